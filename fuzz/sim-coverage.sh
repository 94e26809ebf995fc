#!/bin/bash
# Line and region coverage of provider/src/transport (llvm-cov) by a
# sim_case corpus and, for comparison, by `uroce fuzz`'s generator alone
# for some seconds (docs/src/fuzzing/cargo-fuzz.md, "Coverage guidance").
#
#   bash fuzz/sim-coverage.sh CORPUS_DIR [GENERATOR_SECONDS [GENERATOR_CASES]]
#
# LLVM_BIN names llvm-profdata's and llvm-cov's directory: they must read
# rustc's profiles (rustc 1.95 is LLVM 22; Debian's llvm-19 reads them,
# llvm-14 does not). Builds go below $CARGO_TARGET_DIR (or target/).
set -euo pipefail
corpus=$(realpath "$1")
secs=${2:-0}
cases=${3:-}
llvm=${LLVM_BIN:-/usr/lib/llvm-19/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
tdir=${CARGO_TARGET_DIR:-$root/target}
triple=$(rustc -vV | sed -n 's/^host: //p')
report() { # BINARY PROFDATA
  "$llvm/llvm-cov" report "$1" -instr-profile="$2" "$root"/provider/src/transport/*.rs \
    "$root"/provider/src/transport/*/*.rs | sed "s|$root/provider/src/||"
}

# The campaign's corpus, on sim_case built with -Cinstrument-coverage.
(cd "$root/fuzz" && RUSTC_BOOTSTRAP=1 cargo fuzz coverage -s none --target-dir "$tdir/coverage" \
  --llvm-path "$llvm" sim_case "$corpus" >/dev/null)
echo "sim_case corpus $corpus ($(ls "$corpus" | wc -l) inputs):"
report "$tdir/coverage/$triple/release/sim_case" "$root/fuzz/coverage/sim_case/coverage.profdata"

# The generator alone, round-robin over every transport and mode, for as
# long (or as many cases as the campaign ran, on a shared machine), on the
# same code built the same way.
if [ "$secs" -gt 0 ]; then
  raw=$(mktemp -d)
  # (Build scripts are instrumented too: their profiles go elsewhere.)
  (cd "$root" && LLVM_PROFILE_FILE="$raw/build/%p.profraw" \
    RUSTFLAGS="-Cinstrument-coverage --cfg fuzzing" cargo build -q --release \
    -p uroce-fuzz --example sim_case_seeds --target-dir "$tdir/coverage-base")
  bin="$tdir/coverage-base/release/examples/sim_case_seeds"
  LLVM_PROFILE_FILE="$raw/gen-%m.profraw" "$bin" run "$secs" $cases
  "$llvm/llvm-profdata" merge -sparse "$raw"/*.profraw -o "$raw/gen.profdata"
  echo "generator alone, $secs s${cases:+ or $cases cases}:"
  report "$bin" "$raw/gen.profdata"
  rm -rf "$raw"
fi
