//! # uroce: RDMA verbs without hardware
//!
//! A verbs-compatible API over a userspace RoCEv2 engine. The objects and
//! calls follow rdma-core's libibverbs:
//!
//! | verbs | uroce |
//! |---|---|
//! | `ibv_get_device_list` / `ibv_open_device` | [`devices`], [`Device::open`] |
//! | `ibv_query_device/port/gid` | [`Context::query_device`], [`Context::query_port`], [`Context::query_gid`] |
//! | `ibv_alloc_pd` | [`Context::alloc_pd`] |
//! | `ibv_reg_mr` | [`ProtectionDomain::reg_mr`], [`ProtectionDomain::alloc_mr`], [`ProtectionDomain::reg_mr_raw`] |
//! | `ibv_create_cq` / `ibv_poll_cq` | [`Context::create_cq`], [`CompletionQueue::poll`] |
//! | `ibv_create_qp` / `ibv_modify_qp` / `ibv_query_qp` | [`ProtectionDomain::create_qp`], [`QueuePair::modify`], [`QueuePair::query`] |
//! | `ibv_post_send` / `ibv_post_recv` | [`QueuePair::post_send`], [`QueuePair::post_recv`] |
//!
//! Registered memory is shared with the engine and with remote peers, so
//! it is never exposed as `&[u8]`/`&mut [u8]`: see [`MemoryRegion`] and the
//! memory model of [`uroce_provider::device::MrHandle`].
//!
//! rdma_cm and rsockets are in the crate above this one, `uroce_rdmacm`,
//! as librdmacm is above libibverbs: it reaches each device's connection
//! manager agent (QP1, started when the device opens) through its
//! [`CmPort`].
#![warn(missing_docs)]

mod ah;
#[cfg(feature = "tokio")]
mod async_cq;
mod cm_port;
mod connect;
mod cq;
mod device;
mod error;
mod events;
pub mod loopback;
mod pd;
mod qp;
mod srq;

pub use ah::AddressHandle;
#[cfg(feature = "tokio")]
pub use async_cq::CqStream;
pub use cm_port::{CmLayer, CmPort};
pub use connect::{ConnectOptions, CqBuilder, Endpoint, QpBuilder};
pub use cq::CompletionQueue;
pub use device::{
    devices, Context, Device, DeviceAttr, GidEntry, PortAttr, FW_VER, GID_ENTRIES, GID_TABLE_LEN,
    MAX_INLINE, MAX_RD_ATOM, MAX_SGE,
};
pub use error::{Error, Result};
pub use events::{AsyncEvent, CompChannel, CqEvent, EventElement, EventType};
pub use pd::{inc_rkey, MemoryRegion, MemoryWindow, ProtectionDomain};
pub use qp::{QpInitAttr, QueuePair};
pub use srq::{SharedReceiveQueue, SrqAttr, SrqAttrMask};
pub use uroce_provider::counters::CounterSnapshot;
pub use uroce_provider::device::{
    clock_ns as completion_clock_ns, wallclock_ns as completion_wallclock_ns,
    CLOCK_KHZ as COMPLETION_CLOCK_KHZ,
};
pub use uroce_provider::device::{Faults, MemError, MwBind, MwType};
pub use uroce_provider::explain::Explanation;
pub use uroce_provider::qp_attr::{AddressVector, AttrMask, QpAttr, QpCap};
pub use uroce_provider::types::{
    Access, FlushSpec, Mtu, QpState, QpType, RecvWr, SendFlags, SendWr, Sge, UdDest, Wc, WcFlags,
    WcOpcode, WcStatus, WrOpcode,
};
pub use uroce_wire as wire;
