//! Posting: the `ibv_context::ops` entries verbs.h's inline functions
//! call to post work (`post_send`, `post_recv`, `post_srq_recv`,
//! `bind_mw`), and the conversion of C work requests to uroce's. Each WR
//! list is one post into the provider, whose rules (opcode per QP type,
//! SGE and inline limits, UD destination and MTU) apply once; the C side
//! only applies the SGE and inline rules early, before it reads a
//! program's arrays.

use crate::ah::ah_of_wr;
use crate::ffi::*;
use crate::objects::errno;
use crate::qp::qp;
use crate::srq::srq;
use crate::{errno_result, guard};
use libc::c_int;
use uroce_provider::types::{InlineData, SgList};
use uroce_verbs::{QueuePair, RecvWr, SendFlags, SendWr, Sge, SharedReceiveQueue, WrOpcode};

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
        if ud && !matches!(op, WrOpcode::Send | WrOpcode::SendWithImm) {
            // No other opcode has a UD form: its union holds no address
            // handle (an RDMA WR's holds a remote address), and the WR
            // completes with LOC_QP_OP_ERR, as on rxe.
        } else if ud {
            let u = w.wr.ud;
            let a = ah_of_wr(u.ah)?;
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

/// An errno, as the C WR conversions report it, passed through uroce's
/// post loop (which reports its own errors as `uroce_verbs::Error`s).
struct Errno(i32);

impl From<uroce_verbs::Error> for Errno {
    fn from(e: uroce_verbs::Error) -> Errno {
        Errno(errno(&e))
    }
}

/// The WRs of a C list, first to last, each `next` read only when the
/// WR after it is wanted (so a list longer than a post takes, or one
/// that loops back on itself, is not walked past the WR that stopped the
/// post). Records the WR it handed out last: where a post stopped.
fn walk<W>(
    first: *mut W,
    next: fn(*mut W) -> *mut W,
    last: &std::cell::Cell<*mut W>,
) -> impl Iterator<Item = *mut W> + '_ {
    std::iter::successors((!first.is_null()).then_some(first), move |&w| {
        Some(next(w)).filter(|n| !n.is_null())
    })
    .inspect(move |&w| last.set(w))
}

/// `ops.post_send`: the WRs before `*bad` were posted. The list is read
/// as it is posted, and at most the send queue's depth in one call (the
/// WR after those: ENOMEM).
pub(crate) unsafe extern "C" fn post_send(
    p: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
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
                set_bad(wr);
                return e;
            }
        };
        if wr.is_null() {
            set_bad(std::ptr::null_mut());
            return libc::EINVAL;
        }
        // SAFETY: the QP's C half.
        let ud = unsafe { (*p).qp_type } == 4;
        let last = std::cell::Cell::new(wr);
        // SAFETY: the caller's WR list: each WR handed out is valid.
        let next = |w: *mut ibv_send_wr| unsafe { (*w).next };
        let r = q.rust.post_send_with(walk(wr, next, &last), |w| {
            // SAFETY: as above.
            unsafe { send_wr_of(&*w, ud, &q.rust) }.map_err(Errno)
        });
        match r {
            Ok(()) => 0,
            Err((_, Errno(e))) => {
                set_bad(last.get());
                e
            }
        }
    })
}

/// One C receive WR as uroce's, its SGE count admitted by `admit` (the
/// queue's rule) before its list is read.
///
/// # Safety
/// `w` is a valid WR (the caller's contract).
unsafe fn recv_wr_of(
    w: &ibv_recv_wr,
    admit: impl Fn(usize) -> Result<(), i32>,
) -> Result<RecvWr, Errno> {
    let n = count(w.num_sge).map_err(Errno)?;
    // SAFETY: the WR's list (the caller's contract).
    let sg_list = unsafe { sg_list(w.sg_list, n, admit) }.map_err(Errno)?;
    Ok(RecvWr {
        wr_id: w.wr_id,
        sg_list,
    })
}

/// A queue C receive WRs are posted to: a QP's receive queue or an SRQ.
trait RecvQueue {
    /// The queue's SGE count rule (the provider's, the one posting
    /// applies too).
    fn admit(&self, n: usize) -> Result<(), i32>;
    /// The queue's `post_recv_with`.
    fn post(
        &self,
        items: &mut dyn Iterator<Item = *mut ibv_recv_wr>,
        read: &mut dyn FnMut(*mut ibv_recv_wr) -> Result<RecvWr, Errno>,
    ) -> Result<(), (usize, Errno)>;
}

/// [`RecvQueue`] for a uroce queue type, given the name of its SGE rule.
macro_rules! recv_queue {
    ($ty:ty, $admit:ident) => {
        impl RecvQueue for $ty {
            fn admit(&self, n: usize) -> Result<(), i32> {
                self.$admit(n).map_err(|e| errno(&e))
            }
            fn post(
                &self,
                items: &mut dyn Iterator<Item = *mut ibv_recv_wr>,
                read: &mut dyn FnMut(*mut ibv_recv_wr) -> Result<RecvWr, Errno>,
            ) -> Result<(), (usize, Errno)> {
                self.post_recv_with(items, read)
            }
        }
    };
}
recv_queue!(QueuePair, check_recv_sges);
recv_queue!(SharedReceiveQueue, check_sges);

/// Posts a C receive WR list to `queue` (the looked-up QP or SRQ, or the
/// errno its lookup failed with), each WR's SGE count admitted by the
/// queue's rule before its list is read: the first refused WR goes to
/// `*bad` (the whole list when the lookup failed). A NULL list is EINVAL.
///
/// # Safety
/// The list is valid (the caller's contract).
unsafe fn post_recv_list<Q: RecvQueue + ?Sized>(
    queue: Result<&Q, i32>,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let (w, e) = match queue {
        Err(e) => (wr, e),
        Ok(_) if wr.is_null() => (wr, libc::EINVAL),
        Ok(q) => {
            let last = std::cell::Cell::new(wr);
            // SAFETY: the caller's list: each WR handed out is valid.
            let next = |w: *mut ibv_recv_wr| unsafe { (*w).next };
            // SAFETY: as above.
            let mut read = |w: *mut ibv_recv_wr| unsafe { recv_wr_of(&*w, |n| q.admit(n)) };
            let mut items = walk(wr, next, &last);
            let r = q.post(&mut items, &mut read);
            drop(items);
            match r {
                Ok(()) => return 0,
                Err((_, Errno(e))) => (last.get(), e),
            }
        }
    };
    if !bad.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { *bad = w };
    }
    e
}

/// `ops.post_recv`: as `post_send`, at most the receive queue's depth.
pub(crate) unsafe extern "C" fn post_recv(
    p: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a QP from this library; the caller's list.
    guard(libc::EIO, || unsafe {
        post_recv_list(qp(p).map(|q| &*q.rust), wr, bad)
    })
}

/// `ops.post_srq_recv`: as `post_send`, at most the SRQ's `max_wr`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: an SRQ from this library; the caller's list.
    guard(libc::EIO, || unsafe {
        post_recv_list(srq(s).map(|q| &*q.rust), wr, bad)
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
) -> Result<uroce_provider::device::MwBind, i32> {
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
