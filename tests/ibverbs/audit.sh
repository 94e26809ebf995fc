# A program that brings its own libibverbs (as a Python wheel does:
# auditwheel bundles a renamed copy, libibverbs-<hash>.so.<version>, and
# finds it through RUNPATH, which LD_LIBRARY_PATH never reaches) gets
# uroce's under `uroce exec`, whose LD_AUDIT module redirects any
# libibverbs or librdmacm by name or path (tests/ibverbs/bundled.c).
# Without `uroce exec` (LD_LIBRARY_PATH only) it gets the bundled copy:
# rdma-core's, which lists no uroce device.
#
# Sourced by tests/ibverbs/matrix.sh (its pass/fail, $tmp, $root; the
# uroce binary is $uroce_bin, target/release's unless set).

uroce_bin=${uroce_bin:-$root/target/release/uroce}
debian_verbs=$(readlink -f /usr/lib/x86_64-linux-gnu/libibverbs.so.1 2>/dev/null ||
  readlink -f "$(ldconfig -p | awk '/libibverbs.so.1 / {print $NF; exit}')")
if ! command -v patchelf >/dev/null; then
  echo "skip  bundled libibverbs (patchelf missing: apt-get install patchelf)"
elif [ ! -f "$debian_verbs" ]; then
  echo "skip  bundled libibverbs (Debian's libibverbs1 missing)"
else
  # As auditwheel lays out a wheel: the renamed copy, its soname changed
  # to the new name, in a directory the program's RUNPATH names.
  bundled=libibverbs-1de1263b.so.1.14.48.0
  mkdir -p "$tmp/wheel/libs"
  cp "$debian_verbs" "$tmp/wheel/libs/$bundled"
  patchelf --set-soname "$bundled" "$tmp/wheel/libs/$bundled"
  cc -O1 -Wall -o "$tmp/wheel/bundled" tests/ibverbs/bundled.c "$tmp/wheel/libs/$bundled" \
    -ldl -Wl,--enable-new-dtags,-rpath,'$ORIGIN/libs' || exit 1
  # A module that needs librdmacm.so.1's versioned symbols.
  echo 'void *cm(void) { return rdma_create_event_channel(); }' >"$tmp/wheel/needcm.c"
  cc -shared -fPIC -O1 -include rdma/rdma_cma.h -o "$tmp/wheel/libneedcm.so" \
    "$tmp/wheel/needcm.c" -lrdmacm || exit 1
  if readelf -d "$tmp/wheel/bundled" | grep -q "NEEDED.*\[$bundled\]" &&
    readelf -d "$tmp/wheel/bundled" | grep -q 'RUNPATH.*\$ORIGIN/libs'; then
    # Before: LD_LIBRARY_PATH alone does not reach it.
    UROCE_DEVICES=uroce0=127.105.9.1 WANT_DEVICE=uroce0 timeout 20 env \
      LD_LIBRARY_PATH="$("$uroce_bin" libdir)" "$tmp/wheel/bundled" >"$tmp/out" 2>&1
    if grep -q "from $tmp/wheel/libs/$bundled" "$tmp/out" && ! grep -q "^device uroce0" "$tmp/out"; then
      pass "bundled libibverbs, LD_LIBRARY_PATH" "the bundled copy is loaded (rdma-core's: no uroce0)"
    else
      fail "bundled libibverbs, LD_LIBRARY_PATH" "expected the bundled copy"
    fi
    # After: uroce exec makes it uroce's, by DT_NEEDED and by dlopen path.
    if UROCE_DEVICES=uroce0=127.105.9.1 WANT_DEVICE=uroce0 timeout 20 \
      "$uroce_bin" exec "$tmp/wheel/bundled" "$tmp/wheel/libs/$bundled" "$tmp/wheel/libneedcm.so" \
      >"$tmp/out" 2>&1 &&
      grep -q "from .*/liburoce_ibverbs.so$" "$tmp/out"; then
      pass "bundled libibverbs (uroce exec)" "$(grep -m1 '^ok' "$tmp/out" | cut -c7-)"
    else
      fail "bundled libibverbs (uroce exec)" "the bundled copy was not replaced by uroce's"
    fi
  else
    fail "bundled libibverbs" "the program does not need $bundled through RUNPATH"
  fi
fi
# The audit module's namespace takes glibc's optional static TLS: without
# the room `uroce exec` adds (GLIBC_TUNABLES), a program linked with a
# library of 32 KiB of initial-exec TLS (as rustc's librustc_driver) fails
# to start ("cannot allocate memory in static TLS block").
mkdir -p "$tmp/tls"
echo '__thread char big[32768] __attribute__((tls_model("initial-exec")));
char *big_tls(void) { big[0] = 1; return big; }' >"$tmp/tls/big.c"
echo 'char *big_tls(void); int main(void) { return big_tls()[0] == 1 ? 0 : 1; }' >"$tmp/tls/main.c"
if cc -shared -fPIC -O1 -o "$tmp/tls/libbig.so" "$tmp/tls/big.c" &&
  cc -O1 -o "$tmp/tls/bigtls" "$tmp/tls/main.c" "$tmp/tls/libbig.so" -Wl,-rpath,"$tmp/tls"; then
  if UROCE_DEVICES=uroce0=127.105.9.1 timeout 20 "$uroce_bin" exec "$tmp/tls/bigtls" >"$tmp/out" 2>&1; then
    pass "large initial-exec TLS (uroce exec)" "a library of 32 KiB of initial-exec TLS loads beside the audit module"
  else
    fail "large initial-exec TLS (uroce exec)" "$(head -c 300 "$tmp/out")"
  fi
else
  fail "large initial-exec TLS (uroce exec)" "could not build the program"
fi
