//! # uroce-provider
//!
//! The transport as sans-IO state machines, memory (PDs, MRs, keys),
//! completion queues, and the engine that drives them over UDP.
#![warn(missing_docs)]

pub mod cm;
pub mod counters;
pub mod cq;
pub mod device;
pub mod diag;
pub use diag::{check, explain, stat, trace};
pub mod endpoint;
pub mod engine;
pub mod env;
pub mod events;
pub mod memory;
pub mod net;
pub mod observe;
pub mod planted;
pub mod qp_attr;
pub mod quota;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod threads;
pub mod transport;
pub mod types;

#[cfg(test)]
mod layering;

pub use uroce_wire as wire;
