//! The calls that need no device: names of enum values, rates, fork
//! support, sysfs.

use libc::{c_char, c_int, c_void, size_t};
use std::ffi::CStr;

crate::symbol_versions! {
    "IBVERBS_1.0": [ibv_read_sysfs_file, ibv_rate_to_mult, mult_to_ibv_rate]
    "IBVERBS_1.1": [ibv_fork_init, ibv_dontfork_range, ibv_dofork_range, ibv_wc_status_str,
                    ibv_event_type_str, ibv_node_type_str, ibv_port_state_str,
                    ibv_rate_to_mbps, mbps_to_ibv_rate]
    "IBVERBS_1.13": [ibv_is_fork_initialized]
    "IBVERBS_PRIVATE_34": [ibv_wr_opcode_str]
}

fn pick(table: &[&'static CStr], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// The words of rdma-core's `ibv_wc_status_str` (uroce's `WcStatus`
/// `Display` gives the same).
#[no_mangle]
extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const T: &[&CStr] = &[
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
    ];
    pick(T, status)
}

#[no_mangle]
extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const T: &[&CStr] = &[
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
    ];
    pick(T, event)
}

#[no_mangle]
extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"unknown",
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    pick(T, node_type)
}

#[no_mangle]
extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    const T: &[&CStr] = &[
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ];
    pick(T, port_state)
}

#[no_mangle]
extern "C" fn ibv_wr_opcode_str(opcode: c_int) -> *const c_char {
    const T: &[&CStr] = &[
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
    ];
    pick(T, opcode)
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

#[no_mangle]
extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

#[no_mangle]
extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES.iter().find(|r| r.1 == mult).map_or(0, |r| r.0)
}

#[no_mangle]
extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

#[no_mangle]
extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(0, |r| r.0)
}

/// Nothing to prepare: registered memory is ordinary process memory that
/// no device DMAs into, so fork() is as safe as without RDMA.
#[no_mangle]
extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED`.
#[no_mangle]
extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

#[no_mangle]
extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

#[no_mangle]
extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: size_t) -> c_int {
    0
}

/// `ibv_read_sysfs_file`: reads `dir/file` (`dir` is a device's
/// `ibdev_path` or `dev_path`) into `buf`, NUL-terminated without its
/// trailing newline, as rdma-core does; the length, or -1 with errno.
/// uroce's devices have such files under `uroce exec` only (its sysfs
/// view); elsewhere this fails with ENOENT.
///
/// # Safety
/// `dir` and `file` are NUL-terminated strings, `buf` holds `size` bytes.
#[no_mangle]
unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's strings.
    let (d, f) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let mut path = d.to_bytes().to_vec();
    path.push(b'/');
    path.extend_from_slice(f.to_bytes());
    let Ok(path) = std::ffi::CString::new(path) else {
        crate::set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return -1;
    }
    // SAFETY: the caller's buffer of `size` bytes.
    let n = unsafe { libc::read(fd, buf.cast(), size) };
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    if n < 0 {
        return -1;
    }
    let mut len = n as usize;
    // As rdma-core: the newline cut off, else a NUL after the contents;
    // contents that fill the buffer without a newline fail (-1), since
    // they could not be terminated.
    // SAFETY: every index read or written is below `size` (len <= size;
    // buf[len] is written only when len < size).
    unsafe {
        if len > 0 && *buf.add(len - 1) == b'\n' as c_char {
            len -= 1;
            *buf.add(len) = 0;
        } else if len < size {
            *buf.add(len) = 0;
        } else {
            return -1;
        }
    }
    len as c_int
}
