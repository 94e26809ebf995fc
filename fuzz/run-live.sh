#!/usr/bin/env bash
# `uroce fuzz` against a live uroce target, bounded: the target is a uroce
# device (uroce's libibverbs.so.1 under uroce-fuzz-agent) in a network
# namespace of its own, the fuzzer sends from another address in it.
# First ReDMArk's attacks (`uroce fuzz attack`, RC and UC, spoofing from
# 127.0.0.9): their table is printed, only a failure to run fails. Then
# every mode and transport runs for a share of the time (keys and
# duplicates with the agent's further keys: regions and windows); any finding
# fails the run (uroce is expected to run clean), and the findings stay
# in $OUT (default: a temporary directory, printed). Last, a capture of
# `uroce demo` is replayed on the target (`uroce fuzz pcap`, with mutants).
#
#   bash fuzz/run-live.sh [SECONDS_PER_RUN] [CASES_PER_RUN]
#
# Needs root (ip netns), a C compiler and libibverbs-dev (the agent).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
per_run=${1:-20}
cases=${2:-400}
out=${OUT:-$(mktemp -d /tmp/uroce-fuzz-live.XXXXXX)}
mkdir -p "$out"

# The drop-in libraries in a cargo invocation of their own, uroce-cli in
# another: cargo unifies one invocation's features, and uroce-cli's
# (uroce-fuzz enables the provider's testing face) must not reach the
# libraries (tests/ibverbs/symbols.sh checks).
cargo build --release -q -p uroce-ibverbs -p uroce-preload || exit 1
cargo build --release -q -p uroce-cli || exit 1
uroce=${CARGO_TARGET_DIR:-$root/target}/release/uroce
libdir=$("$uroce" libdir) || exit 1
cc -O2 -Wall -o "$out/uroce-fuzz-agent" fuzz/agent/uroce_fuzz_agent.c -libverbs || {
  echo "the agent does not compile (apt-get install libibverbs-dev)"
  exit 1
}

ns=uroce-fuzz-$$
ip netns add "$ns" || exit 1
agent_pid=
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null
  ip netns del "$ns" 2>/dev/null
}
trap cleanup EXIT
ip -n "$ns" link set lo up

target=127.0.0.1 fuzzer=127.0.0.2 agent=127.0.0.1:4792
UROCE_DEVICES=fz0=$target LD_LIBRARY_PATH=$libdir ip netns exec "$ns" \
  "$out/uroce-fuzz-agent" -a $target -l 127.0.0.1 -p 4792 >"$out/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 50); do
  grep -q listening "$out/agent.log" 2>/dev/null && break
  sleep 0.1
done
grep -q listening "$out/agent.log" || { cat "$out/agent.log"; exit 1; }

status=0
for qp in rc uc; do
  ip netns exec "$ns" "$uroce" fuzz attack --target udp:$target --fuzzer $fuzzer --agent $agent \
    --qp $qp --spoof 127.0.0.9 >"$out/attack-$qp.log" 2>&1 || status=1
  cat "$out/attack-$qp.log"
done
findings=0
for qp in rc uc ud; do
  modes="fields sequence keys duplicates responder"
  for mode in $modes; do
    t0=$SECONDS
    ip netns exec "$ns" "$uroce" fuzz --target udp:$target --fuzzer $fuzzer --agent $agent \
      --qp "$qp" --mode "$mode" --seed 1 --cases "$cases" --time "$per_run" \
      --out "$out/$qp-$mode" >"$out/$qp-$mode.log" 2>&1
    rc=$?
    line=$(grep -m1 "cases in" "$out/$qp-$mode.log")
    n=$(grep -c "^finding " "$out/$qp-$mode.log")
    findings=$((findings + n))
    printf '%-4s %-10s %s (%d s)\n' "$qp" "$mode" "${line:-no summary (exit $rc)}" $((SECONDS - t0))
    if [ $rc != 0 ] || [ "$n" != 0 ]; then
      status=1
      sed 's/^/  | /' "$out/$qp-$mode.log" | head -40
    fi
  done
done
# Replay: a capture uroce makes of its own traffic (the demo, between two
# addresses on a veth pair of MTU 1500, so at the target's RoCE MTU of
# 1024), its main flow replayed on the target, then mutants of it. Fails
# if it cannot run or an oracle trips.
t0=$SECONDS
ip -n "$ns" link add rp0 mtu 1500 type veth peer name rp1 mtu 1500
for i in 0 1; do
  ip -n "$ns" addr add 10.99.0.$((i + 1))/24 dev rp$i && ip -n "$ns" link set rp$i up
done
ip netns exec "$ns" "$uroce" demo --a 10.99.0.1 --b 10.99.0.2 -n 3 --mib 1 \
  --pcap "$out/demo.pcap" >"$out/demo.log" 2>&1 || { cat "$out/demo.log"; status=1; }
ip netns exec "$ns" "$uroce" fuzz pcap "$out/demo.pcap" --target udp:$target --fuzzer $fuzzer \
  --agent $agent --mutate 10 --out "$out/pcap" >"$out/pcap.log" 2>&1
rc=$?
printf 'pcap replay (%d s, exit %d):\n' $((SECONDS - t0)) $rc
sed 's/^/  | /' "$out/pcap.log" | head -40
[ $rc = 0 ] || status=1
kill -0 "$agent_pid" 2>/dev/null || { echo "the agent died"; status=1; }
# uroce makes every key the agent exposes (regions, windows of both types).
if grep "no further keys" "$out/agent.log"; then status=1; fi
echo "uroce fuzz (live, netns): $findings findings; logs and findings in $out"
exit $status
