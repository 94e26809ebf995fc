#!/usr/bin/env bash
# uroce against the kernel's own UDP, on one machine, in one run.
#
#   bash benches/perftest.sh
#
# First the yardsticks: what Linux UDP does on loopback between two
# processes, measured by benches/yardstick/udp_yard.c (built here with
# `cc -O2`). The receiver counts what it actually received, over
# UROCE_BENCH_SECS seconds after a 0.3 s warm-up:
#   * UDP 4 KiB (and 1 KiB), 1 datagram per syscall: one send(2) per
#     datagram, one recv(2) per datagram; MiB/s.
#   * UDP GSO/GRO, 4 KiB (and 1 KiB) segments: the sender sets UDP_SEGMENT
#     and sends 61,440 bytes per send(2) (15 x 4096, 60 x 1024), the
#     receiver sets UDP_GRO and reads whole coalesced batches (gso_size from
#     the cmsg): the kernel's UDP bulk ceiling; MiB/s. "n/a (kernel lacks
#     UDP_SEGMENT)" where the kernel cannot.
#   * UDP 64 B, sendmmsg/recvmmsg: 64-byte datagrams in batches of 64 per
#     syscall on both sides; datagrams received per second (Mpps).
#   * UDP GSO/GRO, 64 B segments: 64 segments of 64 bytes per send(2), as
#     above; segments received per second (Mpps): small packets the way
#     uroce's engine batches them (sendmmsg with UDP GSO, recvmmsg with GRO).
#   * UDP busy-poll ping-pong, 2 B: non-blocking sockets, both sides spin on
#     recv(2); half the round trip, median and 99th percentile (µs). A side
#     that waits past 50 µs blocks in poll(2) until the answer comes: the
#     scheduler stacks two spinning processes on one core and leaves them
#     there while the other idles, and a wake-up moves one back.
# Then Debian's perftest on uroce's drop-in libibverbs.so.1 (RC, one QP,
# server on device uroce0, client on uroce1, 127.90.n.1/.2, TCP 18900+n),
# at MTU 4096 and 1024 (-m):
#   * ib_write_bw, ib_send_bw, ib_read_bw -s 65536 -D SECS: "BW average",
#     MiB/s (perftest's MB/sec column is 2^20 bytes per second); compared
#     with the GSO/GRO ceiling at the MTU's segment size (target >= 50%) and
#     with the 1-datagram-per-syscall figure (for reference).
#   * the same -s 64: "MsgRate" (Mpps), compared with the sendmmsg/recvmmsg
#     packet rate (target >= 50%) and with GSO/GRO at 64 B (for reference).
#   * ib_send_lat, ib_write_lat -s 2 -n ITERS: t_typical (perftest's median
#     of half round trips) and its 99% percentile, compared with the UDP
#     busy-poll half round trip (target <= 1.5x).
# Then many QPs:
#   * ib_write_bw -s 4096 -m 4096 -N with -q 1000 against the same with
#     -q 1 (default depth 128 and 5000 iterations per QP; quick: -n 1000);
#     "BW average", target >= 80% of the one-QP figure. -N (--noPeak) is
#     required: perftest's peak computation is quadratic in the number of
#     iterations, hopeless at 1000 QPs x 5000. Four processes with 250 QPs
#     each into one server is not something perftest can express (one
#     ib_write_bw server serves one client, and a uroce device address
#     belongs to one process): verbs-api/tests/verbs/many_qps.rs covers that
#     shape, 4 devices x 250 RC QPs writing into one server device.
#   * benches/qp_scale.rs (`cargo bench -p uroce-benches --bench qp_scale`,
#     built here, run UROCE_BENCH_SECS per figure): one process, two
#     devices (127.90.200.1/.2), a 2-byte SEND/RECV ping-pong going
#     round-robin over 1,000 connected RC QP pairs, driven by one thread;
#     time per round trip against the same on one QP pair (target <= 1.5x).
# And an idle figure: ib_write_lat -s 2 -n 1000 --wait_destroy, so that
# after its run each of the two processes holds its connected RC QP (and
# uroce's device engine thread) with no traffic; utime+stime of both
# processes from /proc/PID/stat over UROCE_BENCH_IDLE_SECS seconds, as % of
# one core (target < 1%).
# And the CPU cost per byte, at MTU 4096 and 1024 (quick runs too):
#   * ib_write_bw -s 65536 -m MTU -D SECS+2, both processes' utime+stime
#     (every thread) sampled from /proc/PID/stat every 0.2 s; the window is
#     the stretch where the responder's CPU clock runs (it uses next to
#     none before or after the transfer), less a sample at each end; bytes
#     moved = BW average x window. Printed per side as ns of CPU per byte and as
#     cycles per byte at the CPU's nominal clock (/proc/cpuinfo's
#     "cpu MHz"; a VM exposes no cycle counter to perf here). The
#     requester (client) spins on its CQ, so it shows a whole core
#     divided by the bandwidth; the responder (server) is uroce's receive
#     side alone (perftest sleeps in a TCP read meanwhile).
# Each full (non-quick) run appends its ratios (date, commit, test, MTU,
# ratio, target) to benches/history.csv and draws benches/history.png
# (benches/history.sh; gnuplot), ratio against target per test.
#
# Nothing is pinned: both sides of every test share the machine's cores,
# and other load on the machine skews every figure (the CPU busy before the
# run is printed). Targets are reported, never asserted; the script exits
# non-zero only if a program fails to run.
#
# Environment:
#   UROCE_BENCH_SECS=2        seconds per throughput measurement (quick: 1)
#   UROCE_BENCH_QUICK=1       MTU 4096 only, 1 s measurements, 5 s idle,
#                             -n 1000 for the many-QPs ib_write_bw
#                             (about a minute; for CI)
#   UROCE_BENCH_IDLE_SECS=10  the idle window (quick: 5)
#   UROCE_BENCH_LAT_ITERS     latency round trips (default 5000 x SECS)
#   UROCE_BENCH_NOBUILD=1     use target/release as it is (no cargo build;
#                             the newest target/release/deps/qp_scale-*)
#   UROCE_BENCH_OUT=path      also write the tables (markdown) to path
#   UROCE_BENCH_KEEP=1        keep every program's output (the temp dir)
#   UROCE_BENCH_HISTORY=0     a full run does not append to benches/history.csv
#   UROCE_BENCH_NET=90        the second octet of every address (127.N.x.y)
#   UROCE_BENCH_PORT=18900    the first TCP port, less one (perftest's
#                             exchange; about 30 ports from there)
#                             (both so that runs side by side do not meet)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t_start=$SECONDS

quick=${UROCE_BENCH_QUICK:-0}
[ "$quick" = 0 ] || [ "$quick" = 1 ] || { echo "perftest.sh: UROCE_BENCH_QUICK is 0 or 1" >&2; exit 2; }
if [ "$quick" = 1 ]; then
  secs=${UROCE_BENCH_SECS:-1}
  idle_secs=${UROCE_BENCH_IDLE_SECS:-5}
  mtus=(4096)
else
  secs=${UROCE_BENCH_SECS:-2}
  idle_secs=${UROCE_BENCH_IDLE_SECS:-10}
  mtus=(4096 1024)
fi
[[ $secs =~ ^[1-9][0-9]{0,2}$ ]] && [ "$secs" -le 600 ] || { echo "perftest.sh: UROCE_BENCH_SECS must be 1..600, not '$secs'" >&2; exit 2; }
lat_iters=${UROCE_BENCH_LAT_ITERS:-$((5000 * secs))}
bnet=${UROCE_BENCH_NET:-90}
bport=${UROCE_BENCH_PORT:-18900}
[[ $bnet =~ ^[0-9]{1,3}$ ]] && [ "$bnet" -le 255 ] || { echo "perftest.sh: UROCE_BENCH_NET must be 0..255, not '$bnet'" >&2; exit 2; }
[[ $bport =~ ^[1-9][0-9]{3,4}$ ]] && [ "$bport" -le 65000 ] || { echo "perftest.sh: UROCE_BENCH_PORT must be 1000..65000, not '$bport'" >&2; exit 2; }
for v in idle_secs lat_iters; do
  [[ ${!v} =~ ^[1-9][0-9]{0,5}$ ]] || { echo "perftest.sh: $v must be a positive integer, not '${!v}'" >&2; exit 2; }
done
[ "$lat_iters" -ge 5 ] || lat_iters=5

# ---- tools
need=()
command -v cc >/dev/null || need+=(gcc)
command -v ib_write_bw >/dev/null || need+=(perftest)
# A full run draws benches/history.png.
[ "$quick" = 1 ] || [ "${UROCE_BENCH_HISTORY:-1}" = 0 ] || command -v gnuplot >/dev/null || need+=(gnuplot-nox)
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null 2>&1 || true
  apt-get install -y -q "${need[@]}" >/dev/null 2>&1
fi
for p in cc stdbuf timeout ib_write_bw ib_send_bw ib_read_bw ib_send_lat ib_write_lat; do
  command -v $p >/dev/null || { echo "perftest.sh: $p missing (apt-get install perftest gcc)" >&2; exit 1; }
done
qp_bin="" # benches/qp_scale.rs, built
if [ "${UROCE_BENCH_NOBUILD:-0}" != 1 ]; then
  # The drop-in libraries in a cargo invocation of their own, uroce-cli in
  # another: cargo unifies one invocation's features, and uroce-cli's
  # (uroce-fuzz enables the provider's testing face) must not reach the
  # libraries (tests/ibverbs/symbols.sh checks).
  cargo build --release -q -p uroce-ibverbs -p uroce-preload || exit 1
  cargo build --release -q -p uroce-cli || exit 1
  # cargo names the bench binary it built (target/release/deps/qp_scale-HASH).
  qp_bin=$(cargo bench -q --no-run -p uroce-benches --bench qp_scale --message-format=json |
    grep -o '"executable":"[^"]*/qp_scale-[^"]*"' | tail -n 1 | sed 's/^"executable":"//; s/"$//')
  [ -n "$qp_bin" ] || { echo "perftest.sh: cargo bench --no-run --bench qp_scale failed" >&2; exit 1; }
else
  # The newest build of it (older ones stay in deps/ under other hashes).
  for f in $(ls -t "$root"/target/release/deps/qp_scale-* 2>/dev/null); do
    [ -f "$f" ] && [ -x "$f" ] && [[ ${f##*/} != *.* ]] && { qp_bin=$f; break; }
  done
fi
libdir=$("$root/target/release/uroce" libdir) || { echo "perftest.sh: target/release/uroce libdir failed" >&2; exit 1; }
[ -e "$libdir/libibverbs.so.1" ] || { echo "perftest.sh: no libibverbs.so.1 in $libdir" >&2; exit 1; }

tmp=$(mktemp -d)
bg=() # background processes we started (timeout's pids)
cleanup() {
  for p in "${bg[@]}"; do kill "$p" 2>/dev/null; done
  if [ "${UROCE_BENCH_KEEP:-0}" = 1 ]; then
    echo "perftest.sh: every program's output is in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cc -O2 -Wall -o "$tmp/udp_yard" benches/yardstick/udp_yard.c || { echo "perftest.sh: cannot compile udp_yard.c" >&2; exit 1; }

failures=0
failed_names=()
fail() { # NAME FILE...: count a failure, show the programs' last words
  failures=$((failures + 1))
  failed_names+=("$1")
  echo "FAILED: $1" >&2
  shift
  # perftest's errors go to stderr, unbuffered, so they come first in the
  # file: show those lines, then how the output ends.
  for f in "$@"; do
    [ -s "$f" ] || continue
    echo "---- $(basename "$f"):" >&2
    grep -i -E 'error|fail|unable|couldn|exceed|refused|scnt|timed out|exit|panic' "$f" | head -n 12 | sed 's/^/  ! /' >&2
    tail -n 4 "$f" | sed 's/^/  | /' >&2
  done
}

# Floating point through awk: calc EXPR [VAR=VALUE...]
calc() {
  local e=$1 a args=()
  shift
  for a in "$@"; do args+=(-v "$a"); done
  awk "${args[@]}" "BEGIN { print ($e) }" 2>/dev/null
}
# unbg PID: forget a background process that has been waited for.
unbg() {
  local p keep=()
  for p in "${bg[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  bg=("${keep[@]}")
}
num() { [[ ${1:-} =~ ^[0-9]+(\.[0-9]+)?$ ]]; }

# CPU busy on the whole machine over one second, before we start.
cpu_busy() {
  local a b
  read -r _ a1 a2 a3 a4 a5 a6 a7 a8 _ </proc/stat
  sleep 1
  read -r _ b1 b2 b3 b4 b5 b6 b7 b8 _ </proc/stat
  a=$((a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8))
  b=$((b1 + b2 + b3 + b4 + b5 + b6 + b7 + b8))
  local idle=$(((b4 + b5) - (a4 + a5))) total=$((b - a))
  [ "$total" -gt 0 ] && echo $(((total - idle) * 100 / total)) || echo "?"
}

ncpu=$(nproc 2>/dev/null || echo "?")
busy=$(cpu_busy)
hdr=$tmp/header.md
{
  echo "uroce perftest: $(git rev-parse --short HEAD 2>/dev/null || echo "?"), $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -sr), $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $ncpu cores."
  echo "Both sides of every test share these $ncpu cores (nothing pinned); CPU busy before the run: $busy%."
  if [ "$busy" != "?" ] && [ "$busy" -ge 25 ]; then
    echo "**Warning: the machine was busy before the run: every figure below is skewed.**"
  fi
  echo "Throughput windows ${secs} s, latency ${lat_iters} round trips, idle window ${idle_secs} s, MTUs ${mtus[*]}."
} >"$hdr"
cat "$hdr"
echo

# ---- UDP yardsticks
declare -A Y
yard() { # KEY MODE SIZE
  local key=$1 mode=$2 size=$3 out rc
  out=$(timeout $((secs + 60)) "$tmp/udp_yard" "$mode" "$size" "$secs" 127.$bnet.1.1 127.$bnet.1.2 2>"$tmp/yard.err")
  rc=$?
  if [ $rc != 0 ] || [ -z "$out" ]; then
    [ $rc = 124 ] && echo "timed out" >>"$tmp/yard.err"
    fail "udp_yard $mode $size" "$tmp/yard.err"
    Y[$key.state]=FAILED
    return
  fi
  if [[ $out == na* ]]; then
    local reason=${out#*reason=\"}
    Y[$key.state]="n/a (${reason%\"})"
    echo "udp_yard $mode $size: ${Y[$key.state]}"
    return
  fi
  Y[$key.state]=ok
  local kv
  for kv in $out; do
    [[ $kv == *=* ]] && Y[$key.${kv%%=*}]=${kv#*=}
  done
  echo "udp_yard $mode $size: $out"
}
segs=()
for m in "${mtus[@]}"; do segs+=("$m"); done
for s in "${segs[@]}"; do yard "bulk$s" bulk "$s"; done
for s in "${segs[@]}"; do yard "gso$s" gso "$s"; done
yard mmsg64 mmsg 64
yard gso64 gso 64
yard pp2 pingpong 2
echo

# ---- perftest on uroce
declare -A P
pt_n=10
perf() { # KEY SIZE TOOL ARGS...: server -d uroce0, client -d uroce1
  # (each side's time limit: secs + 90 s, or $perf_lim when set)
  local key=$1 size=$2
  shift 2
  pt_n=$((pt_n + 1))
  local port=$((bport + pt_n)) net=127.$bnet.$pt_n
  local lim=${perf_lim:-$((secs + 90))}
  local s="$tmp/$key.server" c="$tmp/$key.client"
  UROCE_DEVICES="uroce0=$net.1,uroce1=$net.2" LD_LIBRARY_PATH=$libdir \
    timeout $lim "$@" -d uroce0 -x 0 -p $port >"$s" 2>&1 &
  local spid=$!
  bg+=("$spid")
  local _i
  for _i in $(seq 100); do
    if command -v ss >/dev/null; then
      ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    elif [ "$_i" -ge 5 ]; then
      break
    fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  UROCE_DEVICES="uroce0=$net.1,uroce1=$net.2" LD_LIBRARY_PATH=$libdir \
    timeout $lim "$@" -d uroce1 -x 0 -p $port "$net.1" >"$c" 2>&1
  local crc=$?
  [ $crc = 0 ] || kill "$spid" 2>/dev/null
  wait "$spid"
  local src=$?
  unbg "$spid"
  local line
  # The result line: message size, iterations, then the figures.
  line=$(awk -v s="$size" '$1 == s && $2 ~ /^[0-9]+$/ && NF >= 5 { l = $0 } END { print l }' "$c" | tr -s ' \t' ' ')
  if [ $crc != 0 ] || [ $src != 0 ] || [ -z "$line" ]; then
    echo "client exit $crc, server exit $src (124: timed out after $lim s)" >>"$c"
    fail "$* (port $port)" "$c" "$s"
    P[$key.state]=FAILED
    return
  fi
  P[$key.state]=ok
  P[$key.line]=$line
  echo "$*: $line"
}

for m in "${mtus[@]}"; do
  for op in write send read; do
    perf "${op}_bw_64k_$m" 65536 ib_${op}_bw -s 65536 -m "$m" -D "$secs"
    perf "${op}_bw_64_$m" 64 ib_${op}_bw -s 64 -m "$m" -D "$secs"
  done
  for op in send write; do
    perf "${op}_lat_$m" 2 ib_${op}_lat -s 2 -m "$m" -n "$lat_iters"
  done
  # UC against RC (issue #26: no slower).
  perf "write_lat_uc_$m" 2 ib_write_lat -c UC -s 2 -m "$m" -n "$lat_iters"
done

# ---- many QPs
# ib_write_bw over 1000 RC QPs against one; -N: no peak computation (it is
# quadratic in iterations). Default depth (128) and iterations (5000 per
# QP, 20 GB at 1000 QPs; quick: 1000). The 4-processes-x-250-QPs shape
# cannot be run with perftest (one server serves one client, one uroce
# device address belongs to one process): verbs-api/tests/verbs/many_qps.rs
# covers it, 4 devices x 250 QPs writing into one server.
mq_iters=()
[ "$quick" = 1 ] && mq_iters=(-n 1000)
perf write_bw_4k_q1 4096 ib_write_bw -s 4096 -m 4096 -N -q 1 "${mq_iters[@]}"
perf_lim=$((secs + 120)) perf write_bw_4k_q1000 4096 ib_write_bw -s 4096 -m 4096 -N -q 1000 "${mq_iters[@]}"

# A 2-byte ping-pong round-robin over 1,000 RC QP pairs against one pair,
# in one process (benches/qp_scale.rs).
QS_ONE="" QS_MANY="" QS_N=""
qp_scale() {
  local out="$tmp/qp_scale.out" rc line
  if [ -z "$qp_bin" ]; then
    echo "no target/release/deps/qp_scale-* (cargo bench --no-run -p uroce-benches --bench qp_scale)" >"$out"
    fail "qp_scale" "$out"
    return
  fi
  UROCE_QP_SCALE_SECS=$secs UROCE_QP_SCALE_NET=$bnet timeout $((4 * secs + 120)) "$qp_bin" >"$out" 2>&1
  rc=$?
  line=$(grep -E '^qp_scale: 1 QP [0-9.]+ us/round trip, [0-9]+ QPs [0-9.]+ us/round trip' "$out" | tail -n 1)
  if [ $rc != 0 ] || [ -z "$line" ]; then
    echo "exit $rc (124: timed out after $((4 * secs + 120)) s)" >>"$out"
    fail "qp_scale ($qp_bin)" "$out"
    return
  fi
  read -r QS_ONE QS_N QS_MANY < <(echo "$line" | awk '{ print $4, $7, $9 }')
  echo "$line"
}
qp_scale

# ---- idle: two processes, one connected RC QP each, no traffic
clk=$(getconf CLK_TCK 2>/dev/null || echo 100)
cputicks() { # PID: utime+stime (all threads)
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  # shellcheck disable=SC2086
  set -- $st
  echo $((${12} + ${13}))
}
idle_pct=""
idle_detail=""
launch_pair() { # LIMIT PORT NET SERVER_OUT CLIENT_OUT ARGS...: the server
  # (-d uroce0) and then, once it listens on PORT, the client (-d uroce1)
  # of ARGS in the background; sets SPID and CPID.
  local lim=$1 port=$2 net=$3 so=$4 co=$5 _i
  shift 5
  export UROCE_DEVICES="uroce0=$net.1,uroce1=$net.2"
  LD_LIBRARY_PATH=$libdir timeout $lim "$@" -d uroce0 -x 0 -p $port >"$so" 2>&1 &
  SPID=$!
  bg+=("$SPID")
  for _i in $(seq 100); do
    command -v ss >/dev/null || { sleep 0.5; break; }
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 "$SPID" 2>/dev/null || break
    sleep 0.1
  done
  LD_LIBRARY_PATH=$libdir timeout $lim "$@" -d uroce1 -x 0 -p $port "$net.1" >"$co" 2>&1 &
  CPID=$!
  bg+=("$CPID")
  unset UROCE_DEVICES
}

idle_test() {
  pt_n=$((pt_n + 1))
  local port=$((bport + pt_n)) net=127.$bnet.$pt_n
  local wait_s=$((idle_secs + 2)) lim=$((idle_secs + 90))
  local s="$tmp/idle.server" c="$tmp/idle.client"
  # stdbuf: perftest's stdout is a file here; line-buffer it so that
  # "Waiting N seconds before releasing resources" shows while it waits.
  local args=(stdbuf -oL ib_write_lat -s 2 -n 1000 --wait_destroy=$wait_s)
  launch_pair $lim $port $net "$s" "$c" "${args[@]}"
  local spid=$SPID cpid=$CPID _i
  # Both have printed their result and sleep with the QP connected.
  local ok=0
  for _i in $(seq 300); do
    grep -q "Waiting" "$s" 2>/dev/null && grep -q "Waiting" "$c" 2>/dev/null && { ok=1; break; }
    kill -0 "$spid" 2>/dev/null && kill -0 "$cpid" 2>/dev/null || break
    sleep 0.1
  done
  local sp cp s0 c0 s1 c1
  sp=$(pgrep -P "$spid" | head -n 1)
  cp=$(pgrep -P "$cpid" | head -n 1)
  if [ $ok = 1 ] && [ -n "$sp" ] && [ -n "$cp" ] && s0=$(cputicks "$sp") && c0=$(cputicks "$cp"); then
    sleep "$idle_secs"
    if s1=$(cputicks "$sp") && c1=$(cputicks "$cp"); then
      idle_pct=$(calc 'sprintf("%.2f", 100 * (s + c) / k / t)' s=$((s1 - s0)) c=$((c1 - c0)) k="$clk" t="$idle_secs")
      idle_detail=$(calc 'sprintf("server %.2f%% + client %.2f%%", 100 * s / k / t, 100 * c / k / t)' \
        s=$((s1 - s0)) c=$((c1 - c0)) k="$clk" t="$idle_secs")
    fi
  fi
  wait "$cpid"
  local crc=$?
  wait "$spid"
  local src=$?
  unbg "$spid"
  unbg "$cpid"
  if [ $crc != 0 ] || [ $src != 0 ] || [ -z "$idle_pct" ]; then
    echo "client exit $crc, server exit $src (124: timed out after $lim s)" >>"$c"
    fail "idle: ${args[*]} (port $port)" "$c" "$s"
    idle_pct=""
    return
  fi
  echo "idle ${args[*]}: $idle_pct% of a core over $idle_secs s ($idle_detail)"
}
idle_test

# ---- CPU cost per byte moved: ib_write_bw -s 65536 at each MTU
declare -A CPU
cpu_mhz=$(awk -F': *' '/^cpu MHz/ { print $2; exit }' /proc/cpuinfo 2>/dev/null)
num "$cpu_mhz" || cpu_mhz=""
cpu_cost() { # MTU
  local m=$1
  pt_n=$((pt_n + 1))
  local port=$((bport + pt_n)) net=127.$bnet.$pt_n
  local lim=$((secs + 92))
  local s="$tmp/cpu$m.server" c="$tmp/cpu$m.client" smp="$tmp/cpu$m.samples"
  local args=(ib_write_bw -s 65536 -m "$m" -D $((secs + 2)))
  launch_pair $lim $port $net "$s" "$c" "${args[@]}"
  local spid=$SPID cpid=$CPID _i
  local sp="" cp="" st ct
  : >"$smp"
  while kill -0 "$cpid" 2>/dev/null; do
    [ -n "$sp" ] || sp=$(pgrep -P "$spid" | head -n 1)
    [ -n "$cp" ] || cp=$(pgrep -P "$cpid" | head -n 1)
    if [ -n "$sp" ] && [ -n "$cp" ] && st=$(cputicks "$sp") && ct=$(cputicks "$cp"); then
      echo "$(date +%s.%N) $st $ct" >>"$smp"
    fi
    sleep 0.2
  done
  wait "$cpid"
  local crc=$?
  wait "$spid"
  local src=$?
  unbg "$spid"
  unbg "$cpid"
  local line bw
  line=$(awk '$1 == 65536 && $2 ~ /^[0-9]+$/ && NF >= 5 { l = $0 } END { print l }' "$c" | tr -s ' \t' ' ')
  bw=$(echo "$line" | awk '{ print $4 }')
  # The window: from the first to the last sample where the responder's
  # clock moved by at least 30% of its largest step (1 tick at least: on
  # a loaded machine it gets a fraction of a core), less one sample at
  # each end; then CPU seconds per side over bytes moved.
  local w
  w=$(awk -v clk="$clk" '
    { t[NR] = $1; s[NR] = $2; c[NR] = $3 }
    END {
      for (i = 2; i <= NR; i++) if (s[i] - s[i - 1] > m) m = s[i] - s[i - 1]
      th = int(0.3 * m + 0.5); if (th < 1) th = 1
      for (i = 2; i <= NR; i++) if (s[i] - s[i - 1] >= th) { if (!a) a = i; b = i }
      a += 1; b -= 1
      if (a < 3 || b - a < 3) exit
      dt = t[b] - t[a]
      printf "%.6f %.6f %.6f\n", dt, (s[b] - s[a]) / clk, (c[b] - c[a]) / clk
    }' "$smp")
  if [ $crc != 0 ] || [ $src != 0 ] || ! num "$bw" || [ -z "$w" ]; then
    echo "client exit $crc, server exit $src (124: timed out after $lim s); window: '${w}'" >>"$c"
    fail "cpu cost: ${args[*]} (port $port)" "$c" "$s"
    CPU[$m.state]=FAILED
    return
  fi
  local dt scpu ccpu
  read -r dt scpu ccpu <<<"$w"
  CPU[$m.state]=ok
  CPU[$m.bw]=$bw
  CPU[$m.window]=$dt
  # ns of CPU per byte: CPU seconds / (MiB/s x 2^20 x seconds) x 1e9.
  CPU[$m.server]=$(calc 'sprintf("%.3f", 1e9 * x / (bw * 1048576 * dt))' x="$scpu" bw="$bw" dt="$dt")
  CPU[$m.client]=$(calc 'sprintf("%.3f", 1e9 * x / (bw * 1048576 * dt))' x="$ccpu" bw="$bw" dt="$dt")
  CPU[$m.scores]=$(calc 'sprintf("%.2f", x / dt)' x="$scpu" dt="$dt")
  CPU[$m.ccores]=$(calc 'sprintf("%.2f", x / dt)' x="$ccpu" dt="$dt")
  echo "cpu cost ${args[*]}: $bw MiB/s over ${dt} s: server ${CPU[$m.server]} ns/B (${CPU[$m.scores]} cores), client ${CPU[$m.client]} ns/B (${CPU[$m.ccores]} cores)"
}
for m in 4096 1024; do cpu_cost "$m"; done
echo

# ---- the tables
fmt_ratio() { # VALUE YARDSTICK: percent
  num "$1" && num "$2" && [ "$(calc "b > 0" b="$2")" = 1 ] || { echo "n/a"; return; }
  calc 'sprintf(100 * a / b < 10 ? "%.1f%%" : "%.0f%%", 100 * a / b)' a="$1" b="$2"
}
verdict_ge() { # VALUE YARDSTICK PCT
  num "$1" && num "$2" && [ "$(calc "b > 0" b="$2")" = 1 ] || { echo "≥ $3%: n/a"; return; }
  if [ "$(calc "100 * a / b >= p" a="$1" b="$2" p="$3")" = 1 ]; then echo "≥ $3%: met"; else echo "≥ $3%: **missed**"; fi
}
ystate() { # KEY: the yardstick's value, or why not
  local k=$1 f=$2
  if [ "${Y[$k.state]:-}" = ok ]; then echo "${Y[$k.$f]}"; else echo "${Y[$k.state]:-not run}"; fi
}
pfield() { # KEY N: field N of perftest's result line
  [ "${P[$1.state]:-}" = ok ] || { echo "FAILED"; return; }
  echo "${P[$1.line]}" | awk -v n="$2" '{ print $n }'
}

table=$tmp/table.md
{
  cat "$hdr"
  echo
  echo "UDP yardsticks (loopback, two processes; both share the machine's $ncpu cores):"
  echo
  echo "| Yardstick | Result |"
  echo "|---|---|"
  for s in "${segs[@]}"; do
    k=bulk$s
    if [ "${Y[$k.state]:-}" = ok ]; then
      echo "| UDP $((s / 1024)) KiB, 1 datagram per syscall | ${Y[$k.mib_s]} MiB/s (${Y[$k.mdgram_s]} M datagrams/s) |"
    else
      echo "| UDP $((s / 1024)) KiB, 1 datagram per syscall | $(ystate "$k" x) |"
    fi
  done
  for s in "${segs[@]}"; do
    k=gso$s
    if [ "${Y[$k.state]:-}" = ok ]; then
      echo "| UDP GSO/GRO, $((s / 1024)) KiB segments ($((61440 / s)) per send) | ${Y[$k.mib_s]} MiB/s (${Y[$k.mdgram_s]} M segments/s) |"
    else
      echo "| UDP GSO/GRO, $((s / 1024)) KiB segments | $(ystate "$k" x) |"
    fi
  done
  if [ "${Y[mmsg64.state]:-}" = ok ]; then
    echo "| UDP 64 B, sendmmsg/recvmmsg (batches of 64) | ${Y[mmsg64.mdgram_s]} Mpps |"
  else
    echo "| UDP 64 B, sendmmsg/recvmmsg (batches of 64) | $(ystate mmsg64 x) |"
  fi
  if [ "${Y[gso64.state]:-}" = ok ]; then
    echo "| UDP GSO/GRO, 64 B segments (64 per send) | ${Y[gso64.mdgram_s]} Mpps |"
  else
    echo "| UDP GSO/GRO, 64 B segments | $(ystate gso64 x) |"
  fi
  if [ "${Y[pp2.state]:-}" = ok ]; then
    echo "| UDP busy-poll ping-pong, 2 B, half round trip | ${Y[pp2.half_rtt_median_us]} µs median, ${Y[pp2.half_rtt_p99_us]} µs p99 |"
  else
    echo "| UDP busy-poll ping-pong, 2 B, half round trip | $(ystate pp2 x) |"
  fi
  echo
  echo "uroce (Debian perftest $(dpkg-query -W -f '${Version}' perftest 2>/dev/null || echo "?"), RC, on uroce's libibverbs.so.1):"
  echo
  echo "| perftest | MTU | uroce | Yardstick | Ratio | Target |"
  echo "|---|---|---|---|---|---|"
  for m in "${mtus[@]}"; do
    kib=$((m / 1024))
    for op in write send read; do
      k=${op}_bw_64k_$m
      v=$(pfield "$k" 4)
      shown=$v
      num "$v" && shown="$v MiB/s"
      g=$(ystate "gso$m" mib_s)
      b=$(ystate "bulk$m" mib_s)
      gs=$g; num "$g" && gs="$g MiB/s"
      bs=$b; num "$b" && bs="$b MiB/s"
      # Issue #26: >= 60% of the ceiling at MTU 4096, >= 40% at 1024.
      local_t=60
      [ "$m" -ge 4096 ] || local_t=40
      echo "| ib_${op}_bw -s 65536 | $m | $shown | UDP GSO/GRO, $kib KiB segments: $gs | $(fmt_ratio "$v" "$g") | $(verdict_ge "$v" "$g" $local_t) |"
      echo "| ib_${op}_bw -s 65536 | $m | $shown | UDP $kib KiB, 1 datagram per syscall: $bs | $(fmt_ratio "$v" "$b") | (reference) |"
    done
    y=$(ystate mmsg64 mdgram_s)
    ys=$y; num "$y" && ys="$y Mpps"
    g=$(ystate gso64 mdgram_s)
    gs=$g; num "$g" && gs="$g Mpps"
    for op in write send read; do
      k=${op}_bw_64_$m
      v=$(pfield "$k" 5)
      shown=$v
      num "$v" && shown="$v Mpps"
      echo "| ib_${op}_bw -s 64 | $m | $shown | UDP 64 B, sendmmsg/recvmmsg: $ys | $(fmt_ratio "$v" "$y") | $(verdict_ge "$v" "$y" 50) |"
      echo "| ib_${op}_bw -s 64 | $m | $shown | UDP GSO/GRO, 64 B segments: $gs | $(fmt_ratio "$v" "$g") | (reference) |"
    done
    y=$(ystate pp2 half_rtt_median_us)
    y99=$(ystate pp2 half_rtt_p99_us)
    ys=$y; num "$y" && ys="$y µs"
    # Issue #26: send <= 2.0x, write <= 2.5x the UDP half round trip
    # (typical); p99 <= 3x the yardstick's p99; UC no slower than RC.
    for op in send write; do
      k=${op}_lat_$m
      lim=2.0
      [ $op = send ] || lim=2.5
      v=$(pfield "$k" 5)
      p99=$(pfield "$k" 8)
      shown=$v
      num "$v" && shown="$v µs (p99 $p99)"
      if num "$v" && num "$y" && [ "$(calc "b > 0" b="$y")" = 1 ]; then
        r=$(calc 'sprintf("%.2f×", a / b)' a="$v" b="$y")
        if [ "$(calc "a / b <= l" a="$v" b="$y" l="$lim")" = 1 ]; then t="≤ ${lim}×: met"; else t="≤ ${lim}×: **missed**"; fi
      else
        r="n/a"
        t="≤ ${lim}×: n/a"
      fi
      echo "| ib_${op}_lat -s 2, t_typical | $m | $shown | UDP busy-poll ping-pong, 2 B: $ys | $r | $t |"
      if num "$p99" && num "$y99" && [ "$(calc "b > 0" b="$y99")" = 1 ]; then
        r=$(calc 'sprintf("%.2f×", a / b)' a="$p99" b="$y99")
        if [ "$(calc "a / b <= 3" a="$p99" b="$y99")" = 1 ]; then t="≤ 3×: met"; else t="≤ 3×: **missed**"; fi
      else
        r="n/a"
        t="≤ 3×: n/a"
      fi
      echo "| ib_${op}_lat -s 2, p99 | $m | $p99 µs | UDP busy-poll ping-pong, 2 B, p99: $y99 µs | $r | $t |"
    done
    v=$(pfield "write_lat_uc_$m" 5)
    rcv=$(pfield "write_lat_$m" 5)
    if num "$v" && num "$rcv" && [ "$(calc "b > 0" b="$rcv")" = 1 ]; then
      r=$(calc 'sprintf("%.2f×", a / b)' a="$v" b="$rcv")
      if [ "$(calc "a / b <= 1.1" a="$v" b="$rcv")" = 1 ]; then t="≤ 1.1× RC: met"; else t="≤ 1.1× RC: **missed**"; fi
    else
      r="n/a"
      t="≤ 1.1× RC: n/a"
    fi
    echo "| ib_write_lat -c UC -s 2, t_typical | $m | $v µs (p99 $(pfield "write_lat_uc_$m" 8)) | ib_write_lat (RC): $rcv µs | $r | $t |"
  done
  v=$(pfield write_bw_4k_q1000 4)
  y=$(pfield write_bw_4k_q1 4)
  shown=$v; num "$v" && shown="$v MiB/s"
  ys=$y; num "$y" && ys="$y MiB/s"
  echo "| ib_write_bw -s 4096, 1000 QPs | 4096 | $shown | ib_write_bw -s 4096, 1 QP: $ys | $(fmt_ratio "$v" "$y") | $(verdict_ge "$v" "$y" 80) |"
  if num "$QS_MANY" && num "$QS_ONE" && [ "$(calc "b > 0" b="$QS_ONE")" = 1 ]; then
    r=$(calc 'sprintf("%.2f×", a / b)' a="$QS_MANY" b="$QS_ONE")
    if [ "$(calc "a / b <= 1.5" a="$QS_MANY" b="$QS_ONE")" = 1 ]; then t="≤ 1.5×: met"; else t="≤ 1.5×: **missed**"; fi
    echo "| $(echo "$QS_N" | sed -E ':a; s/([0-9])([0-9]{3})($|,)/\1,\2\3/; ta') QPs round-robin ping-pong, per message (qp_scale, 2 B round trip) | — | $QS_MANY µs | 1 QP: $QS_ONE µs | $r | $t |"
  else
    echo "| 1,000 QPs round-robin ping-pong, per message (qp_scale, 2 B round trip) | — | FAILED | 1 QP | n/a | ≤ 1.5×: n/a |"
  fi
  if num "$idle_pct"; then
    shown="$idle_pct% of a core"
    if [ "$(calc "p < 1" p="$idle_pct")" = 1 ]; then t="< 1%: met"; else t="< 1%: **missed**"; fi
    echo "| idle: 2 processes, 1 connected RC QP each, ${idle_secs} s | — | $shown ($idle_detail) | one core | $idle_pct% | $t |"
  else
    echo "| idle: 2 processes, 1 connected RC QP each | — | FAILED | one core | n/a | < 1%: n/a |"
  fi
} >"$table"
{
  echo
  echo "CPU cost per byte moved, ib_write_bw -s 65536 (one RC QP; utime+stime of each whole process over the transfer; cycles at the nominal ${cpu_mhz:-?} MHz):"
  echo
  echo "| MTU | uroce | responder (server): CPU per byte | requester (client, spins on its CQ): CPU per byte | cores busy (server + client) |"
  echo "|---|---|---|---|---|"
  for m in 4096 1024; do
    if [ "${CPU[$m.state]:-}" != ok ]; then
      echo "| $m | ${CPU[$m.state]:-not run} | n/a | n/a | n/a |"
      continue
    fi
    cyc() { num "$cpu_mhz" && calc 'sprintf(", %.2f cycles/B", n * mhz / 1000)' n="$1" mhz="$cpu_mhz"; }
    echo "| $m | ${CPU[$m.bw]} MiB/s | ${CPU[$m.server]} ns/B$(cyc "${CPU[$m.server]}") | ${CPU[$m.client]} ns/B$(cyc "${CPU[$m.client]}") | ${CPU[$m.scores]} + ${CPU[$m.ccores]} |"
  done
} >>"$table"
cat "$table"
if [ -n "${UROCE_BENCH_OUT:-}" ]; then
  cp "$table" "$UROCE_BENCH_OUT" || { echo "perftest.sh: cannot write $UROCE_BENCH_OUT" >&2; failures=$((failures + 1)); }
fi
# ---- history: a full run's ratios go to benches/history.csv and its chart
if [ "$quick" = 0 ] && [ "${UROCE_BENCH_HISTORY:-1}" != 0 ]; then
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
  if bash benches/history.sh append "$table" benches/history.csv "$commit" "$(date -u +%Y-%m-%dT%H:%MZ)"; then
    echo "perftest.sh: ratios appended to benches/history.csv"
    if bash benches/history.sh draw benches/history.csv benches/history.png; then
      echo "perftest.sh: chart in benches/history.png"
    fi
  fi
fi
echo
echo "perftest.sh: $((SECONDS - t_start)) s, $failures program(s) failed${failed_names[*]:+: ${failed_names[*]}}"
[ "$failures" = 0 ]
