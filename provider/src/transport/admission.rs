//! Admission of packets to a QP, before any transport looks at them
//! (IBA 9.6, packet header validation): the QP's partition, the connected
//! peer's address (and, in strict mode, its UDP source port), the reasons
//! a packet is dropped and counted, and the detector of PSN sweeps.

use super::{Nanos, QpConfig, RxMeta};
use crate::counters::Counters;
use crate::events::EventType;
use std::net::IpAddr;
use uroce_wire::packet::ParsedPacket;
use uroce_wire::{Psn, Transport};

/// Request PSNs further than this from the expected PSN, ahead or behind,
/// are out of window: no real requester has that many PSNs in flight
/// (rxe keeps at most 128 unacknowledged, uroce 64; 2^14 packets are 64 MiB
/// at a 4 KiB MTU), so such packets come from a PSN sweep or a broken
/// peer. They are still handled as the spec says (a sequence NAK once per
/// gap, a duplicate acknowledged); they are counted, and a rate of them
/// is reported.
pub const PLAUSIBLE_PSN_WINDOW: u32 = 1 << 14;
/// Out-of-window packets within [`SWEEP_PERIOD_NS`] that make a QP report
/// [`EventType::PsnSweep`].
pub const SWEEP_THRESHOLD: u32 = 64;
/// The period over which out-of-window packets are counted (1 s).
pub const SWEEP_PERIOD_NS: u64 = 1_000_000_000;

/// Watches a QP's request PSNs for a sweep (see [`PLAUSIBLE_PSN_WINDOW`]).
#[derive(Debug, Default, Clone)]
pub struct SweepDetector {
    since: Nanos,
    count: u32,
    reported: bool,
}

impl SweepDetector {
    /// Notes a request at `psn` when `expected` was expected: counts it in
    /// `psn_out_of_window` when it is out of window, and reports
    /// `PsnSweep` for the QP the first time a period's count passes
    /// [`SWEEP_THRESHOLD`].
    pub fn note(&mut self, now: Nanos, psn: Psn, expected: Psn, cfg: &QpConfig) {
        let d = psn.distance_from(expected).min(expected.distance_from(psn));
        if d <= PLAUSIBLE_PSN_WINDOW {
            return;
        }
        Counters::inc(&cfg.counters.psn_out_of_window);
        if now.0.saturating_sub(self.since.0) >= SWEEP_PERIOD_NS {
            self.since = now;
            self.count = 0;
            self.reported = false;
        }
        self.count += 1;
        if self.count > SWEEP_THRESHOLD && !self.reported {
            self.reported = true;
            Counters::inc(&cfg.counters.psn_sweeps);
            cfg.event(EventType::PsnSweep);
        }
    }
}

/// Why a packet was not admitted to a QP: dropped and counted, nothing
/// else happens (IBA 9.6: packets failing header validation are silently
/// dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// The QP's state does not take it, or it is of another transport.
    BadState,
    /// Not from the connected peer's address (or, in strict mode, its
    /// UDP source port).
    WrongSource,
    /// Not the QP's partition.
    BadPkey,
    /// A new request while the QP's deferred-request queue is full.
    DeferredFull,
    /// A duplicate READ or atomic that matches no responder resource.
    UnmatchedDuplicate,
}

impl Drop {
    /// Counts the drop: `dropped_pkts` and the reason's own counter.
    pub fn count(self, c: &Counters) {
        Counters::inc(&c.dropped_pkts);
        Counters::inc(match self {
            Drop::BadState => &c.drop_bad_state,
            Drop::WrongSource => &c.drop_wrong_source,
            Drop::BadPkey => &c.drop_bad_pkey,
            Drop::DeferredFull => &c.drop_deferred_full,
            Drop::UnmatchedDuplicate => &c.drop_unmatched_duplicate,
        });
    }
}

/// The partition every QP is in (the default P_Key, full membership).
pub const PKEY: u16 = 0xffff;

/// The P_Key check (IBA 9.6, header validation): the partition bits
/// must match ours.
pub fn pkey_matches(pkey: u16) -> bool {
    pkey & 0x7fff == PKEY & 0x7fff
}

/// The connected peer of an RC or UC QP as admission sees it: its address,
/// and in strict mode the UDP source port its first accepted packet came
/// from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerPin {
    /// The pinned source port, once a packet was accepted (strict mode).
    pub port: Option<u16>,
}

impl PeerPin {
    /// Admission of a packet to a connected QP (RC, UC): a state that
    /// receives, the QP's transport, the connected peer's address (and,
    /// pinned, its port), the QP's partition.
    pub fn admit(
        &self,
        receiving: bool,
        peer: IpAddr,
        transport: Transport,
        meta: &RxMeta,
        pkt: &ParsedPacket<'_>,
    ) -> Result<(), Drop> {
        if !receiving || pkt.info.transport != transport {
            return Err(Drop::BadState);
        }
        if meta.src.to_canonical() != peer.to_canonical()
            || self.port.is_some_and(|p| p != meta.src_port)
        {
            return Err(Drop::WrongSource);
        }
        if !pkey_matches(pkt.bth.pkey) {
            return Err(Drop::BadPkey);
        }
        Ok(())
    }

    /// After a packet that moved the QP forward (an expected request, a
    /// response that acknowledged something): in strict mode, the peer's
    /// source port is pinned from then on.
    pub fn accepted(&mut self, strict: bool, meta: &RxMeta) {
        if strict && self.port.is_none() {
            self.port = Some(meta.src_port);
        }
    }
}
