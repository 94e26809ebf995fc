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
//!
//! On a device shared by processes, a MAD the agent says is another
//! process's ([`Route::Forward`]) leaves again at once, re-made as the
//! packet that came (its sender's address, port and QP, its ICRC for
//! them) behind the group's forward header, to the device's own address,
//! where the steering program takes it to its owner (see
//! `engine::share`).

use super::{CmAgent, CmEvent, CmGroup, Route};
use crate::counters::Counters;
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
use crate::transport::{Nanos, QpMachine, RxMeta, Transmit};
use crate::types::{QpState, QpType};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
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

/// A MAD on its way to the process that owns it.
struct Forward {
    slot: u32,
    from: SocketAddr,
    src_qp: u32,
    tclass: u8,
    psn: Psn,
    mad: [u8; MAD_LEN],
}

/// A device's QP1. See the module doc.
pub struct GsiQp {
    agent: Arc<Mutex<CmAgent>>,
    local_ip: IpAddr,
    psn: Psn,
    counters: Arc<Counters>,
    sink: Option<Sink>,
    /// The device's processes, when it is shared.
    group: Option<Arc<dyn CmGroup>>,
    forwards: VecDeque<Forward>,
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
        group: Option<Arc<dyn CmGroup>>,
    ) -> GsiQp {
        GsiQp {
            agent,
            local_ip,
            psn: Psn::random(),
            counters,
            sink,
            group,
            forwards: VecDeque::new(),
        }
    }

    /// Emits forward `f` into `buf`: the group's header, then the packet
    /// as its sender made it.
    fn emit_forward(&self, f: &Forward, buf: &mut [u8]) -> Option<Transmit> {
        let group = self.group.as_ref()?;
        let at = group.write_forward_header(f.slot, f.from, f.tclass, buf);
        let mut h = Headers::new(BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: GSI_QPN,
            psn: f.psn,
            ..BthRepr::default()
        });
        h.deth = Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp: f.src_qp,
        });
        let inner = &mut buf[at..];
        let hdr = packet::emit_headers(&h, MAD_LEN, inner).ok()?;
        inner.get_mut(hdr..hdr + MAD_LEN)?.copy_from_slice(&f.mad);
        let ctx = IpContext::between(
            f.from.ip(),
            self.local_ip,
            f.from.port(),
            uroce_wire::ROCEV2_UDP_PORT,
        );
        let len = packet::finish(inner, hdr, MAD_LEN, &ctx).ok()?;
        Some(Transmit {
            dst: self.local_ip,
            len: at + len,
            tclass: f.tclass,
            hop_limit: None,
        })
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
        let src = meta.src.to_canonical();
        if let Route::Forward(slot) = agent.handle_mad(now, src, deth.src_qp, pkt.payload) {
            let mut mad = [0u8; MAD_LEN];
            let n = pkt.payload.len().min(MAD_LEN);
            mad[..n].copy_from_slice(&pkt.payload[..n]);
            self.forwards.push_back(Forward {
                slot,
                from: SocketAddr::new(src, meta.src_port),
                src_qp: deth.src_qp,
                tclass: meta.tclass,
                psn: pkt.bth.psn,
                mad,
            });
        }
        self.deliver(agent);
    }
    fn poll_transmit(&mut self, _now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        while let Some(f) = self.forwards.pop_front() {
            if let Some(t) = self.emit_forward(&f, buf) {
                return Some(t);
            }
        }
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
