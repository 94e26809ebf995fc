//! Connection management: rdma_cm's model over uroce's CM agent.
//!
//! | librdmacm | uroce |
//! |---|---|
//! | `rdma_create_event_channel` / `rdma_get_cm_event` | [`EventChannel::new`], [`EventChannel::get_event`] |
//! | `rdma_create_id` | [`CmId::new`] |
//! | `rdma_bind_addr` / `rdma_resolve_addr` / `rdma_resolve_route` | [`CmId::bind_addr`], [`CmId::resolve_addr`], [`CmId::resolve_route`] |
//! | `rdma_listen` / `rdma_accept` / `rdma_reject` | [`CmId::listen`], [`CmId::accept`], [`CmId::reject`] |
//! | `rdma_create_qp` | [`CmId::create_qp`] |
//! | `rdma_connect` / `rdma_establish` / `rdma_disconnect` | [`CmId::connect`], [`CmId::establish`], [`CmId::disconnect`] |
//!
//! Addresses are IP addresses and ports as with the kernel's rdma_cm on
//! RoCE (IBTA Annex A11): a port and a port space make the CM service
//! ID, and a REQ (or SIDR_REQ) carries the CMA header with both IP
//! addresses and the active side's port ahead of the user's private data.
//! An address resolves to the uroce device that has it (or, for a remote
//! address, the device the route leaves from, else the only one).
//!
//! As in librdmacm, the QP moves through its states inside the calls and
//! the event processing: [`CmId::create_qp`] leaves an RC QP in INIT (a UD
//! QP in RTS), the REP's arrival moves the active side's QP to RTR and RTS
//! before [`CmEventType::Established`] is returned, and
//! [`CmId::accept`] moves the passive side's QP before the REP goes out.
//!
//! The event channel's descriptor is readable while an event waits: put
//! it in `poll`/`epoll` or an async reactor, then call
//! [`EventChannel::try_get_event`].
//!
//! The files, by idea: `event` (the events and their parameters),
//! `channel` (event channels), `dispatch` (the device side: rdma_cm's
//! layer on each device's CM port, routing the agent's events to ids),
//! `id` (ids: state, options, teardown), `addr` (addresses, ports and
//! their resolution), `qp` (the id's QP and its attributes), `exchange`
//! (the connection exchange), `agent_event` (the agent's events made the
//! user's) and `multicast`.

mod addr;
mod agent_event;
mod channel;
mod dispatch;
mod event;
mod exchange;
mod id;
mod multicast;
mod qp;

pub use addr::binds_any;
pub(crate) use addr::device_towards;
pub use channel::EventChannel;
pub use event::{CmEvent, CmEventType, ConnParam, UdParam, RDMA_UDP_QKEY};
pub use id::CmId;
pub use uroce_wire::cma::PortSpace;
