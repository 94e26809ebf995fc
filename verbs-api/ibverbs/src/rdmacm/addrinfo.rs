//! Address information: `rdma_getaddrinfo` (IP addresses and names, as
//! librdmacm resolves them without ibacm) and `rdma_freeaddrinfo`.

use super::ffi::*;
use crate::{guard, set_errno};
use libc::{c_char, c_int, c_void};
use std::ptr::null_mut;
use uroce_verbs::QpType;

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_getaddrinfo, rdma_freeaddrinfo]
}

/// `RAI_PASSIVE`, `RAI_NUMERICHOST`, `RAI_SA`.
pub(super) const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const RAI_SA: c_int = 0x20;
/// `AF_IB`.
const AF_IB: c_int = 27;

/// A `malloc`ed copy of `len` bytes (librdmacm frees with `free`).
///
/// # Safety
/// `src` points to `len` readable bytes.
unsafe fn malloc_copy(src: *const c_void, len: usize) -> Result<*mut c_void, i32> {
    // SAFETY: plain allocation.
    let d = unsafe { libc::malloc(len.max(1)) };
    if d.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: the caller's promise; d holds len bytes.
    unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), d.cast::<u8>(), len) };
    Ok(d)
}

/// librdmacm's `ucma_convert_to_ai`: the getaddrinfo hints for `h`.
fn ai_hints(h: &rdma_addrinfo) -> libc::addrinfo {
    // SAFETY: all-zero is a valid addrinfo.
    let mut ai: libc::addrinfo = unsafe { std::mem::zeroed() };
    if h.ai_flags & RAI_PASSIVE != 0 {
        ai.ai_flags = libc::AI_PASSIVE;
    }
    if h.ai_flags & RAI_NUMERICHOST != 0 {
        ai.ai_flags |= libc::AI_NUMERICHOST;
    }
    if h.ai_family != AF_IB {
        ai.ai_family = h.ai_family;
    }
    ai.ai_socktype = match h.ai_qp_type {
        2 | 3 | 9 | 10 => libc::SOCK_STREAM,
        4 => libc::SOCK_DGRAM,
        _ => 0,
    };
    ai.ai_protocol = match h.ai_port_space {
        0x0106 => libc::IPPROTO_TCP,
        0x0002 | 0x0111 => libc::IPPROTO_UDP,
        0x013f if ai.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
        0x013f if ai.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
        _ => 0,
    };
    ai
}

/// `rdma_getaddrinfo` for IP addresses (and names, through the system's
/// resolver), as librdmacm does it without ibacm: the first address
/// getaddrinfo gives, the source with `RAI_PASSIVE`, else the
/// destination; RC (`SOCK_STREAM`, RDMA_PS_TCP) or UD (`SOCK_DGRAM`,
/// RDMA_PS_UDP) unless the hints say. Returns 0, a getaddrinfo error
/// (`EAI_*`, for `gai_strerror`), or -1 with errno. `RAI_SA` (an IB
/// service lookup) is EOPNOTSUPP.
#[no_mangle]
unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard(-1, || {
        let fail = |e: i32| {
            set_errno(e);
            -1
        };
        if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
            return fail(libc::EINVAL);
        }
        let h: &rdma_addrinfo = if hints.is_null() {
            &ZERO_HINTS.0
        } else {
            // SAFETY: the caller's hints.
            unsafe { &*hints }
        };
        if h.ai_flags & RAI_SA != 0 {
            return fail(libc::EOPNOTSUPP);
        }
        // SAFETY: calloc of one rdma_addrinfo (all-zero is valid).
        let rai = unsafe { libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()) }
            .cast::<rdma_addrinfo>();
        if rai.is_null() {
            return fail(libc::ENOMEM);
        }
        // SAFETY: just allocated, ours until returned.
        let r = unsafe { &mut *rai };
        let mut ret: Result<(), i32> = Ok(());
        if !node.is_null() || !service.is_null() {
            let aih = ai_hints(h);
            let mut ai: *mut libc::addrinfo = null_mut();
            // SAFETY: the caller's strings; our hints and out-parameter.
            let g = unsafe {
                libc::getaddrinfo(
                    node,
                    service,
                    if hints.is_null() {
                        std::ptr::null()
                    } else {
                        &aih
                    },
                    &mut ai,
                )
            };
            if g != 0 {
                // SAFETY: ours, nothing in it yet.
                unsafe { libc::free(rai.cast()) };
                return g;
            }
            // SAFETY: getaddrinfo's first result.
            let a = unsafe { &*ai };
            r.ai_qp_type = if h.ai_qp_type != 0 {
                h.ai_qp_type
            } else {
                match a.ai_socktype {
                    libc::SOCK_STREAM => QpType::Rc as c_int,
                    libc::SOCK_DGRAM => QpType::Ud as c_int,
                    _ => 0,
                }
            };
            r.ai_port_space = if h.ai_port_space != 0 {
                h.ai_port_space
            } else {
                match a.ai_protocol {
                    libc::IPPROTO_TCP => 0x0106,
                    libc::IPPROTO_UDP => 0x0111,
                    _ => 0,
                }
            };
            r.ai_family = a.ai_family;
            // SAFETY: getaddrinfo's address of ai_addrlen bytes, and its
            // canonical name (a C string) if any.
            ret = unsafe {
                malloc_copy(a.ai_addr.cast(), a.ai_addrlen as usize).map(|d| {
                    let name = if a.ai_canonname.is_null() {
                        null_mut()
                    } else {
                        libc::strdup(a.ai_canonname)
                    };
                    if a.ai_flags & libc::AI_PASSIVE != 0 {
                        r.ai_flags = RAI_PASSIVE;
                        r.ai_src_addr = d.cast();
                        r.ai_src_len = a.ai_addrlen;
                        r.ai_src_canonname = name;
                    } else {
                        r.ai_dst_addr = d.cast();
                        r.ai_dst_len = a.ai_addrlen;
                        r.ai_dst_canonname = name;
                    }
                })
            };
            // SAFETY: from getaddrinfo.
            unsafe { libc::freeaddrinfo(ai) };
        } else {
            r.ai_flags = h.ai_flags;
            r.ai_family = h.ai_family;
            r.ai_qp_type = h.ai_qp_type;
            r.ai_port_space = h.ai_port_space;
            if h.ai_dst_len != 0 && !h.ai_dst_addr.is_null() {
                // SAFETY: the hints' address of ai_dst_len bytes.
                ret =
                    unsafe { malloc_copy(h.ai_dst_addr.cast(), h.ai_dst_len as usize) }.map(|d| {
                        r.ai_dst_addr = d.cast();
                        r.ai_dst_len = h.ai_dst_len;
                    });
            }
        }
        if ret.is_ok() && r.ai_src_len == 0 && h.ai_src_len != 0 && !h.ai_src_addr.is_null() {
            // SAFETY: the hints' address of ai_src_len bytes.
            ret = unsafe { malloc_copy(h.ai_src_addr.cast(), h.ai_src_len as usize) }.map(|d| {
                r.ai_src_addr = d.cast();
                r.ai_src_len = h.ai_src_len;
            });
        }
        match ret {
            Ok(()) => {
                // SAFETY: the caller's out-parameter.
                unsafe { *res = rai };
                0
            }
            Err(e) => {
                // SAFETY: ours.
                unsafe { free_addrinfo(rai) };
                fail(e)
            }
        }
    })
}

/// All-zero hints (`rdma_getaddrinfo` without hints).
struct Hints(rdma_addrinfo);
// SAFETY: never written; its pointers are NULL.
unsafe impl Sync for Hints {}
static ZERO_HINTS: Hints = Hints(rdma_addrinfo {
    ai_flags: 0,
    ai_family: 0,
    ai_qp_type: 0,
    ai_port_space: 0,
    ai_src_len: 0,
    ai_dst_len: 0,
    ai_src_addr: null_mut(),
    ai_dst_addr: null_mut(),
    ai_src_canonname: null_mut(),
    ai_dst_canonname: null_mut(),
    ai_route_len: 0,
    ai_route: null_mut(),
    ai_connect_len: 0,
    ai_connect: null_mut(),
    ai_next: null_mut(),
});

#[no_mangle]
unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    // SAFETY: a list from rdma_getaddrinfo (the caller's contract).
    unsafe { free_addrinfo(res) }
}

/// # Safety
/// `res` is NULL or a list from `rdma_getaddrinfo`.
unsafe fn free_addrinfo(mut res: *mut rdma_addrinfo) {
    while !res.is_null() {
        // SAFETY: a list from rdma_getaddrinfo, every part from malloc.
        unsafe {
            let r = &*res;
            let next = r.ai_next;
            for p in [
                r.ai_connect,
                r.ai_route,
                r.ai_src_canonname.cast(),
                r.ai_dst_canonname.cast(),
                r.ai_src_addr.cast(),
                r.ai_dst_addr.cast(),
            ] {
                libc::free(p);
            }
            libc::free(res.cast());
            res = next;
        }
    }
}
