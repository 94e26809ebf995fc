//! rsockets (`uroce_rdmacm::rsocket`, `rsocket_dgram`) over real engines
//! on loopback, one binary (one link, not six, on a 2-core machine):
//! streams (`stream`), direct writes (`iomap`), non-blocking connects
//! (`nonblock`), keepalive (`keepalive`), `IP_TOS` (`tos`) and datagram
//! rsockets (`dgram`).
//!
//! The devices are the process's (`UROCE_DEVICES`, read when a device
//! opens): [`init`] sets them once, before any test opens a device, from
//! each module's own addresses. `tos`'s comes first: its peer is no
//! device, so its socket takes the first one.

mod dgram;
mod iomap;
mod keepalive;
mod nonblock;
mod stream;
mod tos;

use std::sync::Once;

/// Every test calls this first.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let devices = [
            tos::devices(),
            stream::devices(),
            iomap::devices(),
            nonblock::devices(),
            keepalive::devices(),
            dgram::devices(),
        ]
        .join(",");
        // SAFETY of set_var: before any thread of this test binary reads
        // the environment through uroce (every test calls init first).
        std::env::set_var("UROCE_DEVICES", devices);
    });
}
