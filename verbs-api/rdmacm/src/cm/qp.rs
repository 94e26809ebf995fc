//! The id's QP (`rdma_create_qp`, `rdma_init_qp_attr`): the attributes
//! rdma_cm gives it in INIT, and those the REQ and REP settle for RTR and
//! RTS.

use super::id::{IdState2, QpPath};
use super::{CmId, RDMA_UDP_QKEY};
use std::sync::Arc;
use uroce_provider::qp_attr::{gid_of, ip_of_gid};
use uroce_verbs::{
    Access, AddressVector, AttrMask, ConnectOptions, Context, Error, Mtu, ProtectionDomain, QpAttr,
    QpInitAttr, QpState, QpType, QueuePair, Result, MAX_RD_ATOM,
};
use uroce_wire::cm::ReqRepr;

impl CmId {
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
}

fn mtu_of(v: u8) -> Mtu {
    Mtu::from_u32(v as u32).unwrap_or(Mtu::Mtu1024)
}

/// The local ACK timeout rdma_cm's REQs carry (4.096 us x 2^17: 0.5 s;
/// the kernel derives about this from RoCE's packet lifetime).
pub(super) const ACK_TIMEOUT: u8 = 17;

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
pub(super) fn req_path(
    st: &IdState2,
    req: &ReqRepr,
    ctx: &Context,
    responder_resources: u8,
    initiator_depth: u8,
) -> QpPath {
    QpPath {
        peer: st
            .peer_ip()
            .unwrap_or_else(|| ip_of_gid(&req.primary.local_gid)),
        mtu: mtu_of(req.path_mtu).min(ctx.active_mtu()),
        dest_qpn: req.local_qpn,
        // A REQ's or REP's starting PSN is where its sender's receive
        // queue starts: the other side sends from it (the kernel's CM
        // reads them so).
        rq_psn: st.psn,
        sq_psn: req.starting_psn,
        max_dest_rd_atomic: responder_resources,
        max_rd_atomic: initiator_depth,
        timeout: st.ack_timeout.unwrap_or(req.primary.local_ack_timeout),
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
pub(super) fn ready_qp(qp: &QueuePair, p: &QpPath) -> Result<()> {
    let rc = qp.qp_type() == QpType::Rc;
    let (a, m) = path_attr(p, QpState::Rtr, rc);
    qp.modify(&a, m)?;
    let (a, m) = path_attr(p, QpState::Rts, rc);
    qp.modify(&a, m)?;
    Ok(())
}
