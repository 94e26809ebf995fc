//! The sysfs view: `/sys/class/infiniband` and `/sys/class/infiniband_verbs`
//! answered from the tree `uroce exec` wrote for uroce's devices (its root
//! in `UROCE_SYSFS`; `uroce_cli::sysfs_tree` writes it).
//!
//! Every call that names a file by path and that programs use to find,
//! read or list sysfs entries — the `open` family (with glibc's fortified
//! `__open_2` forms), `fopen`, `freopen`, `opendir`, `scandir`, the `stat`
//! family (with glibc's older `__xstat` forms and `statx`), `access`,
//! `readlink`, `realpath` — takes an absolute path under either class (or
//! under `/sys/devices/virtual/uroce`, where the tree's entries of the
//! class link to, as the kernel's link into `/sys/devices`) to the same
//! path in the tree and leaves every other path alone ([`route`]).
//! `realpath` (and `canonicalize_file_name`) of such a path is resolved
//! here, component by component through these same calls ([`resolve`]):
//! glibc's own would look at the real `/sys`. A real directory makes
//! `readdir`, `getdents`, `fstat` and `read` on what was opened work
//! unchanged. Relative paths are left alone. Opening for writing (or creating,
//! truncating) anything in the view fails with EACCES, as writing a
//! read-only sysfs attribute does. Without `UROCE_SYSFS` nothing moves.

use libc::{c_char, c_int, c_uint, c_void};
use std::ffi::CStr;
use std::sync::atomic::AtomicPtr;

use super::{next, set_errno};

/// The directories the view answers for: the two classes, and where the
/// tree's class entries link to (the devices' own directories, a name
/// the kernel never uses under `/sys/devices/virtual`).
const CLASSES: [&[u8]; 3] = [
    b"/sys/class/infiniband",
    b"/sys/class/infiniband_verbs",
    b"/sys/devices/virtual/uroce",
];

/// The longest path handed on (PATH_MAX, its NUL included).
const PATH_MAX: usize = libc::PATH_MAX as usize;

/// The tree's root, from `UROCE_SYSFS` (None: unset or empty). Read with
/// `getenv`, which allocates nothing: the hooks run inside `open` and
/// `readlink`, which allocators call while they set themselves up
/// (jemalloc reads `/etc/malloc.conf` with `readlink` from inside its
/// first `malloc`, under its init lock: a hook that allocated there would
/// wait on that lock forever).
fn root<'a>() -> Option<&'a [u8]> {
    // SAFETY: a NUL-terminated name; getenv returns null or a string of
    // the environment, valid until the program changes that variable.
    let p = unsafe { libc::getenv(c"UROCE_SYSFS".as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: getenv's string, NUL-terminated.
    let v = unsafe { CStr::from_ptr(p) }.to_bytes();
    (!v.is_empty()).then_some(v)
}

/// Whether an absolute path with no `.`, `..` or empty component is one
/// the view answers for: one of the classes or anything under them.
fn clean_in_view(path: &[u8]) -> bool {
    CLASSES.iter().any(|c| {
        path.strip_prefix(*c)
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
    })
}

/// Where a call on `path` goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Leave the path alone.
    Real,
    /// Into the tree: this path (taken apart) is in the view.
    View(Norm),
    /// To this path outside the view: `path` went through the view and
    /// out again by `..` (`/sys/class/infiniband/..` is `/sys/class`).
    Out(Norm),
}

/// An absolute path taken apart lexically, on the stack (the hooks
/// allocate nothing: they may run where `malloc` may not).
pub struct Norm {
    buf: [u8; PATH_MAX],
    len: usize,
}

impl Norm {
    /// The path.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// Appends `/` and `comp`; false if that would not fit.
    fn push(&mut self, comp: &[u8]) -> bool {
        if self.len + 1 + comp.len() >= PATH_MAX {
            return false;
        }
        self.buf[self.len] = b'/';
        self.buf[self.len + 1..self.len + 1 + comp.len()].copy_from_slice(comp);
        self.len += 1 + comp.len();
        true
    }
    /// Drops the last component.
    fn pop(&mut self) {
        self.len = self
            .as_bytes()
            .iter()
            .rposition(|&b| b == b'/')
            .unwrap_or(0);
    }
}

impl PartialEq for Norm {
    fn eq(&self, other: &Norm) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for Norm {}
impl std::fmt::Debug for Norm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// Where a call on `path` goes: absolute paths are taken apart lexically
/// (`.`, `..` and repeated `/`). The kernel walks a `..` after a link
/// from where the link led (`/sys/class/infiniband/<dev>/device/..` is
/// the device's parent); taken apart lexically it is the directory before
/// the link. Programs that go up through a link use `realpath` first,
/// which follows them ([`resolve`]).
/// A path too long to take apart is left alone (the kernel refuses it).
pub fn route(path: &[u8]) -> Route {
    // Most paths are nowhere near the view.
    if path.first() != Some(&b'/')
        || !(path.windows(10).any(|w| w == b"infiniband")
            || path.windows(13).any(|w| w == b"virtual/uroce"))
    {
        return Route::Real;
    }
    let mut norm = Norm {
        buf: [0; PATH_MAX],
        len: 0,
    };
    let mut passed_view = false;
    for comp in path.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => norm.pop(),
            c => {
                if !norm.push(c) {
                    return Route::Real;
                }
                passed_view |= clean_in_view(norm.as_bytes());
            }
        }
    }
    if norm.len == 0 {
        norm.buf[0] = b'/';
        norm.len = 1;
    }
    if clean_in_view(norm.as_bytes()) {
        Route::View(norm)
    } else if passed_view {
        Route::Out(norm)
    } else {
        Route::Real
    }
}

/// A NUL-terminated path on the stack.
pub struct CPath {
    buf: [u8; PATH_MAX],
}

impl CPath {
    /// The concatenation of `parts`, or None if longer than PATH_MAX.
    pub fn new(parts: &[&[u8]]) -> Option<CPath> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len >= PATH_MAX {
            return None;
        }
        let mut buf = [0u8; PATH_MAX];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Some(CPath { buf })
    }
    /// As a C string.
    pub fn as_ptr(&self) -> *const c_char {
        self.buf.as_ptr().cast()
    }
    /// The bytes, without the NUL.
    pub fn as_bytes(&self) -> &[u8] {
        let n = self.buf.iter().position(|&b| b == 0).unwrap_or(PATH_MAX);
        &self.buf[..n]
    }
}

/// Calls `f` with `path`, or with where [`route`] sends it: when that is
/// the view, failing with EACCES instead if `write`; with ENAMETOOLONG if
/// the new name is too long.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn via_view<R>(
    path: *const c_char,
    write: bool,
    fail: R,
    f: impl FnOnce(*const c_char) -> R,
) -> R {
    // Nothing here allocates (see `root`): the path is looked at first,
    // on the stack, and the environment only for a path in the view.
    if path.is_null() {
        return f(path);
    }
    // SAFETY: the caller's string (not null).
    let bytes = unsafe { CStr::from_ptr(path) }.to_bytes();
    let route = route(bytes);
    if route == Route::Real {
        return f(path);
    }
    let Some(root) = root() else {
        return f(path);
    };
    let moved = match route {
        Route::Real => return f(path),
        Route::View(_) if write => {
            set_errno(libc::EACCES);
            return fail;
        }
        // The view's paths all start with "/sys".
        Route::View(n) => CPath::new(&[root, &n.as_bytes()[4..]]),
        Route::Out(n) => CPath::new(&[n.as_bytes()]),
    };
    match moved {
        Some(p) => f(p.as_ptr()),
        None => {
            set_errno(libc::ENAMETOOLONG);
            fail
        }
    }
}

/// Whether `open` flags would change or create the file.
fn open_writes(flags: c_int) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & (libc::O_CREAT | libc::O_TRUNC) != 0
}

/// Whether an `fopen` mode would change or create the file.
///
/// # Safety
/// `mode` is null or a NUL-terminated string.
unsafe fn fopen_writes(mode: *const c_char) -> bool {
    if mode.is_null() {
        return false;
    }
    // SAFETY: the caller's promise.
    let m = unsafe { CStr::from_ptr(mode) }.to_bytes();
    m.first() != Some(&b'r') || m.contains(&b'+')
}

// The open family is variadic in C (`mode` only with O_CREAT/O_TMPFILE).
// These take `mode` as a plain third (fourth) argument: on the x86-64 and
// AArch64 Linux calling conventions a variadic integer argument travels in
// the same register as a named one, so the caller's `mode` is read when it
// was passed and a meaningless value, never used by the C library, when it
// was not.
type OpenFn = unsafe extern "C" fn(*const c_char, c_int, c_uint) -> c_int;
type OpenatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type Openat2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;
type OpendirFn = unsafe extern "C" fn(*const c_char) -> *mut libc::DIR;
type ScandirFn =
    unsafe extern "C" fn(*const c_char, *mut c_void, *mut c_void, *mut c_void) -> c_int;
type GetxattrFn = unsafe extern "C" fn(*const c_char, *const c_char, *mut c_void, usize) -> isize;
type ListxattrFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> isize;
type ScandiratFn =
    unsafe extern "C" fn(c_int, *const c_char, *mut c_void, *mut c_void, *mut c_void) -> c_int;
type ReadlinkChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize, usize) -> isize;
type ReadlinkatChkFn =
    unsafe extern "C" fn(c_int, *const c_char, *mut c_char, usize, usize) -> isize;
type FreopenFn =
    unsafe extern "C" fn(*const c_char, *const c_char, *mut libc::FILE) -> *mut libc::FILE;
type ReadlinkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> isize;
type ReadlinkatFn = unsafe extern "C" fn(c_int, *const c_char, *mut c_char, usize) -> isize;

/// Defines `open`-like functions: (name, C name, slot, type, arguments;
/// the path argument, the flags argument).
macro_rules! open_like {
    ($( $name:ident $cname:literal $slot:ident $ty:ident ($($a:ident: $t:ty),*) path=$p:ident flags=$fl:ident; )*) => {$(
        /// As the C library's, with paths in the sysfs view moved into it.
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let f = forward!($slot, $cname, $ty);
            // SAFETY: forwarded as called (the path possibly moved).
            unsafe { via_view($p, open_writes($fl), -1, |$p| f($($a),*)) }
        }
    )*};
}

open_like! {
    open c"open" OPEN OpenFn (path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    open64 c"open64" OPEN64 OpenFn (path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    __open c"__open" UOPEN OpenFn (path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    __open64 c"__open64" UOPEN64 OpenFn (path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    openat c"openat" OPENAT OpenatFn (dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    openat64 c"openat64" OPENAT64 OpenatFn (dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) path=path flags=flags;
    __open_2 c"__open_2" OPEN_2 Open2Fn (path: *const c_char, flags: c_int) path=path flags=flags;
    __open64_2 c"__open64_2" OPEN64_2 Open2Fn (path: *const c_char, flags: c_int) path=path flags=flags;
    __openat_2 c"__openat_2" OPENAT_2 Openat2Fn (dirfd: c_int, path: *const c_char, flags: c_int) path=path flags=flags;
    __openat64_2 c"__openat64_2" OPENAT64_2 Openat2Fn (dirfd: c_int, path: *const c_char, flags: c_int) path=path flags=flags;
}

/// Defines functions that look at a path without changing anything:
/// (name, C name, slot, type, arguments; the path argument, the return
/// type and its failure value).
macro_rules! looks_at {
    ($( $name:ident $cname:literal $slot:ident $ty:ident ($($a:ident: $t:ty),*) path=$p:ident -> $ret:ty = $fail:expr; )*) => {$(
        /// As the C library's, with paths in the sysfs view moved into it.
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $ret {
            let f = forward!($slot, $cname, $ty, $fail);
            // SAFETY: forwarded as called (the path possibly moved).
            unsafe { via_view($p, false, $fail, |$p| f($($a),*)) }
        }
    )*};
}

looks_at! {
    opendir c"opendir" OPENDIR OpendirFn (path: *const c_char) path=path -> *mut libc::DIR = std::ptr::null_mut();
    scandir c"scandir" SCANDIR ScandirFn (path: *const c_char, list: *mut c_void, filter: *mut c_void, compar: *mut c_void) path=path -> c_int = -1;
    scandir64 c"scandir64" SCANDIR64 ScandirFn (path: *const c_char, list: *mut c_void, filter: *mut c_void, compar: *mut c_void) path=path -> c_int = -1;
    scandirat c"scandirat" SCANDIRAT ScandiratFn (dirfd: c_int, path: *const c_char, list: *mut c_void, filter: *mut c_void, compar: *mut c_void) path=path -> c_int = -1;
    scandirat64 c"scandirat64" SCANDIRAT64 ScandiratFn (dirfd: c_int, path: *const c_char, list: *mut c_void, filter: *mut c_void, compar: *mut c_void) path=path -> c_int = -1;
    __readlink_chk c"__readlink_chk" READLINK_CHK ReadlinkChkFn (path: *const c_char, buf: *mut c_char, size: usize, buflen: usize) path=path -> isize = -1;
    __readlinkat_chk c"__readlinkat_chk" READLINKAT_CHK ReadlinkatChkFn (dirfd: c_int, path: *const c_char, buf: *mut c_char, size: usize, buflen: usize) path=path -> isize = -1;
    readlink c"readlink" READLINK ReadlinkFn (path: *const c_char, buf: *mut c_char, size: usize) path=path -> isize = -1;
    readlinkat c"readlinkat" READLINKAT ReadlinkatFn (dirfd: c_int, path: *const c_char, buf: *mut c_char, size: usize) path=path -> isize = -1;
    getxattr c"getxattr" GETXATTR GetxattrFn (path: *const c_char, name: *const c_char, value: *mut c_void, size: usize) path=path -> isize = -1;
    lgetxattr c"lgetxattr" LGETXATTR GetxattrFn (path: *const c_char, name: *const c_char, value: *mut c_void, size: usize) path=path -> isize = -1;
    listxattr c"listxattr" LISTXATTR ListxattrFn (path: *const c_char, list: *mut c_char, size: usize) path=path -> isize = -1;
    llistxattr c"llistxattr" LLISTXATTR ListxattrFn (path: *const c_char, list: *mut c_char, size: usize) path=path -> isize = -1;
}

/// `fopen(3)` and its alias, with paths in the sysfs view moved into it.
macro_rules! fopen_fn {
    ($(#[$doc:meta])* $name:ident $cname:literal $slot:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char) -> *mut libc::FILE {
            let f = forward!($slot, $cname, FopenFn, std::ptr::null_mut());
            // SAFETY: the caller's mode string; forwarded as called.
            unsafe {
                via_view(path, fopen_writes(mode), std::ptr::null_mut(), |p| {
                    f(p, mode)
                })
            }
        }
    };
}

fopen_fn!(
    /// `fopen(3)`, with paths in the sysfs view moved into it.
    fopen c"fopen" FOPEN
);
fopen_fn!(
    /// `fopen64(3)`, with paths in the sysfs view moved into it.
    fopen64 c"fopen64" FOPEN64
);

/// `freopen(3)` and its alias, with paths in the sysfs view moved into it
/// (a null path, the stream's own file in a new mode, is left alone).
macro_rules! freopen_fn {
    ($(#[$doc:meta])* $name:ident $cname:literal $slot:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            mode: *const c_char,
            stream: *mut libc::FILE,
        ) -> *mut libc::FILE {
            let f = forward!($slot, $cname, FreopenFn, std::ptr::null_mut());
            // SAFETY: the caller's mode string; forwarded as called.
            unsafe {
                via_view(path, fopen_writes(mode), std::ptr::null_mut(), |p| {
                    f(p, mode, stream)
                })
            }
        }
    };
}

freopen_fn!(
    /// `freopen(3)`.
    freopen c"freopen" FREOPEN
);
freopen_fn!(
    /// `freopen64(3)`.
    freopen64 c"freopen64" FREOPEN64
);

// ------------------------------------------------------------------ realpath

/// Symbolic links followed in one resolution at most (the kernel's
/// `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The canonical form of the absolute path `path` when [`route`] takes it
/// into the view: each component in turn, its links followed, looked at
/// (`lstat`, `readlink`) where [`via_view`] sends it: in the view's tree
/// where it is in the view, on the real filesystem where a link led out
/// of it. glibc's `realpath` cannot serve: it calls its own internal
/// `readlink` and `lstat`, which no preload reaches. The kernel is asked
/// directly (system calls), not through the C library's names, which may
/// be this library's own or, on an older glibc, missing. Err: errno.
pub fn resolve(path: &[u8]) -> Result<Norm, c_int> {
    // What is left to walk, at the end of `rest` (`rest[at..]`).
    let mut rest = [0u8; PATH_MAX];
    if path.len() >= PATH_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    let mut at = PATH_MAX - path.len();
    rest[at..].copy_from_slice(path);
    let mut out = Norm {
        buf: [0; PATH_MAX],
        len: 0,
    };
    let mut links = 0;
    while at < PATH_MAX {
        // The next component, and `at` past it and its `/`.
        let n = rest[at..]
            .iter()
            .position(|&b| b == b'/')
            .unwrap_or(PATH_MAX - at);
        let comp = &rest[at..at + n];
        let next_at = (at + n + 1).min(PATH_MAX);
        match comp {
            b"" | b"." => {
                at = next_at;
                continue;
            }
            b".." => {
                out.pop();
                at = next_at;
                continue;
            }
            c => {
                if !out.push(c) {
                    return Err(libc::ENAMETOOLONG);
                }
            }
        }
        at = next_at;
        let Some(cp) = CPath::new(&[out.as_bytes()]) else {
            return Err(libc::ENAMETOOLONG);
        };
        // SAFETY: all-zero is a valid `struct stat`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path (moved into the tree if in the
        // view) and a `struct stat` for the kernel to fill.
        let r = unsafe {
            via_view(cp.as_ptr(), false, -1, |p| {
                libc::syscall(
                    libc::SYS_newfstatat,
                    libc::AT_FDCWD,
                    p,
                    &raw mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            })
        };
        if r != 0 {
            return Err(errno());
        }
        let more = rest[at..].iter().any(|&b| b != b'/');
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(libc::ELOOP);
                }
                let mut target = [0u8; PATH_MAX];
                // SAFETY: a NUL-terminated path (moved as above) and a
                // buffer of the size given.
                let got = unsafe {
                    via_view(cp.as_ptr(), false, -1, |p| {
                        libc::syscall(
                            libc::SYS_readlinkat,
                            libc::AT_FDCWD,
                            p,
                            target.as_mut_ptr(),
                            PATH_MAX - 1,
                        )
                    })
                };
                let Ok(got) = usize::try_from(got) else {
                    return Err(errno());
                };
                let target = &target[..got];
                // What is left becomes the target, `/`, what was left.
                if target.len() + 1 > at {
                    return Err(libc::ENAMETOOLONG);
                }
                at -= target.len() + 1;
                rest[at..at + target.len()].copy_from_slice(target);
                rest[at + target.len()] = b'/';
                if target.first() == Some(&b'/') {
                    out.len = 0;
                } else {
                    out.pop();
                }
            }
            libc::S_IFDIR => {}
            _ if more => return Err(libc::ENOTDIR),
            _ => {}
        }
    }
    if out.len == 0 {
        out.buf[0] = b'/';
        out.len = 1;
    }
    Ok(out)
}

fn errno() -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() }
}

type RealpathFn = unsafe extern "C" fn(*const c_char, *mut c_char) -> *mut c_char;
type RealpathChkFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> *mut c_char;
type CanonicalizeFn = unsafe extern "C" fn(*const c_char) -> *mut c_char;

/// Whether `path` is one [`resolve`] answers for (the view is in use and
/// the path goes through it).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn resolves_here(path: *const c_char) -> bool {
    // SAFETY: the caller's promise.
    !path.is_null()
        && route(unsafe { CStr::from_ptr(path) }.to_bytes()) != Route::Real
        && root().is_some()
}

/// [`resolve`] into `out` (`size` bytes; null: a buffer `malloc` gives,
/// which the caller frees, as glibc's). Null and errno on failure.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` null or `size` writable bytes.
unsafe fn resolve_into(path: *const c_char, out: *mut c_char, size: usize) -> *mut c_char {
    // SAFETY: the caller's promise.
    let r = match resolve(unsafe { CStr::from_ptr(path) }.to_bytes()) {
        Ok(r) => r,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    let b = r.as_bytes();
    let dst = if out.is_null() {
        // SAFETY: plain malloc, freed by the caller with free.
        let p = unsafe { libc::malloc(b.len() + 1) }.cast::<c_char>();
        if p.is_null() {
            set_errno(libc::ENOMEM);
            return p;
        }
        p
    } else if b.len() + 1 > size {
        set_errno(libc::ENAMETOOLONG);
        return std::ptr::null_mut();
    } else {
        out
    };
    // SAFETY: `dst` holds at least b.len() + 1 bytes (checked or
    // allocated above).
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr().cast(), dst, b.len());
        *dst.add(b.len()) = 0;
    }
    dst
}

/// `realpath(3)`: a path through the view is resolved by [`resolve`];
/// every other path by the C library.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, out: *mut c_char) -> *mut c_char {
    // SAFETY: the caller's string.
    if unsafe { resolves_here(path) } {
        // SAFETY: realpath's `out` holds PATH_MAX bytes.
        return unsafe { resolve_into(path, out, PATH_MAX) };
    }
    let f = forward!(REALPATH, c"realpath", RealpathFn, std::ptr::null_mut());
    // SAFETY: forwarded as called.
    unsafe { f(path, out) }
}

/// `__realpath_chk`, glibc's fortified `realpath`: as [`realpath`], with
/// the size of `out` known.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    out: *mut c_char,
    size: usize,
) -> *mut c_char {
    // SAFETY: the caller's string.
    if unsafe { resolves_here(path) } {
        // SAFETY: `out` holds `size` bytes, as the caller says.
        return unsafe { resolve_into(path, out, size) };
    }
    let f = forward!(
        REALPATH_CHK,
        c"__realpath_chk",
        RealpathChkFn,
        std::ptr::null_mut()
    );
    // SAFETY: forwarded as called.
    unsafe { f(path, out, size) }
}

/// `canonicalize_file_name(3)`: `realpath(path, NULL)`.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: the caller's string.
    if unsafe { resolves_here(path) } {
        // SAFETY: a buffer is allocated.
        return unsafe { resolve_into(path, std::ptr::null_mut(), 0) };
    }
    let f = forward!(
        CANONICALIZE,
        c"canonicalize_file_name",
        CanonicalizeFn,
        std::ptr::null_mut()
    );
    // SAFETY: forwarded as called.
    unsafe { f(path) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(p: &[u8]) -> Norm {
        let mut n = Norm {
            buf: [0; PATH_MAX],
            len: p.len(),
        };
        n.buf[..p.len()].copy_from_slice(p);
        n
    }
    fn view(p: &[u8]) -> Route {
        Route::View(norm(&[b"/sys", p].concat()))
    }

    #[test]
    fn only_the_two_classes() {
        assert_eq!(route(b"/sys/class/infiniband"), view(b"/class/infiniband"));
        assert_eq!(
            route(b"/sys/class/infiniband/u0/ports/1/gid_attrs/types/1"),
            view(b"/class/infiniband/u0/ports/1/gid_attrs/types/1")
        );
        assert_eq!(
            route(b"/sys/class/infiniband_verbs/"),
            view(b"/class/infiniband_verbs")
        );
        assert_eq!(
            route(b"/sys//class/./infiniband/u0/"),
            view(b"/class/infiniband/u0")
        );
        assert_eq!(
            route(b"/sys/class/net/../infiniband/u0"),
            view(b"/class/infiniband/u0")
        );
        assert_eq!(route(b"/sys/class/infiniband_mad"), Route::Real);
        assert_eq!(route(b"/sys/class/infinibandx/a"), Route::Real);
        assert_eq!(route(b"/sys/class/net/lo"), Route::Real);
        assert_eq!(route(b"/sys/devices/virtual/infiniband/rxe0"), Route::Real);
        assert_eq!(route(b"sys/class/infiniband"), Route::Real, "relative");
        assert_eq!(route(b"/dev/infiniband/uverbs0"), Route::Real);
        let long = [b"/sys/class/infiniband/".as_slice(), &[b'a'; PATH_MAX]].concat();
        assert_eq!(route(&long), Route::Real, "too long to take apart");
        assert_eq!(
            route(b"/sys/class/infiniband/.."),
            Route::Out(norm(b"/sys/class"))
        );
        assert_eq!(
            route(b"/sys/class/infiniband/../../.."),
            Route::Out(norm(b"/"))
        );
    }

    /// Allocations made by this thread (the test binary's allocator).
    struct Counting;
    thread_local!(static ALLOCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) });
    // SAFETY: System's allocator, with a count on the side.
    unsafe impl std::alloc::GlobalAlloc for Counting {
        unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
            ALLOCS.with(|a| a.set(a.get() + 1));
            // SAFETY: forwarded as called.
            unsafe { std::alloc::System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
            // SAFETY: forwarded as called.
            unsafe { std::alloc::System.dealloc(p, l) }
        }
    }
    #[global_allocator]
    static COUNTING: Counting = Counting;

    #[test]
    fn the_hooks_allocate_nothing() {
        // jemalloc calls readlink("/etc/malloc.conf") from inside its first
        // malloc: a hook that allocated there deadlocked rustc.
        std::env::set_var("UROCE_SYSFS", "/tmp/uroce-test-tree");
        let mut seen = Vec::with_capacity(4);
        let before = ALLOCS.with(|a| a.get());
        for p in [
            c"/etc/malloc.conf",
            c"/sys/class/infiniband/u0/ports/1/state",
            c"/sys/class/infiniband/..",
            c"/dev/infiniband/uverbs-u0",
        ] {
            // SAFETY: NUL-terminated paths; the closure only records.
            let moved = unsafe {
                via_view(p.as_ptr(), false, -1, |q| {
                    seen.push(CStr::from_ptr(q).to_bytes().len());
                    0
                })
            };
            assert_eq!(moved, 0);
        }
        assert_eq!(ALLOCS.with(|a| a.get()), before, "the hooks allocated");
        assert_eq!(
            seen,
            [
                16,
                "/tmp/uroce-test-tree/class/infiniband/u0/ports/1/state".len(),
                "/sys/class".len(),
                "/dev/infiniband/uverbs-u0".len()
            ]
        );
    }

    #[test]
    fn writes_are_refused() {
        assert!(!open_writes(
            libc::O_RDONLY | libc::O_CLOEXEC | libc::O_DIRECTORY
        ));
        assert!(open_writes(libc::O_WRONLY));
        assert!(open_writes(libc::O_RDWR));
        assert!(open_writes(libc::O_RDONLY | libc::O_CREAT));
        // SAFETY: NUL-terminated literals.
        unsafe {
            assert!(!fopen_writes(c"r".as_ptr()));
            assert!(!fopen_writes(c"re".as_ptr()));
            assert!(fopen_writes(c"r+".as_ptr()));
            assert!(fopen_writes(c"w".as_ptr()));
            assert!(fopen_writes(c"a".as_ptr()));
        }
    }

    #[test]
    fn long_names_are_refused() {
        let root = vec![b'r'; PATH_MAX - 4];
        assert!(CPath::new(&[&root, b"/cl"]).is_some());
        assert!(CPath::new(&[&root, b"/cla"]).is_none());
        let p = CPath::new(&[b"/tmp/x", b"/class/infiniband"]).unwrap();
        assert_eq!(p.as_bytes(), b"/tmp/x/class/infiniband");
    }
}
