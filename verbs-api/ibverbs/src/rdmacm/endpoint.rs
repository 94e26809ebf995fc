//! Endpoints: `rdma_create_ep` makes a synchronous id (with its QP) from
//! an address information entry, `rdma_destroy_ep` undoes it.

use super::addrinfo::RAI_PASSIVE;
use super::ffi::*;
use super::{create_id, destroy_id, id, ps_of};
use crate::ffi::*;
use crate::{guard, minus_one_result};
use libc::c_int;
use std::ptr::null_mut;
use uroce_verbs::QpType;

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_create_ep, rdma_destroy_ep]
}

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
