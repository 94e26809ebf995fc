//! The rest of libibverbs' exported symbols, so that every program or
//! library linked against rdma-core (up to IBVERBS_1.18) finds what it
//! binds: the calls uroce does not do (importing device memory, dma-bufs,
//! device memory handles, completion counters, port speed) report
//! EOPNOTSUPP. And the symbols other rdma-core libraries import, which
//! must exist for them to load at all: perftest links libmlx5 and libefa
//! (and librdmacm), all built with BIND_NOW, so the loader resolves every
//! symbol they import (the provider-driver interface of
//! `IBVERBS_PRIVATE_34`, the kernel-struct copy helpers, ECE) before
//! `main` runs.
//!
//! None of them is reached on uroce: `verbs_register_driver_34` (called by
//! each provider library's constructor) ignores the driver, so no
//! hardware provider ever opens a device (and rdma-core's own librdmacm,
//! where a program loads it instead of this library's, finds no kernel
//! RDMA CM). The rest return EOPNOTSUPP (or NULL with errno EOPNOTSUPP).

use libc::{c_char, c_int, c_void};

/// A provider library registers its driver: uroce has its own devices.
#[no_mangle]
extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// libmlx5 reads this flag (rdma-core's default: false).
#[no_mangle]
static verbs_allow_disassociate_destroy: bool = false;

/// Functions that report "not supported" (an `int` or a pointer, errno
/// EOPNOTSUPP), declared at their version nodes; `also` names this
/// module's other exports. One list: each stub is named once, and the
/// module's [`crate::symbol_versions`] are made from it.
macro_rules! unsupported {
    (
        $($node:literal: int: [$($name:ident),* $(,)?] ptr: [$($pname:ident),* $(,)?])*
        also: $($anode:literal: [$($asym:ident),* $(,)?])*
    ) => {
        $(
            $(
                #[no_mangle]
                extern "C" fn $name() -> c_int {
                    crate::set_errno(libc::EOPNOTSUPP);
                    libc::EOPNOTSUPP
                }
            )*
            $(
                #[no_mangle]
                extern "C" fn $pname() -> *mut c_void {
                    crate::set_errno(libc::EOPNOTSUPP);
                    std::ptr::null_mut()
                }
            )*
        )*
        crate::symbol_versions! {
            $($node: [$($name,)* $($pname,)*])*
            $($anode: [$($asym,)*])*
        }
    };
}

unsupported! {
    "IBVERBS_1.0":
        int: [
            ibv_copy_path_rec_from_kern, ibv_copy_qp_attr_from_kern,
            ibv_copy_path_rec_to_kern
        ]
        ptr: []
    "IBVERBS_1.1":
        int: [ibv_resolve_eth_l2_from_gid, ibv_copy_ah_attr_from_kern]
        ptr: []
    "IBVERBS_1.10":
        int: [ibv_query_ece, ibv_set_ece]
        ptr: []
    "IBVERBS_1.12":
        int: []
        ptr: [ibv_reg_dmabuf_mr]
    "IBVERBS_1.13":
        int: [ibv_unimport_dm]
        ptr: [ibv_import_dm]
    "IBVERBS_1.15":
        int: [ibv_dealloc_dmah]
        ptr: [ibv_alloc_dmah, ibv_reg_mr_ex]
    "IBVERBS_1.16":
        int: [ibv_dm_export_dmabuf_fd, ibv_query_port_speed]
        ptr: []
    "IBVERBS_1.17":
        int: [ibv_free_buf]
        ptr: [ibv_alloc_buf, ibv_reg_buf_mr]
    "IBVERBS_1.18":
        int: [
            _ibv_query_comp_cntr_caps, ibv_destroy_comp_cntr, ibv_export_buf_dmabuf_fd,
            ibv_inc_comp_cntr, ibv_inc_err_comp_cntr, ibv_qp_attach_comp_cntr,
            ibv_read_comp_cntr, ibv_read_err_comp_cntr, ibv_set_comp_cntr,
            ibv_set_err_comp_cntr
        ]
        ptr: [ibv_create_comp_cntr]
    "IBVERBS_PRIVATE_34":
        int: [
            __verbs_log, execute_ioctl, ibv_cmd_advise_mr, ibv_cmd_alloc_dm,
            ibv_cmd_alloc_mw, ibv_cmd_alloc_pd, ibv_cmd_attach_mcast,
            ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
            ibv_cmd_create_cq_ex, ibv_cmd_create_flow, ibv_cmd_create_flow_action_esp,
            ibv_cmd_create_qp_ex, ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table,
            ibv_cmd_create_srq, ibv_cmd_create_srq_ex, ibv_cmd_create_wq,
            ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd, ibv_cmd_dereg_mr,
            ibv_cmd_destroy_ah, ibv_cmd_destroy_counters, ibv_cmd_destroy_cq,
            ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action, ibv_cmd_destroy_qp,
            ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
            ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context,
            ibv_cmd_modify_cq, ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp,
            ibv_cmd_modify_qp_ex, ibv_cmd_modify_srq, ibv_cmd_modify_wq,
            ibv_cmd_open_qp, ibv_cmd_open_xrcd, ibv_cmd_query_context,
            ibv_cmd_query_device_any, ibv_cmd_query_mr, ibv_cmd_query_port,
            ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters,
            ibv_cmd_reg_dm_mr, ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_rereg_mr,
            ibv_cmd_resize_cq, ibv_cmd_create_cq, ibv_cmd_create_qp, ibv_cmd_post_send,
            ibv_cmd_post_recv, ibv_cmd_post_srq_recv, ibv_cmd_poll_cq,
            ibv_cmd_req_notify_cq, ibv_cmd_create_srq_ex2, verbs_set_ops,
            verbs_init_cq, verbs_uninit_context, __ioctl_final_num_attrs,
            ibv_read_ibdev_sysfs_file
        ]
        ptr: [_verbs_init_and_alloc_context, verbs_open_device]
    also:
    "IBVERBS_1.0": [ibv_get_sysfs_path]
    "IBVERBS_1.1": [ibv_register_driver]
    "IBVERBS_PRIVATE_34": [verbs_register_driver_34, verbs_allow_disassociate_destroy]
}

/// The pre-1.1 driver registration (a hidden version in rdma-core):
/// ignored, as `verbs_register_driver_34`.
#[no_mangle]
extern "C" fn ibv_register_driver(_name: *const c_char, _init: *const c_void) {}

/// There is no sysfs device to point at.
#[no_mangle]
extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}
