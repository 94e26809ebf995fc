//! The device endpoint: every QP of one device address behind one sans-IO
//! interface, in the style of quinn-proto's `Endpoint`.
//!
//! Datagrams and time go in ([`Endpoint::handle_datagram`],
//! [`Endpoint::handle_timeout`]); datagrams come out
//! ([`Endpoint::poll_transmit`]), and so does the next deadline
//! ([`Endpoint::poll_timeout`]). Between them the endpoint does everything
//! the receive and send paths do above the socket: the ICRC check with the
//! sender's unknown IPv4 identification solved for, parsing, CNPs,
//! demultiplexing by destination QPN, the per-device counters, fair
//! round-robin transmission among the QPs that have something to send,
//! and a timer heap over the QPs' deadlines.
//!
//! Two drivers run this same code: the UDP engine (`engine`), which adds
//! the socket, the doorbell and the command channel, and the simulated
//! network (`net::sim`), which adds virtual time and faults. So every
//! simulator test exercises the production receive path.
//!
//! Completions and events leave through the sinks each QP was built with
//! (its CQs and the device's event queue, see `transport::QpConfig`).

use crate::counters::Counters;
use crate::observe::{self, Dir, Fact, PacketInfo, Topic};
use crate::transport::{Nanos, QpMachine, RxMeta, Transmit};
use crate::types::QpType;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use uroce_wire::icrc::{verify_unknown_ipv4_id_in_place, IpContext, HEADROOM, IPV4_DF};
use uroce_wire::packet;

/// Packets one QP sends in a row before the next QP with something to
/// send gets its turn.
pub const BURST: u32 = 32;
/// Stale timer entries allowed beyond two per QP before the heap is
/// rebuilt.
const TIMER_SLACK: usize = 64;
/// Request PSNs a device's QPs may have in flight together (its in-flight
/// budget): 4 MiB at a 4096-byte MTU, a quarter of what the peer engine's
/// receive buffer holds. One QP keeps at most 64; beyond 16 busy QPs the
/// budget, not the QPs' windows, bounds what a burst puts in the peer's
/// socket, so that hundreds of QPs do not overflow it (each overflow costs
/// a go-back-N resend).
pub const DEVICE_INFLIGHT_PSNS: u32 = 1024;

/// The destination QP number of a multicast packet (IBA 10.5.2.5: QP
/// 0xFFFFFF; rxe's `IB_MULTICAST_QPN`).
pub const MULTICAST_QPN: u32 = 0xff_ffff;
/// Multicast groups one device may have QPs attached to (rxe's
/// `RXE_MAX_MCAST_GRP`).
pub const MAX_MCAST_GRP: usize = 8192;
/// QPs one multicast group may have attached on one device (rxe's
/// `RXE_MAX_MCAST_QP_ATTACH`).
pub const MAX_MCAST_QP_ATTACH: usize = 56;
/// Attachments of all groups on one device together (rxe's
/// `RXE_MAX_TOT_MCAST_QP_ATTACH`).
pub const MAX_TOTAL_MCAST_QP_ATTACH: usize = 0x70000;

/// Why a multicast attach or detach was refused (the errno the kernel
/// answers is in each variant's doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum McastError {
    /// No such QP on the device (EINVAL).
    #[error("no QP {0:#x} on this device")]
    NoQp(u32),
    /// Only UD QPs join groups (EINVAL, as `ib_attach_mcast`).
    #[error("QP {0:#x} is not a UD QP")]
    NotUd(u32),
    /// The GID is not a multicast one (EINVAL, as `ib_attach_mcast`).
    #[error("{0} is not a multicast address")]
    NotMulticast(IpAddr),
    /// The GID is of the other IP version than the device (EINVAL).
    #[error("{0} is not of the device's IP version")]
    WrongFamily(IpAddr),
    /// Detach of a group the QP is not attached to (EINVAL, as
    /// `ib_uverbs_detach_mcast`).
    #[error("QP {qpn:#x} is not attached to {group}")]
    NotAttached {
        /// The QP.
        qpn: u32,
        /// The group.
        group: IpAddr,
    },
    /// The device has [`MAX_MCAST_GRP`] groups (ENOMEM).
    #[error("the device has max_mcast_grp ({MAX_MCAST_GRP}) groups")]
    TooManyGroups,
    /// The group has [`MAX_MCAST_QP_ATTACH`] QPs (ENOMEM).
    #[error("the group has max_mcast_qp_attach ({MAX_MCAST_QP_ATTACH}) QPs")]
    GroupFull,
    /// The device has [`MAX_TOTAL_MCAST_QP_ATTACH`] attachments (ENOMEM).
    #[error("the device has max_total_mcast_qp_attach ({MAX_TOTAL_MCAST_QP_ATTACH}) attachments")]
    TooManyAttachments,
}

impl McastError {
    /// The device attribute a limit error names.
    pub fn limit(&self) -> &'static str {
        match self {
            McastError::TooManyGroups => "max_mcast_grp",
            McastError::GroupFull => "max_mcast_qp_attach",
            McastError::TooManyAttachments => "max_total_mcast_qp_attach",
            _ => "",
        }
    }
}

/// What an attach or detach did to the device's set of groups: the
/// driver joins or leaves the group on the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupChange {
    /// The first QP of the device joined the group.
    Joined,
    /// The last QP of the device left the group.
    Left,
    /// The device's groups are as they were (another QP already was, or
    /// still is, attached; or this QP already was).
    Unchanged,
}

/// What a receiving socket reports of a datagram's IP header
/// (`IP_RECVTOS` and `IP_RECVTTL`, or `IPV6_RECVTCLASS` and
/// `IPV6_RECVHOPLIMIT`): a UD receive's GRH area shows them, as rxe copies
/// the header as it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxIp {
    /// TOS / traffic class (DSCP and ECN bits).
    pub tclass: u8,
    /// TTL / hop limit.
    pub hop_limit: u8,
}

impl Default for RxIp {
    /// What a socket that reports nothing is taken for: TOS 0, TTL 64.
    fn default() -> RxIp {
        RxIp {
            tclass: 0,
            hop_limit: 64,
        }
    }
}

/// The group of a multicast GID, as the IP address packets to it carry
/// (an IPv4-mapped GID is its IPv4 address).
pub fn mcast_group(gid: &[u8; 16]) -> IpAddr {
    std::net::Ipv6Addr::from(*gid).to_canonical()
}

/// A QP in the endpoint, with its scheduling state.
struct Slot {
    qp: Box<dyn QpMachine>,
    /// Queued in `Endpoint::dirty`.
    dirty: bool,
    /// Its request PSNs in flight, as last counted in the budget.
    inflight: u32,
    /// Listed in `Endpoint::throttled`.
    throttled: bool,
    /// The deadline last entered in `Endpoint::timers`.
    deadline: Option<Nanos>,
}

impl Slot {
    fn new(qp: Box<dyn QpMachine>) -> Slot {
        Slot {
            qp,
            dirty: false,
            inflight: 0,
            throttled: false,
            deadline: None,
        }
    }
}

/// What became of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxVerdict {
    /// Handed to its QP.
    Delivered,
    /// Not a RoCEv2 packet uroce can parse.
    Malformed,
    /// The ICRC did not match for any IPv4 identification.
    BadIcrc,
    /// A congestion notification packet (counted).
    Cnp,
    /// No QP with that number on this device.
    NoQp,
}

/// A received datagram's fate and the IP header fields the ICRC check
/// found, for captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxReport {
    /// What happened to it.
    pub verdict: RxVerdict,
    /// The IPv4 identification solved for and whether DF was set ((0,
    /// true) when unknown).
    pub ipv4_id: (u16, bool),
}

/// Every QP of one device address. See the module docs.
pub struct Endpoint {
    local_ip: IpAddr,
    /// By QPN, with FxHash: looked up for every packet, and its keys are
    /// this device's own QPNs (a peer chooses none of them, so a hash
    /// without a secret cannot be flooded).
    qps: FxHashMap<u32, Slot>,
    /// QPs that may have packets to send, each once, in the order they
    /// became so: only these are polled for output.
    dirty: VecDeque<u32>,
    /// The QP [`Endpoint::poll_transmit`] is draining, and how many
    /// packets it has sent in this turn.
    current: Option<(u32, u32)>,
    /// (deadline, QPN) of every QP's next timer; entries a QP's later
    /// reschedule made stale are skipped when they come up.
    timers: BinaryHeap<Reverse<(Nanos, u32)>>,
    counters: Arc<Counters>,
    /// Request PSNs in flight over all QPs (the sum of `Slot::inflight`).
    inflight: u32,
    /// QPs that found the budget spent when they were polled: queued for
    /// output again once it has room.
    throttled: Vec<u32>,
    /// The in-flight budget.
    budget: u32,
    /// The QPs attached to each multicast group, in attach order.
    groups: HashMap<IpAddr, Vec<u32>>,
    /// Attachments over all groups.
    attachments: usize,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Endpoint({}, {} QPs)", self.local_ip, self.qps.len())
    }
}

impl Endpoint {
    /// An endpoint for the device at `local_ip`, counting into `counters`.
    pub fn new(local_ip: IpAddr, counters: Arc<Counters>) -> Endpoint {
        Endpoint {
            local_ip,
            qps: FxHashMap::default(),
            dirty: VecDeque::new(),
            current: None,
            timers: BinaryHeap::new(),
            counters,
            inflight: 0,
            throttled: Vec::new(),
            budget: DEVICE_INFLIGHT_PSNS,
            groups: HashMap::new(),
            attachments: 0,
        }
    }

    /// Sets the device's in-flight budget (request PSNs of all its QPs
    /// together; see [`DEVICE_INFLIGHT_PSNS`]).
    #[cfg(any(test, feature = "testing"))]
    pub fn set_budget(&mut self, psns: u32) {
        self.budget = psns.max(1);
        self.release_throttled();
    }

    /// Request PSNs in flight over all QPs.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Recounts a QP's in-flight PSNs into the budget after something
    /// happened to it; frees throttled QPs if that made room.
    fn recount(&mut self, qpn: u32) {
        let Some(s) = self.qps.get_mut(&qpn) else {
            return;
        };
        let now = s.qp.inflight();
        let was = std::mem::replace(&mut s.inflight, now);
        self.inflight = self.inflight - was + now;
        if now < was {
            self.release_throttled();
        }
    }

    /// Queues the throttled QPs for output again if the budget has room.
    fn release_throttled(&mut self) {
        if self.inflight >= self.budget {
            return;
        }
        for qpn in std::mem::take(&mut self.throttled) {
            if let Some(s) = self.qps.get_mut(&qpn) {
                s.throttled = false;
            }
            self.mark(qpn);
        }
    }

    /// The device address.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }

    /// The device counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Adds a QP; a QP with the same number is replaced and returned.
    pub fn add_qp(&mut self, qp: Box<dyn QpMachine>) -> Option<Box<dyn QpMachine>> {
        let qpn = qp.qpn();
        let old = self.qps.insert(qpn, Slot::new(qp));
        if let Some(o) = &old {
            self.inflight -= o.inflight;
        }
        self.mark(qpn);
        old.map(|s| s.qp)
    }

    /// Removes a QP, detached from every multicast group (as the kernel
    /// detaches a QP destroyed while attached): see [`Endpoint::groups`]
    /// for the groups the device still has.
    pub fn remove_qp(&mut self, qpn: u32) -> Option<Box<dyn QpMachine>> {
        if self.current.is_some_and(|(q, _)| q == qpn) {
            self.current = None;
        }
        let s = self.qps.remove(&qpn)?;
        let attachments = &mut self.attachments;
        self.groups.retain(|_, qps| {
            let before = qps.len();
            qps.retain(|&q| q != qpn);
            *attachments -= before - qps.len();
            !qps.is_empty()
        });
        self.inflight -= s.inflight;
        self.release_throttled();
        Some(s.qp)
    }

    /// A QP, to look at.
    pub fn qp(&self, qpn: u32) -> Option<&(dyn QpMachine + 'static)> {
        self.qps.get(&qpn).map(|s| &*s.qp)
    }

    /// Every QP (QP1 included).
    pub fn qps(&self) -> impl Iterator<Item = &(dyn QpMachine + 'static)> + '_ {
        self.qps.values().map(|s| &*s.qp)
    }

    /// A QP, to change (modify, post to): it is queued for output, since
    /// the change may give it something to send or move its timers.
    pub fn qp_mut(&mut self, qpn: u32) -> Option<&mut (dyn QpMachine + 'static)> {
        self.mark(qpn);
        self.qps.get_mut(&qpn).map(|s| &mut *s.qp)
    }

    /// Attaches QP `qpn` (a UD QP) to the multicast group `group` (an
    /// IPv4 or IPv6 multicast address of the device's IP version), as
    /// `ibv_attach_mcast` with rxe's limits: a QP already attached stays
    /// so and the call succeeds (the kernel answers 0).
    pub fn attach_mcast(&mut self, group: IpAddr, qpn: u32) -> Result<GroupChange, McastError> {
        let group = group.to_canonical();
        let qp = self.qps.get(&qpn).ok_or(McastError::NoQp(qpn))?;
        if !group.is_multicast() {
            return Err(McastError::NotMulticast(group));
        }
        if qp.qp.qp_type() != QpType::Ud {
            return Err(McastError::NotUd(qpn));
        }
        if group.is_ipv4() != self.local_ip.to_canonical().is_ipv4() {
            return Err(McastError::WrongFamily(group));
        }
        let members = self.groups.get(&group);
        if members.is_some_and(|m| m.contains(&qpn)) {
            return Ok(GroupChange::Unchanged);
        }
        // rxe's order: the group first, then its QPs, then the total.
        if members.is_none() && self.groups.len() >= MAX_MCAST_GRP {
            return Err(McastError::TooManyGroups);
        }
        if members.is_some_and(|m| m.len() >= MAX_MCAST_QP_ATTACH) {
            return Err(McastError::GroupFull);
        }
        if self.attachments >= MAX_TOTAL_MCAST_QP_ATTACH {
            return Err(McastError::TooManyAttachments);
        }
        self.attachments += 1;
        let members = self.groups.entry(group).or_default();
        members.push(qpn);
        Ok(if members.len() == 1 {
            GroupChange::Joined
        } else {
            GroupChange::Unchanged
        })
    }

    /// Detaches QP `qpn` from `group` (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, group: IpAddr, qpn: u32) -> Result<GroupChange, McastError> {
        let group = group.to_canonical();
        if !self.qps.contains_key(&qpn) {
            return Err(McastError::NoQp(qpn));
        }
        let not_attached = McastError::NotAttached { qpn, group };
        let members = self.groups.get_mut(&group).ok_or(not_attached)?;
        let at = members.iter().position(|&q| q == qpn).ok_or(not_attached)?;
        members.remove(at);
        self.attachments -= 1;
        if members.is_empty() {
            self.groups.remove(&group);
            return Ok(GroupChange::Left);
        }
        Ok(GroupChange::Unchanged)
    }

    /// The multicast groups some QP of the device is attached to.
    #[cfg(any(test, feature = "testing"))]
    pub fn groups(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.groups.keys().copied()
    }

    /// The QPs attached to `group`, in attach order.
    pub fn group_members(&self, group: IpAddr) -> &[u32] {
        self.groups
            .get(&group.to_canonical())
            .map_or(&[], |m| m.as_slice())
    }

    /// Queues a QP for output (once): it has new work (a doorbell).
    pub fn mark(&mut self, qpn: u32) {
        if let Some(s) = self.qps.get_mut(&qpn) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push_back(qpn);
            }
        }
    }

    /// Queues every QP for output (a driver whose applications post
    /// without ringing a doorbell: the simulated network).
    #[cfg(any(test, feature = "testing"))]
    pub fn mark_all(&mut self) {
        for (&qpn, s) in self.qps.iter_mut() {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push_back(qpn);
            }
        }
    }

    /// Takes one received datagram from `from`: `buf` holds
    /// [`HEADROOM`] bytes of scratch space followed by the UDP payload (the
    /// ICRC is computed in place, in one pass). Verifies the ICRC (solving
    /// for an IPv4 sender's identification, which a UDP socket hides),
    /// parses and hands the packet to its QP. `ip` holds the IP header's
    /// fields the socket reported.
    #[cfg(any(test, feature = "testing"))]
    pub fn handle_datagram(
        &mut self,
        now: Nanos,
        from: SocketAddr,
        ip: RxIp,
        buf: &mut [u8],
    ) -> RxReport {
        self.handle_datagram_to(now, from, self.local_ip, ip, buf)
    }

    /// [`Endpoint::handle_datagram`] of a datagram sent to `to`: the
    /// device's address, or a multicast group it joined. A packet to
    /// [`MULTICAST_QPN`] sent to a group goes to every QP of the device
    /// attached to that group, each checking it as its own (rxe's
    /// `rxe_rcv_mcast_pkt`: QP state, P_Key and Q_Key per QP); one to
    /// another QPN is delivered by number, as rxe does.
    pub fn handle_datagram_to(
        &mut self,
        now: Nanos,
        from: SocketAddr,
        to: IpAddr,
        ip: RxIp,
        buf: &mut [u8],
    ) -> RxReport {
        let unknown = (0, true);
        if buf.len() < HEADROOM {
            Counters::inc(&self.counters.malformed_pkts);
            return RxReport {
                verdict: RxVerdict::Malformed,
                ipv4_id: unknown,
            };
        }
        let ctx = icrc_context(from, to);
        let verified = verify_unknown_ipv4_id_in_place(&ctx, buf);
        let ipv4_id = verified
            .as_ref()
            .map_or(unknown, |s| (s.ident, s.flags_frag & IPV4_DF != 0));
        let report = |verdict| RxReport { verdict, ipv4_id };
        let Ok(pkt) = packet::parse(&buf[HEADROOM..]) else {
            Counters::inc(&self.counters.malformed_pkts);
            return RxReport {
                verdict: RxVerdict::Malformed,
                ipv4_id: unknown,
            };
        };
        let Ok(id) = verified else {
            Counters::inc(&self.counters.icrc_errors);
            return report(RxVerdict::BadIcrc);
        };
        if pkt.info.operation == uroce_wire::Operation::Cnp {
            Counters::inc(&self.counters.cnp_rcvd);
            return report(RxVerdict::Cnp);
        }
        let mut meta = RxMeta::new(from.ip(), to);
        meta.src_port = from.port();
        meta.ipv4_id = id.ident;
        meta.ipv4_flags_frag = id.flags_frag;
        meta.tclass = ip.tclass;
        meta.hop_limit = ip.hop_limit;
        let qpn = pkt.bth.dest_qp;
        if qpn == MULTICAST_QPN {
            // A copy for each attached QP (none: the group is not joined
            // here, or not by that address).
            let group = to.to_canonical();
            if !group.is_multicast() || !self.groups.contains_key(&group) {
                Counters::inc(&self.counters.dropped_pkts);
                return report(RxVerdict::NoQp);
            }
            // By index: a QP's processing cannot change the groups.
            let mut i = 0;
            while let Some(&q) = self.groups.get(&group).and_then(|m| m.get(i)) {
                self.deliver(now, q, &meta, &pkt);
                i += 1;
            }
            return report(RxVerdict::Delivered);
        }
        if !self.deliver(now, qpn, &meta, &pkt) {
            Counters::inc(&self.counters.dropped_pkts);
            return report(RxVerdict::NoQp);
        }
        report(RxVerdict::Delivered)
    }

    /// Hands a parsed packet to QP `qpn` and queues the QP for output;
    /// false if there is no such QP.
    fn deliver(
        &mut self,
        now: Nanos,
        qpn: u32,
        meta: &RxMeta,
        pkt: &packet::ParsedPacket<'_>,
    ) -> bool {
        let Some(s) = self.qps.get_mut(&qpn) else {
            return false;
        };
        observe::tell(Topic::TIMELINE, || Fact::Packet {
            qpn,
            dir: Dir::Rx,
            pkt: PacketInfo::of(pkt),
        });
        s.qp.handle_packet(now, meta, pkt);
        if !s.dirty {
            s.dirty = true;
            self.dirty.push_back(qpn);
        }
        self.recount(qpn);
        true
    }

    /// The next packet to send, written into `buf` (path MTU + 128 bytes
    /// at least), or `None` once no QP has anything to send now. Each QP
    /// queued for output sends up to [`BURST`] packets in a row, then goes
    /// to the back of the queue if it has more: no QP starves the others,
    /// and a driver can batch each QP's run of packets.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        loop {
            let (qpn, sent) = match self.current {
                Some(c) => c,
                None => {
                    let qpn = self.dirty.pop_front()?;
                    if let Some(s) = self.qps.get_mut(&qpn) {
                        s.dirty = false;
                    }
                    (qpn, 0)
                }
            };
            self.current = None;
            let spent = self.inflight >= self.budget;
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if sent < BURST {
                slot.qp.set_throttled(spent);
                let t = slot.qp.poll_transmit(now, buf);
                let fresh = slot.qp.inflight();
                let was = std::mem::replace(&mut slot.inflight, fresh);
                self.inflight = self.inflight - was + fresh;
                if let Some(t) = t {
                    self.current = Some((qpn, sent + 1));
                    observe::tell_packet_bytes(qpn, Dir::Tx, &buf[..t.len]);
                    return Some(t);
                }
                if spent && fresh > 0 && !slot.throttled {
                    // It may have requests the budget held back.
                    slot.throttled = true;
                    self.throttled.push(qpn);
                }
            } else if !slot.dirty {
                // Its turn is over; it may have more.
                slot.dirty = true;
                self.dirty.push_back(qpn);
            }
            schedule(&mut self.timers, qpn, slot);
            compact_timers(&mut self.timers, &self.qps);
        }
    }

    /// The QP whose packet [`Endpoint::poll_transmit`] returned last
    /// (while it may send more).
    pub fn last_sender(&self) -> Option<u32> {
        self.current.map(|(q, _)| q)
    }

    /// Runs the QP timers that are due at `now`; their QPs are queued for
    /// output (and rescheduled there). Returns whether any QP's timer ran.
    pub fn handle_timeout(&mut self, now: Nanos) -> bool {
        let mut any = false;
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if slot.deadline != Some(t) {
                continue; // stale: the QP was rescheduled since
            }
            slot.deadline = None;
            if slot.qp.poll_timeout().is_some_and(|d| d <= now) {
                slot.qp.handle_timeout(now);
                any = true;
            }
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push_back(qpn);
            }
            self.recount(qpn);
        }
        any
    }

    /// The earliest QP deadline, as of the last time each QP was polled
    /// for output (every path that touches a QP queues it for that).
    pub fn poll_timeout(&mut self) -> Option<Nanos> {
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if self.qps.get(&qpn).is_some_and(|s| s.deadline == Some(t)) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }

    /// Whether some QP is queued for output.
    pub fn has_output(&self) -> bool {
        self.current.is_some() || !self.dirty.is_empty()
    }

    /// True when every QP with something to send has only ACKs and NAKs
    /// (see [`QpMachine::only_acks_to_send`]).
    pub fn only_acks_to_send(&self) -> bool {
        self.current
            .map(|(qpn, _)| qpn)
            .into_iter()
            .chain(self.dirty.iter().copied())
            .all(|qpn| self.qps.get(&qpn).is_none_or(|s| s.qp.only_acks_to_send()))
    }
}

/// Enters a QP's next deadline in the timer heap if it changed.
fn schedule(timers: &mut BinaryHeap<Reverse<(Nanos, u32)>>, qpn: u32, slot: &mut Slot) {
    let d = slot.qp.poll_timeout();
    if d != slot.deadline {
        slot.deadline = d;
        if let Some(t) = d {
            timers.push(Reverse((t, qpn)));
        }
    }
}

/// Keeps the timer heap bounded: every reschedule leaves a stale entry
/// behind until its time comes (an ACK stream moves a QP's deadline at
/// every ACK, so stale entries would grow with ACK rate x timeout). Once
/// the heap holds more than twice the QPs (plus slack), it is rebuilt from
/// the QPs' current deadlines: O(QPs) work after at least as many pushes,
/// so O(1) per push, and at most 2 x QPs + 64 entries.
fn compact_timers(timers: &mut BinaryHeap<Reverse<(Nanos, u32)>>, qps: &FxHashMap<u32, Slot>) {
    if timers.len() <= 2 * qps.len() + TIMER_SLACK {
        return;
    }
    *timers = qps
        .iter()
        .filter_map(|(&qpn, s)| s.deadline.map(|t| Reverse((t, qpn))))
        .collect();
}

/// The ICRC context of a datagram from `from` to our `local` address on
/// port 4791 (the IPv4 identification is solved for; see `wire::icrc`).
fn icrc_context(from: SocketAddr, local: IpAddr) -> IpContext {
    IpContext::between(from.ip(), local, from.port(), uroce_wire::ROCEV2_UDP_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::QpType;
    use std::sync::atomic::Ordering::Relaxed;

    /// A QP whose deadline moves at every ACK leaves a stale heap entry
    /// each time; the heap is rebuilt before it holds more than 2 x QPs +
    /// TIMER_SLACK entries, keeping each QP's current deadline.
    #[test]
    fn the_timer_heap_stays_bounded() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut qps = FxHashMap::default();
        for qpn in [1u32, 2] {
            let cfg = crate::testing::config(ip, qpn, 4);
            let qp = crate::transport::new_qp(QpType::Rc, cfg).unwrap();
            qps.insert(qpn, Slot::new(qp));
        }
        let mut timers = BinaryHeap::new();
        for i in 0..10_000u64 {
            let qpn = 1 + (i % 2) as u32;
            let t = Nanos(i);
            qps.get_mut(&qpn).unwrap().deadline = Some(t);
            timers.push(Reverse((t, qpn)));
            compact_timers(&mut timers, &qps);
            assert!(timers.len() <= 2 * qps.len() + TIMER_SLACK);
        }
        let mut left: Vec<_> = timers.into_iter().map(|Reverse(e)| e).collect();
        left.sort();
        // Every QP's current deadline is still there.
        assert!(left.contains(&(Nanos(9_998), 1)) && left.contains(&(Nanos(9_999), 2)));
    }

    /// Garbage, a packet with a broken ICRC and a packet for an unknown
    /// QP are each counted where they are dropped.
    #[test]
    fn drops_are_counted_by_reason() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let counters = Arc::new(Counters::default());
        let mut ep = Endpoint::new(ip, counters.clone());
        let from: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let mut buf = vec![0u8; HEADROOM + 3];
        let r = ep.handle_datagram(Nanos(0), from, RxIp::default(), &mut buf);
        assert_eq!(r.verdict, RxVerdict::Malformed);
        // A valid SEND ONLY to QP 0x11 built by a QP config's emitter.
        let cfg = crate::testing::config("10.0.0.2".parse().unwrap(), 0x22, 4);
        let h = uroce_wire::packet::Headers::new(uroce_wire::BthRepr {
            opcode: uroce_wire::Opcode::RC_SEND_ONLY,
            dest_qp: 0x11,
            pkey: 0xffff,
            ..Default::default()
        });
        let mut pkt = vec![0u8; 256];
        let n = cfg.emit(ip, &h, 8, &mut pkt, |p| {
            p.fill(7);
            true
        });
        let n = n.expect("emit");
        let mut buf = vec![0u8; HEADROOM + n];
        buf[HEADROOM..].copy_from_slice(&pkt[..n]);
        let r = ep.handle_datagram(Nanos(0), from, RxIp::default(), &mut buf);
        assert_eq!(r.verdict, RxVerdict::NoQp);
        assert_eq!(r.ipv4_id, (0, true));
        buf[HEADROOM + 20] ^= 1; // payload bit: the ICRC no longer matches
        let r = ep.handle_datagram(Nanos(0), from, RxIp::default(), &mut buf);
        assert_eq!(r.verdict, RxVerdict::BadIcrc);
        assert_eq!(counters.malformed_pkts.load(Relaxed), 1);
        assert_eq!(counters.dropped_pkts.load(Relaxed), 1);
        assert_eq!(counters.icrc_errors.load(Relaxed), 1);
    }
}
