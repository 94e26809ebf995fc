//! The `ibv_qp_ex` work request builder (`ibv_wr_start`, `ibv_wr_*`,
//! `ibv_wr_complete`/`abort`): function pointers in every uroce QP. A
//! batch is built in the QP and posted by `ibv_wr_complete` as one post;
//! an error met while building fails the batch there.

use crate::ah::ah_of_wr;
use crate::ffi::*;
use crate::guard;
use crate::objects::errno;
use crate::post::{bind_request, gather_inline, sg_list};
use crate::qp::qp;
use libc::{c_int, c_void, size_t};
use uroce_provider::types::SgList;
use uroce_verbs::{QueuePair, SendFlags, SendWr, Sge, WrOpcode};

/// Runs `f` on the QP's batch, with the QP (for its limit rules); errors
/// are kept for `ibv_wr_complete`.
fn with_batch(
    p: *mut ibv_qp_ex,
    f: impl FnOnce(&mut Vec<SendWr>, *mut ibv_qp_ex, &QueuePair) -> Result<(), i32>,
) {
    guard((), || {
        // SAFETY: a QP made by this library.
        let Ok(q) = (unsafe { qp(p.cast()) }) else {
            return;
        };
        let mut b = q.batch.lock();
        let (wrs, err) = &mut *b;
        if let Err(e) = f(wrs, p, &q.rust) {
            if *err == 0 {
                *err = e;
            }
        }
    })
}

/// Room for one more WR in a batch: a batch holds at most the send
/// queue's depth (ENOMEM beyond, reported by `ibv_wr_complete`, which
/// then posts nothing), so a program that never completes its batch
/// cannot grow it without bound.
fn room(wrs: &[SendWr], q: &QueuePair) -> Result<(), i32> {
    if wrs.len() >= q.send_depth() as usize {
        return Err(libc::ENOMEM);
    }
    Ok(())
}

/// Starts a WR with the `wr_id` and `wr_flags` the program set on the
/// `ibv_qp_ex`.
fn new_wr(p: *mut ibv_qp_ex, op: WrOpcode, set: impl FnOnce(&mut SendWr)) {
    with_batch(p, |wrs, p, q| {
        room(wrs, q)?;
        // SAFETY: the C half of a live QP, owned by the posting thread.
        let (id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
        let mut w = SendWr::new(id, op);
        w.flags = SendFlags::from_bits_truncate(flags);
        set(&mut w);
        wrs.push(w);
        Ok(())
    })
}

/// [`new_wr`] of an operation on the peer's memory at `addr` (`rkey`).
fn remote_wr(p: *mut ibv_qp_ex, op: WrOpcode, rkey: u32, addr: u64, set: impl FnOnce(&mut SendWr)) {
    new_wr(p, op, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        set(w);
    })
}

/// Edits the WR started last (given the QP).
fn last_wr(p: *mut ibv_qp_ex, f: impl FnOnce(&mut SendWr, &QueuePair) -> Result<(), i32>) {
    with_batch(p, |wrs, _, q| f(wrs.last_mut().ok_or(libc::EINVAL)?, q))
}

pub(crate) unsafe extern "C" fn wr_start(p: *mut ibv_qp_ex) {
    with_batch(p, |wrs, _, _| {
        wrs.clear();
        Ok(())
    });
    guard((), || {
        // SAFETY: a QP made by this library.
        if let Ok(q) = unsafe { qp(p.cast()) } {
            q.batch.lock().1 = 0;
        }
    })
}

pub(crate) unsafe extern "C" fn wr_complete(p: *mut ibv_qp_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: a QP made by this library.
        let q = match unsafe { qp(p.cast()) } {
            Ok(q) => q,
            Err(e) => return e,
        };
        let (wrs, err) = std::mem::take(&mut *q.batch.lock());
        if err != 0 {
            return err;
        }
        match q.rust.post_send(&wrs) {
            Ok(()) => 0,
            Err((_, e)) => errno(&e),
        }
    })
}

pub(crate) unsafe extern "C" fn wr_abort(p: *mut ibv_qp_ex) {
    guard((), || {
        // SAFETY: a QP made by this library.
        if let Ok(q) = unsafe { qp(p.cast()) } {
            *q.batch.lock() = (Vec::new(), 0);
        }
    })
}

/// `ibv_wr_bind_mw`: a BIND_MW work request in the batch.
pub(crate) unsafe extern "C" fn wr_bind_mw(
    p: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    with_batch(p, |wrs, p, q| {
        room(wrs, q)?;
        if info.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's window and bind info.
        let b = unsafe { bind_request(mw, rkey, &*info)? };
        // SAFETY: the C half of a live QP, owned by the posting thread.
        let (id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
        let mut w = SendWr::new(id, WrOpcode::BindMw);
        w.flags = SendFlags::from_bits_truncate(flags);
        w.bind = Some(b);
        wrs.push(w);
        Ok(())
    })
}

/// `ibv_wr_send_tso`: an operation uroce does not have (a QP asking for
/// it at creation is refused).
/// Called anyway, they fail the batch: `ibv_wr_complete` returns
/// EOPNOTSUPP and posts nothing, the way providers report errors of the
/// `ibv_wr_*` API.
fn unsupported(p: *mut ibv_qp_ex) {
    with_batch(p, |_, _, _| Err(libc::EOPNOTSUPP))
}
pub(crate) unsafe extern "C" fn wr_send_tso(
    p: *mut ibv_qp_ex,
    _hdr: *mut c_void,
    _sz: u16,
    _mss: u16,
) {
    unsupported(p)
}
/// `ibv_wr_atomic_write`: the 8 bytes at `wr` are copied now and land at
/// the remote address as one aligned store.
pub(crate) unsafe extern "C" fn wr_atomic_write(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    wr: *const c_void,
) {
    with_batch(p, |wrs, p, _| {
        if wr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's 8 bytes (ibv_wr_atomic_write's contract).
        let bytes = unsafe { wr.cast::<[u8; 8]>().read_unaligned() };
        // SAFETY: the C half of a live QP, owned by the posting thread.
        let (id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
        let mut w = SendWr::atomic_write(id, addr, rkey, bytes);
        w.flags = SendFlags::from_bits_truncate(flags);
        wrs.push(w);
        Ok(())
    })
}

/// `ibv_wr_flush` (rdma-core 45; the slot after `wr_atomic_write`):
/// `len` bytes at `addr` (or the whole region, level
/// `IBV_FLUSH_MR`) made visible (type `IBV_FLUSH_GLOBAL`) before the
/// completion. RETH lengths are 32 bits: a longer range is EINVAL.
pub(crate) unsafe extern "C" fn wr_flush(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    len: usize,
    kind: u8,
    level: u8,
) {
    with_batch(p, |wrs, p, _| {
        let len = u32::try_from(len).map_err(|_| libc::EINVAL)?;
        // SAFETY: the C half of a live QP, owned by the posting thread.
        let (id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
        let mut w = SendWr::flush(id, addr, rkey, len, kind, level);
        w.flags = SendFlags::from_bits_truncate(flags);
        wrs.push(w);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn wr_send(p: *mut ibv_qp_ex) {
    new_wr(p, WrOpcode::Send, |_| {})
}
pub(crate) unsafe extern "C" fn wr_send_imm(p: *mut ibv_qp_ex, imm: u32) {
    new_wr(p, WrOpcode::SendWithImm, |w| w.imm_data = u32::from_be(imm))
}
pub(crate) unsafe extern "C" fn wr_send_inv(p: *mut ibv_qp_ex, rkey: u32) {
    new_wr(p, WrOpcode::SendWithInv, |w| w.invalidate_rkey = rkey)
}
pub(crate) unsafe extern "C" fn wr_local_inv(p: *mut ibv_qp_ex, rkey: u32) {
    new_wr(p, WrOpcode::LocalInv, |w| w.invalidate_rkey = rkey)
}
pub(crate) unsafe extern "C" fn wr_rdma_write(p: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    remote_wr(p, WrOpcode::RdmaWrite, rkey, addr, |_| {})
}
pub(crate) unsafe extern "C" fn wr_rdma_write_imm(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    imm: u32,
) {
    remote_wr(p, WrOpcode::RdmaWriteWithImm, rkey, addr, |w| {
        w.imm_data = u32::from_be(imm)
    })
}
pub(crate) unsafe extern "C" fn wr_rdma_read(p: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    remote_wr(p, WrOpcode::RdmaRead, rkey, addr, |_| {})
}
pub(crate) unsafe extern "C" fn wr_atomic_cmp_swp(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    cmp: u64,
    swap: u64,
) {
    remote_wr(p, WrOpcode::AtomicCmpAndSwp, rkey, addr, |w| {
        w.compare_add = cmp;
        w.swap = swap;
    })
}
pub(crate) unsafe extern "C" fn wr_atomic_fetch_add(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    add: u64,
) {
    remote_wr(p, WrOpcode::AtomicFetchAndAdd, rkey, addr, |w| {
        w.compare_add = add
    })
}
pub(crate) unsafe extern "C" fn wr_set_ud_addr(
    p: *mut ibv_qp_ex,
    a: *mut ibv_ah,
    qpn: u32,
    qkey: u32,
) {
    last_wr(p, |w, _| {
        // SAFETY: an AH made by this library.
        let a = unsafe { ah_of_wr(a)? };
        w.ud = Some(a.rust.ud_dest(qpn, qkey));
        Ok(())
    })
}
/// XRC is not supported.
pub(crate) unsafe extern "C" fn wr_set_xrc_srqn(p: *mut ibv_qp_ex, _srqn: u32) {
    last_wr(p, |_, _| Err(libc::EOPNOTSUPP))
}
pub(crate) unsafe extern "C" fn wr_set_sge(p: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    last_wr(p, |w, _| {
        w.sg_list = SgList::from_slice(&[Sge { addr, length, lkey }]);
        Ok(())
    })
}
/// rxe's provider refuses a list longer than the QP's max_send_sge with
/// ENOSPC (reported by `ibv_wr_complete`); the count is checked (by the
/// QP's rule) before the list is read.
pub(crate) unsafe extern "C" fn wr_set_sge_list(p: *mut ibv_qp_ex, n: size_t, sg: *const ibv_sge) {
    last_wr(p, |w, q| {
        // SAFETY: the caller's array of n elements, read once the QP
        // admits the count (sg_list refuses NULL with a count).
        w.sg_list = unsafe { sg_list(sg, n, |n| q.check_send_sges(n).map_err(|_| libc::ENOSPC))? };
        Ok(())
    })
}

/// Inline data longer than the QP's max_inline_data is ENOSPC, as rxe's
/// provider answers, found (by the QP's rule) before anything is copied.
pub(crate) unsafe extern "C" fn wr_set_inline_data(
    p: *mut ibv_qp_ex,
    addr: *mut c_void,
    len: size_t,
) {
    last_wr(p, |w, q| {
        q.check_inline(len).map_err(|_| libc::ENOSPC)?;
        let len = u32::try_from(len).map_err(|_| libc::EINVAL)?;
        w.flags |= SendFlags::INLINE;
        // SAFETY: the caller's buffer of len bytes (gather_inline refuses
        // NULL with a length).
        w.inline_data = unsafe {
            gather_inline(&[Sge {
                addr: addr as u64,
                length: len,
                lkey: 0,
            }])?
        };
        Ok(())
    })
}

/// As rxe's provider: the buffers are read one by one, and the list is
/// ENOSPC as soon as their total passes the QP's max_inline_data (so
/// nothing past that buffer is read, and no slice of `n` elements is
/// formed from a count that may be careless). Zero-length buffers count
/// for nothing, as there.
pub(crate) unsafe extern "C" fn wr_set_inline_data_list(
    p: *mut ibv_qp_ex,
    n: size_t,
    bufs: *const ibv_data_buf,
) {
    last_wr(p, |w, q| {
        if n > 0 && bufs.is_null() {
            return Err(libc::EINVAL);
        }
        let mut sges = Vec::new();
        let mut total: usize = 0;
        for i in 0..n {
            // SAFETY: the caller's array of n buffers (non-null when n > 0),
            // i < n; read_unaligned, so a misaligned pointer is no UB here.
            let b = unsafe { bufs.add(i).read_unaligned() };
            total = total.checked_add(b.length).ok_or(libc::ENOSPC)?;
            q.check_inline(total).map_err(|_| libc::ENOSPC)?;
            if b.length > 0 {
                sges.push(Sge {
                    addr: b.addr as u64,
                    // Within max_inline_data, so within u32.
                    length: b.length as u32,
                    lkey: 0,
                });
            }
        }
        w.flags |= SendFlags::INLINE;
        // SAFETY: each buffer is readable for its length (the caller's
        // contract); the total is within the QP's max_inline_data.
        w.inline_data = unsafe { gather_inline(&sges)? };
        Ok(())
    })
}
