//! Connection management: rdma_cm's model over uroce's CM agent.
//!
//! | librdmacm | uroce |
//! |---|---|
//! | `rdma_create_event_channel` / `rdma_get_cm_event` | [`EventChannel::new`], [`EventChannel::get_event`] |
//! | `rdma_create_id` | [`CmId::new`] |
//! | `rdma_bind_addr` / `rdma_resolve_addr` / `rdma_resolve_route` | [`CmId::bind_addr`], [`CmId::resolve_addr`], [`CmId::resolve_route`] |
//! | `rdma_listen` / `rdma_accept` / `rdma_reject` | [`CmId::listen`], [`CmId::accept`], [`CmId::reject`] |
//! | `rdma_create_qp` | [`CmId::create_qp`] |
//! | `rdma_connect` / `rdma_establish` / `rdma_disconnect` | [`CmId::connect`], [`CmId::establish`], [`CmId::disconnect`] |
//!
//! Addresses are IP addresses and ports as with the kernel's rdma_cm on
//! RoCE (IBTA Annex A11): a port and a port space make the CM service
//! ID, and a REQ (or SIDR_REQ) carries the CMA header with both IP
//! addresses and the active side's port ahead of the user's private data.
//! An address resolves to the uroce device that has it (or, for a remote
//! address, the device the route leaves from, else the only one).
//!
//! As in librdmacm, the QP moves through its states inside the calls and
//! the event processing: [`CmId::create_qp`] leaves an RC QP in INIT (a UD
//! QP in RTS), the REP's arrival moves the active side's QP to RTR and RTS
//! before [`CmEventType::Established`] is returned, and
//! [`CmId::accept`] moves the passive side's QP before the REP goes out.
//!
//! The event channel's descriptor is readable while an event waits: put
//! it in `poll`/`epoll` or an async reactor, then call
//! [`EventChannel::try_get_event`].

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::Duration;
use uroce_provider::cm::{self as pcm, CmAgent};
use uroce_provider::events::Semaphore;
use uroce_provider::qp_attr::{gid_of, ip_of_gid};
use uroce_verbs::{
    devices, Access, AddressVector, AttrMask, CmLayer, CmPort, ConnectOptions, Context, Device,
    Error, Mtu, ProtectionDomain, QpAttr, QpInitAttr, QpState, QpType, QueuePair, Result,
    MAX_RD_ATOM,
};
use uroce_wire::cm::{RepRepr, ReqRepr};
pub use uroce_wire::cma::PortSpace;
use uroce_wire::cma::{self, CmaHeaderRepr, CMA_HDR_LEN};

/// The Q_Key of rdma_cm's UD ids (`RDMA_UDP_QKEY`).
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `enum rdma_cm_event_type`, same numbering.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum CmEventType {
    AddrResolved = 0,
    AddrError = 1,
    RouteResolved = 2,
    RouteError = 3,
    ConnectRequest = 4,
    ConnectResponse = 5,
    ConnectError = 6,
    Unreachable = 7,
    Rejected = 8,
    Established = 9,
    Disconnected = 10,
    DeviceRemoval = 11,
    MulticastJoin = 12,
    MulticastError = 13,
    AddrChange = 14,
    TimewaitExit = 15,
}

impl CmEventType {
    /// The words `rdma_event_str` gives.
    pub fn as_str(self) -> &'static str {
        use CmEventType::*;
        match self {
            AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            Rejected => "RDMA_CM_EVENT_REJECTED",
            Established => "RDMA_CM_EVENT_ESTABLISHED",
            Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        }
    }
}

/// `struct rdma_conn_param`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (at most 56 bytes in a TCP-port-space connect, 196 in
    /// an accept, 148 in a reject).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics the peer may have outstanding at us.
    pub responder_resources: u8,
    /// RDMA READs/atomics we may have outstanding at the peer.
    pub initiator_depth: u8,
    /// End-to-end flow control (carried, not used).
    pub flow_control: bool,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits; 7: forever).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (for an id without a QP).
    pub srq: bool,
    /// The QP number (for an id without a QP).
    pub qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: false,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }
}

/// `struct rdma_ud_param`: where a UD peer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParam {
    /// Private data.
    pub private_data: Vec<u8>,
    /// The address vector to reach the peer.
    pub ah_attr: AddressVector,
    /// The peer's QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `struct rdma_cm_event`.
#[derive(Debug, Clone)]
pub struct CmEvent {
    /// What happened.
    pub event: CmEventType,
    /// The id it happened to (for a connect request: the new id).
    pub id: CmId,
    /// For a connect request: the listening id.
    pub listen_id: Option<CmId>,
    /// 0, a REJ reason (rejected), a SIDR status, or a negative errno.
    pub status: i32,
    /// Connection parameters (connected ids).
    pub conn: ConnParam,
    /// UD parameters (UD ids).
    pub ud: Option<UdParam>,
}

// ---------------------------------------------------------------------
// The device side: routing the agent's events to ids
// ---------------------------------------------------------------------

/// rdma_cm's layer on a device's [`CmPort`]: which id each connection
/// and listened service belongs to.
#[derive(Default)]
struct Ids {
    routes: Mutex<Routes>,
}

/// A device's CM as rdma_cm uses it: the device's port (its agent) and
/// rdma_cm's layer on it.
#[derive(Clone)]
struct CmDevice {
    port: Arc<CmPort>,
    ids: Arc<Ids>,
}

impl std::fmt::Debug for CmDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CmDevice({})", self.port.ip())
    }
}

#[derive(Default)]
struct Routes {
    conns: HashMap<u32, Weak<IdInner>>,
    /// Per service: the ids listening (two when an IPv4 and an IPv6 id
    /// restricted to their families share a port).
    listeners: HashMap<u64, Vec<Listener>>,
}

/// An id listening on a service.
struct Listener {
    id: Weak<IdInner>,
    /// The IP version of the CMA headers it takes (`Some(true)`: IPv4
    /// only; `None`: both), as the kernel's `cma_match_private_data`.
    v4: Option<bool>,
}

impl Routes {
    /// The listener on `sid` for a request whose CMA header (at the start
    /// of `private_data`) is of its IP version; without a CMA header (the
    /// IB port space), the first.
    fn listener(&self, sid: u64, private_data: &[u8]) -> Option<Arc<IdInner>> {
        let v4 = cma::CmaHeader::new_checked(private_data)
            .ok()
            .and_then(|h| CmaHeaderRepr::parse(&h).ok())
            .map(|h| h.src.is_ipv4());
        self.listeners
            .get(&sid)?
            .iter()
            .filter(|l| l.v4.is_none() || v4.is_none() || l.v4 == v4)
            .find_map(|l| l.id.upgrade())
    }

    /// Removes `id`'s listen on `sid` (and listeners gone); true when
    /// nobody listens there any more.
    fn unlisten(&mut self, sid: u64, id: *const IdInner) -> bool {
        let Some(list) = self.listeners.get_mut(&sid) else {
            return true;
        };
        list.retain(|l| l.id.strong_count() > 0 && !std::ptr::eq(l.id.as_ptr(), id));
        if list.is_empty() {
            self.listeners.remove(&sid);
            return true;
        }
        false
    }
}

impl CmDevice {
    /// The CM of `ctx`'s device, rdma_cm's layer installed on its port
    /// the first time.
    fn of(ctx: &Context) -> Result<CmDevice> {
        let port = ctx.cm_port().clone();
        let ids = port
            .layer(Ids::default)
            .ok_or_else(|| Error::Invalid("another CM layer holds the device".into()))?;
        Ok(CmDevice { port, ids })
    }

    /// The device's address.
    fn ip(&self) -> IpAddr {
        self.port.ip()
    }

    fn routes(&self) -> MutexGuard<'_, Routes> {
        self.ids.routes.lock()
    }

    /// Stops `id`'s listen on `sid`: the agent stops taking its REQs once
    /// no other id listens there.
    fn unlisten(&self, sid: u64, id: *const IdInner) {
        if self.routes().unlisten(sid, id) {
            self.with_agent(|a, _| a.unlisten(sid));
        }
    }

    /// Runs `f` on the agent, then lets the engine send what it queued.
    fn with_agent<T>(&self, f: impl FnOnce(&mut CmAgent, pcm::Nanos) -> T) -> T {
        self.port.with_agent(f)
    }

    /// Waits (at most `limit`) while our DREQ for `conn` is unanswered.
    /// The kernel's CM answers the peer from time-wait after the program
    /// has gone; uroce's CM goes with the program. A program that
    /// disconnects, destroys its id and exits at once (perftest -R's
    /// server) would otherwise leave a peer whose own DREQ crossed a lost
    /// one of ours with nobody to answer it: ~100 s of DREQ retries
    /// before the kernel reports DISCONNECTED. The peer's DREP, or its
    /// DREQ (answered), ends the wait; the time-wait period bounds it.
    /// The DREQ goes again every quarter of the wait: the retries at the
    /// peer's response timeout (4.3 s from the kernel) would come after
    /// the program has gone, and a peer whose only DREQ from us was lost
    /// (and who sends none of its own: rping's server waits for
    /// DISCONNECTED) would wait forever.
    fn linger(&self, conn: u32, limit: Duration) {
        let start = std::time::Instant::now();
        let mut resent = 0u32;
        while start.elapsed() < limit
            && self.port.peek(|a| a.state(conn)) == Some(pcm::ConnState::DreqSent)
        {
            if start.elapsed() >= limit / 4 * (resent + 1) {
                resent += 1;
                self.with_agent(|a, _| a.resend_last(conn));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl CmLayer for Ids {
    /// On the engine thread: each event to its id's channel.
    fn route(&self, port: &CmPort, events: Vec<pcm::CmEvent>) {
        for e in events {
            let target = {
                let routes = self.routes.lock();
                match &e {
                    pcm::CmEvent::ReqReceived {
                        service_id, req, ..
                    } => routes.listener(*service_id, &req.private_data),
                    pcm::CmEvent::SidrReqReceived {
                        service_id, req, ..
                    } => routes.listener(*service_id, &req.private_data),
                    other => routes.conns.get(&event_conn(other)).and_then(Weak::upgrade),
                }
            };
            match target {
                Some(id) => {
                    {
                        // Under the id's channel lock: migrate() moves what
                        // is queued, so nothing may land in the old channel
                        // after it.
                        let ch = id.channel.lock();
                        ch.push(Pending::Agent(id.clone(), e));
                    }
                    release_off_engine_thread(id);
                }
                // Nobody wants it (the id went away): a request is
                // refused, the rest is forgotten.
                None => port.refuse(e),
            }
        }
    }
}

/// Lets go of a handle `route` upgraded on the engine thread. The user may
/// have taken the event and dropped the id meanwhile; then this is the
/// last handle, and dropping an id destroys its QP and may drop the
/// device, which waits for the engine thread: on the engine thread itself
/// that would never return. The last handle is released on a thread of
/// its own instead.
fn release_off_engine_thread(id: Arc<IdInner>) {
    if let Ok(last) = Arc::try_unwrap(id) {
        let _ = uroce_provider::threads::spawn("uroce-cm-release".into(), move || drop(last));
    }
}

fn event_conn(e: &pcm::CmEvent) -> u32 {
    use pcm::CmEvent::*;
    match e {
        ReqReceived { conn, .. }
        | RepReceived { conn, .. }
        | Established { conn }
        | Rejected { conn, .. }
        | Unreachable { conn }
        | Disconnected { conn, .. }
        | TimewaitExit { conn }
        | SidrReqReceived { conn, .. }
        | SidrRepReceived { conn, .. } => *conn,
    }
}

// ---------------------------------------------------------------------
// Event channels
// ---------------------------------------------------------------------

enum Pending {
    /// Ready for the user.
    Ready(CmEvent),
    /// From the agent: processed in `get_event` on the user's thread
    /// (it may move QPs, which the engine thread cannot wait for).
    Agent(Arc<IdInner>, pcm::CmEvent),
}

struct Channel {
    queue: Mutex<VecDeque<Pending>>,
    sem: Semaphore,
}

impl Channel {
    fn push(&self, p: Pending) {
        self.queue.lock().push_back(p);
        self.sem.post();
    }
}

/// An event channel (`struct rdma_event_channel`).
#[derive(Clone)]
pub struct EventChannel {
    inner: Arc<Channel>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EventChannel(fd {})", self.inner.sem.fd())
    }
}

impl AsRawFd for EventChannel {
    /// Readable while an event waits.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.sem.fd()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`.
    pub fn new() -> Result<EventChannel> {
        let sem = Semaphore::new().map_err(|e| Error::Engine(format!("event channel: {e}")))?;
        Ok(EventChannel {
            inner: Arc::new(Channel {
                queue: Mutex::new(VecDeque::new()),
                sem,
            }),
        })
    }

    /// `rdma_get_cm_event`: waits for the next event. A signal handler
    /// that interrupts the wait ends it with [`Error::Interrupted`], as it
    /// ends the kernel's wait in the `write(2)` librdmacm makes on its
    /// channel (see [`Semaphore::wait`] for `SA_RESTART`).
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            self.inner.sem.wait().map_err(Error::from_wait)?;
            if let Some(e) = self.pop() {
                return Ok(e);
            }
        }
    }

    /// The next event, or `Err(WouldBlock)` if none waits.
    pub fn try_get_event(&self) -> Result<CmEvent> {
        self.get_event_timeout(Some(Duration::ZERO))?
            .ok_or(Error::WouldBlock)
    }

    /// The next event within `timeout` (`None`: wait forever).
    pub fn get_event_timeout(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            if !self.inner.sem.take(left) {
                return Ok(None);
            }
            if let Some(e) = self.pop() {
                return Ok(Some(e));
            }
        }
    }

    /// The event the count just taken stands for, if it makes one for
    /// the program (an agent's event may not).
    fn pop(&self) -> Option<CmEvent> {
        let p = self.inner.queue.lock().pop_front()?;
        match p {
            Pending::Ready(e) => Some(e),
            Pending::Agent(id, e) => process(&id, e).inspect(|_| on_the_wire(&id)),
        }
    }
}

// ---------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdState {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Passive, before accept/reject.
    ConnectRequest,
    /// REQ sent.
    Connecting,
    /// Active: REP received, QP ready, RTU not yet sent (no QP on the id).
    ConnectResponse,
    /// Passive: REP sent.
    Accepted,
    Connected,
    Disconnected,
    /// SIDR_REQ sent.
    Resolving,
}

struct IdState2 {
    state: IdState,
    ctxs: Vec<Context>,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    conn: Option<u32>,
    listening: Option<u64>,
    qp: Option<Arc<QueuePair>>,
    /// Passive: the REQ being answered.
    req: Option<Box<ReqRepr>>,
    /// Our receive queue's starting PSN: what our REQ or REP announces,
    /// and where the peer's sends start (a UD QP's send PSN).
    psn: u32,
    /// What the REQ and REP settled for the QP (once known).
    path: Option<QpPath>,
    /// The retry count our REQ asked for.
    retry_count: u8,
    /// `rdma_set_afonly`'s value, if the user set it (else it follows the
    /// bound address family, see [`afonly_default`]).
    afonly: Option<bool>,
    /// The multicast groups joined: (address, MGID, send-only).
    mcast: Vec<(SocketAddr, [u8; 16], bool)>,
    /// `RDMA_OPTION_ID_TOS` as last set.
    tos: u8,
    /// The traffic class of the resolved route (`tos` as it was at
    /// `resolve_route`, as the kernel's `cma_resolve_iboe_route` puts it
    /// in the path record): what our REQ's path (and so both QPs and the
    /// CM's MADs), or our UD peer's address, carries.
    route_tos: u8,
}

/// The QP attributes a connection's REQ and REP settle.
#[derive(Debug, Clone, Copy)]
struct QpPath {
    peer: IpAddr,
    mtu: Mtu,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    max_dest_rd_atomic: u8,
    max_rd_atomic: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    /// The path's traffic class (the IP TOS of the QP's packets).
    traffic_class: u8,
}

struct IdInner {
    /// Where its events go (`rdma_migrate_id` changes it).
    channel: Mutex<Arc<Channel>>,
    ps: PortSpace,
    qp_type: QpType,
    st: Mutex<IdState2>,
}

impl IdInner {
    /// What destroying the id does (once): its listen ends, its
    /// connection is torn down as its state says, and a DREQ of ours
    /// still unanswered is waited for (see [`CmDevice::linger`]).
    fn teardown(&self) {
        let (listening, conn, ctxs) = {
            let mut st = self.st.lock();
            (st.listening.take(), st.conn.take(), st.ctxs.clone())
        };
        for ctx in ctxs.iter() {
            if let (Some(sid), Ok(dev)) = (listening, CmDevice::of(ctx)) {
                dev.unlisten(sid, self);
            }
        }
        if let (Some(conn), Some(ctx)) = (conn, ctxs.first()) {
            let Ok(dev) = CmDevice::of(ctx) else {
                return;
            };
            dev.routes().conns.remove(&conn);
            let linger = dev.with_agent(|a, now| {
                a.destroy(now, conn);
                (a.state(conn) == Some(pcm::ConnState::DreqSent)).then(|| a.timewait_ns())
            });
            // Never on the engine thread: the wait needs it to run.
            if let Some(ns) = linger.filter(|_| !ctx.on_engine_thread()) {
                dev.linger(conn, Duration::from_nanos(ns));
                // A whole engine pass more: the DREPs that answered the
                // peer's DREQ are sent, not just queued.
                let _ = ctx.settle();
            }
        }
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// An rdma_cm identifier (`struct rdma_cm_id`). Clones share it; it is
/// destroyed (`rdma_destroy_id`: the connection torn down as its state
/// says) when the last clone and every event naming it are dropped.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.st.lock();
        write!(
            f,
            "CmId({:?} {:?} {:?} -> {:?})",
            self.inner.ps, st.state, st.src, st.dst
        )
    }
}

impl PartialEq for CmId {
    fn eq(&self, o: &CmId) -> bool {
        Arc::ptr_eq(&self.inner, &o.inner)
    }
}

impl Eq for CmId {}

impl std::hash::Hash for CmId {
    /// The id's identity, as `==` compares it.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        Arc::as_ptr(&self.inner).hash(h)
    }
}

fn mtu_of(v: u8) -> Mtu {
    Mtu::from_u32(v as u32).unwrap_or(Mtu::Mtu1024)
}

/// An address that binds no particular device, as the kernel's CMA
/// treats it (`cma_any_addr`): the wildcard, and a loopback address
/// (127/8, ::1) that no uroce device has. An id bound to one listens on
/// every device and picks its device when it resolves a destination, as
/// on the wildcard. (libfabric's verbs provider binds 127.0.0.1 to ask
/// for "any device".)
pub fn binds_any(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_unspecified()
        || (ip.is_loopback()
            && !devices().is_ok_and(|d| d.iter().any(|d| d.ip().to_canonical() == ip)))
}

/// The uroce device (opened, shared in the process) that has `ip`.
fn context_for(ip: IpAddr) -> Result<Context> {
    let ip = ip.to_canonical();
    let devs = devices()?;
    let dev = devs
        .iter()
        .find(|d| d.ip().to_canonical() == ip)
        .ok_or_else(|| Error::AddrNotAvailable(ip.to_string()))?;
    dev.open_shared()
}

/// The device to reach `dst` from: the one that has `dst`, else the one
/// the kernel's route to `dst` leaves from, else the only one (of the
/// right family).
pub(crate) fn device_towards(dst: IpAddr) -> Result<Device> {
    let devs = devices()?;
    let dst = dst.to_canonical();
    if let Some(d) = devs.iter().find(|d| d.ip().to_canonical() == dst) {
        return Ok(d.clone());
    }
    // A kernel socket even under librspreload (see kernel_udp_socket).
    let domain = if dst.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if let Ok(sock) =
        uroce_provider::engine::kernel_udp_socket(domain).map(std::net::UdpSocket::from)
    {
        if sock.connect(SocketAddr::new(dst, 9)).is_ok() {
            if let Ok(local) = sock.local_addr() {
                if let Some(d) = devs.iter().find(|d| d.ip() == local.ip()) {
                    return Ok(d.clone());
                }
            }
        }
    }
    let same: Vec<_> = devs
        .iter()
        .filter(|d| d.ip().is_ipv4() == dst.is_ipv4())
        .collect();
    match same.as_slice() {
        [d, ..] => Ok((*d).clone()),
        [] => Err(Error::AddrNotAvailable(dst.to_string())),
    }
}

/// (address, port space, port) -> the id bound there, and whether it is
/// restricted to its address family (the kernel's `afonly`, fixed at
/// bind time).
type PortTable = Mutex<HashMap<(IpAddr, u16, u16), (Weak<IdInner>, bool)>>;

/// The kernel CMA's `afonly` for an id bound without `rdma_set_afonly`:
/// an IPv4 id is restricted to IPv4; an IPv6 id to IPv6 only if the
/// host's `net.ipv6.bindv6only` says so (default 0: an IPv6 wildcard
/// also takes IPv4, and conflicts with an IPv4 bind of its port).
fn afonly_default(ip: IpAddr) -> bool {
    ip.is_ipv4()
        || std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "1")
}

/// Ports this process has bound, per (device address, port space).
fn ports() -> &'static PortTable {
    static P: std::sync::OnceLock<PortTable> = std::sync::OnceLock::new();
    P.get_or_init(Default::default)
}

impl CmId {
    /// `rdma_destroy_id` now, whatever clones and queued events remain:
    /// the listen ends and the connection is torn down as its state says
    /// (a DREQ for an established one, then a wait of at most the
    /// time-wait period for its answer: the peer has nobody to answer it
    /// once this program exits). Dropping the last clone does the same.
    pub fn destroy(&self) {
        self.inner.teardown();
    }

    /// `rdma_create_id`: an id in `ps` (TCP and IB: RC; UDP: UD) whose
    /// events go to `channel`.
    pub fn new(channel: &EventChannel, ps: PortSpace) -> Result<CmId> {
        let qp_type = match ps {
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
            _ => QpType::Rc,
        };
        Self::with_type(channel, ps, qp_type)
    }

    /// `rdma_create_id` with an explicit QP type (RC or UC over TCP/IB,
    /// UD over UDP).
    pub fn with_type(channel: &EventChannel, ps: PortSpace, qp_type: QpType) -> Result<CmId> {
        Ok(CmId {
            inner: Arc::new(IdInner {
                channel: Mutex::new(channel.inner.clone()),
                ps,
                qp_type,
                st: Mutex::new(IdState2 {
                    state: IdState::Idle,
                    ctxs: Vec::new(),
                    src: None,
                    dst: None,
                    conn: None,
                    listening: None,
                    qp: None,
                    req: None,
                    psn: uroce_wire::Psn::random().value(),
                    path: None,
                    retry_count: 7,
                    afonly: None,
                    mcast: Vec::new(),
                    tos: 0,
                    route_tos: 0,
                }),
            }),
        })
    }

    /// `rdma_set_option(RDMA_OPTION_ID_TOS)`: the traffic class (IP TOS,
    /// DSCP and ECN bits) of the route the next `resolve_route` resolves,
    /// as in the kernel: the REQ's path carries it, so both sides' QPs
    /// and the CM's own MADs (REQ, REP, RTU, DREQ, DREP) take it as
    /// their traffic class (and a UD id's peer address). A route already
    /// resolved keeps the traffic class it was resolved with.
    pub fn set_tos(&self, tos: u8) {
        self.inner.st.lock().tos = tos;
    }

    /// The traffic class set with [`CmId::set_tos`] (0 by default).
    pub fn tos(&self) -> u8 {
        self.inner.st.lock().tos
    }

    /// The resolved route's traffic class (see [`CmId::set_tos`]).
    pub fn route_tos(&self) -> u8 {
        self.inner.st.lock().route_tos
    }

    /// `rdma_migrate_id`: from now on the id's events go to `channel`,
    /// and so do those already queued for it on its old channel.
    pub fn migrate(&self, channel: &EventChannel) {
        let mut cur = self.inner.channel.lock();
        if Arc::ptr_eq(&cur, &channel.inner) {
            return;
        }
        let old = std::mem::replace(&mut *cur, channel.inner.clone());
        let mine = |p: &Pending| match p {
            Pending::Ready(e) => Arc::ptr_eq(&e.id.inner, &self.inner),
            Pending::Agent(id, _) => Arc::ptr_eq(id, &self.inner),
        };
        let moved: Vec<Pending> = {
            let mut q = old.queue.lock();
            let (moved, kept): (Vec<Pending>, Vec<Pending>) = q.drain(..).partition(|p| mine(p));
            *q = kept.into();
            moved
        };
        // The old channel keeps their counts: a reader that takes one finds
        // the queue without it and waits again (taking them here could
        // block on a descriptor the program made blocking).
        for p in moved {
            channel.inner.push(p);
        }
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.inner.ps
    }
    /// The QP type connections of this id use.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }
    /// The device context (`id->verbs`), once an address is bound.
    pub fn context(&self) -> Option<Context> {
        self.inner.st.lock().ctxs.first().cloned()
    }
    /// The QP created on the id.
    pub fn qp(&self) -> Option<Arc<QueuePair>> {
        self.inner.st.lock().qp.clone()
    }
    /// The local address (`rdma_get_local_addr`).
    pub fn src_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().src
    }
    /// The peer's address (`rdma_get_peer_addr`).
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        self.inner.st.lock().dst
    }

    fn reserve_port(&self, ip: IpAddr, port: u16, afonly: bool) -> Result<u16> {
        let mut p = ports().lock();
        p.retain(|_, (w, _)| w.strong_count() > 0);
        let ps = self.inner.ps as u16;
        // As the kernel's CMA (cma_check_port, without REUSEADDR): two
        // ids restricted to their address families (afonly) do not meet
        // when the families differ; otherwise a port bound on the
        // wildcard address conflicts with every address
        // (EADDRNOTAVAIL), and the same address twice is EADDRINUSE.
        let clash = |q: u16| {
            let mut bound = p.iter().filter(|((_, s, pt), _)| *s == ps && *pt == q);
            bound.find_map(|(&(other, ..), &(_, other_afonly))| {
                if afonly && other_afonly && other.is_ipv4() != ip.is_ipv4() {
                    None
                } else if binds_any(other) || binds_any(ip) {
                    Some(Error::PortConflict(q))
                } else if other == ip {
                    Some(Error::AddrInUse)
                } else {
                    None
                }
            })
        };
        let port = if port == 0 {
            // An ephemeral port, as the kernel picks one (its local range).
            loop {
                let q = 32768 + (rand::random::<u16>() % 28232);
                if clash(q).is_none() {
                    break q;
                }
            }
        } else {
            port
        };
        if let Some(e) = clash(port) {
            return Err(e);
        }
        p.insert((ip, ps, port), (Arc::downgrade(&self.inner), afonly));
        Ok(port)
    }

    /// `rdma_set_afonly` (`RDMA_OPTION_ID_AFONLY`): whether the id, once
    /// bound, takes only its own address family: an IPv6 listener with it
    /// takes no IPv4 connections, and may share its port with an IPv4
    /// one (tgtd binds `0.0.0.0` and `[::]` so). Before or right after
    /// `bind_addr`, as the kernel allows; a bound id's port is not
    /// checked again.
    pub fn set_afonly(&self, afonly: bool) -> Result<()> {
        let mut st = self.inner.st.lock();
        match st.state {
            IdState::Idle => {}
            IdState::AddrBound => {
                if let Some(src) = st.src {
                    let key = (src.ip(), self.inner.ps as u16, src.port());
                    if let Some(e) = ports().lock().get_mut(&key) {
                        e.1 = afonly;
                    }
                }
            }
            _ => return Err(Error::Invalid("set_afonly after listen or connect".into())),
        }
        st.afonly = Some(afonly);
        Ok(())
    }

    /// `rdma_bind_addr`: to a device's address, or to the wildcard address
    /// or a loopback address no device has (every device: [`binds_any`]).
    /// Port 0 picks a free port.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::Idle {
            return Err(Error::Invalid("the id is bound already".into()));
        }
        let ctxs = if binds_any(addr.ip()) {
            let all: Vec<Context> = devices()?
                .iter()
                .filter(|d| d.ip().is_ipv4() == addr.is_ipv4() || addr.is_ipv6())
                .map(|d| d.open_shared())
                .collect::<Result<_>>()?;
            if all.is_empty() {
                return Err(Error::AddrNotAvailable(addr.ip().to_string()));
            }
            all
        } else {
            vec![context_for(addr.ip())?]
        };
        let afonly = st.afonly.unwrap_or_else(|| afonly_default(addr.ip()));
        let port = self.reserve_port(addr.ip(), addr.port(), afonly)?;
        st.src = Some(SocketAddr::new(addr.ip(), port));
        st.ctxs = ctxs;
        st.state = IdState::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: finds the device for `dst` (from `src` if
    /// given) and reports [`CmEventType::AddrResolved`].
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        let state = self.inner.st.lock().state;
        if state == IdState::Idle {
            let src = match src {
                Some(s) => s,
                None => SocketAddr::new(device_towards(dst.ip())?.ip(), 0),
            };
            self.bind_addr(src)?;
        } else if state != IdState::AddrBound {
            return Err(Error::Invalid("resolve_addr: wrong id state".into()));
        }
        let mut st = self.inner.st.lock();
        let src_ip = st.src.map(|s| s.ip());
        // A source of the other family: EINVAL at once, the id left bound
        // (the kernel's resolve_prepare_src, "cma_family(id_priv) !=
        // dst_addr->sa_family").
        if src_ip.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(Error::Invalid(
                "resolve_addr: the source and destination are of different families".into(),
            ));
        }
        if src_ip.is_some_and(binds_any) {
            // Bound to no device: narrow to the device towards dst.
            let d = device_towards(dst.ip())?;
            st.ctxs = vec![d.open_shared()?];
            let port = st.src.map_or(0, |s| s.port());
            st.src = Some(SocketAddr::new(d.ip(), port));
        }
        st.dst = Some(dst);
        st.state = IdState::AddrResolved;
        drop(st);
        self.ready(CmEventType::AddrResolved, 0);
        Ok(())
    }

    /// `rdma_resolve_route`: on RoCE the route is the address; reports
    /// [`CmEventType::RouteResolved`].
    pub fn resolve_route(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::AddrResolved {
            return Err(Error::Invalid("resolve_route before resolve_addr".into()));
        }
        st.state = IdState::RouteResolved;
        st.route_tos = st.tos;
        drop(st);
        self.ready(CmEventType::RouteResolved, 0);
        Ok(())
    }

    fn ready(&self, event: CmEventType, status: i32) {
        self.inner.channel.lock().push(Pending::Ready(CmEvent {
            event,
            id: self.clone(),
            listen_id: None,
            status,
            conn: ConnParam::default(),
            ud: None,
        }));
    }

    fn service_id(&self, port: u16) -> u64 {
        cma::service_id(self.inner.ps, port)
    }

    /// `rdma_listen`: takes connection requests (and SIDR requests) for
    /// the bound port on its device(s).
    pub fn listen(&self, _backlog: i32) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::AddrBound {
            return Err(Error::Invalid("listen needs a bound id".into()));
        }
        let port = st.src.map_or(0, |s| s.port());
        let sid = self.service_id(port);
        let afonly = st
            .afonly
            .unwrap_or_else(|| st.src.is_some_and(|s| afonly_default(s.ip())));
        let v4 = st.src.filter(|_| afonly).map(|s| s.is_ipv4());
        let me = Arc::as_ptr(&self.inner);
        for (i, ctx) in st.ctxs.iter().enumerate() {
            let dev = CmDevice::of(ctx)?;
            let first = {
                let mut routes = dev.routes();
                let list = routes.listeners.entry(sid).or_default();
                list.retain(|l| l.id.strong_count() > 0);
                list.push(Listener {
                    id: Arc::downgrade(&self.inner),
                    v4,
                });
                list.len() == 1
            };
            if first && dev.with_agent(|a, _| a.listen(sid)).is_err() {
                for dev in st.ctxs[..=i].iter().filter_map(|c| CmDevice::of(c).ok()) {
                    dev.unlisten(sid, me);
                }
                return Err(Error::AddrInUse);
            }
        }
        st.listening = Some(sid);
        st.state = IdState::Listen;
        Ok(())
    }

    /// `rdma_create_qp`: a QP on the id's device, moved to INIT (RC, UC)
    /// or through to RTS (UD, with `RDMA_UDP_QKEY`).
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        init: &QpInitAttr<'_>,
    ) -> Result<Arc<QueuePair>> {
        if init.qp_type != self.inner.qp_type {
            return Err(Error::Invalid(format!(
                "the id takes a {:?} QP",
                self.inner.qp_type
            )));
        }
        if self.inner.st.lock().qp.is_some() {
            return Err(Error::Invalid("the id has a QP already".into()));
        }
        let qp = Arc::new(pd.create_qp(init)?);
        self.attach_qp(qp.clone())?;
        Ok(qp)
    }

    /// Makes `qp` (of this id's device, in RESET) the id's QP, as
    /// [`CmId::create_qp`] does with the QP it creates: moved to INIT (RC,
    /// UC) or through to RTS (UD).
    pub fn attach_qp(&self, qp: Arc<QueuePair>) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.qp.is_some() {
            return Err(Error::Invalid("the id has a QP already".into()));
        }
        if qp.qp_type() != self.inner.qp_type {
            return Err(Error::Invalid(format!(
                "the id takes a {:?} QP",
                self.inner.qp_type
            )));
        }
        let (a, m) = init_attr(self.inner.qp_type);
        qp.modify(&a, m)?;
        if self.inner.qp_type == QpType::Ud {
            let mut a = QpAttr {
                qp_state: QpState::Rtr,
                ..QpAttr::default()
            };
            qp.modify(&a, AttrMask::STATE)?;
            a.qp_state = QpState::Rts;
            a.sq_psn = st.psn;
            qp.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)?;
        }
        st.qp = Some(qp);
        Ok(())
    }

    /// `rdma_join_multicast` on RoCE, as the kernel's CMA does it
    /// (`cma_iboe_join_multicast`): no SA, the MGID is the group's IPv4
    /// address, IPv4-mapped; the id's QP (unless `send_only`) is attached
    /// to it as librdmacm does on the event; then
    /// [`CmEventType::MulticastJoin`] reports where to send (QP 0xFFFFFF,
    /// Q_Key `RDMA_UDP_QKEY`, hop limit 64), or `MulticastError` with the
    /// attach's error. EINVAL for an id not bound, not UD, or the zero
    /// address; IPv6 groups are refused (EOPNOTSUPP) as the kernel refuses
    /// them on RoCE v2.
    pub fn join_multicast(&self, addr: SocketAddr, send_only: bool) -> Result<()> {
        let mut st = self.inner.st.lock();
        if !matches!(st.state, IdState::AddrBound | IdState::AddrResolved) {
            return Err(Error::Invalid("join_multicast needs a bound id".into()));
        }
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::Invalid("join_multicast needs a UD id".into()));
        }
        if addr.ip().is_unspecified() {
            return Err(Error::Invalid("join_multicast: the zero address".into()));
        }
        let IpAddr::V4(v4) = addr.ip().to_canonical() else {
            return Err(Error::NotSupported(
                "IPv6 multicast on RoCE v2 (the kernel's CMA refuses it too)",
            ));
        };
        if st
            .src
            .is_some_and(|s| s.is_ipv6() && !s.ip().is_unspecified())
        {
            return Err(Error::Invalid("an IPv4 group on an IPv6 id".into()));
        }
        let mgid = v4.to_ipv6_mapped().octets();
        let attached = match (&st.qp, send_only) {
            (Some(qp), false) => qp.attach_mcast(&mgid, 0),
            _ => Ok(()),
        };
        if attached.is_ok() {
            st.mcast.push((addr, mgid, send_only));
        }
        drop(st);
        let ud = UdParam {
            private_data: Vec::new(),
            ah_attr: AddressVector {
                dgid: mgid,
                hop_limit: 64,
                ..AddressVector::default()
            },
            qp_num: uroce_provider::device::MULTICAST_QPN,
            qkey: RDMA_UDP_QKEY,
        };
        let (event, status) = match attached {
            Ok(()) => (CmEventType::MulticastJoin, 0),
            Err(e) => (CmEventType::MulticastError, -e.errno()),
        };
        self.inner.channel.lock().push(Pending::Ready(CmEvent {
            event,
            id: self.clone(),
            listen_id: None,
            status,
            conn: ConnParam::default(),
            ud: Some(ud),
        }));
        Ok(())
    }

    /// `rdma_leave_multicast`: detaches the id's QP from a group it joined
    /// (EADDRNOTAVAIL for an address not joined, as librdmacm answers).
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        let at = st
            .mcast
            .iter()
            .position(|(a, ..)| a.ip() == addr.ip())
            .ok_or_else(|| Error::AddrNotAvailable(addr.ip().to_string()))?;
        let (_, mgid, send_only) = st.mcast.remove(at);
        // As librdmacm: the detach's own error (a QP destroyed since,
        // which detached it) is not the caller's.
        if let (Some(qp), false) = (&st.qp, send_only) {
            let _ = qp.detach_mcast(&mgid, 0);
        }
        Ok(())
    }

    /// Forgets the id's QP (`rdma_destroy_qp`); the caller destroys it.
    pub fn detach_qp(&self) -> Option<Arc<QueuePair>> {
        self.inner.st.lock().qp.take()
    }

    /// `rdma_init_qp_attr`: the attributes (and mask) that move a QP of
    /// this connection to `state`: INIT at any time, RTR and RTS once the
    /// REQ (passive) or REP (active) has settled them.
    pub fn init_qp_attr(&self, state: QpState) -> Result<(QpAttr, AttrMask)> {
        let st = self.inner.st.lock();
        match state {
            QpState::Init => Ok(init_attr(self.inner.qp_type)),
            QpState::Rtr | QpState::Rts if self.inner.qp_type == QpType::Ud => {
                let a = QpAttr {
                    qp_state: state,
                    sq_psn: st.psn,
                    ..QpAttr::default()
                };
                let m = if state == QpState::Rts {
                    AttrMask::STATE | AttrMask::SQ_PSN
                } else {
                    AttrMask::STATE
                };
                Ok((a, m))
            }
            QpState::Rtr | QpState::Rts => {
                let p = match (st.path, &st.req, st.ctxs.first()) {
                    (Some(p), ..) => p,
                    // A connect request not yet accepted: what the REQ
                    // asked for (the kernel's CM answers so too; accept's
                    // parameters may still lower the RDMA READ depths).
                    (None, Some(req), Some(ctx)) => req_path(
                        &st,
                        req,
                        ctx,
                        req.initiator_depth.min(MAX_RD_ATOM),
                        req.responder_resources.min(MAX_RD_ATOM),
                    ),
                    _ => {
                        return Err(Error::Invalid(
                            "the connection is not negotiated yet".into(),
                        ))
                    }
                };
                Ok(path_attr(&p, state, self.inner.qp_type == QpType::Rc))
            }
            _ => Err(Error::Invalid(format!("no attributes for {state:?}"))),
        }
    }

    /// `rdma_connect`: sends the REQ (connected ids) or SIDR_REQ (UD ids).
    #[allow(clippy::field_reassign_with_default)] // a REQ has 27 fields
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::RouteResolved {
            return Err(Error::Invalid("connect before resolve_route".into()));
        }
        let (src, dst, ctx) = match (st.src, st.dst, st.ctxs.first().cloned()) {
            (Some(s), Some(d), Some(c)) => (s, d, c),
            _ => return Err(Error::Invalid("connect: no route".into())),
        };
        let pdata =
            self.with_cma_header(src, dst, &param.private_data, max_req_pdata(self.inner.ps))?;
        let sid = self.service_id(dst.port());
        let dev = CmDevice::of(&ctx)?;
        let dst_ip = dst.ip().to_canonical();
        let tos = st.route_tos;
        // The route to this id is in place before the REQ leaves: held
        // across the send, the routes' lock keeps the engine thread from
        // handing out the answer (a REP from a fast peer) before the id
        // is registered for it. Routed to nobody, the REP was forgotten,
        // its retries were taken for duplicates, and rdma_connect's
        // caller waited for ever (qperf's rc_bi_bw under load).
        let mut routes = dev.routes();
        let conn = if self.inner.qp_type == QpType::Ud {
            dev.with_agent(|a, now| a.sidr_request(now, dst_ip, sid, tos, &pdata))
                .map_err(cm_err)?
        } else {
            let (qpn, srq) = match &st.qp {
                Some(qp) => (qp.qp_num(), qp.has_srq()),
                None => (param.qp_num, param.srq),
            };
            let mut req = ReqRepr::default();
            req.service_id = sid;
            req.local_qpn = qpn & 0xff_ffff;
            req.starting_psn = st.psn;
            req.responder_resources = param.responder_resources;
            req.initiator_depth = param.initiator_depth;
            req.transport_service_type = if self.inner.qp_type == QpType::Uc {
                1
            } else {
                0
            };
            req.end_to_end_flow_control = param.flow_control;
            req.retry_count = param.retry_count.min(7);
            st.retry_count = req.retry_count;
            req.rnr_retry_count = param.rnr_retry_count.min(7);
            req.srq = srq;
            req.pkey = 0xffff;
            req.path_mtu = ctx.active_mtu() as u8;
            req.primary = path(src.ip(), dst.ip(), st.route_tos);
            req.private_data[..pdata.len()].copy_from_slice(&pdata);
            dev.with_agent(|a, now| a.connect(now, dst_ip, &req))
                .map_err(cm_err)?
        };
        routes.conns.insert(conn, Arc::downgrade(&self.inner));
        drop(routes);
        st.conn = Some(conn);
        st.state = if self.inner.qp_type == QpType::Ud {
            IdState::Resolving
        } else {
            IdState::Connecting
        };
        Ok(())
    }

    /// The CMA header (for the IP port spaces) and the user's data.
    fn with_cma_header(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        user: &[u8],
        max: usize,
    ) -> Result<Vec<u8>> {
        if user.len() > max {
            return Err(Error::Invalid(format!(
                "private data of {} bytes; at most {max} here",
                user.len()
            )));
        }
        let mut out = Vec::with_capacity(CMA_HDR_LEN + user.len());
        if self.inner.ps != PortSpace::Ib {
            let hdr = CmaHeaderRepr {
                port: src.port(),
                src: src.ip().to_canonical(),
                dst: dst.ip().to_canonical(),
            };
            let mut b = [0u8; CMA_HDR_LEN];
            hdr.emit(&mut cma::CmaHeader::new_unchecked(&mut b[..]))
                .map_err(|e| Error::Invalid(e.to_string()))?;
            out.extend_from_slice(&b);
        }
        out.extend_from_slice(user);
        Ok(out)
    }

    /// `rdma_accept`: moves the QP to RTR and RTS from the REQ and sends
    /// the REP (connected ids), or answers the SIDR_REQ (UD ids).
    #[allow(clippy::field_reassign_with_default)]
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::ConnectRequest {
            return Err(Error::Invalid("accept: not a connect request".into()));
        }
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("accept: no connection".into()));
        };
        let dev = CmDevice::of(&ctx)?;
        if self.inner.qp_type == QpType::Ud {
            let qpn = st.qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
            if param.private_data.len() > 136 {
                return Err(Error::Invalid(
                    "SIDR_REP private data: at most 136 bytes".into(),
                ));
            }
            dev.with_agent(|a, now| {
                a.sidr_reply(
                    now,
                    conn,
                    pcm::SIDR_OK,
                    qpn,
                    RDMA_UDP_QKEY,
                    &param.private_data,
                )
            })
            .map_err(cm_err)?;
            st.state = IdState::Connected;
            return Ok(());
        }
        let req = st
            .req
            .clone()
            .ok_or(Error::Invalid("accept: no REQ".into()))?;
        if param.private_data.len() > 196 {
            return Err(Error::Invalid("REP private data: at most 196 bytes".into()));
        }
        let path = req_path(
            &st,
            &req,
            &ctx,
            param.responder_resources,
            param.initiator_depth,
        );
        st.path = Some(path);
        let (qpn, srq) = match &st.qp {
            Some(qp) => {
                ready_qp(qp, &path)?;
                (qp.qp_num(), qp.has_srq())
            }
            None => (param.qp_num, param.srq),
        };
        let mut rep = RepRepr::default();
        rep.local_qpn = qpn & 0xff_ffff;
        rep.starting_psn = st.psn;
        rep.responder_resources = param.responder_resources;
        rep.initiator_depth = param.initiator_depth;
        rep.target_ack_delay = 15;
        rep.end_to_end_flow_control = param.flow_control;
        rep.rnr_retry_count = param.rnr_retry_count.min(7);
        rep.srq = srq;
        rep.private_data[..param.private_data.len()].copy_from_slice(&param.private_data);
        dev.with_agent(|a, now| a.accept(now, conn, &rep))
            .map_err(cm_err)?;
        st.state = IdState::Accepted;
        Ok(())
    }

    /// `rdma_reject`: a REJ (consumer reject) with private data, or a
    /// SIDR_REP with status rejected.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::ConnectRequest {
            return Err(Error::Invalid("reject: not a connect request".into()));
        }
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("reject: no connection".into()));
        };
        let dev = CmDevice::of(&ctx)?;
        if self.inner.qp_type == QpType::Ud {
            dev.with_agent(|a, now| a.sidr_reply(now, conn, pcm::SIDR_REJECT, 0, 0, private_data))
                .map_err(cm_err)?;
        } else {
            dev.with_agent(|a, _| a.reject(conn, pcm::reason::CONSUMER_REJECT, private_data))
                .map_err(cm_err)?;
        }
        dev.routes().conns.remove(&conn);
        st.conn = None;
        st.state = IdState::Disconnected;
        Ok(())
    }

    /// `rdma_establish`: for an id without a QP, after
    /// [`CmEventType::ConnectResponse`] (the caller readied its QP): sends
    /// the RTU.
    pub fn establish(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::ConnectResponse {
            return Err(Error::Invalid("establish: no connect response".into()));
        }
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("establish: no connection".into()));
        };
        CmDevice::of(&ctx)?
            .with_agent(|a, _| a.establish(conn, &[]))
            .map_err(cm_err)?;
        st.state = IdState::Connected;
        Ok(())
    }

    /// `rdma_disconnect`: moves the QP to ERR and sends a DREQ (or, if the
    /// peer's DREQ came first, nothing more: it was answered).
    pub fn disconnect(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("disconnect: not connected".into()));
        };
        if !matches!(
            st.state,
            IdState::Connected | IdState::Accepted | IdState::Disconnected
        ) {
            return Err(Error::Invalid("disconnect: not connected".into()));
        }
        if let Some(qp) = &st.qp {
            let a = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = qp.modify(&a, AttrMask::STATE);
        }
        let r = CmDevice::of(&ctx)?.with_agent(|a, now| match a.state(conn) {
            Some(pcm::ConnState::Established) => a.disconnect(now, conn, &[]),
            Some(pcm::ConnState::RepSent) => {
                // Accepted but no RTU yet: as the kernel, a DREQ all
                // the same once established is implied.
                a.notify_established(conn)?;
                a.disconnect(now, conn, &[])
            }
            _ => Ok(()),
        });
        r.map_err(cm_err)?;
        st.state = IdState::Disconnected;
        Ok(())
    }

    /// Passive side: the QP saw the peer's traffic before the RTU (as
    /// `IBV_EVENT_COMM_EST` tells librdmacm): the connection is up.
    pub fn notify_established(&self) -> Result<()> {
        let st = self.inner.st.lock();
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("notify: no connection".into()));
        };
        CmDevice::of(&ctx)?
            .with_agent(|a, _| a.notify_established(conn))
            .map_err(cm_err)
    }
}

fn libc_einval() -> i32 {
    22
}

fn cm_err(e: pcm::CmError) -> Error {
    match e {
        pcm::CmError::InUse => Error::AddrInUse,
        pcm::CmError::NoResources => Error::NoMemory("CM connections"),
        other => Error::Invalid(other.to_string()),
    }
}

fn max_req_pdata(ps: PortSpace) -> usize {
    match ps {
        PortSpace::Ib => uroce_wire::cm::REQ_PRIVATE_DATA_LEN,
        _ => uroce_wire::cm::REQ_PRIVATE_DATA_LEN - CMA_HDR_LEN,
    }
}

/// The primary path of a REQ from `src` to `dst` on RoCE, with traffic
/// class `tos`.
fn path(src: IpAddr, dst: IpAddr, tos: u8) -> uroce_wire::cm::CmPath {
    uroce_wire::cm::CmPath {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: gid_of(src.to_canonical()),
        remote_gid: gid_of(dst.to_canonical()),
        flow_label: 0,
        packet_rate: 3,
        traffic_class: tos,
        hop_limit: 64,
        sl: 0,
        subnet_local: true,
        local_ack_timeout: ACK_TIMEOUT,
    }
}

/// The local ACK timeout rdma_cm's REQs carry (4.096 us x 2^17: 0.5 s;
/// the kernel derives about this from RoCE's packet lifetime).
const ACK_TIMEOUT: u8 = 17;

/// INIT attributes of rdma_cm's QPs: port 1, P_Key index 0; RC and UC
/// allow remote writes, reads and atomics (the kernel's CM grants reads
/// and atomics when responder resources are offered: uroce's responder
/// bounds them by max_dest_rd_atomic anyway); UD takes `RDMA_UDP_QKEY`.
fn init_attr(qp_type: QpType) -> (QpAttr, AttrMask) {
    ConnectOptions {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        qkey: RDMA_UDP_QKEY,
        ..ConnectOptions::default()
    }
    .init_attr(qp_type)
}

/// The QP path a passive id's REQ settles, with the READ/atomic depths
/// the accepting side grants.
fn req_path(
    st: &IdState2,
    req: &ReqRepr,
    ctx: &Context,
    responder_resources: u8,
    initiator_depth: u8,
) -> QpPath {
    QpPath {
        peer: st
            .dst
            .map_or_else(|| ip_of_gid(&req.primary.local_gid), |d| d.ip()),
        mtu: mtu_of(req.path_mtu).min(ctx.active_mtu()),
        dest_qpn: req.local_qpn,
        // A REQ's or REP's starting PSN is where its sender's receive
        // queue starts: the other side sends from it (the kernel's CM
        // reads them so).
        rq_psn: st.psn,
        sq_psn: req.starting_psn,
        max_dest_rd_atomic: responder_resources,
        max_rd_atomic: initiator_depth,
        timeout: req.primary.local_ack_timeout,
        retry_cnt: req.retry_count,
        rnr_retry: req.rnr_retry_count,
        // The kernel's CM takes the REQ's primary path for the passive
        // QP, its traffic class with it.
        traffic_class: req.primary.traffic_class,
    }
}

/// RTR or RTS attributes of a connected QP.
fn path_attr(p: &QpPath, state: QpState, rc: bool) -> (QpAttr, AttrMask) {
    let mut a = QpAttr {
        qp_state: state,
        path_mtu: p.mtu,
        dest_qp_num: p.dest_qpn,
        rq_psn: p.rq_psn,
        sq_psn: p.sq_psn,
        ah_attr: AddressVector {
            dgid: gid_of(p.peer.to_canonical()),
            traffic_class: p.traffic_class,
            ..AddressVector::default()
        },
        // uroce refuses 0 (a responder that can take no READ).
        max_dest_rd_atomic: p.max_dest_rd_atomic.max(1),
        max_rd_atomic: p.max_rd_atomic,
        min_rnr_timer: 12,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt.min(7),
        rnr_retry: p.rnr_retry.min(7),
        ..QpAttr::default()
    };
    a.cur_qp_state = state;
    let m = if state == QpState::Rtr {
        AttrMask::to_rtr(rc)
    } else {
        AttrMask::to_rts(rc)
    };
    (a, m)
}

/// Moves an RC/UC QP from INIT through RTR to RTS for a connection.
fn ready_qp(qp: &QueuePair, p: &QpPath) -> Result<()> {
    let rc = qp.qp_type() == QpType::Rc;
    let (a, m) = path_attr(p, QpState::Rtr, rc);
    qp.modify(&a, m)?;
    let (a, m) = path_attr(p, QpState::Rts, rc);
    qp.modify(&a, m)?;
    Ok(())
}

/// Before the user sees an agent's event: the MADs that came with it (the
/// DREP that answered a DREQ, with DISCONNECTED) and those its processing
/// queued (an RTU, a REJ) are handed to the socket. The agent hands its
/// events over while the engine's pass that emitted their MADs is still
/// sending; a program that exits on DISCONNECTED (qperf's server) would
/// otherwise take the DREP with it and leave its peer resending its DREQ
/// for a minute. (The kernel's CM sends the DREP itself, program or not.)
fn on_the_wire(id: &IdInner) {
    let ctx = id.st.lock().ctxs.first().cloned();
    if let Some(ctx) = ctx {
        ctx.flush(Duration::from_millis(100));
    }
}

/// Turns an agent event into the user's event, doing on the way what
/// librdmacm does in `rdma_get_cm_event`: new ids for requests, the
/// active side's QP readied and the RTU sent on a REP.
fn process(id: &Arc<IdInner>, e: pcm::CmEvent) -> Option<CmEvent> {
    let cid = CmId { inner: id.clone() };
    let ctx = id.st.lock().ctxs.first().cloned()?;
    let dev = CmDevice::of(&ctx).ok()?;
    let mk = |event, id: CmId, status, conn, ud| CmEvent {
        event,
        id,
        listen_id: None,
        status,
        conn,
        ud,
    };
    let forget = |conn: u32| {
        dev.routes().conns.remove(&conn);
    };
    match e {
        pcm::CmEvent::ReqReceived { conn, src, req, .. } => {
            // A new id on the listener's device (the one the REQ came to).
            let (user, peer) = match split_cma(id.ps, &req.private_data, src) {
                Some(x) => x,
                None => {
                    dev.with_agent(|a, _| a.reject(conn, pcm::reason::CONSUMER_REJECT, &[]))
                        .ok();
                    return None;
                }
            };
            let local_port = id.st.lock().src.map_or(0, |s| s.port());
            let new = CmId::with_type(
                &EventChannel {
                    inner: id.channel.lock().clone(),
                },
                id.ps,
                if req.transport_service_type == 1 {
                    QpType::Uc
                } else {
                    QpType::Rc
                },
            )
            .ok()?;
            {
                let mut st = new.inner.st.lock();
                st.state = IdState::ConnectRequest;
                st.ctxs = vec![ctx_for_ip(&id.st.lock().ctxs, dev.ip()).unwrap_or(ctx.clone())];
                st.src = Some(SocketAddr::new(dev.ip(), local_port));
                st.dst = Some(peer);
                st.conn = Some(conn);
                st.req = Some(req.clone());
            }
            dev.routes().conns.insert(conn, Arc::downgrade(&new.inner));
            let param = ConnParam {
                private_data: user,
                // From our side, as the kernel reports them: what the
                // peer initiates is what our responder takes.
                responder_resources: req.initiator_depth,
                initiator_depth: req.responder_resources,
                flow_control: req.end_to_end_flow_control,
                retry_count: req.retry_count,
                rnr_retry_count: req.rnr_retry_count,
                srq: req.srq,
                qp_num: req.local_qpn,
            };
            let mut ev = mk(CmEventType::ConnectRequest, new, 0, param, None);
            ev.listen_id = Some(cid);
            Some(ev)
        }
        pcm::CmEvent::SidrReqReceived { conn, src, req, .. } => {
            let (user, peer) = match split_cma(id.ps, &req.private_data, src) {
                Some(x) => x,
                None => {
                    dev.with_agent(|a, now| a.sidr_reply(now, conn, pcm::SIDR_REJECT, 0, 0, &[]))
                        .ok();
                    return None;
                }
            };
            let local_port = id.st.lock().src.map_or(0, |s| s.port());
            let new = CmId::with_type(
                &EventChannel {
                    inner: id.channel.lock().clone(),
                },
                id.ps,
                QpType::Ud,
            )
            .ok()?;
            {
                let mut st = new.inner.st.lock();
                st.state = IdState::ConnectRequest;
                st.ctxs = vec![ctx.clone()];
                st.src = Some(SocketAddr::new(dev.ip(), local_port));
                st.dst = Some(peer);
                st.conn = Some(conn);
            }
            dev.routes().conns.insert(conn, Arc::downgrade(&new.inner));
            let ud = UdParam {
                private_data: user.clone(),
                ah_attr: AddressVector {
                    dgid: gid_of(peer.ip()),
                    ..AddressVector::default()
                },
                qp_num: 0,
                qkey: RDMA_UDP_QKEY,
            };
            let param = ConnParam {
                private_data: user,
                ..ConnParam::default()
            };
            let mut ev = mk(CmEventType::ConnectRequest, new, 0, param, Some(ud));
            ev.listen_id = Some(cid);
            Some(ev)
        }
        pcm::CmEvent::RepReceived { conn, rep } => {
            let mut st = id.st.lock();
            if st.state != IdState::Connecting {
                return None;
            }
            let param = ConnParam {
                private_data: rep.private_data.to_vec(),
                // From our side, as the kernel reports them: what the
                // peer initiates is what our responder takes.
                responder_resources: rep.initiator_depth,
                initiator_depth: rep.responder_resources,
                flow_control: rep.end_to_end_flow_control,
                retry_count: 0,
                rnr_retry_count: rep.rnr_retry_count,
                srq: rep.srq,
                qp_num: rep.local_qpn,
            };
            // As the kernel's CM: our READs in flight are what the peer's
            // responder takes, our responder takes what it initiates.
            let path = QpPath {
                peer: st.dst.map(|d| d.ip())?,
                mtu: ctx.active_mtu(),
                dest_qpn: rep.local_qpn,
                rq_psn: st.psn,
                sq_psn: rep.starting_psn,
                max_dest_rd_atomic: rep.initiator_depth,
                max_rd_atomic: rep.responder_resources,
                timeout: ACK_TIMEOUT,
                retry_cnt: st.retry_count,
                rnr_retry: rep.rnr_retry_count,
                traffic_class: st.route_tos,
            };
            st.path = Some(path);
            let Some(qp) = st.qp.clone() else {
                // The caller readies its QP, then calls establish().
                st.state = IdState::ConnectResponse;
                drop(st);
                return Some(mk(CmEventType::ConnectResponse, cid, 0, param, None));
            };
            if ready_qp(&qp, &path).is_err() {
                dev.with_agent(|a, _| a.reject(conn, pcm::reason::CONSUMER_REJECT, &[]))
                    .ok();
                forget(conn);
                st.state = IdState::Disconnected;
                drop(st);
                return Some(mk(
                    CmEventType::ConnectError,
                    cid,
                    -libc_einval(),
                    param,
                    None,
                ));
            }
            dev.with_agent(|a, _| a.establish(conn, &[])).ok();
            st.state = IdState::Connected;
            drop(st);
            Some(mk(CmEventType::Established, cid, 0, param, None))
        }
        pcm::CmEvent::Established { .. } => {
            let mut st = id.st.lock();
            if st.state != IdState::Accepted {
                return None;
            }
            st.state = IdState::Connected;
            drop(st);
            Some(mk(
                CmEventType::Established,
                cid,
                0,
                ConnParam::default(),
                None,
            ))
        }
        pcm::CmEvent::Rejected { conn, rej } => {
            forget(conn);
            id.st.lock().state = IdState::Disconnected;
            let param = ConnParam {
                private_data: rej.private_data.to_vec(),
                ..ConnParam::default()
            };
            Some(mk(
                CmEventType::Rejected,
                cid,
                rej.reason as i32,
                param,
                None,
            ))
        }
        pcm::CmEvent::Unreachable { conn } => {
            forget(conn);
            id.st.lock().state = IdState::Disconnected;
            Some(mk(
                CmEventType::Unreachable,
                cid,
                -110,
                ConnParam::default(),
                None,
            ))
        }
        pcm::CmEvent::Disconnected { private_data, .. } => {
            id.st.lock().state = IdState::Disconnected;
            let param = ConnParam {
                private_data: private_data.to_vec(),
                ..ConnParam::default()
            };
            Some(mk(CmEventType::Disconnected, cid, 0, param, None))
        }
        pcm::CmEvent::TimewaitExit { conn } => {
            forget(conn);
            id.st.lock().conn = None;
            Some(mk(
                CmEventType::TimewaitExit,
                cid,
                0,
                ConnParam::default(),
                None,
            ))
        }
        pcm::CmEvent::SidrRepReceived { conn, rep } => {
            forget(conn);
            let mut st = id.st.lock();
            st.conn = None;
            let peer = st.dst.map(|d| d.ip())?;
            if rep.status != pcm::SIDR_OK {
                st.state = IdState::Disconnected;
                drop(st);
                return Some(mk(
                    CmEventType::Unreachable,
                    cid,
                    rep.status as i32,
                    ConnParam::default(),
                    None,
                ));
            }
            st.state = IdState::Connected;
            let tos = st.route_tos;
            drop(st);
            let ud = UdParam {
                private_data: rep.private_data.to_vec(),
                ah_attr: AddressVector {
                    dgid: gid_of(peer.to_canonical()),
                    traffic_class: tos,
                    ..AddressVector::default()
                },
                qp_num: rep.qpn,
                qkey: rep.qkey,
            };
            let param = ConnParam {
                private_data: rep.private_data.to_vec(),
                qp_num: rep.qpn,
                ..ConnParam::default()
            };
            Some(mk(CmEventType::Established, cid, 0, param, Some(ud)))
        }
    }
}

fn ctx_for_ip(ctxs: &[Context], ip: IpAddr) -> Option<Context> {
    ctxs.iter().find(|c| c.device().ip() == ip).cloned()
}

/// Splits a REQ's (or SIDR_REQ's) private data into the user's part and
/// the peer's address: after the CMA header for the IP port spaces
/// (`None` if the header is malformed), all of it for RDMA_PS_IB.
fn split_cma(ps: PortSpace, data: &[u8], src: IpAddr) -> Option<(Vec<u8>, SocketAddr)> {
    if ps == PortSpace::Ib {
        return Some((data.to_vec(), SocketAddr::new(src, 0)));
    }
    let view = cma::CmaHeader::new_checked(data).ok()?;
    let hdr = CmaHeaderRepr::parse(&view).ok()?;
    Some((
        data[CMA_HDR_LEN..].to_vec(),
        SocketAddr::new(hdr.src, hdr.port),
    ))
}
