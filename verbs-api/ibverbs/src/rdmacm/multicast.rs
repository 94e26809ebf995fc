//! Multicast: `rdma_join_multicast` (and `_ex`) join a group and attach
//! the id's UD QP to it (a send-only join attaches nothing),
//! `rdma_leave_multicast` leaves it; the context each join's event
//! reports is kept here.

use super::ffi::*;
use super::{complete, errno, id, sockaddr_from_c};
use crate::minus_one_result;
use libc::{c_int, c_void, sockaddr};

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_join_multicast, rdma_leave_multicast]
    "RDMACM_1.1": [rdma_join_multicast_ex]
}

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
