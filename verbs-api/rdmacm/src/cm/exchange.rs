//! The connection exchange: listening, REQ / REP / RTU (or SIDR_REQ /
//! SIDR_REP for UD ids), REJ, and DREQ / DREP, as rdma_cm's calls make
//! them (`rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`,
//! `rdma_establish`, `rdma_disconnect`, `rdma_notify`).

use super::addr::afonly_default;
use super::dispatch::{CmDevice, Listener};
use super::id::{IdState, IdState2};
use super::qp::{ready_qp, req_path, ACK_TIMEOUT};
use super::{CmId, ConnParam, PortSpace, RDMA_UDP_QKEY};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use uroce_provider::device::cm as pcm;
use uroce_provider::qp_attr::gid_of;
use uroce_verbs::{AttrMask, Context, Error, QpAttr, QpState, QpType, Result};
use uroce_wire::cm::{RepRepr, ReqRepr};
use uroce_wire::cma::{self, CmaHeaderRepr, CMA_HDR_LEN};

impl CmId {
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
            if first && dev.agent().listen(sid).is_err() {
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
        let dst_ip = st.peer_ip().unwrap_or(dst.ip()).to_canonical();
        let tos = st.route_tos;
        // The route to this id is in place before the REQ leaves: held
        // across the send, the routes' lock keeps the engine thread from
        // handing out the answer (a REP from a fast peer) before the id
        // is registered for it. Routed to nobody, the REP was forgotten,
        // its retries were taken for duplicates, and rdma_connect's
        // caller waited for ever (qperf's rc_bi_bw under load).
        let mut routes = dev.routes();
        let conn = if self.inner.qp_type == QpType::Ud {
            dev.agent()
                .sidr_request(dst_ip, sid, tos, &pdata)
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
            // From the device's own GID (the id's address may be one
            // of its netdev's, see addr::names_own_netdev).
            req.primary = path(ctx.device().ip(), dst_ip, st.route_tos);
            req.private_data[..pdata.len()].copy_from_slice(&pdata);
            dev.agent().connect(dst_ip, &req).map_err(cm_err)?
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
        let (conn, ctx, dev) = request(&st, "accept")?;
        if self.inner.qp_type == QpType::Ud {
            let qpn = st.qp.as_ref().map_or(param.qp_num, |q| q.qp_num());
            if param.private_data.len() > 136 {
                return Err(Error::Invalid(
                    "SIDR_REP private data: at most 136 bytes".into(),
                ));
            }
            dev.agent()
                .sidr_reply(conn, pcm::SIDR_OK, qpn, RDMA_UDP_QKEY, &param.private_data)
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
        dev.agent().accept(conn, &rep).map_err(cm_err)?;
        st.state = IdState::Accepted;
        Ok(())
    }

    /// `rdma_reject`: a REJ (consumer reject) with private data, or a
    /// SIDR_REP with status rejected.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        let mut st = self.inner.st.lock();
        let (conn, _, dev) = request(&st, "reject")?;
        if self.inner.qp_type == QpType::Ud {
            dev.agent()
                .sidr_reply(conn, pcm::SIDR_REJECT, 0, 0, private_data)
                .map_err(cm_err)?;
        } else {
            dev.agent()
                .reject(conn, pcm::reason::CONSUMER_REJECT, private_data)
                .map_err(cm_err)?;
        }
        dev.routes().conns.remove(&conn);
        st.conn = None;
        st.state = IdState::Disconnected;
        Ok(())
    }

    /// `rdma_establish`: for an id without a QP, after
    /// [`CmEventType::ConnectResponse`](super::CmEventType::ConnectResponse)
    /// (the caller readied its QP): sends the RTU.
    pub fn establish(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::ConnectResponse {
            return Err(Error::Invalid("establish: no connect response".into()));
        }
        let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
            return Err(Error::Invalid("establish: no connection".into()));
        };
        CmDevice::of(&ctx)?
            .agent()
            .establish(conn, &[])
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
        // Established, or accepted with no RTU yet (as the kernel: a DREQ
        // all the same once established is implied): a DREQ; else the
        // peer's DREQ came first and was answered.
        CmDevice::of(&ctx)?
            .agent()
            .disconnect(conn)
            .map_err(cm_err)?;
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
            .agent()
            .notify_established(conn)
            .map_err(cm_err)
    }
}

/// A passive id's request, for `call` (accept or reject) to answer: its
/// connection, context and device.
fn request(st: &IdState2, call: &str) -> Result<(u32, Context, CmDevice)> {
    if st.state != IdState::ConnectRequest {
        return Err(Error::Invalid(format!("{call}: not a connect request")));
    }
    let (Some(conn), Some(ctx)) = (st.conn, st.ctxs.first().cloned()) else {
        return Err(Error::Invalid(format!("{call}: no connection")));
    };
    let dev = CmDevice::of(&ctx)?;
    Ok((conn, ctx, dev))
}

pub(super) fn libc_einval() -> i32 {
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
