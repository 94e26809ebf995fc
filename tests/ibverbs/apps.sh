#!/usr/bin/env bash
# Real applications on uroce, as their users run them: two processes on two
# uroce devices, under `uroce exec` (uroce's libibverbs.so.1/librdmacm.so.1
# and liburoce_preload.so), each program under `timeout`.
#
#   * Open MPI 4.1 and MPICH 4.0 over UCX (rc_verbs/ud_verbs only, never
#     shared memory) running tests/ibverbs/mpi_check.c: a data-checked
#     ping-pong and bandwidth loop, and one-sided MPI_Win_allocate with
#     MPI_Put/MPI_Get/MPI_Accumulate between fences. UCX's own log must
#     show the verbs lane on uroce0, so a run that fell back to anything
#     else cannot pass. Two ranks on two devices, and a plain
#     `mpirun -np 4` whose four ranks share one device (no per-rank
#     wrapper: mpirun under `uroce exec`, one UROCE_DEVICES for all);
#   * qperf's RC tests (rdma_cm, -cm1), each client timed: it must return
#     within a few seconds of its one-second test;
#   * tgt's iSER target (tgtd, a file-backed LUN made with tgtadm) with
#     libiscsi's initiator tools over iser:// URLs: iscsi-inq,
#     iscsi-readcapacity16 and iscsi-test-cu's WRITE/READ/VERIFY/COMPARE
#     AND WRITE tests (data compared on the target);
#   * fio's rdma engine: RDMA WRITE, RDMA READ, and SEND/RECV with the
#     receiver verifying every block (verify=crc32c);
#   * librpma's messaging examples 12, 12scch and 13 (tests/ibverbs/rpma_msg.c
#     on Debian's librpma-dev): an unsignaled SEND and at once a
#     disconnect, twenty times each, none may hang;
#   * Python wheels from PyPI, each in a venv of its own, run as
#     `uroce exec -- python3 ...`: Mooncake Transfer Engine's Python API
#     and its transfer_engine_bench (device discovery from sysfs), NIXL's
#     UCX backend (the wheel's own UCX and libibverbs). WRITE and READ
#     verified, and uroce's counters (`uroce stat`) must show the bytes
#     went over its devices: both fall back to other transports quietly.
#
# Installs the Debian packages when root and missing; an app whose package
# is still missing is skipped with a message. Devices 127.104.<n>.1 (server)
# and .2 (client), TCP ports 19400-19499. Prints each result line, then
# "apps: N passed, N failed" (read by .ci/run); exits non-zero on a failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

pkgs=(openmpi-bin libopenmpi-dev mpich libmpich-dev ucx-utils qperf tgt libiscsi-bin fio iproute2
  librpma-dev python3-venv)
need=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ] && [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null 2>&1 || true
  apt-get install -y -q "${need[@]}" >/dev/null 2>&1 || echo "apps.sh: could not install ${need[*]}"
fi

# The drop-in libraries in a cargo invocation of their own, uroce-cli in
# another: cargo unifies one invocation's features, and uroce-cli's
# (uroce-fuzz enables the provider's testing face) must not reach the
# libraries (tests/ibverbs/symbols.sh checks).
cargo build --release -q -p uroce-ibverbs -p uroce-preload || exit 1
cargo build --release -q -p uroce-cli || exit 1
uroce=$root/target/release/uroce
ux=("$uroce" exec --)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
# With UROCE_CHECK set (the verbs checker on: see the book's "Finding your
# RDMA bug", docs/src/tools/check.md), an entry whose output ($tmp/out, and
# the files named in check_also) holds a checker report fails, unless that
# page names it as a mistake of the program (known_reports=REGEX of the report lines allowed).
pass() {
  if [ -n "${UROCE_CHECK:-}" ] &&
    cat "$tmp/out" ${check_also:-} 2>/dev/null | grep 'uroce check \[' | grep -qvE "${known_reports:-^$}"; then
    failed=$((failed + 1)); printf 'FAIL  %-34s %s\n' "$1" "UROCE_CHECK reported a mistake"
    cat "$tmp/out" ${check_also:-} 2>/dev/null | grep -A12 'uroce check \[' | head -40 | sed 's/^/      | /'
    return
  fi
  passed=$((passed + 1)); printf 'ok    %-34s %s\n' "$1" "$2"
}
fail() {
  failed=$((failed + 1)); printf 'FAIL  %-34s %s\n' "$1" "$2"
  sed 's/^/      | /' "$tmp/out" | tail -20
}
skip() { printf 'skip  %-34s %s\n' "$1" "$2"; }
# have PROGRAM...: every program is there.
have() {
  local p
  for p in "$@"; do [ -x "$p" ] || command -v "$p" >/dev/null || return 1; done
}
# wait_port PORT: until something listens on TCP PORT (5 s at most).
wait_port() {
  for _ in $(seq 50); do
    ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.1
  done
  return 1
}
# The elapsed seconds since $1 (an $EPOCHREALTIME), to 0.1 s.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# ---- MPI over UCX
# Two ranks on one host must not meet in shared memory: UCX may use
# rc_verbs, ud_verbs and self (a rank to itself) only, on uroce0. UCX's
# info log names the lanes each endpoint got ("ep_cfg[1]: tag(rc_verbs/
# uroce0:1)"): the entry passes only when the peer's lane is a verbs one.
export UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=uroce0:1
n=0
# mpi NAME MODE LANES MPIRUN ARGS... -- PROGRAM: two ranks of PROGRAM MODE,
# rank 0 on 127.104.<n>.1 and rank 1 on .2; each of LANES (tag, rma) must be a
# verbs lane in UCX's log. With mpi_np4=1 instead a plain `mpirun -np 4
# PROGRAM MODE`, as on a host with one kernel RDMA device: mpirun itself
# under `uroce exec`, one UROCE_DEVICES entry (uroce0=127.104.<n>.1) for
# every rank, so the four ranks share the one device
# (docs/src/guide/sharing.md) and every pair of them meets over its
# verbs lanes.
mpi() {
  local name=$1 mode=$2 lane=$3
  shift 3
  local run=()
  while [ "$1" != "--" ]; do run+=("$1"); shift; done
  local prog=$2
  n=$((n + 1))
  if [ -n "${mpi_np4:-}" ]; then
    UROCE_DEVICES="uroce0=127.104.$n.1" timeout -k 5 180 "${ux[@]}" "${run[@]}" -np 4 "$prog" "$mode" >"$tmp/out" 2>&1
  else
    timeout -k 5 90 "${run[@]}" \
      -np 1 env UROCE_DEVICES="uroce0=127.104.$n.1" "${ux[@]}" "$prog" "$mode" : \
      -np 1 env UROCE_DEVICES="uroce0=127.104.$n.2" "${ux[@]}" "$prog" "$mode" >"$tmp/out" 2>&1
  fi
  mpi_judge "$name" "$lane" $?
}
# mpi_judge NAME LANES RC: the entry passes when mpirun exited 0 (RC),
# rank 0 printed its "mpi_check: ok" line and UCX's log shows, for each
# of LANES (tag, rma), such a lane over rc_verbs or ud_verbs on uroce0.
mpi_judge() {
  local name=$1 lanes=$2 rc=$3
  local line lane missing=""
  line=$(grep -m1 '^mpi_check: ok' "$tmp/out")
  for lane in $lanes; do
    grep -Eq "ep_cfg\[[0-9]+\]: .*$lane\((rc|ud)_verbs/uroce0:1" "$tmp/out" || missing="$missing $lane"
  done
  if [ $rc = 0 ] && [ -n "$line" ] && [ -z "$missing" ]; then
    pass "$name" "${line#mpi_check: ok: }"
  elif [ $rc = 0 ] && [ -n "$line" ]; then
    fail "$name" "ran, but UCX's log shows no$missing lane over rc_verbs/ud_verbs on uroce0"
  else
    fail "$name" "mpirun exit $rc"
  fi
}

ompi_run=(/usr/bin/mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none
  --mca pml ucx --mca pml_ucx_devices any --mca osc ucx --mca btl self
  -x UCX_TLS -x UCX_NET_DEVICES -x UCX_LOG_LEVEL=info)
mpich_run=(/usr/bin/mpirun.mpich -genv UCX_LOG_LEVEL info)
if have /usr/bin/mpicc.openmpi /usr/bin/mpirun.openmpi &&
  /usr/bin/mpicc.openmpi -O2 -Wall -o "$tmp/mpi_ompi" tests/ibverbs/mpi_check.c 2>"$tmp/out"; then
  mpi "Open MPI p2p (pml ucx)" p2p tag "${ompi_run[@]}" -- "$tmp/mpi_ompi"
  # osc ucx opens a second UCP context on the device (issue #24 item 11).
  mpi "Open MPI one-sided (osc ucx)" rma rma "${ompi_run[@]}" -- "$tmp/mpi_ompi"
  mpi_np4=1 mpi "Open MPI -np 4, one device" all "tag rma" "${ompi_run[@]}" -- "$tmp/mpi_ompi"
else
  skip "Open MPI" "mpicc.openmpi/mpirun.openmpi missing or failed (apt-get install openmpi-bin libopenmpi-dev)"
fi
if have /usr/bin/mpicc.mpich /usr/bin/mpirun.mpich &&
  /usr/bin/mpicc.mpich -O2 -Wall -o "$tmp/mpi_mpich" tests/ibverbs/mpi_check.c 2>"$tmp/out"; then
  mpi "MPICH p2p (ch4:ucx)" p2p tag "${mpich_run[@]}" -- "$tmp/mpi_mpich"
  mpi "MPICH one-sided (ch4:ucx)" rma rma "${mpich_run[@]}" -- "$tmp/mpi_mpich"
  mpi_np4=1 mpi "MPICH -np 4, one device" all "tag rma" "${mpich_run[@]}" -- "$tmp/mpi_mpich"
else
  skip "MPICH" "mpicc.mpich/mpirun.mpich missing or failed (apt-get install mpich libmpich-dev)"
fi
unset UCX_TLS UCX_NET_DEVICES

# ---- qperf's RC tests over rdma_cm
# One server; each test is its own client process with a one-second test
# (-t 1). The client must print its figure and exit within 5 s of starting
# (connection, the test, teardown): the disconnect must not hang.
# qperf 0.4.11 (Debian 12's) never destroys the server's QP: cm_open_server
# makes it on the CONNECT_REQUEST's id while cm_close destroys the
# listening id's (fixed upstream after 0.4.11, qperf commit 83bc16e "Use
# the rdma_cm_id from CMINFO rather than from the event"); rd_close then
# deregisters the region under the QP's last WR, still outstanding. The
# book's "Finding your RDMA bug" (docs/src/tools/check.md) names the
# report, the one allowed here.
qperf_known='uroce check \[lifetime\]: ibv_dereg_mr of the region with lkey 0x[0-9a-f]+ while [0-9]+ send WR\(s\) outstanding on QP 0x[0-9a-f]+ use it'
if have qperf; then
  qport=19450
  UROCE_DEVICES=uroce0=127.104.20.1 timeout -k 2 240 "${ux[@]}" qperf -lp $qport >"$tmp/qserver" 2>&1 &
  qpid=$!
  if wait_port $qport; then
    for t in rc_bw rc_bi_bw rc_lat rc_rdma_read_bw rc_rdma_read_lat rc_rdma_write_bw \
      rc_rdma_write_lat rc_rdma_write_poll_lat rc_compare_swap_mr rc_fetch_add_mr \
      ver_rc_compare_swap ver_rc_fetch_add; do
      t0=$EPOCHREALTIME
      qmark=$(wc -l <"$tmp/qserver")
      UROCE_DEVICES=uroce0=127.104.20.2 timeout -k 1 10 stdbuf -oL "${ux[@]}" \
        qperf -lp $qport -cm1 -t 1 127.104.20.1 "$t" >"$tmp/out" 2>&1
      rc=$?
      took=$(since "$t0")
      line=$(grep -m1 ' = ' "$tmp/out" | tr -s ' ')
      # The server's reports during this test count too.
      tail -n +$((qmark + 1)) "$tmp/qserver" >"$tmp/qnew"
      if [ $rc = 0 ] && [ -n "$line" ] && awk -v s="$took" 'BEGIN { exit !(s <= 5) }'; then
        check_also=$tmp/qnew known_reports=$qperf_known pass "qperf $t" "${line# } (client returned after $took s)"
      elif [ -n "$line" ]; then
        fail "qperf $t" "${line# }, but the client had not returned after $took s (exit $rc)"
      elif [ $rc = 124 ] || [ $rc = 137 ]; then
        # qperf prints its figure after the connection is torn down.
        fail "qperf $t" "no result: the client had not returned after $took s (hangs in teardown?)"
      else
        fail "qperf $t" "no result, exit $rc after $took s"
      fi
    done
  else
    cp "$tmp/qserver" "$tmp/out"
    fail "qperf" "the server did not listen on $qport"
  fi
  kill "$qpid" 2>/dev/null
  wait "$qpid" 2>/dev/null
else
  skip "qperf" "qperf missing (apt-get install qperf)"
fi

# ---- tgt's iSER target, libiscsi's initiator
# tgtd serves iSER on rdma_cm port 19460 (every address of its device) and
# plain iSCSI on 127.104.30.1:19461; its control socket is
# /var/run/tgtd/socket.104. tgtd needs root.
tgt_ctl=(tgtadm -C 104)
tgt_stop() {
  "${tgt_ctl[@]}" --op delete --mode system >/dev/null 2>&1
  for _ in $(seq 30); do kill -0 "$tpid" 2>/dev/null || break; sleep 0.1; done
  kill "$tpid" 2>/dev/null
  wait "$tpid" 2>/dev/null
}
if ! have tgtd tgtadm; then
  skip "tgt iSER" "tgtd missing (apt-get install tgt)"
elif ! have iscsi-inq iscsi-readcapacity16 iscsi-test-cu; then
  skip "tgt iSER" "libiscsi's tools missing (apt-get install libiscsi-bin)"
elif [ "$(id -u)" != 0 ]; then
  skip "tgt iSER" "tgtd needs root"
else
  iqn=iqn.2026-11.org.uroce:apps
  # tgt before 1.0.95 (Debian 12 has 1.0.85) refuses an iSER login with
  # "Target not found" unless the initiator passes both the address ACL
  # and an initiator-name ACL (iser_text.c's login start wants
  # ip_acl() && iqn_acl() to succeed; the TCP driver wants either; fixed
  # upstream in tgt commit b73c64d). So the target also gets an
  # initiator-name ACL and every tool logs in with that name (-i).
  ini_iqn=iqn.2026-11.org.uroce:initiator
  url=iser://127.104.30.1:19460/$iqn/1
  truncate -s 64M "$tmp/lun.img"
  UROCE_DEVICES=uroce0=127.104.30.1 timeout -k 2 240 "${ux[@]}" \
    tgtd -f -C 104 --iser port=19460 --iscsi portal=127.104.30.1:19461 >"$tmp/tgtd" 2>&1 &
  tpid=$!
  for _ in $(seq 50); do
    [ -S /var/run/tgtd/socket.104 ] && "${tgt_ctl[@]}" --op show --mode sys >/dev/null 2>&1 && break
    sleep 0.1
  done
  if "${tgt_ctl[@]}" --lld iser --op new --mode target --tid 1 -T "$iqn" >"$tmp/out" 2>&1 &&
    "${tgt_ctl[@]}" --lld iser --op new --mode logicalunit --tid 1 --lun 1 -b "$tmp/lun.img" >>"$tmp/out" 2>&1 &&
    "${tgt_ctl[@]}" --lld iser --op bind --mode target --tid 1 -I ALL >>"$tmp/out" 2>&1 &&
    "${tgt_ctl[@]}" --lld iser --op bind --mode target --tid 1 -Q "$ini_iqn" >>"$tmp/out" 2>&1; then
    pass "tgtd iser target" "LUN 1: 64 MiB file, iSER on port 19460"
    # ini NAME REGEX PROGRAM ARGS...: an initiator tool on 127.104.30.2;
    # passes when it exits 0 and prints REGEX. libiscsi 1.19 (Debian 12's)
    # allocates its iSER connection uninitialised and walks its tx_desc
    # list from whatever the heap held (iscsi_init_iser_transport's
    # iscsi_malloc; valgrind: "Conditional jump or move depends on
    # uninitialised value(s)" in cm_thread's iser_reg_mr): a segfault
    # once the heap holds other bytes there, as it does under UROCE_CHECK
    # (fixed in libiscsi 1.20, commit b4ba920 "iser: fix segfault at
    # iser_reg_mr"). MALLOC_PERTURB_=255 makes glibc's malloc return
    # zeroed memory, as the fix's iscsi_zmalloc does.
    ini() {
      local name=$1 regex=$2
      shift 2
      MALLOC_PERTURB_=255 UROCE_DEVICES=uroce0=127.104.30.2 timeout -k 2 60 "${ux[@]}" "$@" >"$tmp/out" 2>&1
      local rc=$?
      local line
      line=$(grep -m1 -E "$regex" "$tmp/out" | tr -s ' \t' ' ')
      if [ $rc = 0 ] && [ -n "$line" ]; then
        check_also=$tmp/tgtd pass "$name" "$line"
      else
        fail "$name" "exit $rc"
      fi
    }
    ini "iscsi-inq (iser)" 'Vendor|Product' iscsi-inq -i "$ini_iqn" "$url"
    ini "iscsi-readcapacity16 (iser)" '[Ss]ize|LBA|[Bb]lock' iscsi-readcapacity16 -i "$ini_iqn" "$url"
    for t in SCSI.Write16.Simple SCSI.Read16.Simple SCSI.Verify16.Simple SCSI.Verify16.Mismatch \
      SCSI.CompareAndWrite.Simple SCSI.CompareAndWrite.Miscompare; do
      ini "iscsi-test-cu $t (iser)" 'Run Summary|passed' iscsi-test-cu -i "$ini_iqn" --dataloss --fail -s -t "$t" "$url"
    done
  else
    cat "$tmp/tgtd" >>"$tmp/out"
    fail "tgtd iser target" "tgtadm could not make the target (iSER driver not started?)"
  fi
  tgt_stop
fi

# ---- fio's rdma engine
# The server is the reading job (rw=read), the client the writing one
# (rw=write) with verb= the operation. Jobs run as threads (--thread) so
# that timeout's signal reaches them. For SEND/RECV the receiver checks
# every block (verify=crc32c) and keeps more receives posted than the
# sender has sends in flight (fio's rdma engine sets rnr_retry 0). It posts
# them only after its handshake's reply, so the client's first SEND races
# the server's first receive WR: a server slowed down (UROCE_CHECK sums
# every receive buffer and records the caller at each post) can lose it
# ("RNR retry counter exceeded"), as on any NIC.
if have fio; then
  f=0
  # fio_rdma NAME SERVER-OPTIONS -- CLIENT-OPTIONS
  fio_rdma() {
    local name=$1
    shift
    local sopt=()
    while [ "$1" != "--" ]; do sopt+=("$1"); shift; done
    shift
    f=$((f + 1))
    local port=$((19470 + f))
    local common=(--ioengine=rdma --thread --port=$port --bs=64k --size=32m --verify_state_save=0)
    local try crc src spid again=""
    for try in 1 2; do
      UROCE_DEVICES="uroce0=127.104.4$f.1" timeout -k 2 60 "${ux[@]}" \
        fio --name=server "${common[@]}" --rw=read "${sopt[@]}" >"$tmp/server" 2>&1 &
      spid=$!
      # rdma_cm listens on no TCP port: give the server a moment.
      sleep 1
      UROCE_DEVICES="uroce0=127.104.4$f.2" timeout -k 2 60 "${ux[@]}" \
        fio --name=client "${common[@]}" --hostname="127.104.4$f.1" --rw=write "$@" >"$tmp/client" 2>&1
      crc=$?
      # fio's own race (above): the first SEND before the server's first
      # receive WR, with rnr_retry 0. The pair starts over once, and the
      # result line says so.
      if [ $crc != 0 ] && [ $try = 1 ] && grep -q "RNR retry counter exceeded" "$tmp/client"; then
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
        again="(second try: the first lost fio's RNR race) "
        continue
      fi
      wait "$spid"
      src=$?
      break
    done
    cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
    local line
    line=$(grep -m1 -E '^ +WRITE: bw=' "$tmp/client" | tr -s ' ')
    if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] && grep -q 'io=32.0MiB' <<<"$line" &&
      ! grep -Eq 'err= *[1-9]|verify: bad' "$tmp/out"; then
      pass "$name" "$again${line# WRITE: }"
    else
      fail "$name" "${again}client exit $crc, server exit $src"
    fi
  }
  fio_rdma "fio rdma RDMA WRITE" --iodepth=8 -- --verb=write --iodepth=8
  fio_rdma "fio rdma RDMA READ" --iodepth=8 -- --verb=read --iodepth=8
  fio_rdma "fio rdma SEND/RECV verify" --iodepth=32 --verify=crc32c --verify_fatal=1 -- \
    --verb=send --iodepth=2 --verify=crc32c --do_verify=0
else
  skip "fio" "fio missing (apt-get install fio)"
fi

# ---- librpma: a SEND posted just before the disconnect
# tests/ibverbs/rpma_msg.c does what librpma's examples 12 and 12scch do
# (the client's last message is an unsignaled SEND, and at once
# rpma_conn_disconnect: the server must receive it, or it waits for it
# forever) and 13 (three clients on one SRQ, each disconnected by the
# server after its last message). Twenty pairs each of 12 and 12scch,
# each process under a 5 s timeout, server 127.104.60.1, client .2; 13
# on 127.104.61.1 (server) and .2-.4; and 13 again as librpma's README
# runs it, the server and its three clients on one device (shared by
# four processes: rdma_cm on a shared device, issue #33), 127.104.62.1.
# rdma_cm's port 19480.
# rpma_pair NAME RUNS SERVER-DEV CLIENT-DEVS MODE [CLIENTS]: RUNS times, a
# server and CLIENTS clients (1 unless given, at once), each its own
# process; the count of runs where all exited 0 within the timeout.
rpma_pair() {
  local name=$1 runs=$2 sdev=$3 cdevs=$4 mode=$5 nc=${6:-1}
  local ok=0 bad=0 i c spid cpids rc t0=$EPOCHREALTIME
  rm -f "$tmp/rall" "$tmp"/rclient*
  local srv=${sdev#*=} sargs=() cargs=() cl
  IFS=, read -ra cl <<<"$cdevs"
  [ -n "$mode" ] && sargs=("$mode") cargs=("$mode")
  [ "$mode" = srq ] && sargs+=("$nc")
  for i in $(seq "$runs"); do
    UROCE_DEVICES=$sdev timeout -k 1 5 "${ux[@]}" "$tmp/rpma_msg" server "$srv" 19480 "${sargs[@]}" \
      >"$tmp/rserver" 2>&1 &
    spid=$!
    for _ in $(seq 50); do grep -q listening "$tmp/rserver" && break; sleep 0.05; done
    cpids=()
    for c in $(seq "$nc"); do
      UROCE_DEVICES=${cl[$(((c - 1) % ${#cl[@]}))]} timeout -k 1 5 "${ux[@]}" "$tmp/rpma_msg" \
        client "$srv" 19480 $((c * 1000)) 5 "${cargs[@]}" >"$tmp/rclient$c" 2>&1 &
      cpids+=($!)
    done
    rc=0
    for c in "${cpids[@]}"; do wait "$c" || rc=$?; done
    wait "$spid" || rc=$?
    # Every run's output, for UROCE_CHECK's look (pass).
    cat "$tmp/rserver" "$tmp"/rclient* >>"$tmp/rall"
    if [ $rc = 0 ]; then
      ok=$((ok + 1))
    else
      # The first failure's output, for the report.
      [ $bad = 0 ] && { echo "run $i (exit $rc):"; cat "$tmp/rserver" "$tmp"/rclient*; } >"$tmp/rfirst"
      bad=$((bad + 1))
    fi
  done
  if [ $ok = "$runs" ]; then
    local line
    line=$(tail -1 "$tmp/rserver")
    mv "$tmp/rall" "$tmp/out"
    pass "$name" "$runs of $runs runs, none hung ($(since "$t0") s): ${line#rpma_msg server: }"
  else
    cp "$tmp/rfirst" "$tmp/out"
    fail "$name" "$bad of $runs runs failed or hung (a 5 s timeout each; $(since "$t0") s in all)"
  fi
}
if [ ! -e /usr/include/librpma.h ]; then
  skip "librpma" "librpma.h missing (apt-get install librpma-dev)"
elif ! cc -O2 -Wall -o "$tmp/rpma_msg" tests/ibverbs/rpma_msg.c -lrpma -libverbs 2>"$tmp/out"; then
  fail "librpma" "tests/ibverbs/rpma_msg.c does not build"
else
  rpma_pair "librpma 12: SEND, then disconnect" 20 uroce0=127.104.60.1 uroce0=127.104.60.2 ""
  rpma_pair "librpma 12scch: shared channel" 20 uroce0=127.104.60.1 uroce0=127.104.60.2 scch
  rpma_pair "librpma 13: 3 clients, one SRQ" 5 uroce0=127.104.61.1 \
    uroce0=127.104.61.2,uroce0=127.104.61.3,uroce0=127.104.61.4 srq 3
  rpma_pair "librpma 13 on one shared device" 5 uroce0=127.104.62.1 uroce0=127.104.62.1 srq 3
fi

# ---- Python wheels from PyPI
# Each in a venv of its own, installed by pip from PyPI as a user would
# and run as `uroce exec -- python3 ...`, with no other set-up (the
# README's "Python wheels"). The venvs are kept outside the repository,
# in ~/.cache/uroce-apps (and pip's downloads, 46 and 69 MB, in its own
# cache), so that the second run of this script (UROCE_CHECK=1) and the
# next CI run only check them: a new one takes 20 to 40 s here. Both
# libraries fall back without a word (Mooncake to TCP, UCX to shared
# memory or TCP), so each entry also needs uroce's own counters
# (`uroce stat`) to show that the bytes crossed its devices. A package
# pip cannot install is skipped.
venvs=${XDG_CACHE_HOME:-$HOME/.cache}/uroce-apps
# venv NAME PIP-ARGS...: $venvs/NAME with the packages (made or checked);
# how long that took in $venv_took.
venv() {
  local name=$1
  shift
  local t0=$EPOCHREALTIME
  mkdir -p "$venvs" &&
    { [ -x "$venvs/$name/bin/pip" ] || python3 -m venv "$venvs/$name" >"$tmp/out" 2>&1; } &&
    timeout 600 "$venvs/$name/bin/pip" install -q --disable-pip-version-check "$@" >>"$tmp/out" 2>&1
  local rc=$?
  venv_took=$(since "$t0")
  return $rc
}
# pkts ADDR: "SENT RECEIVED", the packet counters of the running uroce
# device at ADDR ("0 0" if none runs).
pkts() {
  "$uroce" stat --json 2>/dev/null | python3 -c '
import json, sys
for p in json.load(sys.stdin):
    for d in p["devices"]:
        if d["addr"] == sys.argv[1]:
            c = d["counters"]
            print(c.get("sent_pkts", 0), c.get("rcvd_pkts", 0))
            sys.exit()
print(0, 0)' "$1"
}

# ---- Mooncake Transfer Engine (mooncake-transfer-engine-non-cuda)
# Its Python API between two processes (tests/ibverbs/mooncake_check.py:
# protocol "rdma", P2P handshake, 4 MiB WRITE and READ, verified, and the
# client's packet counters), devices 127.104.70.1 (server) and .2; then
# its transfer_engine_bench, target 127.104.71.1 and initiator .2, a
# WRITE run and a READ run of 2 s. Both with the device Mooncake
# discovers itself (from sysfs, through `uroce exec`'s view: no device
# named, no topology file): its log must say it found uroce0.
mc_pkg=mooncake-transfer-engine-non-cuda==0.3.13.post1
if ! have python3; then
  skip "Mooncake" "python3 missing"
elif ! venv mooncake "$mc_pkg"; then
  skip "Mooncake" "pip could not install $mc_pkg ($venv_took s): $(tail -1 "$tmp/out")"
else
  echo "      (venv $venvs/mooncake with $mc_pkg: $venv_took s)"
  py=$venvs/mooncake/bin/python3
  found='Device uroce0 port 1 is available'
  mkdir -p "$tmp/mc"
  t0=$EPOCHREALTIME
  UROCE_DEVICES=uroce0=127.104.70.1 timeout -k 2 90 "${ux[@]}" "$py" tests/ibverbs/mooncake_check.py \
    server 127.104.70.1 "$tmp/mc" $((4 << 20)) "$uroce" >"$tmp/mcserver" 2>&1 &
  spid=$!
  UROCE_DEVICES=uroce0=127.104.70.2 timeout -k 2 90 "${ux[@]}" "$py" tests/ibverbs/mooncake_check.py \
    client 127.104.70.2 "$tmp/mc" $((4 << 20)) "$uroce" >"$tmp/mcclient" 2>&1
  crc=$?
  wait "$spid"
  src=$?
  cat "$tmp/mcclient" - "$tmp/mcserver" <<<"---- server:" >"$tmp/out"
  line=$(grep -m1 '^mooncake_check: ok: RDMA' "$tmp/mcclient")
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] && grep -q '^mooncake_check: ok' "$tmp/mcserver" &&
    grep -q "$found" "$tmp/mcclient" && grep -q "$found" "$tmp/mcserver"; then
    pass "Mooncake Python API (rdma)" "${line#mooncake_check: ok: } ($(since "$t0") s)"
  else
    fail "Mooncake Python API (rdma)" "client exit $crc, server exit $src"
  fi
  bench=$venvs/mooncake/bin/transfer_engine_bench
  bopt=(--metadata_server=P2PHANDSHAKE --protocol=rdma --auto_discovery=true
    --buffer_size=$((64 << 20)) --threads=2 --batch_size=16 --block_size=65536)
  UROCE_DEVICES=uroce0=127.104.71.1 timeout -k 2 60 "${ux[@]}" "$bench" --mode=target \
    --local_server_name=127.104.71.1 "${bopt[@]}" >"$tmp/mctarget" 2>&1 &
  tpid=$!
  # With the P2P handshake the target listens on a port of its choosing
  # and logs it; the initiator names the target by it.
  seg=
  for _ in $(seq 100); do
    seg=$(grep -oP 'P2P handshake, listening on \K[0-9.]+:[0-9]+' "$tmp/mctarget") && break
    sleep 0.1
  done
  for op in write read; do
    t0=$EPOCHREALTIME
    read -r s0 r0 <<<"$(pkts 127.104.71.1)"
    UROCE_DEVICES=uroce0=127.104.71.2 timeout -k 2 30 "${ux[@]}" "$bench" --mode=initiator \
      --local_server_name=127.104.71.2 --segment_id="$seg" --operation=$op --duration=2 \
      "${bopt[@]}" >"$tmp/out" 2>&1
    rc=$?
    read -r s1 r1 <<<"$(pkts 127.104.71.1)"
    # What the run moved (batches of 16 blocks of 64 KiB), in 4 KiB packets
    # at least, must have crossed the target's device.
    done_line=$(grep -oP 'Test completed: \K.*' "$tmp/out")
    batches=$(grep -oP 'batch count \K[0-9]+' <<<"$done_line")
    if [ $op = write ]; then moved=$((r1 - r0)) way=received; else moved=$((s1 - s0)) way=sent; fi
    need=$(( ${batches:-0} * 16 * 16 ))
    if [ -z "$seg" ]; then
      cp "$tmp/mctarget" "$tmp/out"
      fail "Mooncake transfer_engine_bench $op" "the target logged no P2P handshake port"
    elif [ $rc = 0 ] && [ -n "$done_line" ] && [ "$need" -gt 0 ] && [ "$moved" -ge "$need" ] &&
      grep -q "$found" "$tmp/out"; then
      pass "Mooncake transfer_engine_bench $op" "$done_line; the target's uroce0 $way $moved packets ($(since "$t0") s)"
    else
      fail "Mooncake transfer_engine_bench $op" "exit $rc; the target's device moved $moved packets, the run needs $need"
    fi
  done
  kill "$tpid" 2>/dev/null
  wait "$tpid" 2>/dev/null
fi

# ---- NIXL (nixl-cu12), its UCX backend, host memory
# tests/ibverbs/nixl_check.py: the wheel as shipped (its own UCX and a
# renamed rdma-core libibverbs, which `uroce exec`'s audit module makes
# uroce's), target 127.104.80.1 and initiator .2, 4 MiB WRITE and READ
# verified, the initiator's packet counters. The wheel requires torch,
# which NIXL imports only for tensor descriptors (these are plain
# memory): --no-deps and numpy spare CI the 2 GB of torch and CUDA.
# UCX_TLS and UCX_NET_DEVICES as for MPI above: two processes on one
# host would otherwise meet in shared memory.
nixl_pkg=nixl-cu12==1.5.1
if ! have python3; then
  skip "NIXL" "python3 missing"
elif ! venv nixl --no-deps "$nixl_pkg" numpy; then
  skip "NIXL" "pip could not install $nixl_pkg ($venv_took s): $(tail -1 "$tmp/out")"
else
  echo "      (venv $venvs/nixl with $nixl_pkg and numpy: $venv_took s)"
  py=$venvs/nixl/bin/python3
  mkdir -p "$tmp/nixl"
  t0=$EPOCHREALTIME
  export UCX_TLS=rc_verbs,ud_verbs,self UCX_NET_DEVICES=uroce0:1
  UROCE_DEVICES=uroce0=127.104.80.1 timeout -k 2 90 "${ux[@]}" "$py" tests/ibverbs/nixl_check.py \
    target "$tmp/nixl" $((4 << 20)) "$uroce" >"$tmp/nxtarget" 2>&1 &
  spid=$!
  UROCE_DEVICES=uroce0=127.104.80.2 timeout -k 2 90 "${ux[@]}" "$py" tests/ibverbs/nixl_check.py \
    initiator "$tmp/nixl" $((4 << 20)) "$uroce" >"$tmp/nxinit" 2>&1
  crc=$?
  wait "$spid"
  src=$?
  unset UCX_TLS UCX_NET_DEVICES
  cat "$tmp/nxinit" - "$tmp/nxtarget" <<<"---- target:" >"$tmp/out"
  line=$(grep -m1 '^nixl_check: ok: RDMA' "$tmp/nxinit")
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ] && grep -q '^nixl_check: ok' "$tmp/nxtarget"; then
    pass "NIXL UCX backend (rc_verbs)" "${line#nixl_check: ok: } ($(since "$t0") s)"
  else
    fail "NIXL UCX backend (rc_verbs)" "initiator exit $crc, target exit $src"
  fi
fi

echo "apps: $passed passed, $failed failed"
[ "$failed" = 0 ]
