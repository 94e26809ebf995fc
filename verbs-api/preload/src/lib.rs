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
//! library answers `stat`/`access` for exactly those paths as for a
//! character device, mode 0666, through every name the C library exports
//! for them (glibc's `__xstat` forms, which binaries linked before glibc
//! 2.33 call for `stat`, `lstat`, `statx`, `euidaccess`, ...; the
//! test `tests/entry_points.rs` lists the machine's glibc against this
//! library's symbols), and passes every other call to the C library
//! unchanged.
//! Opening such a node is left to the C library (ENOENT): no file could
//! stand in for a uverbs file descriptor, and uroce's libibverbs never
//! opens one.
//!
//! It also adds each configured device (`UROCE_DEVICES`, default `uroce0`
//! on 127.0.0.1) to what `getifaddrs` returns, as an interface of its own
//! name that is up and not loopback, holding the device's address (a /32
//! or /128). libfabric's verbs provider finds RDMA devices only through
//! the addresses of such interfaces (it skips the loopback interface,
//! where uroce's 127.x addresses live). `UROCE_IFADDRS=0` turns that off.
//!
//! And it gives programs a sysfs view of the devices ([`sysfs_view`]): calls
//! on paths under `/sys/class/infiniband` and `/sys/class/infiniband_verbs`
//! go to the read-only tree `uroce exec` wrote for them (named in
//! `UROCE_SYSFS`), so UCX finds each GID's RoCE version and the pyverbs
//! tests a device's net device.
//!
//! And, named in `LD_AUDIT` as well, it makes any libibverbs or librdmacm
//! the program loads, by whatever name or path, uroce's ([`audit`]).
//!
//! It is a separate library, preloaded only into the programs `uroce exec`
//! starts, rather than part of `libibverbs.so.1`: a program linked with
//! libibverbs would otherwise have every `stat` in the process routed
//! through it (and libc's `getifaddrs` comes before libibverbs' in the
//! lookup order anyway).

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

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
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
    ($slot:ident, $name:literal, $ty:ty) => {
        forward!($slot, $name, $ty, -1)
    };
    ($slot:ident, $name:literal, $ty:ty, $fail:expr) => {{
        static $slot: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
        let p = next(&$slot, $name);
        if p.is_null() {
            set_errno(libc::ENOSYS);
            return $fail;
        }
        // SAFETY: the C library's definition of this very function.
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

/// What `statx` reports for a uroce device node: as [`fill`].
fn fill_statx(st: *mut libc::statx) {
    if st.is_null() {
        return;
    }
    // SAFETY: the caller's output buffer (non-null); all-zero is a valid
    // `struct statx`.
    unsafe {
        std::ptr::write_bytes(st, 0, 1);
        (*st).stx_mask = libc::STATX_TYPE | libc::STATX_MODE | libc::STATX_NLINK;
        (*st).stx_mode = (libc::S_IFCHR | 0o666) as u16;
        (*st).stx_nlink = 1;
        (*st).stx_rdev_major = 231;
        (*st).stx_rdev_minor = 192;
    }
}

/// Defines the functions that look at a file by its path, whatever name
/// the C library gives them (`stat` and glibc's older `__xstat` forms,
/// which binaries linked before glibc 2.33 call): a uroce device node is
/// answered here (`node`), any other path forwarded to the C library's
/// function, moved into the sysfs view if it is in it.
macro_rules! looks_at_node {
    ($( $name:ident $cname:literal $slot:ident ($($a:ident: $t:ty),*) path=$p:ident node=$node:expr; )*) => {$(
        /// As the C library's, for a uroce device node and in the sysfs
        /// view too.
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // SAFETY: the caller's string.
            if unsafe { matches($p) } {
                return $node;
            }
            let f = forward!($slot, $cname, unsafe extern "C" fn($($t),*) -> c_int);
            // SAFETY: forwarded as called (the path possibly moved).
            unsafe { via_view($p, false, -1, |$p| f($($a),*)) }
        }
    )*};
}

looks_at_node! {
    stat c"stat" STAT (path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    // The same structure on 64-bit Linux, as for the other `64` forms.
    stat64 c"stat64" STAT64 (path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    // A node is no link: `lstat` answers as `stat`.
    lstat c"lstat" LSTAT (path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    lstat64 c"lstat64" LSTAT64 (path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    // An absolute path ignores `dirfd`; a relative one is never a node.
    fstatat c"fstatat" FSTATAT (dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) path=path node={ fill(st); 0 };
    fstatat64 c"fstatat64" FSTATAT64 (dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) path=path node={ fill(st); 0 };
    // `ver` is `_STAT_VER`, the layout `struct stat` has anyway.
    __xstat c"__xstat" XSTAT (ver: c_int, path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    __xstat64 c"__xstat64" XSTAT64 (ver: c_int, path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    __lxstat c"__lxstat" LXSTAT (ver: c_int, path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    __lxstat64 c"__lxstat64" LXSTAT64 (ver: c_int, path: *const c_char, st: *mut libc::stat) path=path node={ fill(st); 0 };
    __fxstatat c"__fxstatat" FXSTATAT (ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) path=path node={ fill(st); 0 };
    __fxstatat64 c"__fxstatat64" FXSTATAT64 (ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat, flags: c_int) path=path node={ fill(st); 0 };
    statx c"statx" STATX (dirfd: c_int, path: *const c_char, flags: c_int, mask: libc::c_uint, st: *mut libc::statx) path=path node={ fill_statx(st); 0 };
    // Every mode is granted on a uroce device node.
    access c"access" ACCESS (path: *const c_char, mode: c_int) path=path node=0;
    faccessat c"faccessat" FACCESSAT (dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) path=path node=0;
    euidaccess c"euidaccess" EUIDACCESS (path: *const c_char, mode: c_int) path=path node=0;
    eaccess c"eaccess" EACCESS (path: *const c_char, mode: c_int) path=path node=0;
}

pub mod audit;
pub mod sysfs_view;
use sysfs_view::via_view;

// ---------------------------------------------------------------- getifaddrs

/// One added interface: the `ifaddrs` node and what it points to.
#[repr(C)]
struct Node {
    ifa: libc::ifaddrs,
    addr: libc::sockaddr_storage,
    mask: libc::sockaddr_storage,
    name: [c_char; 64],
}

/// Blocks of added nodes handed out by `getifaddrs` and not yet freed:
/// (first node, count).
static ADDED: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

/// The configured devices, as `UROCE_DEVICES` names them (`name=ip,...`;
/// unset: `uroce0` on 127.0.0.1). Malformed entries are skipped.
fn devices() -> Vec<(String, std::net::IpAddr)> {
    let spec = std::env::var("UROCE_DEVICES").unwrap_or_default();
    if spec.trim().is_empty() {
        return vec![("uroce0".into(), std::net::Ipv4Addr::LOCALHOST.into())];
    }
    spec.split(',')
        .filter_map(|e| {
            let (name, ip) = e.trim().split_once('=')?;
            Some((name.trim().to_string(), ip.trim().parse().ok()?))
        })
        .filter(|(n, _)| !n.is_empty() && n.len() < 64)
        .collect()
}

/// A sockaddr for `ip` (port 0) and the all-ones mask of its family.
fn sockaddrs(ip: std::net::IpAddr) -> (libc::sockaddr_storage, libc::sockaddr_storage) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let (mut a, mut m): (libc::sockaddr_storage, libc::sockaddr_storage) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (s, bytes) in [(&mut a, v4.octets()), (&mut m, [0xff; 4])] {
                // SAFETY: sockaddr_storage is large and aligned enough for
                // any sockaddr.
                let sin =
                    unsafe { &mut *(s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_addr.s_addr = u32::from_ne_bytes(bytes);
            }
        }
        std::net::IpAddr::V6(v6) => {
            for (s, bytes) in [(&mut a, v6.octets()), (&mut m, [0xff; 16])] {
                // SAFETY: as above.
                let sin6 = unsafe {
                    &mut *(s as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
                };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_addr.s6_addr = bytes;
            }
        }
    }
    (a, m)
}

/// Nodes for the configured devices, linked in order, in one leaked block
/// (recorded in [`ADDED`]); null when there are none.
fn added_nodes() -> *mut libc::ifaddrs {
    let devs = devices();
    if devs.is_empty() {
        return std::ptr::null_mut();
    }
    let nodes: Vec<Node> = devs
        .iter()
        .map(|(name, ip)| {
            let (addr, mask) = sockaddrs(*ip);
            let mut n = [0 as c_char; 64];
            for (d, s) in n.iter_mut().zip(name.bytes()) {
                *d = s as c_char;
            }
            Node {
                // SAFETY: all-zero is a valid ifaddrs (null pointers).
                ifa: unsafe { std::mem::zeroed() },
                addr,
                mask,
                name: n,
            }
        })
        .collect();
    let len = nodes.len();
    let p: *mut Node = Box::into_raw(nodes.into_boxed_slice()).cast();
    for i in 0..len {
        // SAFETY: i < len, inside the block just leaked; the pointers
        // stored point into the same block, which lives until
        // freeifaddrs.
        unsafe {
            let n = p.add(i);
            (*n).ifa.ifa_next = if i + 1 < len {
                &raw mut (*p.add(i + 1)).ifa
            } else {
                std::ptr::null_mut()
            };
            (*n).ifa.ifa_name = (&raw mut (*n).name).cast();
            (*n).ifa.ifa_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_uint;
            (*n).ifa.ifa_addr = (&raw mut (*n).addr).cast();
            (*n).ifa.ifa_netmask = (&raw mut (*n).mask).cast();
        }
    }
    ADDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((p as usize, len));
    // SAFETY: the first node of the block (len >= 1).
    unsafe { &raw mut (*p).ifa }
}

/// The block of added nodes `ifa` is in, if any.
fn added_block(ifa: *const libc::ifaddrs) -> Option<(usize, usize)> {
    let a = ifa as usize;
    ADDED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .find(|&(p, n)| a >= p && a < p + n * std::mem::size_of::<Node>())
}

type GetifaddrsFn = unsafe extern "C" fn(*mut *mut libc::ifaddrs) -> c_int;
type FreeifaddrsFn = unsafe extern "C" fn(*mut libc::ifaddrs);

/// `getifaddrs(3)`: the C library's list, then one entry per uroce
/// device (unless `UROCE_IFADDRS=0`).
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let f = forward!(GETIFADDRS, c"getifaddrs", GetifaddrsFn);
    // SAFETY: forwarded as called.
    let r = unsafe { f(out) };
    if r != 0 || out.is_null() || std::env::var("UROCE_IFADDRS").is_ok_and(|v| v == "0") {
        return r;
    }
    let extra = added_nodes();
    if extra.is_null() {
        return r;
    }
    // SAFETY: `out` holds the C library's list (possibly empty); append.
    unsafe {
        let mut tail = out;
        while !(*tail).is_null() {
            tail = &raw mut (**tail).ifa_next;
        }
        *tail = extra;
    }
    0
}

/// `freeifaddrs(3)`: frees the entries [`getifaddrs`] added, then gives
/// the C library its own list back.
///
/// # Safety
/// As the C library's.
#[no_mangle]
pub unsafe extern "C" fn freeifaddrs(list: *mut libc::ifaddrs) {
    static FREE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    // Cut the list before the first added node.
    let mut head = list;
    let mut prev: *mut libc::ifaddrs = std::ptr::null_mut();
    let mut cur = list;
    while !cur.is_null() {
        if let Some((p, n)) = added_block(cur) {
            if prev.is_null() {
                head = std::ptr::null_mut();
            } else {
                // SAFETY: prev is a live node of the C library's part.
                unsafe { (*prev).ifa_next = std::ptr::null_mut() };
            }
            ADDED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&(q, _)| q != p);
            // SAFETY: made by Box::into_raw of a boxed slice of n nodes in
            // added_nodes, removed from ADDED above, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p as *mut Node, n)) });
            break;
        }
        prev = cur;
        // SAFETY: a live node.
        cur = unsafe { (*cur).ifa_next };
    }
    if head.is_null() {
        return;
    }
    let p = next(&FREE, c"freeifaddrs");
    if !p.is_null() {
        // SAFETY: the C library's freeifaddrs, on its own list.
        unsafe { std::mem::transmute::<*mut c_void, FreeifaddrsFn>(p)(head) };
    }
}

#[cfg(test)]
mod tests {
    use super::is_uroce_node;

    #[test]
    fn added_interfaces_are_listed_and_freed() {
        std::env::set_var("UROCE_DEVICES", "a0=127.9.0.1,b1=::1,bad");
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: the functions under test, used as C programs do.
        unsafe {
            assert_eq!(super::getifaddrs(&mut list), 0);
            let mut names = Vec::new();
            let mut cur = list;
            while !cur.is_null() {
                let n = std::ffi::CStr::from_ptr((*cur).ifa_name)
                    .to_string_lossy()
                    .into_owned();
                if n == "a0" {
                    let sin = &*(*cur).ifa_addr.cast::<libc::sockaddr_in>();
                    assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [127, 9, 0, 1]);
                    assert_eq!((*cur).ifa_flags & libc::IFF_LOOPBACK as u32, 0);
                }
                names.push(n);
                cur = (*cur).ifa_next;
            }
            assert!(
                names.ends_with(&["a0".to_string(), "b1".to_string()]),
                "{names:?}"
            );
            super::freeifaddrs(list);
        }
        assert!(super::ADDED.lock().unwrap().is_empty());
    }

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
