//! QP1, the General Services Interface QP, for CM MADs only: UD SEND ONLY
//! packets to QPN 1 with the GSI Q_Key 0x80010000 (IBA 13.5), each
//! carrying one 256-byte MAD. The engine (or the simulated network) drives
//! it like any QP; it hands every MAD to the device's [`CmAgent`] and sends
//! what the agent gives back.
//!
//! The agent sits behind a mutex shared with the application's calls
//! (connect, accept, ...): after each call the application kicks QPN 1 so
//! that the engine sends what the call queued and re-arms the timer. The
//! lock is taken only on QP1's path, never on a data QP's.

use super::{CmAgent, CmEvent};
use crate::counters::Counters;
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
use crate::transport::{Nanos, QpMachine, RxMeta, Transmit};
use crate::types::{QpState, QpType};
use parking_lot::Mutex;
use std::net::IpAddr;
use std::sync::Arc;
use uroce_wire::bth::BthRepr;
use uroce_wire::deth::DethRepr;
use uroce_wire::icrc::IpContext;
use uroce_wire::mad::{GSI_QKEY, GSI_QPN, MAD_LEN};
use uroce_wire::opcode::Opcode;
use uroce_wire::packet::{self, Headers, ParsedPacket};
use uroce_wire::{Operation, Psn, Transport};

/// Takes the agent's new events, called on the engine thread with no
/// lock held (it may lock the agent).
pub type Sink = Arc<dyn Fn(Vec<CmEvent>) + Send + Sync>;

/// A device's QP1. See the module doc.
pub struct GsiQp {
    agent: Arc<Mutex<CmAgent>>,
    local_ip: IpAddr,
    psn: Psn,
    counters: Arc<Counters>,
    sink: Option<Sink>,
}

impl std::fmt::Debug for GsiQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GsiQp")
            .field("local_ip", &self.local_ip)
            .field("psn", &self.psn)
            .field("agent", &*self.agent.lock())
            .finish()
    }
}

impl GsiQp {
    /// QP1 of the device at `local_ip`, serving `agent`. With a `sink`,
    /// the agent's events go to it as they come; without, they stay in
    /// the agent for [`CmAgent::poll_event`].
    pub fn new(
        agent: Arc<Mutex<CmAgent>>,
        local_ip: IpAddr,
        counters: Arc<Counters>,
        sink: Option<Sink>,
    ) -> GsiQp {
        GsiQp {
            agent,
            local_ip,
            psn: Psn::random(),
            counters,
            sink,
        }
    }

    /// Hands the agent's events to the sink, outside the agent's lock —
    /// once the MADs queued with them have been emitted: an event can
    /// end the program (DISCONNECTED is often the last thing it waits
    /// for), and the DREP that came with it must not die with it. The
    /// endpoint drains this QP's output right after a packet or a timer
    /// (and after a kick), and [`GsiQp::poll_transmit`] delivers then.
    fn deliver(&self, mut agent: parking_lot::MutexGuard<'_, CmAgent>) {
        let Some(sink) = &self.sink else {
            return;
        };
        if !agent.has_events() || agent.has_output() {
            return;
        }
        let events: Vec<CmEvent> = std::iter::from_fn(|| agent.poll_event()).collect();
        drop(agent);
        sink(events);
    }
}

fn ip_context(src: IpAddr, dst: IpAddr) -> IpContext {
    let port = uroce_wire::ROCEV2_UDP_PORT;
    IpContext::between(src, dst, port, port)
}

impl QpMachine for GsiQp {
    fn qpn(&self) -> u32 {
        GSI_QPN
    }
    fn qp_type(&self) -> QpType {
        QpType::Ud
    }
    fn state(&self) -> QpState {
        QpState::Rts
    }
    fn attr(&self) -> QpAttr {
        QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Rts,
            qkey: GSI_QKEY,
            sq_psn: self.psn.value(),
            ..QpAttr::default()
        }
    }
    /// QP1 belongs to the CM: applications do not modify it.
    fn modify(&mut self, _attr: &QpAttr, _mask: AttrMask) -> Result<(), ModifyError> {
        Err(ModifyError::BadTransition {
            from: QpState::Rts,
            to: QpState::Rts,
            qp_type: QpType::Ud,
        })
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let ok = pkt.info.transport == Transport::Ud && pkt.info.operation == Operation::Send;
        let Some(deth) = pkt.deth().filter(|_| ok) else {
            Counters::inc(&self.counters.cm_dropped_mads);
            return;
        };
        if deth.qkey != GSI_QKEY {
            Counters::inc(&self.counters.qkey_violations);
            return;
        }
        let mut agent = self.agent.lock();
        agent.handle_mad(now, meta.src.to_canonical(), deth.src_qp, pkt.payload);
        self.deliver(agent);
    }
    fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        let mut agent = self.agent.lock();
        loop {
            let Some(out) = agent.poll_transmit() else {
                // Drained: what the events answered is on its way.
                self.deliver(agent);
                return None;
            };
            let mut h = Headers::new(BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                pkey: 0xffff,
                dest_qp: out.dst_qpn & 0xff_ffff,
                psn: self.psn,
                ..BthRepr::default()
            });
            h.deth = Some(DethRepr {
                qkey: GSI_QKEY,
                src_qp: GSI_QPN,
            });
            let Ok(hdr) = packet::emit_headers(&h, MAD_LEN, buf) else {
                continue;
            };
            if out.mad.emit(&mut buf[hdr..hdr + MAD_LEN]).is_err() {
                // Values the codec refuses (a caller's out-of-range
                // field): nothing goes out.
                Counters::inc(&self.counters.cm_dropped_mads);
                continue;
            }
            let ctx = ip_context(self.local_ip, out.dst);
            let Ok(len) = packet::finish(buf, hdr, MAD_LEN, &ctx) else {
                continue;
            };
            self.psn = self.psn.next();
            Counters::inc(&self.counters.sent_pkts);
            return Some(Transmit {
                dst: out.dst,
                len,
                tclass: out.tclass,
                hop_limit: None,
            });
        }
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        self.agent.lock().poll_timeout()
    }
    fn handle_timeout(&mut self, now: Nanos) {
        let mut agent = self.agent.lock();
        agent.handle_timeout(now);
        self.deliver(agent);
    }
}
