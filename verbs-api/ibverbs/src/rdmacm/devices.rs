//! The librdmacm calls that take no id: the device list
//! (`rdma_get_devices`) and the events' names (`rdma_event_str`).

use crate::ffi::*;
use crate::{guard, set_errno};
use libc::c_int;
use std::ptr::null_mut;

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_get_devices, rdma_free_devices, rdma_event_str]
}

/// The context of every device (`rdma_cm_id::verbs` of its ids), in a
/// NULL-terminated array from `malloc`.
#[no_mangle]
unsafe extern "C" fn rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard(null_mut(), || {
        let list = crate::device::cm_contexts();
        let out = match &list {
            Ok(v) => {
                // SAFETY: malloc of n + 1 pointers (checked below).
                let a = unsafe { libc::calloc(v.len() + 1, std::mem::size_of::<usize>()) }
                    .cast::<*mut ibv_context>();
                if !a.is_null() {
                    for (i, &c) in v.iter().enumerate() {
                        // SAFETY: within the n + 1 entries.
                        unsafe { *a.add(i) = c };
                    }
                } else {
                    set_errno(libc::ENOMEM);
                }
                a
            }
            Err(e) => {
                set_errno(*e);
                null_mut()
            }
        };
        if !num.is_null() {
            let n = if out.is_null() {
                0
            } else {
                list.map_or(0, |v| v.len())
            };
            // SAFETY: the caller's out-parameter.
            unsafe { *num = c_int::try_from(n).unwrap_or(c_int::MAX) };
        }
        out
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: an array from rdma_get_devices (malloc), or NULL. The
    // contexts stay open, as librdmacm keeps its devices.
    unsafe { libc::free(list.cast()) };
}

crate::enums::name_table! {
    fn rdma_event_str(event), unknown c"UNKNOWN EVENT", [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
    ]
}
