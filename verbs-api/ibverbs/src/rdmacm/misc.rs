//! The rest of librdmacm: devices, event names, address information,
//! endpoints (`rdma_create_ep`), multicast (`rdma_join_multicast`,
//! `rdma_join_multicast_ex`, `rdma_leave_multicast`: IPv4 groups, as the
//! kernel's CMA joins them on RoCE; IPv6 groups are EOPNOTSUPP), and ECE,
//! answered as on a device without it. The rsocket calls are in
//! `rsocket.rs`.

use super::ffi::*;
use super::{complete, create_id, destroy_id, errno, id, ps_of, sockaddr_from_c};
use crate::ffi::*;
use crate::{guard, minus_one_result, set_errno};
use libc::{c_char, c_int, c_void, sockaddr};
use std::ffi::CStr;
use std::ptr::null_mut;
use uroce_verbs::QpType;

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_get_devices, rdma_free_devices, rdma_event_str, rdma_getaddrinfo,
                   rdma_freeaddrinfo, rdma_create_ep, rdma_destroy_ep, rdma_join_multicast,
                   rdma_leave_multicast]
    "RDMACM_1.1": [rdma_join_multicast_ex]
    "RDMACM_1.3": [rdma_set_local_ece, rdma_get_remote_ece]
}

/// `RAI_PASSIVE`, `RAI_NUMERICHOST`, `RAI_SA`.
const RAI_PASSIVE: c_int = 1;
const RAI_NUMERICHOST: c_int = 2;
const RAI_SA: c_int = 0x20;
/// `AF_IB`.
const AF_IB: c_int = 27;

// ---------------------------------------------------------------- devices

/// The context of every device (`rdma_cm_id::verbs` of its ids), in a
/// NULL-terminated array from `malloc`.
#[no_mangle]
unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let list = crate::device::cm_contexts();
        let out = match &list {
            Ok(v) => {
                // SAFETY: malloc of n + 1 pointers (checked below).
                let a = unsafe { libc::calloc(v.len() + 1, std::mem::size_of::<usize>()) }
                    .cast::<*mut ibv_context>();
                if !a.is_null() {
                    for (i, &c) in v.iter().enumerate() {
                        // SAFETY: within the n + 1 entries.
                        unsafe { *a.add(i) = c };
                    }
                } else {
                    set_errno(libc::ENOMEM);
                }
                a
            }
            Err(e) => {
                set_errno(*e);
                null_mut()
            }
        };
        if !num.is_null() {
            let n = if out.is_null() {
                0
            } else {
                list.map_or(0, |v| v.len())
            };
            // SAFETY: the caller's out-parameter.
            unsafe { *num = c_int::try_from(n).unwrap_or(c_int::MAX) };
        }
        out
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: an array from rdma_get_devices (malloc), or NULL. The
    // contexts stay open, as librdmacm keeps its devices.
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
extern "C" fn rdma_event_str(event: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| T.get(i))
        .copied()
        .unwrap_or(c"UNKNOWN EVENT")
        .as_ptr()
}

// ---------------------------------------------------------------- addrinfo

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

// ---------------------------------------------------------------- endpoints

fn qp_type_of(t: c_int) -> Result<QpType, i32> {
    match t {
        2 => Ok(QpType::Rc),
        3 => Ok(QpType::Uc),
        4 => Ok(QpType::Ud),
        _ => Err(libc::EINVAL),
    }
}

/// `rdma_create_ep`: a synchronous id for `res`: bound (`RAI_PASSIVE`; the
/// QP attributes kept for `rdma_get_request`), or with its address and
/// route resolved and, given QP attributes, its QP made.
#[no_mangle]
unsafe extern "C" fn rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    minus_one_result(|| {
        if out.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's address information.
        let r = unsafe { &*res };
        let ps = ps_of(r.ai_port_space)?;
        let qp_type = qp_type_of(r.ai_qp_type)?;
        let p = create_id(null_mut(), null_mut(), ps, qp_type)?;
        // SAFETY: p was just made; the caller's addresses and attributes.
        let made = unsafe { set_up_ep(p, r, pd, qp_init_attr) };
        match made {
            Ok(()) => {
                // SAFETY: the caller's out-parameter.
                unsafe { *out = p };
                Ok(())
            }
            Err(e) => {
                // SAFETY: p is live and ours.
                unsafe { destroy_ep(p) };
                Err(e)
            }
        }
    })
}

/// # Safety
/// `p` is a live id of this library; `r`'s addresses and `attr` are the
/// caller's (valid or NULL).
unsafe fn set_up_ep(
    p: *mut rdma_cm_id,
    r: &rdma_addrinfo,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    if r.ai_flags & RAI_PASSIVE != 0 {
        // SAFETY: as above.
        unsafe { super::bind_addr(p, r.ai_src_addr)? };
        if !pd.is_null() {
            // SAFETY: the id's C half.
            unsafe { (*p).pd = pd };
        }
        if !attr.is_null() {
            // SAFETY: the caller's attributes.
            let mut a = Box::new(unsafe { *attr });
            a.qp_type = r.ai_qp_type;
            inner.st.lock().qp_init_attr = Some(a);
        }
        return Ok(());
    }
    // SAFETY: as above.
    unsafe {
        super::resolve_addr(p, r.ai_src_addr, r.ai_dst_addr)?;
        super::resolve_route(p)?;
    }
    if !attr.is_null() {
        // SAFETY: the caller's attributes.
        unsafe {
            (*attr).qp_type = r.ai_qp_type;
            super::qp::create_qp(p, pd, &mut *attr)?;
        }
    }
    if r.ai_connect_len != 0 && !r.ai_connect.is_null() {
        // SAFETY: the caller's ai_connect_len bytes.
        let d = unsafe { std::slice::from_raw_parts(r.ai_connect.cast::<u8>(), r.ai_connect_len) };
        inner.st.lock().connect = d.to_vec();
    }
    Ok(())
}

/// # Safety
/// `p` is NULL or a live id of this library.
unsafe fn destroy_ep(p: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    let Ok(inner) = (unsafe { id(p) }) else {
        return;
    };
    // SAFETY: as above.
    unsafe {
        if !(*p).qp.is_null() {
            super::qp::destroy_qp(p);
        }
        if !(*p).srq.is_null() {
            super::qp::destroy_srq(p);
        }
    }
    inner.st.lock().qp_init_attr = None;
    // SAFETY: as above.
    let _ = unsafe { destroy_id(p) };
}

#[no_mangle]
unsafe extern "C" fn rdma_destroy_ep(p: *mut rdma_cm_id) {
    // SAFETY: an id of this library (the caller's contract).
    guard((), || unsafe { destroy_ep(p) })
}

// ---------------------------------------------------------------- multicast

/// The `context` each (id, MGID) was joined with: librdmacm hands it back
/// as the join event's `param.ud.private_data`.
static MC_CONTEXTS: std::sync::LazyLock<parking_lot::Mutex<McContexts>> =
    std::sync::LazyLock::new(Default::default);

/// (id address, MGID) -> context address.
type McContexts = std::collections::HashMap<(usize, [u8; 16]), usize>;

/// The context a multicast event of id `p` for `mgid` reports.
pub(crate) fn mc_context(p: *mut rdma_cm_id, mgid: &[u8; 16]) -> *const c_void {
    MC_CONTEXTS
        .lock()
        .get(&(p as usize, *mgid))
        .map_or(std::ptr::null(), |&c| c as *const c_void)
}

/// Forgets the join contexts of an id being destroyed.
pub(crate) fn forget_mc_contexts(p: *mut rdma_cm_id) {
    MC_CONTEXTS.lock().retain(|(id, _), _| *id != p as usize);
}

/// Joins the group at `addr` (see `CmId::join_multicast`): the id's QP is
/// attached, and RDMA_CM_EVENT_MULTICAST_JOIN (or _ERROR) reports it.
///
/// # Safety
/// `p` is NULL or an id of this library; `addr` NULL or a socket address.
unsafe fn join(
    p: *mut rdma_cm_id,
    addr: *const sockaddr,
    send_only: bool,
    context: *mut c_void,
) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    // SAFETY: as above.
    let a = unsafe { sockaddr_from_c(addr) }.ok_or(libc::EINVAL)?;
    if let std::net::IpAddr::V4(v4) = a.ip().to_canonical() {
        MC_CONTEXTS
            .lock()
            .insert((p as usize, v4.to_ipv6_mapped().octets()), context as usize);
    }
    inner
        .cm()?
        .join_multicast(a, send_only)
        .map_err(|e| errno(&e))?;
    // SAFETY: a live id of this library.
    unsafe { complete(p) }
}

#[no_mangle]
unsafe extern "C" fn rdma_join_multicast(
    p: *mut rdma_cm_id,
    addr: *mut sockaddr,
    context: *mut c_void,
) -> c_int {
    // SAFETY: an id of this library; the caller's address.
    minus_one_result(|| unsafe { join(p, addr, false, context) })
}

#[no_mangle]
unsafe extern "C" fn rdma_join_multicast_ex(
    p: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        unsafe { id(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        // RDMA_CM_JOIN_MC_ATTR_RESERVED, _ADDRESS, _JOIN_FLAGS;
        // RDMA_MC_JOIN_FLAG_RESERVED.
        if a.comp_mask >= 4 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & 1 == 0 || a.comp_mask & 2 == 0 || a.join_flags >= 2 {
            return Err(libc::EINVAL);
        }
        // RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: no attach.
        // SAFETY: an id of this library; the caller's address.
        unsafe { join(p, a.addr, a.join_flags == 1, context) }
    })
}

/// Leaves a group the id joined (EADDRNOTAVAIL for one it did not).
#[no_mangle]
unsafe extern "C" fn rdma_leave_multicast(p: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        let inner = unsafe { id(p)? };
        // SAFETY: the caller's address.
        let a = unsafe { sockaddr_from_c(addr) }.ok_or(libc::EINVAL)?;
        inner.cm()?.leave_multicast(a).map_err(|e| errno(&e))?;
        if let std::net::IpAddr::V4(v4) = a.ip().to_canonical() {
            MC_CONTEXTS
                .lock()
                .remove(&(p as usize, v4.to_ipv6_mapped().octets()));
        }
        Ok(())
    })
}

// ---------------------------------------------------------------- ECE

/// Kept, as librdmacm keeps it, and never sent: uroce's QPs have no ECE
/// (`ibv_query_ece` is EOPNOTSUPP), so connections go without, as on any
/// device without ECE.
#[no_mangle]
unsafe extern "C" fn rdma_set_local_ece(p: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        let inner = unsafe { id(p)? };
        // SAFETY: the id's C half; the caller's ECE.
        if !unsafe { (*p).qp }.is_null() || ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        let e = unsafe { &*ece };
        if e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        inner.st.lock().local_ece = (e.vendor_id, e.options);
        Ok(())
    })
}

/// The peer's ECE: none (vendor 0, options 0).
#[no_mangle]
unsafe extern "C" fn rdma_get_remote_ece(p: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        unsafe { id(p)? };
        // SAFETY: the id's C half; the caller's ECE.
        if !unsafe { (*p).qp }.is_null() || ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        unsafe {
            *ece = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            }
        };
        Ok(())
    })
}
