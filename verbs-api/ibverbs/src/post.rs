//! Posting: the `ibv_context::ops` entries verbs.h's inline functions
//! call to post work (`post_send`, `post_recv`, `post_srq_recv`,
//! `bind_mw`), and the conversion of C work requests to uroce's. Each WR
//! list is one post into the provider, whose rules (opcode per QP type,
//! SGE and inline limits, UD destination and MTU) apply once; the C side
//! only applies the SGE and inline rules early, before it reads a
//! program's arrays.

use crate::ah::ah;
use crate::ffi::*;
use crate::objects::errno;
use crate::qp::qp;
use crate::srq::srq;
use crate::{errno_result, guard};
use libc::c_int;
use uroce_verbs::provider::types::{InlineData, SgList};
use uroce_verbs::{QueuePair, RecvWr, SendFlags, SendWr, Sge, WrOpcode};

/// A C scatter/gather list of `n` elements as uroce's. `admit` is the
/// queue's SGE count rule (the provider's, the one posting applies too):
/// it runs before the list is touched, as rxe's provider checks the count,
/// so a careless count is refused, not a read past the caller's array. A
/// NULL list with a count is EINVAL.
///
/// # Safety
/// `sg` points to `n` elements when `n > 0` and `admit(n)` accepts.
pub(crate) unsafe fn sg_list(
    sg: *const ibv_sge,
    n: usize,
    admit: impl FnOnce(usize) -> Result<(), i32>,
) -> Result<SgList, i32> {
    if n == 0 {
        return Ok(SgList::new());
    }
    admit(n)?;
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise, for a count the queue admits.
    let s = unsafe { std::slice::from_raw_parts(sg, n) };
    Ok(s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: e.lkey,
        })
        .collect())
}

/// A C WR's `num_sge` as a count (negative: EINVAL).
fn count(num_sge: c_int) -> Result<usize, i32> {
    usize::try_from(num_sge).map_err(|_| libc::EINVAL)
}

/// The total length of an inline send's buffers (what the QP's inline
/// rule is checked against before anything is copied).
fn inline_len(list: &[Sge]) -> usize {
    list.iter().map(|s| s.length as usize).sum()
}

/// The bytes of an inline send, copied now from the program's memory
/// (its length already admitted by the QP's inline rule). Zero-length
/// elements are skipped (a NULL address with length 0 is no slice); a
/// NULL address with a length is EINVAL.
///
/// # Safety
/// Each element with a non-zero length addresses `length` readable bytes
/// (ibv_post_send's contract for IBV_SEND_INLINE: addresses, not keys,
/// count).
pub(crate) unsafe fn gather_inline(list: &[Sge]) -> Result<InlineData, i32> {
    let mut d = InlineData::new();
    for s in list.iter().filter(|s| s.length > 0) {
        if s.addr == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's promise, for a non-null address.
        let b =
            unsafe { std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize) };
        d.extend_from_slice(b);
    }
    Ok(d)
}

fn wr_opcode_of(v: c_int) -> Result<WrOpcode, i32> {
    use WrOpcode::*;
    Ok(match v {
        0 => RdmaWrite,
        1 => RdmaWriteWithImm,
        2 => Send,
        3 => SendWithImm,
        4 => RdmaRead,
        5 => AtomicCmpAndSwp,
        6 => AtomicFetchAndAdd,
        7 => LocalInv,
        8 => BindMw,
        9 => SendWithInv,
        _ => return Err(libc::EINVAL),
    })
}

/// One C send WR as uroce's.
///
/// # Safety
/// `w` is a valid WR whose pointers are valid (the caller's contract).
unsafe fn send_wr_of(w: &ibv_send_wr, ud: bool, q: &QueuePair) -> Result<SendWr, i32> {
    let op = wr_opcode_of(w.opcode)?;
    let mut s = SendWr::new(w.wr_id, op);
    // IBV_SEND_IP_CSUM (16) has no meaning here; ignore it as rxe does.
    s.flags = SendFlags::from_bits_truncate(w.send_flags);
    // SAFETY: the WR's list (caller's contract).
    s.sg_list = unsafe {
        sg_list(w.sg_list, count(w.num_sge)?, |n| {
            q.check_send_sges(n).map_err(|e| errno(&e))
        })?
    };
    if s.flags.contains(SendFlags::INLINE) {
        q.check_inline(inline_len(&s.sg_list))
            .map_err(|e| errno(&e))?;
        // SAFETY: as above.
        s.inline_data = unsafe { gather_inline(&s.sg_list)? };
    }
    match op {
        WrOpcode::SendWithInv | WrOpcode::LocalInv => s.invalidate_rkey = w.imm_data,
        _ => s.imm_data = u32::from_be(w.imm_data),
    }
    if op == WrOpcode::BindMw {
        let b = w.bind_mw;
        // SAFETY: the window and region the WR names (caller's contract).
        s.bind = Some(unsafe { bind_request(b.mw, b.rkey, &b.bind_info)? });
        return Ok(s);
    }
    // SAFETY: reading the union member the opcode and QP type select; all
    // members are plain data, so any bits are valid.
    unsafe {
        if ud {
            let u = w.wr.ud;
            let a = ah(u.ah)?;
            s.ud = Some(a.rust.ud_dest(u.remote_qpn, u.remote_qkey));
        } else if op.is_atomic() {
            let a = w.wr.atomic;
            s.remote_addr = a.remote_addr;
            s.rkey = a.rkey;
            s.compare_add = a.compare_add;
            s.swap = a.swap;
        } else {
            let r = w.wr.rdma;
            s.remote_addr = r.remote_addr;
            s.rkey = r.rkey;
        }
    }
    Ok(s)
}

/// `ops.post_send`: the WRs before `*bad` were posted.
pub(crate) unsafe extern "C" fn post_send(
    p: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let first = wr;
    let set_bad = |w: *mut ibv_send_wr| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = w };
        }
    };
    guard(libc::EIO, || {
        // SAFETY: a QP from this library.
        let q = match unsafe { qp(p) } {
            Ok(q) => q,
            Err(e) => {
                set_bad(first);
                return e;
            }
        };
        if wr.is_null() {
            set_bad(std::ptr::null_mut());
            return libc::EINVAL;
        }
        // SAFETY: the QP's C half.
        let ud = unsafe { (*p).qp_type } == 4;
        let mut ptrs = Vec::new();
        let mut wrs = Vec::new();
        let mut failed = None;
        while !wr.is_null() {
            // SAFETY: the caller's WR list.
            match unsafe { send_wr_of(&*wr, ud, &q.rust) } {
                Ok(s) => {
                    wrs.push(s);
                    ptrs.push(wr);
                }
                Err(e) => {
                    failed = Some((wr, e));
                    break;
                }
            }
            // SAFETY: as above.
            wr = unsafe { (*wr).next };
        }
        if !wrs.is_empty() {
            if let Err((i, e)) = q.rust.post_send(&wrs) {
                set_bad(ptrs.get(i).copied().unwrap_or(first));
                return errno(&e);
            }
        }
        match failed {
            Some((w, e)) => {
                set_bad(w);
                e
            }
            None => 0,
        }
    })
}

/// A C receive WR list as uroce's, with each WR's pointer.
///
/// # Safety
/// The list is valid (the caller's contract).
unsafe fn recv_wrs(
    mut wr: *mut ibv_recv_wr,
    admit: impl Fn(usize) -> Result<(), i32>,
) -> (
    Vec<RecvWr>,
    Vec<*mut ibv_recv_wr>,
    Option<(*mut ibv_recv_wr, i32)>,
) {
    let (mut wrs, mut ptrs) = (Vec::new(), Vec::new());
    while !wr.is_null() {
        // SAFETY: the caller's promise.
        let w = unsafe { &*wr };
        // SAFETY: as above.
        match count(w.num_sge).and_then(|n| unsafe { sg_list(w.sg_list, n, &admit) }) {
            Ok(sg_list) => {
                wrs.push(RecvWr {
                    wr_id: w.wr_id,
                    sg_list,
                });
                ptrs.push(wr);
            }
            Err(e) => return (wrs, ptrs, Some((wr, e))),
        }
        wr = w.next;
    }
    (wrs, ptrs, None)
}

fn finish_recv(
    posted: Result<(), (usize, uroce_verbs::Error)>,
    ptrs: &[*mut ibv_recv_wr],
    failed: Option<(*mut ibv_recv_wr, i32)>,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let (w, e) = match (posted, failed) {
        (Err((i, e)), _) => match ptrs.get(i) {
            Some(&w) => (w, errno(&e)),
            None => return errno(&e),
        },
        (Ok(()), Some(f)) => f,
        (Ok(()), None) => return 0,
    };
    if !bad.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { *bad = w };
    }
    e
}

/// Converts a C receive WR list (each SGE count admitted by `admit`, the
/// queue's rule) and posts what converted with `post`; the first failure
/// goes to `*bad`. A NULL list is EINVAL.
///
/// # Safety
/// The list is valid (the caller's contract).
unsafe fn post_recv_list(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    admit: impl Fn(usize) -> Result<(), i32>,
    post: impl FnOnce(&[RecvWr]) -> Result<(), (usize, uroce_verbs::Error)>,
) -> c_int {
    if wr.is_null() {
        return finish_recv(Ok(()), &[], Some((wr, libc::EINVAL)), bad);
    }
    // SAFETY: the caller's promise.
    let (wrs, ptrs, failed) = unsafe { recv_wrs(wr, admit) };
    let posted = if wrs.is_empty() { Ok(()) } else { post(&wrs) };
    finish_recv(posted, &ptrs, failed, bad)
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    p: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a QP from this library.
        let q = match unsafe { qp(p) } {
            Ok(q) => q,
            Err(e) => return finish_recv(Ok(()), &[], Some((wr, e)), bad),
        };
        // SAFETY: the caller's list.
        unsafe {
            post_recv_list(
                wr,
                bad,
                |n| q.rust.check_recv_sges(n).map_err(|e| errno(&e)),
                |w| q.rust.post_recv(w),
            )
        }
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: an SRQ from this library.
        let q = match unsafe { srq(s) } {
            Ok(q) => q,
            Err(e) => return finish_recv(Ok(()), &[], Some((wr, e)), bad),
        };
        // SAFETY: the caller's list.
        unsafe {
            post_recv_list(
                wr,
                bad,
                |n| q.rust.check_sges(n).map_err(|e| errno(&e)),
                |w| q.rust.post_recv(w),
            )
        }
    })
}

// ---------------------------------------------------------------- memory windows

/// A bind request from the C terms: window, new key, bind info. The
/// window access may name remote read/write/atomic (and local write,
/// meaningless for a window), and zero-based (type 2 only: a type 1 bind
/// with it completes with MW_BIND_ERR); anything else is EINVAL.
///
/// # Safety
/// `mw` is null or a live window of this library; `info.mr` is null or a
/// live region of this library.
pub(crate) unsafe fn bind_request(
    mw: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<uroce_verbs::provider::memory::MwBind, i32> {
    // SAFETY: the caller's promise.
    let m = unsafe { crate::pd_mr::mw(mw)? };
    const ZERO_BASED: u32 = uroce_verbs::Access::ZERO_BASED.bits();
    let acc = uroce_verbs::Access::from_bits(info.mw_access_flags & (0xf | ZERO_BASED))
        .ok_or(libc::EINVAL)?;
    if info.mw_access_flags & !(0xf | ZERO_BASED) != 0 {
        return Err(libc::EINVAL);
    }
    let (lkey, len) = if info.mr.is_null() {
        (0, 0)
    } else {
        // SAFETY: the caller's promise.
        (unsafe { (*info.mr).lkey }, info.length)
    };
    // SAFETY: a live window (checked non-null above).
    let mw_rkey = unsafe { (*mw).rkey };
    Ok(m.rust
        .bind_request(mw_rkey, rkey, lkey, info.addr, len, acc))
}

/// `ops.bind_mw` (behind `ibv_bind_mw`, which has checked the type, the
/// region's PD and a null region's range): posts a BIND_MW work request
/// with the next key and sets `mw->rkey` to it, as rdma-core's providers
/// do; the application undoes that itself if the bind completes in error.
pub(crate) unsafe extern "C" fn bind_mw(
    qp_p: *mut ibv_qp,
    mw: *mut ibv_mw,
    b: *mut ibv_mw_bind,
) -> c_int {
    errno_result(|| {
        if mw.is_null() || b.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a QP made by this library (the caller's contract).
        let q = unsafe { qp(qp_p)? };
        // SAFETY: the caller's bind description and window.
        let (b, old) = unsafe { (&*b, (*mw).rkey) };
        let new_rkey = uroce_verbs::inc_rkey(old);
        let mut wr = SendWr::new(b.wr_id, WrOpcode::BindMw);
        wr.flags = SendFlags::from_bits_truncate(b.send_flags);
        // SAFETY: as above.
        wr.bind = Some(unsafe { bind_request(mw, new_rkey, &b.bind_info)? });
        q.rust
            .post_send(std::slice::from_ref(&wr))
            .map_err(|(_, e)| errno(&e))?;
        // SAFETY: a live window.
        unsafe { (*mw).rkey = new_rkey };
        Ok(())
    })
}
