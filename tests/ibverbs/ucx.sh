# UCX (Debian's ucx-utils, UCX 1.13) on uroce: ucx_info lists uroce's
# devices with the rc_verbs and ud_verbs transports, and ucx_perftest runs
# UCT tests over each transport and UCP tests (tag, put/get, am, stream)
# between two processes. Everything runs under `uroce exec` (uroce's
# libraries, and liburoce_preload.so, which lets UCX find the devices
# without a /dev/infiniband node); nothing is set up as root.
#
# Sourced by tests/ibverbs/matrix.sh (its pass/fail, $tmp, $root). Each
# pair of processes gets uroce0 on 127.84.<k>.1 (server) and .2 (client)
# and TCP port 18900 + k for ucx_perftest's own exchange.

uroce_exec=("$root/target/release/uroce" exec --)

if ! command -v ucx_perftest >/dev/null; then
  fail "ucx" "ucx_perftest missing (apt-get install ucx-utils)"
  return 0 2>/dev/null || exit 1
fi

# ---- discovery
# The transports listed in uroce0's memory domain (up to the next one).
uroce_tls() {
  awk '/Memory domain:/ {on = ($NF == "uroce0")} on && /Transport:/ {print $NF}' "$tmp/out" | sort -u | tr '\n' ' '
}
if UROCE_DEVICES=uroce0=127.84.0.1 timeout 60 "${uroce_exec[@]}" ucx_info -d >"$tmp/out" 2>&1 &&
  [[ "$(uroce_tls)" == *"rc_verbs"*"ud_verbs"* ]]; then
  pass "ucx_info -d" "uroce0: rc_verbs and ud_verbs"
else
  fail "ucx_info -d" "uroce0 not listed with rc_verbs and ud_verbs"
fi

# ---- the GID's RoCE version, which UCX reads from sysfs
# (/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<n>; without it UCX
# calls the GID RoCE v1 and uses RoCE v1's traffic class): under `uroce
# exec` it opens that file and reads "RoCE v2" (seen with strace, skipped
# without it).
if command -v strace >/dev/null; then
  UROCE_DEVICES=uroce0=127.105.2.1 timeout 60 strace -f -qq -e trace=openat,read -s 32 \
    -o "$tmp/strace" "${uroce_exec[@]}" ucx_info -d >"$tmp/out" 2>&1
  opened=$(grep -cE 'openat\(.*/class/infiniband/uroce0/ports/1/gid_attrs/types/[0-9]+"' "$tmp/strace")
  v2=$(grep -cE 'read\([0-9]+, "RoCE v2\\n"' "$tmp/strace")
  if [ "$opened" -gt 0 ] && [ "$v2" -gt 0 ]; then
    pass "ucx_info -d: GID type from sysfs" "$opened opens of gid_attrs/types/<n>, $v2 reads of \"RoCE v2\""
  else
    grep -E 'gid_attrs|RoCE' "$tmp/strace" | tail -5 >>"$tmp/out"
    fail "ucx_info -d: GID type from sysfs" "$opened opens of gid_attrs/types/<n>, $v2 reads of \"RoCE v2\""
  fi
else
  echo "skip  ucx_info -d: GID type from sysfs (strace missing: apt-get install strace)"
fi

k=0
# ucx NAME ENV... -- ARGS...: ucx_perftest server and client (the client
# with ARGS), each with ENV; passes when both exit 0 and the client prints
# its "Final:" line.
ucx() {
  local name=$1
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  k=$((k + 1))
  local port=$((18900 + k))
  env "${envs[@]}" UROCE_DEVICES="uroce0=127.84.$k.1" \
    timeout 60 "${uroce_exec[@]}" ucx_perftest -p "$port" >"$tmp/server" 2>&1 &
  local spid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  env "${envs[@]}" UROCE_DEVICES="uroce0=127.84.$k.2" \
    timeout 60 "${uroce_exec[@]}" ucx_perftest 127.0.0.1 -p "$port" "$@" >"$tmp/client" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  cat "$tmp/client" - "$tmp/server" <<<"---- server:" >"$tmp/out"
  local line
  line=$(grep -m1 '^Final:' "$tmp/client" | tr -s ' \t' ' ')
  if [ $crc = 0 ] && [ $src = 0 ] && [ -n "$line" ]; then
    pass "$name" "$line"
  else
    fail "$name" "client exit $crc, server exit $src"
  fi
}

# UCT, one transport each.
for t in am_lat am_bw; do
  ucx "ucx uct $t ud_verbs" -- -t "$t" -x ud_verbs -d uroce0:1 -n 2000
done
for t in am_lat put_lat put_bw add_lat; do
  ucx "ucx uct $t rc_verbs" -- -t "$t" -x rc_verbs -d uroce0:1 -n 2000
done
# UCP over rc_verbs with ud_verbs (which UCP wires up over), and over
# ud_verbs alone.
ucp=(UCX_NET_DEVICES=uroce0:1 UCX_TLS=rc_verbs,ud_verbs)
for t in tag_lat tag_bw ucp_put_bw ucp_get ucp_am_lat stream_bw; do
  ucx "ucx ucp $t rc+ud" "${ucp[@]}" -- -t "$t" -n 2000
done
ucx "ucx ucp tag_bw 1 MiB rc+ud" "${ucp[@]}" -- -t tag_bw -s 1048576 -n 50
ucx "ucx ucp tag_lat ud" UCX_NET_DEVICES=uroce0:1 UCX_TLS=ud_verbs -- -t tag_lat -n 2000
