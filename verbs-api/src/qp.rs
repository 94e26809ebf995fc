//! Queue pairs.

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use std::sync::Arc;
use uroce_provider::engine::can_post_send;
use uroce_provider::qp_attr::{AttrMask, QpAttr, QpCap};
use uroce_provider::transport::{QpConfig, StateCell};
use uroce_provider::transport::{RecvQueue, SendQueue};
use uroce_provider::types::{Access, QpState, QpType, RecvWr, SendFlags, SendWr, WrOpcode};

/// `ibv_qp_init_attr`.
#[derive(Debug, Clone, Copy)]
pub struct QpInitAttr<'a> {
    /// Send completions go here.
    pub send_cq: &'a CompletionQueue,
    /// Receive completions go here.
    pub recv_cq: &'a CompletionQueue,
    /// Capacities.
    pub cap: QpCap,
    /// Transport.
    pub qp_type: QpType,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Receive WRs come from this shared receive queue (RC, UC, UD); the
    /// QP then has no receive queue of its own.
    pub srq: Option<&'a SharedReceiveQueue>,
}

/// A queue pair (`struct ibv_qp`).
///
/// Made by [`ProtectionDomain::create_qp`] or [`ProtectionDomain::qp_builder`];
/// connected by [`QueuePair::modify`] through INIT, RTR and RTS, or by
/// [`QueuePair::connect`] (RC, UC) and [`QueuePair::activate`] (UD).
///
/// ```
/// use std::time::Duration;
/// use uroce_verbs::{Access, Device, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode};
/// let ctx = Device::new("doc4", "127.70.4.1".parse().unwrap()).open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let cq = ctx.cq_builder().build().unwrap();
/// // An RC QP connected to a second one on the same device.
/// let (a, b) = (pd.qp_builder(&cq).build().unwrap(), pd.qp_builder(&cq).build().unwrap());
/// a.connect(&b.endpoint()).unwrap();
/// b.connect(&a.endpoint()).unwrap();
/// let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
/// mr.write(0, b"ping").unwrap();
/// let recv = RecvWr { wr_id: 1, sg_list: [mr.sge(32, 32)].into_iter().collect() };
/// b.post_recv(&[recv]).unwrap();
/// let mut send = SendWr::new(2, WrOpcode::Send);
/// send.flags = SendFlags::SIGNALED;
/// send.sg_list = [mr.sge(0, 4)].into_iter().collect();
/// a.post_send(&[send]).unwrap();
/// let wcs = cq.wait(2, Duration::from_secs(5));
/// assert!(wcs.iter().all(|wc| wc.status == WcStatus::Success));
/// assert_eq!(mr.to_vec(32, 4).unwrap(), b"ping");
/// ```
#[derive(Debug)]
pub struct QueuePair {
    ctx: Context,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq: Arc<SendQueue>,
    rq: Arc<RecvQueue>,
    /// The state as the engine's QP publishes it (it moves to ERR or SQE
    /// on its own).
    state: Arc<StateCell>,
    srq: bool,
    /// The PSN this QP's first packet carries (random, 24 bits): what
    /// [`QueuePair::endpoint`] tells the peer.
    psn: u32,
    _pd: Arc<()>,
    _send_cq: Arc<uroce_provider::cq::CqInner>,
    _recv_cq: Arc<uroce_provider::cq::CqInner>,
}

impl QueuePair {
    pub(crate) fn create(pd: &ProtectionDomain, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        let ctx = pd.ctx.clone();
        let mut c = init.cap;
        if let Some(srq) = init.srq {
            if srq.pd != pd.id {
                return Err(Error::Invalid(
                    "the SRQ belongs to another protection domain".into(),
                ));
            }
            // As verbs: a QP with an SRQ has no receive queue of its own.
            c.max_recv_wr = 0;
            c.max_recv_sge = 0;
        }
        // Checked here too (the provider's factory checks again) so that
        // no QP number is taken for a request that cannot succeed.
        c.check().map_err(|e| Error::Invalid(e.to_string()))?;
        let qpn = ctx.inner.alloc_qpn();
        let sq = Arc::new(SendQueue::new(c.max_send_wr.max(1)));
        let rq = match init.srq {
            Some(srq) => srq.rq.clone(),
            None => Arc::new(RecvQueue::new(c.max_recv_wr.max(1))),
        };
        let cfg = QpConfig {
            qpn,
            pd: pd.id,
            keys: ctx.inner.keys.clone(),
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            sq: sq.clone(),
            rq: rq.clone(),
            sq_sig_all: init.sq_sig_all,
            cap: c,
            local_ip: ctx.device().ip(),
            src_port: uroce_wire::ROCEV2_UDP_PORT,
            counters: ctx.inner.engine.counters().clone(),
            limits: ctx.inner.limits(),
            events: ctx.inner.engine.events().clone(),
            strict_source_port: strict_source_port(),
            state: Arc::default(),
        };
        let state = cfg.state.clone();
        let added = uroce_provider::transport::new_qp(init.qp_type, cfg)
            .map_err(|e| Error::Invalid(e.to_string()))
            .and_then(|qp| Ok(ctx.inner.engine.add_boxed_qp(qp)?));
        if let Err(e) = added {
            ctx.inner.free_qpn(qpn);
            return Err(e);
        }
        Ok(QueuePair {
            ctx,
            qpn,
            qp_type: init.qp_type,
            cap: c,
            sq,
            rq,
            state,
            srq: init.srq.is_some(),
            psn: rand::random::<u32>() & 0xff_ffff,
            _pd: pd.users.clone(),
            _send_cq: init.send_cq.inner.clone(),
            _recv_cq: init.recv_cq.inner.clone(),
        })
    }

    /// The context the QP belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The starting PSN chosen for this QP at creation (random, 24 bits):
    /// what [`QueuePair::connect`] puts in RTS and
    /// [`QueuePair::endpoint`] tells the peer.
    pub fn start_psn(&self) -> u32 {
        self.psn
    }

    /// Whether receives come from an SRQ.
    pub fn has_srq(&self) -> bool {
        self.srq
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Capacities.
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// `ibv_modify_qp`: errors name the attribute that is wrong.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.ctx.inner.engine.modify_qp(self.qpn, attr, mask)?;
        Ok(())
    }

    /// The engine's whole view of this QP (requester, completer and
    /// responder state), for debugging.
    pub fn debug_state(&self) -> String {
        self.ctx
            .inner
            .engine
            .dump_qp(self.qpn)
            .unwrap_or_else(|e| e.to_string())
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.ctx.inner.engine.query_qp(self.qpn)?)
    }

    /// The current state (as the engine's QP last set it).
    pub fn state(&self) -> QpState {
        self.state.get()
    }

    /// `ibv_bind_mw`: binds a type 1 window to `range` of a region with
    /// `access` (REMOTE_READ/WRITE/ATOMIC; the region needs MW_BIND, and
    /// LOCAL_WRITE for remote write or atomic), or unbinds it with
    /// `None`. The bind is a work request on this QP's send queue,
    /// executed in order (completion opcode BIND_MW, status MW_BIND_ERR
    /// when refused); the window's new R_Key is returned at once, as
    /// `ibv_bind_mw` sets `mw->rkey`.
    pub fn bind_mw(
        &self,
        mw: &crate::MemoryWindow,
        to: Option<(&crate::MemoryRegion, std::ops::Range<usize>)>,
        access: Access,
        wr_id: u64,
        flags: SendFlags,
    ) -> Result<u32> {
        if mw.kind() != uroce_provider::memory::MwType::Type1 {
            return Err(Error::Invalid(
                "ibv_bind_mw binds type 1 windows; type 2 take a BIND_MW work request".into(),
            ));
        }
        let new_rkey = crate::inc_rkey(mw.rkey());
        let (lkey, addr, len) = match &to {
            Some((mr, r)) => (mr.lkey(), mr.addr() + r.start as u64, r.len() as u64),
            None => (0, 0, 0),
        };
        let mut wr = SendWr::new(wr_id, WrOpcode::BindMw);
        wr.flags = flags;
        wr.bind = Some(mw.bind_request(mw.rkey(), new_rkey, lkey, addr, len, access));
        self.post_send(std::slice::from_ref(&wr))
            .map_err(|(_, e)| e)?;
        mw.set_rkey(new_rkey);
        Ok(new_rkey)
    }

    /// `ibv_post_send`. On error, the WRs before the failing one were
    /// posted; returns the failing index with the error (like `bad_wr`).
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        let st = self.state();
        if !can_post_send(st) {
            return Err((
                0,
                Error::Invalid("QP is not in RTS (or SQD/SQE/ERR)".into()),
            ));
        }
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.check_opcode(wr) {
                return Err((i, e));
            }
            if wr.sg_list.len() > self.cap.max_send_sge as usize {
                return Err((
                    i,
                    Error::Invalid(format!("{} SGEs exceed max_send_sge", wr.sg_list.len())),
                ));
            }
            if wr.flags.contains(SendFlags::INLINE)
                && wr.inline_data.len() > self.cap.max_inline_data as usize
            {
                return Err((
                    i,
                    Error::Invalid("inline data exceeds max_inline_data".into()),
                ));
            }
            self.sq.post(wr.clone()).map_err(|e| (i, e.into()))?;
        }
        self.ctx.inner.engine.post_kick(self.qpn);
        Ok(())
    }

    /// What a QP of this type may send (`ibv_post_send` returns EINVAL
    /// for the rest), and for UD, a destination and a length within the
    /// path MTU.
    fn check_opcode(&self, wr: &SendWr) -> Result<()> {
        if !self.qp_type.may_post(wr.opcode) {
            return Err(Error::Invalid(format!(
                "{:?} is not a {:?} operation",
                wr.opcode, self.qp_type
            )));
        }
        if self.qp_type == QpType::Ud {
            if wr.ud.is_none() {
                return Err(Error::Invalid(
                    "a UD send needs a destination (wr.ud: address handle, QPN, Q_Key)".into(),
                ));
            }
            let len = if wr.flags.contains(SendFlags::INLINE) {
                wr.inline_data.len() as u64
            } else {
                wr.total_len()
            };
            let mtu = self.ctx.inner.active_mtu.bytes();
            if len > mtu as u64 {
                return Err(Error::Invalid(format!(
                    "a UD message of {len} bytes exceeds the path MTU ({mtu} bytes)"
                )));
            }
        }
        Ok(())
    }

    /// `ibv_attach_mcast`: not supported (each device binds one unicast
    /// address; IP multicast does not fit that cleanly).
    pub fn attach_mcast(&self, _gid: &[u8; 16], _lid: u16) -> Result<()> {
        Err(Error::NotSupported(crate::ah::NO_MULTICAST))
    }
    /// `ibv_detach_mcast`: not supported (see [`QueuePair::attach_mcast`]).
    pub fn detach_mcast(&self, _gid: &[u8; 16], _lid: u16) -> Result<()> {
        Err(Error::NotSupported(crate::ah::NO_MULTICAST))
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        if self.rq.is_srq() {
            return Err((
                0,
                Error::Invalid("the QP receives from an SRQ: post to the SRQ".into()),
            ));
        }
        if self.state() == QpState::Reset {
            return Err((0, Error::Invalid("QP is in RESET".into())));
        }
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > self.cap.max_recv_sge as usize {
                return Err((
                    i,
                    Error::Invalid(format!("{} SGEs exceed max_recv_sge", wr.sg_list.len())),
                ));
            }
            self.rq.post(wr.clone()).map_err(|e| (i, e.into()))?;
        }
        self.ctx.inner.engine.kick(self.qpn);
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let _ = self.ctx.inner.engine.destroy_qp(self.qpn);
        self.ctx.inner.free_qpn(self.qpn);
    }
}

/// The environment variable that turns on strict source ports for every
/// RC and UC QP created afterwards (`1`): see
/// [`QpConfig::strict_source_port`].
pub const STRICT_SOURCE_PORT_ENV: &str = "UROCE_STRICT_SOURCE_PORT";

fn strict_source_port() -> bool {
    std::env::var(STRICT_SOURCE_PORT_ENV).is_ok_and(|v| v.trim() == "1")
}
