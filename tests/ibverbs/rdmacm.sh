# Debian's rdma_cm programs, unmodified, on uroce's librdmacm.so.1 (the
# same object as its libibverbs.so.1). Sourced by matrix.sh, whose pass,
# fail, $tmp and LD_LIBRARY_PATH it uses; its results count in matrix.sh's
# closing line.
#
#   * tests/ibverbs/rdmacm_errors.c: error paths of the C API, a rejected
#     connection, a non-blocking channel, connections in one process (an
#     SRQ on the id; rdma_establish for an id without a QP);
#   * tests/ibverbs/bind6.c: 0.0.0.0 and [::] on one port, with and
#     without RDMA_OPTION_ID_AFONLY, as the kernel's CMA answers;
#   * tests/ibverbs/cm_exit.c: a server that exits the moment it sees
#     DISCONNECTED leaves its DREP on the wire (the client's DISCONNECTED
#     within 3 s, not after DREQ retries);
#   * tests/ibverbs/cm_src.c: rdma_resolve_addr from an explicit source;
#   * tests/ibverbs/cm_fork.c: children of fork() connect on the device
#     their parent holds (and, under `uroce exec`, to 127.0.0.1);
#   * tests/ibverbs/cm_threads.c: an id and channel shared by two threads
#     as rping 44 shares them (destroy waits for the other thread's ack;
#     a destroyed channel answers EBADF);
#   * rping -V (data verified) at three sizes, ucmatose -c 4 (and -m:
#     ids migrated to a new channel), udaddy -c 4 (UD through SIDR),
#     rdma_server/rdma_client (synchronous ids, rdma_create_ep), mckey
#     (UD multicast through rdma_join_multicast, 127.106.200.x),
#     perftest's ib_send_bw -R, ib_write_bw -R and ib_read_lat -R: server
#     and client in their own processes.
#
# Each pair gets its own addresses (127.41.<n>.1 for the server, .2 for the
# client) and each process only its own device: rdma_cm picks the device
# by address, and a process given both would bind both. A subset of the
# pairs runs again with server and client on ONE device (127.41.<n>.1 for
# both, named uroce0 in each), two processes sharing it as they share a
# kernel device, the device's CM passing each MAD to its process (issue
# #33; docs/src/guide/sharing.md); UROCE_MATRIX_ONE_DEVICE_CM=1 runs every
# pair so.

cm_n=10

# cm_pair NAME RESULT-REGEX SERVER-COMMAND ARGS... -- CLIENT-COMMAND ARGS...:
# {S} and {C} in the arguments become the server's and client's address,
# {SD} and {CD} their device's name (srv and cli; with cm_one_device=1
# both uroce0 on the server's address, and the name says ", one device").
# The client's output must have a line matching RESULT-REGEX (with
# cm_count=N set: exactly N such lines).
# The client starts once the server's device has bound its address (UDP
# 4791) and a moment more for its rdma_listen.
cm_pair() {
  local name=$1 regex=$2
  shift 2
  cm_n=$((cm_n + 1))
  local s=127.41.$cm_n.1 c=127.41.$cm_n.2 sd=srv cd=cli
  [ -z "${cm_one_device:-}" ] || { c=$s sd=uroce0 cd=uroce0 name="$name, one device"; }
  local server=() client=() a
  while [ "$1" != "--" ]; do a=${1//\{S\}/$s}; a=${a//\{SD\}/$sd}; server+=("${a//\{C\}/$c}"); shift; done
  shift
  for a in "$@"; do a=${a//\{S\}/$s}; a=${a//\{CD\}/$cd}; client+=("${a//\{C\}/$c}"); done
  local try crc src again=""
  for try in 1 2; do
    UROCE_DEVICES="$sd=$s" timeout 90 "${server[@]}" >"$tmp/server" 2>&1 &
    local spid=$!
    for _ in $(seq 100); do
      ss -Huan "src $s:4791" | grep -q . && break
      sleep 0.1
    done
    sleep 1
    UROCE_DEVICES="$cd=$c" timeout 90 "${client[@]}" >"$tmp/client" 2>&1
    crc=$?
    # Rejected as "nobody listening" (REJ reason 8): the client came
    # before the server's rdma_listen (seen once in CI). The pair starts
    # over once, and the result line says so.
    # Or rping's own teardown race (rdmacm-utils 44, kernel devices too):
    # its event thread acknowledges DISCONNECTED, which lets the main
    # thread's rdma_destroy_id return and destroy the channel, and loops
    # back to rdma_get_cm_event before or after that close: after it,
    # EBADF and exit 255 once every ping is done (seen once in 20 runs on
    # one device). The pair starts over once for that too.
    if [ $crc != 0 ] && [ $try = 1 ] && { grep -qE "REJECTED.{0,3} error:? 8" "$tmp/client" ||
      grep -A1 "DISCONNECT EVENT" "$tmp/client" | grep -q "rdma_get_cm_event: Bad file descriptor"; }; then
      kill "$spid" 2>/dev/null
      wait "$spid" 2>/dev/null
      again="(second try) "
      continue
    fi
    wait "$spid"
    src=$?
    break
  done
  cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
  local line count
  line=$(grep -m1 -E "$regex" "$tmp/client" | tr -s ' \t' ' ' | cut -c1-70)
  count=$(grep -cE "$regex" "$tmp/client")
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] &&
    [ -z "${cm_count:-}" -o "${cm_count:-}" = "$count" ] &&
    ! grep -qiE "data mismatch|invalid data" "$tmp/out"; then
    pass "$name" "$again${cm_count:+$count x }$line"
  else
    fail "$name" "client exit $crc, server exit $src, $count result lines"
  fi
}

# ---- the C program
if cc -O1 -Wall -o "$tmp/rdmacm_errors" tests/ibverbs/rdmacm_errors.c -libverbs -lrdmacm; then
  if UROCE_DEVICES=uroce0=127.41.2.1,uroce1=127.41.2.2 timeout 60 "$tmp/rdmacm_errors" >"$tmp/out" 2>&1; then
    pass "rdmacm_errors.c" "$(tail -1 "$tmp/out")"
  else
    fail "rdmacm_errors.c" "$(grep -c FAIL "$tmp/out") checks failed"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  rdmacm_errors.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- the IPv4 and IPv6 wildcards on one port (tgtd's portal), with and
# without RDMA_OPTION_ID_AFONLY, answered as the kernel's CMA (bind6.c)
if cc -O1 -Wall -o "$tmp/bind6" tests/ibverbs/bind6.c -lrdmacm; then
  if UROCE_DEVICES=uroce0=127.41.4.1 timeout 60 "$tmp/bind6" >"$tmp/out" 2>&1; then
    pass "bind6.c" "$(tail -1 "$tmp/out")"
  else
    fail "bind6.c" "$(grep -c FAIL "$tmp/out") checks failed"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  bind6.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- a server that exits on DISCONNECTED leaves its DREP on the wire:
# the client's DISCONNECTED comes at once, 10 rounds (cm_exit.c)
if cc -O1 -Wall -o "$tmp/cm_exit" tests/ibverbs/cm_exit.c -libverbs -lrdmacm; then
  if UROCE_SERVER_DEVICES=srv=127.41.3.1 UROCE_CLIENT_DEVICES=cli=127.41.3.2 \
    timeout 120 "$tmp/cm_exit" 127.41.3.1 7471 10 >"$tmp/out" 2>&1; then
    pass "cm_exit.c" "$(tail -1 "$tmp/out")"
  else
    fail "cm_exit.c" "$(tail -1 "$tmp/out")"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  cm_exit.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- ids and channels shared by two threads as rping 44 shares them
# (tests/ibverbs/cm_threads.c): rdma_destroy_id waits for another
# thread's acknowledgement, a destroyed channel is EBADF, not freed memory
if cc -O1 -Wall -o "$tmp/cm_threads" tests/ibverbs/cm_threads.c -lrdmacm -libverbs -lpthread; then
  if UROCE_DEVICES=uroce0=127.105.21.1 timeout 60 "$tmp/cm_threads" 127.105.21.1 127.105.21.2 >"$tmp/out" 2>&1; then
    pass "cm_threads.c" "$(tail -1 "$tmp/out")"
  else
    fail "cm_threads.c" "$(grep -c FAIL "$tmp/out") checks failed ($(tail -1 "$tmp/out"))"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  cm_threads.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- children of fork() on a device their parent holds, as the pyverbs
# rdmacm tests run (tests/ibverbs/cm_fork.c): each child opens the device
# anew and connects through rdma_cm; then the parent's own context still
# works. Again under `uroce exec` to 127.0.0.1, the address of the `lo`
# its sysfs view names as the device's netdev (which pyverbs connects to):
# it reaches the device itself, as the kernel's CMA resolves it.
if cc -O1 -Wall -o "$tmp/cm_fork" tests/ibverbs/cm_fork.c -lrdmacm -libverbs; then
  if UROCE_DEVICES=uroce0=127.105.22.1 timeout 90 "$tmp/cm_fork" 127.105.22.1 7480 >"$tmp/out" 2>&1; then
    pass "cm_fork.c" "$(tail -1 "$tmp/out")"
  else
    fail "cm_fork.c" "$(tail -3 "$tmp/out" | tr '\n' ' ')"
  fi
  if UROCE_DEVICES=uroce0=127.105.23.1 timeout 90 "$uroce" exec -- "$tmp/cm_fork" 127.105.23.1 7480 127.0.0.1 \
    >"$tmp/out" 2>&1; then
    pass "cm_fork.c to 127.0.0.1 under uroce exec" "$(tail -1 "$tmp/out")"
  else
    fail "cm_fork.c to 127.0.0.1 under uroce exec" "$(tail -3 "$tmp/out" | tr '\n' ' ')"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  cm_fork.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- rdma_resolve_addr with an explicit source on an unbound id
# (tests/ibverbs/cm_src.c: rping -I's and cmtime -b's call, and the
# sources librdmacm and the kernel refuse)
if cc -O1 -Wall -o "$tmp/cm_src" tests/ibverbs/cm_src.c -lrdmacm -libverbs; then
  if UROCE_DEVICES=uroce0=127.105.20.1,uroce1=127.105.20.2 timeout 60 "$tmp/cm_src" 127.105.20.1 127.105.20.2 >"$tmp/out" 2>&1; then
    pass "cm_src.c" "$(tail -1 "$tmp/out")"
  else
    fail "cm_src.c" "$(grep -c FAIL "$tmp/out") checks failed"
  fi
else
  failed=$((failed + 1))
  echo "FAIL  cm_src.c (does not compile: apt-get install librdmacm-dev)"
fi

# ---- mckey: UD multicast through rdma_join_multicast, sender and
# receiver in their own processes (devices 127.106.200.1 and .2, group
# 239.106.0.1); the receiver joins first and must get all 4 messages.
mc_r=127.106.200.1 mc_s=127.106.200.2 mc_g=239.106.0.1
UROCE_DEVICES="rcv=$mc_r" timeout 60 mckey -m $mc_g -b $mc_r -C 4 >"$tmp/mc_recv" 2>&1 &
mc_pid=$!
for _ in $(seq 100); do
  ss -Huan "src $mc_g:4791" | grep -q . && break
  sleep 0.1
done
UROCE_DEVICES="snd=$mc_s" timeout 60 mckey -m $mc_g -s -b $mc_s -C 4 >"$tmp/mc_send" 2>&1
mc_src=$?
wait $mc_pid
mc_rrc=$?
if [ $mc_src = 0 ] && [ $mc_rrc = 0 ] && grep -q "data transfers complete" "$tmp/mc_recv"; then
  pass "mckey -m (multicast)" "4 messages to group $mc_g received"
else
  cat "$tmp/mc_send" - "$tmp/mc_recv" <<<"---- receiver:" >"$tmp/out"
  fail "mckey -m (multicast)" "sender $mc_src, receiver $mc_rrc"
fi

# perftest over rdma_cm (-R), in cm_pairs below.
bw='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
lat='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+'
# The clients' data connection waits for the server's second rdma_listen
# (tests/ibverbs/cm_delay.c says why).
delay=()
if cc -O1 -Wall -shared -fPIC -o "$tmp/cm_delay.so" tests/ibverbs/cm_delay.c -ldl; then
  delay=(env "LD_PRELOAD=$tmp/cm_delay.so")
fi
# perftest's rdma_cm exchange (perftest_communication.c) copies its keys
# into the buffer whose receive WR (SYNC_SPEC_ID, 5) is posted, then sends
# them from there (rdma_write_keys' memcpy into rdma_ctx->buf[0]); the
# peer's keys overwrite them (docs/src/tools/check.md, "Finding your RDMA bug").
perftest_known='uroce check \[buffer\]: the application wrote into the buffer of receive WR wr_id 5 on QP 0x[0-9a-f]+ \(56 bytes at 0x[0-9a-f]+, lkey 0x[0-9a-f]+; first at byte 0 of the message\)'
# The rdma_cm pairs: on two devices; with UROCE_MATRIX_ONE_DEVICE_CM=1 on
# one too (the header says why not by default).
cm_pairs() {
  # ---- rping: -V checks every byte the server sent back; -C iterations
  for spec in "23 2000" "4096 500" "65535 200"; do
    set -- $spec
    cm_count=$2 cm_pair "rping -V -S $1 -C $2" "^ping data" \
      rping -s -a {S} -p 7471 -V -C "$2" -S "$1" -- rping -c -a {S} -p 7471 -V -v -C "$2" -S "$1"
  done

  # ---- ucmatose: four connections, 20 messages of 4 KiB each way
  cm_pair "ucmatose -c 4 -C 20 -S 4096" "^return status 0" \
    ucmatose -b {S} -p 7471 -c 4 -C 20 -S 4096 -- ucmatose -s {S} -b {C} -p 7471 -c 4 -C 20 -S 4096

  # ---- ucmatose -m: the ids migrated to a new channel (rdma_migrate_id)
  cm_pair "ucmatose -c 2 -m" "^return status 0" \
    ucmatose -b {S} -p 7471 -c 2 -m -- ucmatose -s {S} -b {C} -p 7471 -c 2 -m

  # ---- udaddy: UD, the peer's QP number and Q_Key through SIDR
  cm_pair "udaddy -c 4" "^return status 0" \
    udaddy -b {S} -c 4 -- udaddy -s {S} -b {C} -c 4

  # ---- rdma_server/rdma_client: rdma_getaddrinfo, rdma_create_ep,
  # synchronous ids, rdma_get_request, the CQs rdma_create_qp makes
  cm_pair "rdma_server/rdma_client" "rdma_client: end 0" \
    rdma_server -s {S} -p 7471 -- rdma_client -s {S} -p 7471

  # ---- perftest over rdma_cm (-R): connection and data exchange
  known_reports=$perftest_known cm_pair "ib_send_bw -R" "$bw" \
    ib_send_bw -R -x 0 -d {SD} -p 7471 -n 100 -- "${delay[@]}" ib_send_bw -R -x 0 -d {CD} -p 7471 -n 100 {S}
  known_reports=$perftest_known cm_pair "ib_write_bw -R" "$bw" \
    ib_write_bw -R -x 0 -d {SD} -p 7471 -n 100 -- "${delay[@]}" ib_write_bw -R -x 0 -d {CD} -p 7471 -n 100 {S}
  known_reports=$perftest_known cm_pair "ib_read_lat -R" "$lat" \
    ib_read_lat -R -x 0 -d {SD} -p 7471 -n 100 -- "${delay[@]}" ib_read_lat -R -x 0 -d {CD} -p 7471 -n 100 {S}

  # rsockets: rdmacm-utils' rstream (rsocket calls only, no kernel TCP to
  # fall back to) in both directions' default test and a 1 MB custom one.
  if command -v rstream >/dev/null; then
    cm_pair "rstream 1 MB x 20" "^custom" \
      rstream -b {S} -p 19740 -S 1000000 -C 20 -- rstream -s {S} -p 19740 -S 1000000 -C 20
    cm_pair "rstream 64 KB x 100, non-blocking" "^custom" \
      rstream -b {S} -p 19741 -S 65536 -C 100 -T n -- rstream -s {S} -p 19741 -S 65536 -C 100 -T n
  else
    echo "SKIP rstream: Debian's rdmacm-utils is not installed"
  fi
}
cm_pairs
[ -z "${UROCE_MATRIX_ONE_DEVICE_CM:-}" ] || cm_one_device=1 cm_pairs

# ---- a subset with one device for both sides (one UROCE_DEVICES entry):
# server and client are two processes on it, as `rping -s` and `rping -c`
# in two terminals on one kernel device
if [ -z "${UROCE_MATRIX_ONE_DEVICE_CM:-}" ]; then
  cm_one_device=1 cm_count=500 cm_pair "rping -V -C 500" "^ping data" \
    rping -s -a {S} -p 7471 -V -C 500 -- rping -c -a {S} -p 7471 -V -v -C 500
  cm_one_device=1 cm_pair "ucmatose -c 4 -C 20 -S 4096" "^return status 0" \
    ucmatose -b {S} -p 7471 -c 4 -C 20 -S 4096 -- ucmatose -s {S} -b {C} -p 7471 -c 4 -C 20 -S 4096
  cm_one_device=1 cm_pair "udaddy -c 4" "^return status 0" \
    udaddy -b {S} -c 4 -- udaddy -s {S} -b {C} -c 4
  cm_one_device=1 cm_pair "rdma_server/rdma_client" "rdma_client: end 0" \
    rdma_server -s {S} -p 7471 -- rdma_client -s {S} -p 7471
  known_reports=$perftest_known cm_one_device=1 cm_pair "ib_write_bw -R" "$bw" \
    ib_write_bw -R -x 0 -d {SD} -p 7471 -n 100 -- "${delay[@]}" ib_write_bw -R -x 0 -d {CD} -p 7471 -n 100 {S}
  if command -v rstream >/dev/null; then
    cm_one_device=1 cm_pair "rstream 1 MB x 20" "^custom" \
      rstream -b {S} -p 19742 -S 1000000 -C 20 -- rstream -s {S} -p 19742 -S 1000000 -C 20
  fi
fi

# ---- rsockets under librspreload and rdmacm-utils' other rsocket programs
source tests/ibverbs/rsocket.sh
