//! `ibv_cq_ex` polling: `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`
//! and the `ibv_wc_read_*` readers, function pointers in every uroce CQ.

use crate::cq::{cq, wc_to_c};
use crate::ffi::*;
use crate::guard;
use libc::{c_int, c_uint, c_void};
use uroce_verbs::Wc;

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
/// The completion clock when the engine generated the completion (in
/// `hca_core_clock` ticks: ns on CLOCK_MONOTONIC); 0 from a CQ made
/// without `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK)`.
pub(crate) unsafe extern "C" fn read_completion_ts(c: *mut ibv_cq_ex) -> u64 {
    cur(c, |w| w.timestamp)
}
/// The same moment on the wall clock (ns since the epoch); 0 as above.
pub(crate) unsafe extern "C" fn read_completion_wallclock_ns(c: *mut ibv_cq_ex) -> u64 {
    cur(c, |w| match w.timestamp {
        0 => 0,
        ts => uroce_verbs::completion_wallclock_ns(ts),
    })
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
