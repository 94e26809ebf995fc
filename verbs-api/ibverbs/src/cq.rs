//! Completion channels and completion queues: creation, resizing and
//! destruction, and the completion side of the data path verbs.h's
//! inline functions call through `ibv_context::ops` (`poll_cq`,
//! `req_notify_cq`) with completion events. Every CQ is an `ibv_cq_ex`;
//! its extended polling is [`crate::cq_ex`].

use crate::ffi::*;
use crate::objects::{accessor, destroy_boxed, errno, register, Handles};
use crate::{errno_result, guard, is_nonblocking, minus_one_result, ptr_result};
use libc::{c_int, c_uint, c_void};
use parking_lot::Mutex;
use std::mem::ManuallyDrop;
use std::ptr::{addr_of, addr_of_mut};
use std::sync::Arc;
use uroce_verbs::{CompChannel, CompletionQueue, Wc, WcFlags, WcOpcode, WcStatus};

crate::symbol_versions! {
    "IBVERBS_1.0": [ibv_create_comp_channel, ibv_destroy_comp_channel]
    "IBVERBS_1.1": [ibv_create_cq, ibv_resize_cq, ibv_destroy_cq,
                    ibv_get_cq_event, ibv_ack_cq_events]
}

// ---------------------------------------------------------------- channel

#[repr(C)]
pub(crate) struct Chan {
    pub c: ibv_comp_channel,
    pub inner: ChanInner,
}
pub(crate) struct ChanInner {
    pub rust: ManuallyDrop<CompChannel>,
}
accessor!(chan, ibv_comp_channel, Chan, ChanInner);

crate::exported! {
    fn ibv_create_comp_channel / ibv_create_comp_channel_impl(
        context: *mut ibv_context,
    ) -> *mut ibv_comp_channel {
        ptr_result(|| {
            // SAFETY: a context from ibv_open_device.
            let ctx = unsafe { crate::objects::ctx(context)? };
            let rust = ctx.rust.create_comp_channel().map_err(|e| errno(&e))?;
            crate::make_blocking(rust.fd());
            let obj = Box::new(Chan {
                c: ibv_comp_channel {
                    context,
                    fd: rust.fd(),
                    refcnt: 0,
                },
                inner: ChanInner {
                    rust: ManuallyDrop::new(rust),
                },
            });
            Ok(Box::into_raw(obj).cast())
        })
    }
}

crate::exported! {
    fn ibv_destroy_comp_channel / ibv_destroy_comp_channel_impl(
        p: *mut ibv_comp_channel,
    ) -> c_int {
        errno_result(|| {
            if p.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: as in ibv_dealloc_pd, for a channel.
            unsafe {
                destroy_boxed(
                    p.cast::<Chan>(),
                    |o| addr_of_mut!((*o).inner.rust),
                    CompChannel::destroy,
                    || {},
                )
            }
        })
    }
}

// ---------------------------------------------------------------- CQ

/// Every CQ is an `ibv_cq_ex` (which begins with `ibv_cq`), so
/// `ibv_poll_cq` and `ibv_start_poll` both work on it.
#[repr(C)]
pub(crate) struct Cq {
    pub c: ibv_cq_ex,
    pub inner: CqInner,
}
pub(crate) struct CqInner {
    pub rust: ManuallyDrop<CompletionQueue>,
    pub handles: Arc<Handles>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current.
    pub cur: Mutex<Wc>,
}
accessor!(cq, ibv_cq, Cq, CqInner);

fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: i64,
) -> Result<*mut Cq, i32> {
    // SAFETY: a context from ibv_open_device.
    let ctx = unsafe { crate::objects::ctx(context)? };
    let cqe = u32::try_from(cqe).map_err(|_| libc::EINVAL)?;
    // The kernel refuses a completion vector the device does not have.
    // SAFETY: a live context (checked just above).
    let vectors = i64::from(unsafe { (*context).num_comp_vectors });
    if !(0..vectors).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: a channel from ibv_create_comp_channel.
        Some(unsafe { chan(channel)? })
    };
    let mut b = Box::<Cq>::new_uninit();
    // The CQ's cq_context in uroce is this object's address: completion
    // events name it (ibv_get_cq_event returns it).
    let me = b.as_mut_ptr();
    let rust = ctx
        .rust
        .create_cq_with(cqe, me as u64, ch.map(|c| &*c.rust))
        .map_err(|e| errno(&e))?;
    let handle = rust.handle();
    let depth = rust.cqe();
    b.write(Cq {
        c: ibv_cq_ex {
            context,
            channel,
            cq_context,
            handle,
            cqe: c_int::try_from(depth).unwrap_or(c_int::MAX),
            // SAFETY: all-zero is PTHREAD_MUTEX_INITIALIZER /
            // PTHREAD_COND_INITIALIZER on glibc.
            mutex: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cond: unsafe { std::mem::zeroed() },
            comp_events_completed: 0,
            async_events_completed: 0,
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: Some(crate::cq_ex::start_poll),
            next_poll: Some(crate::cq_ex::next_poll),
            end_poll: Some(crate::cq_ex::end_poll),
            read_opcode: Some(crate::cq_ex::read_opcode),
            read_vendor_err: Some(crate::cq_ex::read_vendor_err),
            read_byte_len: Some(crate::cq_ex::read_byte_len),
            read_imm_data: Some(crate::cq_ex::read_imm_data),
            read_qp_num: Some(crate::cq_ex::read_qp_num),
            read_src_qp: Some(crate::cq_ex::read_src_qp),
            read_wc_flags: Some(crate::cq_ex::read_wc_flags),
            read_slid: Some(crate::cq_ex::read_slid),
            read_sl: Some(crate::cq_ex::read_sl),
            read_dlid_path_bits: Some(crate::cq_ex::read_dlid_path_bits),
            read_completion_ts: Some(crate::cq_ex::read_completion_ts),
            read_cvlan: Some(crate::cq_ex::read_cvlan),
            read_flow_tag: Some(crate::cq_ex::read_flow_tag),
            read_tm_info: Some(crate::cq_ex::read_tm_info),
            read_completion_wallclock_ns: Some(crate::cq_ex::read_completion_wallclock_ns),
        },
        inner: CqInner {
            rust: ManuallyDrop::new(rust),
            handles: ctx.handles.clone(),
            cur: Mutex::new(Wc::new(0, WcStatus::Success, WcOpcode::Send, 0)),
        },
    });
    // SAFETY: fully initialised by the write above.
    let p = Box::into_raw(unsafe { b.assume_init() });
    ctx.handles.cqs.lock().insert(handle, p as usize);
    register(p.cast::<ibv_cq>(), context, handle);
    Ok(p)
}

crate::exported! {
    fn ibv_create_cq / ibv_create_cq_impl(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int,
    ) -> *mut ibv_cq {
        ptr_result(|| {
            create_cq(context, cqe, cq_context, channel, i64::from(comp_vector)).map(|p| p.cast())
        })
    }
}

/// `verbs_context::create_cq_ex`: the standard completion fields are
/// always available; with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` or
/// `_WALLCLOCK` completions are stamped when the engine generates them.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ptr_result(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let a = unsafe { &*attr };
        // IBV_CQ_INIT_ATTR_MASK_FLAGS only; flags: single-threaded,
        // ignore-overrun (both harmless to accept).
        if a.comp_mask & !1 != 0 || a.flags & !3 != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        let p = create_cq(
            context,
            cqe,
            a.cq_context,
            a.channel,
            i64::from(a.comp_vector),
        )?;
        const TIMESTAMPS: u64 = 1 << 7 | 1 << 11;
        if a.wc_flags & TIMESTAMPS != 0 {
            // SAFETY: just made, live.
            unsafe { (*p).inner.rust.stamp_completions() };
        }
        Ok(p.cast())
    })
}

/// `ibv_resize_cq`: EINVAL for a count outside 1..=max_cqe or below the
/// completions waiting (the kernel's rxe_cq_chk_attr); `cq->cqe` then
/// holds the new depth.
#[no_mangle]
unsafe extern "C" fn ibv_resize_cq(p: *mut ibv_cq, cqe: c_int) -> c_int {
    errno_result(|| {
        // SAFETY: a live CQ (the caller's contract).
        let inner = unsafe { cq(p)? };
        let n = u32::try_from(cqe).map_err(|_| libc::EINVAL)?;
        inner.rust.resize(n).map_err(|e| errno(&e))?;
        // SAFETY: p is a live CQ; cqe is the application-visible depth.
        unsafe { (*p).cqe = c_int::try_from(inner.rust.cqe()).unwrap_or(c_int::MAX) };
        Ok(())
    })
}

crate::objects::destroy_listed! {
    fn ibv_destroy_cq / ibv_destroy_cq_impl(ibv_cq) as Cq, cq, CompletionQueue, cqs
}

// ---------------------------------------------------------------- WCs, polling, events

pub(crate) fn wc_to_c(w: &Wc) -> ibv_wc {
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

/// A C completion as uroce's (for `ibv_create_ah_from_wc`).
pub(crate) fn wc_from_c(c: &ibv_wc) -> Wc {
    let mut w = Wc::new(
        c.wr_id,
        // Values verbs.h does not define: the catch-all status; a receive.
        u32::try_from(c.status)
            .ok()
            .and_then(WcStatus::from_u32)
            .unwrap_or(WcStatus::GeneralErr),
        u32::try_from(c.opcode)
            .ok()
            .and_then(WcOpcode::from_u32)
            .unwrap_or(WcOpcode::Recv),
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
        let chan = unsafe { chan(ch)? };
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
