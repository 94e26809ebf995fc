//! Queue pairs.

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use std::sync::Arc;
use uroce_provider::device::MwType;
use uroce_provider::device::{QpHandle, QpSpec};
use uroce_provider::qp_attr::{AttrMask, QpAttr, QpCap};
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
    /// The provider's QP: its queues, published state and engine entry.
    /// Declared (so dropped) before the context: the QP leaves the engine
    /// first, and the device's engine stops with the context, not after
    /// it.
    qp: QpHandle,
    ctx: Context,
    /// The PSN this QP's first packet carries (random, 24 bits): what
    /// [`QueuePair::endpoint`] tells the peer.
    psn: u32,
    _pd: Arc<()>,
}

impl QueuePair {
    pub(crate) fn create(pd: &ProtectionDomain, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        let ctx = pd.ctx.clone();
        let qp = ctx.inner.face.create_qp(&QpSpec {
            qp_type: init.qp_type,
            pd: pd.id,
            send_cq: &init.send_cq.inner,
            recv_cq: &init.recv_cq.inner,
            srq: init.srq.map(|s| &s.inner),
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
        })?;
        Ok(QueuePair {
            qp,
            ctx,
            psn: rand::random::<u32>() & 0xff_ffff,
            _pd: pd.users.clone(),
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
        self.qp.has_srq()
    }

    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
    /// Transport type.
    pub fn qp_type(&self) -> QpType {
        self.qp.qp_type()
    }
    /// Capacities.
    pub fn cap(&self) -> QpCap {
        self.qp.cap()
    }

    /// `ibv_modify_qp`: errors name the attribute that is wrong.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.qp.modify(attr, mask)?;
        Ok(())
    }

    /// The engine's whole view of this QP (requester, completer and
    /// responder state), for debugging.
    pub fn debug_state(&self) -> String {
        self.qp.debug_state()
    }

    /// `ibv_query_qp`.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.qp.query()?)
    }

    /// The current state (as the engine's QP last set it).
    pub fn state(&self) -> QpState {
        self.qp.state()
    }

    /// The QP's last error, explained: which check failed on which side
    /// (the key, address and region; the NAK; the silent peer). Kept
    /// whether or not `UROCE_EXPLAIN=1` prints it to stderr.
    pub fn last_error(&self) -> Option<crate::Explanation> {
        self.qp.last_error()
    }

    /// Why the QP is in ERR, when it is and that was explained.
    pub fn error_cause(&self) -> Option<crate::Explanation> {
        self.qp.error_cause()
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
        if mw.kind() != MwType::Type1 {
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
    /// What a QP of this type may send, its SGE and inline limits, and
    /// for a UD SEND a destination are checked here (EINVAL), once, by the
    /// provider. A UD QP takes any opcode and length, as rxe and NICs do:
    /// one it cannot send completes with LOC_QP_OP_ERR, one longer than
    /// the path MTU with LOC_LEN_ERR (the QP then in SQE).
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        self.qp.post_send(wrs).map_err(|(i, e)| (i, e.into()))
    }

    /// [`QueuePair::post_send`] of the WRs `read` makes of `items`, each
    /// read only once the ones before it are posted: a foreign list (the
    /// C library's) is walked as it is posted, and one call posts at most
    /// the send queue's depth (the WR after those is refused with
    /// ENOMEM, unread).
    pub fn post_send_with<T, E: From<Error>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<SendWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        self.qp
            .post_send_with(items, Caller::reader(read))
            .map_err(Caller::out)
    }

    /// The rules a send WR's SGE count (`max_send_sge`) and inline length
    /// (`max_inline_data`) must pass, for a caller that must check a
    /// foreign list's length before reading it (the C library); posting
    /// applies the same rules.
    pub fn check_send_sges(&self, n: usize) -> Result<()> {
        self.qp
            .check_send_sges(n)
            .map_err(|e| Error::Invalid(e.to_string()))
    }
    /// See [`QueuePair::check_send_sges`].
    pub fn check_inline(&self, len: usize) -> Result<()> {
        self.qp
            .check_inline(len)
            .map_err(|e| Error::Invalid(e.to_string()))
    }
    /// The rule a receive WR's SGE count must pass (`max_recv_sge`).
    pub fn check_recv_sges(&self, n: usize) -> Result<()> {
        self.qp
            .check_recv_sges(n)
            .map_err(|e| Error::Invalid(e.to_string()))
    }

    /// `ibv_attach_mcast`: this UD QP receives the datagrams sent to the
    /// multicast GID `gid` (IPv4-mapped `::ffff:224.0.0.0/100`, or IPv6
    /// `ff00::/8`, of the device's IP version) and QP 0xFFFFFF, from
    /// any device, its own included. The LID is ignored, as the kernel
    /// ignores it on RoCE. Errors as the kernel's: EINVAL for a QP other
    /// than UD, a GID that is not multicast; attaching twice succeeds;
    /// ENOMEM past rxe's limits (`max_mcast_grp` groups per device,
    /// `max_mcast_qp_attach` QPs per group, `max_total_mcast_qp_attach`).
    /// Destroying the QP detaches it.
    pub fn attach_mcast(&self, gid: &[u8; 16], _lid: u16) -> Result<()> {
        Ok(self.qp.attach_mcast(gid)?)
    }
    /// `ibv_detach_mcast`: EINVAL if the QP is not attached to `gid`.
    pub fn detach_mcast(&self, gid: &[u8; 16], _lid: u16) -> Result<()> {
        Ok(self.qp.detach_mcast(gid)?)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        self.qp.post_recv(wrs).map_err(|(i, e)| (i, e.into()))
    }

    /// [`QueuePair::post_recv`] of the WRs `read` makes of `items`, as
    /// [`QueuePair::post_send_with`].
    pub fn post_recv_with<T, E: From<Error>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        self.qp
            .post_recv_with(items, Caller::reader(read))
            .map_err(Caller::out)
    }

    /// The send queue's depth: the most WRs one post takes.
    pub fn send_depth(&self) -> u32 {
        self.qp.cap().max_send_wr.max(1)
    }
}

/// A caller's error passed through the provider's post loop, which
/// reports its own errors as `DeviceError`s.
pub(crate) struct Caller<E>(pub(crate) E);

impl<E> Caller<E> {
    /// `read`, its errors passed through the provider as [`Caller`]s.
    pub(crate) fn reader<T, W>(
        mut read: impl FnMut(T) -> std::result::Result<W, E>,
    ) -> impl FnMut(T) -> std::result::Result<W, Caller<E>> {
        move |t| read(t).map_err(Caller)
    }

    /// The failing WR's index and the caller's error, out of the
    /// provider's.
    pub(crate) fn out((i, Caller(e)): (usize, Caller<E>)) -> (usize, E) {
        (i, e)
    }
}

impl<E: From<Error>> From<uroce_provider::device::DeviceError> for Caller<E> {
    fn from(e: uroce_provider::device::DeviceError) -> Caller<E> {
        Caller(E::from(e.into()))
    }
}
