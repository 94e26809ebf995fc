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
//!
//! RC is a [`Service`] of the one QP engine ([`super::core`]): the engine
//! owns the QP's life (modify, completions, ERR, RESET, the state switch
//! of `poll_transmit`); RC supplies its hooks: its modify attributes
//! (PSNs, retry counters), the flush of the WRs its requester holds and
//! of the receive WR of a message in progress, both halves of the receive
//! path (requests to the responder, responses to the completer, then the
//! SQD drain check), responses before requests, the retransmission and
//! RNR timers, the in-flight count and the device's throttle. SEND and
//! WRITE segmentation and placement are UC's too ([`super::message`]).

mod completer;
mod requester;
mod responder;

use super::core::{Qp, Service};
use super::{Nanos, RxMeta, Transmit};
use crate::qp_attr::{AttrMask, QpAttr};
use crate::types::{QpState, QpType, WcStatus};
#[cfg(any(test, feature = "testing"))]
pub use requester::ack_timeout_ns;
use requester::Requester;
use responder::Responder;
#[cfg(any(test, feature = "testing"))]
pub use responder::{MAX_DEFERRED, MAX_QUEUED_RESPONSES};
use uroce_wire::packet::ParsedPacket;
use uroce_wire::Psn;

#[cfg(any(test, feature = "testing"))]
pub use super::message::MAX_MSG_SIZE;
#[cfg(any(test, feature = "testing"))]
pub use super::QpConfig;
#[cfg(any(test, feature = "testing"))]
pub use super::PKEY;
/// How many bytes of requests a QP may have outstanding (sent,
/// unacknowledged) at once: its window in PSNs is this over the path MTU
/// ([`max_inflight_psns`]), so that a QP at MTU 1024 keeps as much in
/// flight as one at 4096. With 64 PSNs at every MTU, a 64 KiB WRITE at
/// MTU 1024 filled the window alone, and the requester stopped for the
/// ACK round trip after every message (ib_write_bw -m 1024: 0.7-1.2 GB/s
/// with 64 PSNs, 1.0-1.8 GB/s with 256, alternated on this machine).
pub const MAX_INFLIGHT_BYTES: u32 = 256 * 1024;
/// The fewest PSNs a full window holds (MTU 4096).
pub const MIN_INFLIGHT_PSNS: u32 = 64;
/// The most PSNs a full window holds (MTU 1024 and below). rxe lets 128
/// PSNs be unacknowledged at any MTU (`RXE_MAX_UNACKED_PSNS`); the device's
/// budget ([`crate::endpoint::DEVICE_INFLIGHT_PSNS`]) still bounds all QPs
/// together.
pub const MAX_INFLIGHT_PSNS: u32 = 256;

/// How many PSNs a QP may have outstanding at once at path MTU `mtu`: a
/// full window ([`MAX_INFLIGHT_BYTES`]) in packets, between
/// [`MIN_INFLIGHT_PSNS`] and [`MAX_INFLIGHT_PSNS`].
pub fn max_inflight_psns(mtu: u32) -> u32 {
    (MAX_INFLIGHT_BYTES / mtu.max(1)).clamp(MIN_INFLIGHT_PSNS, MAX_INFLIGHT_PSNS)
}
/// The smallest congestion window a requester backs off to (PSNs).
pub const MIN_CWND: u32 = 4;
/// A request packet asks for an ACK at least this often within a message.
pub const ACK_REQ_EVERY: u32 = 16;

/// An RC QP: the engine ([`Qp`]) with RC's requester, completer and
/// responder.
pub type RcQp = Qp<RcService>;

/// RC's part of a QP: the requester (with the completer's state) and the
/// responder.
#[derive(Debug, Default)]
pub struct RcService {
    req: Requester,
    resp: Responder,
}

impl Service for RcService {
    const QP_TYPE: QpType = QpType::Rc;

    fn psns(&self) -> (Psn, Psn) {
        (self.req.next_psn, self.resp.epsn)
    }

    /// The requester's PSN and retry counters, the responder's PSN.
    fn apply_modify(qp: &mut RcQp, attr: &QpAttr, mask: AttrMask, _to: QpState) {
        qp.svc.req.modify(attr, mask);
        qp.svc.resp.modify(attr, mask);
    }

    /// The WRs the requester took complete with WR_FLUSH_ERR, in order,
    /// then the receive WR of a message in progress; READ responses and
    /// atomic ACKs still queued are dropped (ACKs and NAKs still go).
    fn on_error(qp: &mut RcQp) {
        for e in qp.svc.req.drain() {
            qp.retire_send(&e.wr, WcStatus::WrFlushErr, 0);
        }
        if let Some(wr_id) = qp.svc.resp.abort_current() {
            qp.complete_recv(wr_id, WcStatus::WrFlushErr);
        }
        qp.svc.resp.drop_reads();
    }

    fn on_reset(qp: &mut RcQp) {
        let n = qp.svc.req.drain().len() as u32;
        qp.core.cfg.sq.retire(n);
        qp.svc = RcService::default();
    }

    /// Requests go to the responder, responses to the completer (a
    /// response needs a requester: not in RTR).
    fn receive(qp: &mut RcQp, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let request = pkt.info.is_request;
        let receiving = qp.core.receiving() && (request || qp.core.state != QpState::Rtr);
        qp.receive_connected(now, receiving, meta, pkt, |qp| {
            let (epsn, una) = (qp.svc.resp.epsn, qp.svc.req.una);
            if request {
                qp.handle_request(now, pkt);
            } else {
                qp.handle_response(now, pkt);
                qp.check_drained();
            }
            qp.svc.resp.epsn != epsn || qp.svc.req.una != una
        });
    }

    /// Requests deferred behind READ responses run first (not in ERR).
    fn respond(qp: &mut RcQp, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        if qp.core.state != QpState::Err {
            qp.run_deferred(now);
        }
        qp.transmit_response(buf)
    }

    fn request(qp: &mut RcQp, now: Nanos, buf: &mut [u8], allow_new: bool) -> Option<Transmit> {
        qp.transmit_request(now, buf, allow_new)
    }

    /// No started WR is outstanding.
    fn drained(&self) -> bool {
        self.req.wqes.iter().all(|e| !e.started)
    }

    /// The retransmission timer or the RNR wait.
    fn deadline(&self) -> Option<Nanos> {
        self.req.poll_timeout()
    }

    fn timeout(qp: &mut RcQp, now: Nanos) {
        qp.requester_timeout(now);
    }

    fn inflight(&self) -> u32 {
        self.req.inflight()
    }

    fn set_throttled(&mut self, on: bool) {
        self.req.throttled = on;
    }

    /// ACKs and NAKs only: no READ response or atomic ACK to send, no
    /// request waiting behind a READ, and no request of this QP's own to
    /// send (every WR taken is sent, none waits to be taken).
    fn only_acks_to_send(qp: &RcQp) -> bool {
        matches!(qp.core.state, QpState::Rtr | QpState::Rts)
            && qp.svc.resp.only_acks()
            && qp.svc.req.send_idx == qp.svc.req.wqes.len()
            && !qp.core.cfg.sq.has_pending()
    }
}
