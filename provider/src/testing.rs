//! The testing face: fixtures of connected QPs on the simulated network
//! (after quinn's `Pair`), built from the provider's own parts as a device
//! would build them, without a device or an engine.
//!
//! * [`config`]: a [`QpConfig`] with its own key table, CQs, queues,
//!   counters and event queue; [`side_with`]: such an endpoint, with a QP
//!   of any type made from it, attached to a [`SimNet`] ([`Side`]);
//! * [`connect`], [`to_rtr`], [`to_rts`], [`uc_connect`], [`ud_up`]: the
//!   modify-QP sequences that bring a QP up (RC, UC, UD);
//! * [`RcPair`]: two connected RC QPs, with regions, posts and waiting
//!   for completions in virtual time; [`PairParams`] its connection;
//! * [`sge`], [`signaled_wr`]: work request shorthands.
//!
//! It is compiled for this crate's unit tests and, with the non-default
//! feature `testing`, for its users: the provider's integration tests
//! (`provider/tests/provider/`, through a dev-dependency of the crate on itself
//! with the feature), the benches, uroce-verbs' examples and uroce-fuzz
//! (the fuzzer's simulated target and the pair harness of the cargo-fuzz
//! targets). It uses the crate's public API only, and carries no fuzzer
//! code and no serialization. A build of the device library in which the
//! feature is on (unified with uroce-fuzz's, when uroce-cli is built in
//! the same cargo invocation) links none of it: nothing there calls it.

use crate::counters::Counters;
use crate::cq::CqInner;
use crate::events::AsyncEvents;
use crate::memory::{KeyTable, MrInner};
use crate::net::sim::{Faults, QpId, SimNet};
use crate::qp_attr::{AddressVector, AttrMask, ModifyLimits, QpAttr, QpCap};
use crate::transport::rc::{QpConfig, RcQp};
use crate::transport::{QpMachine, RecvQueue, SendQueue, StateCell};
use crate::types::{Access, Mtu, QpState, RecvWr, SendFlags, SendWr, Sge, Wc, WrOpcode};
use std::net::IpAddr;
use std::sync::Arc;

/// One end of a pair.
pub struct Side {
    /// Address.
    pub ip: IpAddr,
    /// Key table (one per side, as one per context).
    pub keys: Arc<KeyTable>,
    /// Send CQ.
    pub send_cq: Arc<CqInner>,
    /// Receive CQ.
    pub recv_cq: Arc<CqInner>,
    /// Send queue.
    pub sq: Arc<SendQueue>,
    /// Receive queue.
    pub rq: Arc<RecvQueue>,
    /// The QP in the network.
    pub id: QpId,
    /// Its number.
    pub qpn: u32,
    /// Device counters.
    pub counters: Arc<Counters>,
    /// The side's asynchronous events.
    pub events: Arc<AsyncEvents>,
    /// The QP's published state and explained errors.
    pub state: Arc<StateCell>,
}

impl Side {
    /// The QP's last explained error, displayed ("" when none).
    pub fn last_error(&self) -> String {
        self.state
            .last_error()
            .map_or_else(String::new, |e| e.to_string())
    }
}

/// Connection parameters of a pair.
#[derive(Debug, Clone, Copy)]
pub struct PairParams {
    /// Path MTU.
    pub mtu: Mtu,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Min RNR timer code.
    pub min_rnr_timer: u8,
    /// max_rd_atomic and max_dest_rd_atomic.
    pub rd_atomic: u8,
    /// Initial PSN of a (b's is `psn + 0x1000`).
    pub psn: u32,
    /// Queue depth.
    pub depth: u32,
    /// The path traffic class (`ah_attr.traffic_class`) of a's QP and
    /// of b's.
    pub traffic_class: [u8; 2],
}

impl Default for PairParams {
    fn default() -> Self {
        PairParams {
            mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            rd_atomic: 16,
            psn: 0x12_3456,
            depth: 256,
            traffic_class: [0, 0],
        }
    }
}

/// Two connected RC QPs, `a` at 10.0.0.1 and `b` at 10.0.0.2.
pub struct RcPair {
    /// The network.
    pub net: SimNet,
    /// One end.
    pub a: Side,
    /// The other end.
    pub b: Side,
}

/// The protection domain every fixture QP and region is in.
pub const PD: u32 = 1;

fn side(net: &mut SimNet, ip: IpAddr, qpn: u32, p: &PairParams) -> Side {
    side_with(net, ip, qpn, p, |cfg| Box::new(RcQp::new(cfg)))
}

/// One endpoint at `ip` with QP number `qpn`, its own key table, CQs
/// (4 x depth), queues, counters and event queue; `make` builds the QP
/// (any type) from the configuration, which is then attached to `net`.
pub fn side_with(
    net: &mut SimNet,
    ip: IpAddr,
    qpn: u32,
    p: &PairParams,
    make: impl FnOnce(QpConfig) -> Box<dyn QpMachine>,
) -> Side {
    let cfg = config(ip, qpn, p.depth);
    let side = Side {
        ip,
        keys: cfg.keys.clone(),
        send_cq: cfg.send_cq.clone(),
        recv_cq: cfg.recv_cq.clone(),
        sq: cfg.sq.clone(),
        rq: cfg.rq.clone(),
        id: 0,
        qpn,
        counters: cfg.counters.clone(),
        events: cfg.events.clone(),
        state: cfg.state.clone(),
    };
    Side {
        id: net.add_boxed(ip, make(cfg)),
        ..side
    }
}

/// A QP configuration at `ip` with QP number `qpn` and everything of its
/// own: key table, CQs of 4 x `depth`, queues of `depth`, counters, event
/// queue. Tests replace what they share with struct update syntax.
pub fn config(ip: IpAddr, qpn: u32, depth: u32) -> QpConfig {
    crate::diag::install();
    QpConfig {
        qpn,
        pd: PD,
        recv_pd: PD,
        keys: Arc::new(KeyTable::new()),
        send_cq: Arc::new(CqInner::new(4 * depth as usize)),
        recv_cq: Arc::new(CqInner::new(4 * depth as usize)),
        sq: Arc::new(SendQueue::new(depth).expect("a test queue")),
        rq: Arc::new(RecvQueue::new(depth).expect("a test queue")),
        sq_sig_all: false,
        cap: QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 16,
            max_recv_sge: 16,
            max_inline_data: 256,
        },
        local_ip: ip,
        src_port: uroce_wire::ROCEV2_UDP_PORT,
        counters: Arc::new(Counters::default()),
        limits: ModifyLimits {
            max_rd_atom: 128,
            active_mtu: Mtu::Mtu4096,
            privileged_qkey: false,
        },
        events: Arc::new(AsyncEvents::new().expect("eventfd")),
        strict_source_port: false,
        state: Arc::default(),
        observer: crate::observe::Observer::process(),
    }
}

/// Brings an RC QP through RESET -> INIT -> RTR -> RTS towards a peer.
pub fn connect(
    qp: &mut dyn QpMachine,
    peer: IpAddr,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    p: &PairParams,
) {
    to_rtr(qp, peer, dest_qpn, rq_psn, p);
    to_rts(qp, sq_psn, p);
}

/// RESET -> INIT -> RTR towards a peer (RC attributes, every access).
pub fn to_rtr(qp: &mut dyn QpMachine, peer: IpAddr, dest_qpn: u32, rq_psn: u32, p: &PairParams) {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut a = to_init(
        qp,
        access | Access::REMOTE_ATOMIC | Access::FLUSH_GLOBAL,
        peer,
        dest_qpn,
        rq_psn,
        p.mtu,
    );
    a.max_dest_rd_atomic = p.rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    a.ah_attr.traffic_class = p.traffic_class[0];
    qp.modify(&a, AttrMask::to_rtr(true)).expect("INIT->RTR");
}

/// RESET -> INIT with `access`; returns the attributes for INIT -> RTR
/// towards `peer` (state RTR, address, MTU, QPN, PSN), for the caller to
/// complete and apply.
fn to_init(
    qp: &mut dyn QpMachine,
    access: Access,
    peer: IpAddr,
    dest_qpn: u32,
    rq_psn: u32,
    mtu: Mtu,
) -> QpAttr {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: access,
        ..QpAttr::default()
    };
    qp.modify(
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .expect("RESET->INIT");
    a.qp_state = QpState::Rtr;
    a.ah_attr = AddressVector::to_ip(peer);
    a.path_mtu = mtu;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a
}

/// RESET -> INIT -> RTR (-> RTS when `rts`) with only the attributes UC
/// takes (`connect` sets RC-only ones, which UC refuses); remote write
/// allowed.
pub fn uc_connect(
    qp: &mut dyn QpMachine,
    peer: IpAddr,
    dest_qpn: u32,
    rq_psn: u32,
    sq_psn: u32,
    mtu: Mtu,
    rts: bool,
) {
    let mut a = to_init(
        qp,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        peer,
        dest_qpn,
        rq_psn,
        mtu,
    );
    qp.modify(&a, AttrMask::to_rtr(false)).expect("INIT->RTR");
    if rts {
        a.qp_state = QpState::Rts;
        a.sq_psn = sq_psn;
        qp.modify(&a, AttrMask::to_rts(false)).expect("RTR->RTS");
    }
}

/// RESET -> INIT -> RTR -> RTS with the attributes UD takes.
pub fn ud_up(qp: &mut dyn QpMachine, qkey: u32, sq_psn: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..QpAttr::default()
    };
    qp.modify(
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .expect("RESET->INIT");
    a.qp_state = QpState::Rtr;
    qp.modify(&a, AttrMask::STATE).expect("INIT->RTR");
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    qp.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN)
        .expect("RTR->RTS");
}

/// RTR -> RTS (RC attributes).
pub fn to_rts(qp: &mut dyn QpMachine, sq_psn: u32, p: &PairParams) {
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: p.rd_atomic,
        ..QpAttr::default()
    };
    qp.modify(&a, AttrMask::to_rts(true)).expect("RTR->RTS");
}

impl RcPair {
    /// A connected pair on a network with the given seed and faults.
    pub fn new(seed: u64, faults: Faults, p: PairParams) -> RcPair {
        let mut net = SimNet::new(seed, faults);
        let a_ip: IpAddr = "10.0.0.1".parse().expect("ip");
        let b_ip: IpAddr = "10.0.0.2".parse().expect("ip");
        let a = side(&mut net, a_ip, 0x11, &p);
        let b = side(&mut net, b_ip, 0x22, &p);
        let (pa, pb) = (p.psn & 0xff_ffff, (p.psn + 0x1000) & 0xff_ffff);
        connect(net.qp(a.id), b_ip, b.qpn, pb, pa, &p);
        let pb_params = PairParams {
            traffic_class: [p.traffic_class[1]; 2],
            ..p
        };
        connect(net.qp(b.id), a_ip, a.qpn, pa, pb, &pb_params);
        RcPair { net, a, b }
    }

    /// Registers `len` zeroed bytes on side `a` (true) or `b`.
    pub fn mr(&self, on_a: bool, len: usize, access: Access) -> Arc<MrInner> {
        let s = if on_a { &self.a } else { &self.b };
        s.keys.register_zeroed(PD, len, access).expect("alloc")
    }

    /// Posts a send WR on a side.
    pub fn post_send(&self, on_a: bool, wr: SendWr) {
        let s = if on_a { &self.a } else { &self.b };
        s.sq.post(wr).expect("send queue full");
    }

    /// Posts a receive WR.
    pub fn post_recv(&self, on_a: bool, wr_id: u64, sges: &[Sge]) {
        let s = if on_a { &self.a } else { &self.b };
        s.rq.post(RecvWr {
            wr_id,
            sg_list: sges.iter().copied().collect(),
        })
        .expect("recv queue full");
    }

    /// Runs until `n` completions are on the CQ (`send` or receive) of a
    /// side, or `limit_ns` of virtual time pass; returns them.
    pub fn wait(&mut self, on_a: bool, send: bool, n: usize, limit_ns: u64) -> Vec<Wc> {
        let cq = {
            let s = if on_a { &self.a } else { &self.b };
            if send {
                s.send_cq.clone()
            } else {
                s.recv_cq.clone()
            }
        };
        let mut out = Vec::new();
        self.net.run_until(limit_ns, |_| {
            while let Some(wc) = cq.poll_one() {
                out.push(wc);
            }
            out.len() >= n
        });
        out
    }

    /// Runs until the network is idle or `limit_ns` pass.
    pub fn settle(&mut self, limit_ns: u64) {
        self.net.run_until(limit_ns, |_| false);
    }
}

/// An SGE covering `len` bytes at offset `off` of a region.
pub fn sge(mr: &MrInner, off: u64, len: u32) -> Sge {
    Sge {
        addr: mr.iova() + off,
        length: len,
        lkey: mr.lkey(),
    }
}

/// A signaled send WR over the given SGEs.
pub fn signaled_wr(id: u64, op: WrOpcode, sges: &[Sge]) -> SendWr {
    let mut w = SendWr::new(id, op);
    w.flags = SendFlags::SIGNALED;
    w.sg_list = sges.iter().copied().collect();
    w
}
