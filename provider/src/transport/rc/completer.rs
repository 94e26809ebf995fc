//! The completer: ACKs, NAKs, READ responses and atomic ACKs
//! (IBA 9.7.5.1.x requester side, 9.9.2 requester errors).

use super::RcQp;
use crate::counters::Counters;
use crate::observe::cause::{Asked, Cause};
use crate::observe::{Fact, Resend, Topic};
use crate::transport::status::requester_status;
use crate::transport::Nanos;
use crate::types::{WcStatus, WrOpcode};
use uroce_wire::aeth::{rnr_timer_ns, AethSyndrome, NakCode};
use uroce_wire::packet::ParsedPacket;
use uroce_wire::{Operation, Psn};

impl RcQp {
    pub(super) fn handle_response(&mut self, now: Nanos, pkt: &ParsedPacket<'_>) {
        let psn = pkt.bth.psn;
        if pkt.info.operation == Operation::RdmaReadResponse {
            self.read_answer_seen(now, psn);
        }
        // A response must be for a PSN we sent and that is not yet
        // acknowledged; anything else is stale (or a ghost) and dropped.
        let outstanding = self.svc.req.hwm.distance_from(self.svc.req.una);
        if psn.distance_from(self.svc.req.una) >= outstanding {
            // An ACK for the PSN just before una re-acknowledges: harmless.
            Counters::inc(&self.core.cfg.counters.dropped_pkts);
            return;
        }
        let before = self.svc.req.una;
        match pkt.info.operation {
            Operation::Acknowledge => {
                let Some(aeth) = pkt.aeth() else { return };
                match aeth.syndrome {
                    AethSyndrome::Ack { .. } => self.ack_through(psn),
                    AethSyndrome::RnrNak { timer } => {
                        Counters::inc(&self.core.cfg.counters.rnr_naks_rcvd);
                        self.core.tally.rnr_naks_rcvd += 1;
                        if !self.nak_reaches(psn) {
                            return;
                        }
                        if self.core.attr.rnr_retry != 7 {
                            if self.svc.req.rnr_left == 0 {
                                self.core.why = Some(Cause::RnrRetryExceeded {
                                    peer: self.core.peer(),
                                    psn: psn.value(),
                                    syndrome: aeth.syndrome,
                                    timer,
                                    timer_ns: rnr_timer_ns(timer),
                                    rnr_retry: self.core.attr.rnr_retry,
                                    last_seen_ns: self.core.peer_last_seen(now),
                                });
                                self.fail_at(psn, WcStatus::RnrRetryExcErr);
                                return;
                            }
                            self.svc.req.rnr_left -= 1;
                        }
                        self.svc.req.go_back(psn);
                        self.svc.req.timer = None;
                        self.svc.req.rnr_until = Some(now.plus(rnr_timer_ns(timer)));
                        let (qpn, retries_left) = (self.qpn(), self.svc.req.rnr_left);
                        self.core
                            .cfg
                            .observer
                            .tell(Topic::TIMELINE, || Fact::RnrWait {
                                qpn,
                                psn: psn.value(),
                                wait_ns: rnr_timer_ns(timer),
                                retries_left,
                            });
                    }
                    AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                        Counters::inc(&self.core.cfg.counters.seq_naks_rcvd);
                        self.core.tally.seq_naks_rcvd += 1;
                        if !self.nak_reaches(psn) {
                            return;
                        }
                        // A NAK for the PSN we are already resending from,
                        // caused by packets sent before that resend began
                        // (reordering), asks for nothing new.
                        if let Some((p, h)) = self.svc.req.nak_resend {
                            if p == psn && h.is_after(self.svc.req.next_psn) {
                                return;
                            }
                        }
                        // Unlike a timeout, a sequence NAK proves the path
                        // and the responder alive: it resends without
                        // spending the retry budget (which detects dead
                        // paths). Under heavy reordering go-back-N would
                        // otherwise exhaust it while making progress.
                        self.svc.req.go_back(psn);
                        self.svc.req.nak_resend = Some((psn, self.svc.req.hwm));
                        let (qpn, retries_left) = (self.qpn(), self.svc.req.retry_left);
                        self.core
                            .cfg
                            .observer
                            .tell(Topic::TIMELINE, || Fact::Retransmit {
                                qpn,
                                psn: psn.value(),
                                cause: Resend::SeqNak,
                                retries_left,
                            });
                        // Not a congestion signal: reordering makes them
                        // too (25% reordering with halving at each NAK
                        // took a lossy-link stress run from 250 s to
                        // 459 s); timeouts and the device budget are.
                    }
                    AethSyndrome::Nak(code) => {
                        if self.nak_reaches(psn) {
                            self.core.why = Some(self.nak_fault(psn, aeth.syndrome));
                            self.fail_at(psn, requester_status(code));
                        }
                    }
                    AethSyndrome::Reserved(_) => {
                        Counters::inc(&self.core.cfg.counters.dropped_pkts);
                    }
                }
            }
            Operation::RdmaReadResponse => self.read_response(now, psn, pkt),
            Operation::AtomicAcknowledge => self.atomic_ack(psn, pkt),
            _ => Counters::inc(&self.core.cfg.counters.dropped_pkts),
        }
        if self.svc.req.una != before
            && matches!(
                self.core.state,
                crate::types::QpState::Rts | crate::types::QpState::Sqd
            )
        {
            // Progress: fresh retry budget and timer; the window grows.
            let mtu = self.mtu();
            self.svc
                .req
                .on_acked(self.svc.req.una.distance_from(before), mtu);
            self.svc.req.retry_left = self.core.attr.retry_cnt;
            self.svc.req.rnr_left = self.core.attr.rnr_retry;
            self.svc.req.timer = if self.svc.req.inflight() > 0 && self.core.attr.timeout != 0 {
                Some(now.plus(super::requester::ack_timeout_ns(self.core.attr.timeout)))
            } else {
                None
            };
        }
        self.retire();
    }

    /// A response for the READ being waited for, whether it fills the
    /// hole, lies ahead of it or repeats one already placed, shows the
    /// responder alive and answering: the retransmission timer restarts
    /// (rxe's requester restarts it at every response). A responder
    /// answers in order, and each re-request of a READ makes it send the
    /// rest of the READ again: while it still sends answers to earlier
    /// requests, a re-request only queues another answer behind them. A
    /// timer that ran out during the stream would re-request again and
    /// again; against a slow responder (rxe in an emulated guest) the
    /// queue grew until a later request's ACK came after every retry
    /// (`a_slow_responders_read_answers_keep_the_read_alive`).
    fn read_answer_seen(&mut self, now: Nanos, psn: Psn) {
        if self.svc.req.timer.is_none() || self.core.attr.timeout == 0 {
            return;
        }
        let waited = self.svc.req.waited().map(|i| &self.svc.req.wqes[i]);
        if waited.is_some_and(|e| e.started && e.wr.opcode == WrOpcode::RdmaRead && e.contains(psn))
        {
            self.svc.req.timer =
                Some(now.plus(super::requester::ack_timeout_ns(self.core.attr.timeout)));
        }
    }

    /// What the requester knows of an error NAK for `psn`: the peer, the
    /// syndrome and PSN, and what the WR holding `psn` asked for. The
    /// responder's own explanation names the check that failed.
    fn nak_fault(&self, psn: Psn, syndrome: AethSyndrome) -> Cause {
        let asked = self.svc.req.holding(psn).map(|e| Asked {
            wr_id: e.wr.wr_id,
            op: e.wr.opcode,
            rkey: e.wr.rkey,
            va: e.wr.remote_addr,
            len: e.len,
        });
        Cause::NakReceived {
            peer: self.core.peer(),
            syndrome,
            psn: psn.value(),
            asked,
        }
    }

    /// A NAK (or RNR NAK) for `psn` acknowledges everything before it;
    /// whether it then applies to `psn`. It does not when a READ or atomic
    /// before `psn` is still unanswered: its response was lost (an implied
    /// NAK), it is resent first, and the responder NAKs `psn` again when
    /// the resend reaches it. Taking the NAK at once would complete the
    /// READ or atomic without its data (found by `uroce fuzz --mode
    /// responder`), or resume past it.
    fn nak_reaches(&mut self, psn: Psn) -> bool {
        planted!(self.ack_before(psn), NakAcknowledgesItsPsn => self.ack_through(psn));
        self.svc.req.una == psn && self.core.state != crate::types::QpState::Err
    }

    /// Everything before `psn` is acknowledged.
    fn ack_before(&mut self, psn: Psn) {
        if psn != self.svc.req.una {
            self.ack_through(psn.sub(1));
        }
    }

    /// Everything up to and including `psn` is acknowledged. A READ or
    /// atomic inside that range without its response means the response
    /// was lost: resend it (an implied NAK, IBA ch. 9.7).
    fn ack_through(&mut self, psn: Psn) {
        // All PSNs compared here lie within the send window (< 2^23 wide),
        // so the signed 24-bit order is exact.
        for i in 0..self.svc.req.wqes.len() {
            let e = &mut self.svc.req.wqes[i];
            if e.done || e.error.is_some() || !e.started {
                continue;
            }
            if e.first_psn.is_after(psn) {
                break;
            }
            if planted!(e.wr.opcode.is_read_or_atomic(), ImpliedNakIgnored => false) {
                // Acknowledged past an unanswered READ/atomic.
                let resume = e.first_psn.add(e.read_done);
                if resume.is_after(psn) {
                    break;
                }
                self.svc.req.una = resume;
                // Once per hole: every later response of the same READ
                // implies the same NAK, and each re-request would make
                // the responder replay the rest of the READ again. A lost
                // re-request is covered by the ACK timer.
                if self.svc.req.read_rerequest != Some(resume) {
                    self.svc.req.read_rerequest = Some(resume);
                    self.svc.req.go_back(resume);
                }
                return;
            }
            if !e.last_psn().is_after(psn) {
                e.done = true;
            }
        }
        self.svc.req.una = psn.next();
        self.svc.req.resume_after_una();
    }

    fn read_response(&mut self, now: Nanos, psn: Psn, pkt: &ParsedPacket<'_>) {
        let mtu = self.mtu() as u64;
        // FLUSH and ATOMIC WRITE are answered by an empty READ RESPONSE
        // ONLY (as rxe answers them): an acknowledgement of their PSN.
        if let Some(e) = self.svc.req.holding(psn) {
            if e.wr.opcode.is_flush_or_atomic_write() {
                if pkt.info.position == uroce_wire::Position::Only && pkt.payload.is_empty() {
                    self.ack_through(psn);
                } else {
                    Counters::inc(&self.core.cfg.counters.dropped_pkts);
                }
                return;
            }
        }
        // Responses also acknowledge the requests before their READ (not
        // the READ's own earlier PSNs: a hole in them is handled below).
        let first = self
            .svc
            .req
            .wqes
            .iter()
            .find(|e| e.wr.opcode == WrOpcode::RdmaRead && e.contains(psn))
            .map_or(psn, |e| e.first_psn);
        if first.is_after(self.svc.req.una) {
            self.ack_before(first);
        }
        let Some(i) = self.svc.req.waited() else {
            return;
        };
        let reorder_ns = reorder_window_ns(self.core.attr.timeout);
        let e = &mut self.svc.req.wqes[i];
        if e.wr.opcode != WrOpcode::RdmaRead || !e.contains(psn) {
            Counters::inc(&self.core.cfg.counters.dropped_pkts);
            return;
        }
        let expected = e.first_psn.add(e.read_done);
        let pos = pkt.info.position;
        if psn != expected {
            if !psn.is_after(expected) {
                // A duplicate (from a re-request's replay).
                Counters::inc(&self.core.cfg.counters.dropped_pkts);
                return;
            }
            // Ahead of a hole: reordered, or the hole's packet was lost.
            // Place it now if it fits the window (the PSN fixes its offset),
            // so that reordering costs no resend; ask again for the rest
            // only once the hole looks lost: it outlived the reorder
            // window, or enough later packets passed it, or the last one
            // came (nothing more would tell). Once per hole; the ACK timer
            // covers a lost re-request.
            let idx = psn.distance_from(e.first_psn);
            let k = idx - e.read_done - 1;
            // A packet that does not fit its place is dropped here; the
            // in-order one will judge it.
            if e.read_done == 0 && e.read_ahead == 0 {
                self.core.cfg.sq.read_placing(e.wr.wr_id);
            }
            if k < 128
                && e.read_ahead & (1u128 << k) == 0
                && e.place_read_response(idx, mtu, pos, pkt.payload).is_ok()
            {
                e.read_ahead |= 1u128 << k;
            } else {
                Counters::inc(&self.core.cfg.counters.dropped_pkts);
            }
            let is_last = idx + 1 == e.npkts;
            let (since, seen) = match self.svc.req.read_hole {
                Some((h, t, n)) if h == expected => (t, n + 1),
                _ => (now, 1),
            };
            self.svc.req.read_hole = Some((expected, since, seen));
            let lost = k >= 128
                || is_last
                || seen >= REORDER_PKTS
                || now.0.saturating_sub(since.0) >= reorder_ns;
            if lost && self.svc.req.read_rerequest != Some(expected) {
                self.svc.req.read_rerequest = Some(expected);
                self.svc.req.una = expected;
                self.svc.req.go_back(expected);
            }
            return;
        }
        if e.read_done == 0 && e.read_ahead == 0 {
            self.core.cfg.sq.read_placing(e.wr.wr_id);
        }
        if let Err(status) = e.place_read_response(e.read_done, mtu, pos, pkt.payload) {
            e.error = Some(status);
            return;
        }
        e.read_done += 1;
        // Then whatever arrived ahead of it and now follows on.
        while e.read_ahead & 1 != 0 {
            e.read_ahead >>= 1;
            e.read_done += 1;
        }
        e.read_ahead >>= 1;
        // (Bits are only set for packets of this READ: no overrun.)
        if e.read_done == e.npkts {
            e.done = true;
        }
        self.svc.req.una = e.first_psn.add(e.read_done);
        self.svc.req.read_hole = None;
    }

    /// An ATOMIC ACKNOWLEDGE answers the atomic sent at its PSN and
    /// acknowledges everything before it. One whose PSN is not an atomic's
    /// (a SEND's, a WRITE's) is a response of the wrong kind, which the
    /// requester discards whole (IBA 9.7.5.2, response checks): it
    /// acknowledges nothing. (rxe completes such a SEND with success.)
    fn atomic_ack(&mut self, psn: Psn, pkt: &ParsedPacket<'_>) {
        let answers_an_atomic = self.svc.req.wqes.iter().any(|e| {
            e.started
                && !e.done
                && e.error.is_none()
                && e.wr.opcode.is_atomic()
                && e.first_psn == psn
        });
        if planted!(!answers_an_atomic, AtomicAckAnyPsn => false) {
            Counters::inc(&self.core.cfg.counters.dropped_pkts);
            return;
        }
        self.ack_before(psn);
        let Some(i) = self.svc.req.waited() else {
            return;
        };
        let e = &mut self.svc.req.wqes[i];
        let own_psn = planted!(e.first_psn == psn, AtomicAckAnyPsn => true);
        if !e.wr.opcode.is_atomic() || !own_psn || !e.started {
            Counters::inc(&self.core.cfg.counters.dropped_pkts);
            return;
        }
        let orig = pkt.atomic_ack().map(|a| a.orig).unwrap_or(0);
        // The original value lands in local memory in host byte order.
        if e.data.scatter(0, &orig.to_ne_bytes()).is_err() {
            e.error = Some(WcStatus::LocProtErr);
            return;
        }
        e.done = true;
        self.svc.req.una = psn.next();
    }
}

/// Later responses that must pass a hole in a READ's responses before it
/// counts as lost (reordering moves a packet by fewer).
const REORDER_PKTS: u32 = 32;

/// How long a hole in a READ's responses may stay open before it counts
/// as lost: a sixteenth of the ACK timeout (4 ms at the usual 14).
fn reorder_window_ns(timeout: u8) -> u64 {
    if timeout == 0 {
        4_000_000
    } else {
        super::requester::ack_timeout_ns(timeout) / 16
    }
}
