//! What enum values are called and mean, as rdma-core says: the
//! `ibv_*_str` names of statuses, events, node types, port states and
//! opcodes, and `enum ibv_rate`'s multiples and Mb/s.

use libc::{c_char, c_int};
use std::ffi::CStr;

crate::symbol_versions! {
    "IBVERBS_1.0": [ibv_rate_to_mult, mult_to_ibv_rate]
    "IBVERBS_1.1": [ibv_wc_status_str, ibv_event_type_str, ibv_node_type_str,
                    ibv_port_state_str, ibv_rate_to_mbps, mbps_to_ibv_rate]
    "IBVERBS_PRIVATE_34": [ibv_wr_opcode_str]
}

/// Entry `i` of a table of names, `unknown` for a value outside it.
pub(crate) fn name_in(table: &[&'static CStr], i: c_int, unknown: &'static CStr) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(unknown)
        .as_ptr()
}

/// An `extern "C" fn(c_int) -> *const c_char` of rdma-core's `*_str`
/// kind: entry `value` of the table of names, `unknown` outside it (the
/// strings are static: the pointer stays valid).
macro_rules! name_table {
    ($(#[$m:meta])* fn $name:ident($arg:ident), unknown $unknown:literal, [$($n:literal),+ $(,)?]) => {
        $(#[$m])*
        #[no_mangle]
        extern "C" fn $name($arg: libc::c_int) -> *const libc::c_char {
            const T: &[&std::ffi::CStr] = &[$($n),+];
            $crate::enums::name_in(T, $arg, $unknown)
        }
    };
}
pub(crate) use name_table;

name_table! {
    /// The words of rdma-core's `ibv_wc_status_str` (uroce's `WcStatus`
    /// `Display` gives the same).
    fn ibv_wc_status_str(status), unknown c"unknown", [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM rendezvous error",
    ]
}

name_table! {
    fn ibv_event_type_str(event), unknown c"unknown", [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ]
}

name_table! {
    fn ibv_node_type_str(node_type), unknown c"unknown", [
        c"unknown",
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ]
}

name_table! {
    fn ibv_port_state_str(port_state), unknown c"unknown", [
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ]
}

name_table! {
    fn ibv_wr_opcode_str(opcode), unknown c"unknown", [
        c"rdma-write",
        c"rdma-write-with-imm",
        c"send",
        c"send-with-imm",
        c"rdma-read",
        c"atomic-cmp-and-swap",
        c"atomic-fetch-and-add",
        c"local-invalidate",
        c"bind-mw",
        c"send-with-invalidate",
        c"tso",
        c"driver1",
        c"unknown",
        c"unknown",
        c"unknown",
        c"atomic-write",
    ]
}

/// `enum ibv_rate` -> multiple of 2.5 Gb/s (rdma-core's table).
const RATES: &[(c_int, c_int, c_int)] = &[
    // (enum, mult, mbps)
    (2, 1, 2500),
    (3, 4, 10000),
    (4, 8, 20000),
    (5, 12, 30000),
    (6, 16, 40000),
    (7, 24, 60000),
    (8, 32, 80000),
    (9, 48, 120000),
    (10, 2, 5000),
    (11, 6, 14062),
    (12, 22, 56250),
    (13, 45, 112500),
    (14, 67, 168750),
    (15, 10, 25000),
    (16, 40, 100000),
    (17, 80, 200000),
    (18, 120, 300000),
    (19, 11, 28125),
    (20, 20, 50000),
    (21, 160, 400000),
    (22, 240, 600000),
];

/// The `extern "C"` look-ups in [`RATES`]: `fn name(arg) from -> to or
/// none` answers column `to` of the row whose column `from` is `arg`, and
/// `none` when no row has it.
macro_rules! rate_lookups {
    ($(fn $name:ident($arg:ident) $from:tt -> $to:tt or $none:expr;)+) => {
        $(
            #[no_mangle]
            extern "C" fn $name($arg: c_int) -> c_int {
                RATES.iter().find(|r| r.$from == $arg).map_or($none, |r| r.$to)
            }
        )+
    };
}

rate_lookups! {
    fn ibv_rate_to_mult(rate) 0 -> 1 or -1;
    fn mult_to_ibv_rate(mult) 1 -> 0 or 0;
    fn ibv_rate_to_mbps(rate) 0 -> 2 or -1;
    fn mbps_to_ibv_rate(mbps) 2 -> 0 or 0;
}
