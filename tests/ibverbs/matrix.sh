#!/usr/bin/env bash
# Debian's own RDMA programs, unmodified, on uroce's libibverbs.so.1.
#
# Installs ibverbs-utils, perftest, libibverbs-dev, python3-pyverbs,
# rdmacm-utils and librdmacm-dev if missing (as root),
# builds uroce (release), then runs:
#   * tests/ibverbs/symbols.sh: the libraries hold no symbol of the
#     provider's test machinery (its testing face, planted mistakes);
#   * tests/ibverbs/errors.c: error paths through the C API, the ibv_wr_*
#     API, ibv_cq_ex polling and a completion channel fd in poll(2);
#   * tests/ibverbs/mcast.c: UD multicast (attach/detach errors and limits,
#     a send to a group reaching the members of two devices);
#   * tests/ibverbs/hoplimit.c: the IP TTL a UD datagram arrives with, in
#     the receiver's GRH area: a multicast one's address handle hop limit,
#     a unicast one's route TTL;
#   * tests/ibverbs/handles.c: stale, garbled and foreign objects refused,
#     looping WR lists stopped at the queue's depth, each advertised object
#     limit enforced, an SRQ of another PD;
#   * tests/ibverbs/datapath.c: zero-based memory and regions at an iova,
#     completion timestamps, a UD address handle's traffic class in the
#     receiver's GRH, WRITE WITH IMMEDIATE into a small receive WR;
#   * tests/ibverbs/explain.c: with UROCE_EXPLAIN=1, a WRITE with a wrong
#     rkey (IBV_WC_REM_ACCESS_ERR) and the flush after it leave lines on
#     stderr naming the rkey, va, len, the failed check and the NAK;
#   * tests/ibverbs/signals.c: signals the program blocks and reads from a
#     signalfd reach it (no thread of the library takes them);
#   * tests/ibverbs/eintr.c: a signal handler interrupts ibv_get_cq_event,
#     ibv_get_async_event and rdma_get_cm_event (EINTR), or not
#     (SA_RESTART), as it interrupts a kernel device's read(2);
#   * tests/ibverbs/bigqueue.c: QPs and SRQs whose queues cannot be
#     allocated (RLIMIT_AS) are refused with ENOMEM, not an abort;
#   * tests/ibverbs/check_*.c: one mistake each, which the verbs checker
#     (UROCE_CHECK=1) must report once, naming the program's line;
#   * tests/ibverbs/contexts.c: no event at open, an async_fd per context
#     with the events of its own objects, EADDRINUSE for a taken address;
#   * ibv_devices and ibv_devinfo; tests/ibverbs/sysfs.c: the sysfs files
#     `uroce exec` answers for the devices, realpath through them and the
#     device node through every name of stat; tests/ibverbs/audit.sh: a
#     program with its own renamed libibverbs (as a Python wheel bundles
#     one) gets uroce's under `uroce exec`; pyverbs (python3-pyverbs), and
#     rdma-core's pyverbs test suite (tests/ibverbs/pyverbs.sh);
#   * ibv_rc/uc/ud/srq_pingpong -c (data checked), server and client in
#     their own processes; and each facing `uroce rc/uc/ud/srq-pingpong`,
#     both ways;
#   * perftest's ib_{send,write,read,atomic}_bw and ib_{send,write,read}_lat
#     over RC, and UC/UD where the tool offers them;
#   * tests/ibverbs/stat.sh: `uroce stat` against ibv_rc_pingpong's
#     server (its QP, receives and buffer), its socket gone at exit;
#   * tests/ibverbs/rdmacm.sh: the rdma_cm programs (rdmacm-utils' rping,
#     ucmatose, udaddy, rdma_server/rdma_client, perftest -R) on uroce's
#     librdmacm.so.1, and tests/ibverbs/rdmacm_errors.c; rsockets
#     (rstream, and tests/ibverbs/rsocket.sh: riostream, udpong's
#     datagram rsockets, and TCP programs and iperf3 under
#     librspreload.so);
#   * tests/ibverbs/ucx.sh: UCX's ucx_info and ucx_perftest (UCT over
#     rc_verbs and ud_verbs, UCP tag/put/get/am/stream) under `uroce exec`;
#   * tests/ibverbs/libfabric.sh: libfabric's fi_info and fi_pingpong
#     (verbs MSG and DGRAM, ofi_rxm, ofi_rxd) under `uroce exec`.
# Each pair gets its own devices (127.40.<n>.1 and .2, UDP 4791) and TCP
# port (18700 + n). The ping-pong and perftest pairs run again with both
# processes on ONE device (one UROCE_DEVICES entry, -d uroce0 on both;
# a subset, or all with UROCE_MATRIX_ONE_DEVICE=all), and the rdma_cm
# pairs so with UROCE_MATRIX_ONE_DEVICE_CM=1 (tests/ibverbs/rdmacm.sh). Prints each program's result line, then
# "ibverbs matrix: N passed, N failed"; exits non-zero on a failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

need=()
command -v ibv_rc_pingpong >/dev/null || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null || need+=(perftest)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
/usr/bin/python3 -c 'import pyverbs' 2>/dev/null || need+=(python3-pyverbs)
command -v ss >/dev/null || need+=(iproute2)
command -v rping >/dev/null || need+=(rdmacm-utils)
[ -e /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
command -v ucx_perftest >/dev/null || need+=(ucx-utils)
command -v fi_pingpong >/dev/null || need+=(libfabric-bin)
command -v patchelf >/dev/null || need+=(patchelf)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q "${need[@]}" >/dev/null 2>&1
  fi
  for p in ibv_rc_pingpong ib_write_bw ss rping; do
    command -v $p >/dev/null || { echo "ibverbs matrix: $p missing (apt-get install ${need[*]})"; exit 1; }
  done
fi

# The drop-in libraries in a cargo invocation of their own, uroce-cli in
# another: cargo unifies one invocation's features, and uroce-cli's
# (uroce-fuzz enables the provider's testing face) must not reach the
# libraries (tests/ibverbs/symbols.sh checks).
cargo build --release -q -p uroce-ibverbs -p uroce-preload || exit 1
cargo build --release -q -p uroce-cli || exit 1
libdir=$("$root/target/release/uroce" libdir) || exit 1
export LD_LIBRARY_PATH=$libdir
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
# With UROCE_CHECK set (the verbs checker on: see the book's "Finding your
# RDMA bug", docs/src/tools/check.md), an entry whose output holds a
# checker report fails, unless it plants mistakes on purpose (may_report=1
# pass ...) or the report is a mistake of the program that page names
# (known_reports=REGEX
# of the report lines allowed).
pass() {
  if [ -n "${UROCE_CHECK:-}" ] && [ -z "${may_report:-}" ] &&
    grep 'uroce check \[' "$tmp/out" 2>/dev/null | grep -qvE "${known_reports:-^$}"; then
    failed=$((failed + 1)); printf 'FAIL  %-34s %s\n' "$1" "UROCE_CHECK reported a mistake"
    grep -A12 'uroce check \[' "$tmp/out" | head -40 | sed 's/^/      | /'
    return
  fi
  passed=$((passed + 1)); printf 'ok    %-34s %s\n' "$1" "$2"
}
fail() {
  failed=$((failed + 1)); printf 'FAIL  %-34s %s\n' "$1" "$2"
  sed 's/^/      | /' "$tmp/out" | tail -20
}

# No test machinery in the libraries just built (tests/ibverbs/symbols.sh).
. "$root/tests/ibverbs/symbols.sh"

# ---- the C error-path program
cc -O1 -Wall -o "$tmp/errors" tests/ibverbs/errors.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.40.2.1,uroce1=127.40.2.2 timeout 60 "$tmp/errors" >"$tmp/out" 2>&1; then
  may_report=1 pass "errors.c" "$(tail -1 "$tmp/out")"
else
  fail "errors.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- stale and garbled objects, looping WR lists, object limits, an SRQ of
# another PD (handles.c caps its own address space: a list that allocates
# without end fails here)
cc -O1 -Wall -o "$tmp/handles" tests/ibverbs/handles.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.101.1.1,uroce1=127.101.1.2 timeout 300 "$tmp/handles" >"$tmp/out" 2>&1; then
  may_report=1 pass "handles.c" "$(tail -1 "$tmp/out")"
else
  fail "handles.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- UD multicast: attach/detach errors, rxe's limits, a send to a group
# reaching both devices' members
cc -O1 -Wall -o "$tmp/mcast" tests/ibverbs/mcast.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.106.3.1,uroce1=127.106.3.2 timeout 60 "$tmp/mcast" >"$tmp/out" 2>&1; then
  pass "mcast.c" "$(tail -1 "$tmp/out")"
else
  fail "mcast.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- the TTL of UD datagrams: the address handle's hop limit to a group,
# the route's to a unicast address (devices 127.110.4.1 and .2)
cc -O1 -Wall -o "$tmp/hoplimit" tests/ibverbs/hoplimit.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.110.4.1,uroce1=127.110.4.2 timeout 60 "$tmp/hoplimit" >"$tmp/out" 2>&1; then
  pass "hoplimit.c" "$(tail -1 "$tmp/out")"
else
  fail "hoplimit.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- the data path: zero-based memory, completion timestamps, UD traffic
# class, WRITE WITH IMMEDIATE into a small receive WR
cc -O1 -Wall -o "$tmp/datapath" tests/ibverbs/datapath.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.103.9.1,uroce1=127.103.9.2 timeout 60 "$tmp/datapath" >"$tmp/out" 2>&1; then
  pass "datapath.c" "$(tail -1 "$tmp/out")"
else
  fail "datapath.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- errors that explain themselves: UROCE_EXPLAIN=1 puts the failed
# check of a WRITE with a wrong rkey on stderr, on both sides
cc -O1 -Wall -o "$tmp/explain" tests/ibverbs/explain.c -libverbs || exit 1
if UROCE_EXPLAIN=1 UROCE_DEVICES=uroce0=127.118.1.1,uroce1=127.118.1.2 timeout 60 "$tmp/explain" >"$tmp/out" 2>&1; then
  pass "explain.c" "$(tail -1 "$tmp/out")"
else
  fail "explain.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- signals the program blocks stay its own (no library thread takes them)
cc -O1 -Wall -o "$tmp/signals" tests/ibverbs/signals.c -libverbs -lrdmacm -lpthread || exit 1
if UROCE_DEVICES=uroce0=127.40.9.1,uroce1=127.40.9.2 timeout 60 "$tmp/signals" >"$tmp/out" 2>&1; then
  pass "signals.c" "$(tail -1 "$tmp/out")"
else
  fail "signals.c" "exit $? (a library thread took a signal the program blocks)"
fi

# ---- signals interrupt blocking event calls as with a kernel device:
# EINTR without SA_RESTART, the wait restarted with it, EAGAIN when the
# descriptor is non-blocking
cc -O1 -Wall -o "$tmp/eintr" tests/ibverbs/eintr.c -libverbs -lrdmacm -lpthread || exit 1
if UROCE_DEVICES=uroce0=127.108.1.1 timeout 60 "$tmp/eintr" >"$tmp/out" 2>&1; then
  pass "eintr.c" "$(tail -1 "$tmp/out")"
else
  fail "eintr.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- a QP/SRQ whose queues cannot be allocated (under RLIMIT_AS) is
# refused with ENOMEM, and the process lives on
cc -O1 -Wall -o "$tmp/bigqueue" tests/ibverbs/bigqueue.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.108.1.3 timeout 60 "$tmp/bigqueue" >"$tmp/out" 2>&1; then
  pass "bigqueue.c" "$(tail -1 "$tmp/out")"
else
  fail "bigqueue.c" "exit $? ($(grep -c FAIL "$tmp/out") checks failed)"
fi

# ---- contexts: no event at open, an async_fd per context, events to the
# object's context, EADDRINUSE for a taken address
cc -O1 -Wall -o "$tmp/contexts" tests/ibverbs/contexts.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.40.4.1 timeout 60 "$tmp/contexts" >"$tmp/out" 2>&1; then
  pass "contexts.c" "$(tail -1 "$tmp/out")"
else
  fail "contexts.c" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- the verbs checker (UROCE_CHECK=1): each tests/ibverbs/check_NAME.c
# makes one mistake; exactly one report of its category must reach stderr,
# naming the program's own source line (built with -g, the backtrace is
# symbolised). Each also passes its own checks. NAME:CATEGORY[:REGEX]: the
# report must also match REGEX (when it was made).
for c in buffer:buffer:after.it.was.sent sent:buffer:before.it.was.sent \
  recv_buf:buffer:ibv_post_recv.and.the.arrival read_target:buffer:RDMA.READ \
  dereg:lifetime destroy_qp:lifetime ah:lifetime \
  unsignaled:queue cq_size:queue ack:event cq_poll:event:never.polled \
  cq_event:event:second.completion.event err_post:post pd:post inline:post \
  atomic_lkey:post:sent.anyway; do
  t=check_${c%%:*} cat=${c#*:} want=.
  case $cat in *:*) want=${cat#*:} cat=${cat%%:*} ;; esac
  cc -g -O0 -Wall -o "$tmp/$t" "tests/ibverbs/$t.c" -libverbs || exit 1
  UROCE_CHECK=1 UROCE_DEVICES=uroce0=127.117.1.1,uroce1=127.117.1.2 timeout 60 \
    "$tmp/$t" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  n=$(grep -c '^uroce check \[' "$tmp/err")
  cat "$tmp/err" >>"$tmp/out"
  if [ $rc = 0 ] && [ "$n" = 1 ] && grep "^uroce check \[$cat\]" "$tmp/err" | grep -q "$want" &&
    grep -q "$t\.c:[0-9]" "$tmp/err"; then
    may_report=1 pass "$t.c (UROCE_CHECK)" "[$cat] at $(grep -m1 -o "$t\.c:[0-9]*" "$tmp/err")"
  else
    fail "$t.c (UROCE_CHECK)" "exit $rc, $n reports (1 [$cat] naming $t.c expected)"
  fi
done

# ---- device listing
export UROCE_DEVICES=uroce0=127.40.3.1,uroce1=127.40.3.2
if timeout 20 ibv_devices >"$tmp/out" 2>&1 && grep -q "uroce1 .*027572fffe280302" "$tmp/out"; then
  pass ibv_devices "$(grep uroce0 "$tmp/out" | tr -s ' \t' ' ')"
else
  fail ibv_devices "uroce0/uroce1 with their GUIDs not listed"
fi
if timeout 20 ibv_devinfo -v >"$tmp/out" 2>&1 && grep -q "PORT_ACTIVE" "$tmp/out" &&
  grep -q "GID\[  0\]:.*::ffff:127.40.3.2, RoCE v2" "$tmp/out"; then
  pass ibv_devinfo "$(grep -m1 -E 'active_mtu' "$tmp/out" | tr -s ' \t' ' '),$(grep -m1 'GID\[' "$tmp/out" | tr -s ' \t' ' ')"
else
  fail ibv_devinfo "no active port or RoCE v2 GID"
fi

# ---- the sysfs view `uroce exec` gives (tests/ibverbs/sysfs.c): the files
# programs read for RDMA devices agree with the verbs calls
cc -O1 -Wall -o "$tmp/sysfs" tests/ibverbs/sysfs.c -libverbs || exit 1
if UROCE_DEVICES=uroce0=127.105.1.1,uroce1=127.105.1.2 timeout 20 \
  "$root/target/release/uroce" exec "$tmp/sysfs" >"$tmp/out" 2>&1; then
  pass "sysfs.c (uroce exec)" "$(tail -1 "$tmp/out")"
else
  fail "sysfs.c (uroce exec)" "$(grep -c FAIL "$tmp/out") checks failed"
fi

# ---- a bundled, renamed libibverbs found through RUNPATH (tests/ibverbs/audit.sh)
. "$root/tests/ibverbs/audit.sh"

# ---- pyverbs binds every libibverbs symbol, by version, at import
if /usr/bin/python3 -c 'import pyverbs' 2>/dev/null; then
  if timeout 30 /usr/bin/python3 - >"$tmp/out" 2>&1 <<'EOF'
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.pd import PD
names = [x.name.decode() for x in d.get_device_list()]
ctx = d.Context(name="uroce0")
pd = PD(ctx)
mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
mr.write(b"pyverbs", 7)
assert mr.read(7, 0) == b"pyverbs"
print(f"devices {names}, port state {ctx.query_port(1).state}, gid {ctx.query_gid(1, 0)}")
EOF
  then
    pass pyverbs "$(tail -1 "$tmp/out")"
  else
    fail pyverbs "import or calls failed"
  fi
  # rdma-core's pyverbs test suite (tests/ibverbs/pyverbs.sh).
  . "$root/tests/ibverbs/pyverbs.sh"
  # Two of its tests plant the mistakes they expect to fail (an lkey that
  # names no region; a receive WR's region re-registered to another PD).
  # And its traffic() (tests/utils.py) posts the receive WRs into the MR
  # it then writes each message to send into (get_send_elements'
  # mem_write): the program's write into a posted receive buffer, which
  # the peer's message overwrites (see docs/src/tools/check.md).
  pyverbs_known='^pyverbs suite: uroce check \[(post\]: (send WR wr_id 0 on QP 0x[0-9a-f]+, SGE 8 bytes at 0x[0-9a-f]+: lkey 0x[0-9a-f]+ names no registered region|receive WR wr_id 0 on QP 0x[0-9a-f]+, SGE 1024 bytes at 0x[0-9a-f]+: lkey 0x[0-9a-f]+ is a region of another protection domain)|buffer\]: the application wrote into the buffer of receive WR wr_id 0 on QP 0x[0-9a-f]+ \([0-9]+ bytes at 0x[0-9a-f]+, lkey 0x[0-9a-f]+; first at byte 0 of the message\))'
  if pyverbs_suite >"$tmp/out" 2>&1; then
    known_reports=$pyverbs_known pass "pyverbs suite (rdma-core v44)" "$(head -1 "$tmp/out" | sed 's/^pyverbs suite: //')"
  else
    fail "pyverbs suite (rdma-core v44)" "$(head -1 "$tmp/out" | sed 's/^pyverbs suite: //')"
  fi
fi

# ---- server/client pairs
n=10
# cross NAME RESULT-REGEX SERVER-COMMAND ARGS... -- CLIENT-COMMAND ARGS...:
# the server runs with -d uroce0, the client with -d uroce1 and the
# server's address (TCP); each pair gets its own devices and port.
# With one_device=1 both run with -d uroce0 on ONE device (one
# UROCE_DEVICES entry, as two terminals on a host with a kernel device:
# docs/src/guide/sharing.md), and the name says ", one device"; only the
# pairs whose name matches $one_device_some run so, unless
# UROCE_MATRIX_ONE_DEVICE=all.
cross() {
  local name=$1 regex=$2
  shift 2
  local server=() client=()
  while [ "$1" != "--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  if [ -n "${one_device:-}" ]; then
    [ "${UROCE_MATRIX_ONE_DEVICE:-}" = all ] || [[ $name =~ $one_device_some ]] || return 0
    name="$name, one device"
  fi
  n=$((n + 1))
  local port=$((18700 + n)) cdev=uroce1
  export UROCE_DEVICES="uroce0=127.40.$n.1,uroce1=127.40.$n.2"
  [ -z "${one_device:-}" ] || { cdev=uroce0; export UROCE_DEVICES="uroce0=127.40.$n.1"; }
  timeout 90 "${server[@]}" -d uroce0 -p "$port" >"$tmp/server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  timeout 90 "${client[@]}" -d $cdev -p "$port" 127.40.$n.1 >"$tmp/client" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
  local line
  line=$(grep -m1 -E "$regex" "$tmp/client" | tr -s ' \t' ' ')
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] && ! grep -q "invalid data" "$tmp/out"; then
    pass "$name" "$line"
  else
    fail "$name" "client exit $crc, server exit $src"
  fi
}
# pair NAME RESULT-REGEX COMMAND ARGS...: the same program on both sides.
pair() {
  local name=$1 regex=$2
  shift 2
  cross "$name" "$regex" "$@" -- "$@"
}

pp='iters in'
# ibv_srq_pingpong leaves the loop once its counts of all QPs' sends and
# receives reach -n, while SENDs it posted on other QPs are in flight, and
# destroys those QPs (docs/src/tools/check.md, "Finding your RDMA bug").
srq_known='^uroce check \[lifetime\]: QP 0x[0-9a-f]+ destroyed with 1 send WR\(s\) outstanding \(oldest: SEND wr_id 2\)'
# With -c the client writes its check pattern into the buffer its posted
# receive WRs own (rc_pingpong.c: pp_post_recv, then ctx->buf[i] = ... before
# the first pp_post_send), which the server's message then overwrites; uroce's
# ping-pong commands do as rdma-core's (docs/src/tools/check.md).
srq_known="$srq_known|"'uroce check \[buffer\]: the application wrote into the buffer of receive WR wr_id 1 on QP 0x[0-9a-f]+ \([0-9]+ bytes at 0x[0-9a-f]+, lkey 0x[0-9a-f]+; first at byte 0 of the message\)'
uroce=$root/target/release/uroce
bw='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
lat='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+'
# The ping-pong and perftest pairs; run on two devices, then on one.
verbs_pairs() {
  for t in rc uc ud srq; do
    known_reports=$srq_known pair "ibv_${t}_pingpong -c" "$pp" "ibv_${t}_pingpong" -g 0 -c
  done
  # -e: sleep on the completion channel.
  known_reports=$srq_known pair "ibv_rc_pingpong -c -e" "$pp" ibv_rc_pingpong -g 0 -c -e

  # uroce's own ping-pong commands facing rdma-core's tools (exchange format,
  # options, buffer layout: UD data after the 40-byte GRH, SRQ's 256 slots).
  for t in rc uc ud srq; do
    known_reports=$srq_known cross "srv ibv_${t}_pingpong, cli uroce" "$pp" "ibv_${t}_pingpong" -g 0 -c -- "$uroce" "$t-pingpong" -g 0 -c
    known_reports=$srq_known cross "srv uroce, cli ibv_${t}_pingpong" "$pp" "$uroce" "$t-pingpong" -g 0 -c -- "ibv_${t}_pingpong" -g 0 -c
  done

  # Every RC operation, and IBA 1.5's ATOMIC WRITE and FLUSH (which the
  # interop guest's rxe, Linux 6.1, lacks), between two uroce processes,
  # every byte verified.
  cross "uroce rc-stress --ext" 'rc-stress: .* 0 errors' "$uroce" rc-stress -n 3000 -- "$uroce" rc-stress -n 3000 --ext

  pair "ib_send_bw RC" "$bw" ib_send_bw -x 0
  # UC and UD have no retransmission: a SEND that finds the receive queue
  # empty is dropped, as on hardware, and a counted run would then wait
  # forever for it. perftest's duration mode (-D) is made for that.
  pair "ib_send_bw UC -D 2" "$bw" ib_send_bw -x 0 -c UC -D 2
  pair "ib_send_bw UD -D 2" "$bw" ib_send_bw -x 0 -c UD -D 2
  pair "ib_write_bw RC" "$bw" ib_write_bw -x 0
  pair "ib_write_bw UC" "$bw" ib_write_bw -x 0 -c UC
  pair "ib_read_bw RC" "$bw" ib_read_bw -x 0
  pair "ib_atomic_bw RC" "$bw" ib_atomic_bw -x 0
  pair "ib_send_lat RC" "$lat" ib_send_lat -x 0
  pair "ib_send_lat UC" "$lat" ib_send_lat -x 0 -c UC
  pair "ib_send_lat UD" "$lat" ib_send_lat -x 0 -c UD
  pair "ib_write_lat RC" "$lat" ib_write_lat -x 0
  pair "ib_write_lat UC" "$lat" ib_write_lat -x 0 -c UC
  pair "ib_read_lat RC" "$lat" ib_read_lat -x 0
  pair "ib_send_bw RC -e" "$bw" ib_send_bw -x 0 -e
  pair "ib_send_lat RC -e" "$lat" ib_send_lat -x 0 -e
}
verbs_pairs
# And both sides on ONE device, -d uroce0 on each (cross above): by
# default a subset that has each tool and transport once (RC, UC, UD, an
# SRQ, READ, atomics, a completion channel, uroce's commands facing
# rdma-core's), about 15 s more on 2 cores; UROCE_MATRIX_ONE_DEVICE=all
# runs every pair so (about 35 s more; the stage took 300 s then, on a
# loaded machine).
one_device_some='^(ibv_(rc|ud|srq)_pingpong -c|srv uroce, cli ibv_uc_pingpong|uroce rc-stress --ext|ib_send_bw UD -D 2|ib_write_bw UC|ib_read_bw RC|ib_atomic_bw RC|ib_write_lat RC|ib_send_lat RC -e)$'
one_device=1 verbs_pairs

# uroce stat against ibv_rc_pingpong (tests/ibverbs/stat.sh).
. "$root/tests/ibverbs/stat.sh"

# rdma_cm: rdmacm-utils and perftest -R on uroce's librdmacm.so.1.
. "$root/tests/ibverbs/rdmacm.sh"

# UCX: ucx_info and ucx_perftest's UCT and UCP tests (tests/ibverbs/ucx.sh).
. "$root/tests/ibverbs/ucx.sh"

# libfabric: fi_info and fi_pingpong over verbs MSG/DGRAM, ofi_rxm and
# ofi_rxd (tests/ibverbs/libfabric.sh).
. "$root/tests/ibverbs/libfabric.sh"

echo "ibverbs matrix: $passed passed, $failed failed"
[ "$failed" = 0 ]
