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

/// The `ibv_wc_read_*` function pointers that read one field of the
/// current completion ([`cur`]: the type's default when there is none).
macro_rules! readers {
    ($($(#[$m:meta])* fn $name:ident -> $t:ty: $f:expr;)+) => {
        $(
            $(#[$m])*
            pub(crate) unsafe extern "C" fn $name(c: *mut ibv_cq_ex) -> $t {
                cur(c, $f)
            }
        )+
    };
}

readers! {
    fn read_opcode -> c_int: |w| w.opcode as c_int;
    fn read_vendor_err -> u32: |w| w.vendor_err;
    fn read_byte_len -> u32: |w| w.byte_len;
    fn read_imm_data -> u32: |w| wc_to_c(w).imm_data;
    fn read_qp_num -> u32: |w| w.qp_num;
    fn read_src_qp -> u32: |w| w.src_qp;
    fn read_wc_flags -> c_uint: |w| w.wc_flags.bits();
    fn read_slid -> u32: |w| w.slid as u32;
    fn read_sl -> u8: |w| w.sl;
    fn read_dlid_path_bits -> u8: |w| w.dlid_path_bits;
    /// The completion clock when the engine generated the completion (in
    /// `hca_core_clock` ticks: ns on CLOCK_MONOTONIC); 0 from a CQ made
    /// without `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP(_WALLCLOCK)`.
    fn read_completion_ts -> u64: |w| w.timestamp;
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
