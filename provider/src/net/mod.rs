//! Networks that carry the transport's packets: the simulated network
//! with virtual time and fault injection (tests), and the UDP engine's
//! socket (see `engine`).

pub mod faults;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
