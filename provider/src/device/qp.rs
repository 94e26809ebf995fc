//! Queue pairs: creation, modify, and the post paths.

use super::stat::QpEntry;
use super::{strict_source_port, CqHandle, Device, DeviceError, LimitError, Result, SrqHandle};
use crate::cq::CqInner;
use crate::diag::check::{self, CqOwing, QpLedger};
use crate::engine::can_post_send;
use crate::memory::{KeyTable, PdId};
use crate::observe::{Event, QpCall, Topic};
use crate::qp_attr::{AttrMask, QpAttr, QpCap};
use crate::quota::{Resource, Slot};
use crate::transport::{new_qp, QpConfig, RecvQueue, SendQueue, StateCell};
use crate::types::{QpState, QpType, RecvWr, SendFlags, SendWr};
use std::sync::Arc;

impl Device {
    /// A random unused 24-bit QP number (never 0 or 1, the special QPs),
    /// in this process's slot of a shared device.
    fn alloc_qpn(&self) -> u32 {
        let (base, mask) = self.engine().qpn_space();
        let mut used = self.shared.qpns.lock();
        loop {
            let q = base | (rand::random::<u32>() & mask);
            if q > 1 && used.insert(q) {
                return q;
            }
        }
    }
    fn free_qpn(&self, qpn: u32) {
        self.shared.qpns.lock().remove(&qpn);
    }

    /// A queue pair in RESET, on the engine. With an SRQ it has no
    /// receive queue of its own (its receive capacities read 0).
    pub fn create_qp(&self, spec: &QpSpec<'_>) -> Result<QpHandle> {
        let mut cap = spec.cap;
        // An SRQ of another PD is allowed (IBA 10.2.9.1: the SRQ's PD
        // checks its receive WRs; the kernel does not compare them).
        if spec.srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        // The capacities are checked (QpCap::check, the rule the factory
        // applies too) before the queues are allocated at their sizes
        // and a QP number is taken.
        cap.check()?;
        let slot = self.take_slot(Resource::Qp)?;
        let mut sq = SendQueue::new(cap.max_send_wr.max(1))?;
        let rq = match spec.srq {
            Some(srq) => srq.rq.clone(),
            None => Arc::new(RecvQueue::new(cap.max_recv_wr.max(1))?),
        };
        let qpn = self.alloc_qpn();
        let owing = |cq: &CqHandle| CqOwing::new(cq.inner.clone(), cq.ledger.clone());
        let ledger = QpLedger::new(
            &self.shared.keys,
            qpn,
            spec.pd,
            &cap,
            spec.sq_sig_all,
            [owing(spec.send_cq), owing(spec.recv_cq)],
        );
        sq.attach_ledger(ledger.clone());
        let sq = Arc::new(sq);
        let state = Arc::new(StateCell::default());
        let engine = self.engine();
        let cfg = QpConfig {
            qpn,
            pd: spec.pd,
            recv_pd: spec.srq.map_or(spec.pd, |s| s.pd),
            keys: self.shared.keys.clone(),
            send_cq: spec.send_cq.inner.clone(),
            recv_cq: spec.recv_cq.inner.clone(),
            sq: sq.clone(),
            rq: rq.clone(),
            sq_sig_all: spec.sq_sig_all,
            cap,
            local_ip: self.shared.ip,
            src_port: uroce_wire::ROCEV2_UDP_PORT,
            counters: engine.counters().clone(),
            limits: self.modify_limits(),
            events: self.events.clone(),
            strict_source_port: strict_source_port(),
            state: state.clone(),
            observer: crate::observe::Observer::process(),
        };
        // A QP the engine refuses gives its number back.
        let added = new_qp(spec.qp_type, cfg)
            .map_err(DeviceError::from)
            .and_then(|qp| Ok(engine.add_boxed_qp(qp)?));
        if let Err(e) = added {
            self.free_qpn(qpn);
            return Err(e);
        }
        self.shared.reg.add_qp(
            qpn,
            QpEntry {
                qp_type: spec.qp_type,
                pd: spec.pd,
                cap,
                sq: sq.clone(),
                rq: rq.clone(),
                send_cq: spec.send_cq.handle(),
                recv_cq: spec.recv_cq.handle(),
                srq: spec.srq.map(|s| s.handle),
                state: state.clone(),
            },
        );
        Ok(QpHandle {
            dev: self.clone(),
            qpn,
            qp_type: spec.qp_type,
            cap,
            pd: spec.pd,
            sq,
            rq,
            state,
            srq: spec.srq.is_some(),
            ledger,
            _send_cq: spec.send_cq.inner.clone(),
            _recv_cq: spec.recv_cq.inner.clone(),
            _slot: slot,
        })
    }
}

/// What a QP is made of (see [`Device::create_qp`]).
#[derive(Debug, Clone, Copy)]
pub struct QpSpec<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// Send completions go here.
    pub send_cq: &'a CqHandle,
    /// Receive completions go here.
    pub recv_cq: &'a CqHandle,
    /// Receive WRs come from this SRQ.
    pub srq: Option<&'a SrqHandle>,
    /// Capacities.
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

/// A queue pair on a device. Dropping it removes the QP from the engine.
#[derive(Debug)]
pub struct QpHandle {
    dev: Device,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq: Arc<SendQueue>,
    rq: Arc<RecvQueue>,
    /// The state as the engine's QP publishes it (it moves to ERR or SQE
    /// on its own).
    state: Arc<StateCell>,
    srq: bool,
    pd: PdId,
    /// The checker's ledger (`UROCE_CHECK` on when the QP was made).
    ledger: Option<Arc<QpLedger>>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _slot: Slot,
}

impl QpHandle {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Capacities (with an SRQ, the receive ones are 0).
    pub fn cap(&self) -> QpCap {
        self.cap
    }
    /// Whether receives come from an SRQ.
    pub fn has_srq(&self) -> bool {
        self.srq
    }
    /// The state as the engine's QP last set it.
    pub fn state(&self) -> QpState {
        self.state.get()
    }
    /// The QP's last error explained: which check failed on which side
    /// (see [`crate::diag::explain`]); kept whether or not `UROCE_EXPLAIN=1`
    /// prints it.
    pub fn last_error(&self) -> Option<crate::diag::explain::Explanation> {
        self.state.last_error()
    }
    /// Why the QP is in ERR, when it is and that was explained.
    pub fn error_cause(&self) -> Option<crate::diag::explain::Explanation> {
        self.state.error_cause()
    }
    /// Modifies the QP; returns its attributes afterwards.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<QpAttr> {
        if mask.contains(AttrMask::STATE) && matches!(attr.qp_state, QpState::Err | QpState::Reset)
        {
            self.tell_checker(Topic::CHECK, QpCall::Modify(attr.qp_state));
        }
        Ok(self.dev.engine().modify_qp(self.qpn, attr, mask)?)
    }
    /// The QP's attributes.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev.engine().query_qp(self.qpn)?)
    }
    /// `ibv_attach_mcast`: the QP (UD) receives what is sent to the
    /// multicast GID `gid` (an IPv4-mapped or IPv6 multicast address) and
    /// QP 0xFFFFFF. The LID is not asked for: RoCE ignores it.
    pub fn attach_mcast(&self, gid: &[u8; 16]) -> Result<()> {
        let group = crate::endpoint::mcast_group(gid);
        Ok(self.dev.engine().attach_mcast(self.qpn, group)?)
    }
    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&self, gid: &[u8; 16]) -> Result<()> {
        let group = crate::endpoint::mcast_group(gid);
        Ok(self.dev.engine().detach_mcast(self.qpn, group)?)
    }
    /// The engine's whole view of the QP, for debugging.
    pub fn debug_state(&self) -> String {
        self.dev
            .engine()
            .dump_qp(self.qpn)
            .unwrap_or_else(|e| e.to_string())
    }

    /// Tells the checker, when it wants topic `t` and keeps a ledger of
    /// this QP, of the application's `call`.
    #[inline(always)]
    fn tell_checker(&self, t: Topic, call: QpCall<'_>) {
        if let Some(l) = self.ledger.as_deref() {
            crate::observe::tell(t, || Event::QpCall { qp: l, call });
        }
    }

    /// The SGE count rule of this QP's send WRs (EINVAL beyond
    /// `max_send_sge`): checked before a caller reads a foreign list, and
    /// on posting.
    pub fn check_send_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        self.cap.check_send_sges(n)
    }
    /// The inline length rule (EINVAL beyond `max_inline_data`).
    pub fn check_inline(&self, len: usize) -> std::result::Result<(), LimitError> {
        let r = self.cap.check_inline(len);
        if r.is_err() {
            self.tell_checker(Topic::CHECK_POST, QpCall::InlineTooLong(len));
        }
        r
    }
    /// The SGE count rule of this QP's receive WRs (EINVAL beyond
    /// `max_recv_sge`).
    pub fn check_recv_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        self.cap.check_recv_sges(n)
    }

    /// Every rule a send WR must pass to be posted on this QP: the
    /// opcode for the QP type, the SGE count, the inline length, and for
    /// a UD SEND a destination.
    ///
    /// A UD QP takes any opcode and any length here, as rxe and NICs post
    /// them: one its service lacks (RDMA READ, WRITE, atomics, local
    /// operations) completes with LOC_QP_OP_ERR, a message longer than the
    /// path MTU with LOC_LEN_ERR, and the QP goes to SQE (the engine's
    /// checks, `ud.rs`).
    fn check_send(&self, wr: &SendWr) -> Result<()> {
        let ud = self.qp_type == QpType::Ud;
        if !ud && !self.qp_type.may_post(wr.opcode) {
            return Err(DeviceError::Invalid(format!(
                "{:?} is not a {:?} operation",
                wr.opcode, self.qp_type
            )));
        }
        self.check_send_sges(wr.sg_list.len())?;
        if wr.flags.contains(SendFlags::INLINE) {
            self.check_inline(wr.inline_data.len())?;
        }
        if ud && self.qp_type.may_post(wr.opcode) && wr.ud.is_none() {
            return Err(DeviceError::Invalid(
                "a UD send needs a destination (wr.ud: address handle, QPN, Q_Key)".into(),
            ));
        }
        Ok(())
    }

    /// Posts send WRs: each is checked, then queued; the engine is told
    /// once, after the last (what was posted before a refused WR goes
    /// out too). On error, returns the failing index with the error (the
    /// WRs before it were posted).
    pub fn post_send(&self, wrs: &[SendWr]) -> Posted {
        self.post_send_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the send WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most the send queue's depth in one call), as
    /// [`QpHandle::post_send`].
    pub fn post_send_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<SendWr, E>,
    ) -> Posted<E> {
        if !can_post_send(self.state()) {
            return Err((
                0,
                DeviceError::Invalid("QP is not in RTS (or SQD/SQE/ERR)".into()).into(),
            ));
        }
        if crate::observe::wants(Topic::CHECK_POST) && self.state() == QpState::Err {
            self.tell_checker(Topic::CHECK_POST, QpCall::PostInErr);
        }
        let depth = self.sq.capacity() as usize;
        let (posted, r) = post_each(items, depth, read, |wr| {
            self.check_send(&wr)?;
            self.tell_checker(Topic::CHECK_POST, QpCall::PostSend(&wr));
            Ok(self.sq.post(wr)?)
        });
        if posted > 0 {
            self.dev.engine().post_kick(self.qpn);
        }
        r
    }

    /// Posts receive WRs on the QP's own receive queue (EINVAL with an
    /// SRQ, or in RESET). On error, returns the failing index with the
    /// error (the WRs before it were posted).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Posted {
        self.post_recv_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the receive WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most the receive queue's depth in one call), as
    /// [`QpHandle::post_recv`].
    pub fn post_recv_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> Posted<E> {
        if self.srq {
            return Err((
                0,
                DeviceError::Invalid("the QP receives from an SRQ: post to the SRQ".into()).into(),
            ));
        }
        if self.state() == QpState::Reset {
            return Err((0, DeviceError::Invalid("QP is in RESET".into()).into()));
        }
        let depth = self.rq.capacity();
        let (posted, r) = post_each(items, depth, read, |wr| {
            self.check_recv_sges(wr.sg_list.len())?;
            recv_posting(&self.dev.shared.keys, self.pd, self.qpn, &wr);
            match &self.ledger {
                Some(l) => l.post_recv(wr, |wr| self.rq.post(wr))?,
                None => self.rq.post(wr)?,
            }
            Ok(())
        });
        if posted > 0 {
            self.dev.engine().kick(self.qpn);
        }
        r
    }
}

/// What a post of a list of WRs returns: on error, the refused WR's index
/// with its error (the WRs before it were posted).
pub type Posted<E = DeviceError> = std::result::Result<(), (usize, E)>;

/// Posts a list of WRs in order, as verbs does: each item is read into a
/// WR (`read`: the caller's conversion, which may refuse it) and posted
/// (`post`) before the next item is taken, until one is refused. Returns
/// how many went in, and the refused one's index with its error
/// (`*bad_wr`).
///
/// One call posts at most `depth` WRs (the queue's capacity): the item
/// after those is refused with ENOMEM without being read, as a NIC
/// provider finds its queue full. A list that loops back on itself (a C
/// program's `next` pointing back) thus ends there, touching nothing
/// beyond the refused WR, instead of growing without bound.
pub(super) fn post_each<T, W, E: From<DeviceError>>(
    items: impl IntoIterator<Item = T>,
    depth: usize,
    mut read: impl FnMut(T) -> std::result::Result<W, E>,
    mut post: impl FnMut(W) -> Result<()>,
) -> (usize, Posted<E>) {
    let mut n = 0;
    for item in items {
        if n == depth {
            let full = DeviceError::NoMemory("more WRs in one post than the queue holds");
            return (n, Err((n, full.into())));
        }
        let posted = read(item).and_then(|wr| post(wr).map_err(E::from));
        if let Err(e) = posted {
            return (n, Err((n, e)));
        }
        n += 1;
    }
    (n, Ok(()))
}

/// Tells the checker receive WR `wr` is posted to `owner` (a QP's number
/// or an SRQ's handle) of PD `pd`.
pub(super) fn recv_posting(keys: &Arc<KeyTable>, pd: PdId, owner: u32, wr: &RecvWr) {
    crate::observe::tell(Topic::CHECK_POST, || Event::RecvPosting {
        keys,
        pd,
        owner,
        wr,
    });
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger {
            check::qp_destroyed(l);
        }
        self.dev.shared.reg.remove_qp(self.qpn);
        let _ = self.dev.engine().destroy_qp(self.qpn);
        self.dev.free_qpn(self.qpn);
    }
}
