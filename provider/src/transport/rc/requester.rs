//! The requester: send WRs to request packets (IBA 9.7.1-9.7.4).

use super::{max_inflight_psns, RcQp, ACK_REQ_EVERY, MIN_CWND};
use crate::counters::Counters;
use crate::observe::cause::Side;
use crate::observe::cause::{Cause, LkeyFault, WrCheck};
use crate::observe::{Fact, Resend, Topic};
use crate::qp_attr::{AttrMask, QpAttr};
use crate::transport::message::MAX_MSG_SIZE;
use crate::transport::message::{fill_payload, message_headers, npkts, position, segment};
use crate::transport::sgl::Resolved;
use crate::transport::{Nanos, Transmit};
use crate::types::{Access, SendFlags, SendWr, WcStatus, WrOpcode};
use std::collections::VecDeque;
use uroce_wire::packet::Headers;
use uroce_wire::{AtomicEthRepr, Opcode, Position, Psn, RethRepr};

/// A send WR the engine has taken from the send queue.
#[derive(Debug)]
pub(super) struct SqEntry {
    pub wr: SendWr,
    /// Local buffers, resolved once.
    pub data: Resolved,
    /// Message length in bytes (8 for atomics).
    pub len: u64,
    /// PSNs the WR occupies (READ: one per response packet).
    pub npkts: u32,
    /// First PSN, once started.
    pub first_psn: Psn,
    pub started: bool,
    /// READ: response packets placed so far, in order.
    pub read_done: u32,
    /// READ: response packets placed ahead of a hole (arrived early, or
    /// after a lost one): bit k is packet `read_done + 1 + k`.
    pub read_ahead: u128,
    /// Finished successfully (waits to be retired in order).
    pub done: bool,
    /// Finished with an error.
    pub error: Option<WcStatus>,
    /// Admission's lkey check failed: the first SGE that failed, for the
    /// explanation (boxed: only a refused WR has one).
    pub lkey_fault: Option<Box<LkeyFault>>,
}

impl SqEntry {
    /// READ: writes response packet `idx` at its offset, once its length
    /// and whether it ends the message fit that place. (Its position may be
    /// relative to the original request or to any re-request of the
    /// remainder, so only "ends the message or not" is checked.)
    pub fn place_read_response(
        &self,
        idx: u32,
        mtu: u64,
        pos: Position,
        payload: &[u8],
    ) -> Result<(), WcStatus> {
        let (off, want_len) = segment(self.len, idx, mtu);
        // The response's opcode must fit its place in a stream of FIRST,
        // MIDDLE..., LAST or ONLY (IBA 9.7.5): the first packet of the
        // READ opens the stream; a later one may open the stream of a
        // re-request (FIRST, or ONLY at the end) or continue one; only
        // the last ends it.
        let n = self.npkts;
        let fits = match (idx, pos) {
            (0, p) => p == position(0, n),
            (k, Position::First | Position::Middle) => k + 1 < n,
            (k, Position::Last | Position::Only) => k + 1 == n,
        };
        if !fits || payload.len() != want_len {
            return Err(WcStatus::BadRespErr);
        }
        self.data
            .scatter(off, payload)
            .map_err(|_| WcStatus::LocProtErr)
    }
    pub fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }
    /// Not finished yet, successfully or not.
    pub fn pending(&self) -> bool {
        !self.done && self.error.is_none()
    }
    /// Whether `psn` lies in the WR's PSN range.
    pub fn contains(&self, psn: Psn) -> bool {
        self.started && psn.distance_from(self.first_psn) < self.npkts
    }
}

#[derive(Debug, Default)]
pub(super) struct Requester {
    /// WRs taken from the send queue and not yet retired, in order.
    pub wqes: VecDeque<SqEntry>,
    /// Index of the WR whose packet goes out next.
    pub send_idx: usize,
    /// Packet index within that WR.
    pub send_pkt: u32,
    /// PSN of the next packet to send.
    pub next_psn: Psn,
    /// Highest PSN ever sent + 1 (packets below it are resends).
    pub hwm: Psn,
    /// Oldest unacknowledged PSN.
    pub una: Psn,
    pub retry_left: u8,
    pub rnr_left: u8,
    /// Retransmission deadline.
    pub timer: Option<Nanos>,
    /// No sending before this (RNR wait).
    pub rnr_until: Option<Nanos>,
    /// Packets sent since the last AckReq.
    pub since_ack_req: u32,
    /// The PSN of the last sequence-error resend and the highest PSN sent
    /// when it began.
    pub nak_resend: Option<(Psn, Psn)>,
    /// The PSN a READ was last re-requested from after a hole in its
    /// responses.
    pub read_rerequest: Option<Psn>,
    /// The congestion window in PSNs ([`Requester::window`]; 0: the full
    /// window of the path MTU, [`max_inflight_psns`]).
    pub cwnd: u32,
    /// PSNs acknowledged since the window last grew.
    pub cwnd_acked: u32,
    /// The device's in-flight budget is spent (`QpMachine::set_throttled`).
    pub throttled: bool,
    /// A hole in a READ's responses: its PSN, when a later response first
    /// showed it, and how many later responses have arrived since.
    pub read_hole: Option<(Psn, Nanos, u32)>,
}

impl Requester {
    /// The WR whose PSN range holds `psn`, if one is outstanding.
    pub fn holding(&self, psn: Psn) -> Option<&SqEntry> {
        self.wqes.iter().find(|e| e.contains(psn))
    }
    /// Takes a modify's send PSN (nothing sent yet from there) and retry
    /// counters.
    pub fn modify(&mut self, attr: &QpAttr, mask: AttrMask) {
        if mask.contains(AttrMask::SQ_PSN) {
            let psn = Psn::new(attr.sq_psn);
            self.next_psn = psn;
            self.una = psn;
            self.hwm = psn;
        }
        if mask.contains(AttrMask::RETRY_CNT) {
            self.retry_left = attr.retry_cnt;
        }
        if mask.contains(AttrMask::RNR_RETRY) {
            self.rnr_left = attr.rnr_retry;
        }
    }
    pub fn inflight(&self) -> u32 {
        self.next_psn.distance_from(self.una)
    }
    /// PSNs the requester may have unacknowledged now, at path MTU `mtu`:
    /// a window that halves at each retransmission timeout (a whole
    /// window's tail lost: the path or the receiver is overrun) down to
    /// [`MIN_CWND`] and grows back by one PSN per window of PSNs
    /// acknowledged, up to [`max_inflight_psns`] (additive increase,
    /// multiplicative decrease, as TCP). Go-back-N resends a whole window
    /// after each timeout; QPs on several devices doing that at full
    /// window into one receiver overflow it again and again until their
    /// retries run out, where halved windows drain it. Sequence NAKs do
    /// not cut it: reordering causes them as well as loss.
    pub fn window(&self, mtu: u32) -> u32 {
        if self.cwnd == 0 {
            max_inflight_psns(mtu)
        } else {
            self.cwnd
        }
    }
    /// A sign of congestion: the window halves.
    pub fn on_congestion(&mut self, mtu: u32) {
        self.cwnd = (self.window(mtu) / 2).max(MIN_CWND);
        self.cwnd_acked = 0;
    }
    /// `n` PSNs newly acknowledged: the window grows by one for each
    /// window's worth.
    pub fn on_acked(&mut self, n: u32, mtu: u32) {
        if self.cwnd == 0 {
            return;
        }
        self.cwnd_acked += n;
        while self.cwnd != 0 && self.cwnd_acked >= self.cwnd {
            self.cwnd_acked -= self.cwnd;
            self.cwnd += 1;
            if self.cwnd >= max_inflight_psns(mtu) {
                self.cwnd = 0;
                self.cwnd_acked = 0;
            }
        }
    }
    /// Removes every WR not yet retired (for flush or reset).
    pub fn drain(&mut self) -> Vec<SqEntry> {
        self.send_idx = 0;
        self.send_pkt = 0;
        self.timer = None;
        self.rnr_until = None;
        self.wqes.drain(..).collect()
    }
    pub fn poll_timeout(&self) -> Option<Nanos> {
        match (self.timer, self.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    /// Rewinds to resend from `psn` (go-back-N). Returns false if no sent
    /// WR holds it.
    pub fn go_back(&mut self, psn: Psn) -> bool {
        let Some(i) = self.wqes.iter().position(|e| e.contains(psn)) else {
            return false;
        };
        self.send_idx = i;
        self.send_pkt = psn.distance_from(self.wqes[i].first_psn);
        self.next_psn = psn;
        true
    }
    /// The front WR was retired: indexes shift down by one, and if it was
    /// the one being (re)sent, sending moves on to the next one.
    pub fn pop_adjust(&mut self) {
        if self.send_idx == 0 {
            self.send_pkt = 0;
        } else {
            self.send_idx -= 1;
        }
    }

    /// If sending is positioned before `una` (a go-back overtaken by
    /// acknowledgements), skips to `una`.
    pub fn resume_after_una(&mut self) {
        if self.next_psn.distance_from(self.una) < (1 << 23) {
            return; // next_psn is at or after una
        }
        if !self.go_back(self.una) {
            self.send_idx = self
                .wqes
                .iter()
                .position(|e| !e.started)
                .unwrap_or(self.wqes.len());
            self.send_pkt = 0;
            self.next_psn = self.una;
        }
    }

    /// The oldest WR not yet finished: the one a response is waited for.
    pub fn waited(&self) -> Option<usize> {
        self.wqes.iter().position(SqEntry::pending)
    }

    /// Incomplete READ/atomic WRs before the one being sent.
    fn rd_atomic_outstanding(&self) -> usize {
        self.wqes
            .iter()
            .take(self.send_idx)
            .filter(|e| e.wr.opcode.takes_rd_atomic_credit() && e.pending())
            .count()
    }
}

/// The RC opcode of packet `pos` of a WR (from the opcode table).
fn request_opcode(op: WrOpcode, pos: Position) -> Option<Opcode> {
    op.request_opcode(uroce_wire::Transport::Rc, pos)
}

impl RcQp {
    /// Builds the engine's view of a posted WR, checking it locally:
    /// opcode valid for RC, SGEs (lkey, PD, access, bounds) and lengths.
    fn admit(&self, wr: SendWr) -> SqEntry {
        let mtu = self.mtu();
        let mut e = SqEntry {
            data: Resolved::default(),
            len: 0,
            npkts: 1,
            first_psn: Psn::default(),
            started: false,
            read_done: 0,
            read_ahead: 0,
            done: false,
            error: None,
            lkey_fault: None,
            wr,
        };
        let op = e.wr.opcode;
        if op.is_local() {
            // No packet: executed when sending reaches it.
            e.npkts = 0;
            return e;
        }
        if request_opcode(op, Position::Only).is_none() {
            e.error = Some(WcStatus::LocQpOpErr);
            return e;
        }
        match op {
            // One packet: the range to flush travels in the RETH; no local
            // buffers.
            WrOpcode::Flush => {
                e.len = u64::from(e.wr.flush.len);
                return e;
            }
            // The 8 bytes travel with the WR (copied at post time).
            WrOpcode::AtomicWrite => {
                e.len = 8;
                if e.wr.inline_data.len() != 8 {
                    e.error = Some(WcStatus::LocLenErr);
                }
                return e;
            }
            _ => {}
        }
        let need = if op.is_read_or_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        if e.wr.flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic() {
            e.len = e.wr.inline_data.len() as u64;
        } else {
            match Resolved::resolve(&self.core.cfg.keys, self.core.cfg.pd, &e.wr.sg_list, need) {
                Ok(r) => {
                    e.len = r.total();
                    e.data = r;
                }
                // The buffers of a READ or atomic receive its response:
                // the request goes anyway, as rxe and NICs send it (the
                // L_Key is checked where the response is placed). A bad
                // R_Key's NAK then comes first (REM_ACCESS_ERR); else the
                // remote side executes, and placing the response into no
                // buffers fails: LOC_PROT_ERR, QP to ERR.
                Err(_) if op.is_read_or_atomic() => {
                    e.len = e.wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
                }
                Err(f) => {
                    e.error = Some(WcStatus::LocProtErr);
                    e.lkey_fault = Some(Box::new(f));
                    return e;
                }
            }
        }
        if op.is_atomic() {
            if e.len != 8 {
                e.error = Some(WcStatus::LocLenErr);
            }
            return e;
        }
        if e.len > MAX_MSG_SIZE {
            e.error = Some(WcStatus::LocLenErr);
            return e;
        }
        e.npkts = npkts(e.len, mtu);
        e
    }

    /// Produces the next request packet, if any may go now.
    /// With `allow_new` false (SQD), only WRs already started are sent
    /// (resent); the queue drains.
    pub(super) fn transmit_request(
        &mut self,
        now: Nanos,
        buf: &mut [u8],
        allow_new: bool,
    ) -> Option<Transmit> {
        if let Some(t) = self.svc.req.rnr_until {
            if now < t {
                return None;
            }
            self.svc.req.rnr_until = None;
        }
        if !allow_new
            && self
                .svc
                .req
                .wqes
                .get(self.svc.req.send_idx)
                .is_none_or(|e| !e.started)
        {
            return None;
        }
        loop {
            if self.svc.req.send_idx == self.svc.req.wqes.len() {
                let wr = self.core.cfg.sq.take()?;
                let e = self.admit(wr);
                self.svc.req.wqes.push_back(e);
            }
            if !self.svc.req.wqes[self.svc.req.send_idx]
                .wr
                .opcode
                .is_local()
            {
                break;
            }
            // Executed in order with the packets around it; its
            // completion waits for theirs. Go on with the next WR.
            if !self.execute_local() {
                return None;
            }
        }
        let idx = self.svc.req.send_idx;
        if self.svc.req.wqes[idx].error.is_some() {
            // A local error: complete what precedes, then this one, in order.
            self.retire();
            return None;
        }
        let inflight = self.svc.req.inflight();
        if inflight >= self.svc.req.window(self.mtu()) || (self.svc.req.throttled && inflight > 0) {
            return None;
        }
        if !self.svc.req.wqes[idx].started {
            let e = &self.svc.req.wqes[idx];
            let rd_atomic = e.wr.opcode.takes_rd_atomic_credit();
            let fence = e.wr.flags.contains(SendFlags::FENCE);
            if (fence || rd_atomic) && self.svc.req.rd_atomic_outstanding() > 0 {
                let limit = (self.core.attr.max_rd_atomic as usize).max(1);
                if fence || self.svc.req.rd_atomic_outstanding() >= limit {
                    return None;
                }
            }
            let psn = self.svc.req.next_psn;
            let e = &mut self.svc.req.wqes[idx];
            e.first_psn = psn;
            e.started = true;
        }
        let t = self.build_request(idx, self.svc.req.send_pkt, buf)?;
        // Advance.
        let e = &self.svc.req.wqes[idx];
        let psn = self.svc.req.next_psn;
        if psn.distance_from(self.svc.req.una) < self.svc.req.hwm.distance_from(self.svc.req.una) {
            Counters::inc(&self.core.cfg.counters.retransmits);
            self.core.tally.retransmits += 1;
        }
        if e.wr.opcode == WrOpcode::RdmaRead {
            self.svc.req.next_psn = e.first_psn.add(e.npkts);
            self.svc.req.send_idx += 1;
            self.svc.req.send_pkt = 0;
        } else {
            self.svc.req.next_psn = psn.next();
            self.svc.req.send_pkt += 1;
            if self.svc.req.send_pkt == e.npkts {
                self.svc.req.send_idx += 1;
                self.svc.req.send_pkt = 0;
            }
        }
        if self.svc.req.next_psn.distance_from(self.svc.req.una)
            > self.svc.req.hwm.distance_from(self.svc.req.una)
        {
            self.svc.req.hwm = self.svc.req.next_psn;
        }
        if self.svc.req.timer.is_none() && self.core.attr.timeout != 0 {
            self.svc.req.timer = Some(now.plus(ack_timeout_ns(self.core.attr.timeout)));
        }
        Some(t)
    }

    /// Executes the local operation (BIND_MW, LOCAL_INV) at `send_idx`
    /// once (a go-back that passes it again skips it) and moves on. A
    /// refused one completes with its status (rxe's: MW_BIND_ERR for a
    /// bind, LOC_QP_OP_ERR for an invalidation) after the WRs before it,
    /// and the QP goes to ERR.
    /// Returns false when it failed: sending then stays at it until it
    /// completes in error, as for any WR that failed locally.
    fn execute_local(&mut self) -> bool {
        let idx = self.svc.req.send_idx;
        let e = &mut self.svc.req.wqes[idx];
        if e.error.is_some() {
            self.retire();
            return false;
        }
        self.svc.req.send_pkt = 0;
        if e.started {
            self.svc.req.send_idx += 1;
            return true;
        }
        e.started = true;
        e.first_psn = self.svc.req.next_psn;
        let result = self.core.cfg.execute_local(&e.wr);
        let ok = result.is_ok();
        match result {
            Ok(()) => {
                e.done = true;
                self.svc.req.send_idx += 1;
            }
            Err((s, why)) => {
                e.error = Some(s);
                self.core.why = Some(why);
            }
        }
        self.retire();
        ok
    }

    /// Writes packet `k` of WR `idx` into `buf`.
    fn build_request(&mut self, idx: usize, k: u32, buf: &mut [u8]) -> Option<Transmit> {
        let mtu = self.mtu();
        let psn = self.svc.req.next_psn;
        let e = &self.svc.req.wqes[idx];
        let op = e.wr.opcode;
        let pos = position(k, e.npkts);
        let mut h = Headers::new(self.bth(request_opcode(op, pos)?, psn));
        let mut payload = (0u64, 0usize); // (message offset, length)
        match op {
            WrOpcode::RdmaRead => {
                let off = k as u64 * mtu as u64;
                h.reth = Some(RethRepr {
                    va: e.wr.remote_addr.wrapping_add(off),
                    rkey: e.wr.rkey,
                    dma_len: e.len.saturating_sub(off) as u32,
                });
                h.bth.ack_req = true;
            }
            WrOpcode::Flush => {
                h.feth = Some(uroce_wire::FethRepr {
                    placement: e.wr.flush.placement,
                    selectivity: e.wr.flush.selectivity,
                });
                h.reth = Some(RethRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    dma_len: e.wr.flush.len,
                });
                h.bth.ack_req = true;
            }
            WrOpcode::AtomicWrite => {
                h.reth = Some(RethRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    dma_len: 8,
                });
                h.bth.ack_req = true;
                payload = (0, 8);
            }
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd => {
                let cmp = op == WrOpcode::AtomicCmpAndSwp;
                h.atomic_eth = Some(AtomicEthRepr {
                    va: e.wr.remote_addr,
                    rkey: e.wr.rkey,
                    swap_add: if cmp { e.wr.swap } else { e.wr.compare_add },
                    compare: if cmp { e.wr.compare_add } else { 0 },
                });
                h.bth.ack_req = true;
            }
            // SEND and WRITE: as UC builds them, and an ACK asked for at
            // the end of the message, every ACK_REQ_EVERY packets and when
            // the window fills.
            _ => {
                payload = segment(e.len, k, mtu as u64);
                h = message_headers(h.bth, &e.wr, e.len, pos)?;
                h.bth.ack_req = pos.ends_message()
                    || self.svc.req.since_ack_req + 1 >= ACK_REQ_EVERY
                    || self.svc.req.inflight() + 1 >= self.svc.req.window(mtu);
            }
        }
        if h.bth.ack_req {
            self.svc.req.since_ack_req = 0;
        } else {
            self.svc.req.since_ack_req += 1;
        }
        let e = &self.svc.req.wqes[idx];
        let inline = e.wr.flags.contains(SendFlags::INLINE) || op == WrOpcode::AtomicWrite;
        // The first copy of a SEND/WRITE's bytes for the wire (not a
        // resend): the checker compares its sources now.
        let resend =
            psn.distance_from(self.svc.req.una) < self.svc.req.hwm.distance_from(self.svc.req.una);
        if k == 0 && payload.1 > 0 && !inline && !resend {
            self.core.cfg.sq.sending(e.wr.wr_id);
        }
        let res = self.emit(&h, payload.1, buf, |dst| {
            fill_payload(&e.wr, &e.data, inline, payload.0, dst)
        });
        if res.is_none() {
            // The memory went away under us (deregistered): local protection error.
            self.svc.req.wqes[idx].error = Some(WcStatus::LocProtErr);
            self.retire();
        }
        res
    }

    /// Completes finished WRs at the head of the queue, in posting order.
    /// A WR that failed completes with its status and moves the QP to ERR.
    pub(super) fn retire(&mut self) {
        while let Some(front) = self.svc.req.wqes.front() {
            let (error, done) = (front.error, front.done);
            if error.is_none() && !done {
                break;
            }
            let e = self.svc.req.wqes.pop_front().expect("front exists");
            self.svc.req.pop_adjust();
            if let Some(status) = error {
                // The fault admission found is the WR's (the lkey check
                // runs once); any other is looked for now.
                if let Some(f) = e.lkey_fault {
                    let (op, wr_id) = (e.wr.opcode, e.wr.wr_id);
                    let check = WrCheck::Lkey(*f);
                    self.core.why = Some(Cause::SendWr { op, wr_id, check });
                }
                let why = self.local_fault(&e.wr, status);
                self.explain(Some(status), Side::of_send_status(status), why);
                self.publish_error();
                self.retire_send(&e.wr, status, 0);
                self.enter_error();
                return;
            }
            self.retire_send(&e.wr, WcStatus::Success, e.len);
        }
        self.svc.req.resume_after_una();
    }

    /// The retransmission timer or the RNR wait ran out.
    pub(super) fn requester_timeout(&mut self, now: Nanos) {
        if let Some(t) = self.svc.req.rnr_until {
            if now >= t {
                self.svc.req.rnr_until = None;
            }
        }
        let Some(t) = self.svc.req.timer else { return };
        if now < t {
            return;
        }
        self.svc.req.timer = None;
        if self.svc.req.inflight() == 0
            && self
                .svc
                .req
                .wqes
                .iter()
                .take(self.svc.req.send_idx)
                .all(|e| e.done)
        {
            return;
        }
        Counters::inc(&self.core.cfg.counters.retry_timeouts);
        self.core.tally.retry_timeouts += 1;
        if self.svc.req.retry_left == 0 {
            let a = &self.core.attr;
            self.core.why = Some(Cause::RetryExceeded {
                peer: self.core.peer(),
                psn: self.svc.req.una.value(),
                retry_cnt: a.retry_cnt,
                timeout: a.timeout,
                timeout_ns: ack_timeout_ns(a.timeout),
                last_seen_ns: self.core.peer_last_seen(now),
            });
            self.fail_at(self.svc.req.una, WcStatus::RetryExcErr);
            return;
        }
        self.svc.req.retry_left -= 1;
        let mtu = self.mtu();
        self.svc.req.on_congestion(mtu);
        Counters::inc(&self.core.cfg.counters.window_cuts);
        let una = self.svc.req.una;
        // A READ resent from `una` is that hole's re-request: answers
        // ahead of the hole still on their way (to earlier requests) must
        // not make another one (see `RcQp::read_answer_seen`).
        let in_read =
            (self.svc.req.holding(una)).is_some_and(|e| e.wr.opcode == WrOpcode::RdmaRead);
        self.svc.req.read_rerequest = in_read.then_some(una);
        self.svc.req.read_hole = None;
        self.svc.req.go_back(una);
        let (qpn, psn, retries_left) = (self.qpn(), una.value(), self.svc.req.retry_left);
        self.core
            .cfg
            .observer
            .tell(Topic::TIMELINE, || Fact::Retransmit {
                qpn,
                psn,
                cause: Resend::AckTimeout,
                retries_left,
            });
    }

    /// The WR holding `psn` (or the oldest one) fails with `status`.
    pub(super) fn fail_at(&mut self, psn: Psn, status: WcStatus) {
        let i = self
            .svc
            .req
            .wqes
            .iter()
            .position(|e| e.contains(psn) && !e.done)
            .unwrap_or(0);
        if let Some(e) = self.svc.req.wqes.get_mut(i) {
            e.error = Some(status);
        }
        // Everything before it has been acknowledged.
        for e in self.svc.req.wqes.iter_mut().take(i) {
            if e.error.is_none() {
                e.done = true;
            }
        }
        self.retire();
    }
}

/// The shortest local ACK timeout: 4 ms, one jiffy of the kernels rxe
/// runs on (`CONFIG_HZ=250`). rxe rounds the timeout up to whole jiffies
/// and never below one (`rxe_qp_from_attr`), so a program asking for
/// `timeout` 4 (65 µs, the `ibverbs` crate's default) waits a jiffy on
/// rxe. A userspace stack is descheduled for longer than 65 µs on a busy
/// machine: seven such timeouts in a row (`retry_cnt` 6) failed a healthy
/// connection with `IBV_WC_RETRY_EXC_ERR` under load.
pub const MIN_ACK_TIMEOUT_NS: u64 = 4_000_000;

/// The local ACK timeout: 4.096 µs × 2^timeout (IBA 9.7.6.1.3), never
/// shorter than `MIN_ACK_TIMEOUT_NS`.
pub fn ack_timeout_ns(timeout: u8) -> u64 {
    (4096u64 << timeout.min(31)).max(MIN_ACK_TIMEOUT_NS)
}
