//! An agent's event made the user's, on the user's thread (in
//! [`EventChannel::get_event`](super::EventChannel::get_event)), doing
//! on the way what librdmacm does in `rdma_get_cm_event`: new ids for
//! requests, the active side's QP readied and the RTU sent on a REP. One
//! function per message kind; [`process`] picks it.

use super::dispatch::CmDevice;
use super::exchange::libc_einval;
use super::id::{IdInner, IdState, QpPath};
use super::qp::{ready_qp, ACK_TIMEOUT};
use super::RDMA_UDP_QKEY;
use super::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace, UdParam};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use uroce_provider::device::cm as pcm;
use uroce_provider::qp_attr::gid_of;
use uroce_verbs::{AddressVector, Context, QpType};
use uroce_wire::cm::{RejRepr, RepRepr, ReqRepr, SidrRepRepr, SidrReqRepr};
use uroce_wire::cma::{self, CmaHeaderRepr, CMA_HDR_LEN};

/// Before the user sees an agent's event: the MADs that came with it (the
/// DREP that answered a DREQ, with DISCONNECTED) and those its processing
/// queued (an RTU, a REJ) are handed to the socket. The agent hands its
/// events over while the engine's pass that emitted their MADs is still
/// sending; a program that exits on DISCONNECTED (qperf's server) would
/// otherwise take the DREP with it and leave its peer resending its DREQ
/// for a minute. (The kernel's CM sends the DREP itself, program or not.)
pub(super) fn on_the_wire(id: &IdInner) {
    let ctx = id.st.lock().ctxs.first().cloned();
    if let Some(ctx) = ctx {
        ctx.flush(Duration::from_millis(100));
    }
}

/// Turns an agent event into the user's event (`None`: it makes none).
pub(super) fn process(id: &Arc<IdInner>, e: pcm::CmEvent) -> Option<CmEvent> {
    let ctx = id.st.lock().ctxs.first().cloned()?;
    let p = Processing {
        id: CmId { inner: id.clone() },
        dev: CmDevice::of(&ctx).ok()?,
        ctx,
    };
    use pcm::CmEvent::*;
    match e {
        ReqReceived { conn, src, req, .. } => p.connect_request(conn, src, req),
        SidrReqReceived { conn, src, req, .. } => p.sidr_request(conn, src, &req),
        RepReceived { conn, rep } => p.reply(conn, &rep),
        Established { .. } => p.established(),
        Rejected { conn, rej } => Some(p.rejected(conn, &rej)),
        Unreachable { conn } => Some(p.unreachable(conn)),
        Disconnected { private_data, .. } => Some(p.disconnected(&private_data[..])),
        TimewaitExit { conn } => Some(p.timewait_exit(conn)),
        SidrRepReceived { conn, rep } => p.sidr_reply(conn, &rep),
    }
}

/// An agent's event for `id`, on its (first) device.
struct Processing {
    id: CmId,
    ctx: Context,
    dev: CmDevice,
}

impl Processing {
    /// The user's event on this id.
    fn event(&self, event: CmEventType, status: i32, conn: ConnParam) -> CmEvent {
        self.event_ud(event, status, conn, None)
    }

    /// The user's event on this id, with UD parameters.
    fn event_ud(
        &self,
        event: CmEventType,
        status: i32,
        conn: ConnParam,
        ud: Option<UdParam>,
    ) -> CmEvent {
        CmEvent {
            event,
            id: self.id.clone(),
            listen_id: None,
            status,
            conn,
            ud,
        }
    }

    /// The connection's events go to nobody any more.
    fn forget(&self, conn: u32) {
        self.dev.routes().conns.remove(&conn);
    }

    /// A new id (of `qp_type`, on `ctx`) for a request to this listening
    /// id on connection `conn` from `peer` (the CMA header's address), sent
    /// by the device at `sender`, routed its events; the request's event
    /// names both. The id's packets go to `sender`: `peer` may be an
    /// address of the sender's netdev that no device has (see
    /// `addr::names_own_netdev`), as the kernel's passive side takes the
    /// route from the REQ's path and the address from the CMA header.
    fn passive_id(
        &self,
        qp_type: QpType,
        ctx: Context,
        conn: u32,
        (peer, sender): (SocketAddr, IpAddr),
        req: Option<Box<ReqRepr>>,
    ) -> Option<CmId> {
        let inner = &self.id.inner;
        let local_port = inner.st.lock().src.map_or(0, |s| s.port());
        let channel = EventChannel {
            inner: inner.channel.lock().clone(),
        };
        let new = CmId::with_type(&channel, inner.ps, qp_type).ok()?;
        {
            let mut st = new.inner.st.lock();
            st.state = IdState::ConnectRequest;
            st.ctxs = vec![ctx];
            st.src = Some(SocketAddr::new(self.dev.ip(), local_port));
            st.dst = Some(peer);
            st.route_dst = (peer.ip() != sender).then_some(sender);
            st.conn = Some(conn);
            st.req = req;
        }
        self.dev
            .routes()
            .conns
            .insert(conn, Arc::downgrade(&new.inner));
        Some(new)
    }

    /// The request's event: on the new id, from the listening one.
    fn request_event(&self, new: CmId, conn: ConnParam, ud: Option<UdParam>) -> CmEvent {
        CmEvent {
            event: CmEventType::ConnectRequest,
            id: new,
            listen_id: Some(self.id.clone()),
            status: 0,
            conn,
            ud,
        }
    }

    /// A REQ to a listening id: a new id on the listener's device (the one
    /// the REQ came to). A malformed CMA header is rejected.
    fn connect_request(self, conn: u32, src: IpAddr, req: Box<ReqRepr>) -> Option<CmEvent> {
        let Some((user, peer)) = split_cma(self.id.inner.ps, &req.private_data, src) else {
            self.dev
                .agent()
                .reject(conn, pcm::reason::CONSUMER_REJECT, &[])
                .ok();
            return None;
        };
        let qp_type = if req.transport_service_type == 1 {
            QpType::Uc
        } else {
            QpType::Rc
        };
        let ctx =
            ctx_for_ip(&self.id.inner.st.lock().ctxs, self.dev.ip()).unwrap_or(self.ctx.clone());
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
        let new = self.passive_id(qp_type, ctx, conn, (peer, src), Some(req))?;
        Some(self.request_event(new, param, None))
    }

    /// A SIDR_REQ to a listening UD id: a new UD id, and where the peer
    /// is. A malformed CMA header is refused.
    fn sidr_request(self, conn: u32, src: IpAddr, req: &SidrReqRepr) -> Option<CmEvent> {
        let Some((user, peer)) = split_cma(self.id.inner.ps, &req.private_data, src) else {
            self.dev
                .agent()
                .sidr_reply(conn, pcm::SIDR_REJECT, 0, 0, &[])
                .ok();
            return None;
        };
        let new = self.passive_id(QpType::Ud, self.ctx.clone(), conn, (peer, src), None)?;
        let ud = UdParam {
            private_data: user.clone(),
            ah_attr: AddressVector {
                dgid: gid_of(src),
                ..AddressVector::default()
            },
            qp_num: 0,
            qkey: RDMA_UDP_QKEY,
        };
        let param = ConnParam {
            private_data: user,
            ..ConnParam::default()
        };
        Some(self.request_event(new, param, Some(ud)))
    }

    /// The REP to our REQ: the QP (if the id has one) readied and the RTU
    /// sent, else left to the caller ([`CmId::establish`]).
    fn reply(self, conn: u32, rep: &RepRepr) -> Option<CmEvent> {
        let mut st = self.id.inner.st.lock();
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
            peer: st.peer_ip()?,
            mtu: self.ctx.active_mtu(),
            dest_qpn: rep.local_qpn,
            rq_psn: st.psn,
            sq_psn: rep.starting_psn,
            max_dest_rd_atomic: rep.initiator_depth,
            max_rd_atomic: rep.responder_resources,
            timeout: st.ack_timeout.unwrap_or(ACK_TIMEOUT),
            retry_cnt: st.retry_count,
            rnr_retry: rep.rnr_retry_count,
            traffic_class: st.route_tos,
        };
        st.path = Some(path);
        let Some(qp) = st.qp.clone() else {
            // The caller readies its QP, then calls establish().
            st.state = IdState::ConnectResponse;
            drop(st);
            return Some(self.event(CmEventType::ConnectResponse, 0, param));
        };
        if ready_qp(&qp, &path).is_err() {
            self.dev
                .agent()
                .reject(conn, pcm::reason::CONSUMER_REJECT, &[])
                .ok();
            self.forget(conn);
            st.state = IdState::Disconnected;
            drop(st);
            return Some(self.event(CmEventType::ConnectError, -libc_einval(), param));
        }
        self.dev.agent().establish(conn, &[]).ok();
        st.state = IdState::Connected;
        drop(st);
        Some(self.event(CmEventType::Established, 0, param))
    }

    /// The RTU to our REP: the passive side is connected.
    fn established(self) -> Option<CmEvent> {
        let mut st = self.id.inner.st.lock();
        if st.state != IdState::Accepted {
            return None;
        }
        st.state = IdState::Connected;
        drop(st);
        Some(self.event(CmEventType::Established, 0, ConnParam::default()))
    }

    /// The peer's REJ, with its reason as the status.
    fn rejected(self, conn: u32, rej: &RejRepr) -> CmEvent {
        self.forget(conn);
        self.id.inner.st.lock().state = IdState::Disconnected;
        let param = ConnParam {
            private_data: rej.private_data.to_vec(),
            ..ConnParam::default()
        };
        self.event(CmEventType::Rejected, rej.reason as i32, param)
    }

    /// No answer after every retry: ETIMEDOUT.
    fn unreachable(self, conn: u32) -> CmEvent {
        self.forget(conn);
        self.id.inner.st.lock().state = IdState::Disconnected;
        self.event(CmEventType::Unreachable, -110, ConnParam::default())
    }

    /// The connection is over (a DREQ, or the DREP to ours).
    fn disconnected(self, private_data: &[u8]) -> CmEvent {
        self.id.inner.st.lock().state = IdState::Disconnected;
        let param = ConnParam {
            private_data: private_data.to_vec(),
            ..ConnParam::default()
        };
        self.event(CmEventType::Disconnected, 0, param)
    }

    /// The time-wait after a disconnection is over: the connection is
    /// gone.
    fn timewait_exit(self, conn: u32) -> CmEvent {
        self.forget(conn);
        self.id.inner.st.lock().conn = None;
        self.event(CmEventType::TimewaitExit, 0, ConnParam::default())
    }

    /// The SIDR_REP to our SIDR_REQ: where the UD peer is, or its refusal.
    fn sidr_reply(self, conn: u32, rep: &SidrRepRepr) -> Option<CmEvent> {
        self.forget(conn);
        let mut st = self.id.inner.st.lock();
        st.conn = None;
        let peer = st.peer_ip()?;
        if rep.status != pcm::SIDR_OK {
            st.state = IdState::Disconnected;
            drop(st);
            return Some(self.event(
                CmEventType::Unreachable,
                rep.status as i32,
                ConnParam::default(),
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
        Some(self.event_ud(CmEventType::Established, 0, param, Some(ud)))
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
