//! A deterministic in-memory network with virtual time and fault
//! injection, driving the same device [`Endpoint`]s as the UDP engine:
//! every delivered packet takes the production receive path (the ICRC
//! check that solves for the sender's IPv4 identification, parsing,
//! demultiplexing, counters) and every sent one the production scheduler.
//!
//! Every packet the QPs emit is delivered after a configurable delay (plus
//! jitter, which reorders), or lost, duplicated or corrupted, as a seeded
//! RNG decides; a scripted filter can drop or alter chosen packets. Time
//! only moves when nothing else can happen: to the next delivery or the
//! next QP deadline. A run is a pure function of its seed.

use crate::counters::Counters;
use crate::endpoint::{Endpoint, GroupChange, McastError, RxIp};
use crate::net::faults::FaultInjector;
pub use crate::net::faults::Faults;
use crate::transport::{Nanos, QpMachine};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use uroce_wire::icrc::HEADROOM;
use uroce_wire::packet::{self, ParsedPacket};

/// What a scripted filter does with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Deliver normally (random faults still apply).
    Pass,
    /// Drop it.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver it after this much extra delay.
    Delay(u64),
}

/// A packet in flight, as the filter sees it.
#[derive(Debug)]
pub struct Wire<'a> {
    /// Sender.
    pub src: IpAddr,
    /// Receiver.
    pub dst: IpAddr,
    /// Parsed packet.
    pub pkt: &'a ParsedPacket<'a>,
    /// The IP header's TOS / traffic class.
    pub tclass: u8,
    /// Index of this packet among all sent (0-based).
    pub index: u64,
}

type Filter = Box<dyn FnMut(&Wire<'_>) -> Verdict + Send>;

struct InFlight {
    src: IpAddr,
    dst: IpAddr,
    ip: RxIp,
    bytes: Vec<u8>,
}

/// A delivered packet: (time, source, destination, UDP payload).
pub type Traced = (Nanos, IpAddr, IpAddr, Vec<u8>);

/// One direction of a link with settings of its own.
struct Link {
    src: IpAddr,
    dst: IpAddr,
    faults: Option<FaultInjector>,
    /// Largest UDP payload + IP/UDP headers the link carries (IP MTU).
    mtu: Option<usize>,
    /// Everything sent in `[from, until)` is lost.
    black_holes: Vec<(Nanos, Nanos)>,
    /// Bytes per second the sender puts on this link, if limited.
    rate: Option<u64>,
    /// When the link finishes sending what is queued on it.
    free_at: Nanos,
}

/// Identifies a QP in the network.
pub type QpId = usize;

/// The simulated network.
pub struct SimNet {
    now: Nanos,
    faults: FaultInjector,
    /// Per-link settings, by (source, destination); links not named here
    /// use `faults`.
    links: Vec<Link>,
    filter: Option<Filter>,
    /// One endpoint per device address.
    endpoints: Vec<Endpoint>,
    /// Each QP's endpoint (an index) and number.
    ids: Vec<(usize, u32)>,
    queue: BinaryHeap<Reverse<(Nanos, u64, usize)>>,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    seq: u64,
    sent: u64,
    buf: Vec<u8>,
    rbuf: Vec<u8>,
    counters: Arc<Counters>,
    /// Every packet delivered, for captures.
    pub trace: Option<Vec<Traced>>,
}

impl SimNet {
    /// A network with a seed and random faults. The links have at least
    /// 2 µs of delay.
    pub fn new(seed: u64, faults: Faults) -> SimNet {
        let faults = Faults {
            delay_ns: faults.delay_ns.max(2_000),
            ..faults
        };
        SimNet {
            now: Nanos(0),
            links: Vec::new(),
            faults: FaultInjector::new(Faults { seed, ..faults }),
            filter: None,
            endpoints: Vec::new(),
            ids: Vec::new(),
            queue: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
            sent: 0,
            buf: vec![0u8; 4096 + 256],
            rbuf: vec![0u8; HEADROOM + 4096 + 256],
            counters: Arc::new(Counters::default()),
            trace: None,
        }
    }
    /// Virtual time now.
    pub fn now(&self) -> Nanos {
        self.now
    }
    /// Counters of the network and its endpoints (ICRC errors, unknown
    /// QPs, ...).
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    /// Changes the random faults.
    pub fn set_faults(&mut self, f: Faults) {
        let seed = self.faults.faults().seed;
        self.faults = FaultInjector::new(Faults { seed, ..f });
    }
    /// Installs a scripted filter (replacing any other).
    pub fn set_filter(&mut self, f: impl FnMut(&Wire<'_>) -> Verdict + Send + 'static) {
        self.filter = Some(Box::new(f));
    }
    fn link(&mut self, src: IpAddr, dst: IpAddr) -> &mut Link {
        let i = match self.links.iter().position(|l| l.src == src && l.dst == dst) {
            Some(i) => i,
            None => {
                self.links.push(Link {
                    src,
                    dst,
                    faults: None,
                    mtu: None,
                    black_holes: Vec::new(),
                    rate: None,
                    free_at: Nanos(0),
                });
                self.links.len() - 1
            }
        };
        &mut self.links[i]
    }

    /// Gives the link from `src` to `dst` faults of its own (the seed is
    /// taken from `f`).
    pub fn set_link_faults(&mut self, src: IpAddr, dst: IpAddr, f: Faults) {
        let f = Faults {
            delay_ns: f.delay_ns.max(2_000),
            ..f
        };
        self.link(src, dst).faults = Some(FaultInjector::new(f));
    }

    /// Limits the IP packets the link from `src` to `dst` carries to
    /// `mtu` bytes (IP + UDP headers + RoCE packet); larger ones are lost,
    /// as on a link with DF set.
    pub fn set_link_mtu(&mut self, src: IpAddr, dst: IpAddr, mtu: usize) {
        self.link(src, dst).mtu = Some(mtu);
    }

    /// Limits what `src` sends to `dst` to `bytes_per_sec`: packets queue
    /// behind each other (without bound) before their delay starts. A
    /// slow sender, as kernel rxe in an emulated guest (a few thousand
    /// packets a second), whose answers to later requests wait behind
    /// what it still has to send for earlier ones. Packets lost on the
    /// way take their time on the link too.
    pub fn set_link_rate(&mut self, src: IpAddr, dst: IpAddr, bytes_per_sec: u64) {
        self.link(src, dst).rate = Some(bytes_per_sec.max(1));
    }

    /// Loses everything sent from `src` to `dst` between `from_ns` and
    /// `until_ns` (virtual time).
    pub fn black_hole(&mut self, src: IpAddr, dst: IpAddr, from_ns: u64, until_ns: u64) {
        self.link(src, dst)
            .black_holes
            .push((Nanos(from_ns), Nanos(until_ns)));
    }

    /// Removes the scripted filter.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }
    /// Attaches a QP at address `ip`.
    pub fn add(&mut self, ip: IpAddr, qp: impl QpMachine + 'static) -> QpId {
        self.add_boxed(ip, Box::new(qp))
    }
    /// Attaches a boxed QP at address `ip` (to the endpoint of that
    /// address, made on first use).
    ///
    /// # Panics
    /// If a QP with the same number is already at `ip` (a broken test).
    pub fn add_boxed(&mut self, ip: IpAddr, qp: Box<dyn QpMachine>) -> QpId {
        let e = match self.endpoints.iter().position(|e| e.local_ip() == ip) {
            Some(e) => e,
            None => {
                self.endpoints
                    .push(Endpoint::new(ip, self.counters.clone()));
                self.endpoints.len() - 1
            }
        };
        let qpn = qp.qpn();
        assert!(
            self.endpoints[e].add_qp(qp).is_none(),
            "two QPs numbered {qpn:#x} at {ip}"
        );
        self.ids.push((e, qpn));
        self.ids.len() - 1
    }
    /// A QP (queued for output: the caller may post to it or modify it).
    pub fn qp(&mut self, id: QpId) -> &mut dyn QpMachine {
        let (e, qpn) = self.ids[id];
        self.endpoints[e].qp_mut(qpn).expect("a QP of this network")
    }
    /// Attaches a QP to a multicast group (see
    /// [`Endpoint::attach_mcast`]): packets sent to the group reach it.
    pub fn attach_mcast(&mut self, id: QpId, group: IpAddr) -> Result<GroupChange, McastError> {
        let (e, qpn) = self.ids[id];
        self.endpoints[e].attach_mcast(group, qpn)
    }
    /// Detaches a QP from a multicast group.
    pub fn detach_mcast(&mut self, id: QpId, group: IpAddr) -> Result<GroupChange, McastError> {
        let (e, qpn) = self.ids[id];
        self.endpoints[e].detach_mcast(group, qpn)
    }
    /// Sets the in-flight budget of the device at `ip` (see
    /// [`crate::endpoint::DEVICE_INFLIGHT_PSNS`]).
    pub fn set_budget(&mut self, ip: IpAddr, psns: u32) {
        if let Some(e) = self.endpoints.iter_mut().find(|e| e.local_ip() == ip) {
            e.set_budget(psns);
        }
    }
    /// Request PSNs the device at `ip` has in flight over all its QPs.
    pub fn inflight(&self, ip: IpAddr) -> u32 {
        self.endpoints
            .iter()
            .find(|e| e.local_ip() == ip)
            .map_or(0, |e| e.inflight())
    }
    /// Puts a packet of our own making on the wire (a hostile or broken
    /// peer), delivered after the usual delay.
    pub fn inject(&mut self, src: IpAddr, dst: IpAddr, bytes: Vec<u8>) {
        self.launch(src, dst, RxIp::default(), bytes);
    }

    /// Delivers every packet due now (an injected packet on a link
    /// without delay is), before any QP transmits again: a driver that
    /// injects a packet and then posts work sees the packet handled
    /// first, in the order it did the two. Returns whether any was.
    pub fn deliver_due(&mut self) -> bool {
        let mut any = false;
        while let Some(Reverse((t, _, slot))) = self.queue.peek().copied() {
            if t > self.now {
                break;
            }
            self.queue.pop();
            if let Some(p) = self.slots[slot].take() {
                self.free.push(slot);
                self.deliver(p);
                any = true;
            }
        }
        any
    }

    /// Packets sent so far.
    pub fn packets_sent(&self) -> u64 {
        self.sent
    }

    /// Lets every QP transmit, delivers what is due, and if nothing
    /// happened advances time to the next event. Returns false when the
    /// network is idle (nothing in flight, no deadline).
    pub fn step(&mut self) -> bool {
        let mut progressed = self.transmit_all();
        progressed |= self.deliver_due();
        // Timers.
        let now = self.now;
        for e in &mut self.endpoints {
            progressed |= e.handle_timeout(now);
        }
        if progressed {
            return true;
        }
        let next_pkt = self.queue.peek().map(|Reverse((t, _, _))| *t);
        let next_timer = self
            .endpoints
            .iter_mut()
            .filter_map(|e| e.poll_timeout())
            .min();
        match (next_pkt, next_timer) {
            (None, None) => false,
            (a, b) => {
                let t = a.into_iter().chain(b).min().unwrap_or(self.now);
                self.now = self.now.max(t);
                true
            }
        }
    }

    /// Steps until `done` holds or virtual time passes `limit_ns` more, or
    /// the network goes idle. Returns whether `done` held.
    pub fn run_until(&mut self, limit_ns: u64, mut done: impl FnMut(&mut SimNet) -> bool) -> bool {
        let end = self.now.plus(limit_ns);
        loop {
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                return done(self);
            }
        }
    }

    fn transmit_all(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.endpoints.len() {
            // Tests post to QPs without ringing a doorbell: every QP is
            // looked at, as if each had been kicked.
            self.endpoints[i].mark_all();
            let src = self.endpoints[i].local_ip();
            while let Some(t) = self.endpoints[i].poll_transmit(self.now, &mut self.buf) {
                let bytes = self.buf[..t.len].to_vec();
                // A multicast datagram's own hop limit, else the route's
                // (64), as the engine's socket sends them.
                let ip = RxIp {
                    tclass: t.tclass,
                    hop_limit: t.hop_limit.unwrap_or(64),
                };
                self.launch(src, t.dst, ip, bytes);
                any = true;
            }
        }
        any
    }

    fn launch(&mut self, src: IpAddr, dst: IpAddr, ip: RxIp, bytes: Vec<u8>) {
        let index = self.sent;
        self.sent += 1;
        let mut verdict = Verdict::Pass;
        if let Some(f) = self.filter.as_mut() {
            if let Ok(pkt) = packet::parse(&bytes) {
                verdict = f(&Wire {
                    src,
                    dst,
                    pkt: &pkt,
                    tclass: ip.tclass,
                    index,
                });
            }
        }
        let mut copies = match verdict {
            Verdict::Drop => 0,
            Verdict::Duplicate => 2,
            _ => 1,
        };
        let now = self.now;
        let mut link = self.links.iter_mut().find(|l| l.src == src && l.dst == dst);
        let ip_udp = if src.is_ipv4() { 28 } else { 48 };
        let mut queued_ns = 0;
        if let Some(l) = link.as_mut() {
            if let Some(rate) = l.rate {
                let wire = (bytes.len() + ip_udp) as u128 * 1_000_000_000 / rate as u128;
                l.free_at = l.free_at.max(now).plus(wire as u64);
                queued_ns = l.free_at.0 - now.0;
            }
            if l.mtu.is_some_and(|m| bytes.len() + ip_udp > m)
                || l.black_holes.iter().any(|(a, b)| *a <= now && now < *b)
            {
                copies = 0;
                Counters::inc(&self.counters.dropped_pkts);
            }
        }
        let inj = match link.and_then(|l| l.faults.as_mut()) {
            Some(inj) => inj,
            None => &mut self.faults,
        };
        for (d, b) in inj.inject(&bytes, copies) {
            let mut delay = d + queued_ns;
            if let Verdict::Delay(d) = verdict {
                delay += d;
            }
            let slot = self.free.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            self.slots[slot] = Some(InFlight {
                src,
                dst,
                ip,
                bytes: b,
            });
            self.seq += 1;
            self.queue
                .push(Reverse((self.now.plus(delay), self.seq, slot)));
        }
    }

    fn deliver(&mut self, p: InFlight) {
        if let Some(t) = self.trace.as_mut() {
            t.push((self.now, p.src, p.dst, p.bytes.clone()));
        }
        if p.dst.is_multicast() {
            // A copy to every device with a QP in the group, the
            // sender's own included (a NIC loops multicast back).
            let from = SocketAddr::new(p.src, uroce_wire::ROCEV2_UDP_PORT);
            let n = p.bytes.len();
            if HEADROOM + n > self.rbuf.len() {
                self.rbuf.resize(HEADROOM + n, 0);
            }
            let mut any = false;
            for e in self.endpoints.iter_mut() {
                if e.group_members(p.dst).is_empty() {
                    continue;
                }
                any = true;
                self.rbuf[HEADROOM..HEADROOM + n].copy_from_slice(&p.bytes);
                e.handle_datagram_to(self.now, from, p.dst, p.ip, &mut self.rbuf[..HEADROOM + n]);
            }
            if !any {
                Counters::inc(&self.counters.dropped_pkts);
            }
            return;
        }
        let Some(e) = self.endpoints.iter_mut().find(|e| e.local_ip() == p.dst) else {
            Counters::inc(&self.counters.dropped_pkts);
            return;
        };
        let n = p.bytes.len();
        if HEADROOM + n > self.rbuf.len() {
            self.rbuf.resize(HEADROOM + n, 0);
        }
        self.rbuf[HEADROOM..HEADROOM + n].copy_from_slice(&p.bytes);
        let from = SocketAddr::new(p.src, uroce_wire::ROCEV2_UDP_PORT);
        e.handle_datagram(self.now, from, p.ip, &mut self.rbuf[..HEADROOM + n]);
    }
}
