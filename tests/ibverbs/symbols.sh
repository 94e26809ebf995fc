#!/usr/bin/env bash
# The shipped libraries carry no test machinery: neither
# liburoce_ibverbs.so (uroce's libibverbs.so.1 and librdmacm.so.1) nor
# liburoce_preload.so holds a symbol or source file of the provider's
# testing face (`uroce_provider::testing`, its feature `testing`) or of
# its planted mistakes (`uroce_provider::planted`, feature `planted`).
#
# Cargo unifies the features of one invocation: a library built in the
# same `cargo build` as uroce-cli (whose uroce-fuzz enables the provider's
# `testing`) links that provider. So every script builds the libraries
# (`-p uroce-ibverbs -p uroce-preload`) in an invocation of their own, and
# uroce-cli in another; this is the check that they did.
#
# Sourced by tests/ibverbs/matrix.sh (after its build, with pass, fail and
# $tmp), or run alone:
#   bash tests/ibverbs/symbols.sh [LIB...]
# (default: target/release's two libraries), which prints what it found
# and exits non-zero when a library has any of it or is missing.

# test_machinery LIB: prints each kind of test machinery LIB holds, with
# how often (nothing: LIB is clean). Reads the symbol table (nm, demangled)
# and every string (strings: mangled names and the debug info's file
# names, which outlive the linker's removal of unused code).
test_machinery() {
  { nm --demangle "$1" 2>/dev/null; strings -a "$1"; } |
    grep -oE 'uroce_provider(::|[0-9]+)(testing|planted)|provider/src/(testing|planted)\.rs' |
    sed -E 's/^uroce_provider[0-9]+/uroce_provider::/' | sort | uniq -c
}

# shipped_libs_clean LIB...: 0 when every LIB exists and is clean;
# otherwise prints what is wrong and returns 1.
shipped_libs_clean() {
  local lib found bad=0
  for lib in "$@"; do
    if [ ! -f "$lib" ]; then
      echo "$lib: missing"
      bad=1
      continue
    fi
    found=$(test_machinery "$lib")
    if [ -n "$found" ]; then
      echo "$lib: test machinery in the shipped library (built together with uroce-cli?):"
      echo "$found"
      bad=1
    fi
  done
  return $bad
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  root=$(cd "$(dirname "$0")/../.." && pwd)
  rel=${CARGO_TARGET_DIR:-$root/target}/release
  [ $# -gt 0 ] || set -- "$rel/liburoce_ibverbs.so" "$rel/liburoce_preload.so"
  if shipped_libs_clean "$@"; then
    echo "shipped libraries: no test machinery in $*"
  else
    exit 1
  fi
else
  # ---- the shipped libraries carry no test machinery
  if shipped_libs_clean "$root/target/release/liburoce_ibverbs.so" \
    "$root/target/release/liburoce_preload.so" >"$tmp/out" 2>&1; then
    pass "shipped libraries" "no testing/planted symbol"
  else
    fail "shipped libraries" "test machinery found"
  fi
fi
