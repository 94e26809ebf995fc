//! The provider's insides for the fuzzer and the tests (feature
//! `testing`): the sans-IO transport (`transport::new_qp`, `QpConfig`,
//! the queues), the memory model (the key table, regions and windows),
//! the simulated network, the CM agent, the engine's capture and socket
//! helpers. A shipped build has none of this: without the feature the
//! modules behind it are private, and only [`crate::device`] and the
//! value types are public.

/// The sans-IO transport: the QP machines, their configuration and
/// queues (`crate::transport`).
pub mod transport {
    pub use crate::transport::*;
}
/// The memory model: the key table, regions and windows
/// (`crate::memory`).
pub mod memory {
    pub use crate::memory::*;
}
/// The simulated network and the faults (`crate::net`).
pub mod net {
    pub use crate::net::*;
}
/// Completion queues and channels (`crate::cq`).
pub mod cq {
    pub use crate::cq::*;
}
/// Asynchronous events and the event queues (`crate::events`).
pub mod events {
    pub use crate::events::*;
}
/// The connection manager agent and QP1 (`crate::cm`).
pub mod cm {
    pub use crate::cm::*;
}
/// The engine: its capture, sockets and driver (`crate::engine`).
pub mod engine {
    pub use crate::engine::*;
}
/// Multicast groups and the engine's demultiplexing (`crate::endpoint`).
pub mod endpoint {
    pub use crate::endpoint::*;
}
/// The device's object quotas (`crate::quota`).
pub mod quota {
    pub use crate::quota::*;
}
