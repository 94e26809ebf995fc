//! # uroce-provider
//!
//! The transport as sans-IO state machines, memory (PDs, MRs, keys),
//! completion queues, and the engine that drives them over UDP.
#![warn(missing_docs)]

pub mod check;
pub mod cm;
pub mod counters;
pub mod cq;
pub mod device;
pub mod diag;
pub mod endpoint;
pub mod engine;
pub mod env;
pub mod events;
pub mod explain;
pub mod memory;
pub mod net;
pub mod planted;
pub mod qp_attr;
pub mod quota;
pub mod stat;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod threads;
pub mod trace;
pub mod transport;
pub mod types;

pub use uroce_wire as wire;
