//! librdmacm's structures, as `<rdma/rdma_cma.h>` (librdmacm-dev 44) lays
//! them out, and the two libibverbs ones only librdmacm's calls take
//! (`ibv_srq_init_attr_ex`, `ibv_ece`). The layout test compares every
//! size and listed offset with the installed headers (`rdmacm_layout_table!`).
#![allow(non_camel_case_types, missing_docs)]

use crate::ffi::*;
use libc::{c_char, c_int, c_void, size_t, sockaddr, sockaddr_storage, socklen_t};

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ib_addr {
    pub sgid: ibv_gid,
    pub dgid: ibv_gid,
    /// Network byte order.
    pub pkey: u16,
}

/// `struct rdma_addr`: each address is a union of `sockaddr`,
/// `sockaddr_in`, `sockaddr_in6` and `sockaddr_storage`; the storage is
/// the largest and is what Rust names.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    pub src_storage: sockaddr_storage,
    pub dst_storage: sockaddr_storage,
    pub addr: rdma_ib_addr,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sa_path_rec {
    pub dgid: ibv_gid,
    pub sgid: ibv_gid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route`.
#[repr(C)]
pub struct rdma_route {
    pub addr: rdma_addr,
    pub path_rec: *mut ibv_sa_path_rec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    pub route: rdma_route,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut rdma_cm_event,
    pub send_cq_channel: *mut ibv_comp_channel,
    pub send_cq: *mut ibv_cq,
    pub recv_cq_channel: *mut ibv_comp_channel,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub pd: *mut ibv_pd,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_ud_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: ibv_ah_attr,
    pub qp_num: u32,
    pub qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    pub conn: rdma_conn_param,
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: c_int,
    pub status: c_int,
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: socklen_t,
    pub ai_dst_len: socklen_t,
    pub ai_src_addr: *mut sockaddr,
    pub ai_dst_addr: *mut sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: size_t,
    pub ai_route: *mut c_void,
    pub ai_connect_len: size_t,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    pub comp_mask: u32,
    pub join_flags: u32,
    pub addr: *mut sockaddr,
}

/// `struct ibv_ece` (`<infiniband/verbs.h>`).
#[repr(C)]
pub struct ibv_ece {
    pub vendor_id: u32,
    pub options: u32,
    pub comp_mask: u32,
}

/// `struct ibv_tm_cap`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_tm_cap {
    pub max_num_tags: u32,
    pub max_ops: u32,
}

/// `struct ibv_srq_init_attr_ex`: begins as `ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr_ex {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
    pub comp_mask: u32,
    pub srq_type: c_int,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub tm_cap: ibv_tm_cap,
}

/// `struct ibv_path_data` (`<infiniband/sa.h>`): what `RDMA_OPTION_IB_PATH`
/// takes, an array of; only its size matters here.
pub const IBV_PATH_DATA_SIZE: usize = 72;

/// The structures and fields the layout test checks, for a macro `$m`.
#[macro_export]
macro_rules! rdmacm_layout_table {
    ($m:ident) => {
        $m! {
            rdma_event_channel [fd]
            rdma_ib_addr [sgid dgid pkey]
            rdma_addr [src_storage dst_storage addr]
            ibv_sa_path_rec [dgid sgid dlid slid raw_traffic flow_label hop_limit traffic_class reversible numb_path pkey sl mtu_selector mtu rate_selector rate packet_life_time_selector packet_life_time preference]
            rdma_route [addr path_rec num_paths]
            rdma_cm_id [verbs channel context qp route ps port_num event send_cq_channel send_cq recv_cq_channel recv_cq srq pd qp_type]
            rdma_conn_param [private_data private_data_len responder_resources initiator_depth flow_control retry_count rnr_retry_count srq qp_num]
            rdma_ud_param [private_data private_data_len ah_attr qp_num qkey]
            rdma_cm_event [id listen_id event status param]
            rdma_addrinfo [ai_flags ai_family ai_qp_type ai_port_space ai_src_len ai_dst_len ai_src_addr ai_dst_addr ai_src_canonname ai_dst_canonname ai_route_len ai_route ai_connect_len ai_connect ai_next]
            rdma_cm_join_mc_attr_ex [comp_mask join_flags addr]
            ibv_ece [vendor_id options comp_mask]
            ibv_tm_cap [max_num_tags max_ops]
            ibv_srq_init_attr_ex [srq_context attr comp_mask srq_type pd xrcd cq tm_cap]
        }
    };
}
