//! fork() support: nothing to do, since no device DMAs into registered
//! memory.

use libc::{c_int, c_void, size_t};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_fork_init, ibv_dontfork_range, ibv_dofork_range]
    "IBVERBS_1.13": [ibv_is_fork_initialized]
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
