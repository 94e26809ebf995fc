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

pub mod core;
pub mod rc;
pub mod sgl;
pub mod status;
pub mod uc;
pub mod ud;

pub use self::core::QpCore;
use crate::counters::Counters;
use crate::cq::CqInner;
use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventType};
use crate::memory::{KeyTable, PdId};
use crate::qp_attr::{AttrMask, CapError, ModifyError, QpAttr};
use crate::qp_attr::{ModifyLimits, QpCap};
use crate::types::{QpState, QpType, RecvWr, SendWr};
use crate::types::{Wc, WcOpcode, WcStatus};
use uroce_wire::icrc::IpContext;
use uroce_wire::packet::{self, Headers};

/// `ip` as an IPv6 address (IPv4-mapped for IPv4).
pub fn to_v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
use crossbeam::queue::ArrayQueue;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use uroce_wire::packet::ParsedPacket;
use uroce_wire::{Psn, Transport};

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
    /// Traffic class / TOS as received.
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
}

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

/// The payload length rule for a request packet, the same for RC and UC
/// (IBA ch. 9.7, the responder's length checks): every packet but the last of a message carries exactly the
/// path MTU; the last carries 1 to MTU bytes; an only packet 0 to MTU.
pub fn payload_length_ok(position: uroce_wire::Position, len: usize, mtu: usize) -> bool {
    use uroce_wire::Position;
    match position {
        Position::First | Position::Middle => len == mtu,
        Position::Last => (1..=mtu).contains(&len),
        Position::Only => len <= mtu,
    }
}

/// A QP's state as the machine last set it, readable from any thread: the
/// verbs layer checks posts against it instead of mirroring modify calls
/// (the engine moves a QP to ERR or SQE on its own).
#[derive(Debug, Default)]
pub struct StateCell(AtomicU32);

impl StateCell {
    /// The state.
    pub fn get(&self) -> QpState {
        QpState::from_u32(self.0.load(Ordering::Acquire)).unwrap_or(QpState::Err)
    }
    /// Publishes a new state (the machine does, whenever it changes).
    pub fn set(&self, s: QpState) {
        self.0.store(s as u32, Ordering::Release);
    }
}

/// What a QP is built from.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// The QP number.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: PdId,
    /// The context's key table.
    pub keys: Arc<KeyTable>,
    /// Send completions go here.
    pub send_cq: Arc<CqInner>,
    /// Receive completions go here.
    pub recv_cq: Arc<CqInner>,
    /// Posted send WRs.
    pub sq: Arc<SendQueue>,
    /// Posted receive WRs (or the SRQ's).
    pub rq: Arc<RecvQueue>,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Capacities.
    pub cap: QpCap,
    /// The device's address.
    pub local_ip: IpAddr,
    /// UDP source port of our packets.
    pub src_port: u16,
    /// Device counters.
    pub counters: Arc<Counters>,
    /// Device limits for modify checks.
    pub limits: ModifyLimits,
    /// The device's asynchronous event queue.
    pub events: Arc<AsyncEvents>,
    /// Strict mode: an RC or UC QP also pins the peer's UDP source port
    /// after the first packet that moved it forward, and drops packets
    /// from other ports (an on-path attacker must then also match it).
    /// Off by default: RoCEv2 lets a peer pick any source port per QP, and
    /// some change it (path migration, rate limiting by flow).
    pub strict_source_port: bool,
    /// Where the machine publishes its state.
    pub state: Arc<StateCell>,
}

impl QpConfig {
    /// The ICRC context of packets we send to `dst` (UDP from our port to
    /// 4791; for IPv4 the header our socket produces: DF, ID 0).
    pub fn ip_context(&self, dst: IpAddr) -> IpContext {
        IpContext::between(
            self.local_ip,
            dst,
            self.src_port,
            uroce_wire::ROCEV2_UDP_PORT,
        )
    }

    /// Writes headers + payload (filled by `fill`, which may refuse) + pad
    /// + ICRC for `dst` into `buf`; returns the length.
    pub fn emit(
        &self,
        dst: IpAddr,
        h: &Headers,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<usize> {
        let hdr = packet::emit_headers(h, payload_len, buf).ok()?;
        if !fill(&mut buf[hdr..hdr + payload_len]) {
            return None;
        }
        packet::finish(buf, hdr, payload_len, &self.ip_context(dst)).ok()
    }

    /// The local buffers of a send WR that reads only its own memory (UC
    /// and UD sends; RC checks per opcode): the inline bytes, or the SGEs
    /// resolved against the key table (a bad one is a local protection
    /// error). Returns them with the message length.
    pub fn send_buffers(&self, wr: &SendWr) -> Result<(sgl::Resolved, u64), WcStatus> {
        if wr.flags.contains(crate::types::SendFlags::INLINE) {
            return Ok((sgl::Resolved::default(), wr.inline_data.len() as u64));
        }
        let r = sgl::Resolved::resolve(
            &self.keys,
            self.pd,
            &wr.sg_list,
            crate::types::Access::empty(),
        )
        .map_err(|_| WcStatus::LocProtErr)?;
        let len = r.total();
        Ok((r, len))
    }

    /// Executes a local operation (BIND_MW, LOCAL_INV) for this QP. A
    /// refused one gives rxe's status: MW_BIND_ERR for a bind,
    /// LOC_QP_OP_ERR for an invalidation.
    pub fn execute_local(&self, wr: &SendWr) -> Result<(), WcStatus> {
        match (wr.opcode, &wr.bind) {
            (crate::types::WrOpcode::BindMw, Some(b)) => self
                .keys
                .bind_mw(b, self.pd, self.qpn)
                .map(|_| ())
                .map_err(|_| WcStatus::MwBindErr),
            (crate::types::WrOpcode::BindMw, None) => Err(WcStatus::MwBindErr),
            (crate::types::WrOpcode::LocalInv, _) => self
                .keys
                .invalidate_rkey(wr.invalidate_rkey, self.pd, self.qpn, false)
                .map_err(|_| WcStatus::LocQpOpErr),
            _ => Err(WcStatus::LocQpOpErr),
        }
    }

    /// Completes every WR waiting in the send queue with WR_FLUSH_ERR, in
    /// posting order. Returns false if a completion was lost to a full CQ.
    pub fn flush_sends(&self) -> bool {
        let mut ok = true;
        while let Some(wr) = self.sq.take() {
            self.sq.retire(1);
            let wc = Wc::new(
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.opcode.wc_opcode(),
                self.qpn,
            );
            ok &= self.complete(true, wc, false);
        }
        ok
    }

    /// In ERR: every WR waiting in the send queue and in the QP's own
    /// receive queue completes with WR_FLUSH_ERR, in posting order. An
    /// SRQ's WRs belong to every QP attached to it: they stay.
    pub fn flush_posted(&self) {
        self.flush_sends();
        if self.rq.is_srq() {
            return;
        }
        while let Some(wr) = self.rq.take() {
            let wc = Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            let _ = self.complete(false, wc, false);
        }
    }

    /// True when [`QpConfig::flush_posted`] has WRs to flush.
    pub fn has_posted(&self) -> bool {
        self.sq.has_pending() || (!self.rq.is_srq() && !self.rq.is_empty())
    }

    /// To RESET: WRs waiting in the send queue and the QP's own receive
    /// queue are discarded without completions (an SRQ keeps its WRs).
    pub fn discard_posted(&self) {
        while self.sq.take().is_some() {
            self.sq.retire(1);
        }
        if !self.rq.is_srq() {
            while self.rq.take().is_some() {}
        }
        // Completions of the QP's previous life go too (see
        // CqInner::remove_qp).
        self.send_cq.remove_qp(self.qpn);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.remove_qp(self.qpn);
        }
    }

    /// Entering ERR: a QP on an SRQ reports that it takes no more WQEs
    /// from it (LAST_WQE_REACHED).
    pub fn report_last_wqe(&self) {
        if self.rq.is_srq() {
            self.event(EventType::QpLastWqeReached);
        }
    }

    /// Adds a completion to the send or the receive CQ (`solicited`: a
    /// receive completion of a message with the SE bit). Returns false if
    /// the CQ overflowed: the QP must then go to ERR and report QP_FATAL
    /// (once: not when already in ERR); the CQ reports CQ_ERR itself.
    #[must_use]
    pub fn complete(&self, send: bool, wc: Wc, solicited: bool) -> bool {
        let cq = if send { &self.send_cq } else { &self.recv_cq };
        if cq.push_notify(wc, solicited) {
            return true;
        }
        Counters::inc(&self.counters.cq_overflows);
        false
    }

    /// Reports an asynchronous event about this QP.
    pub fn event(&self, event_type: EventType) {
        self.events.push(AsyncEvent {
            event_type,
            element: EventElement::Qp(self.qpn),
        });
    }
}

/// Why posting a work request failed (errno-like, as verbs reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue is full (ENOMEM).
    #[error("work queue full")]
    QueueFull,
    /// The QP's state does not allow posting (EINVAL).
    #[error("QP state does not allow posting")]
    BadState,
    /// The WR is malformed: too many SGEs, inline too long, bad opcode for
    /// the QP type, ... (EINVAL).
    #[error("invalid work request: {0}")]
    Invalid(&'static str),
}

/// The send queue shared by the posting threads and the engine.
#[derive(Debug)]
pub struct SendQueue {
    queue: ArrayQueue<SendWr>,
    outstanding: AtomicU32,
    max: u32,
}

impl SendQueue {
    /// A queue of `max` WRs (at least 1).
    pub fn new(max: u32) -> SendQueue {
        let max = max.max(1);
        SendQueue {
            queue: ArrayQueue::new(max as usize),
            outstanding: AtomicU32::new(0),
            max,
        }
    }
    /// Depth.
    pub fn capacity(&self) -> u32 {
        self.max
    }
    /// Posts a WR. A WR occupies its slot until it completes (or, when
    /// unsignaled, until a later completion retires it).
    pub fn post(&self, wr: SendWr) -> Result<(), PostError> {
        if self.outstanding.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(PostError::QueueFull);
        }
        // Cannot fail: the queue holds `max` and at most `max` are posted.
        self.queue.push(wr).map_err(|_| PostError::QueueFull)
    }
    /// The engine takes the next posted WR.
    pub fn take(&self) -> Option<SendWr> {
        self.queue.pop()
    }
    /// True when WRs wait to be taken.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }
    /// The engine retires `n` WRs (completed or flushed).
    pub fn retire(&self, n: u32) {
        self.outstanding.fetch_sub(n, Ordering::AcqRel);
    }
    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// The receive queue (or an SRQ's queue) shared by posting threads and the
/// engine.
#[derive(Debug)]
pub struct RecvQueue {
    queue: ArrayQueue<RecvWr>,
    srq: Option<SrqHook>,
}

/// What makes a receive queue a shared receive queue: its handle, its
/// limit, and where the limit event goes.
#[derive(Debug)]
struct SrqHook {
    handle: u32,
    /// `srq_limit`: 0 when disarmed.
    limit: AtomicU32,
    events: Arc<AsyncEvents>,
}

impl RecvQueue {
    /// A queue of `max` WRs (at least 1).
    pub fn new(max: u32) -> RecvQueue {
        RecvQueue {
            queue: ArrayQueue::new(max.max(1) as usize),
            srq: None,
        }
    }
    /// A shared receive queue of `max` WRs with handle `handle`; when armed
    /// (see [`RecvQueue::arm_limit`]) it reports `SRQ_LIMIT_REACHED` to
    /// `events`.
    pub fn new_srq(max: u32, handle: u32, events: Arc<AsyncEvents>) -> RecvQueue {
        RecvQueue {
            queue: ArrayQueue::new(max.max(1) as usize),
            srq: Some(SrqHook {
                handle,
                limit: AtomicU32::new(0),
                events,
            }),
        }
    }
    /// True for a shared receive queue.
    pub fn is_srq(&self) -> bool {
        self.srq.is_some()
    }
    /// The SRQ's handle (0 for a QP's own receive queue).
    pub fn srq_handle(&self) -> u32 {
        self.srq.as_ref().map_or(0, |h| h.handle)
    }
    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0
    /// disarms): once the engine takes a WR that leaves fewer than `limit`
    /// waiting, one `SRQ_LIMIT_REACHED` event is reported and the limit
    /// disarms. Returns false for a QP's own receive queue.
    pub fn arm_limit(&self, limit: u32) -> bool {
        match &self.srq {
            Some(h) => {
                h.limit.store(limit, Ordering::Release);
                true
            }
            None => false,
        }
    }
    /// The armed limit (0: disarmed).
    pub fn limit(&self) -> u32 {
        self.srq
            .as_ref()
            .map_or(0, |h| h.limit.load(Ordering::Acquire))
    }
    /// Depth.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }
    /// Posts a receive WR.
    pub fn post(&self, wr: RecvWr) -> Result<(), PostError> {
        self.queue.push(wr).map_err(|_| PostError::QueueFull)
    }
    /// The engine takes the next receive WR.
    pub fn take(&self) -> Option<RecvWr> {
        let wr = self.queue.pop()?;
        if let Some(h) = &self.srq {
            let limit = h.limit.load(Ordering::Acquire);
            if limit != 0
                && (self.queue.len() as u32) < limit
                && h.limit
                    .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                h.events.push(AsyncEvent {
                    event_type: EventType::SrqLimitReached,
                    element: EventElement::Srq(h.handle),
                });
            }
        }
        Some(wr)
    }
    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn srq_limit_fires_once_when_count_drops_below() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let q = RecvQueue::new_srq(8, 42, ev.clone());
        for i in 0..4 {
            q.post(RecvWr {
                wr_id: i,
                ..RecvWr::default()
            })
            .unwrap();
        }
        assert!(q.arm_limit(3));
        q.take().unwrap(); // 3 left: not below 3
        assert!(ev.get(Some(Duration::ZERO)).is_none());
        q.take().unwrap(); // 2 left: fires, disarms
        let e = ev.get(Some(Duration::ZERO)).unwrap();
        assert_eq!(e.event_type, EventType::SrqLimitReached);
        assert_eq!(e.element, EventElement::Srq(42));
        assert_eq!(q.limit(), 0);
        q.take().unwrap();
        assert!(ev.get(Some(Duration::ZERO)).is_none());
        assert!(!RecvQueue::new(4).arm_limit(1));
    }

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
