//! The responder (IBA 9.7.5.1, 9.9.3), as a pipeline named after the
//! spec's checks: PSN, op sequence, op validity, resources, length, R_Key;
//! execute; acknowledge.

use super::{npkts, RcQp, ATOMIC_REPLAY_DEPTH};
use crate::counters::Counters;
use crate::events::EventType;
use crate::memory::{MemError, MrInner};
use crate::transport::sgl::Resolved;
use crate::transport::status::RespError;
use crate::transport::Nanos;
use crate::types::{Access, QpState, Wc, WcFlags, WcOpcode, WcStatus};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uroce_wire::aeth::{AethSyndrome, NakCode, CREDITS_INVALID};
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::psn::PsnClass;
use uroce_wire::{AethRepr, AtomicAckEthRepr, Opcode, Operation, Position, Psn};

/// A message being received across several packets.
#[derive(Debug)]
enum Current {
    Send {
        wr_id: u64,
        sgl: Resolved,
        written: u64,
    },
    Write {
        mr: Option<Arc<MrInner>>,
        offset: usize,
        total: u64,
        written: u64,
    },
}

/// Something the responder has to send, kept in PSN order.
#[derive(Debug)]
pub(super) enum RespItem {
    Ack {
        psn: Psn,
        syndrome: AethSyndrome,
        msn: u32,
    },
    Read {
        psn: Psn,
        mr: Option<Arc<MrInner>>,
        offset: usize,
        len: u64,
        sent: u32,
        npkts: u32,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
}

#[derive(Debug, Default)]
pub(super) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number: messages completed.
    pub msn: u32,
    cur: Option<Current>,
    out: VecDeque<RespItem>,
    /// A sequence-error NAK was sent for the current gap.
    nak_sent: bool,
    /// Recent atomic results by request PSN.
    atomics: VecDeque<(Psn, u64)>,
    /// Requests that arrived while READ responses were still being sent:
    /// executed after them, so that a READ never sees a later WRITE or
    /// atomic (the responder executes in order, as rxe does).
    deferred: VecDeque<Vec<u8>>,
    /// Buffers of executed deferred requests, reused (no allocation per
    /// packet once warm).
    spare: Vec<Vec<u8>>,
}

impl Responder {
    pub fn reset_psn(&mut self, psn: Psn) {
        self.epsn = psn;
    }
    /// READ responses still to be sent.
    fn reads_pending(&self) -> bool {
        self.out.iter().any(|i| matches!(i, RespItem::Read { .. }))
    }
    /// Drops the message in progress; returns its receive WR, if any.
    pub fn abort_current(&mut self) -> Option<u64> {
        match self.cur.take() {
            Some(Current::Send { wr_id, .. }) => Some(wr_id),
            _ => None,
        }
    }
    /// Drops pending READ responses and atomic ACKs (QP in error), keeping
    /// ACKs and NAKs so the peer still learns what happened.
    pub fn drop_reads(&mut self) {
        self.out.retain(|i| matches!(i, RespItem::Ack { .. }));
        self.deferred.clear();
    }
    fn push_ack(&mut self, psn: Psn, syndrome: AethSyndrome, msn: u32) {
        // Coalesce: a newer positive ACK replaces an older one at the tail.
        if let (
            AethSyndrome::Ack { .. },
            Some(RespItem::Ack {
                syndrome: AethSyndrome::Ack { .. },
                ..
            }),
        ) = (syndrome, self.out.back())
        {
            self.out.pop_back();
        }
        self.out.push_back(RespItem::Ack { psn, syndrome, msn });
    }
}

const ACK: AethSyndrome = AethSyndrome::Ack {
    credits: CREDITS_INVALID,
};
/// Requests held back behind READ responses at most (more are dropped and
/// resent by the requester).
const MAX_DEFERRED: usize = 1024;

impl RcQp {
    pub(super) fn handle_request(&mut self, _now: Nanos, pkt: &ParsedPacket<'_>) {
        if !matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            Counters::inc(&self.cfg.counters.dropped_pkts);
            return;
        }
        let psn = pkt.bth.psn;
        let duplicate = psn.classify(self.resp.epsn) == PsnClass::Duplicate;
        // New requests wait behind READ responses; duplicates change no
        // memory and are answered at once.
        if !duplicate && (self.resp.reads_pending() || !self.resp.deferred.is_empty()) {
            if self.resp.deferred.len() < MAX_DEFERRED {
                let mut b = self.resp.spare.pop().unwrap_or_default();
                b.clear();
                b.extend_from_slice(pkt.bytes);
                self.resp.deferred.push_back(b);
            } else {
                Counters::inc(&self.cfg.counters.dropped_pkts);
            }
            return;
        }
        match psn.classify(self.resp.epsn) {
            PsnClass::Ahead => {
                // One NAK per gap (C9-... "PSN sequence error").
                if !self.resp.nak_sent {
                    self.resp.nak_sent = true;
                    Counters::inc(&self.cfg.counters.seq_naks_sent);
                    let (e, m) = (self.resp.epsn, self.resp.msn);
                    self.resp
                        .push_ack(e, AethSyndrome::Nak(NakCode::PsnSequenceError), m);
                }
            }
            PsnClass::Duplicate => self.duplicate(pkt),
            PsnClass::Expected => {
                self.resp.nak_sent = false;
                if let Err(err) = self.execute(pkt) {
                    self.responder_error(err);
                }
            }
        }
    }

    /// Checks and executes the expected request.
    fn execute(&mut self, pkt: &ParsedPacket<'_>) -> Result<(), RespError> {
        let info = pkt.info;
        let psn = pkt.bth.psn;
        let mtu = self.mtu() as usize;
        // Op sequence (C9-...): a message in progress continues with a
        // MIDDLE or LAST of the same operation; otherwise FIRST or ONLY.
        let in_seq = match (&self.resp.cur, info.operation) {
            (Some(Current::Send { .. }), Operation::Send)
            | (Some(Current::Write { .. }), Operation::RdmaWrite) => {
                !info.position.starts_message()
            }
            (None, _) => info.position.starts_message(),
            _ => false,
        };
        if !in_seq {
            return Err(RespError::InvalidRequest);
        }
        // Op validity against the QP's access flags.
        let qp_access = self.attr.qp_access_flags;
        let need = match info.operation {
            Operation::RdmaWrite => Access::REMOTE_WRITE,
            Operation::RdmaReadRequest => Access::REMOTE_READ,
            Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
            _ => Access::empty(),
        };
        if !qp_access.contains(need) {
            return Err(RespError::InvalidRequest);
        }
        // Length of a payload-carrying packet.
        let plen = pkt.payload.len();
        if info.has_payload {
            let ok = match info.position {
                Position::First | Position::Middle => plen == mtu,
                Position::Last => plen >= 1 && plen <= mtu,
                Position::Only => plen <= mtu,
            };
            if !ok {
                return Err(RespError::InvalidRequest);
            }
        }
        match info.operation {
            Operation::Send => self.exec_send(pkt)?,
            Operation::RdmaWrite => {
                if !self.exec_write(pkt)? {
                    return Ok(()); // RNR: nothing consumed
                }
            }
            Operation::RdmaReadRequest => {
                let reth = pkt.reth().ok_or(RespError::InvalidRequest)?;
                let len = reth.dma_len as u64;
                let (mr, offset) = self.check_rkey(reth.rkey, reth.va, len, Access::REMOTE_READ)?;
                let n = npkts(len, self.mtu());
                self.resp.msn = self.resp.msn.wrapping_add(1);
                let msn = self.resp.msn;
                self.resp.out.push_back(RespItem::Read {
                    psn,
                    mr,
                    offset,
                    len,
                    sent: 0,
                    npkts: n,
                    msn,
                });
                self.resp.epsn = psn.add(n);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let a = pkt.atomic_eth().ok_or(RespError::InvalidRequest)?;
                if a.va % 8 != 0 {
                    return Err(RespError::InvalidRequest);
                }
                let (mr, offset) = self.check_rkey(a.rkey, a.va, 8, Access::REMOTE_ATOMIC)?;
                let mr = mr.ok_or(RespError::RemoteAccess)?;
                let orig = mr
                    .with_atomic_u64(offset, |word| {
                        if info.operation == Operation::CompareSwap {
                            match word.compare_exchange(
                                a.compare,
                                a.swap_add,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            ) {
                                Ok(v) | Err(v) => v,
                            }
                        } else {
                            word.fetch_add(a.swap_add, Ordering::SeqCst)
                        }
                    })
                    .map_err(|_| RespError::RemoteAccess)?;
                if self.resp.atomics.len() == ATOMIC_REPLAY_DEPTH {
                    self.resp.atomics.pop_front();
                }
                self.resp.atomics.push_back((psn, orig));
                self.resp.msn = self.resp.msn.wrapping_add(1);
                let msn = self.resp.msn;
                self.resp
                    .out
                    .push_back(RespItem::AtomicAck { psn, orig, msn });
                self.resp.epsn = psn.next();
                return Ok(());
            }
            _ => return Err(RespError::InvalidRequest),
        }
        self.resp.epsn = psn.next();
        if pkt.bth.ack_req {
            let m = self.resp.msn;
            self.resp.push_ack(psn, ACK, m);
        }
        Ok(())
    }

    /// R_Key check (C9-...): a zero-length access needs no valid key.
    fn check_rkey(
        &self,
        rkey: u32,
        va: u64,
        len: u64,
        need: Access,
    ) -> Result<(Option<Arc<MrInner>>, usize), RespError> {
        if len == 0 {
            return Ok((None, 0));
        }
        self.cfg
            .keys
            .check_rkey(rkey, self.cfg.pd, va, len, need)
            .map(|(mr, off)| (Some(mr), off))
            .map_err(|_| RespError::RemoteAccess)
    }

    fn exec_send(&mut self, pkt: &ParsedPacket<'_>) -> Result<(), RespError> {
        let info = pkt.info;
        if info.position.starts_message() {
            let Some(wr) = self.cfg.rq.take() else {
                self.rnr_nak(pkt.bth.psn);
                return Err(RespError::Rnr);
            };
            match Resolved::resolve(
                &self.cfg.keys,
                self.cfg.pd,
                &wr.sg_list,
                Access::LOCAL_WRITE,
            ) {
                Ok(sgl) => {
                    self.resp.cur = Some(Current::Send {
                        wr_id: wr.wr_id,
                        sgl,
                        written: 0,
                    })
                }
                Err(_) => {
                    self.complete_recv_error(wr.wr_id, WcStatus::LocProtErr);
                    return Err(RespError::RemoteOperational);
                }
            }
        }
        let Some(Current::Send { sgl, written, .. }) = &mut self.resp.cur else {
            return Err(RespError::InvalidRequest);
        };
        match sgl.scatter(*written, pkt.payload) {
            Ok(()) => {}
            // The message is longer than the receive WR's buffers.
            Err(MemError::OutOfBounds { .. }) => return Err(RespError::LengthError),
            // A buffer was deregistered under the WR: the WR's own fault
            // (local protection error, NAK remote operational error).
            Err(_) => return Err(RespError::RemoteOperational),
        }
        *written += pkt.payload.len() as u64;
        if info.position.ends_message() {
            let Some(Current::Send { wr_id, written, .. }) = self.resp.cur.take() else {
                return Err(RespError::InvalidRequest);
            };
            let mut wc = Wc::received(
                wr_id,
                WcOpcode::Recv,
                self.cfg.qpn,
                written as u32,
                self.attr.dest_qp_num,
                pkt.imm(),
            );
            if let Some(rkey) = pkt.ieth() {
                // SEND with invalidate: the named region in our PD stops
                // being usable at once.
                match self.cfg.keys.find_rkey(rkey) {
                    Some(mr) if mr.pd() == self.cfg.pd => self.cfg.keys.deregister(&mr),
                    _ => {
                        self.resp.cur = Some(Current::Send {
                            wr_id,
                            sgl: Resolved::default(),
                            written,
                        });
                        return Err(RespError::InvalidRequest);
                    }
                }
                wc.invalidated_rkey = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
            self.resp.msn = self.resp.msn.wrapping_add(1);
            self.complete_notify(false, wc, pkt.bth.se);
        }
        Ok(())
    }

    /// Returns false when the packet was RNR-NAKed (not executed).
    fn exec_write(&mut self, pkt: &ParsedPacket<'_>) -> Result<bool, RespError> {
        let info = pkt.info;
        if info.position.starts_message() {
            let reth = pkt.reth().ok_or(RespError::InvalidRequest)?;
            let total = reth.dma_len as u64;
            let (mr, offset) = self.check_rkey(reth.rkey, reth.va, total, Access::REMOTE_WRITE)?;
            self.resp.cur = Some(Current::Write {
                mr,
                offset,
                total,
                written: 0,
            });
        }
        let ends = info.position.ends_message();
        let Some(Current::Write {
            mr,
            offset,
            total,
            written,
        }) = &self.resp.cur
        else {
            return Err(RespError::InvalidRequest);
        };
        let plen = pkt.payload.len() as u64;
        if written + plen > *total || (ends && written + plen != *total) {
            return Err(RespError::InvalidRequest);
        }
        // WRITE with immediate consumes a receive WR; check before touching
        // memory so that an RNR leaves nothing done.
        let recv = if ends && pkt.imm().is_some() {
            match self.cfg.rq.take() {
                Some(wr) => Some(wr),
                None => {
                    self.rnr_nak(pkt.bth.psn);
                    return Ok(false);
                }
            }
        } else {
            None
        };
        if plen > 0 {
            let mr = mr.as_ref().ok_or(RespError::RemoteAccess)?;
            mr.write(offset + *written as usize, pkt.payload)
                .map_err(|_| RespError::RemoteAccess)?;
        }
        let total = *total;
        if let Some(Current::Write { written, .. }) = &mut self.resp.cur {
            *written += plen;
        }
        if ends {
            self.resp.cur = None;
            self.resp.msn = self.resp.msn.wrapping_add(1);
            if let Some(wr) = recv {
                let wc = Wc::received(
                    wr.wr_id,
                    WcOpcode::RecvRdmaWithImm,
                    self.cfg.qpn,
                    total as u32,
                    self.attr.dest_qp_num,
                    Some(pkt.imm().unwrap_or(0)),
                );
                self.complete_notify(false, wc, pkt.bth.se);
            }
        }
        Ok(true)
    }

    fn rnr_nak(&mut self, psn: Psn) {
        Counters::inc(&self.cfg.counters.rnr_naks_sent);
        let m = self.resp.msn;
        let timer = self.attr.min_rnr_timer;
        self.resp.push_ack(psn, AethSyndrome::RnrNak { timer }, m);
    }

    /// A duplicate request (IBA 9.7.5.1.1.x): SEND/WRITE are acknowledged
    /// again without executing; READ is answered again; atomics are answered
    /// from the replay cache and never executed twice.
    fn duplicate(&mut self, pkt: &ParsedPacket<'_>) {
        Counters::inc(&self.cfg.counters.duplicate_requests);
        let psn = pkt.bth.psn;
        let msn = self.resp.msn;
        match pkt.info.operation {
            Operation::Send | Operation::RdmaWrite => {
                let last = self.resp.epsn.sub(1);
                self.resp.push_ack(last, ACK, msn);
            }
            Operation::RdmaReadRequest => {
                let Some(reth) = pkt.reth() else { return };
                let len = reth.dma_len as u64;
                match self.check_rkey(reth.rkey, reth.va, len, Access::REMOTE_READ) {
                    Ok((mr, offset)) => {
                        let n = npkts(len, self.mtu());
                        // The requester asks again: responses still queued
                        // for any of the same PSNs are superseded.
                        self.resp.out.retain(|i| match i {
                            RespItem::Read {
                                psn: p, npkts: m, ..
                            } => psn.distance_from(*p) >= *m && p.distance_from(psn) >= n,
                            _ => true,
                        });
                        self.resp.out.push_back(RespItem::Read {
                            psn,
                            mr,
                            offset,
                            len,
                            sent: 0,
                            npkts: n,
                            msn,
                        });
                    }
                    Err(_) => Counters::inc(&self.cfg.counters.dropped_pkts),
                }
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                match self.resp.atomics.iter().find(|(p, _)| *p == psn) {
                    Some(&(_, orig)) => {
                        self.resp
                            .out
                            .push_back(RespItem::AtomicAck { psn, orig, msn })
                    }
                    None => Counters::inc(&self.cfg.counters.dropped_pkts),
                }
            }
            _ => Counters::inc(&self.cfg.counters.dropped_pkts),
        }
    }

    /// A failed check: NAK, complete the receive WR in progress with the
    /// matching status, QP to ERR (IBA 9.9.3: responder class B/C/D errors).
    fn responder_error(&mut self, err: RespError) {
        if err == RespError::Rnr {
            return;
        }
        Counters::inc(&self.cfg.counters.err_naks_sent);
        // IBA 11.6.3.1: affiliated asynchronous errors of the responder.
        self.cfg.event(match err {
            RespError::RemoteAccess => EventType::QpAccessErr,
            _ => EventType::QpReqErr,
        });
        let (psn, msn) = (self.resp.epsn, self.resp.msn);
        self.resp.push_ack(psn, AethSyndrome::Nak(err.nak()), msn);
        if let Some(wr_id) = self.resp.abort_current() {
            self.complete_recv_error(wr_id, err.recv_status());
        }
        self.enter_error();
    }

    fn complete_recv_error(&mut self, wr_id: u64, status: WcStatus) {
        let wc = Wc::new(wr_id, status, WcOpcode::Recv, self.cfg.qpn);
        self.complete(false, wc);
    }

    /// Executes requests held back behind READ responses, once those are
    /// all sent (until another READ holds the rest back).
    pub(super) fn run_deferred(&mut self, now: Nanos) {
        while !self.resp.reads_pending() {
            let Some(bytes) = self.resp.deferred.pop_front() else {
                break;
            };
            if let Ok(pkt) = uroce_wire::packet::parse(&bytes) {
                // Already checked (ICRC, peer, P_Key) when it arrived.
                let rest = std::mem::take(&mut self.resp.deferred);
                self.handle_request(now, &pkt);
                // handle_request deferred nothing: no READ was pending.
                self.resp.deferred = rest;
            }
            if self.resp.spare.len() < MAX_DEFERRED {
                self.resp.spare.push(bytes);
            }
        }
    }

    /// The region a READ is answered from was deregistered while its
    /// responses were going out: the response at `psn` becomes a NAK
    /// (remote access error), as for an R_Key violation found at that
    /// point (rxe's read_reply does the same), and the QP goes to ERR.
    fn read_source_lost(&mut self, psn: Psn, popped: bool) {
        if !popped {
            self.resp.out.pop_front();
        }
        Counters::inc(&self.cfg.counters.err_naks_sent);
        self.cfg.event(EventType::QpAccessErr);
        let msn = self.resp.msn;
        self.resp.out.push_front(RespItem::Ack {
            psn,
            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
            msn,
        });
        self.enter_error();
    }

    /// Produces the next response packet (ACK/NAK, READ response, atomic
    /// ACK), in PSN order.
    pub(super) fn transmit_response(&mut self, buf: &mut [u8]) -> Option<usize> {
        let mtu = self.mtu() as u64;
        let dqp = self.attr.dest_qp_num;
        let item = self.resp.out.front_mut()?;
        let (h, payload, done) = match item {
            RespItem::Ack { psn, syndrome, msn } => {
                let mut h = Headers::new(super::bth(dqp, Opcode::RC_ACKNOWLEDGE, *psn));
                h.aeth = Some(AethRepr {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                (h, None, true)
            }
            RespItem::AtomicAck { psn, orig, msn } => {
                let mut h = Headers::new(super::bth(dqp, Opcode::RC_ATOMIC_ACKNOWLEDGE, *psn));
                h.aeth = Some(AethRepr {
                    syndrome: ACK,
                    msn: *msn,
                });
                h.atomic_ack = Some(AtomicAckEthRepr { orig: *orig });
                (h, None, true)
            }
            RespItem::Read {
                psn,
                mr,
                offset,
                len,
                sent,
                npkts,
                msn,
            } => {
                let k = *sent;
                let opcode = match super::position(k, *npkts) {
                    Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let mut h = Headers::new(super::bth(dqp, opcode, psn.add(k)));
                if opcode != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    h.aeth = Some(AethRepr {
                        syndrome: ACK,
                        msn: *msn,
                    });
                }
                let off = k as u64 * mtu;
                let plen = (*len - off.min(*len)).min(mtu) as usize;
                *sent += 1;
                let done = *sent == *npkts;
                (h, Some((mr.clone(), *offset + off as usize, plen)), done)
            }
        };
        if done {
            self.resp.out.pop_front();
        }
        let plen = payload.as_ref().map_or(0, |p| p.2);
        let res = self.emit(&h, plen, buf, |dst| match &payload {
            Some((Some(mr), off, _)) => mr.read(*off, dst).is_ok(),
            Some((None, _, n)) => *n == 0,
            None => true,
        });
        if res.is_none() && payload.is_some() {
            self.read_source_lost(h.bth.psn, done);
            return self.transmit_response(buf);
        }
        res
    }
}
