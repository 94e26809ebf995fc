//! The transport as sans-IO state machines.
//!
//! A QP's state machine never reads a clock or touches a socket. Its
//! contract (after quinn-proto):
//!
//! * `handle_packet(now, src, packet)` takes one parsed, ICRC-checked
//!   packet addressed to the QP;
//! * `poll_transmit(now, buf)` writes the next packet to send (a whole UDP
//!   payload, BTH to ICRC) into `buf` and says where it goes, or `None`;
//! * `poll_timeout()` names the next deadline; `handle_timeout(now)` may be
//!   called at or after it, and spuriously;
//! * work requests come in through the lock-free queues the application
//!   posts to ([`SendQueue`], [`RecvQueue`]); completions go out to the
//!   CQs.
//!
//! The same code runs under the UDP engine and the simulated network.
//!
//! # Layout
//!
//! * [`core`]: the one QP engine, [`core::Qp<S>`], and what it owns for
//!   every transport (state, modify, completions and the QP_FATAL rule,
//!   ERR/SQE/RESET and flushing, the state switch of `poll_transmit`, the
//!   [`QpMachine`] impl), and the [`core::Service`] hooks a transport
//!   supplies;
//! * [`rc`], [`uc`], [`ud`]: the three services, `RcQp`, `UcQp` and
//!   `UdQp` being `Qp<RcService>`, `Qp<UcService>`, `Qp<UdService>`;
//! * [`message`]: SEND and RDMA WRITE as RC and UC share them
//!   (segmentation, the request packet, the responder's checks and the
//!   placement of a message);
//! * [`status`]: the one error table, what a failed responder check does
//!   per QP type;
//! * [`admission`]: what a packet must pass before a transport sees it
//!   (partition, peer, the reasons of a drop, PSN sweeps);
//! * [`queues`]: the work queues shared with the posting threads, and the
//!   published QP state;
//! * [`config`]: what a QP is built from, [`QpConfig`];
//! * [`sgl`]: scatter/gather lists resolved against the key table.

pub mod admission;
pub mod config;
pub mod core;
pub mod message;
pub mod queues;
pub mod rc;
pub mod sgl;
pub mod status;
pub mod uc;
pub mod ud;

pub use self::admission::{pkey_matches, Drop, PeerPin, SweepDetector, PKEY};
#[cfg(any(test, feature = "testing"))]
pub use self::admission::{PLAUSIBLE_PSN_WINDOW, SWEEP_PERIOD_NS, SWEEP_THRESHOLD};
pub use self::config::QpConfig;
pub use self::core::QpTally;
#[cfg(any(test, feature = "testing"))]
pub use self::core::{LastError, QpCore};
#[cfg(any(test, feature = "testing"))]
pub use self::message::payload_length_ok;
pub use self::queues::{PostError, QueueAllocError, RecvQueue, ResizeError, SendQueue, StateCell};
use crate::qp_attr::{AttrMask, CapError, ModifyError, QpAttr};
use crate::types::{QpState, QpType};
use std::net::IpAddr;
use uroce_wire::packet::ParsedPacket;

/// `ip` as an IPv6 address (IPv4-mapped for IPv4).
pub fn to_v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// Monotonic time in nanoseconds (real or virtual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// `self + ns`, saturating.
    pub const fn plus(self, ns: u64) -> Nanos {
        Nanos(self.0.saturating_add(ns))
    }
}

/// A packet the state machine produced: `len` bytes at the start of the
/// caller's buffer, for UDP port 4791 at `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination IP.
    pub dst: IpAddr,
    /// Bytes written.
    pub len: usize,
    /// The IP header's TOS (IPv4) or traffic class (IPv6), DSCP and ECN
    /// bits: a UD send's address handle's, an RC/UC QP's path's
    /// (`ah_attr.grh.traffic_class`), as rxe writes them.
    pub tclass: u8,
    /// The IP TTL (IPv4) or hop limit (IPv6) of a datagram to a multicast
    /// group: its address handle's `grh.hop_limit`, which rxe writes into
    /// the header as it is (0 keeps the datagram on the host, as the
    /// kernel's `ip_mc_output` does). `None` for every unicast packet:
    /// they carry the route's hop limit (64 by default), as the kernel's
    /// do: it replaces a unicast address vector's hop limit with the
    /// route's when it resolves the address (`ib_resolve_unicast_gid_dmac`,
    /// for address handles and RC/UC paths alike), whatever the program
    /// asked for.
    pub hop_limit: Option<u8>,
}

/// What the receive path knows about a packet besides its bytes: the IP
/// header fields a UD receive buffer's GRH area reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxMeta {
    /// Sender's IP address.
    pub src: IpAddr,
    /// Sender's UDP source port (0 when unknown: the simulated network).
    pub src_port: u16,
    /// Our address the packet came to.
    pub dst: IpAddr,
    /// IPv4 identification (as solved while checking the ICRC; 0 when
    /// unknown or IPv6).
    pub ipv4_id: u16,
    /// IPv4 flags and fragment offset field (DF: 0x4000).
    pub ipv4_flags_frag: u16,
    /// TTL / hop limit as received (64 when the socket does not say).
    pub hop_limit: u8,
    /// Traffic class / TOS as received (IP_RECVTOS / IPV6_RECVTCLASS; 0
    /// when the socket does not say).
    pub tclass: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
}

impl RxMeta {
    /// Metadata for a packet from `src` to `dst` with defaults for the
    /// fields a plain UDP socket does not report.
    pub fn new(src: IpAddr, dst: IpAddr) -> RxMeta {
        RxMeta {
            src,
            src_port: 0,
            dst,
            ipv4_id: 0,
            ipv4_flags_frag: uroce_wire::icrc::IPV4_DF,
            hop_limit: 64,
            tclass: 0,
            flow_label: 0,
        }
    }
}

/// A QP's transport state machine, whatever its type. The engine and the
/// simulated network drive every QP through this.
pub trait QpMachine: Send + std::fmt::Debug {
    /// QP number.
    fn qpn(&self) -> u32;
    /// Transport type.
    fn qp_type(&self) -> QpType;
    /// Current state.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    fn state(&self) -> QpState;
    /// Current attributes (as `ibv_query_qp` reports them).
    fn attr(&self) -> QpAttr;
    /// Applies a modify-QP call (checked against the spec's table).
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError>;
    /// Takes one parsed, ICRC-checked packet addressed to this QP.
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>);
    /// Writes the next packet to send into `buf` (at least path MTU + 128
    /// bytes), or returns `None` when there is nothing to send now.
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit>;
    /// The next deadline.
    fn poll_timeout(&self) -> Option<Nanos>;
    /// Handles the passing of time (safe to call spuriously).
    fn handle_timeout(&mut self, now: Nanos);
    /// Request PSNs sent and not yet acknowledged (RC; 0 for transports
    /// that keep nothing in flight). The endpoint sums them into the
    /// device's in-flight budget.
    fn inflight(&self) -> u32 {
        0
    }
    /// The device's in-flight budget is spent: a QP that already has
    /// requests in flight sends no new request packets until it is lifted
    /// (responses, ACKs and a first request still go).
    fn set_throttled(&mut self, _on: bool) {}
    /// True when what the QP has to send now is at most ACKs and NAKs (no
    /// request, READ response or atomic ACK): output the engine may hold
    /// back for an application's next post to carry (`Driver::app_pass`).
    fn only_acks_to_send(&self) -> bool {
        false
    }
    /// What the QP counted of its own life (see [`core::QpTally`]).
    fn tally(&self) -> core::QpTally {
        core::QpTally::default()
    }
}

/// The one place a QP of a type is made: RC, UC or UD, in RESET, from its
/// configuration, once its capacities are checked against the device's
/// limits. The verbs layer, the simulator tests and the fuzz harness all
/// build QPs here.
pub fn new_qp(qp_type: QpType, cfg: QpConfig) -> Result<Box<dyn QpMachine>, CapError> {
    cfg.cap.check()?;
    Ok(match qp_type {
        QpType::Rc => Box::new(rc::RcQp::new(cfg)),
        QpType::Uc => Box::new(uc::UcQp::new(cfg)),
        QpType::Ud => Box::new(ud::UdQp::new(cfg)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_factory_checks_capacities() {
        use crate::qp_attr::{CapError, MAX_SGE};
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let mut cfg = crate::testing::config(ip, 0x10, 8);
            assert!(new_qp(t, cfg.clone()).is_ok());
            cfg.cap.max_send_sge = MAX_SGE + 1;
            let e = new_qp(t, cfg).unwrap_err();
            assert_eq!(
                e,
                CapError {
                    attr: "max_send_sge",
                    value: MAX_SGE + 1,
                    max: MAX_SGE
                }
            );
            assert_eq!(e.to_string(), "max_send_sge 33 exceeds the device's 32");
        }
    }
}
