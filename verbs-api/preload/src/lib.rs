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

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

/// `stat(2)` and its alias: a uroce device node is filled in, any other
/// path forwarded to the C library's function (moved into the view).
macro_rules! stat_fn {
    ($(#[$doc:meta])* $name:ident $cname:literal $slot:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// As the C library's.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, st: *mut libc::stat) -> c_int {
            // SAFETY: the caller's string.
            if unsafe { matches(path) } {
                fill(st);
                return 0;
            }
            let f = forward!($slot, $cname, StatFn);
            // SAFETY: forwarded as called (the path possibly moved into the view).
            unsafe { via_view(path, false, -1, |p| f(p, st)) }
        }
    };
}

stat_fn!(
    /// `stat(2)`.
    stat c"stat" STAT
);
stat_fn!(
    /// `stat64(2)` (the same structure on 64-bit Linux).
    stat64 c"stat64" STAT64
);

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
    // SAFETY: forwarded as called (the path possibly moved into the view).
    unsafe { via_view(path, false, -1, |p| f(dirfd, p, st, flags)) }
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
    // SAFETY: forwarded as called (the path possibly moved into the view).
    unsafe { via_view(path, false, -1, |p| f(p, mode)) }
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
    // SAFETY: forwarded as called (the path possibly moved into the view).
    unsafe { via_view(path, false, -1, |p| f(dirfd, p, mode, flags)) }
}

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
