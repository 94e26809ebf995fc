//! QPs and SRQs on ids: made through libibverbs' own create calls of this
//! library (so `id->qp` works with verbs.h's inline data-path calls), the
//! QP handed to the uroce id, which moves it through its states.

use super::ffi::*;
use super::{errno, id, last_errno};
use crate::ffi::*;
use crate::{guard, minus_one_result};
use libc::{c_int, c_void};
use std::ptr::{addr_of_mut, null_mut};
use uroce_verbs::{AttrMask, QpAttr, QpState};

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_create_qp, rdma_destroy_qp, rdma_create_qp_ex, rdma_create_srq,
                   rdma_create_srq_ex, rdma_destroy_srq]
    "RDMACM_1.2": [rdma_init_qp_attr]
}

/// `IBV_QP_INIT_ATTR_PD`.
const QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_SRQ_INIT_ATTR_TYPE`, `IBV_SRQ_INIT_ATTR_PD`.
const SRQ_INIT_ATTR_TYPE: u32 = 1;
const SRQ_INIT_ATTR_PD: u32 = 2;
/// `IBV_SRQT_BASIC`.
const SRQT_BASIC: c_int = 0;

/// Mirrors the uroce QP's state in `qp->state` (libibverbs keeps it there
/// after each `ibv_modify_qp`; the CM moves id QPs itself).
///
/// # Safety
/// `qp` is NULL or a live QP of this library.
pub(crate) unsafe fn sync_qp_state(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    if let Ok(q) = unsafe { crate::qp::qp(qp) } {
        // SAFETY: the QP's C half, which libibverbs also writes.
        unsafe { (*qp).state = q.rust.state() as c_int };
    }
}

/// Moves a QP to ERR (librdmacm does on a rejection).
///
/// # Safety
/// `qp` is NULL or a live QP of this library.
pub(crate) unsafe fn qp_to_err(qp: *mut ibv_qp) {
    if qp.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    if let Ok(q) = unsafe { crate::qp::qp(qp) } {
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = q.rust.modify(&a, AttrMask::STATE);
    }
}

/// librdmacm's `ucma_create_cqs`: a completion channel and a CQ (whose
/// context is the id) for each non-zero size.
///
/// # Safety
/// `p` is a live id of this library.
unsafe fn create_cqs(p: *mut rdma_cm_id, send: u32, recv: u32) -> Result<(), i32> {
    // SAFETY: the caller's promise; the id's C half (here and below).
    let verbs = unsafe { (*p).verbs };
    for (size, is_send) in [(recv, false), (send, true)] {
        if size == 0 {
            continue;
        }
        // SAFETY: the id's C half; only this library writes these fields.
        let (chan_at, cq_at) = unsafe {
            if is_send {
                (
                    addr_of_mut!((*p).send_cq_channel),
                    addr_of_mut!((*p).send_cq),
                )
            } else {
                (
                    addr_of_mut!((*p).recv_cq_channel),
                    addr_of_mut!((*p).recv_cq),
                )
            }
        };
        // SAFETY: the id's context, from this library; p as above; the
        // channel is recorded before the CQ is made (destroy_cqs finds it).
        unsafe {
            let ch = made(p, crate::cq::ibv_create_comp_channel_impl(verbs))?;
            *chan_at = ch;
            let n = c_int::try_from(size).unwrap_or(c_int::MAX);
            *cq_at = made(
                p,
                crate::cq::ibv_create_cq_impl(verbs, n, p.cast::<c_void>(), ch, 0),
            )?;
        }
    }
    Ok(())
}

/// `o` as [`create_cqs`] made it, or (NULL) the errno of the call that
/// failed with what `create_cqs` made before destroyed.
///
/// # Safety
/// `p` is a live id of this library.
unsafe fn made<T>(p: *mut rdma_cm_id, o: *mut T) -> Result<*mut T, i32> {
    if o.is_null() {
        let e = last_errno();
        // SAFETY: the caller's promise.
        unsafe { destroy_cqs(p) };
        return Err(e);
    }
    Ok(o)
}

/// librdmacm's `ucma_destroy_cqs`: the CQs and channels it made.
///
/// # Safety
/// `p` is a live id of this library.
unsafe fn destroy_cqs(p: *mut rdma_cm_id) {
    // SAFETY: the caller's promise: the id's C half, only this library
    // writes these fields.
    let c = unsafe { &mut *p };
    // SAFETY: CQs and channels of this library, made by create_cqs.
    unsafe {
        destroy_pair(
            &mut c.recv_cq,
            &mut c.send_cq,
            crate::cq::ibv_destroy_cq_impl,
        );
        destroy_pair(
            &mut c.recv_cq_channel,
            &mut c.send_cq_channel,
            crate::cq::ibv_destroy_comp_channel_impl,
        );
    }
}

/// Destroys an id's receive and send side objects with `destroy` (once
/// where both name the same one), then clears both.
///
/// # Safety
/// Each is NULL or a live object of this library that `destroy` takes.
unsafe fn destroy_pair<T>(
    recv: &mut *mut T,
    send: &mut *mut T,
    destroy: unsafe extern "C" fn(*mut T) -> c_int,
) {
    if !recv.is_null() {
        // SAFETY: the caller's promise.
        unsafe { destroy(*recv) };
    }
    if !send.is_null() && *send != *recv {
        // SAFETY: the caller's promise.
        unsafe { destroy(*send) };
    }
    *recv = null_mut();
    *send = null_mut();
}

/// `rdma_create_qp_ex`: the QP as `ibv_create_qp_ex` makes it (CQs made
/// for the id where the attributes name none, the id's PD where they
/// name none), then given to the uroce id, which moves it to INIT (RC,
/// UC) or RTS (UD).
///
/// # Safety
/// `p` is NULL or a live id of this library. Its C half is reached
/// through `p` field by field (the program may read it meanwhile).
pub(crate) unsafe fn create_qp_ex(
    p: *mut rdma_cm_id,
    a: &mut ibv_qp_init_attr_ex,
) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    let cm = inner.cm()?;
    // SAFETY: the id's C half (here and below).
    let (qp, verbs, pd) = unsafe { ((*p).qp, (*p).verbs, (*p).pd) };
    if !qp.is_null() {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & QP_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.comp_mask |= QP_INIT_ATTR_PD;
        a.pd = pd;
    // SAFETY: a PD of this library (the caller's contract).
    } else if verbs != unsafe { (*a.pd).context } {
        return Err(libc::EINVAL);
    }
    if a.pd.is_null() {
        // An id without a device (not bound to one yet).
        return Err(libc::EINVAL);
    }
    // SAFETY: as above.
    let (id_send, id_recv) = unsafe { ((*p).send_cq, (*p).recv_cq) };
    if (!id_recv.is_null() && !a.recv_cq.is_null() && id_recv != a.recv_cq)
        || (!id_send.is_null() && !a.send_cq.is_null() && id_send != a.send_cq)
    {
        return Err(libc::EINVAL);
    }
    let send = if a.send_cq.is_null() && id_send.is_null() {
        a.cap.max_send_wr
    } else {
        0
    };
    let recv = if a.recv_cq.is_null() && id_recv.is_null() {
        a.cap.max_recv_wr
    } else {
        0
    };
    // SAFETY: a live id.
    unsafe { create_cqs(p, send, recv)? };
    // SAFETY: as above.
    unsafe {
        if a.send_cq.is_null() {
            a.send_cq = (*p).send_cq;
        }
        if a.recv_cq.is_null() {
            a.recv_cq = (*p).recv_cq;
        }
        if !(*p).srq.is_null() && a.srq.is_null() {
            a.srq = (*p).srq;
        }
    }
    // SAFETY: the id's context and the caller's attributes.
    let qp = unsafe { crate::qp::create_qp_ex(verbs, a) };
    if qp.is_null() {
        let e = last_errno();
        // SAFETY: a live id.
        unsafe { destroy_cqs(p) };
        return Err(e);
    }
    // SAFETY: just made by this library.
    let q = unsafe { crate::qp::qp(qp)? };
    if let Err(e) = cm.attach_qp(q.rust.clone()) {
        // SAFETY: the QP just made; a live id.
        unsafe {
            crate::qp::ibv_destroy_qp_impl(qp);
            destroy_cqs(p);
        }
        return Err(errno(&e));
    }
    // SAFETY: as above.
    unsafe {
        sync_qp_state(qp);
        (*p).pd = (*qp).pd;
        (*p).qp = qp;
    }
    Ok(())
}

/// `rdma_create_qp`: as `rdma_create_qp_ex` with the PD given (or the
/// id's), the attributes (capabilities, CQs made) written back.
///
/// # Safety
/// `p` is NULL or a live id of this library.
pub(crate) unsafe fn create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
) -> Result<(), i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: all-zero is valid for this attribute struct.
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = a.qp_context;
    ex.send_cq = a.send_cq;
    ex.recv_cq = a.recv_cq;
    ex.srq = a.srq;
    ex.cap = a.cap;
    ex.qp_type = a.qp_type;
    ex.sq_sig_all = a.sq_sig_all;
    ex.comp_mask = QP_INIT_ATTR_PD;
    // SAFETY: the id's C half (p checked above).
    ex.pd = if pd.is_null() { unsafe { (*p).pd } } else { pd };
    // SAFETY: forwarded.
    let r = unsafe { create_qp_ex(p, &mut ex) };
    a.send_cq = ex.send_cq;
    a.recv_cq = ex.recv_cq;
    a.srq = ex.srq;
    a.cap = ex.cap;
    r
}

/// [`minus_one_result`] of `f` on the caller's attribute struct `attr`
/// (EINVAL for NULL).
///
/// # Safety
/// `attr` is NULL or points to a valid, writable struct for the call.
unsafe fn with_attr<A>(attr: *mut A, f: impl FnOnce(&mut A) -> Result<(), i32>) -> c_int {
    minus_one_result(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: not NULL; the caller's promise.
        f(unsafe { &mut *attr })
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_create_qp(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    // SAFETY: the caller's attributes; an id of this library.
    unsafe { with_attr(attr, |a| create_qp(p, pd, a)) }
}

#[no_mangle]
unsafe extern "C" fn rdma_create_qp_ex(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    // SAFETY: the caller's attributes; an id of this library.
    unsafe { with_attr(attr, |a| create_qp_ex(p, a)) }
}

/// `rdma_destroy_qp`: the id forgets its QP, which is destroyed, with the
/// CQs `rdma_create_qp` made for it.
///
/// # Safety
/// `p` is NULL or a live id of this library.
pub(crate) unsafe fn destroy_qp(p: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    let Ok(inner) = (unsafe { id(p) }) else {
        return;
    };
    if let Ok(cm) = inner.cm() {
        cm.detach_qp();
    }
    // SAFETY: a live id (looked up above); its QP is one of this library.
    unsafe { destroy_with_cqs(p, |c| &mut c.qp, crate::qp::ibv_destroy_qp_impl) }
}

/// Takes the id's object in `slot` (its QP or SRQ) and destroys it with
/// `destroy` (where there is one), then the CQs made for the id.
///
/// # Safety
/// `p` is a live id of this library; the object in its `slot` is NULL or
/// one of this library that `destroy` takes.
unsafe fn destroy_with_cqs<T>(
    p: *mut rdma_cm_id,
    slot: impl FnOnce(&mut rdma_cm_id) -> &mut *mut T,
    destroy: unsafe extern "C" fn(*mut T) -> c_int,
) {
    // SAFETY: the caller's promise: the id's C half, only this library
    // writes these fields.
    let o = std::mem::replace(slot(unsafe { &mut *p }), null_mut());
    if !o.is_null() {
        // SAFETY: the caller's promise.
        unsafe { destroy(o) };
    }
    // SAFETY: a live id.
    unsafe { destroy_cqs(p) };
}

#[no_mangle]
unsafe extern "C" fn rdma_destroy_qp(p: *mut rdma_cm_id) {
    // SAFETY: an id of this library (the caller's contract).
    guard((), || unsafe { destroy_qp(p) })
}

/// `rdma_create_srq_ex`: basic SRQs (on the id's PD where none is given);
/// XRC and the extended attributes are not supported (EOPNOTSUPP, as
/// `ibv_create_srq_ex` answers on this library's devices).
///
/// # Safety
/// `p` is NULL or a live id of this library.
unsafe fn create_srq_ex(p: *mut rdma_cm_id, a: &mut ibv_srq_init_attr_ex) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    unsafe { id(p)? };
    // SAFETY: the id's C half: only this library writes these fields.
    let c = unsafe { &mut *p };
    if a.comp_mask & SRQ_INIT_ATTR_TYPE == 0 {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & SRQ_INIT_ATTR_PD == 0 || a.pd.is_null() {
        a.pd = c.pd;
        a.comp_mask |= SRQ_INIT_ATTR_PD;
    }
    // XRC (and tag matching, ...) are not there.
    if a.srq_type != SRQT_BASIC || a.comp_mask & !(SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: ibv_srq_init_attr_ex begins with ibv_srq_init_attr; the PD
    // is the id's or the caller's.
    let srq =
        unsafe { crate::srq::ibv_create_srq_impl(a.pd, (a as *mut ibv_srq_init_attr_ex).cast()) };
    if srq.is_null() {
        return Err(last_errno());
    }
    if c.pd.is_null() {
        c.pd = a.pd;
    }
    c.srq = srq;
    Ok(())
}

#[no_mangle]
unsafe extern "C" fn rdma_create_srq_ex(
    p: *mut rdma_cm_id,
    attr: *mut ibv_srq_init_attr_ex,
) -> c_int {
    // SAFETY: the caller's attributes; an id of this library.
    unsafe { with_attr(attr, |a| create_srq_ex(p, a)) }
}

#[no_mangle]
unsafe extern "C" fn rdma_create_srq(
    p: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    let make = |a: &mut ibv_srq_init_attr| {
        let mut ex = ibv_srq_init_attr_ex {
            srq_context: a.srq_context,
            attr: a.attr,
            comp_mask: SRQ_INIT_ATTR_TYPE | SRQ_INIT_ATTR_PD,
            srq_type: SRQT_BASIC,
            pd,
            xrcd: null_mut(),
            cq: null_mut(),
            tm_cap: ibv_tm_cap {
                max_num_tags: 0,
                max_ops: 0,
            },
        };
        // SAFETY: an id of this library.
        let r = unsafe { create_srq_ex(p, &mut ex) };
        a.srq_context = ex.srq_context;
        a.attr = ex.attr;
        r
    };
    // SAFETY: the caller's attributes.
    unsafe { with_attr(attr, make) }
}

/// # Safety
/// `p` is NULL or a live id of this library.
pub(crate) unsafe fn destroy_srq(p: *mut rdma_cm_id) {
    if p.is_null() {
        return;
    }
    // SAFETY: the caller's promise (p is not NULL); its SRQ is one of
    // this library.
    unsafe { destroy_with_cqs(p, |c| &mut c.srq, crate::srq::ibv_destroy_srq_impl) }
}

#[no_mangle]
unsafe extern "C" fn rdma_destroy_srq(p: *mut rdma_cm_id) {
    // SAFETY: an id of this library (the caller's contract).
    guard((), || unsafe { destroy_srq(p) })
}

/// `rdma_init_qp_attr`: the attributes (and mask) that move a QP of the
/// connection to `qp_attr->qp_state`, from the uroce id.
#[no_mangle]
unsafe extern "C" fn rdma_init_qp_attr(
    p: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let state = u32::try_from(unsafe { (*attr).qp_state })
            .ok()
            .and_then(QpState::from_u32)
            .ok_or(libc::EINVAL)?;
        let (a, m) = inner.cm()?.init_qp_attr(state).map_err(|e| errno(&e))?;
        // SAFETY: the caller's outputs.
        unsafe {
            *attr = crate::qp::qp_attr_to_c(&a);
            *mask = m.bits() as c_int;
        }
        Ok(())
    })
}
