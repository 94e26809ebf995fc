#!/usr/bin/env bash
# What the diagnostic tools (UROCE_CHECK, UROCE_EXPLAIN, UROCE_TRACE,
# `uroce stat`) cost, off and on, against the same code with them compiled
# out, in one run: builds benches/diag_cost.rs (an example of the package
# uroce-benches) twice (release; the yardstick with RUSTFLAGS=--cfg
# uroce_no_diag, in a target directory of its own so the two builds do not
# replace each other) and alternates them ROUNDS times (default 8). Prints
# a table; asserts nothing about time.
#
#   bash benches/diag_cost.sh [ROUNDS]
#   UROCE_DIAG_QUICK=1 bash benches/diag_cost.sh 2    # shorter runs (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
target=${CARGO_TARGET_DIR:-$PWD/target}
yard_target=$target/diag-yardstick
build() {
    cargo build --quiet --release -p uroce-benches --example diag_cost "$@"
}
build
CARGO_TARGET_DIR=$yard_target RUSTFLAGS="${RUSTFLAGS:-} --cfg uroce_no_diag" build
exec "$target/release/examples/diag_cost" --compare "$yard_target/release/examples/diag_cost" \
    --rounds "$rounds"
