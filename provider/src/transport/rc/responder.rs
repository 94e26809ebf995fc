//! The responder (IBA 9.7.5.1, 9.9.3), as a pipeline named after the
//! spec's checks: PSN, op sequence, op validity, resources, length, R_Key;
//! execute; acknowledge.

use super::RcQp;
use crate::counters::Counters;
use crate::events::EventType;
use crate::memory::{KeyError, MemError, MrInner};
use crate::observe::cause::Side;
use crate::observe::cause::{Cause, Fault, Refused, RkeyFault, Then};
use crate::observe::{self, Event, Topic};
use crate::qp_attr::{AttrMask, QpAttr};
use crate::transport::core::bth;
use crate::transport::message::{check_op_allowed, check_payload_length, check_rkey};
use crate::transport::message::{npkts, position, segment, Inbound, RecvTarget, Target};
use crate::transport::sgl::Resolved;
use crate::transport::status::{ErrorAction, Refusal, RespError};
use crate::transport::{Drop, Nanos, SweepDetector, Transmit};
use crate::types::{Access, QpState, QpType, WcFlags, WcOpcode, WcStatus};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uroce_wire::aeth::{AethSyndrome, NakCode, CREDITS_INVALID};
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::psn::PsnClass;
use uroce_wire::{AethRepr, AtomicAckEthRepr, Opcode, Operation, Position, Psn};

/// An executed RDMA READ or atomic, kept so that a duplicate of it can be
/// answered again: one of the QP's responder resources (IBA ch. 9.7,
/// duplicate READs and atomics; their number is the QP's
/// `max_dest_rd_atomic`, the verbs' "responder resources"). Only a duplicate
/// that matches one of these is answered; the rest are dropped and
/// counted, so that a forged duplicate executes nothing and tells an
/// attacker nothing about keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RdAtomicRes {
    /// First PSN of the request.
    psn: Psn,
    /// PSNs it occupies (a READ: one per response packet).
    npkts: u32,
    /// The request as executed.
    kind: ResKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResKind {
    Read {
        va: u64,
        len: u64,
        rkey: u32,
    },
    Atomic {
        compare_swap: bool,
        va: u64,
        rkey: u32,
        compare: u64,
        swap_add: u64,
        /// The value before the atomic: the answer to a duplicate.
        orig: u64,
    },
    /// A FLUSH or ATOMIC WRITE: a duplicate is answered again with the
    /// empty READ RESPONSE ONLY, never executed again (rxe: the response
    /// is replayed; its requester resends them with a zeroed RETH, so
    /// only the PSN and the operation are compared).
    Ack {
        atomic_write: bool,
    },
}

impl RdAtomicRes {
    /// Whether a READ request at `psn` for `len` bytes at `va` with `rkey`
    /// (`n` PSNs) repeats this READ or the rest of it: the same R_Key, a
    /// range inside the original one (rxe's rule: a requester re-requests
    /// the remainder after the last response it placed), and PSNs inside
    /// the original ones.
    fn repeats_read(&self, psn: Psn, va: u64, len: u64, rkey: u32, n: u32) -> bool {
        let ResKind::Read {
            va: ova,
            len: olen,
            rkey: orkey,
        } = self.kind
        else {
            return false;
        };
        let k = psn.distance_from(self.psn);
        rkey == orkey
            && k < self.npkts
            && n <= self.npkts - k
            && va >= ova
            && va
                .checked_add(len)
                .is_some_and(|end| end <= ova.saturating_add(olen))
    }

    /// The original value to answer a duplicate atomic with, if `a` at
    /// `psn` is the same request as this one.
    fn repeats_atomic(
        &self,
        psn: Psn,
        compare_swap: bool,
        a: &uroce_wire::AtomicEthRepr,
    ) -> Option<u64> {
        match self.kind {
            ResKind::Atomic {
                compare_swap: cs,
                va,
                rkey,
                compare,
                swap_add,
                orig,
            } if psn == self.psn
                && cs == compare_swap
                && (va, rkey, swap_add) == (a.va, a.rkey, a.swap_add)
                && (!cs || compare == a.compare) =>
            {
                Some(orig)
            }
            _ => None,
        }
    }
}

/// Responder resources (IBA ch. 9.7, the QP's `max_dest_rd_atomic`): a QP
/// that offers none takes no READ or atomic. Else: invalid request.
fn check_responder_resources(op: Operation, max_dest_rd_atomic: u8) -> Result<(), Refusal> {
    let needs = matches!(
        op,
        Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd
            | Operation::AtomicWrite
    );
    if needs && max_dest_rd_atomic == 0 {
        Err(RespError::InvalidRequest.with(Refused::NoResources))
    } else {
        Ok(())
    }
}

/// Executes an atomic on the word at `offset` of `mr`: compare and swap
/// (`compare_swap`) or fetch and add; returns the word's value before it.
fn apply_atomic(
    mr: &MrInner,
    offset: usize,
    compare_swap: bool,
    a: &uroce_wire::AtomicEthRepr,
) -> Result<u64, crate::memory::MemError> {
    observe::tell(Topic::CHECK_BUFFER, || Event::NicWrote {
        mr,
        offset,
        len: 8,
    });
    mr.with_atomic_u64(offset, |word| {
        if compare_swap {
            match word.compare_exchange(a.compare, a.swap_add, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            }
        } else {
            word.fetch_add(a.swap_add, Ordering::SeqCst)
        }
    })
}

/// The access a FLUSH's placement type needs, of the QP and of the
/// region: global visibility FLUSH_GLOBAL, persistence FLUSH_PERSISTENT.
fn flush_access(placement: u8) -> Access {
    let mut a = Access::empty();
    if placement & uroce_wire::feth::FLUSH_GLOBAL != 0 {
        a |= Access::FLUSH_GLOBAL;
    }
    if placement & uroce_wire::feth::FLUSH_PERSISTENT != 0 {
        a |= Access::FLUSH_PERSISTENT;
    }
    a
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

impl RespItem {
    /// The (first) PSN the item answers.
    fn psn(&self) -> Psn {
        match self {
            RespItem::Ack { psn, .. }
            | RespItem::Read { psn, .. }
            | RespItem::AtomicAck { psn, .. } => *psn,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Responder {
    /// Expected PSN.
    pub epsn: Psn,
    /// Message sequence number: messages completed.
    pub msn: u32,
    cur: Option<Inbound>,
    out: VecDeque<RespItem>,
    /// A sequence-error NAK was sent for the current gap.
    nak_sent: bool,
    /// Responder resources: executed READs and atomics, oldest first, at
    /// most `max_dest_rd_atomic` (recycled oldest-first, as rxe does).
    res: VecDeque<RdAtomicRes>,
    /// Requests that arrived while READ responses were still being sent:
    /// executed after them, so that a READ never sees a later WRITE or
    /// atomic (the responder executes in order, as rxe does).
    deferred: VecDeque<Vec<u8>>,
    /// Buffers of executed deferred requests, reused (no allocation per
    /// packet once warm).
    spare: Vec<Vec<u8>>,
    /// Out-of-window request PSNs (a sweep).
    sweep: SweepDetector,
}

impl Responder {
    /// Takes a modify's expected PSN.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) {
        if mask.contains(AttrMask::RQ_PSN) {
            self.epsn = Psn::new(attr.rq_psn);
        }
    }
    /// Nothing but ACKs and NAKs to send, and no request waits to be
    /// executed.
    pub fn only_acks(&self) -> bool {
        self.deferred.is_empty() && self.out.iter().all(|i| matches!(i, RespItem::Ack { .. }))
    }
    /// READ responses still to be sent.
    fn reads_pending(&self) -> bool {
        self.out.iter().any(|i| matches!(i, RespItem::Read { .. }))
    }
    /// Drops the message in progress; returns its receive WR, if any.
    pub fn abort_current(&mut self) -> Option<u64> {
        Some(self.cur.take()?.into_recv()?.wr_id)
    }
    /// Drops pending READ responses and atomic ACKs (QP in error), keeping
    /// ACKs and NAKs so the peer still learns what happened.
    pub fn drop_reads(&mut self) {
        self.out.retain(|i| matches!(i, RespItem::Ack { .. }));
        self.deferred.clear();
    }
    /// Keeps an executed READ or atomic for duplicates, recycling the
    /// oldest resource when all `max` are in use.
    fn remember(&mut self, r: RdAtomicRes, max: u8) {
        while self.res.len() >= usize::from(max.max(1)) {
            self.res.pop_front();
        }
        self.res.push_back(r);
    }
    /// The resource a duplicate READ or atomic at `psn` repeats, if any.
    fn resource(&self, psn: Psn) -> Option<RdAtomicRes> {
        self.res
            .iter()
            .rev()
            .find(|r| psn.distance_from(r.psn) < r.npkts)
            .copied()
    }
    /// Queues the `n` response packets of a READ of `len` bytes at
    /// `offset` of `mr` (none for a zero-length READ), first PSN `psn`.
    fn queue_read(
        &mut self,
        psn: Psn,
        mr: Option<Arc<MrInner>>,
        offset: usize,
        len: u64,
        n: u32,
        msn: u32,
    ) {
        self.out.push_back(RespItem::Read {
            psn,
            mr,
            offset,
            len,
            sent: 0,
            npkts: n,
            msn,
        });
    }
    /// Queues `item`, the answer to a duplicate request, unless the same
    /// answer (of its kind, for its PSN) is queued already or the output
    /// queue is full.
    fn queue_again(&mut self, item: RespItem) {
        let same = |i: &RespItem| {
            std::mem::discriminant(i) == std::mem::discriminant(&item) && i.psn() == item.psn()
        };
        if !self.out.iter().any(same) && !self.out_full() {
            self.out.push_back(item);
        }
    }
    /// True when the output queue holds its maximum (a flood of requests
    /// that each want an answer cannot grow it).
    fn out_full(&self) -> bool {
        self.out.len() >= MAX_QUEUED_RESPONSES
    }
    /// Queues an ACK or NAK; returns false (nothing queued) when the
    /// output queue is full: the requester's timer recovers.
    fn push_ack(&mut self, psn: Psn, syndrome: AethSyndrome, msn: u32) -> bool {
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
        // An error NAK always goes (the QP then stops answering); ACKs,
        // RNR and sequence NAKs wait for room (the requester retries).
        let error_nak = matches!(syndrome, AethSyndrome::Nak(c) if c != NakCode::PsnSequenceError);
        if self.out_full() && !error_nak {
            return false;
        }
        self.out.push_back(RespItem::Ack { psn, syndrome, msn });
        true
    }
}

const ACK: AethSyndrome = AethSyndrome::Ack {
    credits: CREDITS_INVALID,
};
/// Requests held back behind READ responses at most (more are dropped and
/// resent by the requester). Above any requester's window (rxe keeps at
/// most 128 PSNs unacknowledged; uroce 64).
pub const MAX_DEFERRED: usize = 256;
/// Responses (ACKs, NAKs, READ response streams, atomic ACKs) queued at
/// most per QP.
pub const MAX_QUEUED_RESPONSES: usize = 256;

impl RcQp {
    pub(super) fn handle_request(&mut self, now: Nanos, pkt: &ParsedPacket<'_>) {
        let c = &self.core.cfg.counters;
        if !matches!(self.core.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            return Drop::BadState.count(c);
        }
        let psn = pkt.bth.psn;
        self.svc
            .resp
            .sweep
            .note(now, psn, self.svc.resp.epsn, &self.core.cfg);
        let class = planted!(
            psn.classify(self.svc.resp.epsn),
            DuplicateExecuted => match psn.classify(self.svc.resp.epsn) {
                PsnClass::Duplicate
                    if matches!(pkt.info.operation, Operation::Send | Operation::RdmaWrite) =>
                {
                    PsnClass::Expected
                }
                class => class,
            }
        );
        // New requests wait behind READ responses; duplicates change no
        // memory and are answered at once, unless requests already wait:
        // then the expected PSN is not yet what those leave, so whatever
        // comes next is classified after them, in arrival order (IBA
        // 9.7.5.1: each request is checked against the expected PSN its
        // predecessors left).
        if (class != PsnClass::Duplicate && self.svc.resp.reads_pending())
            || !self.svc.resp.deferred.is_empty()
        {
            if self.svc.resp.deferred.len() < MAX_DEFERRED {
                let mut b = self.svc.resp.spare.pop().unwrap_or_default();
                b.clear();
                b.extend_from_slice(pkt.bytes);
                self.svc.resp.deferred.push_back(b);
            } else {
                Drop::DeferredFull.count(c);
            }
            return;
        }
        match class {
            PsnClass::Ahead => self.sequence_error(),
            PsnClass::Duplicate => self.duplicate(pkt),
            PsnClass::Expected => {
                self.svc.resp.nak_sent = false;
                if let Err(r) = self.execute(pkt) {
                    if r.err != RespError::Rnr {
                        self.core.why = Some(self.refusal_cause(r, pkt));
                    }
                    let epsn = self.svc.resp.epsn;
                    self.responder_error(r.err, epsn);
                }
            }
        }
    }

    /// A request ahead of the expected PSN (IBA ch. 9.7: PSN sequence
    /// error): one NAK per gap, naming the expected PSN.
    fn sequence_error(&mut self) {
        if planted!(self.svc.resp.nak_sent, SeqNakEveryPacket => false) {
            return;
        }
        self.svc.resp.nak_sent = true;
        Counters::inc(&self.core.cfg.counters.seq_naks_sent);
        let (e, m) = (self.svc.resp.epsn, self.svc.resp.msn);
        self.queue_ack(e, AethSyndrome::Nak(NakCode::PsnSequenceError), m);
    }

    /// Queues an ACK or NAK, counting one the full queue refused.
    fn queue_ack(&mut self, psn: Psn, syndrome: AethSyndrome, msn: u32) {
        if !self.svc.resp.push_ack(psn, syndrome, msn) {
            Counters::inc(&self.core.cfg.counters.drop_response_queue_full);
        }
    }

    /// Checks and executes the expected request: the responder's checks in
    /// rxe's order, each a step named after the rule it enforces and
    /// returning the one [`RespError`] it detects (what an error then does
    /// is [`RespError::action`], one table for every transport) with what
    /// it found ([`Refusal`]: the explanation's facts); then execute.
    fn execute(&mut self, pkt: &ParsedPacket<'_>) -> Result<(), Refusal> {
        let info = pkt.info;
        let psn = pkt.bth.psn;
        self.check_op_sequence(pkt)?;
        check_op_allowed(info.operation, self.core.attr.qp_access_flags)?;
        check_responder_resources(info.operation, self.core.attr.max_dest_rd_atomic)?;
        check_payload_length(pkt, self.mtu() as usize)?;
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
                self.svc.resp.remember(
                    RdAtomicRes {
                        psn,
                        npkts: n,
                        kind: ResKind::Read {
                            va: reth.va,
                            len,
                            rkey: reth.rkey,
                        },
                    },
                    self.core.attr.max_dest_rd_atomic,
                );
                self.svc.resp.msn = planted!(
                    self.svc.resp.msn.wrapping_add(1),
                    MsnNotAdvancedOnRead => self.svc.resp.msn
                );
                let msn = self.svc.resp.msn;
                self.svc.resp.queue_read(psn, mr, offset, len, n, msn);
                self.svc.resp.epsn = psn.add(n);
                return Ok(());
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let a = pkt.atomic_eth().ok_or(RespError::InvalidRequest)?;
                if a.va % 8 != 0 {
                    return Err(RespError::InvalidRequest.with(Refused::Misaligned { va: a.va }));
                }
                let (mr, offset) = self.check_rkey(a.rkey, a.va, 8, Access::REMOTE_ATOMIC)?;
                let mr = mr.ok_or(RespError::RemoteAccess)?;
                let compare_swap = info.operation == Operation::CompareSwap;
                let orig = apply_atomic(&mr, offset, compare_swap, &a)
                    .map_err(|_| RespError::RemoteAccess)?;
                self.svc.resp.remember(
                    RdAtomicRes {
                        psn,
                        npkts: 1,
                        kind: ResKind::Atomic {
                            compare_swap,
                            va: a.va,
                            rkey: a.rkey,
                            compare: a.compare,
                            swap_add: a.swap_add,
                            orig,
                        },
                    },
                    self.core.attr.max_dest_rd_atomic,
                );
                self.svc.resp.msn = self.svc.resp.msn.wrapping_add(1);
                let msn = self.svc.resp.msn;
                self.svc
                    .resp
                    .out
                    .push_back(RespItem::AtomicAck { psn, orig, msn });
                self.svc.resp.epsn = psn.next();
                return Ok(());
            }
            Operation::AtomicWrite => {
                let reth = pkt.reth().ok_or(RespError::InvalidRequest)?;
                if reth.dma_len != 8 || pkt.payload.len() != 8 || reth.va % 8 != 0 {
                    return Err(RespError::InvalidRequest.into());
                }
                let (mr, offset) = self.check_rkey(reth.rkey, reth.va, 8, Access::REMOTE_WRITE)?;
                let mr = mr.ok_or(RespError::RemoteAccess)?;
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(pkt.payload);
                // One aligned 64-bit store: the bytes land as sent.
                observe::tell(Topic::CHECK_BUFFER, || Event::NicWrote {
                    mr: &mr,
                    offset,
                    len: 8,
                });
                mr.with_atomic_u64(offset, |w| {
                    w.store(u64::from_ne_bytes(bytes), Ordering::Release)
                })
                .map_err(|_| RespError::RemoteAccess)?;
                self.finish_ack_request(psn, true);
                return Ok(());
            }
            Operation::Flush => {
                let feth = pkt.feth().ok_or(RespError::InvalidRequest)?;
                let reth = pkt.reth().ok_or(RespError::InvalidRequest)?;
                let need = flush_access(feth.placement);
                if need.is_empty() || !self.core.attr.qp_access_flags.contains(need) {
                    return Err(RespError::InvalidRequest.into());
                }
                let cfg = &self.core.cfg;
                let range = (reth.rkey, reth.va, u64::from(reth.dma_len));
                // The R_Key is checked even for an empty range; the whole
                // region (selectivity MR) skips the range check.
                let refused = if feth.selectivity == uroce_wire::feth::FLUSH_MR {
                    match cfg.keys.find_rkey(reth.rkey) {
                        None => Some(KeyError::BadKey(reth.rkey)),
                        Some(m) if m.pd() != cfg.pd => Some(KeyError::PdMismatch),
                        Some(m) if !m.access().contains(need) => Some(KeyError::Access(need)),
                        Some(m) if !m.is_valid() => Some(KeyError::Mem(MemError::Invalid)),
                        Some(_) => None,
                    }
                } else {
                    let (rkey, va, len) = range;
                    cfg.keys
                        .check_rkey(rkey, cfg.pd, cfg.qpn, va, len, need)
                        .err()
                };
                if let Some(e) = refused {
                    let f = RkeyFault::found(&cfg.keys, cfg.pd, range, need, e);
                    return Err(RespError::RemoteAccess.with(Refused::Rkey(f)));
                }
                // Writes executed before it are visible to every observer
                // once it is answered: uroce's copies are done, in order,
                // by the time the FLUSH is reached; the fence orders them
                // for other threads too.
                std::sync::atomic::fence(Ordering::SeqCst);
                self.finish_ack_request(psn, false);
                return Ok(());
            }
            _ => return Err(RespError::InvalidRequest.into()),
        }
        self.svc.resp.epsn = psn.next();
        if pkt.bth.ack_req {
            let m = self.svc.resp.msn;
            let named = planted!(psn, AckUnexecutedPsn => psn.next());
            self.queue_ack(named, ACK, m);
        }
        Ok(())
    }

    /// A FLUSH or ATOMIC WRITE at `psn` was executed: kept for
    /// duplicates, and answered with an empty READ RESPONSE ONLY.
    fn finish_ack_request(&mut self, psn: Psn, atomic_write: bool) {
        self.svc.resp.remember(
            RdAtomicRes {
                psn,
                npkts: 1,
                kind: ResKind::Ack { atomic_write },
            },
            self.core.attr.max_dest_rd_atomic,
        );
        self.svc.resp.msn = self.svc.resp.msn.wrapping_add(1);
        let msn = self.svc.resp.msn;
        self.svc.resp.queue_read(psn, None, 0, 0, 1, msn);
        self.svc.resp.epsn = psn.next();
    }

    /// Op sequence (IBA ch. 9.7): a message in progress continues with a
    /// MIDDLE or LAST packet of the same operation; with none in progress
    /// only a FIRST or ONLY packet may come. Else: invalid request.
    fn check_op_sequence(&mut self, pkt: &ParsedPacket<'_>) -> Result<(), Refusal> {
        let info = pkt.info;
        let starts = info.position.starts_message();
        let in_seq = match &self.svc.resp.cur {
            Some(m) => !starts && m.continues(info.operation),
            None => starts,
        };
        if in_seq {
            Ok(())
        } else {
            Counters::inc(&self.core.cfg.counters.bad_opcode_sequence);
            Err(RespError::InvalidRequest.with(Refused::OpSequence { starts }))
        }
    }

    /// R_Key check ([`check_rkey`]).
    fn check_rkey(&self, rkey: u32, va: u64, len: u64, need: Access) -> Result<Target, Refusal> {
        check_rkey(&self.core.cfg, rkey, va, len, need)
    }

    fn exec_send(&mut self, pkt: &ParsedPacket<'_>) -> Result<(), Refusal> {
        if pkt.info.position.starts_message() {
            let Some(wr) = self.core.cfg.rq.take() else {
                self.rnr_nak(pkt.bth.psn);
                return Err(RespError::Rnr.into());
            };
            self.core.cfg.recv_taken(&wr, true);
            match RecvTarget::resolve(&self.core.cfg, &wr) {
                Ok(recv) => self.svc.resp.cur = Some(Inbound::Send { recv, written: 0 }),
                Err(cause) => {
                    self.core.why = Some(cause);
                    self.complete_recv(wr.wr_id, WcStatus::LocProtErr);
                    return Err(RespError::RemoteOperational.into());
                }
            }
        }
        let Some((recv, written)) = Inbound::send_packet(&mut self.svc.resp.cur, pkt)? else {
            return Ok(());
        };
        let mut wc = self.received(recv.wr_id, WcOpcode::Recv, written, pkt.imm());
        if let Some(rkey) = pkt.ieth() {
            // SEND with Invalidate may invalidate only a type 2 memory
            // window bound through this QP (IBA 10.6.7.2.5; uroce
            // registers no region for remote invalidation). Anything
            // else: the receive WR completes with REM_INV_REQ_ERR, no
            // NAK is sent and the QP goes to ERR (IBA 9.9.3 class J, as
            // rxe), and nothing is invalidated.
            let cfg = &self.core.cfg;
            if cfg
                .keys
                .invalidate_rkey(rkey, cfg.pd, cfg.qpn, true)
                .is_err()
            {
                let recv = RecvTarget {
                    wr_id: recv.wr_id,
                    sgl: Resolved::default(),
                };
                self.svc.resp.cur = Some(Inbound::Send { recv, written });
                return Err(RespError::InvalidateFailed.with(Refused::Invalidate { rkey }));
            }
            wc.wc_flags |= WcFlags::WITH_INV;
            wc.invalidated_rkey = rkey;
        }
        self.svc.resp.msn = self.svc.resp.msn.wrapping_add(1);
        self.complete(false, wc, pkt.bth.se);
        Ok(())
    }

    /// Returns false when the packet was RNR-NAKed (not executed).
    fn exec_write(&mut self, pkt: &ParsedPacket<'_>) -> Result<bool, Refusal> {
        // The packet of a WRITE with immediate consumes a receive WR, taken
        // before the R_Key and length checks (rxe's check_resource comes
        // first): without one it is RNR-NAKed with nothing done (a WRITE
        // it would open is not in progress, so that its resend opens it
        // again); a check that then fails completes that WR with the
        // error's status (an R_Key violation: REM_ACCESS_ERR, as rxe).
        let ends = pkt.info.position.ends_message();
        let recv = if ends && pkt.imm().is_some() {
            match self.core.cfg.rq.take() {
                Some(wr) => {
                    self.core.cfg.recv_taken(&wr, false);
                    Some(wr)
                }
                None => {
                    self.rnr_nak(pkt.bth.psn);
                    return Ok(false);
                }
            }
        } else {
            None
        };
        let checked =
            Inbound::write_packet(&mut self.svc.resp.cur, &self.core.cfg, pkt).and_then(|()| {
                Inbound::place_write(&mut self.svc.resp.cur, pkt).map_err(Refusal::from)
            });
        let done = match (checked, &recv) {
            (Ok(done), _) => done,
            (Err(r), Some(wr)) => {
                // The error completes the WR the message took.
                let recv = RecvTarget {
                    wr_id: wr.wr_id,
                    sgl: Resolved::default(),
                };
                self.svc.resp.cur = Some(Inbound::Send { recv, written: 0 });
                return Err(r);
            }
            (Err(r), None) => return Err(r),
        };
        let Some(total) = done else {
            return Ok(true);
        };
        self.svc.resp.msn = self.svc.resp.msn.wrapping_add(1);
        if let Some(wr) = recv {
            let imm = Some(pkt.imm().unwrap_or(0));
            let byte_len = planted!(total, WriteImmWrongByteLen => pkt.payload.len() as u64);
            let wc = self.received(wr.wr_id, WcOpcode::RecvRdmaWithImm, byte_len, imm);
            self.complete(false, wc, pkt.bth.se);
        }
        Ok(true)
    }

    fn rnr_nak(&mut self, psn: Psn) {
        Counters::inc(&self.core.cfg.counters.rnr_naks_sent);
        let m = self.svc.resp.msn;
        let timer = planted!(
            self.core.attr.min_rnr_timer,
            RnrNakWrongTimer => self.core.attr.timeout
        );
        self.queue_ack(psn, AethSyndrome::RnrNak { timer }, m);
    }

    /// A duplicate request (IBA ch. 9.7): SEND and WRITE are
    /// acknowledged again without executing; a READ or atomic is answered
    /// again only when it repeats one of the QP's responder resources (the
    /// same R_Key, inside the same range; an atomic: the same request), with
    /// the QP's access and the R_Key checked again; atomics are never
    /// executed twice. Anything else is dropped and counted.
    fn duplicate(&mut self, pkt: &ParsedPacket<'_>) {
        let c = &self.core.cfg.counters;
        Counters::inc(&c.duplicate_requests);
        let psn = pkt.bth.psn;
        let msn = self.svc.resp.msn;
        let res = self.svc.resp.resource(psn);
        match (pkt.info.operation, res) {
            (Operation::Send | Operation::RdmaWrite, _) => {
                // Coalesced: the latest PSN executed, unless that is a
                // READ's or an atomic's (or FLUSH's, ATOMIC WRITE's): a
                // plain ACK naming it would claim that request answered,
                // and a requester that takes it as the answer (kernel
                // rxe 6.1 completes an atomic so, without its result)
                // loses the result if the real response was lost. The
                // duplicate's own PSN acknowledges all it repeats.
                let last = self.svc.resp.epsn.sub(1);
                let ack = if self.svc.resp.resource(last).is_some() {
                    psn
                } else {
                    last
                };
                self.queue_ack(ack, ACK, msn);
            }
            (Operation::RdmaReadRequest, Some(r)) => {
                let Some(reth) = pkt.reth() else { return };
                let len = u64::from(reth.dma_len);
                let n = npkts(len, self.mtu());
                if !r.repeats_read(psn, reth.va, len, reth.rkey, n) {
                    return self.drop_unmatched();
                }
                let allowed =
                    check_op_allowed(Operation::RdmaReadRequest, self.core.attr.qp_access_flags);
                if let Err(e) = allowed {
                    self.core.why = Some(self.refusal_cause(e, pkt));
                    return self.responder_error(e.err, psn);
                }
                let (mr, offset) =
                    match self.check_rkey(reth.rkey, reth.va, len, Access::REMOTE_READ) {
                        Ok(v) => v,
                        Err(e) => {
                            self.core.why = Some(self.refusal_cause(e, pkt));
                            return self.responder_error(e.err, psn);
                        }
                    };
                // The requester asks again: responses still queued for
                // any of the same PSNs are superseded.
                self.svc.resp.out.retain(|i| match i {
                    RespItem::Read {
                        psn: p, npkts: m, ..
                    } => psn.distance_from(*p) >= *m && p.distance_from(psn) >= n,
                    _ => true,
                });
                self.svc.resp.queue_read(psn, mr, offset, len, n, msn);
            }
            (Operation::CompareSwap | Operation::FetchAdd, Some(r)) => {
                let Some(a) = pkt.atomic_eth() else { return };
                let compare_swap = pkt.info.operation == Operation::CompareSwap;
                let Some(saved) = r.repeats_atomic(psn, compare_swap, &a) else {
                    return self.drop_unmatched();
                };
                let orig = planted!(
                    saved,
                    DuplicateAtomicExecuted => self
                        .check_rkey(a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
                        .ok()
                        .and_then(|(mr, off)| {
                            apply_atomic(mr.as_deref()?, off, compare_swap, &a).ok()
                        })
                        .unwrap_or(saved)
                );
                self.svc
                    .resp
                    .queue_again(RespItem::AtomicAck { psn, orig, msn });
            }
            (op @ (Operation::Flush | Operation::AtomicWrite), Some(r))
                if r.psn == psn
                    && r.kind
                        == (ResKind::Ack {
                            atomic_write: op == Operation::AtomicWrite,
                        }) =>
            {
                self.svc.resp.queue_again(RespItem::Read {
                    psn,
                    mr: None,
                    offset: 0,
                    len: 0,
                    sent: 0,
                    npkts: 1,
                    msn,
                });
            }
            _ => self.drop_unmatched(),
        }
    }

    fn drop_unmatched(&mut self) {
        Drop::UnmatchedDuplicate.count(&self.core.cfg.counters);
    }

    /// A failed check: NAK, complete the receive WR in progress with the
    /// matching status, QP to ERR (IBA 9.9.3: responder class B/C/D errors).
    /// The NAK names `psn`: the expected PSN for a new request, the
    /// request's own for a duplicate.
    ///
    /// Class J (a SEND with Invalidate whose invalidation fails) sends no
    /// NAK: the message is acknowledged (rxe acknowledges it when its last
    /// packet asks, as every requester's last packet does), its receive WR
    /// completes in error and the QP goes to ERR; the requester's SEND
    /// completes with success, and its next request goes unanswered.
    fn responder_error(&mut self, err: RespError, psn: Psn) {
        let msn = self.svc.resp.msn;
        let peer = self.core.peer();
        let (recv_status, then) = match err.action(QpType::Rc) {
            ErrorAction::NakAndError { nak, recv_status } => {
                Counters::inc(&self.core.cfg.counters.err_naks_sent);
                // IBA 11.6.3.1: affiliated asynchronous errors of the
                // responder.
                self.core.cfg.event(match err {
                    RespError::RemoteAccess => EventType::QpAccessErr,
                    _ => EventType::QpReqErr,
                });
                self.queue_ack(psn, AethSyndrome::Nak(nak), msn);
                let psn = psn.value();
                (recv_status, Then::NakSent { nak, peer, psn })
            }
            ErrorAction::ErrorNoNak { recv_status } => {
                self.queue_ack(psn, ACK, msn);
                let psn = psn.value();
                (recv_status, Then::NoNak { peer, psn })
            }
            _ => return, // RNR: the NAK is queued, nothing consumed
        };
        let aborted = self.svc.resp.abort_current();
        let cause = self.core.why.take().unwrap_or(Cause::Resp(err.name()));
        let status = match (aborted, err) {
            (Some(_), _) => Some(recv_status),
            (None, RespError::RemoteOperational) => Some(WcStatus::LocProtErr),
            _ => None,
        };
        self.explain(status, Side::Responder, Fault { cause, then });
        let stays = planted!(false, NoErrorOnAccessError => err == RespError::RemoteAccess);
        if let Some(wr_id) = aborted {
            if !stays {
                self.publish_error();
            }
            self.complete_recv(wr_id, recv_status);
        }
        // The READ responses and atomic ACKs queued ahead of the NAK answer
        // requests executed before the error: they still go, in PSN order
        // (an atomic has changed memory; without its ACK the requester
        // never learns the original value). Found by `uroce fuzz --versus`
        // against rxe, which sends them too.
        if stays {
            return;
        }
        let answered = std::mem::take(&mut self.svc.resp.out);
        self.enter_error();
        self.svc.resp.out = answered;
    }

    /// Why request `pkt` was refused with `r`: what the failing site
    /// noted (a receive WR's bad buffers), else what the check that failed
    /// found, else what the error alone says of the request and the
    /// message in progress (error path only).
    fn refusal_cause(&mut self, r: Refusal, pkt: &ParsedPacket<'_>) -> Cause {
        if let Some(w) = self.core.why.take() {
            return w;
        }
        let op = pkt.info.operation;
        let refused = r.why.unwrap_or_else(|| match (r.err, op) {
            (RespError::LengthError, _) => match &self.svc.resp.cur {
                Some(Inbound::Send { recv, written }) => Refused::SendTooLong {
                    so_far: written + pkt.payload.len() as u64,
                    cap: recv.sgl.total(),
                },
                _ => Refused::TooLong,
            },
            (RespError::RemoteAccess, Operation::RdmaWrite) => Refused::WriteRegionLost,
            (_, Operation::Send) if pkt.ieth().is_some() => Refused::Invalidate {
                rkey: pkt.ieth().unwrap_or(0),
            },
            (_, Operation::RdmaWrite) => Refused::WriteLength,
            (e, _) => Refused::Other(e.name()),
        });
        Cause::Request {
            name: pkt.info.name,
            psn: pkt.bth.psn.value(),
            refused,
        }
    }

    /// Executes requests held back behind READ responses, once those are
    /// all sent (until another READ holds the rest back).
    pub(super) fn run_deferred(&mut self, now: Nanos) {
        while !self.svc.resp.reads_pending() {
            let Some(bytes) = self.svc.resp.deferred.pop_front() else {
                break;
            };
            if let Ok(pkt) = uroce_wire::packet::parse(&bytes) {
                // Already checked (ICRC, peer, P_Key) when it arrived.
                let rest = std::mem::take(&mut self.svc.resp.deferred);
                self.handle_request(now, &pkt);
                // handle_request deferred nothing: no READ was pending.
                self.svc.resp.deferred = rest;
            }
            if self.svc.resp.spare.len() < MAX_DEFERRED {
                self.svc.resp.spare.push(bytes);
            }
        }
    }

    /// The region a READ is answered from was deregistered while its
    /// responses were going out: the response at `psn` becomes a NAK
    /// (remote access error), as for an R_Key violation found at that
    /// point (rxe's read_reply does the same), and the QP goes to ERR.
    fn read_source_lost(&mut self, psn: Psn, popped: bool) {
        if !popped {
            self.svc.resp.out.pop_front();
        }
        Counters::inc(&self.core.cfg.counters.err_naks_sent);
        self.core.cfg.event(EventType::QpAccessErr);
        let then = Then::NakSent {
            nak: NakCode::RemoteAccessError,
            peer: self.core.peer(),
            psn: psn.value(),
        };
        let cause = Cause::ReadSourceLost;
        self.explain(None, Side::Responder, Fault { cause, then });
        let msn = self.svc.resp.msn;
        self.svc.resp.out.push_front(RespItem::Ack {
            psn,
            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
            msn,
        });
        self.enter_error();
    }

    /// Produces the next response packet (ACK/NAK, READ response, atomic
    /// ACK), in PSN order.
    pub(super) fn transmit_response(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let mtu = self.mtu() as u64;
        let dqp = self.core.attr.dest_qp_num;
        let item = self.svc.resp.out.front_mut()?;
        let (h, payload, done) = match item {
            RespItem::Ack { psn, syndrome, msn } => {
                let mut h = Headers::new(bth(dqp, Opcode::RC_ACKNOWLEDGE, *psn));
                h.aeth = Some(AethRepr {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                (h, None, true)
            }
            RespItem::AtomicAck { psn, orig, msn } => {
                let mut h = Headers::new(bth(dqp, Opcode::RC_ATOMIC_ACKNOWLEDGE, *psn));
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
                let opcode = match position(k, *npkts) {
                    Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let mut h = Headers::new(bth(dqp, opcode, psn.add(k)));
                if opcode != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    h.aeth = Some(AethRepr {
                        syndrome: ACK,
                        msn: *msn,
                    });
                }
                let (off, seg_len) = segment(*len, k, mtu);
                let plen = planted!(
                    seg_len,
                    ReadLastFullMtu => if *len > 0 { mtu as usize } else { seg_len }
                );
                *sent += 1;
                let done = *sent == *npkts;
                (h, Some((mr.clone(), *offset + off as usize, plen)), done)
            }
        };
        if done {
            self.svc.resp.out.pop_front();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The response queue holds at most MAX_QUEUED_RESPONSES: RNR and
    /// sequence NAKs beyond it are refused (and counted by the caller),
    /// positive ACKs coalesce, and an error NAK always goes.
    #[test]
    fn the_response_queue_is_bounded_but_error_naks_go() {
        let mut r = Responder::default();
        let rnr = AethSyndrome::RnrNak { timer: 1 };
        let mut queued = 0;
        for i in 0..MAX_QUEUED_RESPONSES as u32 + 50 {
            queued += u32::from(r.push_ack(Psn::new(i), rnr, 0));
        }
        assert_eq!(queued as usize, MAX_QUEUED_RESPONSES);
        assert_eq!(r.out.len(), MAX_QUEUED_RESPONSES);
        let seq = AethSyndrome::Nak(NakCode::PsnSequenceError);
        assert!(!r.push_ack(Psn::new(1), seq, 0));
        let err = AethSyndrome::Nak(NakCode::RemoteAccessError);
        assert!(r.push_ack(Psn::new(2), err, 0));
        assert_eq!(r.out.len(), MAX_QUEUED_RESPONSES + 1);

        let mut r = Responder::default();
        for i in 0..1000 {
            assert!(r.push_ack(Psn::new(i), ACK, 0));
        }
        assert_eq!(r.out.len(), 1, "positive ACKs coalesce");
    }
}
