//! rdma_cm identifiers (`struct rdma_cm_id`): their state, options and
//! teardown.

use super::channel::{Channel, Pending};
use super::dispatch::CmDevice;
use super::{CmEvent, CmEventType, ConnParam, EventChannel, PortSpace, UdParam};
use parking_lot::Mutex;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use uroce_verbs::{Context, Error, Mtu, QpType, QueuePair, Result};
use uroce_wire::cm::ReqRepr;
use uroce_wire::cma;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IdState {
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

pub(super) struct IdState2 {
    pub(super) state: IdState,
    pub(super) ctxs: Vec<Context>,
    pub(super) src: Option<SocketAddr>,
    pub(super) dst: Option<SocketAddr>,
    /// Where the CM's packets and the QP's go when that is not `dst`'s
    /// address: the id's own device, for a destination that names the
    /// device's netdev (see `addr::names_own_netdev`).
    pub(super) route_dst: Option<IpAddr>,
    pub(super) conn: Option<u32>,
    pub(super) listening: Option<u64>,
    pub(super) qp: Option<Arc<QueuePair>>,
    /// Passive: the REQ being answered.
    pub(super) req: Option<Box<ReqRepr>>,
    /// Our receive queue's starting PSN: what our REQ or REP announces,
    /// and where the peer's sends start (a UD QP's send PSN).
    pub(super) psn: u32,
    /// What the REQ and REP settled for the QP (once known).
    pub(super) path: Option<QpPath>,
    /// The retry count our REQ asked for.
    pub(super) retry_count: u8,
    /// `rdma_set_afonly`'s value, if the user set it (else it follows
    /// the bound address family, see
    /// [`afonly_default`](super::addr::afonly_default)).
    pub(super) afonly: Option<bool>,
    /// The multicast groups joined: (address, MGID, send-only).
    pub(super) mcast: Vec<(SocketAddr, [u8; 16], bool)>,
    /// `RDMA_OPTION_ID_TOS` as last set.
    pub(super) tos: u8,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT` (`rdma_set_ack_timeout`), if set: the
    /// local QP's ACK timeout at RTS in place of the negotiated one.
    pub(super) ack_timeout: Option<u8>,
    /// The traffic class of the resolved route (`tos` as it was at
    /// `resolve_route`, as the kernel's `cma_resolve_iboe_route` puts it
    /// in the path record): what our REQ's path (and so both QPs and the
    /// CM's MADs), or our UD peer's address, carries.
    pub(super) route_tos: u8,
    /// The bound port, held for the host's processes (see
    /// `addr::host_port`): released with the id.
    pub(super) port_claim: Option<uroce_provider::device::PortClaim>,
}

impl IdState2 {
    /// The address the CM's packets and the QP's go to: the destination's,
    /// or the id's own device's for one that names its netdev.
    pub(super) fn peer_ip(&self) -> Option<IpAddr> {
        self.route_dst.or(self.dst.map(|d| d.ip()))
    }
}

/// The QP attributes a connection's REQ and REP settle.
#[derive(Debug, Clone, Copy)]
pub(super) struct QpPath {
    pub(super) peer: IpAddr,
    pub(super) mtu: Mtu,
    pub(super) dest_qpn: u32,
    pub(super) rq_psn: u32,
    pub(super) sq_psn: u32,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) max_rd_atomic: u8,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    /// The path's traffic class (the IP TOS of the QP's packets).
    pub(super) traffic_class: u8,
}

pub(super) struct IdInner {
    /// Where its events go (`rdma_migrate_id` changes it).
    pub(super) channel: Mutex<Arc<Channel>>,
    pub(super) ps: PortSpace,
    pub(super) qp_type: QpType,
    pub(super) st: Mutex<IdState2>,
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
            let linger = dev.agent().destroy(conn);
            // Never on the engine thread: the wait needs it to run.
            if let Some(limit) = linger.filter(|_| !ctx.on_engine_thread()) {
                dev.linger(conn, limit);
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
    pub(super) inner: Arc<IdInner>,
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
                    route_dst: None,
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
                    ack_timeout: None,
                    route_tos: 0,
                    port_claim: None,
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

    /// `rdma_set_ack_timeout` (`RDMA_OPTION_ID_ACK_TIMEOUT`): the local
    /// QP's ACK timeout (4.096 us * 2^`timeout`, 0: no timer) once it
    /// reaches RTS, in place of the one the REQ settles; not negotiated
    /// with the peer. Set before `connect` (active) or `accept`
    /// (passive); RC ids only, as the kernel (EINVAL otherwise).
    pub fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        if self.inner.qp_type != QpType::Rc {
            return Err(Error::Invalid("ACK timeout: not an RC id".into()));
        }
        self.inner.st.lock().ack_timeout = Some(timeout.min(31));
        Ok(())
    }

    /// The address the id's packets go to: [`CmId::dst_addr`]'s, or the
    /// id's own device's for a destination that names the device's netdev
    /// (under `uroce exec`; see [`CmId::resolve_addr`]).
    pub fn route_dst_ip(&self) -> Option<IpAddr> {
        self.inner.st.lock().peer_ip()
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

    /// Queues an event the call itself makes (no agent's event behind it).
    pub(super) fn ready(&self, event: CmEventType, status: i32, ud: Option<UdParam>) {
        self.inner.channel.lock().push(Pending::Ready(CmEvent {
            event,
            id: self.clone(),
            listen_id: None,
            status,
            conn: ConnParam::default(),
            ud,
        }));
    }

    pub(super) fn service_id(&self, port: u16) -> u64 {
        cma::service_id(self.inner.ps, port)
    }
}
