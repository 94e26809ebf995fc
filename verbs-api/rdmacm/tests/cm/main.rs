//! rdma_cm's Rust API (`uroce_rdmacm::cm`) over real engines on loopback,
//! one binary (one link, not three, on a 2-core machine): the connection
//! exchange and its failure paths and UD through SIDR (`loopback`), the
//! IPv4 and IPv6 wildcards on one port (`afonly`), the id's traffic
//! class (`tos`), and the two sides in two processes on one device
//! (`share`, whose processes are this binary run again as children).
//!
//! The devices and the CM's timeouts are the process's (read from the
//! environment when a device opens): [`init`] sets them once, before any
//! test opens a device, from each module's own addresses. `afonly`'s
//! come first: its wildcard listeners (bound on every device) answer a
//! request through their first device, which must be the one its
//! requests come to.

mod afonly;
mod loopback;
mod share;
mod tos;

use std::net::SocketAddr;
use std::sync::Once;
use std::time::Duration;
use uroce_rdmacm::cm::{CmEvent, CmEventType, EventChannel};

/// Every test calls this first.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let devices = [afonly::devices(), loopback::devices(), tos::devices()].join(",");
        // SAFETY of set_var: before any thread of this test binary reads
        // the environment through uroce (every test calls init first).
        std::env::set_var("UROCE_DEVICES", devices);
        // Quick CM failures (loopback's no-listener and silent-server
        // tests): 67 ms per try, 4 retries.
        std::env::set_var("UROCE_CM_RESPONSE_TIMEOUT", "14");
        std::env::set_var("UROCE_CM_RETRIES", "4");
    });
}

/// A socket address from its parts.
pub fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// The next event on `ch`, within 20 s.
fn next(ch: &EventChannel) -> CmEvent {
    ch.get_event_timeout(Some(Duration::from_secs(20)))
        .unwrap()
        .expect("a CM event within 20 s")
}

/// The next event on `ch`, which must be a `t`.
pub fn expect(ch: &EventChannel, t: CmEventType) -> CmEvent {
    let e = next(ch);
    assert_eq!(e.event, t, "status {} {:?}", e.status, e.id);
    e
}
