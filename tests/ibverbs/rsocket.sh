# rsockets on uroce's librdmacm.so.1: unmodified TCP programs under
# Debian's librspreload.so (rdma-core's preload, which turns their TCP
# sockets into rsockets), and rdmacm-utils' rsocket programs. Sourced by
# rdmacm.sh (so by matrix.sh), whose pass, fail, $tmp and LD_LIBRARY_PATH
# it uses.
#
#   * tests/ibverbs/tcp_stream.c, a plain TCP client and server (poll,
#     send/recv, shutdown; 4 MB each way, every byte checked), and iperf3
#     (installed when root, else skipped) under the preload: each passes
#     only if the kernel had no TCP socket on the port during the run
#     (`ss -tan`) and the client device's capture (UROCE_PCAP) holds at
#     least the bytes moved, as RoCE packets;
#   * riostream -T v (riomap/riowrite: data written straight into the
#     peer's mapped buffer, verified), blocking and with rpoll (-T a);
#
#   * udpong (datagram rsockets: the first datagram over the UDP side
#     channel, the rest over UD QPs), echoed and one-way.
#
# Each pair gets its own addresses (127.107.<n>.1 server, .2 client) and
# TCP port (19750 + n); rs_net and rs_port0 change the 107 and the 19700.

preload=/usr/lib/x86_64-linux-gnu/rsocket/librspreload.so
rs_n=50

# rs_pair NAME BYTES RESULT-REGEX SERVER-COMMAND ARGS... -- CLIENT-COMMAND ARGS...:
# {S}, {C} and {P} in the arguments become the server's and client's
# address and the TCP port. Each runs with its own device (and under the
# preload with rs_preload=1); the client's output must match
# RESULT-REGEX; BYTES is the least the client's device must have carried
# (sent and received). With rs_forever=1 the server is one that never
# exits (udpong's): it is ended once the client is done.
rs_pair() {
  local name=$1 bytes=$2 regex=$3 pre=()
  shift 3
  [ "${rs_preload:-}" = 1 ] && pre=("LD_PRELOAD=$preload")
  rs_n=$((rs_n + 1))
  local s=127.${rs_net:-107}.$rs_n.1 c=127.${rs_net:-107}.$rs_n.2 port=$((${rs_port0:-19700} + rs_n))
  # rs_one=1: one device (the server's) for both sides.
  local cdev="cli=$c"
  [ -n "${rs_one:-}" ] && c=$s cdev="srv=$s"
  local server=() client=() a
  while [ "$1" != "--" ]; do a=${1//\{S\}/$s}; a=${a//\{P\}/$port}; server+=("${a//\{C\}/$c}"); shift; done
  shift
  for a in "$@"; do a=${a//\{S\}/$s}; a=${a//\{P\}/$port}; client+=("${a//\{C\}/$c}"); done
  rm -f "$tmp/${cdev%%=*}.pcap"
  env UROCE_DEVICES="srv=$s" "${pre[@]}" timeout 90 "${server[@]}" >"$tmp/server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do
    ss -Huan "src $s:4791" | grep -q . && break
    sleep 0.1
  done
  sleep 1
  env UROCE_DEVICES="$cdev" UROCE_PCAP="$tmp/{dev}.pcap" "${pre[@]}" \
    timeout 90 "${client[@]}" >"$tmp/client" 2>&1 &
  local cpid=$! tcp=0
  # Kernel TCP on the port while they run: the preload fell back.
  while kill -0 $cpid 2>/dev/null; do
    ss -Htan "( sport = :$port or dport = :$port )" | grep -q . && tcp=1
    sleep 0.2
  done
  wait $cpid
  local crc=$?
  [ $crc = 0 ] && [ "${rs_forever:-}" != 1 ] || kill $spid 2>/dev/null
  wait $spid
  local src=$?
  [ "${rs_forever:-}" = 1 ] && [ $src = 143 ] && src=0
  cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
  local roce line
  roce=$(stat -c %s "$tmp/${cdev%%=*}.pcap" 2>/dev/null || echo 0)
  line=$(grep -m1 -E "$regex" "$tmp/client" | tr -s ' \t' ' ' | cut -c1-60)
  if [ $tcp = 1 ]; then
    fail "$name" "kernel TCP on port $port: not over RoCE"
  elif [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] && [ "$roce" -ge "$bytes" ]; then
    pass "$name" "$line; $((roce / 1000000)) MB of RoCE"
  else
    fail "$name" "client exit $crc, server exit $src, capture $roce bytes"
  fi
}

if [ ! -e $preload ]; then
  echo "SKIP librspreload: Debian's librdmacm1 has no $preload"
else
  if cc -O1 -Wall -o "$tmp/tcp_stream" tests/ibverbs/tcp_stream.c; then
    rs_preload=1 rs_pair "tcp_stream.c (librspreload)" 8000000 "bytes each way checked" \
      "$tmp/tcp_stream" -s {S} {P} 4000000 -- "$tmp/tcp_stream" -c {S} {P} 4000000
  else
    failed=$((failed + 1))
    echo "FAIL  tcp_stream.c (does not compile)"
  fi
  # Installed only when missing; the package lists are fetched first (a
  # fresh image has none, and stale ones name versions the mirror no
  # longer has).
  if ! command -v iperf3 >/dev/null && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null 2>&1
    apt-get install -y -q iperf3 >/dev/null 2>&1
  fi
  if command -v iperf3 >/dev/null; then
    rs_preload=1 rs_pair "iperf3 -n 20M (librspreload)" 20000000 "receiver$" \
      iperf3 -s -1 -B {S} -p {P} -- iperf3 -c {S} -B {C} -p {P} -n 20M
  else
    echo "SKIP iperf3 under librspreload: iperf3 is not installed (apt-get install iperf3)"
  fi
fi

# ---- riostream: riomap'd buffers written by riowrite, every byte verified
if command -v riostream >/dev/null; then
  rs_pair "riostream 100 KB x 10 x 5 -T v" 10000000 "^custom" \
    riostream -b {S} -p {P} -S 100000 -C 10 -I 5 -T v -- riostream -s {S} -p {P} -S 100000 -C 10 -I 5 -T v
  rs_pair "riostream 4 KB x 4 x 20 -T a -T v" 600000 "^custom" \
    riostream -b {S} -p {P} -S 4096 -C 4 -I 20 -T a -T v -- riostream -s {S} -p {P} -S 4096 -C 4 -I 20 -T a -T v
  # The same with one device for both sides (two processes on it).
  rs_one=1 rs_pair "one device: riostream 100 KB x 10 x 5 -T v" 10000000 "^custom" \
    riostream -b {S} -p {P} -S 100000 -C 10 -I 5 -T v -- riostream -s {S} -p {P} -S 100000 -C 10 -I 5 -T v
else
  echo "SKIP riostream: Debian's rdmacm-utils is not installed"
fi

# ---- udpong: datagram rsockets. Echoed 1 KB datagrams (each waited for,
# resent after 1 ms without an answer, as udpong does: on a loaded
# machine every late answer leaves one more duplicate circulating for
# the rest of the run, so the echo run is short), then 1 KB datagrams
# one way (the server counts what arrived; UD may drop).
if command -v udpong >/dev/null; then
  rs_net=111 rs_port0=20100 rs_forever=1 rs_pair "udpong 1 KB x 100 echo" 200000 "^custom" \
    udpong -b {S} -p {P} -- udpong -s {S} -p {P} -S 1024 -C 100 -T e
  rs_net=111 rs_port0=20100 rs_forever=1 rs_pair "udpong 1 KB x 10000 one way" 5000000 "^custom" \
    udpong -b {S} -p {P} -- udpong -s {S} -p {P} -S 1024 -C 10000
else
  echo "SKIP udpong: Debian's rdmacm-utils is not installed"
fi
