#!/usr/bin/env bash
# The Rust RDMA crates, as published on crates.io, on uroce's drop-in
# libibverbs.so.1 and librdmacm.so.1 (issue #17).
#
#   * on-ibverbs (rust-ibverbs 0.9.2): RC SEND/RECV between two processes,
#     GID index 1 as code written for kernel rxe uses it, every byte checked;
#   * on-sideway (sideway 0.4.3): SEND/RECV, RDMA READ and WRITE between
#     two processes with the basic QP/CQ, with the extended QP/CQ (ibv_wr_*
#     posting, ibv_start_poll), and connected through rdma_cm;
#   * the crates' own examples: rust-ibverbs' loopback (a QP connected to
#     itself over GID index 1); sideway's ibv_devinfo, show_gids,
#     rc_pingpong and cmtime (server and client, the client from an
#     explicit source address), and sideway's own test suite (under
#     `uroce exec`, for its sysfs test), built from the published crates.
#
# The crates' build dependencies (cmake and clang for their bindgen and
# rdma-core builds, libnl for ibverbs-sys) are installed here as Debian
# packages, not burdening `cargo test`. Each pair gets its own devices
# (127.60.<n>.1 and .2) and TCP port (18900 + n). Prints a line per program
# and "crates: N passed, N failed"; exits non-zero on a failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || need+=(libclang-dev)
[ -e /usr/include/libnl3/netlink/netlink.h ] || need+=(libnl-3-dev)
[ -e /usr/include/libnl3/netlink/route/link.h ] || need+=(libnl-route-3-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v ss >/dev/null || need+=(iproute2)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -e /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q "${need[@]}" >/dev/null 2>&1
  fi
  for p in cmake clang; do
    command -v $p >/dev/null || { echo "crates: $p missing (apt-get install ${need[*]})"; echo "crates: 0 passed, 1 failed"; exit 1; }
  done
fi

# The drop-in libraries in a cargo invocation of their own, uroce-cli in
# another: cargo unifies one invocation's features, and uroce-cli's
# (uroce-fuzz enables the provider's testing face) must not reach the
# libraries (tests/ibverbs/symbols.sh checks).
cargo build --release -q -p uroce-ibverbs -p uroce-preload || exit 1
cargo build --release -q -p uroce-cli || exit 1
libdir=$("$root/target/release/uroce" libdir) || exit 1
# The crates' target directory outlives a clone (their rdma-core builds are
# the slow part): a cache, rebuilt from nothing on a new machine.
# UROCE_CRATES_TARGET moves it.
export CARGO_TARGET_DIR=${UROCE_CRATES_TARGET:-${XDG_CACHE_HOME:-$HOME/.cache}/uroce-crates-target}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null' EXIT
passed=0
failed=0
# With UROCE_CHECK set (the verbs checker on: see the book's "Finding your
# RDMA bug", docs/src/tools/check.md), an entry whose output ($tmp/out*)
# holds a checker report fails, unless that page names it as a mistake of
# the program
# (known_reports=REGEX of the report lines allowed).
pass() {
  if [ -n "${UROCE_CHECK:-}" ] &&
    cat "$tmp"/out* 2>/dev/null | grep 'uroce check \[' | grep -qvE "${known_reports:-^$}"; then
    failed=$((failed + 1)); printf 'FAIL  %-30s %s\n' "$1" "UROCE_CHECK reported a mistake"
    cat "$tmp"/out* 2>/dev/null | grep -A12 'uroce check \[' | head -40 | sed 's/^/      | /'
    return
  fi
  passed=$((passed + 1)); printf 'ok    %-30s %s\n' "$1" "$2"
}
fail() {
  failed=$((failed + 1)); printf 'FAIL  %-30s %s\n' "$1" "$2"
  for f in "$tmp"/out*; do [ -e "$f" ] && awk -v p="      $(basename "$f") | " '{ print p $0 }' "$f" | tail -15; done
}
finish() {
  echo "crates: $passed passed, $failed failed"
  [ "$failed" = 0 ]
  exit
}

# ---- build: our programs, and the crates' own examples from their
# published sources (copied out of cargo's registry, with their lock files)
if ! (cd "$here" && cargo build -q --bins) >"$tmp/out.build" 2>&1; then
  fail "build tests/crates" "$(grep -m1 -E '^error' "$tmp/out.build")"
  finish
fi
bin=$CARGO_TARGET_DIR/debug
for c in ibverbs-0.9.2 sideway-0.4.3; do
  # Unpacked by the build above, under whichever registry index cargo uses.
  src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$c" 2>/dev/null | head -1)
  [ -n "$src" ] || { fail "find $c" "not in cargo's registry"; finish; }
  cp -r "$src" "$tmp/$c"
done
if ! (cd "$tmp/ibverbs-0.9.2" && cargo build -q --example loopback) >"$tmp/out.build" 2>&1; then
  fail "build ibverbs examples" "$(grep -m1 -E '^error' "$tmp/out.build")"
fi
if ! (cd "$tmp/sideway-0.4.3" && cargo build -q --example ibv_devinfo --example show_gids --example rc_pingpong \
  --example cmtime) \
  >"$tmp/out.build" 2>&1; then
  fail "build sideway examples" "$(grep -m1 -E '^error' "$tmp/out.build")"
fi
rm -f "$tmp/out.build"
export LD_LIBRARY_PATH=$libdir

# run_pair NAME N TCP_PORT SERVER_CMD... -- CLIENT_CMD...: the server on
# 127.60.N.1, the client on 127.60.N.2 once the server is up (listening on
# TCP_PORT; with "-", an rdma_cm server: its device bound on UDP 4791);
# both must exit 0 within 60 s.
run_pair() {
  local name=$1 n=$2 port=$3
  shift 3
  local scmd=() ccmd=()
  while [ "$1" != -- ]; do scmd+=("$1"); shift; done
  shift
  ccmd=("$@")
  rm -f "$tmp"/out*
  UROCE_DEVICES=uroce0=127.60.$n.1 timeout 60 "${scmd[@]}" >"$tmp/out.server" 2>&1 &
  local spid=$! filter
  if [ "$port" = - ]; then filter="src 127.60.$n.1:4791"; else filter="sport = :$port"; fi
  for _ in $(seq 100); do
    ss -Hantu "$filter" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  [ "$port" = - ] && sleep 0.2 # bind, then listen
  UROCE_DEVICES=uroce0=127.60.$n.2 timeout 60 "${ccmd[@]}" >"$tmp/out.client" 2>&1
  local crc=$?
  wait $spid
  local src=$?
  if [ $crc = 0 ] && [ $src = 0 ]; then
    pass "$name" "$(tail -1 "$tmp/out.client")"
  else
    fail "$name" "server exit $src, client exit $crc"
  fi
}

# run_one NAME N PATTERN... -- CMD...: CMD on 127.60.N.1 must exit 0
# within 60 s with every PATTERN (a word, grep -E) in its output.
run_one() {
  local name=$1 n=$2 pats=()
  shift 2
  while [ "$1" != -- ]; do pats+=("$1"); shift; done
  shift
  rm -f "$tmp"/out*
  UROCE_DEVICES=uroce0=127.60.$n.1 timeout 60 "$@" >"$tmp/out" 2>&1
  local rc=$?
  [ $rc = 0 ] || { fail "$name" "exit $rc"; return; }
  for p in "${pats[@]}"; do
    grep -qwE "$p" "$tmp/out" || { fail "$name" "no \"$p\" in its output"; return; }
  done
  pass "$name" "$(grep -c . "$tmp/out") lines, last: $(tail -1 "$tmp/out")"
}

# ---- our programs on the crates
run_pair "ibverbs: rc send/recv" 1 18901 "$bin/on-ibverbs" server 127.0.0.1:18901 -- \
  "$bin/on-ibverbs" client 127.0.0.1:18901
run_pair "sideway: basic qp" 2 18902 "$bin/on-sideway" basic server 127.0.0.1 18902 -- \
  "$bin/on-sideway" basic client 127.0.0.1 18902
run_pair "sideway: extended qp" 3 18903 "$bin/on-sideway" ex server 127.0.0.1 18903 -- \
  "$bin/on-sideway" ex client 127.0.0.1 18903
run_pair "sideway: rdma_cm" 4 - "$bin/on-sideway" cm server 127.60.4.1 18904 -- \
  "$bin/on-sideway" cm client 127.60.4.1 18904

# ---- the crates' own examples
examples=$CARGO_TARGET_DIR/debug/examples
run_one "ibverbs: examples/loopback" 5 sent received -- "$examples/loopback"
run_one "sideway: examples/ibv_devinfo" 6 uroce0 "Active" -- "$examples/ibv_devinfo"
run_one "sideway: examples/show_gids" 6 '127\.60\.6\.1' lo -- "$examples/show_gids"
run_pair "sideway: examples/rc_pingpong" 7 18907 "$examples/rc_pingpong" -p 18907 -n 200 -- \
  "$examples/rc_pingpong" -p 18907 -n 200 127.0.0.1
# sideway's own test suite (its unit tests and tests/*.rs on the first
# device), under `uroce exec`: test_query_gid_table_fallback compares the
# GID table with /sys/class/infiniband (GID types, ndevs), which uroce
# exec's sysfs view answers. Less tests/compiletest.rs (compile-fail
# checks of the crate's API, no RDMA).
rm -f "$tmp"/out*
if (cd "$tmp/sideway-0.4.3" && UROCE_DEVICES=uroce0=127.60.9.1 timeout 300 "$root/target/release/uroce" exec \
  cargo test -q --lib --test test_atomic --test test_cq --test test_mr_and_cq --test test_post_send \
  --test test_qp) >"$tmp/out" 2>&1; then
  pass "sideway: its own tests" "$(awk '/^test result:/ { p += $4 } END { print p " passed" }' "$tmp/out")"
else
  fail "sideway: its own tests" "$(grep -c FAILED "$tmp/out") failures"
fi
# cmtime: 20 connections set up and torn down through rdma_cm, the QPs
# moved by rdma_init_qp_attr on both sides; the client names its source
# (-b: rdma_resolve_addr from it). Built with optimisations, sideway
# 0.4.3's cmtime -b fails there with EINVAL on any librdmacm: its
# Identifier::resolve_addr passes a pointer to a temporary sockaddr that
# is dropped before the call (tests/ibverbs/cm_src.c has the answers).
run_pair "sideway: examples/cmtime -b" 8 - "$examples/cmtime" -b 127.60.8.1 -p 18908 -c 20 -- \
  "$examples/cmtime" -b 127.60.8.2 -s 127.60.8.1 -p 18908 -c 20
finish
