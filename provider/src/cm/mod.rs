//! Communication management (IBTA vol. 1 ch. 12) as a sans-IO state
//! machine: the [`CmAgent`] of one device keeps every connection's CM
//! state, takes the CM MADs that arrive on QP1 and the passing of time, and
//! gives back MADs to send, deadlines and [`CmEvent`]s. [`gsi::GsiQp`] is
//! the QP1 that carries its MADs in RoCEv2 UD packets, driven by the engine
//! (or the simulated network) like any other QP.
//!
//! What the agent does not know: IP addresses as rdma_cm uses them (the
//! CMA private-data header and service IDs from ports), QPs (the caller
//! moves its QP through RTR and RTS between the REP and the RTU), and
//! devices. Those belong to the layer above (`uroce_rdmacm::cm`).
//!
//! ## Connections (ch. 12.9)
//! Active: [`CmAgent::connect`] sends a REQ and waits for a REP, resending
//! the REQ after `2 x packet lifetime + the peer's response timeout` up to
//! the REQ's Max CM Retries (an MRA extends the wait by the service
//! timeout it names). A REP is reported ([`CmEvent::RepReceived`]); the
//! caller readies its QP and calls [`CmAgent::establish`], which sends the
//! RTU. Passive: a REQ for a listened-to service ID is reported
//! ([`CmEvent::ReqReceived`]); [`CmAgent::accept`] sends the REP, resent
//! until the RTU comes. A REQ nobody listens for is rejected with reason
//! 8 (invalid service ID); a REQ from a QP that already has a connection
//! here under another communication ID is rejected as stale (reason 10)
//! and the old connection is disconnected. Retries exhausted: REJ with
//! reason 1 (timeout) to the peer and [`CmEvent::Unreachable`].
//!
//! ## Disconnection
//! [`CmAgent::disconnect`] sends a DREQ (resent like the REQ); a DREQ is
//! answered with a DREP at once. Either way the connection reports
//! [`CmEvent::Disconnected`], waits out the time-wait period (answering
//! duplicate DREQs) and ends with [`CmEvent::TimewaitExit`]. A DREQ for a
//! connection this agent does not know is answered with a DREP too (the
//! kernel's CM does the same: the peer then stops resending).
//!
//! ## SIDR (ch. 12.11)
//! [`CmAgent::sidr_request`] sends a SIDR_REQ, resent like a REQ, and
//! reports the SIDR_REP or a timeout; a SIDR_REQ for a listened-to service
//! is reported and answered by [`CmAgent::sidr_reply`], one nobody listens
//! for gets status 1 (service ID not supported).
//!
//! ## A device shared by processes
//! With a [`CmGroup`] (the device is shared, `engine::share`) the agent
//! is one of several on the device's QP1, one per process, and each
//! takes only its own connections, as the kernel's one CM would: its
//! communication IDs carry its process's slot in their top
//! [`COMM_SLOT_BITS`] bits (as its QPNs do), and a listen takes the
//! service ID device-wide ([`CmGroup::claim`]; a second process gets
//! [`CmError::InUse`]). [`CmAgent::handle_mad`] says where a MAD goes
//! ([`Route`]): a reply to the agent whose ID it names, a REQ or
//! SIDR_REQ to the one that listens on its service ID. One whose owner
//! has exited is answered here as the kernel's CM answers from
//! time-wait: a DREQ with a DREP, a REP with a REJ (timeout), as the
//! kernel's CM sends when it destroys a process's ids; the rest is
//! dropped (all counted in `cm_orphans`).
//!
//! ## Hostile input
//! Malformed MADs, MADs that match no connection, and messages a state
//! does not take are dropped and counted; LAP and APR are dropped (the
//! kernel's CM does not support alternate paths on RoCE either). The
//! agent holds at most [`MAX_CONNS`] connections; REQs beyond that are
//! rejected with reason 3 (no resources).

pub mod gsi;

use crate::counters::Counters;
use crate::observe::{self, Event, Topic};
pub use crate::transport::Nanos;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use uroce_wire::cm::{
    CmMad, CmMessage, DrepRepr, DreqRepr, MraRepr, RejRepr, RepRepr, ReqRepr, RtuRepr, SidrRepRepr,
    SidrReqRepr,
};

/// Connections (and SIDR exchanges) one agent holds at most.
pub const MAX_CONNS: usize = 4096;

/// Bits of a communication ID that name its process's slot on a shared
/// device (as a QPN's top bits do).
pub const COMM_SLOT_BITS: u32 = 6;
const COMM_SLOT_SHIFT: u32 = 32 - COMM_SLOT_BITS;

/// The processes sharing the device, as the CM sees them (implemented
/// by `engine::share`). Slots are those of `engine::share`.
pub trait CmGroup: std::fmt::Debug + Send + Sync {
    /// This process's slot.
    fn slot(&self) -> u32;
    /// Whether a live process holds `slot`.
    fn is_live(&self, slot: u32) -> bool;
    /// Whether this process is the device's only one.
    fn alone(&self) -> bool;
    /// Takes `service_id` device-wide, as long as the value returned is
    /// kept (and while the process lives); `None` if another process
    /// holds it.
    fn claim(&self, service_id: u64) -> Option<Box<dyn std::fmt::Debug + Send>>;
    /// The slot of the process listening on `service_id`.
    fn listener(&self, service_id: u64) -> Option<u32>;
    /// Writes into `buf` the header of a forward to `slot` of a packet
    /// from `from` received with TOS `tclass`; returns its length (the
    /// packet follows it).
    fn write_forward_header(
        &self,
        slot: u32,
        from: SocketAddr,
        tclass: u8,
        buf: &mut [u8],
    ) -> usize;
}

/// Where a MAD that came to QP1 goes (see [`CmAgent::handle_mad`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Handled here.
    Here,
    /// Another process's: forward it to the one in this slot.
    Forward(u32),
}

/// Whose a MAD is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Here,
    Slot(u32),
    /// A process that has exited.
    Gone,
}

/// REJ reasons the agent sends (IBTA table 112).
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Consumer reject.
    pub const CONSUMER_REJECT: u16 = 28;
}

/// SIDR_REP status: the QP is valid.
pub const SIDR_OK: u8 = 0;
/// SIDR_REP status: service ID not supported.
pub const SIDR_UNSUPPORTED: u8 = 1;
/// SIDR_REP status: rejected by the service provider.
pub const SIDR_REJECT: u8 = 2;

/// Timing and identity of one agent.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// The device's address (CM messages go out from it). Read by the
    /// sans-IO users only: QP1 sends from its own.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub local_ip: IpAddr,
    /// The local CA GUID the REQ and REP carry.
    pub ca_guid: u64,
    /// How long this agent takes to answer, as an IBA time exponent
    /// (4.096 us x 2^t): what the REQ announces in both response-timeout
    /// fields. rdma_cm's default is 20 (4.3 s).
    pub response_timeout: u8,
    /// Max CM Retries of the REQs this agent sends (rdma_cm: 15).
    pub max_retries: u8,
    /// Packet lifetime, IBA time exponent (rdma_cm on RoCE: 16, 268 ms);
    /// a message's wait adds twice this.
    pub packet_lifetime: u8,
    /// The service timeout an MRA asks for (IBA time; rdma_cm: 24).
    pub mra_timeout: u8,
}

impl CmConfig {
    /// rdma_cm's timing for a device at `local_ip`, with
    /// `UROCE_CM_RESPONSE_TIMEOUT` (exponent, 8..=31) and
    /// `UROCE_CM_RETRIES` (1..=15) overriding the response timeout and
    /// the retries (tests make failures quick with them).
    pub fn from_env(local_ip: IpAddr, ca_guid: u64) -> CmConfig {
        let mut c = CmConfig::new(local_ip, ca_guid);
        if let Some(t) = env_u8("UROCE_CM_RESPONSE_TIMEOUT").filter(|t| (8..=31).contains(t)) {
            c.response_timeout = t;
            c.packet_lifetime = c.packet_lifetime.min(t);
        }
        if let Some(r) = env_u8("UROCE_CM_RETRIES").filter(|r| (1..=15).contains(r)) {
            c.max_retries = r;
        }
        c
    }
    /// rdma_cm's defaults.
    pub fn new(local_ip: IpAddr, ca_guid: u64) -> CmConfig {
        CmConfig {
            local_ip,
            ca_guid,
            response_timeout: 20,
            max_retries: 15,
            packet_lifetime: 16,
            mra_timeout: 24,
        }
    }
}

fn env_u8(name: &str) -> Option<u8> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// 4.096 us x 2^t in nanoseconds (t is a 5-bit IBA time value).
pub fn iba_time_ns(t: u8) -> u64 {
    4096u64 << (t & 31)
}

/// A MAD's name on the trace's CM track (`sent`: ours, else received).
fn mad_name(m: &CmMessage, sent: bool) -> &'static str {
    macro_rules! names {
        ($($v:ident => $n:literal),* $(,)?) => {
            match m {
                $(CmMessage::$v(_) => if sent { concat!("send ", $n) } else { concat!("recv ", $n) },)*
            }
        };
    }
    names!(
        Req => "REQ", Mra => "MRA", Rej => "REJ", Rep => "REP", Rtu => "RTU", Dreq => "DREQ",
        Drep => "DREP", SidrReq => "SIDR_REQ", SidrRep => "SIDR_REP", Lap => "LAP", Apr => "APR",
    )
}

/// A CM event's name on the trace's CM track.
fn event_name(e: &CmEvent) -> &'static str {
    match e {
        CmEvent::ReqReceived { .. } => "event REQ received",
        CmEvent::RepReceived { .. } => "event REP received",
        CmEvent::Established { .. } => "event established",
        CmEvent::Rejected { .. } => "event rejected",
        CmEvent::Unreachable { .. } => "event unreachable",
        CmEvent::Disconnected { .. } => "event disconnected",
        CmEvent::TimewaitExit { .. } => "event timewait exit",
        CmEvent::SidrReqReceived { .. } => "event SIDR_REQ received",
        CmEvent::SidrRepReceived { .. } => "event SIDR_REP received",
    }
}

/// What the agent tells its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a listened-to service: accept or reject `conn`.
    ReqReceived {
        /// The service ID listened to.
        service_id: u64,
        /// The new connection.
        conn: u32,
        /// Where the REQ came from.
        src: IpAddr,
        /// The REQ.
        req: Box<ReqRepr>,
    },
    /// The REP to our REQ: ready the QP, then
    /// [`CmHandle::establish`](crate::device::CmHandle::establish).
    RepReceived {
        /// The connection.
        conn: u32,
        /// The REP.
        rep: Box<RepRepr>,
    },
    /// The passive side's connection is established (the RTU came).
    Established {
        /// The connection.
        conn: u32,
    },
    /// The peer rejected the REQ or the REP.
    Rejected {
        /// The connection (forgotten now).
        conn: u32,
        /// The REJ.
        rej: Box<RejRepr>,
    },
    /// No answer after every retry (REQ, REP or SIDR_REQ): the peer was
    /// sent a REJ with reason timeout where it had answered at all.
    Unreachable {
        /// The connection (forgotten now).
        conn: u32,
    },
    /// The connection is over: the peer's DREQ came (and was answered),
    /// or ours was answered or ran out of retries.
    Disconnected {
        /// The connection.
        conn: u32,
        /// The DREQ's or DREP's private data (zeros when none came).
        private_data: Box<[u8; 224]>,
    },
    /// The time-wait period after a disconnection is over.
    TimewaitExit {
        /// The connection (forgotten now).
        conn: u32,
    },
    /// A SIDR_REQ for a listened-to service: answer with
    /// [`CmHandle::sidr_reply`](crate::device::CmHandle::sidr_reply).
    SidrReqReceived {
        /// The service ID listened to.
        service_id: u64,
        /// The handle to answer through.
        conn: u32,
        /// Where it came from.
        src: IpAddr,
        /// The SIDR_REQ.
        req: Box<SidrReqRepr>,
    },
    /// The SIDR_REP to our SIDR_REQ.
    SidrRepReceived {
        /// The handle `sidr_request` returned.
        conn: u32,
        /// The SIDR_REP.
        rep: Box<SidrRepRepr>,
    },
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CmError {
    /// The service ID is listened to already.
    #[error("service ID already listened to")]
    InUse,
    /// No such connection.
    #[error("no such connection")]
    NoConn,
    /// The connection's state does not allow this call.
    #[error("the connection's state does not allow this")]
    BadState,
    /// Too many connections.
    #[error("too many connections")]
    NoResources,
    /// Private data longer than the message holds.
    #[error("private data too long")]
    TooLong,
}

/// A connection's CM state (IBTA figure 143, without path migration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// REQ sent, waiting for a REP.
    ReqSent,
    /// The peer MRAed our REQ: waiting longer.
    MraRcvd,
    /// REP received, waiting for the user's `establish`.
    RepRcvd,
    /// REQ received, waiting for the user's `accept` or `reject`.
    ReqRcvd,
    /// REQ received and MRAed.
    MraSent,
    /// REP sent, waiting for the RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// Disconnected; answering duplicate DREQs until the period ends.
    TimeWait,
    /// SIDR_REQ sent.
    SidrReqSent,
    /// SIDR_REQ received, waiting for the user's reply.
    SidrReqRcvd,
    /// SIDR_REP sent; kept to answer duplicate SIDR_REQs.
    SidrRepSent,
}

#[derive(Debug)]
struct Conn {
    state: ConnState,
    /// The peer's address and GSI QP.
    peer: IpAddr,
    peer_gsi: u32,
    /// The peer's communication ID (0 until known); for SIDR, the peer's
    /// request ID.
    remote_id: u32,
    remote_guid: u64,
    /// The peer's QPN (REQ or REP), for stale detection and the DREQ.
    remote_qpn: u32,
    local_qpn: u32,
    service_id: u64,
    /// The message resent on timeout (and on some duplicates).
    last: Option<CmMad>,
    deadline: Option<Nanos>,
    retries_left: u8,
    /// The wait after each (re)send.
    wait_ns: u64,
    /// Retries a REQ exchange allows (from the REQ).
    max_retries: u8,
    /// The peer's response timeout (IBA time), for our DREQs.
    peer_timeout: u8,
    /// Whether events for it still reach the user.
    user: bool,
    /// The traffic class (IP TOS) its MADs leave with: the REQ's primary
    /// path's, on both sides (the kernel's CM sends with the address
    /// vector it builds from that path, `cm_init_av_by_path`).
    tclass: u8,
}

impl Conn {
    /// The active side's new connection to `peer` in `state`, for local
    /// QP `local_qpn` (0: none yet) and `service_id`, its MADs leaving
    /// with `tclass`: nothing known of the peer, `cfg`'s retries and
    /// response timeout.
    fn active(
        state: ConnState,
        peer: IpAddr,
        local_qpn: u32,
        service_id: u64,
        tclass: u8,
        cfg: &CmConfig,
    ) -> Conn {
        Conn {
            state,
            peer,
            peer_gsi: uroce_wire::mad::GSI_QPN,
            remote_id: 0,
            remote_guid: 0,
            remote_qpn: 0,
            local_qpn,
            service_id,
            last: None,
            deadline: None,
            retries_left: 0,
            wait_ns: 0,
            max_retries: cfg.max_retries,
            peer_timeout: cfg.response_timeout,
            user: true,
            tclass,
        }
    }
}

/// A MAD to send: to `dst`'s GSI QP `dst_qpn`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Destination address.
    pub dst: IpAddr,
    /// Destination QP (the peer's GSI QP: 1).
    pub dst_qpn: u32,
    /// The MAD.
    pub mad: CmMad,
    /// The traffic class (IP TOS) it leaves with: its connection's.
    pub tclass: u8,
}

/// The CM state machines of one device. See the module doc.
#[derive(Debug)]
pub struct CmAgent {
    cfg: CmConfig,
    counters: Arc<Counters>,
    conns: HashMap<u32, Conn>,
    /// Service IDs listened to (with their device-wide claim when shared).
    listeners: HashMap<u64, Option<Box<dyn std::fmt::Debug + Send>>>,
    group: Option<Arc<dyn CmGroup>>,
    out: VecDeque<Outgoing>,
    events: VecDeque<CmEvent>,
    tid_hi: u32,
    rng: u64,
}

impl CmAgent {
    /// An agent with no connections.
    pub fn new(cfg: CmConfig, counters: Arc<Counters>) -> CmAgent {
        let seed = rand::random::<u64>() | 1;
        CmAgent {
            cfg,
            counters,
            conns: HashMap::new(),
            listeners: HashMap::new(),
            group: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            tid_hi: rand::random(),
            rng: seed,
        }
    }

    /// The agent of one of the processes sharing a device (see the module
    /// doc).
    pub fn with_group(mut self, group: Arc<dyn CmGroup>) -> CmAgent {
        self.group = Some(group);
        self
    }

    /// The configuration.
    #[cfg(any(test, feature = "testing"))] // for the sans-IO tests and fuzzer
    pub fn config(&self) -> &CmConfig {
        &self.cfg
    }

    /// A connection's state.
    pub fn state(&self, conn: u32) -> Option<ConnState> {
        self.conns.get(&conn).map(|c| c.state)
    }

    /// Sends `conn`'s last MAD (its DREQ, say) again now, without spending
    /// one of its retries: for a process about to exit, whose CM will not
    /// be there for the retries at the peer's response timeout.
    pub fn resend_last(&mut self, conn: u32) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let Some(mad) = c.last else {
            return;
        };
        let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
        self.send(dst, q, tc, mad);
    }

    /// Connections held (including those in time-wait).
    #[cfg(any(test, feature = "testing"))] // for the sans-IO tests and fuzzer
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether it holds no connection.
    #[cfg(any(test, feature = "testing"))] // for the sans-IO tests and fuzzer
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    fn next_rand(&mut self) -> u64 {
        // xorshift64*: IDs need only be unpredictable enough that a
        // restarted peer does not reuse them.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn new_id(&mut self) -> u32 {
        loop {
            let mut id = (self.next_rand() >> 32) as u32;
            if let Some(g) = &self.group {
                id = g.slot() << COMM_SLOT_SHIFT | id & ((1 << COMM_SLOT_SHIFT) - 1);
            }
            if id != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn tid(&self, id: u32) -> u64 {
        (u64::from(self.tid_hi) << 32) | u64::from(id)
    }

    /// The wait after sending a message the peer answers within its
    /// response timeout `t`.
    fn wait(&self, t: u8) -> u64 {
        2 * iba_time_ns(self.cfg.packet_lifetime) + iba_time_ns(t)
    }

    // -----------------------------------------------------------------
    // Output
    // -----------------------------------------------------------------

    /// The next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.out.pop_front()
    }

    /// The next event for the user.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// Whether an event waits.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// How long a connection stays in time-wait (twice the packet
    /// lifetime), answering the peer's DREQs.
    pub fn timewait_ns(&self) -> u64 {
        2 * iba_time_ns(self.cfg.packet_lifetime)
    }

    /// Whether a MAD waits to be sent.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn send(&mut self, dst: IpAddr, dst_qpn: u32, tclass: u8, mad: CmMad) {
        Counters::inc(&self.counters.cm_mads_sent);
        tell_mad(&mad, true, dst, dst_qpn);
        self.out.push_back(Outgoing {
            dst,
            dst_qpn,
            mad,
            tclass,
        });
    }

    fn event(&mut self, conn: u32, e: CmEvent) {
        observe::tell(Topic::TIMELINE, || Event::Cm {
            what: event_name(&e),
            conn: Some(conn),
            detail: "",
        });
        if self.conns.get(&conn).is_none_or(|c| c.user) {
            self.events.push_back(e);
        }
    }

    /// Sends `mad` for `conn`, keeps it for resending, and arms the timer.
    /// Sends `msg` with `tid` to connection `id`'s peer (its GSI QP, with
    /// its traffic class); nothing when there is no such connection.
    fn send_to_peer(&mut self, id: u32, tid: u64, msg: CmMessage) {
        if let Some(c) = self.conns.get(&id) {
            let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
            self.send(dst, q, tc, CmMad { tid, msg });
        }
    }

    /// Opens the active side's connection `id` as `conn` and sends its
    /// first message `msg`, resent until the answer comes.
    fn open(&mut self, now: Nanos, id: u32, conn: Conn, msg: CmMessage) {
        self.conns.insert(id, conn);
        let mad = CmMad {
            tid: self.tid(id),
            msg,
        };
        let wait = self.wait(self.cfg.response_timeout);
        self.send_retried(now, id, mad, wait, self.cfg.max_retries);
    }

    fn send_retried(&mut self, now: Nanos, conn: u32, mad: CmMad, wait_ns: u64, retries: u8) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.last = Some(mad);
        c.wait_ns = wait_ns;
        c.retries_left = retries;
        c.deadline = Some(now.plus(wait_ns));
        let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
        self.send(dst, q, tc, mad);
    }

    // -----------------------------------------------------------------
    // User calls
    // -----------------------------------------------------------------

    /// Takes REQs (and SIDR_REQs) for `service_id`: on the whole device
    /// when it is shared ([`CmError::InUse`] when another process
    /// listens there).
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.contains_key(&service_id) {
            return Err(CmError::InUse);
        }
        let claim = match &self.group {
            Some(g) => Some(g.claim(service_id).ok_or(CmError::InUse)?),
            None => None,
        };
        self.listeners.insert(service_id, claim);
        Ok(())
    }

    /// Stops taking REQs for `service_id` (connections made stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Sends a REQ to `dst` (GSI QP 1). `req` carries everything but the
    /// local communication ID, the CA GUID, the response timeouts and the
    /// retries, which the agent fills in. Returns the connection.
    pub fn connect(&mut self, now: Nanos, dst: IpAddr, req: &ReqRepr) -> Result<u32, CmError> {
        if self.conns.len() >= MAX_CONNS {
            return Err(CmError::NoResources);
        }
        let id = self.new_id();
        let mut req = *req;
        req.local_comm_id = id;
        req.local_ca_guid = self.cfg.ca_guid;
        req.remote_cm_response_timeout = self.cfg.response_timeout;
        req.local_cm_response_timeout = self.cfg.response_timeout;
        req.max_cm_retries = self.cfg.max_retries;
        let (qpn, service, tclass) = (req.local_qpn, req.service_id, req.primary.traffic_class);
        let conn = Conn::active(ConnState::ReqSent, dst, qpn, service, tclass, &self.cfg);
        self.open(now, id, conn, CmMessage::Req(req));
        Ok(id)
    }

    /// Accepts a REQ: sends the REP (resent until the RTU comes). `rep`
    /// carries the QP's fields; the agent fills in the IDs and the GUID.
    pub fn accept(&mut self, now: Nanos, conn: u32, rep: &RepRepr) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn)?;
        if !matches!(c.state, ConnState::ReqRcvd | ConnState::MraSent) {
            return Err(CmError::BadState);
        }
        let mut rep = *rep;
        rep.local_comm_id = conn;
        rep.remote_comm_id = c.remote_id;
        rep.local_ca_guid = self.cfg.ca_guid;
        let (tid, retries, t) = (
            c.last.map_or(self.tid(conn), |m| m.tid),
            c.max_retries,
            c.peer_timeout,
        );
        let wait = self.wait(t);
        let c = self.conns.get_mut(&conn).expect("checked");
        c.state = ConnState::RepSent;
        c.local_qpn = rep.local_qpn;
        let mad = CmMad {
            tid,
            msg: CmMessage::Rep(rep),
        };
        self.send_retried(now, conn, mad, wait, retries);
        Ok(())
    }

    /// Rejects a received REQ (or, on the active side, a REP) with
    /// `reason` and private data; forgets the connection.
    pub fn reject(&mut self, conn: u32, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn)?;
        let message_rejected = match c.state {
            ConnState::ReqRcvd | ConnState::MraSent => 0,
            ConnState::RepRcvd => 1,
            _ => return Err(CmError::BadState),
        };
        let mut rej = RejRepr::default();
        put_private(&mut rej.private_data, private_data)?;
        rej.local_comm_id = conn;
        rej.remote_comm_id = c.remote_id;
        rej.message_rejected = message_rejected;
        rej.reason = reason;
        let tid = c.last.map_or(self.tid(conn), |m| m.tid);
        self.send_to_peer(conn, tid, CmMessage::Rej(rej));
        self.conns.remove(&conn);
        Ok(())
    }

    /// Active side, after the REP: sends the RTU; the connection is
    /// established.
    pub fn establish(&mut self, conn: u32, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conns.get_mut(&conn).ok_or(CmError::NoConn)?;
        if c.state != ConnState::RepRcvd {
            return Err(CmError::BadState);
        }
        let mut rtu = RtuRepr::default();
        put_private(&mut rtu.private_data, private_data)?;
        rtu.local_comm_id = conn;
        rtu.remote_comm_id = c.remote_id;
        let mad = CmMad {
            tid: c.last.map_or(0, |m| m.tid),
            msg: CmMessage::Rtu(rtu),
        };
        c.state = ConnState::Established;
        c.deadline = None;
        // Kept: a duplicate REP (our RTU was lost) is answered with it.
        c.last = Some(mad);
        let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
        self.send(dst, q, tc, mad);
        Ok(())
    }

    /// Passive side: the QP saw the peer's traffic before the RTU
    /// (`IBV_EVENT_COMM_EST`): the connection is established as if the RTU
    /// had come.
    pub fn notify_established(&mut self, conn: u32) -> Result<(), CmError> {
        let c = self.conns.get_mut(&conn).ok_or(CmError::NoConn)?;
        if c.state != ConnState::RepSent {
            return Err(CmError::BadState);
        }
        c.state = ConnState::Established;
        c.deadline = None;
        self.event(conn, CmEvent::Established { conn });
        Ok(())
    }

    /// Connection `conn`, which must be in state `want`.
    fn conn_in(&self, conn: u32, want: ConnState) -> Result<&Conn, CmError> {
        let c = self.conns.get(&conn).ok_or(CmError::NoConn)?;
        if c.state != want {
            return Err(CmError::BadState);
        }
        Ok(c)
    }

    /// Sends a DREQ (resent until the DREP comes).
    pub fn disconnect(
        &mut self,
        now: Nanos,
        conn: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn_in(conn, ConnState::Established)?;
        let mut dreq = DreqRepr::default();
        put_private(&mut dreq.private_data, private_data)?;
        dreq.local_comm_id = conn;
        dreq.remote_comm_id = c.remote_id;
        dreq.remote_qpn = c.remote_qpn;
        let (retries, t) = (c.max_retries, c.peer_timeout);
        let wait = self.wait(t);
        let r = self.next_rand() as u32;
        let tid = self.tid(r);
        self.conns.get_mut(&conn).expect("checked").state = ConnState::DreqSent;
        let mad = CmMad {
            tid,
            msg: CmMessage::Dreq(dreq),
        };
        self.send_retried(now, conn, mad, wait, retries);
        Ok(())
    }

    /// The user is done with `conn`: no more events for it. What the
    /// state calls for goes to the peer (a REJ for an unanswered REQ or
    /// REP, a DREQ for an established connection); the agent keeps the
    /// connection through its time-wait period.
    pub fn destroy(&mut self, now: Nanos, conn: u32) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.user = false;
        match c.state {
            ConnState::ReqRcvd | ConnState::MraSent | ConnState::RepRcvd => {
                let _ = self.reject(conn, reason::CONSUMER_REJECT, &[]);
            }
            ConnState::ReqSent | ConnState::MraRcvd | ConnState::RepSent => {
                self.send_timeout_rej(conn);
                self.conns.remove(&conn);
            }
            ConnState::Established => {
                let _ = self.disconnect(now, conn, &[]);
            }
            ConnState::SidrReqSent | ConnState::SidrReqRcvd => {
                self.conns.remove(&conn);
            }
            ConnState::DreqSent | ConnState::TimeWait | ConnState::SidrRepSent => {}
        }
    }

    /// Sends a SIDR_REQ to `dst` with traffic class `tclass` (the id's
    /// route's); returns its handle.
    pub fn sidr_request(
        &mut self,
        now: Nanos,
        dst: IpAddr,
        service_id: u64,
        tclass: u8,
        private_data: &[u8],
    ) -> Result<u32, CmError> {
        if self.conns.len() >= MAX_CONNS {
            return Err(CmError::NoResources);
        }
        let mut req = SidrReqRepr::default();
        put_private(&mut req.private_data, private_data)?;
        let id = self.new_id();
        req.request_id = id;
        req.pkey = 0xffff;
        req.service_id = service_id;
        let conn = Conn::active(
            ConnState::SidrReqSent,
            dst,
            0,
            service_id,
            tclass,
            &self.cfg,
        );
        self.open(now, id, conn, CmMessage::SidrReq(req));
        Ok(id)
    }

    /// Answers a SIDR_REQ.
    pub fn sidr_reply(
        &mut self,
        now: Nanos,
        conn: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn_in(conn, ConnState::SidrReqRcvd)?;
        let mut rep = SidrRepRepr::default();
        put_private(&mut rep.private_data, private_data)?;
        rep.request_id = c.remote_id;
        rep.status = status;
        rep.qpn = qpn & 0xff_ffff;
        rep.qkey = qkey;
        rep.service_id = c.service_id;
        let mad = CmMad {
            tid: c.last.map_or(0, |m| m.tid),
            msg: CmMessage::SidrRep(rep),
        };
        let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
        let wait = self.wait(self.cfg.response_timeout) * 2;
        let c = self.conns.get_mut(&conn).expect("checked");
        c.state = ConnState::SidrRepSent;
        c.user = false;
        c.last = Some(mad);
        // Kept long enough to answer the requester's retries.
        c.deadline = Some(now.plus(wait));
        self.send(dst, q, tc, mad);
        Ok(())
    }

    // -----------------------------------------------------------------
    // Time
    // -----------------------------------------------------------------

    /// Resends what is due, and ends what ran out of retries.
    pub fn handle_timeout(&mut self, now: Nanos) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            self.expire(now, id);
        }
    }

    fn expire(&mut self, now: Nanos, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        match c.state {
            ConnState::TimeWait => {
                self.event(id, CmEvent::TimewaitExit { conn: id });
                self.conns.remove(&id);
                return;
            }
            ConnState::SidrRepSent => {
                self.conns.remove(&id);
                return;
            }
            _ => {}
        }
        if c.retries_left > 0 {
            c.retries_left -= 1;
            c.deadline = Some(now.plus(c.wait_ns));
            if let Some(mad) = c.last {
                let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
                Counters::inc(&self.counters.cm_retries);
                self.send(dst, q, tc, mad);
            }
            return;
        }
        // Out of retries.
        c.deadline = None;
        match c.state {
            ConnState::ReqSent | ConnState::MraRcvd | ConnState::RepSent => {
                self.send_timeout_rej(id);
                self.event(id, CmEvent::Unreachable { conn: id });
                self.conns.remove(&id);
            }
            ConnState::SidrReqSent => {
                self.event(id, CmEvent::Unreachable { conn: id });
                self.conns.remove(&id);
            }
            ConnState::DreqSent => {
                self.enter_timewait(now, id, [0; 224]);
            }
            _ => {}
        }
    }

    /// REJ with reason timeout for a REQ or REP we give up on.
    fn send_timeout_rej(&mut self, id: u32) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        let mut rej = RejRepr {
            local_comm_id: id,
            remote_comm_id: c.remote_id,
            message_rejected: u8::from(c.state == ConnState::RepSent),
            reason: reason::TIMEOUT,
            ..RejRepr::default()
        };
        // ARI of a timeout REJ: our CA GUID (IBA 12.6.7.2).
        rej.ari[..8].copy_from_slice(&self.cfg.ca_guid.to_be_bytes());
        rej.reject_info_len = 8;
        let tid = c.last.map_or(0, |m| m.tid);
        self.send_to_peer(id, tid, CmMessage::Rej(rej));
    }

    fn enter_timewait(&mut self, now: Nanos, id: u32, private_data: [u8; 224]) {
        let wait = self.timewait_ns();
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let was = c.state;
        c.state = ConnState::TimeWait;
        c.deadline = Some(now.plus(wait));
        c.retries_left = 0;
        if was != ConnState::TimeWait {
            self.event(
                id,
                CmEvent::Disconnected {
                    conn: id,
                    private_data: Box::new(private_data),
                },
            );
        }
    }

    // -----------------------------------------------------------------
    // Input
    // -----------------------------------------------------------------

    /// Takes the bytes of a MAD that came to QP1 from `src`'s QP
    /// `src_qpn`; on a shared device, says whether another process's
    /// agent is to have it instead ([`Route::Forward`]: nothing was done
    /// with it here).
    pub fn handle_mad(&mut self, now: Nanos, src: IpAddr, src_qpn: u32, bytes: &[u8]) -> Route {
        let mad = match CmMad::parse(bytes) {
            Ok(m) => m,
            Err(_) => {
                Counters::inc(&self.counters.cm_malformed_mads);
                return Route::Here;
            }
        };
        match self.owner(&mad.msg) {
            Owner::Here => {}
            Owner::Slot(s) => {
                Counters::inc(&self.counters.cm_forwarded);
                return Route::Forward(s);
            }
            Owner::Gone => {
                Counters::inc(&self.counters.cm_orphans);
                if let CmMessage::Rep(r) = mad.msg {
                    self.reject_orphan_rep(src, src_qpn, mad.tid, &r);
                    return Route::Here;
                }
            }
        }
        Counters::inc(&self.counters.cm_mads_rcvd);
        tell_mad(&mad, false, src, src_qpn);
        let handled = match mad.msg {
            CmMessage::Req(r) => self.on_req(now, src, src_qpn, mad.tid, r),
            CmMessage::Mra(m) => self.on_mra(now, m),
            CmMessage::Rej(r) => self.on_rej(src, r),
            CmMessage::Rep(r) => self.on_rep(src, r),
            CmMessage::Rtu(r) => self.on_rtu(r),
            CmMessage::Dreq(d) => self.on_dreq(now, src, src_qpn, mad.tid, d),
            CmMessage::Drep(d) => self.on_drep(now, d),
            CmMessage::SidrReq(r) => self.on_sidr_req(now, src, src_qpn, mad.tid, r),
            CmMessage::SidrRep(r) => self.on_sidr_rep(r),
            // Alternate paths: not on RoCE (as the kernel's CM).
            _ => false,
        };
        if !handled {
            Counters::inc(&self.counters.cm_dropped_mads);
        }
        Route::Here
    }

    /// Whose `msg` is: the agent whose communication ID it names as the
    /// receiver's (a REQ or SIDR_REQ: the listener of its service ID).
    fn owner(&self, msg: &CmMessage) -> Owner {
        let Some(g) = &self.group else {
            return Owner::Here;
        };
        let by_id = |id: u32| {
            let s = id >> COMM_SLOT_SHIFT;
            if s == g.slot() {
                Owner::Here
            } else if g.is_live(s) {
                Owner::Slot(s)
            } else {
                Owner::Gone
            }
        };
        let by_service = |sid: u64| {
            if self.listeners.contains_key(&sid) || g.alone() {
                return Owner::Here;
            }
            match g.listener(sid) {
                Some(s) if s != g.slot() && g.is_live(s) => Owner::Slot(s),
                _ => Owner::Here,
            }
        };
        match msg {
            CmMessage::Req(r) => by_service(r.service_id),
            CmMessage::SidrReq(r) => by_service(r.service_id),
            CmMessage::Rep(r) => by_id(r.remote_comm_id),
            CmMessage::Rtu(r) => by_id(r.remote_comm_id),
            CmMessage::Mra(r) => by_id(r.remote_comm_id),
            CmMessage::Dreq(r) => by_id(r.remote_comm_id),
            CmMessage::Drep(r) => by_id(r.remote_comm_id),
            // A REJ that names no ID of ours is found by the peer's.
            CmMessage::Rej(r) if r.remote_comm_id != 0 => by_id(r.remote_comm_id),
            CmMessage::SidrRep(r) => by_id(r.request_id),
            _ => Owner::Here,
        }
    }

    /// A REP to a REQ whose process has exited: the REJ (timeout, our CA
    /// GUID) the kernel's CM sends for an id destroyed in REQ sent
    /// (`cm_destroy_id`), so that the peer stops resending its REP.
    fn reject_orphan_rep(&mut self, src: IpAddr, src_qpn: u32, tid: u64, r: &RepRepr) {
        let mut rej = RejRepr {
            local_comm_id: r.remote_comm_id,
            remote_comm_id: r.local_comm_id,
            message_rejected: 1,
            reason: reason::TIMEOUT,
            ..RejRepr::default()
        };
        rej.ari[..8].copy_from_slice(&self.cfg.ca_guid.to_be_bytes());
        rej.reject_info_len = 8;
        self.send(
            src,
            src_qpn,
            0,
            CmMad {
                tid,
                msg: CmMessage::Rej(rej),
            },
        );
    }

    /// The connection a reply names (its Remote Communication ID is our
    /// local one), checked against the peer's ID when we know it.
    fn conn_for(&self, local: u32, remote: u32) -> Option<u32> {
        let c = self.conns.get(&local)?;
        (c.remote_id == 0 || c.remote_id == remote).then_some(local)
    }

    fn on_req(&mut self, now: Nanos, src: IpAddr, src_qpn: u32, tid: u64, req: ReqRepr) -> bool {
        // A duplicate: the same peer ID from the same peer.
        let dup = self.conns.iter().find_map(|(&id, c)| {
            (c.peer == src
                && c.remote_id == req.local_comm_id
                && c.remote_guid == req.local_ca_guid
                && !matches!(
                    c.state,
                    ConnState::SidrReqRcvd | ConnState::SidrRepSent | ConnState::SidrReqSent
                ))
            .then_some(id)
        });
        if let Some(id) = dup {
            Counters::inc(&self.counters.cm_duplicates);
            let mra_timeout = self.cfg.mra_timeout;
            let c = self.conns.get_mut(&id).expect("found");
            match c.state {
                ConnState::ReqRcvd | ConnState::MraSent => {
                    // The user is slow: ask for more time (IBA 12.6.6).
                    let mra = MraRepr {
                        local_comm_id: id,
                        remote_comm_id: c.remote_id,
                        message_mraed: 0,
                        service_timeout: mra_timeout,
                        ..MraRepr::default()
                    };
                    c.state = ConnState::MraSent;
                    let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
                    self.send(
                        dst,
                        q,
                        tc,
                        CmMad {
                            tid,
                            msg: CmMessage::Mra(mra),
                        },
                    );
                }
                ConnState::RepSent => {
                    if let Some(m) = c.last {
                        let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
                        self.send(dst, q, tc, m);
                    }
                }
                _ => {}
            }
            return true;
        }
        let reject = |agent: &mut CmAgent, reason: u16| {
            let rej = RejRepr {
                local_comm_id: 0,
                remote_comm_id: req.local_comm_id,
                message_rejected: 0,
                reason,
                ..RejRepr::default()
            };
            agent.send(
                src,
                src_qpn,
                req.primary.traffic_class,
                CmMad {
                    tid,
                    msg: CmMessage::Rej(rej),
                },
            );
        };
        if !self.listeners.contains_key(&req.service_id) {
            reject(self, reason::INVALID_SERVICE_ID);
            return true;
        }
        // RC and UC only (XRC and RD are not supported).
        if req.transport_service_type > 1 {
            reject(self, reason::INVALID_TRANSPORT);
            return true;
        }
        // Stale: the peer's QP is connected here under another ID (the
        // peer lost its state). Reject, and end the old connection.
        let stale = self.conns.iter().find_map(|(&id, c)| {
            (c.peer == src
                && c.remote_qpn == req.local_qpn
                && matches!(c.state, ConnState::Established | ConnState::RepSent))
            .then_some(id)
        });
        if let Some(old) = stale {
            reject(self, reason::STALE_CONN);
            if self.state(old) == Some(ConnState::Established) {
                let _ = self.disconnect(now, old, &[]);
            } else {
                self.enter_timewait(now, old, [0; 224]);
            }
            return true;
        }
        if self.conns.len() >= MAX_CONNS {
            reject(self, reason::NO_RESOURCES);
            return true;
        }
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state: ConnState::ReqRcvd,
                peer: src,
                peer_gsi: src_qpn,
                remote_id: req.local_comm_id,
                remote_guid: req.local_ca_guid,
                remote_qpn: req.local_qpn,
                local_qpn: 0,
                service_id: req.service_id,
                // The REQ's TID, which the REP and a REJ carry.
                last: Some(CmMad {
                    tid,
                    msg: CmMessage::Req(req),
                }),
                deadline: None,
                retries_left: 0,
                wait_ns: 0,
                max_retries: req.max_cm_retries,
                peer_timeout: req.local_cm_response_timeout,
                user: true,
                tclass: req.primary.traffic_class,
            },
        );
        self.event(
            id,
            CmEvent::ReqReceived {
                service_id: req.service_id,
                conn: id,
                src,
                req: Box::new(req),
            },
        );
        true
    }

    fn on_mra(&mut self, now: Nanos, m: MraRepr) -> bool {
        let Some(id) = self.conn_for(m.remote_comm_id, m.local_comm_id) else {
            return false;
        };
        let extra = iba_time_ns(m.service_timeout);
        let lifetime = 2 * iba_time_ns(self.cfg.packet_lifetime);
        let c = self.conns.get_mut(&id).expect("found");
        let ok = matches!(
            (c.state, m.message_mraed),
            (ConnState::ReqSent | ConnState::MraRcvd, 0) | (ConnState::RepSent, 1)
        );
        if !ok {
            return false;
        }
        if c.state == ConnState::ReqSent {
            c.state = ConnState::MraRcvd;
        }
        if c.remote_id == 0 {
            c.remote_id = m.local_comm_id;
        }
        // One more wait of the service timeout; the retries left stay.
        c.deadline = Some(now.plus(lifetime + extra));
        true
    }

    fn on_rej(&mut self, src: IpAddr, r: RejRepr) -> bool {
        // A peer that gave up before it heard from us names our ID as 0
        // (it never learnt it): found by its own ID, as the kernel's CM
        // finds a timeout REJ.
        let found = if r.remote_comm_id == 0 && r.local_comm_id != 0 {
            self.conns.iter().find_map(|(&id, c)| {
                (c.peer == src && c.remote_id == r.local_comm_id).then_some(id)
            })
        } else {
            self.conn_for(r.remote_comm_id, r.local_comm_id)
        };
        let Some(id) = found else {
            return false;
        };
        let c = &self.conns[&id];
        if !matches!(
            c.state,
            ConnState::ReqSent
                | ConnState::MraRcvd
                | ConnState::RepRcvd
                | ConnState::RepSent
                | ConnState::MraSent
        ) {
            return false;
        }
        self.event(
            id,
            CmEvent::Rejected {
                conn: id,
                rej: Box::new(r),
            },
        );
        self.conns.remove(&id);
        true
    }

    fn on_rep(&mut self, src: IpAddr, r: RepRepr) -> bool {
        let Some(id) = self.conn_for(r.remote_comm_id, r.local_comm_id) else {
            return false;
        };
        let c = self.conns.get_mut(&id).expect("found");
        if c.peer != src {
            return false;
        }
        match c.state {
            ConnState::ReqSent | ConnState::MraRcvd => {
                c.state = ConnState::RepRcvd;
                c.remote_id = r.local_comm_id;
                c.remote_guid = r.local_ca_guid;
                c.remote_qpn = r.local_qpn;
                c.deadline = None;
                self.event(
                    id,
                    CmEvent::RepReceived {
                        conn: id,
                        rep: Box::new(r),
                    },
                );
                true
            }
            ConnState::Established if c.remote_id == r.local_comm_id => {
                // Our RTU was lost: send it again.
                Counters::inc(&self.counters.cm_duplicates);
                if let Some(m) = c.last {
                    let (dst, q, tc) = (c.peer, c.peer_gsi, c.tclass);
                    self.send(dst, q, tc, m);
                }
                true
            }
            ConnState::RepRcvd => {
                Counters::inc(&self.counters.cm_duplicates);
                true
            }
            _ => false,
        }
    }

    fn on_rtu(&mut self, r: RtuRepr) -> bool {
        let Some(id) = self.conn_for(r.remote_comm_id, r.local_comm_id) else {
            return false;
        };
        let c = self.conns.get_mut(&id).expect("found");
        match c.state {
            ConnState::RepSent => {
                c.state = ConnState::Established;
                c.deadline = None;
                self.event(id, CmEvent::Established { conn: id });
                true
            }
            ConnState::Established => {
                Counters::inc(&self.counters.cm_duplicates);
                true
            }
            _ => false,
        }
    }

    fn on_dreq(&mut self, now: Nanos, src: IpAddr, src_qpn: u32, tid: u64, d: DreqRepr) -> bool {
        let drep = DrepRepr {
            local_comm_id: d.remote_comm_id,
            remote_comm_id: d.local_comm_id,
            ..DrepRepr::default()
        };
        let mad = CmMad {
            tid,
            msg: CmMessage::Drep(drep),
        };
        let known = self
            .conn_for(d.remote_comm_id, d.local_comm_id)
            .filter(|id| self.conns[id].peer == src);
        let Some(id) = known else {
            // Unknown: answer anyway so that the peer stops resending.
            Counters::inc(&self.counters.cm_dropped_mads);
            self.send(src, src_qpn, 0, mad);
            return true;
        };
        let c = &self.conns[&id];
        let tc = c.tclass;
        match c.state {
            ConnState::Established | ConnState::DreqSent | ConnState::RepSent => {
                // Twice: this DREP is usually the connection's last
                // message, and the peer resends its DREQ only after its
                // CM response timeout (the kernel's: ~5 s, 15 times,
                // while a synchronous rdma_disconnect waits). A kernel
                // CM answers those from its TimeWait long after the
                // process has gone; uroce's CM ends with its process,
                // often right after this DREP. The peer drops the
                // duplicate (a DREP outside DREQ sent).
                self.send(src, src_qpn, tc, mad);
                self.send(src, src_qpn, tc, mad);
                self.enter_timewait(now, id, d.private_data_224());
                true
            }
            ConnState::TimeWait => {
                Counters::inc(&self.counters.cm_duplicates);
                self.send(src, src_qpn, tc, mad);
                true
            }
            _ => false,
        }
    }

    fn on_drep(&mut self, now: Nanos, d: DrepRepr) -> bool {
        let Some(id) = self.conn_for(d.remote_comm_id, d.local_comm_id) else {
            return false;
        };
        match self.conns[&id].state {
            ConnState::DreqSent => {
                self.enter_timewait(now, id, d.private_data);
                true
            }
            ConnState::TimeWait => {
                Counters::inc(&self.counters.cm_duplicates);
                true
            }
            _ => false,
        }
    }

    fn on_sidr_req(
        &mut self,
        now: Nanos,
        src: IpAddr,
        src_qpn: u32,
        tid: u64,
        r: SidrReqRepr,
    ) -> bool {
        let dup = self.conns.iter().find_map(|(&id, c)| {
            (c.peer == src
                && c.remote_id == r.request_id
                && matches!(c.state, ConnState::SidrReqRcvd | ConnState::SidrRepSent))
            .then_some(id)
        });
        if let Some(id) = dup {
            Counters::inc(&self.counters.cm_duplicates);
            let c = &self.conns[&id];
            if c.state == ConnState::SidrRepSent {
                if let Some(m) = c.last {
                    self.send(src, src_qpn, c.tclass, m);
                }
            }
            return true;
        }
        if !self.listeners.contains_key(&r.service_id) || self.conns.len() >= MAX_CONNS {
            let rep = SidrRepRepr {
                request_id: r.request_id,
                status: SIDR_UNSUPPORTED,
                service_id: r.service_id,
                ..SidrRepRepr::default()
            };
            self.send(
                src,
                src_qpn,
                0,
                CmMad {
                    tid,
                    msg: CmMessage::SidrRep(rep),
                },
            );
            return true;
        }
        let id = self.new_id();
        self.conns.insert(
            id,
            Conn {
                state: ConnState::SidrReqRcvd,
                peer: src,
                peer_gsi: src_qpn,
                remote_id: r.request_id,
                remote_guid: 0,
                remote_qpn: 0,
                local_qpn: 0,
                service_id: r.service_id,
                last: Some(CmMad {
                    tid,
                    msg: CmMessage::SidrReq(r),
                }),
                // The user answers within the period or the entry goes.
                deadline: Some(now.plus(self.wait(self.cfg.response_timeout) * 4)),
                retries_left: 0,
                wait_ns: 0,
                max_retries: 0,
                peer_timeout: 0,
                user: true,
                // The kernel answers with the request's received traffic
                // class, which the agent is not told: 0.
                tclass: 0,
            },
        );
        self.event(
            id,
            CmEvent::SidrReqReceived {
                service_id: r.service_id,
                conn: id,
                src,
                req: Box::new(r),
            },
        );
        true
    }

    fn on_sidr_rep(&mut self, r: SidrRepRepr) -> bool {
        let Some(c) = self.conns.get(&r.request_id) else {
            return false;
        };
        if c.state != ConnState::SidrReqSent {
            return false;
        }
        let id = r.request_id;
        self.event(
            id,
            CmEvent::SidrRepReceived {
                conn: id,
                rep: Box::new(r),
            },
        );
        self.conns.remove(&id);
        true
    }
}

/// DREQ private data in the 224-byte shape `Disconnected` carries.
trait Private224 {
    fn private_data_224(&self) -> [u8; 224];
}

impl Private224 for DreqRepr {
    fn private_data_224(&self) -> [u8; 224] {
        let mut out = [0u8; 224];
        out[..self.private_data.len()].copy_from_slice(&self.private_data);
        out
    }
}

/// Tells the timeline of `mad`, sent to (`sent`) or received from QP
/// `qpn` at `peer`.
fn tell_mad(mad: &CmMad, sent: bool, peer: IpAddr, qpn: u32) {
    if observe::wants(Topic::TIMELINE) {
        let dir = if sent { "to" } else { "from" };
        let detail = format!("{dir} {peer} QP{qpn} tid {:#x}", mad.tid);
        observe::tell(Topic::TIMELINE, || Event::Cm {
            what: mad_name(&mad.msg, sent),
            conn: None,
            detail: &detail,
        });
    }
}

/// Copies `data` into the start of a message's private data field (the
/// rest stays as it is, zero in a fresh message); `TooLong` when it does
/// not fit.
fn put_private(field: &mut [u8], data: &[u8]) -> Result<(), CmError> {
    field
        .get_mut(..data.len())
        .ok_or(CmError::TooLong)?
        .copy_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests;
