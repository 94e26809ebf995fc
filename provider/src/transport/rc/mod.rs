//! Reliable connected QPs (IBA 9.7-9.9): requester, completer and
//! responder as one sans-IO state machine per QP.
//!
//! * `requester` turns send WRs into request packets (segmentation by
//!   path MTU, ack requests, fence and max_rd_atomic, go-back-N resend);
//! * `completer` takes ACKs, NAKs, READ responses and atomic ACKs and
//!   completes send WRs in order, with the retry and RNR counters;
//! * `responder` checks and executes requests (PSN, op sequence, op
//!   validity, resources, length, R_Key; execute; acknowledge), answers
//!   READs and atomics, and completes receive WRs.

mod completer;
mod requester;
mod responder;

use super::{Nanos, Transmit};
use crate::counters::Counters;
use crate::events::EventType;
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
pub use crate::transport::QpConfig;
use crate::transport::QpCore;
use crate::transport::{QpMachine, RxMeta};
use crate::types::{QpState, QpType, Wc, WcStatus};
use requester::Requester;
use responder::Responder;
pub(crate) use responder::{check_op_allowed, check_payload_length};
pub use responder::{MAX_DEFERRED, MAX_QUEUED_RESPONSES};
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::{BthRepr, Opcode, Position, Psn, Transport};

pub use crate::transport::PKEY;
/// How many PSNs may be outstanding (sent, unacknowledged) at once.
pub const MAX_INFLIGHT_PSNS: u32 = 64;
/// The smallest congestion window a requester backs off to (PSNs).
pub const MIN_CWND: u32 = 4;
/// A request packet asks for an ACK at least this often within a message.
pub const ACK_REQ_EVERY: u32 = 16;

/// An RC QP.
#[derive(Debug)]
pub struct RcQp {
    core: QpCore,
    req: Requester,
    resp: Responder,
}

impl RcQp {
    /// A QP in the RESET state.
    pub fn new(cfg: QpConfig) -> RcQp {
        RcQp {
            core: QpCore::new(cfg),
            req: Requester::default(),
            resp: Responder::default(),
        }
    }
    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.core.cfg.qpn
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.core.state
    }
    /// Current attributes (as `ibv_query_qp` reports them).
    pub fn attr(&self) -> QpAttr {
        self.core
            .query(self.req.next_psn.value(), self.resp.epsn.value())
    }
    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.core.cfg
    }

    /// Applies a modify-QP call (checked against the spec's table).
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = self.core.begin_modify(QpType::Rc, attr, mask)?;
        if mask.contains(AttrMask::RQ_PSN) {
            self.resp.reset_psn(Psn::new(attr.rq_psn));
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req.reset_psn(Psn::new(attr.sq_psn));
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.req.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.req.rnr_left = attr.rnr_retry;
        }
        let from = self.core.state;
        match to {
            QpState::Err if from != QpState::Err => self.enter_error(),
            QpState::Reset => self.reset(),
            _ => {}
        }
        self.core.finish_modify(from, to);
        self.check_drained();
        Ok(())
    }

    /// In SQD: once no started WR is outstanding, the send queue is
    /// drained (reported as SQ_DRAINED when asked for at RTS->SQD).
    fn check_drained(&mut self) {
        if self.core.state == QpState::Sqd
            && self.core.attr.sq_draining
            && self.req.wqes.iter().all(|e| !e.started)
        {
            self.core.attr.sq_draining = false;
            if self.core.attr.en_sqd_async_notify {
                self.core.cfg.event(EventType::SqDrained);
            }
        }
    }

    /// Takes one packet addressed to this QP (parsed and ICRC-checked).
    pub fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let c = &self.core.cfg.counters;
        let receiving = self.core.receiving();
        // A response needs a requester: not in RTR.
        let receiving = receiving && (pkt.info.is_request || self.core.state != QpState::Rtr);
        if let Err(d) = self.core.pin.admit(
            receiving,
            self.core.attr.ah_attr.ip(),
            Transport::Rc,
            meta,
            pkt,
        ) {
            d.count(c);
            return;
        }
        Counters::inc(&c.rcvd_pkts);
        self.core.note_received();
        let (epsn, una) = (self.resp.epsn, self.req.una);
        if pkt.info.is_request {
            self.handle_request(now, pkt);
        } else {
            self.handle_response(now, pkt);
            self.check_drained();
        }
        if self.resp.epsn != epsn || self.req.una != una {
            self.core
                .pin
                .accepted(self.core.cfg.strict_source_port, meta);
        }
    }

    /// Writes the next packet to send into `buf` (at least path MTU + 128
    /// bytes), or returns `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        if self.core.state == QpState::Err {
            self.core.cfg.flush_posted();
        } else {
            self.run_deferred(now);
        }
        let t = match self.transmit_response(buf) {
            Some(len) => Some(len),
            None if self.core.state == QpState::Rts => self.transmit_request(now, buf, true),
            None if self.core.state == QpState::Sqd => self.transmit_request(now, buf, false),
            None => None,
        }?;
        Counters::inc(&self.core.cfg.counters.sent_pkts);
        Some(Transmit {
            dst: self.core.attr.ah_attr.ip(),
            len: t,
        })
    }

    /// The next deadline.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        if !matches!(self.core.state, QpState::Rts | QpState::Sqd) {
            return None;
        }
        self.req.poll_timeout()
    }

    /// Handles the passing of time (safe to call spuriously).
    pub fn handle_timeout(&mut self, now: Nanos) {
        if matches!(self.core.state, QpState::Rts | QpState::Sqd) {
            self.requester_timeout(now);
            self.check_drained();
        }
    }

    fn mtu(&self) -> u32 {
        self.core.attr.path_mtu.bytes()
    }

    fn bth(&self, opcode: Opcode, psn: Psn) -> BthRepr {
        bth(self.core.attr.dest_qp_num, opcode, psn)
    }

    /// Writes headers + payload (filled by `fill`) + pad + ICRC into `buf`.
    fn emit(
        &self,
        h: &Headers,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<usize> {
        self.core
            .cfg
            .emit(self.core.attr.ah_attr.ip(), h, payload_len, buf, fill)
    }

    fn complete(&mut self, cq_is_send: bool, wc: Wc) {
        self.complete_notify(cq_is_send, wc, false);
    }

    /// Adds a completion; `solicited` marks a receive completion whose
    /// message asked for a solicited event. A full CQ (overflow) is a
    /// catastrophic error for the QP (IBA 11.4.2.1, QP_FATAL).
    fn complete_notify(&mut self, cq_is_send: bool, wc: Wc, solicited: bool) {
        if !self.core.cfg.complete(cq_is_send, wc, solicited) && self.core.state != QpState::Err {
            self.core.cfg.event(EventType::QpFatal);
            self.core.set_state(QpState::Err);
            self.enter_error();
        }
    }

    /// Moves to ERR: every outstanding WR completes with WR_FLUSH_ERR in
    /// posting order, receive WRs too.
    fn enter_error(&mut self) {
        self.core.set_state(QpState::Err);
        let flushed = self.req.drain();
        for e in flushed {
            let mut wc = Wc::new(
                e.wr.wr_id,
                WcStatus::WrFlushErr,
                e.wr.opcode.wc_opcode(),
                self.core.cfg.qpn,
            );
            wc.byte_len = 0;
            self.core.cfg.sq.retire(1);
            self.complete(true, wc);
        }
        if let Some(wr_id) = self.resp.abort_current() {
            let wc = Wc::new(
                wr_id,
                WcStatus::WrFlushErr,
                crate::types::WcOpcode::Recv,
                self.core.cfg.qpn,
            );
            self.complete(false, wc);
        }
        self.resp.drop_reads();
        self.core.cfg.flush_posted();
        self.core.cfg.report_last_wqe();
    }

    /// To RESET: everything is discarded without completions.
    fn reset(&mut self) {
        let n = self.req.drain().len() as u32;
        self.core.cfg.sq.retire(n);
        self.core.cfg.discard_posted();
        self.core.reset();
        self.req = Requester::default();
        self.resp = Responder::default();
    }
}

/// A BTH to `dest_qp` with the default P_Key.
fn bth(dest_qp: u32, opcode: Opcode, psn: Psn) -> BthRepr {
    BthRepr {
        opcode,
        pkey: PKEY,
        dest_qp,
        psn,
        ..BthRepr::default()
    }
}

/// Largest message (as rxe: 2^31 bytes), RC and UC.
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Position of packet `k` of `n`.
pub(crate) fn position(k: u32, n: u32) -> Position {
    match (k, n) {
        (_, 1) => Position::Only,
        (0, _) => Position::First,
        (k, n) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// Number of packets (PSNs) a message of `len` bytes takes at `mtu`.
pub(crate) fn npkts(len: u64, mtu: u32) -> u32 {
    len.div_ceil(mtu as u64).max(1) as u32
}

impl QpMachine for RcQp {
    fn qpn(&self) -> u32 {
        self.core.cfg.qpn
    }
    fn qp_type(&self) -> QpType {
        QpType::Rc
    }
    fn state(&self) -> QpState {
        self.core.state
    }
    fn attr(&self) -> QpAttr {
        RcQp::attr(self)
    }
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        RcQp::modify(self, attr, mask)
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        RcQp::handle_packet(self, now, meta, pkt)
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        RcQp::poll_transmit(self, now, buf)
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        RcQp::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Nanos) {
        RcQp::handle_timeout(self, now)
    }
    fn inflight(&self) -> u32 {
        if matches!(self.core.state, QpState::Rts | QpState::Sqd) {
            self.req.inflight()
        } else {
            0
        }
    }
    fn set_throttled(&mut self, on: bool) {
        self.req.throttled = on;
    }
}
