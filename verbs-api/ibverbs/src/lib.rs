//! # uroce as `libibverbs.so.1`
//!
//! A drop-in replacement for rdma-core's libibverbs: programs compiled
//! against Debian's `<infiniband/verbs.h>` (ibverbs-utils, perftest, your
//! own) run unmodified on uroce when the dynamic linker finds this library
//! first:
//!
//! ```sh
//! LD_LIBRARY_PATH=$(uroce libdir) ibv_devinfo
//! ```
//!
//! The same object is also `librdmacm.so.1` ([`rdmacm`]): one library, so
//! that rdma_cm ids and the verbs objects programs make on them share one
//! set of devices and engines.
//!
//! What it reproduces, and why each part matters to an unmodified binary:
//!
//! * **symbol versions**: every function is exported at the version node
//!   rdma-core gives it (`ibv_get_device_list@@IBVERBS_1.1`,
//!   `ibv_query_gid_type@@IBVERBS_PRIVATE_34`, ...), since binaries bind
//!   by version and the loader refuses a library that lacks a node they
//!   need (`libibverbs.map` declares the nodes, `symbol_versions` places
//!   each symbol);
//! * **structure layouts** ([`ffi`]): `ibv_post_send`, `ibv_post_recv`,
//!   `ibv_poll_cq`, `ibv_req_notify_cq` and `ibv_post_srq_recv` are inline
//!   in `verbs.h` and call through `ibv_context::ops`; `ibv_query_port`,
//!   `ibv_query_device_ex`, `ibv_create_cq_ex` and `ibv_create_qp_ex` go
//!   through `struct verbs_context`, which sits before `ibv_context`; the
//!   `ibv_wr_*` and `ibv_start_poll`/`ibv_next_poll` calls go through
//!   function pointers in `ibv_qp_ex` and `ibv_cq_ex`. The layout test
//!   compiles C against the installed header and compares;
//! * **errors** as libibverbs reports them: NULL with `errno` for
//!   constructors, the errno value for most calls, -1 with `errno` where
//!   libibverbs returns -1.
//!
//! Each C object is a `#[repr(C)]` Rust struct whose first field is the C
//! structure, followed by the uroce object it stands for; the pointer the
//! program holds is the address of both. No panic crosses the boundary:
//! every entry point that could panic runs under `guard` (the others
//! only read fields or return constants).

pub mod ffi;

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Sets the calling thread's `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`, turning a panic into `fail` (with errno EIO): unwinding into C
/// is undefined behaviour.
pub(crate) fn guard<T>(fail: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// A constructor's result: the object, or NULL with `errno` set.
pub(crate) fn ptr_result<T>(f: impl FnOnce() -> Result<*mut T, i32>) -> *mut T {
    guard(std::ptr::null_mut(), || match f() {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

/// A call that returns 0 or the errno value (and sets `errno` too, as
/// some callers read it).
pub(crate) fn errno_result(f: impl FnOnce() -> Result<(), i32>) -> libc::c_int {
    guard(libc::EIO, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    })
}

/// A call that returns 0, or -1 with `errno` set.
pub(crate) fn minus_one_result(f: impl FnOnce() -> Result<(), i32>) -> libc::c_int {
    guard(-1, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

/// Clears `O_NONBLOCK` on an event descriptor uroce made (its eventfds
/// start non-blocking). libibverbs and librdmacm hand programs blocking
/// descriptors and wait for an event in a `read(2)` of them: a blocking
/// get here is that read (`Semaphore::wait`), so a signal handler ends it
/// with EINTR, or the kernel restarts it under `SA_RESTART`, as with a
/// kernel device. A program that wants the gets not to block sets
/// `O_NONBLOCK` itself, which [`is_nonblocking`] then sees.
pub(crate) fn make_blocking(fd: libc::c_int) {
    set_nonblocking(fd, false);
}

/// Sets `O_NONBLOCK` on an event descriptor uroce made.
pub(crate) fn make_nonblocking(fd: libc::c_int) {
    set_nonblocking(fd, true);
}

fn set_nonblocking(fd: libc::c_int, on: bool) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor this library owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl != -1 {
            let fl = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            libc::fcntl(fd, libc::F_SETFL, fl);
        }
    }
}

/// True if the program made the descriptor non-blocking.
pub(crate) fn is_nonblocking(fd: libc::c_int) -> bool {
    // SAFETY: F_GETFL on a descriptor reads its flags; a bad descriptor
    // gives -1.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl != -1 && fl & libc::O_NONBLOCK != 0
}

/// Which symbol is exported at which version node (rdma-core's
/// `libibverbs.map.in`). A `.symver name, name@@NODE` directive makes
/// `NODE` the symbol's default version; the nodes themselves are declared
/// in `libibverbs.map`, which build.rs passes to the linker. The assembler
/// needs each symbol defined in the object the directive is in, so every
/// module states the versions of its own functions (a module's items stay
/// in one codegen unit). Rust code never calls a versioned function
/// itself: a call can put a reference to the symbol into another codegen
/// unit's object, whose copy of the directives then fails ("default version
/// symbol must be defined"); what the library calls internally is a plain
/// function the exported one forwards to (`ibv_alloc_pd_impl`, ...).
macro_rules! symbol_versions {
    ($($node:literal: [$($sym:ident),* $(,)?])*) => {
        #[cfg(not(test))]
        std::arch::global_asm!(concat!($($(
            ".symver ", stringify!($sym), ", ", stringify!($sym), "@@", $node, "\n",
        )*)*));
        /// This module's exported symbols with their version nodes.
        #[cfg(test)]
        pub(crate) const EXPORTS: &[(&str, &str)] = &[$($(($node, stringify!($sym)),)*)*];
    };
}
pub(crate) use symbol_versions;

/// A C entry point the library calls itself too (see [`symbol_versions`]):
/// `exported! { fn ibv_x / ibv_x_impl(args) -> R { body } }` makes the
/// exported `ibv_x`, which forwards to the plain `ibv_x_impl` that runs
/// `body`: one signature for both.
macro_rules! exported {
    (fn $c_name:ident / $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        #[no_mangle]
        unsafe extern "C" fn $c_name($($arg: $ty),*) -> $ret {
            // SAFETY: forwarded.
            unsafe { $name($($arg),*) }
        }

        #[doc = concat!(
            "`", stringify!($c_name), "`, for callers in this library ",
            "(see [`crate::symbol_versions`])."
        )]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body
    };
}
pub(crate) use exported;

mod ah;
mod compat;
mod cq;
mod cq_ex;
mod device;
mod enums;
mod fork;
mod objects;
mod pd_mr;
mod post;
mod qp;
mod qp_ex;
pub mod rdmacm;
mod srq;
mod sysfs_file;

#[cfg(test)]
mod layout_test;
