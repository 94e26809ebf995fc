//! The data path: the `ibv_context::ops` entries verbs.h's inline
//! functions call (post send/recv, poll, arm), completion events, and the
//! `ibv_cq_ex` / `ibv_qp_ex` function tables.

use crate::ffi::*;
use crate::objects::{ah, cq, errno, qp, srq, Cq};
use crate::{errno_result, guard, minus_one_result};
use libc::{c_int, c_uint, c_void, size_t};
use uroce_verbs::provider::types::{InlineData, SgList};
use uroce_verbs::{
    QueuePair, RecvWr, SendFlags, SendWr, Sge, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode,
};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_get_cq_event, ibv_ack_cq_events]
}

/// Clears `O_NONBLOCK` on an event descriptor uroce made (its eventfds
/// start non-blocking). libibverbs hands programs blocking descriptors,
/// and a program that wants `ibv_get_cq_event`/`ibv_get_async_event` not
/// to block sets `O_NONBLOCK` itself, which [`is_nonblocking`] then sees.
/// uroce's own waits poll before reading, and a blocking read with no
/// event simply waits for the next one, which is what a blocking get
/// wants.
pub(crate) fn make_blocking(fd: c_int) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor this library owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl != -1 {
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
}

/// True if the program made the descriptor non-blocking.
pub(crate) fn is_nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor reads its flags; a bad descriptor
    // gives -1.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl != -1 && fl & libc::O_NONBLOCK != 0
}

// ---------------------------------------------------------------- WCs

fn wc_to_c(w: &Wc) -> ibv_wc {
    let imm = if w.wc_flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey
    } else {
        // ibv_wc::imm_data is in network byte order.
        w.imm_data.to_be()
    };
    ibv_wc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: w.opcode as c_int,
        vendor_err: w.vendor_err,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num,
        src_qp: w.src_qp,
        wc_flags: w.wc_flags.bits(),
        pkey_index: w.pkey_index,
        slid: w.slid,
        sl: w.sl,
        dlid_path_bits: w.dlid_path_bits,
    }
}

fn status_of(v: c_int) -> WcStatus {
    use WcStatus::*;
    const ALL: [WcStatus; 22] = [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocEecOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        LocRddViolErr,
        RemInvRdReqErr,
        RemAbortErr,
        InvEecnErr,
        InvEecStateErr,
        FatalErr,
        RespTimeoutErr,
        GeneralErr,
    ];
    usize::try_from(v)
        .ok()
        .and_then(|i| ALL.get(i))
        .copied()
        .unwrap_or(GeneralErr)
}

fn wc_opcode_of(v: c_int) -> WcOpcode {
    use WcOpcode::*;
    match v {
        0 => Send,
        1 => RdmaWrite,
        2 => RdmaRead,
        3 => CompSwap,
        4 => FetchAdd,
        5 => BindMw,
        6 => LocalInv,
        8 => Flush,
        9 => AtomicWrite,
        129 => RecvRdmaWithImm,
        _ => Recv,
    }
}

/// A C completion as uroce's (for `ibv_create_ah_from_wc`).
pub(crate) fn wc_from_c(c: &ibv_wc) -> Wc {
    let mut w = Wc::new(
        c.wr_id,
        status_of(c.status),
        wc_opcode_of(c.opcode),
        c.qp_num,
    );
    w.vendor_err = c.vendor_err;
    w.byte_len = c.byte_len;
    w.wc_flags = WcFlags::from_bits_truncate(c.wc_flags);
    if w.wc_flags.contains(WcFlags::WITH_INV) {
        w.invalidated_rkey = c.imm_data;
    } else {
        w.imm_data = u32::from_be(c.imm_data);
    }
    w.src_qp = c.src_qp;
    w.pkey_index = c.pkey_index;
    w.slid = c.slid;
    w.sl = c.sl;
    w.dlid_path_bits = c.dlid_path_bits;
    w
}

/// `ops.poll_cq`: up to `n` completions into `wc`; negative on error (a
/// CQ that overflowed).
pub(crate) unsafe extern "C" fn poll_cq(c: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: a CQ from this library (the caller's contract).
        let Ok(q) = (unsafe { cq(c) }) else { return -1 };
        let Ok(n) = usize::try_from(n) else { return -1 };
        if n == 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let mut buf = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
        let mut done = 0;
        while done < n {
            let want = (n - done).min(buf.len());
            let got = match q.rust.poll(&mut buf[..want]) {
                Ok(g) => g,
                Err(_) if done == 0 => return -1,
                Err(_) => break,
            };
            for w in &buf[..got] {
                // SAFETY: the caller's array holds n entries; done < n.
                unsafe { wc.add(done).write(wc_to_c(w)) };
                done += 1;
            }
            if got < want {
                break;
            }
        }
        done as c_int
    })
}

/// `ops.req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, solicited_only: c_int) -> c_int {
    errno_result(|| {
        // SAFETY: a CQ from this library.
        let q = unsafe { cq(c)? };
        q.rust
            .req_notify(solicited_only != 0)
            .map_err(|e| errno(&e))
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    out_cq: *mut *mut ibv_cq,
    out_ctx: *mut *mut c_void,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: a channel from ibv_create_comp_channel.
        let chan = unsafe { crate::objects::chan(ch)? };
        if out_cq.is_null() || out_ctx.is_null() {
            return Err(libc::EINVAL);
        }
        let ev = if is_nonblocking(chan.rust.fd()) {
            chan.rust.try_get_cq_event().map_err(|e| errno(&e))?
        } else {
            chan.rust.get_cq_event().map_err(|e| errno(&e))?
        };
        // The uroce CQ's cq_context is the C object's address.
        let p = ev.cq_context() as usize as *mut Cq;
        // SAFETY: the CQ is live (uroce skips events of dropped CQs, and
        // ibv_destroy_cq refuses while events are unacknowledged); the
        // caller's out-parameters.
        unsafe {
            *out_cq = p.cast();
            *out_ctx = (*p).c.cq_context;
        }
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, n: c_uint) {
    guard((), || {
        // SAFETY: a CQ from this library.
        if let Ok(q) = unsafe { cq(c) } {
            q.rust.ack_events(n);
        }
    })
}

// ---------------------------------------------------------------- posting

/// A C scatter/gather list of `n` elements as uroce's. `admit` is the
/// queue's SGE count rule (the provider's, the one posting applies too):
/// it runs before the list is touched, as rxe's provider checks the count,
/// so a careless count is refused, not a read past the caller's array. A
/// NULL list with a count is EINVAL.
///
/// # Safety
/// `sg` points to `n` elements when `n > 0` and `admit(n)` accepts.
unsafe fn sg_list(
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
unsafe fn gather_inline(list: &[Sge]) -> Result<InlineData, i32> {
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

// ---------------------------------------------------------------- ibv_cq_ex

/// Takes the next completion into the CQ's current slot and the
/// `status`/`wr_id` fields the program reads directly.
fn advance(c: *mut ibv_cq_ex) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: every uroce CQ is an ibv_cq_ex made by this library.
        let Ok(q) = (unsafe { cq(c.cast()) }) else {
            return libc::EINVAL;
        };
        match q.rust.poll_one() {
            Some(w) => {
                // SAFETY: the C half of a live CQ, which the polling thread
                // owns between start_poll and end_poll.
                unsafe {
                    (*c).status = w.status as c_int;
                    (*c).wr_id = w.wr_id;
                }
                *q.cur.lock() = w;
                0
            }
            None => {
                if q.rust.overflowed() {
                    return libc::EIO;
                }
                q.rust.progress();
                libc::ENOENT
            }
        }
    })
}

pub(crate) unsafe extern "C" fn start_poll(
    c: *mut ibv_cq_ex,
    _attr: *mut ibv_poll_cq_attr,
) -> c_int {
    advance(c)
}
pub(crate) unsafe extern "C" fn next_poll(c: *mut ibv_cq_ex) -> c_int {
    advance(c)
}
pub(crate) unsafe extern "C" fn end_poll(_c: *mut ibv_cq_ex) {}

fn cur<T: Default>(c: *mut ibv_cq_ex, f: impl FnOnce(&Wc) -> T) -> T {
    guard(T::default(), || {
        // SAFETY: a CQ made by this library.
        match unsafe { cq(c.cast()) } {
            Ok(q) => f(&q.cur.lock()),
            Err(_) => T::default(),
        }
    })
}

pub(crate) unsafe extern "C" fn read_opcode(c: *mut ibv_cq_ex) -> c_int {
    cur(c, |w| w.opcode as c_int)
}
pub(crate) unsafe extern "C" fn read_vendor_err(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| w.vendor_err)
}
pub(crate) unsafe extern "C" fn read_byte_len(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| w.byte_len)
}
pub(crate) unsafe extern "C" fn read_imm_data(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| wc_to_c(w).imm_data)
}
pub(crate) unsafe extern "C" fn read_qp_num(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| w.qp_num)
}
pub(crate) unsafe extern "C" fn read_src_qp(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| w.src_qp)
}
pub(crate) unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq_ex) -> c_uint {
    cur(c, |w| w.wc_flags.bits())
}
pub(crate) unsafe extern "C" fn read_slid(c: *mut ibv_cq_ex) -> u32 {
    cur(c, |w| w.slid as u32)
}
pub(crate) unsafe extern "C" fn read_sl(c: *mut ibv_cq_ex) -> u8 {
    cur(c, |w| w.sl)
}
pub(crate) unsafe extern "C" fn read_dlid_path_bits(c: *mut ibv_cq_ex) -> u8 {
    cur(c, |w| w.dlid_path_bits)
}
/// No completion timestamps: 0.
pub(crate) unsafe extern "C" fn read_completion_ts(_c: *mut ibv_cq_ex) -> u64 {
    0
}
pub(crate) unsafe extern "C" fn read_cvlan(_c: *mut ibv_cq_ex) -> u16 {
    0
}
pub(crate) unsafe extern "C" fn read_flow_tag(_c: *mut ibv_cq_ex) -> u32 {
    0
}
/// `ibv_wc_read_tm_info`: uroce has no tag matching; a zeroed
/// `ibv_wc_tm_info` (tag, priv), as for a completion without it.
pub(crate) unsafe extern "C" fn read_tm_info(_c: *mut ibv_cq_ex, info: *mut c_void) {
    if !info.is_null() {
        // SAFETY: the caller's `struct ibv_wc_tm_info` (16 bytes: u64, u32
        // and padding).
        unsafe { std::ptr::write_bytes(info.cast::<u8>(), 0, 16) };
    }
}

// ---------------------------------------------------------------- ibv_qp_ex

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

/// Starts a WR with the `wr_id` and `wr_flags` the program set on the
/// `ibv_qp_ex`.
fn new_wr(p: *mut ibv_qp_ex, op: WrOpcode, set: impl FnOnce(&mut SendWr)) {
    with_batch(p, |wrs, p, _| {
        // SAFETY: the C half of a live QP, owned by the posting thread.
        let (id, flags) = unsafe { ((*p).wr_id, (*p).wr_flags) };
        let mut w = SendWr::new(id, op);
        w.flags = SendFlags::from_bits_truncate(flags);
        set(&mut w);
        wrs.push(w);
        Ok(())
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

/// A bind request from the C terms: window, new key, bind info. The
/// window access may name remote read/write/atomic (and local write,
/// meaningless for a window); zero-based windows are not supported
/// (EINVAL), as rxe refuses them for type 1.
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
    let m = unsafe { crate::objects::mw(mw)? };
    let acc = uroce_verbs::Access::from_bits(info.mw_access_flags & 0xf).ok_or(libc::EINVAL)?;
    if info.mw_access_flags & !0xf != 0 {
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
            .map_err(|(_, e)| crate::objects::errno(&e))?;
        // SAFETY: a live window.
        unsafe { (*mw).rkey = new_rkey };
        Ok(())
    })
}

/// `ibv_wr_bind_mw`: a BIND_MW work request in the batch.
pub(crate) unsafe extern "C" fn wr_bind_mw(
    p: *mut ibv_qp_ex,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    with_batch(p, |wrs, p, _| {
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
    new_wr(p, WrOpcode::RdmaWrite, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}
pub(crate) unsafe extern "C" fn wr_rdma_write_imm(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    imm: u32,
) {
    new_wr(p, WrOpcode::RdmaWriteWithImm, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.imm_data = u32::from_be(imm);
    })
}
pub(crate) unsafe extern "C" fn wr_rdma_read(p: *mut ibv_qp_ex, rkey: u32, addr: u64) {
    new_wr(p, WrOpcode::RdmaRead, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
    })
}
pub(crate) unsafe extern "C" fn wr_atomic_cmp_swp(
    p: *mut ibv_qp_ex,
    rkey: u32,
    addr: u64,
    cmp: u64,
    swap: u64,
) {
    new_wr(p, WrOpcode::AtomicCmpAndSwp, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
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
    new_wr(p, WrOpcode::AtomicFetchAndAdd, |w| {
        w.rkey = rkey;
        w.remote_addr = addr;
        w.compare_add = add;
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
        let a = unsafe { ah(a)? };
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
