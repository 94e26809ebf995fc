//! The observation seam: what the transports, the engine, the CM agent
//! and the CQs tell the diagnostic tools, as typed facts.
//!
//! The core composes no words and knows no tool. At each point a tool
//! cares about it tests one word of [`Topic`] bits ([`wants`]: one relaxed
//! load, the constant `false` in the `uroce_no_diag` yardstick build) and,
//! when a tool wants the topic, hands an [`Event`] to an [`Observer`]: a
//! QP's own (its config's `observer`), or the process's ([`Observer::process`]) for
//! what belongs to no QP. The tools (`crate::diag`: the checker, the
//! timeline, the explanations, `uroce stat`) implement the observer, set
//! the topics they want, and turn the facts into reports, trace records
//! and sentences.
//!
//! The seam sits below everything that emits into it and imports only
//! value types: the tools depend on it, it depends on no tool.

pub mod cause;

use crate::memory::{KeyTable, MrInner, PdId};
use crate::types::{QpState, QpType, RecvWr, SendWr, Wc, WcStatus, WrOpcode};
use cause::Explanation;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use uroce_wire::aeth::AethSyndrome;
use uroce_wire::packet::ParsedPacket;

/// False only in the yardstick build (`--cfg uroce_no_diag`) of
/// `benches/diag_cost.sh`, where every hook compiles to nothing.
pub const COMPILED: bool = !cfg!(uroce_no_diag);

bitflags::bitflags! {
    /// What a tool asks to be told about. The checker's categories keep
    /// the values `UROCE_CHECK`'s mask has always had.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Topic: u32 {
        /// The checker's `buffer` category: the NIC's writes into
        /// registered memory ([`Event::NicWrote`]).
        const CHECK_BUFFER = 1;
        /// The checker's `lifetime` category.
        const CHECK_LIFETIME = 2;
        /// The checker's `queue` category.
        const CHECK_QUEUE = 4;
        /// The checker's `event` category: CQs whose events are taken
        /// without polling ([`Event::CqNotPolled`]).
        const CHECK_EVENT = 8;
        /// The checker's `post` category.
        const CHECK_POST = 16;
        /// Every checker category.
        const CHECK = 31;
        /// The timeline (`UROCE_TRACE`): QPs, WRs, packets, retries,
        /// state changes, CM messages.
        const TIMELINE = 1 << 8;
        /// The explanations printed (`UROCE_EXPLAIN=1`): each error a QP
        /// explains ([`Event::Explained`], [`Event::EntersErr`]).
        const EXPLAIN = 1 << 9;
    }
}

/// The one switch word: the topics some tool wants now.
static WANTED: AtomicU32 = AtomicU32::new(0);

/// True when some tool wants topic `t` (any of its bits): one relaxed
/// load.
#[inline(always)]
pub fn wants(t: Topic) -> bool {
    COMPILED && WANTED.load(Ordering::Relaxed) & t.bits() != 0
}

/// True when some tool wants any topic.
#[inline(always)]
pub fn wants_any() -> bool {
    COMPILED && WANTED.load(Ordering::Relaxed) != 0
}

/// Turns topics on from now on (a tool that starts).
pub fn want(t: Topic) {
    WANTED.fetch_or(t.bits(), Ordering::Relaxed);
}

/// Turns topics off (a tool that stops, e.g. the timeline in a child
/// after `fork`, which has no writer thread).
pub fn unwant(t: Topic) {
    WANTED.fetch_and(!t.bits(), Ordering::Relaxed);
}

/// A queue's identity in events: its address, stable while it lives.
pub type QueueId = usize;

/// The identity of queue `q`.
pub fn queue_id<T>(q: &T) -> QueueId {
    q as *const T as usize
}

/// Which way a packet went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Sent by the QP.
    Tx,
    /// Received by the QP.
    Rx,
    /// Sent by the QP and dropped by the fault injector (`UROCE_FAULTS`).
    Lost,
}

/// Why a requester goes back to resend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resend {
    /// The local ACK timeout expired (IBA 9.7.6.1.3).
    AckTimeout,
    /// The responder NAKed a PSN sequence error (IBA 9.7.5.2.2).
    SeqNak,
}

/// Why a QP's posted WRs end without completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// The QP went to RESET.
    Reset,
    /// The QP was destroyed.
    Destroyed,
}

/// One fact a tool may want. Borrowed data lives only for the call; what
/// a QP, its queues and its packets did is a [`Fact`] of owned values,
/// which a tool may keep as it is (the timeline does).
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A device opened (the tools start what they need).
    DeviceOpened,
    /// A device closed (the tools flush what they keep).
    DeviceClosed,
    /// What a QP did ([`Topic::TIMELINE`]).
    Fact(Fact),
    /// The engine wrote into registered memory.
    NicWrote {
        /// The region.
        mr: &'a MrInner,
        /// Where in it.
        offset: usize,
        /// How many bytes.
        len: usize,
    },
    /// The application took a CQ's completion event (or destroys the
    /// CQ) while completions that came before the last event it took
    /// still wait unpolled.
    CqNotPolled {
        /// The CQ's handle.
        cq: u32,
        /// Completions waiting.
        waiting: usize,
        /// At the CQ's destroy (else: at another event).
        at_destroy: bool,
    },
    /// The application destroys a CQ while completion events it took are
    /// not acknowledged (`ibv_ack_cq_events`).
    CqDestroyUnacked {
        /// The CQ's handle.
        cq: u32,
        /// Events taken and not acknowledged.
        unacked: u32,
    },
    /// The application calls a verb on a QP a tool keeps a record of
    /// (what the checker's rules of posts and state changes look at).
    QpCall {
        /// The tool's record of the QP.
        qp: &'a QpRecord,
        /// What it does.
        call: QpCall<'a>,
    },
    /// The application posts receive WR `wr` to queue `owner` (a QP's
    /// number, or an SRQ's handle) of PD `pd` (before it is queued).
    RecvPosting {
        /// The device's key table.
        keys: &'a Arc<KeyTable>,
        /// The PD the buffers must be in.
        pd: PdId,
        /// The QP or SRQ.
        owner: u32,
        /// The WR.
        wr: &'a RecvWr,
    },
    /// The application polled completions `wcs` from a CQ of the device
    /// with `keys`.
    Polled {
        /// The device's key table.
        keys: &'a Arc<KeyTable>,
        /// The completions.
        wcs: &'a [Wc],
    },
    /// The region with local key `lkey` is being deregistered.
    Deregistering {
        /// The device's key table.
        keys: &'a Arc<KeyTable>,
        /// The region's lkey.
        lkey: u32,
    },
    /// A QP explained an error: which check failed, on which side (kept
    /// in the QP's `StateCell` whether or not a tool is told).
    Explained {
        /// The explanation.
        e: &'a Explanation,
    },
    /// A QP enters ERR because of the error completion with status
    /// `after` it explained just before.
    EntersErr {
        /// The QP.
        qpn: u32,
        /// The status of the completion explained before.
        after: WcStatus,
    },
    /// A CM MAD sent or received, or a CM event.
    Cm {
        /// What (the MAD's or event's name).
        what: &'static str,
        /// Our communication ID, when known.
        conn: Option<u32>,
        /// The peer, the transaction.
        detail: &'a str,
    },
}

/// What a QP, its queues and its packets did: owned `Copy` values, told
/// under [`Topic::TIMELINE`] ([`Event::Fact`]).
#[derive(Debug, Clone, Copy)]
pub enum Fact {
    /// A QP was made, with its queues.
    QpCreated {
        /// Its number.
        qpn: u32,
        /// Its type.
        qp_type: QpType,
        /// Its device's address.
        ip: IpAddr,
        /// Its send queue.
        sq: QueueId,
        /// Its receive queue (None: it receives from an SRQ).
        rq: Option<QueueId>,
    },
    /// A QP changed state.
    StateChanged {
        /// The QP.
        qpn: u32,
        /// The state it left.
        from: QpState,
        /// The state it entered.
        to: QpState,
    },
    /// A send WR was posted.
    SendPosted {
        /// The send queue.
        queue: QueueId,
        /// Its ID.
        wr_id: u64,
        /// Its operation.
        opcode: WrOpcode,
        /// The bytes it sends or reads (its inline data, or its SG list).
        len: u64,
    },
    /// A receive WR was posted.
    RecvPosted {
        /// The receive queue (or SRQ).
        queue: QueueId,
        /// Its ID.
        wr_id: u64,
        /// The bytes its scatter list holds.
        len: u64,
    },
    /// A send WR left its queue.
    SendDone {
        /// The QP.
        qpn: u32,
        /// The send queue.
        queue: QueueId,
        /// Its ID.
        wr_id: u64,
        /// How it ended.
        status: WcStatus,
        /// The bytes it moved.
        byte_len: u64,
        /// Whether it made a completion (signaled, or failed).
        completed: bool,
    },
    /// A receive WR completed.
    RecvDone {
        /// The QP.
        qpn: u32,
        /// The receive queue.
        queue: QueueId,
        /// Its ID.
        wr_id: u64,
        /// How it ended.
        status: WcStatus,
        /// The bytes it received.
        byte_len: u64,
    },
    /// A QP's posted WRs end without completions.
    QueuesGone {
        /// The QP.
        qpn: u32,
        /// Its send queue.
        sq: QueueId,
        /// Its receive queue (None: an SRQ, which lives on).
        rq: Option<QueueId>,
        /// Why.
        why: Gone,
    },
    /// A QP sent or received a packet.
    Packet {
        /// The QP.
        qpn: u32,
        /// Which way.
        dir: Dir,
        /// Its headers' facts.
        pkt: PacketInfo,
    },
    /// A requester goes back to resend from `psn`.
    Retransmit {
        /// The QP.
        qpn: u32,
        /// The first PSN resent.
        psn: u32,
        /// Why.
        cause: Resend,
        /// Retries left after this one.
        retries_left: u8,
    },
    /// A requester got an RNR NAK and waits before resending.
    RnrWait {
        /// The QP.
        qpn: u32,
        /// The PSN NAKed.
        psn: u32,
        /// How long it waits.
        wait_ns: u64,
        /// RNR retries left.
        retries_left: u8,
    },
}

impl From<Fact> for Event<'_> {
    fn from(f: Fact) -> Self {
        Event::Fact(f)
    }
}

/// What the tools show of a packet ([`Fact::Packet`]).
#[derive(Debug, Clone, Copy)]
pub struct PacketInfo {
    /// The opcode's name (`RC_SEND_ONLY`).
    pub opcode: &'static str,
    /// Its PSN.
    pub psn: u32,
    /// The destination QP.
    pub dest_qp: u32,
    /// The payload's length.
    pub len: u32,
    /// An ACK's or NAK's syndrome and MSN.
    pub aeth: Option<(AethSyndrome, u32)>,
}

impl PacketInfo {
    /// The facts of `pkt`.
    pub fn of(pkt: &ParsedPacket<'_>) -> PacketInfo {
        PacketInfo {
            opcode: pkt.info.name,
            psn: pkt.bth.psn.value(),
            dest_qp: pkt.bth.dest_qp,
            len: pkt.payload.len() as u32,
            aeth: pkt.aeth().map(|a| (a.syndrome, a.msn)),
        }
    }
}

/// Tells the process's observer, when a tool wants the timeline, of the
/// UDP payload `bytes` QP `qpn` sent (`dir`: out, or lost to the fault
/// injector); a payload that does not parse is not told.
#[inline(always)]
pub fn tell_packet_bytes(qpn: u32, dir: Dir, bytes: &[u8]) {
    #[cold]
    #[inline(never)]
    fn parsed(qpn: u32, dir: Dir, bytes: &[u8]) {
        if let Ok(p) = uroce_wire::packet::parse(bytes) {
            let pkt = PacketInfo::of(&p);
            Observer::process().send(Fact::Packet { qpn, dir, pkt }.into());
        }
    }
    if wants(Topic::TIMELINE) {
        parsed(qpn, dir, bytes);
    }
}

/// A tool's own record of one QP (the checker's ledger): made by the tool,
/// held by the QP's handle and handed back with the QP's calls
/// ([`Event::QpCall`]), so that the tool finds it without a lookup. Opaque
/// to the seam and the core.
pub type QpRecord = dyn std::any::Any + Send + Sync;

/// A verb the application calls on a QP ([`Event::QpCall`]).
#[derive(Debug, Clone, Copy)]
pub enum QpCall<'a> {
    /// It posts this send WR (checked, before it is queued).
    PostSend(&'a SendWr),
    /// It posts while the QP is in ERR.
    PostInErr,
    /// Its post is refused: this many bytes of inline data exceed the
    /// QP's `max_inline_data`.
    InlineTooLong(usize),
    /// It moves the QP to this state (ERR or RESET).
    Modify(QpState),
}

/// What the tools implement: told every event of a topic they want.
pub trait Observe: Send + Sync {
    /// One fact.
    fn observe(&self, e: &Event<'_>);
}

/// An observer that ignores everything (before the tools install theirs).
struct Ignore;

impl Observe for Ignore {
    fn observe(&self, _: &Event<'_>) {}
}

static IGNORE: Ignore = Ignore;
static PROCESS: OnceLock<&'static dyn Observe> = OnceLock::new();

/// Installs the process's observer (the tools do, once; later calls keep
/// the first).
pub fn install(o: &'static dyn Observe) {
    let _ = PROCESS.set(o);
}

/// Whom a QP (or the process) tells: a handle held in each QP's config.
#[derive(Clone, Copy)]
pub struct Observer(Option<&'static dyn Observe>);

impl Observer {
    /// The process's observer: what new QPs are given, and what is told
    /// of events that belong to no QP. It is found when told (the tools
    /// may install theirs after a QP was made).
    pub fn process() -> Observer {
        Observer(None)
    }
    /// A given observer (tests watch a QP with their own).
    pub fn new(o: &'static dyn Observe) -> Observer {
        Observer(Some(o))
    }
    /// Tells `e` when some tool wants topic `t`; `e` is not even made
    /// otherwise.
    #[inline(always)]
    pub fn tell<'a, E: Into<Event<'a>>>(self, t: Topic, e: impl FnOnce() -> E) {
        if wants(t) {
            self.send(e().into());
        }
    }
    /// Tells `e` whatever the topics (lifecycle events, once per device).
    #[cold]
    #[inline(never)]
    pub fn send(self, e: Event<'_>) {
        let o = self.0.or_else(|| PROCESS.get().copied()).unwrap_or(&IGNORE);
        o.observe(&e);
    }
}

impl Default for Observer {
    fn default() -> Observer {
        Observer::process()
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

/// Tells the process's observer `e` when some tool wants topic `t`.
#[inline(always)]
pub fn tell<'a, E: Into<Event<'a>>>(t: Topic, e: impl FnOnce() -> E) {
    if wants(t) {
        Observer::process().send(e().into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a test's own observer was told, as (QPN, event name).
    struct Record(std::sync::Mutex<Vec<(u32, &'static str)>>);

    impl Observe for Record {
        fn observe(&self, e: &Event<'_>) {
            let seen = match *e {
                Event::Fact(Fact::QpCreated { qpn, .. }) => (qpn, "created"),
                Event::Fact(Fact::QueuesGone {
                    qpn,
                    why: Gone::Destroyed,
                    ..
                }) => (qpn, "destroyed"),
                _ => return,
            };
            self.0.lock().unwrap().push(seen);
        }
    }

    #[test]
    fn a_qp_tells_the_observer_its_config_holds() {
        static SEEN: Record = Record(std::sync::Mutex::new(Vec::new()));
        want(Topic::TIMELINE);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let mut watched = crate::testing::config(ip, 0x77, 8);
            watched.observer = Observer::new(&SEEN);
            drop(crate::transport::new_qp(t, watched).unwrap());
            // A QP with the default observer tells the process's, not ours.
            drop(crate::transport::new_qp(t, crate::testing::config(ip, 0x78, 8)).unwrap());
        }
        let seen = SEEN.0.lock().unwrap().clone();
        assert_eq!(seen, [(0x77, "created"), (0x77, "destroyed")].repeat(3));
    }

    #[test]
    fn topics_are_one_word_set_and_cleared() {
        // Bits no tool in this test binary sets: the checker's categories
        // keep their UROCE_CHECK values.
        assert_eq!(Topic::CHECK.bits(), 31);
        assert_eq!(Topic::CHECK_EVENT.bits(), 8);
        let t = Topic::from_bits_retain(1 << 20);
        assert!(!wants(t));
        want(t);
        assert!(wants(t) && wants_any());
        unwant(t);
        assert!(!wants(t));
    }
}
