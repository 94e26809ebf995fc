//! A target on the simulated network: the production endpoint's receive
//! path (ICRC check with the IP-ID solve, parsing, demux) and uroce's own
//! QP machines, deterministic from a seed. With a [`PlantedBug`] its
//! fuzzed QP is deliberately broken, which is how the fuzzer, the
//! minimizer and the oracles are tested: one of the three wrappers below,
//! or (with the feature `planted`) one of the provider's planted
//! mistakes (`uroce_provider::planted::Mistake`, a module that exists only
//! with that feature), active while the fuzzed QP (and only it: not the
//! control pair) runs.

use super::target::{
    access, Completion, Conn, ExposedKey, KeyKind, KeyState, Observation, Target, TargetError,
    EXPOSED_KEYS, PATTERN,
};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::Arc;
#[cfg(feature = "planted")]
use uroce_provider::planted::Mistake;
use uroce_provider::qp_attr::{AttrMask, ModifyError, QpAttr};
use uroce_provider::sans_io::memory::{KeyTable, MrInner, MwBind, MwType};
use uroce_provider::sans_io::net::sim::{Faults, SimNet};
use uroce_provider::sans_io::transport::{Nanos, RxMeta};
use uroce_provider::sans_io::transport::{QpMachine, Transmit};
use uroce_provider::testing::{self, sge, PairParams, Side};
use uroce_provider::types::{
    Access, Mtu, QpState, QpType, RecvWr, SendFlags, SendWr, Wc, WcFlags, WcStatus, WrOpcode,
};
use uroce_wire::packet::ParsedPacket;
use uroce_wire::{Operation, Position, Psn};

/// A deliberate bug in the fuzzed QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlantedBug {
    /// A WRITE request that arrives in the middle of a SEND message (an
    /// opcode sequence the responder must NAK, IBA 9.7.5.1.3) is placed
    /// into the private region: memory corruption behind two packets.
    WriteInsideSend,
    /// A READ request of more than half the region, once answered, moves
    /// the QP to SQD (a state a responder never enters on its own).
    LongReadStallsQp,
    /// A ghost ACK (for a PSN the QP never sent) makes the requester
    /// write into the private region, as if it completed a stale request
    /// into a stale buffer.
    GhostAck,
    /// An RDMA WRITE through a type 2 memory window is checked against
    /// another QP than the one that carries it (IBA 10.6.7.2.4: a type 2
    /// window is usable only through the QP it is bound to): a window
    /// bound to another QP grants the fuzzer its memory.
    WindowAnyQp,
    /// A one-line mistake in the provider's transports or key checks,
    /// planted in the fuzzed QP (the battery's). Only with the feature
    /// `planted`: without it the provider has no planted mistakes.
    #[cfg(feature = "planted")]
    #[serde(skip)]
    Mistake(Mistake),
}

impl PlantedBug {
    /// Parses a name as `--target sim:BUG` takes it: a wrapper's, or
    /// (built with the feature `planted`) a planted mistake's.
    pub fn from_name(s: &str) -> Option<PlantedBug> {
        match s {
            "write-inside-send" => Some(PlantedBug::WriteInsideSend),
            "long-read" => Some(PlantedBug::LongReadStallsQp),
            "ghost-ack" => Some(PlantedBug::GhostAck),
            "window-any-qp" => Some(PlantedBug::WindowAnyQp),
            #[cfg(feature = "planted")]
            _ => Mistake::from_name(s).map(PlantedBug::Mistake),
            #[cfg(not(feature = "planted"))]
            _ => None,
        }
    }

    /// The name `--target sim:BUG` takes.
    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::WriteInsideSend => "write-inside-send",
            PlantedBug::LongReadStallsQp => "long-read",
            PlantedBug::GhostAck => "ghost-ack",
            PlantedBug::WindowAnyQp => "window-any-qp",
            #[cfg(feature = "planted")]
            PlantedBug::Mistake(m) => m.name(),
        }
    }
}

/// The `QpMachine` methods a wrapper of the fuzzed QP passes to its
/// `inner` QP as they are (its state and attributes are the real QP's).
macro_rules! pass_to_inner {
    () => {
        fn qpn(&self) -> u32 {
            self.inner.qpn()
        }
        fn qp_type(&self) -> QpType {
            self.inner.qp_type()
        }
        fn state(&self) -> QpState {
            self.inner.state()
        }
        fn attr(&self) -> QpAttr {
            self.inner.attr()
        }
    };
}

/// The fuzzed QP with a planted mistake: every call into it runs with the
/// mistake planted on this thread (the simulated network runs on the
/// caller's), so that the control pair on the same network runs clean.
#[cfg(feature = "planted")]
#[derive(Debug)]
struct WithMistake {
    inner: Box<dyn QpMachine>,
    mistake: Mistake,
}

#[cfg(feature = "planted")]
impl WithMistake {
    fn run<R>(&self, f: impl FnOnce(&dyn QpMachine) -> R) -> R {
        uroce_provider::planted::with(Some(self.mistake), || f(&*self.inner))
    }
    fn run_mut<R>(&mut self, f: impl FnOnce(&mut dyn QpMachine) -> R) -> R {
        uroce_provider::planted::with(Some(self.mistake), || f(&mut *self.inner))
    }
}

#[cfg(feature = "planted")]
impl QpMachine for WithMistake {
    pass_to_inner!();
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        self.run_mut(|q| q.modify(attr, mask))
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        self.run_mut(|q| q.handle_packet(now, meta, pkt))
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        self.run_mut(|q| q.poll_transmit(now, buf))
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        self.run(|q| q.poll_timeout())
    }
    fn handle_timeout(&mut self, now: Nanos) {
        self.run_mut(|q| q.handle_timeout(now))
    }
    fn inflight(&self) -> u32 {
        self.inner.inflight()
    }
    fn set_throttled(&mut self, on: bool) {
        self.inner.set_throttled(on)
    }
    fn only_acks_to_send(&self) -> bool {
        self.inner.only_acks_to_send()
    }
}

/// The fuzzed QP with a planted bug: it watches the packets it is given
/// and misbehaves as the bug says, then lets the real QP handle them.
#[derive(Debug)]
struct Planted {
    inner: Box<dyn QpMachine>,
    bug: PlantedBug,
    private: Arc<MrInner>,
    /// The fuzzed QP's key table.
    keys: Arc<KeyTable>,
    in_send: bool,
    /// The next PSN the QP sends (as seen on its packets).
    next_sent: Option<Psn>,
}

impl QpMachine for Planted {
    pass_to_inner!();
    fn modify(&mut self, attr: &QpAttr, mask: AttrMask) -> Result<(), ModifyError> {
        self.inner.modify(attr, mask)
    }
    fn handle_packet(&mut self, now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let expected = self.inner.attr().rq_psn;
        let in_order = pkt.bth.psn.value() == expected;
        let info = pkt.info;
        match self.bug {
            PlantedBug::WriteInsideSend if info.is_request && in_order => {
                if info.operation == Operation::RdmaWrite && self.in_send {
                    let n = pkt.payload.len().min(self.private.len());
                    let _ = self.private.write(0, &pkt.payload[..n]);
                    let _ = self.private.fill(0, 1, !PATTERN);
                }
                if info.operation == Operation::Send {
                    self.in_send = matches!(info.position, Position::First | Position::Middle);
                }
            }
            _ => {}
        }
        if self.bug == PlantedBug::WindowAnyQp
            && in_order
            && info.is_request
            && info.operation == Operation::RdmaWrite
        {
            if let Some(r) = pkt.reth() {
                let len = pkt.payload.len() as u64;
                let need = Access::REMOTE_WRITE;
                // The check made for the wrong QP: the control QP's.
                if let Ok((mr, off)) =
                    self.keys
                        .check_rkey(r.rkey, testing::PD, CONTROL_QPN, r.va, len, need)
                {
                    let _ = mr.write(off, pkt.payload);
                }
            }
        }
        if self.bug == PlantedBug::GhostAck && info.operation == Operation::Acknowledge {
            // PSNs from the next one to send on are ghosts (within half
            // the PSN space: the rest are old).
            let next = self.next_sent.unwrap_or(Psn::new(self.inner.attr().sq_psn));
            if pkt.bth.psn.diff(next) >= 0 {
                let _ = self.private.fill(0, 8, !PATTERN);
            }
        }
        self.inner.handle_packet(now, meta, pkt);
        if self.bug == PlantedBug::LongReadStallsQp
            && info.operation == Operation::RdmaReadRequest
            && in_order
            && pkt.reth().is_some_and(|r| r.dma_len > REGION as u32 / 2)
        {
            let a = QpAttr {
                qp_state: QpState::Sqd,
                ..QpAttr::default()
            };
            let _ = self.inner.modify(&a, AttrMask::STATE);
        }
    }
    fn poll_transmit(&mut self, now: Nanos, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.inner.poll_transmit(now, buf)?;
        if let Ok(p) = uroce_wire::packet::parse(&buf[..t.len]) {
            if p.info.is_request {
                let psn = p.bth.psn.next();
                if self.next_sent.is_none_or(|n| psn.diff(n) >= 0) {
                    self.next_sent = Some(psn);
                }
            }
        }
        Some(t)
    }
    fn poll_timeout(&self) -> Option<Nanos> {
        self.inner.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Nanos) {
        self.inner.handle_timeout(now)
    }
    fn inflight(&self) -> u32 {
        self.inner.inflight()
    }
}

const TARGET: [u8; 4] = [10, 77, 0, 1];
const PEER: [u8; 4] = [10, 77, 0, 2];
const FUZZER: [u8; 4] = [10, 77, 0, 100];
const QPN: u32 = 0x111;
const CONTROL_QPN: u32 = 0x222;
const PEER_QPN: u32 = 0x333;
const FUZZER_QPN: u32 = 0x777;
const QKEY: u32 = 0x1111_1111;
/// Size of the exposed and private regions.
pub const REGION: usize = 4096;

struct Live {
    net: SimNet,
    fuzzed: Side,
    exposed: Arc<MrInner>,
    private: Arc<MrInner>,
    control: Side,
    peer: Side,
    control_mr: Arc<MrInner>,
    peer_mr: Arc<MrInner>,
    /// Memory no exposed key lets the fuzzer write.
    guarded: Vec<Guarded>,
    seen_trace: usize,
}

/// Bytes no exposed key lets the fuzzer write: (region, offset, length),
/// filled with [`PATTERN`].
type Guarded = (Arc<MrInner>, usize, usize);

/// Size of the memory behind each exposed region (each window has a
/// quarter of one).
const KEY_REGION: usize = 1024;

/// The keys of [`EXPOSED_KEYS`], set up in `keys` (the fuzzed QP's table,
/// PD [`testing::PD`]) for the fuzzed QP `QPN`, with the memory that no key
/// lets the fuzzer write.
fn expose_keys(keys: &KeyTable) -> (Vec<ExposedKey>, Vec<Guarded>) {
    let mut out = Vec::new();
    let mut guarded = Vec::new();
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let all = remote | Access::LOCAL_WRITE;
    let region = |pd: u32, acc: Access| {
        let mr = keys.register_zeroed(pd, KEY_REGION, acc).expect("alloc");
        let _ = mr.fill(0, KEY_REGION, PATTERN);
        mr
    };
    let key = |name: &str, kind, mr_key: u32, va, access, state| ExposedKey {
        name: name.into(),
        key: mr_key,
        kind,
        va,
        len: KEY_REGION as u32,
        access,
        same_pd: true,
        bound_to_qp: true,
        state,
    };
    // Regions: (rights, PD, guarded).
    let regions = [
        (Access::REMOTE_READ, testing::PD, true),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            testing::PD,
            false,
        ),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            testing::PD,
            false,
        ),
        (Access::empty(), testing::PD, true),
        (all, testing::PD + 1, true),
        (all, testing::PD, true),
        (all | Access::ZERO_BASED, testing::PD, false),
    ];
    for (i, (acc, pd, guard)) in regions.into_iter().enumerate() {
        let mr = region(pd, acc);
        let mut k = key(
            EXPOSED_KEYS[i],
            KeyKind::Region,
            mr.rkey(),
            mr.iova(),
            // (Zero-based shows in `va`, as the agent registers it: with
            // an iova of 0, not a flag.)
            (acc - Access::ZERO_BASED).bits(),
            KeyState::Valid,
        );
        k.same_pd = pd == testing::PD;
        if EXPOSED_KEYS[i] == "deregistered" {
            keys.deregister(&mr);
            k.state = KeyState::Deregistered;
        }
        // (A deregistered region's bytes are out of every access's reach,
        // the observer's too: `MrInner` refuses to touch them.)
        if guard && k.state == KeyState::Valid {
            guarded.push((mr, 0, KEY_REGION));
        }
        out.push(k);
    }
    // Windows: four over one region with the right to bind them, one
    // range each; the last two ranges are guarded.
    let backing = region(testing::PD, Access::LOCAL_WRITE | Access::MW_BIND);
    let win_acc = access::REMOTE;
    let bind = |kind: MwType, i: usize, qpn: u32| {
        let mw = keys.alloc_mw(testing::PD, kind);
        let b = MwBind {
            mw: mw.clone(),
            mw_rkey: mw.rkey(),
            new_rkey: 0x40 + i as u32,
            mr_lkey: backing.lkey(),
            addr: backing.iova() + (i * KEY_REGION / 4) as u64,
            len: (KEY_REGION / 4) as u64,
            access: remote,
        };
        let rkey = keys.bind_mw(&b, testing::PD, qpn).expect("a valid bind");
        (mw, rkey, b.addr)
    };
    let quarter = |name, kind, rkey, va, state| ExposedKey {
        len: (KEY_REGION / 4) as u32,
        ..key(name, kind, rkey, va, win_acc, state)
    };
    let (_, rkey, va) = bind(MwType::Type1, 0, QPN);
    out.push(quarter(
        "window1",
        KeyKind::Window1,
        rkey,
        va,
        KeyState::Valid,
    ));
    let (_, rkey, va) = bind(MwType::Type2, 1, QPN);
    out.push(quarter(
        "window2",
        KeyKind::Window2,
        rkey,
        va,
        KeyState::Valid,
    ));
    let (_, rkey, va) = bind(MwType::Type2, 2, CONTROL_QPN);
    out.push(ExposedKey {
        bound_to_qp: false,
        ..quarter(
            "window2-other-qp",
            KeyKind::Window2,
            rkey,
            va,
            KeyState::Valid,
        )
    });
    let (_, rkey, va) = bind(MwType::Type2, 3, QPN);
    keys.invalidate_rkey(rkey, testing::PD, QPN, false)
        .expect("a bound type 2 window");
    out.push(quarter(
        "window2-invalidated",
        KeyKind::Window2,
        rkey,
        va,
        KeyState::Invalidated,
    ));
    let unbound = keys.alloc_mw(testing::PD, MwType::Type1);
    out.push(ExposedKey {
        len: 0,
        access: 0,
        ..key(
            "window-unbound",
            KeyKind::Window1,
            unbound.rkey(),
            0,
            0,
            KeyState::Unbound,
        )
    });
    guarded.push((backing, KEY_REGION / 2, KEY_REGION / 2));
    (out, guarded)
}

/// The simulated target.
pub struct SimTarget {
    seed: u64,
    bug: Option<PlantedBug>,
    live: Option<Live>,
    cases: u64,
}

impl SimTarget {
    /// A target whose network is seeded with `seed`, with `bug` planted.
    pub fn new(seed: u64, bug: Option<PlantedBug>) -> SimTarget {
        SimTarget {
            seed,
            bug,
            live: None,
            cases: 0,
        }
    }

    fn params(psn: u32) -> PairParams {
        PairParams {
            mtu: Mtu::Mtu1024,
            timeout: 8,
            retry_cnt: 3,
            rnr_retry: 2,
            min_rnr_timer: 1,
            rd_atomic: 4,
            psn,
            depth: 64,
            traffic_class: [0, 0],
        }
    }

    /// A SEND and an RDMA WRITE from the control QP's peer; both must
    /// complete and land.
    fn control_check(l: &mut Live) -> bool {
        let _ = l.control_mr.fill(0, 64, 0);
        let ok = l
            .control
            .rq
            .post(RecvWr {
                wr_id: 0xc0,
                sg_list: [sge(&l.control_mr, 0, 32)].into_iter().collect(),
            })
            .is_ok();
        let _ = l.peer_mr.fill(0, 64, 0xc3);
        let mut send = SendWr::new(0xc1, WrOpcode::Send);
        send.flags = SendFlags::SIGNALED;
        send.sg_list = [sge(&l.peer_mr, 0, 32)].into_iter().collect();
        let mut write = SendWr::new(0xc2, WrOpcode::RdmaWrite);
        write.flags = SendFlags::SIGNALED;
        write.sg_list = [sge(&l.peer_mr, 0, 32)].into_iter().collect();
        write.remote_addr = l.control_mr.iova() + 32;
        write.rkey = l.control_mr.rkey();
        let ok = ok && l.peer.sq.post(send).is_ok() && l.peer.sq.post(write).is_ok();
        if !ok {
            return false;
        }
        let mut done = 0;
        let mut good = true;
        l.net.run_until(2_000_000_000, |_| {
            while let Some(wc) = l.peer.send_cq.poll_one() {
                done += 1;
                good &= wc.status == uroce_provider::types::WcStatus::Success;
            }
            while let Some(wc) = l.control.recv_cq.poll_one() {
                done += 1;
                good &= wc.status == uroce_provider::types::WcStatus::Success;
            }
            done >= 3
        });
        let mut b = [0u8; 64];
        good && done == 3 && l.control_mr.read(0, &mut b).is_ok() && b.iter().all(|&x| x == 0xc3)
    }
}

/// What the fuzzer keeps of a completion: everything, with the details
/// (opcode, length, immediate, invalidated key, source QP) of a
/// successful one only, as the verbs define them only there.
fn completion(wc: &Wc, recv: bool) -> Completion {
    let ok = wc.status == WcStatus::Success;
    let flag = |f: WcFlags| ok && wc.wc_flags.contains(f);
    Completion {
        wr_id: wc.wr_id,
        status: wc.status as u32,
        recv,
        opcode: ok.then_some(wc.opcode as u32),
        byte_len: ok.then_some(wc.byte_len),
        imm: flag(WcFlags::WITH_IMM).then_some(wc.imm_data),
        invalidated_rkey: flag(WcFlags::WITH_INV).then_some(wc.invalidated_rkey),
        src_qp: (ok && recv && wc.src_qp != 0).then_some(wc.src_qp),
    }
}

fn ip(o: [u8; 4]) -> IpAddr {
    IpAddr::from(o)
}

impl Target for SimTarget {
    fn name(&self) -> String {
        match self.bug {
            Some(b) => format!("sim (planted bug {})", b.name()),
            None => "sim".into(),
        }
    }

    fn setup(&mut self, qp_type: QpType, recvs: u32) -> Result<Conn, TargetError> {
        self.cases += 1;
        let mut net = SimNet::new(self.seed ^ self.cases, Faults::default());
        net.trace = Some(Vec::new());
        let psn = (self.seed as u32).wrapping_mul(2654435761) & 0xff_ffff;
        let p = Self::params(psn);
        let (fuzz_psn, own_psn) = (psn, psn ^ 0x5555);
        let bug = self.bug;
        let mut private_slot = None;
        let fuzzed = testing::side_with(&mut net, ip(TARGET), QPN, &p, |cfg| {
            let private = cfg
                .keys
                .register_zeroed(testing::PD, REGION, Access::LOCAL_WRITE)
                .expect("alloc");
            private_slot = Some(private.clone());
            let keys = cfg.keys.clone();
            let qp = uroce_provider::sans_io::transport::new_qp(qp_type, cfg).expect("capacities");
            match bug {
                #[cfg(feature = "planted")]
                Some(PlantedBug::Mistake(mistake)) => Box::new(WithMistake { inner: qp, mistake }),
                Some(bug) => Box::new(Planted {
                    inner: qp,
                    bug,
                    private,
                    keys,
                    in_send: false,
                    next_sent: None,
                }),
                None => qp,
            }
        });
        let private = private_slot.expect("set by the closure");
        private
            .fill(0, REGION, PATTERN)
            .map_err(|e| TargetError::Io(e.to_string()))?;
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // The exposed region takes FLUSHes for global visibility (as the
        // QP does: `testing::to_rtr`), not for persistence.
        let exposed_access = all | Access::FLUSH_GLOBAL;
        let exposed = fuzzed
            .keys
            .register_zeroed(testing::PD, REGION, exposed_access)
            .expect("alloc");
        exposed
            .fill(0, REGION, PATTERN)
            .map_err(|e| TargetError::Io(e.to_string()))?;
        let rbuf = fuzzed
            .keys
            .register_zeroed(testing::PD, REGION, Access::LOCAL_WRITE)
            .expect("alloc");
        {
            let qp = net.qp(fuzzed.id);
            match qp_type {
                QpType::Rc => testing::connect(qp, ip(FUZZER), FUZZER_QPN, fuzz_psn, own_psn, &p),
                QpType::Uc => {
                    testing::uc_connect(qp, ip(FUZZER), FUZZER_QPN, fuzz_psn, own_psn, p.mtu, true)
                }
                QpType::Ud => testing::ud_up(qp, QKEY, own_psn),
            }
        }
        for i in 0..recvs {
            let _ = fuzzed.rq.post(RecvWr {
                wr_id: u64::from(i),
                sg_list: [sge(&rbuf, 0, REGION as u32)].into_iter().collect(),
            });
        }
        // The control pair: an RC QP on the target and its own peer.
        let rc =
            |cfg| uroce_provider::sans_io::transport::new_qp(QpType::Rc, cfg).expect("capacities");
        let control = testing::side_with(&mut net, ip(TARGET), CONTROL_QPN, &p, rc);
        let peer = testing::side_with(&mut net, ip(PEER), PEER_QPN, &p, rc);
        testing::connect(net.qp(control.id), ip(PEER), PEER_QPN, 1000, 2000, &p);
        testing::connect(net.qp(peer.id), ip(TARGET), CONTROL_QPN, 2000, 1000, &p);
        let control_mr = control
            .keys
            .register_zeroed(testing::PD, 64, all)
            .expect("alloc");
        let peer_mr = peer
            .keys
            .register_zeroed(testing::PD, 64, all)
            .expect("alloc");
        let (keys, guarded) = expose_keys(&fuzzed.keys);
        let conn = Conn {
            qp_type,
            target: ip(TARGET),
            fuzzer: ip(FUZZER),
            src_port: uroce_wire::ROCEV2_UDP_PORT,
            qpn: QPN,
            fuzzer_qpn: FUZZER_QPN,
            control_qpn: CONTROL_QPN,
            rq_psn: fuzz_psn,
            sq_psn: own_psn,
            va: exposed.iova(),
            len: REGION as u32,
            rkey: exposed.rkey(),
            private_rkey: private.rkey(),
            qkey: QKEY,
            mtu: p.mtu.bytes(),
            recvs_posted: recvs,
            keys,
            recv_len: Some(REGION as u32),
            min_rnr_timer: Some(Self::params(0).min_rnr_timer),
            access: Some(exposed_access.bits()),
            qp_access: Some(net.qp(fuzzed.id).attr().qp_access_flags.bits()),
            // uroce implements both (and its drop-in announces both).
            ops_1_5: Some(crate::target::OPS_FLUSH | crate::target::OPS_ATOMIC_WRITE),
        };
        self.live = Some(Live {
            net,
            fuzzed,
            exposed,
            private,
            control,
            peer,
            control_mr,
            peer_mr,
            guarded,
            seen_trace: 0,
        });
        Ok(conn)
    }

    fn revives(&self) -> bool {
        true
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn post(&mut self, wr: &super::case::Post) -> Result<(), TargetError> {
        use super::case::PostOp;
        let l = self
            .live
            .as_mut()
            .ok_or_else(|| TargetError::Io("no QP set up".into()))?;
        let (opcode, len) = match wr.op {
            PostOp::Send => (WrOpcode::Send, wr.len),
            PostOp::Write => (WrOpcode::RdmaWrite, wr.len),
            PostOp::Read => (WrOpcode::RdmaRead, wr.len),
            PostOp::CompareSwap => (WrOpcode::AtomicCmpAndSwp, 8),
            PostOp::FetchAdd => (WrOpcode::AtomicFetchAndAdd, 8),
        };
        let mut w = SendWr::new(wr.wr_id, opcode);
        w.flags = SendFlags::SIGNALED;
        if len > 0 {
            w.sg_list = [sge(&l.exposed, u64::from(wr.local_off), len)]
                .into_iter()
                .collect();
        }
        w.remote_addr = wr.remote_va;
        w.rkey = wr.rkey;
        if l.net.qp(l.fuzzed.id).qp_type() == QpType::Ud {
            // A datagram to the fuzzer's QP, with the target's Q_Key.
            w.ud = Some(uroce_provider::types::UdDest {
                ip: ip(FUZZER),
                remote_qpn: FUZZER_QPN,
                remote_qkey: QKEY,
                tclass: 0,
                hop_limit: 64,
            });
        }
        (w.compare_add, w.swap) = match wr.op {
            PostOp::CompareSwap => (wr.compare, wr.swap_add),
            _ => (wr.swap_add, 0),
        };
        l.fuzzed
            .sq
            .post(w)
            .map_err(|e| TargetError::Io(format!("post: {e:?}")))
    }

    // The packet is handled at once, before a post that follows it in the
    // case goes out: the target sees the case's steps in their order (as
    // the model reads them).
    fn send(&mut self, packet: &[u8]) {
        if let Some(l) = self.live.as_mut() {
            l.net.inject(ip(FUZZER), ip(TARGET), packet.to_vec());
            l.net.deliver_due();
        }
    }

    fn send_from(&mut self, src: IpAddr, packet: &[u8]) -> Result<(), TargetError> {
        if let Some(l) = self.live.as_mut() {
            l.net.inject(src, ip(TARGET), packet.to_vec());
            l.net.deliver_due();
        }
        Ok(())
    }

    fn wait(&mut self, us: u32) -> Vec<Vec<u8>> {
        let Some(l) = self.live.as_mut() else {
            return Vec::new();
        };
        l.net.run_until(u64::from(us) * 1000, |_| false);
        let trace = l.net.trace.as_mut().expect("tracing");
        let out = trace[l.seen_trace..]
            .iter()
            .filter(|(_, _, dst, _)| *dst == ip(FUZZER))
            .map(|(_, _, _, b)| b.clone())
            .collect();
        // What the fuzzer has seen need not be kept.
        trace.clear();
        l.seen_trace = 0;
        out
    }

    fn observe(&mut self) -> Result<Observation, TargetError> {
        let Some(l) = self.live.as_mut() else {
            return Err(TargetError::Io("no QP set up".into()));
        };
        // Let timers run out (retransmissions, RNR waits) for a while.
        l.net.run_until(200_000_000, |_| false);
        let mut completions = Vec::new();
        while let Some(wc) = l.fuzzed.send_cq.poll_one() {
            completions.push(completion(&wc, false));
        }
        while let Some(wc) = l.fuzzed.recv_cq.poll_one() {
            completions.push(completion(&wc, true));
        }
        let mut events = Vec::new();
        while let Some(e) = l.fuzzed.events.get(Some(std::time::Duration::ZERO)) {
            events.push(e.event_type.as_str().to_string());
        }
        let mut exposed = vec![0u8; REGION];
        let _ = l.exposed.read(0, &mut exposed);
        let mut priv_bytes = vec![0u8; REGION];
        let intact = |mr: &MrInner, off: usize, len: usize| {
            let mut b = vec![0u8; len];
            mr.read(off, &mut b).is_ok() && b.iter().all(|&x| x == PATTERN)
        };
        let private_intact = l.private.read(0, &mut priv_bytes).is_ok()
            && priv_bytes.iter().all(|&b| b == PATTERN)
            && l.guarded.iter().all(|(mr, o, n)| intact(mr, *o, *n));
        let qp_state = l.net.qp(l.fuzzed.id).state();
        let control_ok = Self::control_check(l);
        Ok(Observation {
            alive: true,
            qp_state,
            completions,
            events,
            exposed,
            private_intact,
            control_ok,
            log: Vec::new(),
            answers: None,
        })
    }
}
