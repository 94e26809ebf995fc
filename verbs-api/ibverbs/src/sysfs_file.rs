//! `ibv_read_sysfs_file`: a program reads a file of a device's sysfs
//! directory (the private sysfs helpers are in `compat`).

use libc::{c_char, c_int, size_t};
use std::ffi::CStr;

crate::symbol_versions! {
    "IBVERBS_1.0": [ibv_read_sysfs_file]
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
