//! What a QP is built from ([`QpConfig`]), and what the configuration
//! does for every transport: emitting packets, resolving a send WR's
//! buffers, local operations, completions, flushing and discarding the
//! posted WRs, and events.

use super::core::LocalFault;
use super::{sgl, RecvQueue, SendQueue, StateCell};
use crate::counters::Counters;
use crate::cq::CqInner;
use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventType};
use crate::memory::{KeyTable, PdId};
use crate::observe::cause::Explanation;
use crate::observe::cause::{Cause, WrCheck};
use crate::observe::{queue_id, Event, Fact, Gone, Observer, Topic};
use crate::qp_attr::{ModifyLimits, QpCap};
use crate::types::{SendWr, Wc, WcOpcode, WcStatus};
use std::net::IpAddr;
use std::sync::Arc;
use uroce_wire::icrc::IpContext;
use uroce_wire::packet::{self, Headers};

/// What a QP is built from.
#[derive(Debug, Clone)]
pub struct QpConfig {
    /// The QP number.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: PdId,
    /// The protection domain its receive WRs' L_Keys belong to: its own,
    /// or its SRQ's (which may be another).
    pub recv_pd: PdId,
    /// The context's key table.
    pub keys: Arc<KeyTable>,
    /// Send completions go here.
    pub send_cq: Arc<CqInner>,
    /// Receive completions go here.
    pub recv_cq: Arc<CqInner>,
    /// Posted send WRs.
    pub sq: Arc<SendQueue>,
    /// Posted receive WRs (or the SRQ's).
    pub rq: Arc<RecvQueue>,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
    /// Capacities.
    pub cap: QpCap,
    /// The device's address.
    pub local_ip: IpAddr,
    /// UDP source port of our packets.
    pub src_port: u16,
    /// Device counters.
    pub counters: Arc<Counters>,
    /// Device limits for modify checks.
    pub limits: ModifyLimits,
    /// The device's asynchronous event queue.
    pub events: Arc<AsyncEvents>,
    /// Strict mode: an RC or UC QP also pins the peer's UDP source port
    /// after the first packet that moved it forward, and drops packets
    /// from other ports (an on-path attacker must then also match it).
    /// Off by default: RoCEv2 lets a peer pick any source port per QP, and
    /// some change it (path migration, rate limiting by flow).
    pub strict_source_port: bool,
    /// Where the machine publishes its state.
    pub state: Arc<StateCell>,
    /// Whom the QP tells what it does (the seam: [`crate::observe`]).
    pub observer: Observer,
}

impl QpConfig {
    /// Tells the QP's observer, when a tool wants the timeline, that
    /// send WR `wr` left the queue with `status` and `byte_len` bytes.
    #[inline(always)]
    pub fn tell_send_done(&self, wr: &SendWr, status: WcStatus, byte_len: u64) {
        self.observer.tell(Topic::TIMELINE, || Fact::SendDone {
            qpn: self.qpn,
            queue: queue_id(&*self.sq),
            wr_id: wr.wr_id,
            status,
            byte_len,
            completed: status != WcStatus::Success
                || self.sq_sig_all
                || wr.flags.contains(crate::types::SendFlags::SIGNALED),
        });
    }

    /// Keeps `e` as the QP's last explanation (and, `cause`, as why it
    /// is in ERR) and tells the QP's observer (the tools print it when
    /// asked for: `UROCE_EXPLAIN=1`).
    pub fn explained(&self, e: Explanation, cause: bool) {
        self.observer
            .tell(Topic::EXPLAIN, || Event::Explained { e: &e });
        self.state.explain(e, cause);
    }

    /// Tells the QP's observer, when a tool wants the timeline, that the
    /// posted WRs end without completions (`why`).
    #[inline(always)]
    pub fn tell_queues_gone(&self, why: Gone) {
        self.observer.tell(Topic::TIMELINE, || Fact::QueuesGone {
            qpn: self.qpn,
            sq: queue_id(&*self.sq),
            rq: (!self.rq.is_srq()).then(|| queue_id(&*self.rq)),
            why,
        });
    }

    /// The engine took receive WR `wr` for a message; it places the
    /// message into its buffers next when `places` (the checker compares
    /// them with their checksums at post: a QP's own receive queue only).
    pub fn recv_taken(&self, wr: &crate::types::RecvWr, places: bool) {
        if let Some(l) = self.sq.ledger().filter(|_| !self.rq.is_srq()) {
            l.recv_taken(wr.wr_id, places);
        }
    }

    /// The ICRC context of packets we send to `dst` (UDP from our port to
    /// 4791; for IPv4 the header our socket produces: DF, ID 0).
    pub fn ip_context(&self, dst: IpAddr) -> IpContext {
        IpContext::between(
            self.local_ip,
            dst,
            self.src_port,
            uroce_wire::ROCEV2_UDP_PORT,
        )
    }

    /// Writes headers + payload (filled by `fill`, which may refuse) + pad
    /// + ICRC for `dst` into `buf`; returns the length.
    pub fn emit(
        &self,
        dst: IpAddr,
        h: &Headers,
        payload_len: usize,
        buf: &mut [u8],
        fill: impl FnOnce(&mut [u8]) -> bool,
    ) -> Option<usize> {
        let hdr = packet::emit_headers(h, payload_len, buf).ok()?;
        if !fill(&mut buf[hdr..hdr + payload_len]) {
            return None;
        }
        packet::finish(buf, hdr, payload_len, &self.ip_context(dst)).ok()
    }

    /// The local buffers of a send WR that reads only its own memory (UC
    /// and UD sends; RC checks per opcode): the inline bytes, or the SGEs
    /// resolved against the key table (a bad one is a local protection
    /// error). Returns them with the message length.
    pub(crate) fn send_buffers(&self, wr: &SendWr) -> Result<(sgl::Resolved, u64), LocalFault> {
        if wr.flags.contains(crate::types::SendFlags::INLINE) {
            return Ok((sgl::Resolved::default(), wr.inline_data.len() as u64));
        }
        let r = sgl::Resolved::resolve(
            &self.keys,
            self.pd,
            &wr.sg_list,
            crate::types::Access::empty(),
        )
        .map_err(|f| LocalFault {
            status: WcStatus::LocProtErr,
            cause: Some(Cause::SendWr {
                op: wr.opcode,
                wr_id: wr.wr_id,
                check: WrCheck::Lkey(f),
            }),
        })?;
        let len = r.total();
        Ok((r, len))
    }

    /// Executes a local operation (BIND_MW, LOCAL_INV) for this QP. A
    /// refused one gives rxe's status: MW_BIND_ERR for a bind,
    /// LOC_QP_OP_ERR for an invalidation, with why it was refused.
    pub fn execute_local(&self, wr: &SendWr) -> Result<(), (WcStatus, Cause)> {
        let refused = |status, check| {
            let (op, wr_id) = (wr.opcode, wr.wr_id);
            (status, Cause::SendWr { op, wr_id, check })
        };
        match (wr.opcode, &wr.bind) {
            (crate::types::WrOpcode::BindMw, Some(b)) => self
                .keys
                .bind_mw(b, self.pd, self.qpn)
                .map(|_| ())
                .map_err(|err| {
                    let check = WrCheck::Bind {
                        mw_rkey: b.mw_rkey,
                        mr_lkey: b.mr_lkey,
                        addr: b.addr,
                        len: b.len,
                        err,
                    };
                    refused(WcStatus::MwBindErr, check)
                }),
            (crate::types::WrOpcode::BindMw, None) => {
                Err(refused(WcStatus::MwBindErr, WrCheck::NoWindow))
            }
            (crate::types::WrOpcode::LocalInv, _) => self
                .keys
                .invalidate_rkey(wr.invalidate_rkey, self.pd, self.qpn, false)
                .map_err(|err| {
                    let rkey = wr.invalidate_rkey;
                    refused(WcStatus::LocQpOpErr, WrCheck::Invalidate { rkey, err })
                }),
            _ => Err(refused(WcStatus::LocQpOpErr, WrCheck::NotLocal)),
        }
    }

    /// Completes every WR waiting in the send queue with WR_FLUSH_ERR, in
    /// posting order. Returns false if a completion was lost to a full CQ.
    pub fn flush_sends(&self) -> bool {
        let mut ok = true;
        while let Some(wr) = self.sq.take() {
            self.sq.retire(1);
            self.tell_send_done(&wr, WcStatus::WrFlushErr, 0);
            let wc = Wc::new(
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.opcode.wc_opcode(),
                self.qpn,
            );
            ok &= self.complete(true, wc, false);
        }
        ok
    }

    /// In ERR: every WR waiting in the send queue and in the QP's own
    /// receive queue completes with WR_FLUSH_ERR, in posting order. An
    /// SRQ's WRs belong to every QP attached to it: they stay.
    pub fn flush_posted(&self) {
        self.flush_sends();
        if self.rq.is_srq() {
            return;
        }
        while let Some(wr) = self.rq.take() {
            let wc = Wc::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn);
            let _ = self.complete(false, wc, false);
        }
    }

    /// True when [`QpConfig::flush_posted`] has WRs to flush.
    pub fn has_posted(&self) -> bool {
        self.sq.has_pending() || (!self.rq.is_srq() && !self.rq.is_empty())
    }

    /// To RESET: WRs waiting in the send queue and the QP's own receive
    /// queue are discarded without completions (an SRQ keeps its WRs).
    pub fn discard_posted(&self) {
        while self.sq.take().is_some() {
            self.sq.retire(1);
        }
        if !self.rq.is_srq() {
            while self.rq.take().is_some() {}
        }
        // Completions of the QP's previous life go too (see
        // CqInner::remove_qp).
        self.send_cq.remove_qp(self.qpn);
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.remove_qp(self.qpn);
        }
    }

    /// Entering ERR: a QP on an SRQ reports that it takes no more WQEs
    /// from it (LAST_WQE_REACHED).
    pub fn report_last_wqe(&self) {
        if self.rq.is_srq() {
            self.event(EventType::QpLastWqeReached);
        }
    }

    /// Adds a completion to the send or the receive CQ (`solicited`: a
    /// receive completion of a message with the SE bit). Returns false if
    /// the CQ overflowed: the QP must then go to ERR and report QP_FATAL
    /// (once: not when already in ERR); the CQ reports CQ_ERR itself.
    #[must_use]
    pub fn complete(&self, send: bool, wc: Wc, solicited: bool) -> bool {
        let cq = if send { &self.send_cq } else { &self.recv_cq };
        if !send {
            self.observer.tell(Topic::TIMELINE, || Fact::RecvDone {
                qpn: self.qpn,
                queue: queue_id(&*self.rq),
                wr_id: wc.wr_id,
                status: wc.status,
                byte_len: u64::from(wc.byte_len),
            });
        }
        if cq.push_notify(wc, solicited) {
            return true;
        }
        Counters::inc(&self.counters.cq_overflows);
        false
    }

    /// Reports an asynchronous event about this QP.
    pub fn event(&self, event_type: EventType) {
        self.events.push(AsyncEvent {
            event_type,
            element: EventElement::Qp(self.qpn),
        });
    }
}
