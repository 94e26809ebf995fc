# libfabric (Debian's libfabric-bin, libfabric 1.17) on uroce: fi_info
# lists uroce's device for the verbs provider's MSG and DGRAM endpoints
# and the ofi_rxm and ofi_rxd utility providers over them, and
# fi_pingpong runs each, data checked (-c), between two processes. Under
# `uroce exec`: libfabric finds RDMA devices through the addresses of
# non-loopback interfaces, which liburoce_preload.so's getifaddrs adds
# (one per device); nothing is set up as root.
#
# Sourced by tests/ibverbs/matrix.sh (its pass/fail, $tmp, $root). Each
# pair gets uroce0 on 127.89.<k>.1 (server) and .2 (client; .1 as well,
# one device for both, where lf_client_host=1) and TCP port 19300 + k for
# fi_pingpong's own exchange.

lf_exec=("$root/target/release/uroce" exec --)

if ! command -v fi_pingpong >/dev/null; then
  fail "libfabric" "fi_pingpong missing (apt-get install libfabric-bin)"
  return 0 2>/dev/null || exit 1
fi

# ---- discovery
if UROCE_DEVICES=uroce0=127.89.0.1 timeout 60 "${lf_exec[@]}" fi_info -p verbs >"$tmp/out" 2>&1; then
  found=$(awk '/provider:/ {p = $2} /domain:/ {d = $2} /type:/ {print p "/" d "/" $2}' "$tmp/out" | sort -u | tr '\n' ' ')
else
  found=""
fi
if [[ "$found" == *"verbs/uroce0/FI_EP_MSG"* && "$found" == *"verbs/uroce0-dgram/FI_EP_DGRAM"* &&
  "$found" == *"verbs;ofi_rxm/uroce0/FI_EP_RDM"* && "$found" == *"verbs;ofi_rxd/uroce0-dgram/FI_EP_RDM"* ]]; then
  pass "fi_info -p verbs" "uroce0: MSG, DGRAM, rxm and rxd RDM"
else
  fail "fi_info -p verbs" "found: ${found:-nothing}"
fi

k=0
# lf NAME ARGS...: fi_pingpong server and client with ARGS (-c: data
# checked); passes when both exit 0 and the client printed its results.
lf() {
  local name=$1
  shift
  k=$((k + 1))
  local port=$((19300 + k))
  UROCE_DEVICES="uroce0=127.89.$k.1" timeout 90 "${lf_exec[@]}" fi_pingpong "$@" -c -B "$port" >"$tmp/server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  UROCE_DEVICES="uroce0=127.89.$k.${lf_client_host:-2}" timeout 90 "${lf_exec[@]}" fi_pingpong "$@" -c -P "$port" "127.89.$k.1" >"$tmp/client" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
  local line
  line=$(grep -E '^[0-9]+[kmg]? +[0-9]+ +=' "$tmp/client" | tail -1 | tr -s ' \t' ' ')
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ]; then
    pass "$name" "$line"
  else
    fail "$name" "client exit $crc, server exit $src"
  fi
}

# The MSG endpoints (msg, and rxm over them) on one device for both
# processes, as on a kernel host: libfabric's verbs provider binds
# 127.0.0.1 to find "any device", rdma_cm binds it to the process's
# device (the kernel's cma_bind_loopback) and the server advertises
# 127.0.0.1, which reaches the client's own device; a server on another
# device would not be there (docs/src/dropin/libibverbs.md).
lf_client_host=1 lf "fi_pingpong verbs msg" -p verbs -e msg -I 200
# fabtests' pingpong sizes its buffers in pp_alloc_msgs before
# pp_alloc_active_res sets the verbs dgram provider's 40-byte message
# prefix: its receive WR (4096 + 40 bytes at rx_buf) reaches 40 bytes into
# tx_buf, where it writes each message it sends, and a 4096-byte datagram
# overwrites them (docs/src/tools/check.md, "Finding your RDMA bug").
lf_dgram_known='uroce check \[buffer\]: the application wrote into the buffer of receive WR wr_id [0-9]+ on QP 0x[0-9a-f]+ \(4136 bytes at 0x[0-9a-f]+, lkey 0x[0-9a-f]+; first at byte 4096 of the message\)'
known_reports=$lf_dgram_known lf "fi_pingpong verbs dgram" -p verbs -e dgram -I 200
lf_client_host=1 lf "fi_pingpong verbs;ofi_rxm rdm" -p "verbs;ofi_rxm" -e rdm -I 200
lf "fi_pingpong verbs;ofi_rxd rdm" -p "verbs;ofi_rxd" -e rdm -I 100
