//! The rtld-audit interface (`LD_AUDIT`, glibc's `rtld-audit(7)`): `uroce
//! exec` names this library there as well as in `LD_PRELOAD`, so that any
//! libibverbs or librdmacm a program loads, whatever its name or path, is
//! uroce's.
//!
//! `LD_LIBRARY_PATH` reaches only the libraries found by their usual
//! names: a Python wheel that bundles its own copy (auditwheel renames it
//! `libibverbs-1de1263b.so.1.14.48.0` and finds it through the RUNPATH of
//! the module that needs it, as NIXL's does) or a program that `dlopen`s
//! one by its full path would load rdma-core's, which sees no uroce
//! device. The dynamic linker asks [`la_objsearch`] about each name it is
//! to load and each file it tries for it: a path whose last component is
//! a libibverbs or a librdmacm (`libibverbs.so.1`,
//! `libibverbs-1de1263b.so.1.14.48.0`, `/opt/x/librdmacm.so`) becomes the
//! library of the same kind in this library's own directory (`uroce
//! libdir`, where `uroce exec` finds it), and every other name is left as
//! it is.
//!
//! A name without a `/` (a `DT_NEEDED` entry, `dlopen("libibverbs.so.1")`)
//! is redirected only at the files the search tries (`LA_SER_LIBPATH`,
//! `LA_SER_RUNPATH`, ...), not as the name itself (`LA_SER_ORIG`): the
//! linker then records the object under the name that was asked for,
//! which is how it finds the object again when it checks the symbol
//! versions the asker needs (`IBVERBS_1.1` of `libibverbs.so.1`). Renamed
//! at `LA_SER_ORIG`, a second name for a library already loaded (UCX's
//! `librdmacm.so.1` after its `libibverbs.so.1`: one file, uroce's) would
//! be recorded as the new path, and glibc stops on an assertion
//! (`_dl_check_map_versions: needed != NULL`). A full path is never
//! searched, so it is redirected at `LA_SER_ORIG`.

use libc::{c_char, c_uint, c_void};
use std::sync::OnceLock;

/// `LA_SER_ORIG`: the name before any search (every other flag: a file
/// the search tries, a full path).
const LA_SER_ORIG: c_uint = 0x01;

/// The audit interface version this library speaks (`LAV_CURRENT` of
/// glibc 2.34 and older; later ones accept it).
const LAV_VERSION: c_uint = 1;

/// The libraries redirected: (the name's prefix, uroce's file for it).
const KINDS: [(&[u8], &[u8]); 2] = [
    (b"libibverbs", b"libibverbs.so.1"),
    (b"librdmacm", b"librdmacm.so.1"),
];

/// Which kind (0: libibverbs, 1: librdmacm) a library name (or path) is:
/// its last component begins with the kind's name, then `.`, `-` or `_`,
/// and holds `.so`.
pub fn kind(name: &[u8]) -> Option<usize> {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    KINDS.iter().position(|(prefix, _)| {
        base.strip_prefix(*prefix)
            .is_some_and(|rest| matches!(rest.first(), Some(b'.' | b'-' | b'_')))
            && base.windows(3).any(|w| w == b".so")
    })
}

/// uroce's libraries, NUL-terminated: this library's directory joined
/// with each kind's file (None if that cannot be found or is too long).
fn ours() -> &'static Option<[Vec<u8>; 2]> {
    static OURS: OnceLock<Option<[Vec<u8>; 2]>> = OnceLock::new();
    OURS.get_or_init(|| {
        // SAFETY: all-zero is a valid Dl_info; dladdr fills it for an
        // address in this library (one of its functions).
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        let addr = la_objsearch as *const c_void;
        // SAFETY: a valid address and a Dl_info to fill.
        if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr's string, NUL-terminated, alive as the library.
        let me = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
        let dir = &me[..me.iter().rposition(|&b| b == b'/')?];
        let path = |file: &[u8]| [dir, b"/", file, b"\0"].concat();
        let both = [path(KINDS[0].1), path(KINDS[1].1)];
        // Loaded from outside `uroce libdir` (no uroce library beside
        // it): redirect nothing rather than to files that are not there.
        let present = |p: &[u8]| {
            let p = std::ffi::CStr::from_bytes_with_nul(p).ok()?;
            // SAFETY: a NUL-terminated path; faccessat only reads it.
            (unsafe { libc::faccessat(libc::AT_FDCWD, p.as_ptr(), libc::F_OK, 0) } == 0)
                .then_some(())
        };
        both.iter().try_for_each(|p| present(p))?;
        Some(both)
    })
}

/// The audit interface's handshake: the version this library speaks (0,
/// "do not use this library", for a linker too old to have one).
#[no_mangle]
pub extern "C" fn la_version(version: c_uint) -> c_uint {
    LAV_VERSION.min(version)
}

/// The dynamic linker's question about a name to load (`LA_SER_ORIG`) or
/// a file it tries for one: a libibverbs or librdmacm by any path becomes
/// uroce's (a name without `/` at the files its search tries), anything
/// else stays.
///
/// # Safety
/// As the dynamic linker calls it: `name` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn la_objsearch(
    name: *const c_char,
    _cookie: *mut usize,
    flag: c_uint,
) -> *mut c_char {
    if name.is_null() {
        return name.cast_mut();
    }
    // SAFETY: the linker's string.
    let bytes = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
    if flag == LA_SER_ORIG && !bytes.contains(&b'/') {
        return name.cast_mut();
    }
    match (kind(bytes), ours()) {
        (Some(k), Some(paths)) => paths[k].as_ptr().cast::<c_char>().cast_mut(),
        _ => name.cast_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn every_name_of_the_two_libraries() {
        for n in [
            "libibverbs.so.1",
            "libibverbs.so",
            "libibverbs-1de1263b.so.1.14.48.0",
            "/opt/venv/lib/python3.12/site-packages/nixl.libs/libibverbs-1de1263b.so.1.14.48.0",
        ] {
            assert_eq!(kind(n.as_bytes()), Some(0), "{n}");
        }
        assert_eq!(kind(b"librdmacm.so.1"), Some(1));
        assert_eq!(kind(b"/x/librdmacm-8c1a2f3e.so.1.3.48.0"), Some(1));
        for n in [
            "libmlx5-rdmav34.so",
            "libibverbs/librxe-rdmav34.so",
            "librspreload.so",
            "libibverbsfoo.so",
            "libibverbs.a",
            "libc.so.6",
            "/usr/lib/libibverbs/",
        ] {
            assert_eq!(kind(n.as_bytes()), None, "{n}");
        }
    }
}
