//! # uroce-rdmacm: rdma_cm and rsockets over uroce's verbs
//!
//! The crate above `uroce_verbs`, as librdmacm is above libibverbs:
//!
//! - [`cm`]: rdma_cm's model (event channels, ids, address and route
//!   resolution, the connection exchange, UD ids through SIDR and
//!   multicast) over each device's connection manager agent, which stays
//!   the device's (reached through `uroce_verbs::CmPort`).
//! - [`rsocket`]: stream rsockets, wire-compatible with librdmacm's.
//! - [`rsocket_dgram`]: datagram rsockets (UD with a UDP side channel).
//!
//! The C drop-in librdmacm (`uroce-ibverbs`) is built on these.
#![warn(missing_docs)]

pub mod cm;
pub mod rsocket;
pub mod rsocket_dgram;
