//! The one QP engine under RC, UC and UD.
//!
//! A QP is a [`Qp<S>`]: the [`QpCore`] every QP type shares, and the state
//! of its transport service `S` ([`Service`]: RC's requester, completer and
//! responder; UC's requester and reassembly; UD's PSN and duplicate
//! filter). `RcQp`, `UcQp` and `UdQp` are `Qp<RcService>`,
//! `Qp<UcService>` and `Qp<UdService>`: one engine, monomorphised per
//! transport (no dynamic dispatch, no allocation of its own on the hot
//! path), as kernel rxe has one requester, responder and completer with
//! per-type switches and quinn one `Connection` with sub-objects.
//!
//! The engine owns the life every QP type shares:
//!
//! * configuration, state (published to [`super::StateCell`]),
//!   attributes, COMM_EST, the connected peer's pin, the query view;
//! * modify: the spec's table (IBA ch. 10-11, table 91), the attributes,
//!   the move to ERR or RESET, SQD's draining flag and the SQ_DRAINED
//!   event (IBA 11.6.3.1);
//! * completions: a completion lost to a full CQ is a catastrophic error
//!   of the QP (IBA 11.4.2.1): QP_FATAL and ERR, once;
//! * errors: ERR completes every outstanding WR with WR_FLUSH_ERR in
//!   posting order, receive WRs too, and reports LAST_WQE_REACHED to an
//!   SRQ's owner (IBA 10.3.1, 11.6.3.1); SQE, the send queue error of UC
//!   and UD, completes the failed WR and flushes the send queue while the
//!   receive queue keeps working (IBA ch. 10, the SQ Error state); a local
//!   error of the receive queue (class A) moves the QP to ERR;
//! * a modify to ERR from RTS or SQD first sends the WRs posted before it
//!   (as a NIC sends the WQEs it fetched; [`LastSends`]), then flushes;
//! * the state switch of `poll_transmit`: ERR flushes what is posted, SQE
//!   flushes the send queue; responses go in any state, requests in RTS
//!   (new WRs) and SQD (only what started);
//! * explanations ([`crate::diag::explain`]): each error completion and each
//!   move to ERR gets one line, kept in the published [`super::StateCell`]
//!   and printed with `UROCE_EXPLAIN=1`; the check that fails returns its
//!   facts as a typed cause ([`crate::observe::cause`], no words here), an
//!   error site that is not where the status is decided notes it
//!   (`QpCore::why`), the explanation is made where the status is decided,
//!   and the move to ERR keeps it as its cause (`QpCore::err_cause`);
//! * timers and in-flight accounting, which count only in RTS and SQD;
//! * the [`QpMachine`] impl.
//!
//! A transport supplies only what differs, the [`Service`] hooks:
//! `apply_modify` (its attributes of a modify), `on_error` (flush the WRs
//! it holds), `on_reset` (forget them), `receive` (admission and its
//! responder or completer), `respond` and `request` (its packets),
//! `drained` (SQD), `deadline`/`timeout` and `inflight`/`set_throttled`
//! (RC's retransmission and the device's in-flight budget).

use super::Nanos;
use super::{PeerPin, QpConfig, QpMachine, RxMeta, Transmit, PKEY};
use crate::counters::Counters;
use crate::events::EventType;
use crate::observe::cause::{Cause, Fault, Peer, Then, WrCheck};
use crate::observe::cause::{Explanation, Side};
use crate::observe::{queue_id, Event, Fact, Gone, Topic};
use crate::qp_attr::{check_modify, AttrMask, ModifyError, QpAttr};
use crate::types::{Access, QpState, QpType, SendFlags, SendWr, Wc, WcOpcode, WcStatus, WrOpcode};
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::{BthRepr, Opcode, Psn, Transport};

/// The state every QP type shares.
#[derive(Debug)]
pub struct QpCore {
    /// What the QP was built from.
    pub cfg: QpConfig,
    /// Current state (also published in `cfg.state`).
    pub state: QpState,
    /// Attributes as last modified.
    pub attr: QpAttr,
    /// COMM_EST was reported (first packet received in RTR).
    pub comm_est: bool,
    /// The peer as admission checks it (connected types).
    pub pin: PeerPin,
    /// When the last packet from the connected peer was admitted: "retry
    /// exceeded" says since when the peer has been silent.
    pub last_rx: Option<Nanos>,
    /// What an error site found, for the explanation made where the
    /// error's status is decided (error paths only).
    pub why: Option<Cause>,
    /// The explanation the next move to ERR gives as its cause.
    pub err_cause: Option<Explanation>,
    /// What `uroce stat` shows of this QP besides its attributes.
    pub tally: QpTally,
    /// A modify to ERR from RTS or SQD: what the send queue still sends
    /// before the QP flushes (see [`LastSends`]).
    pub last_sends: Option<LastSends>,
}

/// What a QP modified to ERR from RTS or SQD with WRs waiting in its send
/// queue still sends, as a NIC sends the WQEs it fetched before the
/// modify: the WRs posted before it
/// (taken while the send queue's `taken` count is below `until`; none
/// new from SQD), as far as the window lets them go now. Then the QP
/// flushes. A program that posts a SEND and at once disconnects (librpma's
/// examples) has its SEND delivered, however soon the modify comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastSends {
    /// The send queue's `taken` count the WRs posted before the modify
    /// bring it to.
    pub until: u64,
    /// Modified from SQD: only WRs already started go on.
    pub from_sqd: bool,
}

/// What one QP has counted of its own life, for `uroce stat` (the
/// device's [`Counters`] hold the same events summed over its QPs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpTally {
    /// Request packets sent again (go-back-N).
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub retry_timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_rcvd: u64,
    /// The last error completion of the QP (a flush only when no other
    /// error came before it: the flushes an error causes do not hide it).
    pub last_error: Option<LastError>,
}

/// An error completion a QP produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastError {
    /// Its status.
    pub status: WcStatus,
    /// Its WR's `wr_id`.
    pub wr_id: u64,
    /// A send (true) or receive (false) completion.
    pub send: bool,
}

impl QpTally {
    /// Notes a completion: an error one becomes the last error, unless it
    /// is a flush and an error of another kind came first.
    pub fn note_completion(&mut self, send: bool, wc: &Wc) {
        let flush_over_cause = wc.status == WcStatus::WrFlushErr
            && self
                .last_error
                .is_some_and(|e| e.status != WcStatus::WrFlushErr);
        if wc.status != WcStatus::Success && !flush_over_cause {
            self.last_error = Some(LastError {
                status: wc.status,
                wr_id: wc.wr_id,
                send,
            });
        }
    }
}

impl QpCore {
    /// A QP in RESET.
    pub fn new(cfg: QpConfig) -> QpCore {
        QpCore {
            cfg,
            state: QpState::Reset,
            attr: QpAttr::default(),
            comm_est: false,
            pin: PeerPin::default(),
            last_rx: None,
            why: None,
            err_cause: None,
            tally: QpTally::default(),
            last_sends: None,
        }
    }

    /// Sets the state and publishes it ([`super::StateCell`]).
    pub fn set_state(&mut self, s: QpState) {
        if s != self.state {
            let (qpn, from) = (self.cfg.qpn, self.state);
            self.cfg
                .observer
                .tell(Topic::TIMELINE, || Fact::StateChanged { qpn, from, to: s });
        }
        self.state = s;
        self.cfg.state.set(s);
    }

    /// True in the states that take packets (RTR, RTS, SQD, SQE).
    pub fn receiving(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// True in the states whose send queue runs (RTS, SQD): timers and
    /// packets in flight count only there.
    pub fn sending(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// The attributes as `ibv_query_qp` reports them, with the transport's
    /// own send and receive PSNs.
    pub fn query(&self, sq_psn: u32, rq_psn: u32) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.cap = self.cfg.cap;
        a.sq_psn = sq_psn;
        a.rq_psn = rq_psn;
        a
    }

    /// The first half of every modify: the spec's table for `qp_type`
    /// (IBA ch. 10-11, table 91), then the attributes taken. Returns the
    /// state to move to.
    pub fn begin_modify(
        &mut self,
        qp_type: QpType,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<QpState, ModifyError> {
        let to = check_modify(qp_type, self.state, attr, mask, &self.cfg.limits)?;
        self.attr.take_masked(attr, mask, self.cfg.local_ip)?;
        Ok(to)
    }

    /// The last half of every modify: the new state, and SQD's draining
    /// flag (set on entry, cleared on leaving).
    pub fn finish_modify(&mut self, from: QpState, to: QpState) {
        self.set_state(to);
        if to == QpState::Sqd && from != QpState::Sqd {
            self.attr.sq_draining = true;
        }
        if to != QpState::Sqd {
            self.attr.sq_draining = false;
        }
    }

    /// A packet was accepted: the first one in RTR reports COMM_EST.
    pub fn note_received(&mut self) {
        if self.state == QpState::Rtr && !self.comm_est {
            self.comm_est = true;
            self.cfg.event(EventType::CommEst);
        }
    }

    /// Back to RESET: attributes, COMM_EST and the peer pin forgotten.
    pub fn reset(&mut self) {
        self.tally = QpTally::default();
        self.comm_est = false;
        self.pin = PeerPin::default();
        self.attr = QpAttr::default();
        self.last_rx = None;
        self.why = None;
        self.err_cause = None;
        self.last_sends = None;
        self.cfg.state.forget_cause();
    }

    /// How long before `now` the connected peer was last heard from
    /// (`None`: not since the QP was connected).
    pub fn peer_last_seen(&self, now: Nanos) -> Option<u64> {
        self.last_rx.map(|t| now.0.saturating_sub(t.0))
    }

    /// The connected peer: address and QPN.
    pub fn peer(&self) -> Peer {
        Peer {
            ip: self.attr.ah_attr.ip(),
            qpn: self.attr.dest_qp_num,
        }
    }
}

/// A send WR's local error: its status, and what the check that failed
/// found when it is more than the status says (the SGE that failed its
/// lkey check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalFault {
    /// The completion status.
    pub status: WcStatus,
    /// The facts, for the explanation.
    pub cause: Option<Cause>,
}

impl From<WcStatus> for LocalFault {
    fn from(status: WcStatus) -> LocalFault {
        LocalFault {
            status,
            cause: None,
        }
    }
}

/// What a transport service (RC, UC, UD) adds to the engine: its state
/// (`Self`, reset to `Default` with the QP) and the hooks the engine calls.
/// Each hook gets the whole QP: the engine's helpers (completion, errors,
/// emitting packets) are methods of [`Qp`].
pub trait Service: Default + std::fmt::Debug + Send + Sized + 'static {
    /// The QP type: the modify table's column, the error table's column.
    const QP_TYPE: QpType;
    /// The transport of the QP's packets (the opcode table's column).
    const TRANSPORT: Transport = match Self::QP_TYPE {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
    };

    /// The send PSN and the expected receive PSN, as `ibv_query_qp`
    /// reports them (`sq_psn`, `rq_psn`).
    fn psns(&self) -> (Psn, Psn);

    /// The attributes as `ibv_query_qp` reports them.
    fn query(qp: &Qp<Self>) -> QpAttr {
        let (sq, rq) = qp.svc.psns();
        qp.core.query(sq.value(), rq.value())
    }

    /// A modify call, checked against the spec's table, to state `to`
    /// (the QP still in its old state): the service takes its own
    /// attributes (PSNs, retry counters) and does what the transition
    /// needs first. A completion it produces may move the QP to ERR; the
    /// modify then ends there.
    fn apply_modify(qp: &mut Qp<Self>, attr: &QpAttr, mask: AttrMask, to: QpState);

    /// Entering ERR (the state is already ERR): the WRs the service took
    /// from the queues complete with WR_FLUSH_ERR, in posting order, and
    /// what answers nothing more is dropped. The engine then flushes the
    /// posted WRs.
    fn on_error(qp: &mut Qp<Self>);

    /// To RESET: the send WRs the service took are retired without
    /// completions and its state forgotten. The engine then discards the
    /// posted WRs.
    fn on_reset(qp: &mut Qp<Self>);

    /// One parsed, ICRC-checked packet addressed to the QP, in any state:
    /// admission (IBA 9.6), then the responder (and RC's completer).
    fn receive(qp: &mut Qp<Self>, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>);

    /// A response to send (RC's ACKs, NAKs, READ responses, atomic ACKs),
    /// asked first and in any state; `None`: none now.
    fn respond(_qp: &mut Qp<Self>, _now: Nanos, _buf: &mut [u8]) -> Option<Transmit> {
        None
    }

    /// The next request packet, asked in RTS (`allow_new`) and SQD (only
    /// WRs already started go on).
    fn request(qp: &mut Qp<Self>, now: Nanos, buf: &mut [u8], allow_new: bool) -> Option<Transmit>;

    /// True when no WR that started is outstanding (SQD: the send queue
    /// is drained).
    fn drained(&self) -> bool {
        true
    }

    /// The next deadline (asked in RTS and SQD).
    fn deadline(&self) -> Option<Nanos> {
        None
    }

    /// Time passed (in RTS and SQD; possibly spuriously).
    fn timeout(_qp: &mut Qp<Self>, _now: Nanos) {}

    /// Request PSNs in flight (in RTS and SQD).
    fn inflight(&self) -> u32 {
        0
    }

    /// See [`QpMachine::set_throttled`].
    fn set_throttled(&mut self, _on: bool) {}

    /// See [`QpMachine::only_acks_to_send`].
    fn only_acks_to_send(_qp: &Qp<Self>) -> bool {
        false
    }
}

/// A QP of transport service `S`: the engine.
#[derive(Debug)]
pub struct Qp<S: Service> {
    pub(crate) core: QpCore,
    pub(crate) svc: S,
}

impl<S: Service> Qp<S> {
    /// A QP in the RESET state.
    pub fn new(cfg: QpConfig) -> Qp<S> {
        cfg.observer.tell(Topic::TIMELINE, || Fact::QpCreated {
            qpn: cfg.qpn,
            qp_type: S::QP_TYPE,
            ip: cfg.local_ip,
            sq: queue_id(&*cfg.sq),
            rq: (!cfg.rq.is_srq()).then(|| queue_id(&*cfg.rq)),
        });
        Qp {
            core: QpCore::new(cfg),
            svc: S::default(),
        }
    }
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.core.cfg.qpn
    }
    /// Current state.
    #[cfg(any(test, feature = "testing"))]
    pub fn state(&self) -> QpState {
        self.core.state
    }
    /// The configuration.
    #[cfg(any(test, feature = "testing"))]
    pub fn config(&self) -> &QpConfig {
        &self.core.cfg
    }
    /// Current attributes (as `ibv_query_qp` reports them).
    #[cfg(any(test, feature = "testing"))]
    pub fn attr(&self) -> QpAttr {
        S::query(self)
    }

    /// Applies a modify-QP call (checked against the spec's table for the
    /// QP's type).
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = self.core.begin_modify(S::QP_TYPE, attr, mask)?;
        let from = self.core.state;
        S::apply_modify(self, attr, mask, to);
        if self.core.state != from {
            // A completion lost to a full CQ moved the QP to ERR.
            return Ok(());
        }
        match to {
            QpState::Err
                if matches!(from, QpState::Rts | QpState::Sqd)
                    && self.core.cfg.sq.waiting() > 0 =>
            {
                // The WRs posted before the modify go first, as a NIC
                // sends what it fetched (`poll_transmit` sends them, then
                // flushes).
                self.core.err_cause = None;
                let sq = &self.core.cfg.sq;
                self.core.last_sends = Some(LastSends {
                    until: sq.taken() + sq.waiting() as u64,
                    from_sqd: from == QpState::Sqd,
                });
                self.note_error();
            }
            QpState::Err if from != QpState::Err => {
                self.core.err_cause = None;
                self.enter_error();
            }
            QpState::Reset => self.reset(),
            _ => {}
        }
        self.core.finish_modify(from, to);
        self.check_drained();
        Ok(())
    }

    /// Takes one packet addressed to this QP (parsed and ICRC-checked).
    #[cfg(any(test, feature = "testing"))]
    pub fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        S::receive(self, now, meta, pkt);
    }

    /// Writes the next packet to send into `buf` (at least path MTU + 128
    /// bytes), or returns `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        match self.core.state {
            QpState::Err => {
                if let Some(last) = self.core.last_sends {
                    let allow_new = !last.from_sqd && self.core.cfg.sq.taken() < last.until;
                    if let Some(t) = S::request(self, now, buf, allow_new) {
                        Counters::inc(&self.core.cfg.counters.sent_pkts);
                        return Some(t);
                    }
                    // Sent what could go (a local error on the way
                    // flushed already): now the flush.
                    if self.core.last_sends.take().is_some() {
                        self.flush_error();
                    }
                }
                if self.core.cfg.has_posted() {
                    self.explain_flush();
                }
                self.core.cfg.flush_posted();
            }
            QpState::Sqe => self.flush_sends(),
            _ => {}
        }
        let t = match S::respond(self, now, buf) {
            Some(t) => t,
            None => match self.core.state {
                QpState::Rts => S::request(self, now, buf, true)?,
                QpState::Sqd => S::request(self, now, buf, false)?,
                _ => return None,
            },
        };
        Counters::inc(&self.core.cfg.counters.sent_pkts);
        Some(t)
    }

    /// The next deadline.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        if !self.core.sending() {
            return None;
        }
        self.svc.deadline()
    }

    /// Handles the passing of time (safe to call spuriously).
    pub fn handle_timeout(&mut self, now: Nanos) {
        if self.core.sending() {
            S::timeout(self, now);
            self.check_drained();
        }
    }

    // ---------------------------------------------------------------
    // Completions and errors
    // ---------------------------------------------------------------

    /// Adds a completion (`solicited`: a receive completion whose message
    /// asked for a solicited event). A full CQ is a catastrophic error for
    /// the QP (IBA 11.4.2.1, QP_FATAL).
    pub(crate) fn complete(&mut self, send: bool, wc: Wc, solicited: bool) {
        if crate::observe::COMPILED {
            self.core.tally.note_completion(send, &wc);
        }
        if !self.core.cfg.complete(send, wc, solicited) {
            self.fatal();
        }
    }

    /// A completion was lost to a full CQ: QP_FATAL and ERR (once).
    pub(crate) fn fatal(&mut self) {
        if self.core.state != QpState::Err {
            self.core.cfg.event(EventType::QpFatal);
            self.explain(None, Side::Local, Cause::CqOverflow);
            self.enter_error();
        }
    }

    /// A send WR leaves the QP: its send queue slot is retired and it
    /// completes with `status` (a successful one only when signaled),
    /// reporting `byte_len` bytes.
    pub(crate) fn retire_send(&mut self, wr: &SendWr, status: WcStatus, byte_len: u64) {
        self.core.cfg.sq.retire(1);
        self.core.cfg.tell_send_done(wr, status, byte_len);
        let signaled = self.core.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        if status != WcStatus::Success || signaled {
            let mut wc = Wc::new(wr.wr_id, status, wr.opcode.wc_opcode(), self.core.cfg.qpn);
            wc.byte_len = byte_len as u32;
            self.complete(true, wc, false);
        }
    }

    /// A receive WR completes with `status` and no data.
    pub(crate) fn complete_recv(&mut self, wr_id: u64, status: WcStatus) {
        let wc = Wc::new(wr_id, status, WcOpcode::Recv, self.core.cfg.qpn);
        self.complete(false, wc, false);
    }

    /// The completion of a message received from the connected peer:
    /// `byte_len` bytes, with its immediate data if any.
    pub(crate) fn received(&self, wr_id: u64, op: WcOpcode, byte_len: u64, imm: Option<u32>) -> Wc {
        let dqp = self.core.attr.dest_qp_num;
        Wc::received(wr_id, op, self.core.cfg.qpn, byte_len as u32, dqp, imm)
    }

    /// Shows ERR to the application before the error completion that
    /// moves the QP there is delivered ([`Qp::enter_error`] follows in the
    /// same pass): a program that polls the completion and then queries
    /// the QP sees ERR, never the state before.
    pub(crate) fn publish_error(&self) {
        self.core.cfg.state.set(QpState::Err);
    }

    /// Moves to ERR: every outstanding WR completes with WR_FLUSH_ERR in
    /// posting order, receive WRs too (an SRQ's WRs stay in the SRQ, and
    /// LAST_WQE_REACHED tells the owner none will be taken for this QP).
    pub(crate) fn enter_error(&mut self) {
        self.note_error();
        self.flush_error();
    }

    /// The first half of [`Qp::enter_error`]: the cause kept (or the
    /// modify that moved the QP there), the state ERR.
    fn note_error(&mut self) {
        let qpn = self.core.cfg.qpn;
        match self.core.err_cause.take() {
            // The cause was explained (and printed) just now: it is why
            // the QP is in ERR; a line that is not itself about the move
            // to ERR is followed by a short one that is.
            Some(c) => {
                if let Some(after) = c.status {
                    let o = self.core.cfg.observer;
                    o.tell(Topic::EXPLAIN, || Event::EntersErr { qpn, after });
                }
                self.core.cfg.state.set_cause(c);
            }
            None => {
                let e = Explanation::new(qpn, None, Side::Local, &Cause::ModifiedToErr.into());
                self.core.cfg.explained(e, true);
            }
        }
        self.core.set_state(QpState::Err);
    }

    /// The last half of [`Qp::enter_error`]: what the service holds and
    /// what is posted complete with WR_FLUSH_ERR, and an SRQ's owner
    /// learns that no WR more is taken for the QP.
    fn flush_error(&mut self) {
        self.core.last_sends = None;
        S::on_error(self);
        self.core.cfg.flush_posted();
        self.core.cfg.report_last_wqe();
    }

    /// To RESET: everything is discarded without completions.
    fn reset(&mut self) {
        self.core.cfg.tell_queues_gone(Gone::Reset);
        S::on_reset(self);
        self.core.cfg.discard_posted();
        self.core.reset();
    }

    /// A send WR failed locally (UC, UD): it completes with `status`
    /// (signaled or not) and the QP moves to SQE, leaving SQD's draining
    /// behind; the WRs waiting in the send queue are flushed (IBA ch. 10:
    /// a send queue error of a UC or UD QP leaves the receive queue
    /// running).
    pub(crate) fn send_error(&mut self, wr: &SendWr, f: impl Into<LocalFault>) {
        let LocalFault { status, cause } = f.into();
        if cause.is_some() {
            self.core.why = cause;
        }
        let cause = self.local_fault(wr, status);
        let then = Then::Sqe;
        self.explain(Some(status), Side::Local, Fault { cause, then });
        self.core.err_cause = None;
        self.core.cfg.sq.retire(1);
        self.core.cfg.tell_send_done(wr, status, 0);
        let wc = Wc::new(wr.wr_id, status, wr.opcode.wc_opcode(), self.core.cfg.qpn);
        self.core.set_state(QpState::Sqe);
        self.core.attr.sq_draining = false;
        self.complete(true, wc, false);
        if self.core.state == QpState::Sqe {
            self.flush_sends();
        }
    }

    /// Explains an error of the QP (`status`: the completion it explains,
    /// `None`: its move to ERR): kept as its last explanation, printed when
    /// asked for, and the cause the next move to ERR gives.
    pub(crate) fn explain(&mut self, status: Option<WcStatus>, side: Side, f: impl Into<Fault>) {
        let e = Explanation::new(self.core.cfg.qpn, status, side, &f.into());
        self.keep_explanation(e);
    }

    /// Keeps `e` as the QP's last explanation (printed when asked for)
    /// and the cause the next move to ERR gives.
    fn keep_explanation(&mut self, e: Explanation) {
        self.core.cfg.explained(e.clone(), false);
        self.core.err_cause = Some(e);
    }

    /// WRs posted to the QP in ERR are about to be flushed: why.
    fn explain_flush(&mut self) {
        let cause = self.core.cfg.state.error_cause();
        let e = Explanation::flushed_in_err(self.core.cfg.qpn, cause.as_ref());
        self.keep_explanation(e);
        self.core.err_cause = None;
    }

    /// Why send WR `wr` failed locally with `status`: what the failing
    /// site noted, else what the status says of the WR (for a protection
    /// error no check noted, such as a region deregistered while the WR
    /// was being sent, the SGE that fails its lkey check now).
    pub(crate) fn local_fault(&mut self, wr: &SendWr, status: WcStatus) -> Cause {
        if let Some(w) = self.core.why.take() {
            return w;
        }
        let (op, wr_id) = (wr.opcode, wr.wr_id);
        let len = wr.message_len();
        let check = match status {
            WcStatus::LocProtErr => {
                let need = if op.is_read_or_atomic() {
                    Access::LOCAL_WRITE
                } else {
                    Access::empty()
                };
                let cfg = &self.core.cfg;
                match super::sgl::Resolved::resolve(&cfg.keys, cfg.pd, &wr.sg_list, need) {
                    Err(f) => WrCheck::Lkey(f),
                    Ok(_) => WrCheck::KeysPassNow,
                }
            }
            WcStatus::LocLenErr if op.is_atomic() || op == WrOpcode::AtomicWrite => {
                WrCheck::AtomicLen { len }
            }
            WcStatus::LocLenErr => {
                let max = if S::QP_TYPE == QpType::Ud {
                    u64::from(self.core.cfg.limits.active_mtu.bytes())
                } else {
                    super::message::MAX_MSG_SIZE
                };
                WrCheck::TooLong { len, max }
            }
            WcStatus::LocQpOpErr => WrCheck::BadOp,
            s => WrCheck::Status(s),
        };
        Cause::SendWr { op, wr_id, check }
    }

    /// WRs waiting in the send queue complete with WR_FLUSH_ERR (a full CQ
    /// is fatal, as for any completion).
    pub(crate) fn flush_sends(&mut self) {
        if !self.core.cfg.flush_sends() {
            self.fatal();
        }
    }

    /// A local error of the receive queue (class A: a receive WR's own
    /// buffers are bad): the WR completes with `status` and the QP goes to
    /// ERR (rxe: a malformed receive WQE).
    pub(crate) fn recv_local_error(&mut self, wr_id: u64, status: WcStatus) {
        let why = self.core.why.take();
        let cause = why.unwrap_or(Cause::RecvBufferLost { wr_id });
        self.explain(Some(status), Side::Local, cause);
        self.publish_error();
        self.complete_recv(wr_id, status);
        if self.core.state != QpState::Err {
            self.enter_error();
        }
    }

    /// In SQD: once no started WR is outstanding, the send queue is
    /// drained (reported as SQ_DRAINED when asked for at RTS->SQD).
    pub(crate) fn check_drained(&mut self) {
        if self.core.state == QpState::Sqd && self.core.attr.sq_draining && self.svc.drained() {
            self.core.attr.sq_draining = false;
            if self.core.attr.en_sqd_async_notify {
                self.core.cfg.event(EventType::SqDrained);
            }
        }
    }

    // ---------------------------------------------------------------
    // Packets of a connected QP (RC, UC)
    // ---------------------------------------------------------------

    /// The receive path of a connected QP (IBA 9.6, header validation): a
    /// packet must come in a state that takes it (`receiving`), be of the
    /// QP's transport, from the connected peer (and, pinned, its port), in
    /// the QP's partition; else it is dropped and counted. An admitted one
    /// is counted, the first in RTR reports COMM_EST, and `handle` takes
    /// it and says whether it moved the QP forward: then, in strict mode,
    /// the peer's source port is pinned.
    pub(crate) fn receive_connected(
        &mut self,
        now: Nanos,
        receiving: bool,
        meta: &RxMeta,
        pkt: &ParsedPacket<'_>,
        handle: impl FnOnce(&mut Self) -> bool,
    ) {
        let c = &self.core.cfg.counters;
        let peer = self.core.attr.ah_attr.ip();
        if let Err(d) = self
            .core
            .pin
            .admit(receiving, peer, S::TRANSPORT, meta, pkt)
        {
            d.count(c);
            return;
        }
        Counters::inc(&c.rcvd_pkts);
        if crate::observe::COMPILED {
            self.core.last_rx = Some(now);
        }
        self.core.note_received();
        if handle(self) {
            let strict = self.core.cfg.strict_source_port;
            self.core.pin.accepted(strict, meta);
        }
    }

    /// The path MTU in bytes.
    pub(crate) fn mtu(&self) -> u32 {
        self.core.attr.path_mtu.bytes()
    }

    /// A BTH to the connected peer's QP.
    pub(crate) fn bth(&self, opcode: Opcode, psn: Psn) -> BthRepr {
        bth(self.core.attr.dest_qp_num, opcode, psn)
    }

    /// Writes headers + payload (filled by `fill`, which may refuse) + pad
    /// + ICRC for the connected peer into `buf`; returns the packet.
    pub(crate) fn emit(
        &self,
        h: &Headers,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<Transmit> {
        let dst = self.core.attr.ah_attr.ip();
        let len = self.core.cfg.emit(dst, h, payload_len, buf, fill)?;
        let tclass = self.core.attr.ah_attr.traffic_class;
        // RC and UC peers are unicast: the route's hop limit.
        Some(Transmit {
            dst,
            len,
            tclass,
            hop_limit: None,
        })
    }
}

impl<S: Service> Drop for Qp<S> {
    /// A QP destroyed with WRs posted: their spans end in the trace (the
    /// queues' addresses may serve another QP next).
    fn drop(&mut self) {
        self.core.cfg.tell_queues_gone(Gone::Destroyed);
    }
}

/// A BTH to `dest_qp` with the default P_Key.
pub(crate) fn bth(dest_qp: u32, opcode: Opcode, psn: Psn) -> BthRepr {
    BthRepr {
        opcode,
        pkey: PKEY,
        dest_qp,
        psn,
        ..BthRepr::default()
    }
}

impl<S: Service> QpMachine for Qp<S> {
    fn qpn(&self) -> u32 {
        self.core.cfg.qpn
    }
    fn qp_type(&self) -> QpType {
        S::QP_TYPE
    }
    fn state(&self) -> QpState {
        self.core.state
    }
    fn attr(&self) -> QpAttr {
        S::query(self)
    }
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        Qp::modify(self, attr, mask)
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        S::receive(self, now, meta, pkt);
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        Qp::poll_transmit(self, now, buf)
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        Qp::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Nanos) {
        Qp::handle_timeout(self, now)
    }
    fn inflight(&self) -> u32 {
        if self.core.sending() {
            self.svc.inflight()
        } else {
            0
        }
    }
    fn set_throttled(&mut self, on: bool) {
        self.svc.set_throttled(on);
    }
    fn only_acks_to_send(&self) -> bool {
        S::only_acks_to_send(self)
    }
    fn tally(&self) -> QpTally {
        self.core.tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flushes_an_error_causes_do_not_hide_it() {
        let mut t = QpTally::default();
        let wc = |id, status| Wc::new(id, status, WcOpcode::Send, 0x11);
        t.note_completion(true, &wc(1, WcStatus::Success));
        assert_eq!(t.last_error, None);
        t.note_completion(true, &wc(2, WcStatus::WrFlushErr));
        assert_eq!(t.last_error.map(|e| e.status), Some(WcStatus::WrFlushErr));
        t.note_completion(true, &wc(3, WcStatus::RetryExcErr));
        t.note_completion(false, &wc(4, WcStatus::WrFlushErr));
        let e = t.last_error.unwrap();
        assert_eq!(
            (e.status, e.wr_id, e.send),
            (WcStatus::RetryExcErr, 3, true)
        );
    }
}
