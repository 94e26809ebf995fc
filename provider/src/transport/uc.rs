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

use super::sgl::Resolved;
use super::status::{ErrorAction, RespError};
use super::{Nanos, QpConfig, QpMachine, RxMeta, Transmit};
use crate::counters::Counters;
use crate::events::EventType;
use crate::memory::MrInner;
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
use crate::transport::rc::{check_op_allowed, check_payload_length};
use crate::transport::rc::{npkts, position, MAX_MSG_SIZE, PKEY};
use crate::transport::QpCore;
use crate::transport::SweepDetector;
use crate::types::{Access, QpState, QpType, SendFlags, SendWr, Wc, WcOpcode, WcStatus, WrOpcode};
use std::sync::Arc;
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::{BthRepr, Opcode, Operation, Position, Psn, RethRepr, Transport};

/// A UC QP.
#[derive(Debug)]
pub struct UcQp {
    core: QpCore,
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

/// A receive WR taken from the receive queue, its buffers resolved.
#[derive(Debug)]
struct TakenRecv {
    wr_id: u64,
    sgl: Resolved,
}

/// The message being received.
#[derive(Debug)]
enum Current {
    Send {
        recv: TakenRecv,
        written: u64,
    },
    Write {
        mr: Option<Arc<MrInner>>,
        offset: usize,
        total: u64,
        written: u64,
    },
}

#[derive(Debug, Default)]
struct Responder {
    /// Expected PSN.
    epsn: Psn,
    cur: Option<Current>,
    /// A message was dropped: packets are ignored until the next FIRST or
    /// ONLY (rxe's `drop_msg`).
    dropping: bool,
    /// The receive WR of a dropped SEND, kept for the next message that
    /// needs one (it is the oldest WR this QP holds).
    held: Option<TakenRecv>,
}

impl UcQp {
    /// A QP in the RESET state.
    pub fn new(cfg: QpConfig) -> UcQp {
        UcQp {
            core: QpCore::new(cfg),
            req: Requester::default(),
            resp: Responder::default(),
            sweep: SweepDetector::default(),
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
    /// The configuration.
    pub fn config(&self) -> &QpConfig {
        &self.core.cfg
    }
    /// Current attributes (as `ibv_query_qp` reports them).
    pub fn attr(&self) -> QpAttr {
        self.core
            .query(self.req.next_psn.value(), self.resp.epsn.value())
    }

    /// Applies a modify-QP call (checked against the spec's table for UC).
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        let to = self.core.begin_modify(QpType::Uc, attr, mask)?;
        if mask.contains(AttrMask::RQ_PSN) {
            self.resp.epsn = Psn::new(attr.rq_psn);
        }
        if mask.contains(AttrMask::SQ_PSN) {
            self.req.next_psn = Psn::new(attr.sq_psn);
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

    /// In SQD: once the WR being sent has gone out entirely, the send queue
    /// is drained (reported as SQ_DRAINED when asked for at RTS->SQD).
    fn check_drained(&mut self) {
        if self.core.state == QpState::Sqd && self.core.attr.sq_draining && self.req.cur.is_none() {
            self.core.attr.sq_draining = false;
            if self.core.attr.en_sqd_async_notify {
                self.core.cfg.event(EventType::SqDrained);
            }
        }
    }

    /// Takes one packet addressed to this QP (parsed and ICRC-checked).
    pub fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let c = &self.core.cfg.counters;
        let receiving = self.core.receiving() && pkt.info.is_request;
        if let Err(d) = self.core.pin.admit(
            receiving,
            self.core.attr.ah_attr.ip(),
            Transport::Uc,
            meta,
            pkt,
        ) {
            d.count(c);
            return;
        }
        Counters::inc(&c.rcvd_pkts);
        self.core.note_received();
        self.sweep
            .note(now, pkt.bth.psn, self.resp.epsn, &self.core.cfg);
        let epsn = self.resp.epsn;
        self.receive(pkt);
        if self.resp.epsn != epsn {
            self.core
                .pin
                .accepted(self.core.cfg.strict_source_port, meta);
        }
    }

    /// Writes the next packet to send into `buf` (at least path MTU + 128
    /// bytes), or returns `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        let len = match self.core.state {
            QpState::Err => {
                self.core.cfg.flush_posted();
                None
            }
            QpState::Sqe => {
                self.flush_sends();
                None
            }
            QpState::Rts => self.transmit_request(buf, true),
            QpState::Sqd => self.transmit_request(buf, false),
            _ => None,
        }?;
        Counters::inc(&self.core.cfg.counters.sent_pkts);
        Some(Transmit {
            dst: self.core.attr.ah_attr.ip(),
            len,
        })
    }

    fn mtu(&self) -> u32 {
        self.core.attr.path_mtu.bytes()
    }

    /// Adds a completion; a full CQ is a catastrophic error for the QP
    /// (IBA 11.4.2.1, QP_FATAL).
    fn complete(&mut self, send: bool, wc: Wc, solicited: bool) {
        if !self.core.cfg.complete(send, wc, solicited) {
            self.fatal();
        }
    }

    /// A completion was lost to a full CQ: QP_FATAL and ERR (once).
    fn fatal(&mut self) {
        if self.core.state != QpState::Err {
            self.core.cfg.event(EventType::QpFatal);
            self.enter_error();
        }
    }

    // ---------------------------------------------------------------
    // Requester
    // ---------------------------------------------------------------

    /// Checks a posted WR locally (opcode valid for UC, SGEs, length) and
    /// resolves its buffers: the data and the message length.
    fn admit(&self, wr: &SendWr) -> Result<(Resolved, u64), WcStatus> {
        // Local operations were executed before this.
        if !QpType::Uc.may_post(wr.opcode) {
            return Err(WcStatus::LocQpOpErr);
        }
        let (data, len) = self.core.cfg.send_buffers(wr)?;
        if len > MAX_MSG_SIZE {
            return Err(WcStatus::LocLenErr);
        }
        Ok((data, len))
    }

    /// Produces the next request packet. With `allow_new` false (SQD) only
    /// the WR already started goes on.
    fn transmit_request(&mut self, buf: &mut [u8], allow_new: bool) -> Option<usize> {
        if self.req.cur.is_none() {
            if !allow_new {
                return None;
            }
            let mut wr = self.core.cfg.sq.take()?;
            // Local operations (BIND_MW, LOCAL_INV) run when the queue
            // reaches them; UC completes each WR once sent, so in order.
            while wr.opcode.is_local() {
                if let Err(status) = self.core.cfg.execute_local(&wr) {
                    self.send_error(&wr, status);
                    return None;
                }
                self.core.cfg.sq.retire(1);
                if self.core.cfg.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED) {
                    let wc = Wc::new(
                        wr.wr_id,
                        WcStatus::Success,
                        wr.opcode.wc_opcode(),
                        self.core.cfg.qpn,
                    );
                    self.complete(true, wc, false);
                }
                self.check_drained();
                wr = self.core.cfg.sq.take()?;
            }
            match self.admit(&wr) {
                Ok((data, len)) => {
                    self.req.cur = Some(SendWqe {
                        wr,
                        data,
                        len,
                        npkts: npkts(len, self.mtu()),
                        sent: 0,
                    })
                }
                Err(status) => {
                    self.send_error(&wr, status);
                    return None;
                }
            }
        }
        let len = match self.build_request(buf) {
            Some(len) => len,
            None => {
                // The memory went away under us (deregistered): a local
                // protection error. What went out of the message is
                // dropped by the responder at our next FIRST/ONLY.
                let w = self.req.cur.take()?;
                self.send_error(&w.wr, WcStatus::LocProtErr);
                return None;
            }
        };
        self.req.next_psn = self.req.next_psn.next();
        let w = self.req.cur.as_mut()?;
        w.sent += 1;
        if w.sent == w.npkts {
            let w = self.req.cur.take()?;
            self.core.cfg.sq.retire(1);
            if self.core.cfg.sq_sig_all || w.wr.flags.contains(SendFlags::SIGNALED) {
                let mut wc = Wc::new(
                    w.wr.wr_id,
                    WcStatus::Success,
                    w.wr.opcode.wc_opcode(),
                    self.core.cfg.qpn,
                );
                wc.byte_len = w.len as u32;
                self.complete(true, wc, false);
            }
            self.check_drained();
        }
        Some(len)
    }

    /// Writes the next packet of the current WR into `buf`.
    fn build_request(&self, buf: &mut [u8]) -> Option<usize> {
        let w = self.req.cur.as_ref()?;
        let mtu = self.mtu() as u64;
        let k = w.sent;
        let pos = position(k, w.npkts);
        let opcode = request_opcode(w.wr.opcode, pos)?;
        let info = opcode.info()?;
        let mut h = Headers::new(BthRepr {
            opcode,
            pkey: PKEY,
            dest_qp: self.core.attr.dest_qp_num,
            psn: self.req.next_psn,
            ..BthRepr::default()
        });
        if info.has(uroce_wire::Ext::Reth) {
            h.reth = Some(RethRepr {
                va: w.wr.remote_addr,
                rkey: w.wr.rkey,
                dma_len: w.len as u32,
            });
        }
        if info.has_imm() {
            h.imm = Some(w.wr.imm_data);
        }
        h.bth.se = pos.ends_message() && w.wr.flags.contains(SendFlags::SOLICITED);
        let off = k as u64 * mtu;
        let plen = (w.len - off.min(w.len)).min(mtu) as usize;
        let inline = w.wr.flags.contains(SendFlags::INLINE);
        self.core
            .cfg
            .emit(self.core.attr.ah_attr.ip(), &h, plen, buf, |dst| {
                if inline {
                    let s = off as usize;
                    match w.wr.inline_data.get(s..s + dst.len()) {
                        Some(src) => {
                            dst.copy_from_slice(src);
                            true
                        }
                        None => false,
                    }
                } else {
                    w.data.gather(off, dst).is_ok()
                }
            })
    }

    /// A send WR failed locally: it completes with `status` and the QP
    /// moves to SQE (for UC, a send queue error does not stop the receive
    /// queue).
    fn send_error(&mut self, wr: &SendWr, status: WcStatus) {
        self.core.cfg.sq.retire(1);
        let wc = Wc::new(wr.wr_id, status, wr.opcode.wc_opcode(), self.core.cfg.qpn);
        self.core.set_state(QpState::Sqe);
        self.core.attr.sq_draining = false;
        self.complete(true, wc, false);
        if self.core.state == QpState::Sqe {
            self.flush_sends();
        }
    }

    /// WRs waiting in the send queue complete with WR_FLUSH_ERR (a full CQ
    /// is fatal, as for any completion).
    fn flush_sends(&mut self) {
        if !self.core.cfg.flush_sends() {
            self.fatal();
        }
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
        if psn != self.resp.epsn || self.resp.dropping {
            if !starts {
                if !self.resp.dropping {
                    self.drop_message();
                }
                return;
            }
            self.resp.dropping = false;
        }
        // Op sequence: a message in progress continues with a MIDDLE or
        // LAST of the same operation. A FIRST or ONLY while one is open
        // ends it unfinished (missing LAST, class D1): the open message is
        // dropped and the packet may start a valid new one.
        match (&self.resp.cur, info.operation, starts) {
            (None, _, true) => {}
            (Some(_), _, true) => {
                Counters::inc(&self.core.cfg.counters.bad_opcode_sequence);
                self.abort_current();
            }
            (Some(Current::Send { .. }), Operation::Send, false)
            | (Some(Current::Write { .. }), Operation::RdmaWrite, false) => {}
            _ => {
                Counters::inc(&self.core.cfg.counters.bad_opcode_sequence);
                self.drop_message();
                return;
            }
        }
        // Length of the packet: the same step as RC's.
        if let Err(e) = check_payload_length(pkt, self.mtu() as usize) {
            self.responder_error(e);
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
            self.resp.epsn = psn.next();
        }
    }

    /// Takes the receive WR a message consumes: the one held back from a
    /// dropped message, else the next posted one.
    fn take_recv(&mut self) -> Result<Option<TakenRecv>, ()> {
        if let Some(t) = self.resp.held.take() {
            return Ok(Some(t));
        }
        let Some(wr) = self.core.cfg.rq.take() else {
            return Ok(None);
        };
        match Resolved::resolve(
            &self.core.cfg.keys,
            self.core.cfg.pd,
            &wr.sg_list,
            Access::LOCAL_WRITE,
        ) {
            Ok(sgl) => Ok(Some(TakenRecv {
                wr_id: wr.wr_id,
                sgl,
            })),
            Err(_) => {
                // The receive WR's own buffers are bad: a local error of
                // the receive queue (class A), the QP goes to ERR.
                self.recv_local_error(wr.wr_id, WcStatus::LocProtErr);
                Err(())
            }
        }
    }

    /// Returns whether the packet was accepted (the expected PSN moves on).
    fn exec_send(&mut self, pkt: &ParsedPacket<'_>) -> bool {
        let pos = pkt.info.position;
        if pos.starts_message() {
            let recv = match self.take_recv() {
                Ok(Some(r)) => r,
                // UC has no RNR: without a receive WR the message is
                // dropped (rxe: class D, `drop_msg`).
                Ok(None) => {
                    self.drop_message();
                    return false;
                }
                Err(()) => return false,
            };
            self.resp.cur = Some(Current::Send { recv, written: 0 });
        }
        let Some(Current::Send { recv, written }) = &mut self.resp.cur else {
            return false;
        };
        let plen = pkt.payload.len() as u64;
        if *written + plen > recv.sgl.total() {
            // The message does not fit the receive WR. rxe (UC, own RQ)
            // treats this as class D: drops the message silently and keeps
            // the WR; with an SRQ as class E: completes the WR with
            // REM_INV_REQ_ERR. Neither moves the QP to ERR. We keep the QP
            // running as rxe does, but consume the WR and complete it with
            // LOC_LEN_ERR, the status IBA and verbs define for a receive
            // buffer too small, so that the application learns of the loss.
            let wr_id = recv.wr_id;
            self.resp.cur = None;
            self.resp.dropping = true;
            Counters::inc(&self.core.cfg.counters.uc_dropped_msgs);
            let wc = Wc::new(
                wr_id,
                WcStatus::LocLenErr,
                WcOpcode::Recv,
                self.core.cfg.qpn,
            );
            self.complete(false, wc, false);
            return false;
        }
        if recv.sgl.scatter(*written, pkt.payload).is_err() {
            // Memory deregistered under the WR: class A.
            let wr_id = recv.wr_id;
            self.resp.cur = None;
            self.recv_local_error(wr_id, WcStatus::LocProtErr);
            return false;
        }
        *written += plen;
        if pos.ends_message() {
            let Some(Current::Send { recv, written }) = self.resp.cur.take() else {
                return false;
            };
            let wc = Wc::received(
                recv.wr_id,
                WcOpcode::Recv,
                self.core.cfg.qpn,
                written as u32,
                self.core.attr.dest_qp_num,
                pkt.imm(),
            );
            self.complete(false, wc, pkt.bth.se);
        }
        true
    }

    /// Returns whether the packet was accepted.
    fn exec_write(&mut self, pkt: &ParsedPacket<'_>) -> bool {
        let pos = pkt.info.position;
        if pos.starts_message() {
            // Op validity: the QP must allow remote writes (the same
            // step as RC's; for UC the policy drops the message).
            if let Err(e) = check_op_allowed(pkt.info.operation, self.core.attr.qp_access_flags) {
                self.responder_error(e);
                return false;
            }
            let Some(reth) = pkt.reth() else {
                self.drop_message();
                return false;
            };
            let total = reth.dma_len as u64;
            // R_Key (a zero-length WRITE needs no valid key): a violation
            // drops the message silently (rxe: UC class D/E, no NAK).
            let target = if total == 0 {
                Ok((None, 0))
            } else {
                self.core
                    .cfg
                    .keys
                    .check_rkey(
                        reth.rkey,
                        self.core.cfg.pd,
                        self.core.cfg.qpn,
                        reth.va,
                        total,
                        Access::REMOTE_WRITE,
                    )
                    .map(|(mr, off)| (Some(mr), off))
            };
            let Ok((mr, offset)) = target else {
                self.drop_message();
                return false;
            };
            self.resp.cur = Some(Current::Write {
                mr,
                offset,
                total,
                written: 0,
            });
        }
        let ends = pos.ends_message();
        let Some(Current::Write {
            mr,
            offset,
            total,
            written,
        }) = &self.resp.cur
        else {
            return false;
        };
        let plen = pkt.payload.len() as u64;
        if *written + plen > *total || (ends && *written + plen != *total) {
            self.drop_message();
            return false;
        }
        let (mr, at, total) = (mr.clone(), *offset + *written as usize, *total);
        // WRITE with immediate consumes a receive WR at its last packet;
        // taken before memory is touched so that, without one, the last
        // packet changes nothing (rxe check_resource precedes execute).
        let recv = if ends && pkt.imm().is_some() {
            match self.take_recv() {
                Ok(Some(r)) => Some(r),
                Ok(None) => {
                    self.drop_message();
                    return false;
                }
                Err(()) => return false,
            }
        } else {
            None
        };
        if plen > 0 {
            let ok = mr
                .as_ref()
                .is_some_and(|mr| mr.is_valid() && mr.write(at, pkt.payload).is_ok());
            if !ok {
                // The region went away mid-message: as an R_Key violation.
                if let (Some(r), ErrorAction::DropMessage { srq_status }) =
                    (recv, RespError::RemoteAccess.action(QpType::Uc))
                {
                    self.give_back(r, srq_status);
                }
                self.responder_error(RespError::RemoteAccess);
                return false;
            }
        }
        if let Some(Current::Write { written, .. }) = &mut self.resp.cur {
            *written += plen;
        }
        if ends {
            self.resp.cur = None;
            if let Some(r) = recv {
                let wc = Wc::received(
                    r.wr_id,
                    WcOpcode::RecvRdmaWithImm,
                    self.core.cfg.qpn,
                    total as u32,
                    self.core.attr.dest_qp_num,
                    Some(pkt.imm().unwrap_or(0)),
                );
                self.complete(false, wc, pkt.bth.se);
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
        if let Some(Current::Send { recv, .. }) = self.resp.cur.take() {
            self.give_back(recv, srq_status);
        }
        self.resp.dropping = true;
    }

    /// Ends the message in progress unfinished (a FIRST or ONLY packet
    /// while one is open): dropped as an invalid request, and the new
    /// packet may start a valid message.
    fn abort_current(&mut self) {
        if self.resp.cur.is_some() {
            self.responder_error(RespError::InvalidRequest);
            self.resp.dropping = false;
        }
    }

    /// A receive WR taken for a message that was then dropped: kept for the
    /// next message (class D1), or, taken from an SRQ, completed with
    /// `srq_status` (class E).
    fn give_back(&mut self, recv: TakenRecv, srq_status: WcStatus) {
        if self.core.cfg.rq.is_srq() {
            let wc = Wc::new(recv.wr_id, srq_status, WcOpcode::Recv, self.core.cfg.qpn);
            self.complete(false, wc, false);
        } else {
            self.resp.held = Some(recv);
        }
    }

    /// A local error of the receive queue (class A): the WR completes with
    /// `status` and the QP goes to ERR.
    fn recv_local_error(&mut self, wr_id: u64, status: WcStatus) {
        let wc = Wc::new(wr_id, status, WcOpcode::Recv, self.core.cfg.qpn);
        self.complete(false, wc, false);
        if self.core.state != QpState::Err {
            self.enter_error();
        }
    }

    // ---------------------------------------------------------------
    // Error and reset
    // ---------------------------------------------------------------

    /// Moves to ERR: every outstanding WR completes with WR_FLUSH_ERR in
    /// posting order, receive WRs too (an SRQ's WRs stay in the SRQ, and
    /// LAST_WQE_REACHED tells the owner none will be taken for this QP).
    fn enter_error(&mut self) {
        self.core.set_state(QpState::Err);
        if let Some(w) = self.req.cur.take() {
            self.core.cfg.sq.retire(1);
            let wc = Wc::new(
                w.wr.wr_id,
                WcStatus::WrFlushErr,
                w.wr.opcode.wc_opcode(),
                self.core.cfg.qpn,
            );
            self.complete(true, wc, false);
        }
        let held = self.resp.held.take().map(|r| r.wr_id);
        let open = match self.resp.cur.take() {
            Some(Current::Send { recv, .. }) => Some(recv.wr_id),
            _ => None,
        };
        for wr_id in held.into_iter().chain(open) {
            let wc = Wc::new(
                wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                self.core.cfg.qpn,
            );
            self.complete(false, wc, false);
        }
        self.resp.dropping = false;
        self.core.cfg.flush_posted();
        self.core.cfg.report_last_wqe();
    }

    /// To RESET: everything is discarded without completions.
    fn reset(&mut self) {
        if self.req.cur.take().is_some() {
            self.core.cfg.sq.retire(1);
        }
        self.core.cfg.discard_posted();
        self.core.reset();
        self.req = Requester::default();
        self.resp = Responder::default();
    }
}

/// The UC opcode of packet `pos` of a WR (from the opcode table), or
/// `None` for operations UC does not have.
fn request_opcode(op: WrOpcode, pos: Position) -> Option<Opcode> {
    op.request_opcode(Transport::Uc, pos)
}

impl QpMachine for UcQp {
    fn qpn(&self) -> u32 {
        self.core.cfg.qpn
    }
    fn qp_type(&self) -> QpType {
        QpType::Uc
    }
    fn state(&self) -> QpState {
        self.core.state
    }
    fn attr(&self) -> QpAttr {
        UcQp::attr(self)
    }
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        UcQp::modify(self, attr, mask)
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        UcQp::handle_packet(self, now, meta, pkt)
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        UcQp::poll_transmit(self, now, buf)
    }
    /// UC never waits for anything.
    fn poll_timeout(&self) -> Option<Nanos> {
        None
    }
    fn handle_timeout(&mut self, _now: Nanos) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_by_position() {
        assert_eq!(position(0, 1), Position::Only);
        assert_eq!(position(0, 3), Position::First);
        assert_eq!(position(1, 3), Position::Middle);
        assert_eq!(position(2, 3), Position::Last);
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
