//! `liburoce_preload.so`: what `uroce exec` preloads so that programs which
//! look for a device's `/dev/infiniband/` node before using it find uroce's
//! devices, without root and without making any node.
//!
//! UCX is such a program: `uct_ib_device_is_accessible` (UCX 1.13,
//! `src/uct/ib/base/ib_md.c`) keeps an IB device only when
//! `/dev/infiniband/<ibv_device.dev_name>` is a character device it may
//! read and write (`stat` and `access`; it never opens it). uroce's devices
//! have no kernel node; their `dev_name` is `uverbs-<name>`, a form the
//! kernel never uses (its nodes are `uverbs0`, `uverbs1`, ...). This
//! library answers `stat`/`access` (and their variants) for exactly those
//! paths as for a character device, mode 0666, and passes every other call
//! to the C library unchanged.
//!
//! It is a separate library, preloaded only into the programs `uroce exec`
//! starts, rather than part of `libibverbs.so.1`: a program linked with
//! libibverbs would otherwise have every `stat` in the process routed
//! through it.

use libc::{c_char, c_int, c_void};
use std::ffi::CStr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The prefix of the paths answered here.
const PREFIX: &[u8] = b"/dev/infiniband/uverbs-";

/// True for `/dev/infiniband/uverbs-<name>` with a non-empty name that
/// has no further `/`.
fn is_uroce_node(path: &[u8]) -> bool {
    path.strip_prefix(PREFIX)
        .is_some_and(|name| !name.is_empty() && !name.contains(&b'/'))
}

/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn matches(path: *const c_char) -> bool {
    // SAFETY: the caller's promise; a null path is never ours.
    !path.is_null() && is_uroce_node(unsafe { CStr::from_ptr(path) }.to_bytes())
}

/// What `stat` reports for a uroce device node: a character device
/// (major 231, uverbs' major), readable and writable by everyone.
fn fill(st: *mut libc::stat) {
    if st.is_null() {
        return;
    }
    // SAFETY: the caller's output buffer (non-null); all-zero is a valid
    // `struct stat`.
    unsafe {
        std::ptr::write_bytes(st, 0, 1);
        (*st).st_mode = libc::S_IFCHR | 0o666;
        (*st).st_rdev = libc::makedev(231, 192);
        (*st).st_nlink = 1;
    }
}

/// The next definition of `name` (the C library's), looked up once.
fn next(slot: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    slot.store(p, Ordering::Release);
    p
}

macro_rules! forward {
    ($slot:ident, $name:literal, $ty:ty) => {{
        static $slot: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        let p = next(&$slot, $name);
        if p.is_null() {
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            return -1;
        }
        // SAFETY: the C library's definition of this very function.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

/// `stat(2)`.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's string.
    if unsafe { matches(path) } {
        fill(st);
        return 0;
    }
    let f = forward!(STAT, c"stat", StatFn);
    // SAFETY: forwarded as called.
    unsafe { f(path, st) }
}

/// `stat64(2)` (the same structure on 64-bit Linux).
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's string.
    if unsafe { matches(path) } {
        fill(st);
        return 0;
    }
    let f = forward!(STAT64, c"stat64", StatFn);
    // SAFETY: forwarded as called.
    unsafe { f(path, st) }
}

/// `fstatat(2)` (an absolute path ignores `dirfd`).
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's string.
    if unsafe { matches(path) } {
        fill(st);
        return 0;
    }
    let f = forward!(FSTATAT, c"fstatat", FstatatFn);
    // SAFETY: forwarded as called.
    unsafe { f(dirfd, path, st, flags) }
}

/// `access(2)`: every mode is granted on a uroce device node.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the caller's string.
    if unsafe { matches(path) } {
        return 0;
    }
    let f = forward!(ACCESS, c"access", AccessFn);
    // SAFETY: forwarded as called.
    unsafe { f(path, mode) }
}

/// `faccessat(2)`.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's string.
    if unsafe { matches(path) } {
        return 0;
    }
    let f = forward!(FACCESSAT, c"faccessat", FaccessatFn);
    // SAFETY: forwarded as called.
    unsafe { f(dirfd, path, mode, flags) }
}

#[cfg(test)]
mod tests {
    use super::is_uroce_node;

    #[test]
    fn only_uroce_nodes() {
        assert!(is_uroce_node(b"/dev/infiniband/uverbs-uroce0"));
        assert!(!is_uroce_node(b"/dev/infiniband/uverbs0"), "a kernel node");
        assert!(!is_uroce_node(b"/dev/infiniband/uverbs-"));
        assert!(!is_uroce_node(b"/dev/infiniband/uverbs-a/b"));
        assert!(!is_uroce_node(b"/dev/infiniband/rdma_cm"));
        assert!(!is_uroce_node(b"/etc/passwd"));
    }
}
