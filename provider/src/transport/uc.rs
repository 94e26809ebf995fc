//! Unreliable connected QPs (IBA vol. 1 ch. 9; kernel rxe as the
//! behavioural reference): a requester
//! that turns SEND and RDMA WRITE work requests into packets, and a
//! responder that reassembles messages, as one sans-IO state machine.
//!
//! UC has no acknowledgements: the requester never waits and never
//! resends, the responder never answers. A lost packet loses its message;
//! the responder notices a PSN or opcode sequence break, drops the message
//! in progress and resumes at the next FIRST or ONLY packet, taking that
//! packet's PSN as the expected one (as kernel rxe's UC `check_psn` and
//! `drop_msg` do).
//!
//! * requester: SEND, SEND with immediate, RDMA WRITE, RDMA WRITE with
//!   immediate, segmented by path MTU, one PSN per packet, AckReq never set,
//!   SE on the last packet of a solicited WR. A WR completes when its last
//!   packet has been produced. A local error (other opcodes, a bad SGE, a
//!   message too long) completes the WR in error and moves the QP to SQE,
//!   where later WRs are flushed until SQE -> RTS (IBA ch. 10, the SQE
//!   state: a send queue error of a UC or UD QP leaves the receive queue
//!   running).
//! * responder: checks PSN, op sequence, op validity (QP access flags),
//!   resources (a receive WR), length, R_Key; a failed check drops the
//!   message silently (IBA class D/D1, counted in `uc_dropped_msgs`); a
//!   receive WR consumed by a dropped SEND is reused for the next message.
//!
//! As a [`Service`] of the one QP engine ([`super::core`]), UC supplies
//! its requester and responder; segmentation, the SEND/WRITE packets, the
//! op-validity, length and R_Key checks and the placement of a message
//! are RC's too ([`super::message`]); what a failed check does is the
//! error table's UC column ([`RespError::action`]). The engine owns SQE
//! (the failed WR completes, the send queue flushes, SQD's draining ends),
//! ERR (UC flushes the WR being sent, then the receive WRs it holds) and
//! RESET.

use super::core::{LocalFault, Qp, Service};
use super::message::{check_op_allowed, check_payload_length, fill_payload, message_headers};
use super::message::{npkts, position, segment, Inbound, RecvTarget, MAX_MSG_SIZE};
use super::sgl::Resolved;
use super::status::{ErrorAction, RespError};
use super::{Nanos, RxMeta, SweepDetector, Transmit};
use crate::counters::Counters;
use crate::observe::cause::Cause;
use crate::observe::cause::Side;
use crate::qp_attr::{AttrMask, QpAttr};
use crate::types::{QpState, QpType, SendWr, WcOpcode, WcStatus, WrOpcode};
use uroce_wire::packet::ParsedPacket;
use uroce_wire::{Opcode, Operation, Position, Psn, Transport};

/// A UC QP: the engine ([`Qp`]) with UC's requester and responder.
pub type UcQp = Qp<UcService>;

/// UC's part of a QP.
#[derive(Debug, Default)]
pub struct UcService {
    req: Requester,
    resp: Responder,
    /// Out-of-window request PSNs (a sweep).
    sweep: SweepDetector,
}

/// A send WR being turned into packets.
#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    /// Local buffers, resolved once (empty for inline data).
    data: Resolved,
    /// Message length.
    len: u64,
    /// Packets the message takes.
    npkts: u32,
    /// Packets produced so far.
    sent: u32,
}

#[derive(Debug, Default)]
struct Requester {
    /// The WR whose packets go out next.
    cur: Option<SendWqe>,
    /// PSN of the next packet.
    next_psn: Psn,
}

#[derive(Debug, Default)]
struct Responder {
    /// Expected PSN.
    epsn: Psn,
    cur: Option<Inbound>,
    /// A message was dropped: packets are ignored until the next FIRST or
    /// ONLY (rxe's `drop_msg`).
    dropping: bool,
    /// The receive WR of a dropped SEND, kept for the next message that
    /// needs one (it is the oldest WR this QP holds).
    held: Option<RecvTarget>,
}

impl Service for UcService {
    const QP_TYPE: QpType = QpType::Uc;

    fn psns(&self) -> (Psn, Psn) {
        (self.req.next_psn, self.resp.epsn)
    }

    fn apply_modify(qp: &mut UcQp, attr: &QpAttr, mask: AttrMask, _to: QpState) {
        if mask.contains(AttrMask::RQ_PSN) {
            qp.svc.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            qp.svc.req.next_psn = Psn::new(attr.sq_psn);
        }
    }

    /// The WR being sent completes with WR_FLUSH_ERR, then the receive WR
    /// held back from a dropped message and that of the SEND in progress.
    fn on_error(qp: &mut UcQp) {
        if let Some(w) = qp.svc.req.cur.take() {
            qp.retire_send(&w.wr, WcStatus::WrFlushErr, 0);
        }
        let held = qp.svc.resp.held.take();
        let open = qp.svc.resp.cur.take().and_then(Inbound::into_recv);
        for recv in held.into_iter().chain(open) {
            qp.complete_recv(recv.wr_id, WcStatus::WrFlushErr);
        }
        qp.svc.resp.dropping = false;
    }

    /// The sweep detector keeps counting across a reset.
    fn on_reset(qp: &mut UcQp) {
        if qp.svc.req.cur.take().is_some() {
            qp.core.cfg.sq.retire(1);
        }
        qp.svc.req = Requester::default();
        qp.svc.resp = Responder::default();
    }

    /// Requests only: UC has no responses.
    fn receive(qp: &mut UcQp, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let receiving = qp.core.receiving() && pkt.info.is_request;
        qp.receive_connected(now, receiving, meta, pkt, |qp| {
            let epsn = qp.svc.resp.epsn;
            qp.svc.sweep.note(now, pkt.bth.psn, epsn, &qp.core.cfg);
            qp.receive(pkt);
            qp.svc.resp.epsn != epsn
        });
    }

    fn request(qp: &mut UcQp, _now: Nanos, buf: &mut [u8], allow_new: bool) -> Option<Transmit> {
        qp.transmit_request(buf, allow_new)
    }

    /// The WR being sent has gone out entirely.
    fn drained(&self) -> bool {
        self.req.cur.is_none()
    }
}

impl UcQp {
    // ---------------------------------------------------------------
    // Requester
    // ---------------------------------------------------------------

    /// Checks a posted WR locally (opcode valid for UC, SGEs, length) and
    /// resolves its buffers: the data and the message length.
    fn admit(&self, wr: &SendWr) -> Result<(Resolved, u64), LocalFault> {
        // Local operations were executed before this.
        if !QpType::Uc.may_post(wr.opcode) {
            return Err(WcStatus::LocQpOpErr.into());
        }
        let (data, len) = self.core.cfg.send_buffers(wr)?;
        if len > MAX_MSG_SIZE {
            return Err(WcStatus::LocLenErr.into());
        }
        Ok((data, len))
    }

    /// Produces the next request packet. With `allow_new` false (SQD) only
    /// the WR already started goes on.
    fn transmit_request(&mut self, buf: &mut [u8], allow_new: bool) -> Option<Transmit> {
        if self.svc.req.cur.is_none() {
            if !allow_new {
                return None;
            }
            let mut wr = self.core.cfg.sq.take()?;
            // Local operations (BIND_MW, LOCAL_INV) run when the queue
            // reaches them; UC completes each WR once sent, so in order.
            while wr.opcode.is_local() {
                if let Err((status, why)) = self.core.cfg.execute_local(&wr) {
                    self.core.why = Some(why);
                    self.send_error(&wr, status);
                    return None;
                }
                self.retire_send(&wr, WcStatus::Success, 0);
                self.check_drained();
                wr = self.core.cfg.sq.take()?;
            }
            match self.admit(&wr) {
                Ok((data, len)) => {
                    self.svc.req.cur = Some(SendWqe {
                        wr,
                        data,
                        len,
                        npkts: npkts(len, self.mtu()),
                        sent: 0,
                    })
                }
                Err(f) => {
                    self.send_error(&wr, f);
                    return None;
                }
            }
        }
        let t = match self.build_request(buf) {
            Some(t) => t,
            None => {
                // The memory went away under us (deregistered): a local
                // protection error. What went out of the message is
                // dropped by the responder at our next FIRST/ONLY.
                let w = self.svc.req.cur.take()?;
                self.send_error(&w.wr, WcStatus::LocProtErr);
                return None;
            }
        };
        self.svc.req.next_psn = self.svc.req.next_psn.next();
        let w = self.svc.req.cur.as_mut()?;
        w.sent += 1;
        if w.sent == w.npkts {
            let w = self.svc.req.cur.take()?;
            self.retire_send(&w.wr, WcStatus::Success, w.len);
            self.check_drained();
        }
        Some(t)
    }

    /// Writes the next packet of the current WR into `buf`.
    fn build_request(&self, buf: &mut [u8]) -> Option<Transmit> {
        let w = self.svc.req.cur.as_ref()?;
        let pos = position(w.sent, w.npkts);
        let opcode = request_opcode(w.wr.opcode, pos)?;
        let bth = self.bth(opcode, self.svc.req.next_psn);
        let h = message_headers(bth, &w.wr, w.len, pos)?;
        let (off, plen) = segment(w.len, w.sent, self.mtu() as u64);
        let inline = w.wr.flags.contains(crate::types::SendFlags::INLINE);
        if w.sent == 0 && plen > 0 && !inline {
            // The first copy of its bytes for the wire: the checker
            // compares its sources now.
            self.core.cfg.sq.sending(w.wr.wr_id);
        }
        self.emit(&h, plen, buf, |dst| {
            fill_payload(&w.wr, &w.data, inline, off, dst)
        })
    }

    // ---------------------------------------------------------------
    // Responder
    // ---------------------------------------------------------------

    /// The responder's checks, in rxe's order: PSN, op sequence, op
    /// validity, resources, length, R_Key; then execute.
    fn receive(&mut self, pkt: &ParsedPacket<'_>) {
        let info = pkt.info;
        let psn = pkt.bth.psn;
        let starts = info.position.starts_message();
        // PSN (rxe check_psn for UC): a PSN other than the
        // expected one, or any packet while a message is being dropped,
        // is dropped unless it starts a message; a FIRST or ONLY resyncs.
        let gap = planted!(psn != self.svc.resp.epsn, UcGapContinues => false);
        if gap || self.svc.resp.dropping {
            if !starts {
                if !self.svc.resp.dropping {
                    self.drop_message();
                }
                return;
            }
            self.svc.resp.dropping = false;
        }
        // Op sequence: a message in progress continues with a MIDDLE or
        // LAST of the same operation. A FIRST or ONLY while one is open
        // ends it unfinished (missing LAST, class D1): the open message is
        // dropped and the packet may start a valid new one.
        let in_seq = match &self.svc.resp.cur {
            None => planted!(starts, UcMiddleWithoutFirst => true),
            Some(_) if starts => {
                Counters::inc(&self.core.cfg.counters.bad_opcode_sequence);
                self.abort_current();
                true
            }
            Some(m) => m.continues(info.operation),
        };
        if !in_seq {
            Counters::inc(&self.core.cfg.counters.bad_opcode_sequence);
            self.drop_message();
            return;
        }
        // Length of the packet: the same step as RC's.
        if let Err(e) = check_payload_length(pkt, self.mtu() as usize) {
            self.responder_error(e.err);
            return;
        }
        let accepted = match info.operation {
            Operation::Send => self.exec_send(pkt),
            Operation::RdmaWrite => self.exec_write(pkt),
            _ => {
                self.drop_message();
                false
            }
        };
        if accepted {
            self.svc.resp.epsn = psn.next();
        }
    }

    /// Takes the receive WR a message consumes: the one held back from a
    /// dropped message, else the next posted one.
    fn take_recv(&mut self) -> Result<Option<RecvTarget>, ()> {
        if let Some(t) = self.svc.resp.held.take() {
            return Ok(Some(t));
        }
        let Some(wr) = self.core.cfg.rq.take() else {
            return Ok(None);
        };
        self.core.cfg.recv_taken(&wr, true);
        match RecvTarget::resolve(&self.core.cfg, &wr) {
            Ok(t) => Ok(Some(t)),
            Err(cause) => {
                // The receive WR's own buffers are bad: a local error of
                // the receive queue (class A), the QP goes to ERR.
                self.core.why = Some(cause);
                self.recv_local_error(wr.wr_id, WcStatus::LocProtErr);
                Err(())
            }
        }
    }

    /// The receive WR of a message: UC has no RNR, without one the message
    /// is dropped (rxe: class D, `drop_msg`). `None`: not there.
    fn message_recv(&mut self) -> Option<RecvTarget> {
        match self.take_recv() {
            Ok(Some(r)) => Some(r),
            Ok(None) => {
                self.drop_message();
                None
            }
            Err(()) => None,
        }
    }

    /// Returns whether the packet was accepted (the expected PSN moves on).
    fn exec_send(&mut self, pkt: &ParsedPacket<'_>) -> bool {
        let starts = pkt.info.position.starts_message();
        if planted!(starts, UcMiddleWithoutFirst => starts || self.svc.resp.cur.is_none()) {
            let Some(recv) = self.message_recv() else {
                return false;
            };
            self.svc.resp.cur = Some(Inbound::Send { recv, written: 0 });
        }
        match Inbound::send_packet(&mut self.svc.resp.cur, pkt) {
            Ok(None) => {}
            Ok(Some((recv, written))) => {
                let wc = self.received(recv.wr_id, WcOpcode::Recv, written, pkt.imm());
                self.complete(false, wc, pkt.bth.se);
            }
            Err(e @ RespError::LengthError) => {
                // The message does not fit the receive WR. rxe (UC, own
                // RQ) treats this as class D: drops the message silently
                // and keeps the WR; with an SRQ as class E: completes the
                // WR with REM_INV_REQ_ERR. Neither moves the QP to ERR. We
                // keep the QP running as rxe does, but consume the WR and
                // complete it with LOC_LEN_ERR, the status IBA and verbs
                // define for a receive buffer too small (the table's
                // receive status of a length error), so that the
                // application learns of the loss.
                let recv = self.svc.resp.cur.take().and_then(Inbound::into_recv);
                self.svc.resp.dropping = true;
                Counters::inc(&self.core.cfg.counters.uc_dropped_msgs);
                if let Some(r) = recv {
                    let cause = Cause::UcSendTooLong {
                        name: pkt.info.name,
                        psn: pkt.bth.psn.value(),
                        wr_id: r.wr_id,
                        cap: r.sgl.total(),
                    };
                    self.explain(Some(e.recv_status()), Side::Responder, cause);
                    self.core.err_cause = None;
                    self.complete_recv(r.wr_id, e.recv_status());
                }
                return false;
            }
            Err(RespError::RemoteOperational) => {
                // Memory deregistered under the WR: class A.
                if let Some(r) = self.svc.resp.cur.take().and_then(Inbound::into_recv) {
                    self.recv_local_error(r.wr_id, WcStatus::LocProtErr);
                }
                return false;
            }
            Err(_) => return false,
        }
        true
    }

    /// Returns whether the packet was accepted.
    fn exec_write(&mut self, pkt: &ParsedPacket<'_>) -> bool {
        let ends = pkt.info.position.ends_message();
        // Op validity: the QP must allow remote writes (the same step as
        // RC's; for UC the policy drops the message).
        if pkt.info.position.starts_message() {
            if let Err(e) = check_op_allowed(pkt.info.operation, self.core.attr.qp_access_flags) {
                self.responder_error(e.err);
                return false;
            }
        }
        // The RETH and the R_Key (a zero-length WRITE needs no valid key),
        // the length: a violation drops the message silently (rxe: UC
        // class D/E, no NAK).
        if let Err(e) = Inbound::write_packet(&mut self.svc.resp.cur, &self.core.cfg, pkt) {
            self.responder_error(e.err);
            return false;
        }
        // WRITE with immediate consumes a receive WR at its last packet;
        // taken before memory is touched so that, without one, the last
        // packet changes nothing (rxe check_resource precedes execute).
        let recv = if ends && pkt.imm().is_some() {
            let Some(r) = self.message_recv() else {
                return false;
            };
            Some(r)
        } else {
            None
        };
        match Inbound::place_write(&mut self.svc.resp.cur, pkt) {
            Ok(None) => {}
            Ok(Some(total)) => {
                if let Some(r) = recv {
                    let imm = Some(pkt.imm().unwrap_or(0));
                    let wc = self.received(r.wr_id, WcOpcode::RecvRdmaWithImm, total, imm);
                    self.complete(false, wc, pkt.bth.se);
                }
            }
            Err(e) => {
                // The region went away mid-message: as an R_Key violation.
                if let (Some(r), ErrorAction::DropMessage { srq_status }) =
                    (recv, e.action(QpType::Uc))
                {
                    self.give_back(r, srq_status);
                }
                self.responder_error(e);
                return false;
            }
        }
        true
    }

    /// Drops the message this packet belongs to (and the one in progress,
    /// if any): counted once, then nothing is accepted until the next
    /// FIRST or ONLY.
    fn drop_message(&mut self) {
        self.responder_error(RespError::InvalidRequest);
    }

    /// A failed check, as the one policy table says for UC
    /// ([`RespError::action`]): the message is dropped (counted) and
    /// reception resumes at the next FIRST or ONLY packet. A SEND's
    /// receive WR does not complete and serves the next message (rxe
    /// do_class_d1e_error resets the WQE); a WR taken from an SRQ cannot
    /// go back: it completes with the table's SRQ status (class E, as
    /// rxe).
    fn responder_error(&mut self, err: RespError) {
        let ErrorAction::DropMessage { srq_status } = err.action(QpType::Uc) else {
            return;
        };
        Counters::inc(&self.core.cfg.counters.uc_dropped_msgs);
        if let Some(recv) = self.svc.resp.cur.take().and_then(Inbound::into_recv) {
            self.give_back(recv, srq_status);
        }
        self.svc.resp.dropping = true;
    }

    /// Ends the message in progress unfinished (a FIRST or ONLY packet
    /// while one is open): dropped as an invalid request, and the new
    /// packet may start a valid message.
    fn abort_current(&mut self) {
        if self.svc.resp.cur.is_some() {
            self.responder_error(RespError::InvalidRequest);
            self.svc.resp.dropping = false;
        }
    }

    /// A receive WR taken for a message that was then dropped: kept for the
    /// next message (class D1), or, taken from an SRQ, completed with
    /// `srq_status` (class E).
    fn give_back(&mut self, recv: RecvTarget, srq_status: WcStatus) {
        if self.core.cfg.rq.is_srq() {
            let cause = Cause::UcSrqDropped { wr_id: recv.wr_id };
            self.explain(Some(srq_status), Side::Responder, cause);
            self.core.err_cause = None;
            self.complete_recv(recv.wr_id, srq_status);
        } else {
            self.svc.resp.held = Some(recv);
        }
    }
}

/// The UC opcode of packet `pos` of a WR (from the opcode table), or
/// `None` for operations UC does not have.
fn request_opcode(op: WrOpcode, pos: Position) -> Option<Opcode> {
    op.request_opcode(Transport::Uc, pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_by_position() {
        // (Positions themselves: `message::tests`.)
        assert_eq!(
            request_opcode(WrOpcode::RdmaWriteWithImm, Position::Only),
            Some(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        );
        assert_eq!(
            request_opcode(WrOpcode::SendWithImm, Position::Middle),
            Some(Opcode::UC_SEND_MIDDLE)
        );
        for op in [
            WrOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp,
            WrOpcode::AtomicFetchAndAdd,
            WrOpcode::SendWithInv,
            WrOpcode::LocalInv,
            WrOpcode::BindMw,
        ] {
            assert_eq!(request_opcode(op, Position::Only), None, "{op:?}");
        }
        for pos in [
            Position::First,
            Position::Middle,
            Position::Last,
            Position::Only,
        ] {
            for op in [
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
            ] {
                let info = request_opcode(op, pos).and_then(|o| o.info()).unwrap();
                assert_eq!((info.transport, info.position), (Transport::Uc, pos));
            }
        }
    }
}
