//! A stateful fuzz harness (issue #12): two connected QPs (RC, UC or UD)
//! on the simulated network, driven by a byte string that the fuzzer
//! chooses: work requests posted on either side, forged packets injected
//! at either side (valid headers with chosen opcodes, PSNs, lengths, keys,
//! AETHs, READ responses), packets dropped or duplicated, QPs moved to
//! ERR, time passing. After every step and at the end the invariants are
//! checked (they panic, which is what the fuzzer looks for):
//!
//! * nothing panics;
//! * no byte outside the regions a side granted its peer changes except
//!   through that side's own work requests: a private region, never
//!   named in any WR, keeps its pattern;
//! * every posted work request completes exactly once (once the QPs have
//!   had time to finish or fail), and no completion names a WR that was
//!   never posted;
//! * no successful receive completion for a message that was never sent
//!   (by the peer's WRs or by a forged packet that ends a message).
//!
//! The same harness runs as a property test under `cargo test`
//! (`fuzz/uroce-fuzz/tests/pair_harness.rs`) and as cargo-fuzz targets
//! (`fuzz/fuzz_targets/{rc,uc,ud}_pair.rs`).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use uroce_provider::qp_attr::{AttrMask, QpAttr};
use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::{Faults, SimNet, Verdict, Wire};
use uroce_provider::sans_io::transport::QpConfig;
use uroce_provider::testing::{
    config, connect, sge, side_with, uc_connect, ud_up, PairParams, Side,
};
use uroce_provider::types::{
    Access, Mtu, QpState, QpType, RecvWr, SendFlags, SendWr, UdDest, Wc, WcStatus, WrOpcode,
};
use uroce_wire::packet::Headers;
use uroce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ext, Opcode,
    OpcodeInfo, Psn, RethRepr, Transport,
};

const SEC: u64 = 1_000_000_000;
const PD: u32 = 1;
const QKEY: u32 = 0x1111_1111;
/// Size of each side's regions.
const REGION: usize = 8192;
/// Work requests posted per side at most (below the CQs' capacity, so no
/// completion is lost to an overflow).
const MAX_WRS: u64 = 48;
const PATTERN: u8 = 0xa5;
/// Size of the private region (a canary: its key is offered to the peer
/// as a wrong key, its bytes must never change).
const PRIVATE: usize = 512;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// Reads the fuzzer's bytes; zeros once they run out.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
}

/// One side of the pair and what the harness knows about it.
struct End {
    side: Side,
    /// Source of sends and sink of READs, atomics and receives.
    local: Arc<MrInner>,
    /// Granted to the peer (remote write, read, atomic).
    exposed: Arc<MrInner>,
    /// Never named in any WR: must keep its pattern.
    private: Arc<MrInner>,
    /// Send WRs posted: wr_id -> completions seen.
    sends: HashMap<u64, u32>,
    /// Receive WRs posted: wr_id -> completions seen.
    recvs: HashMap<u64, u32>,
    /// Successful receive completions.
    received: u64,
    /// Messages that may complete a receive WR here: the peer's SENDs
    /// and WRITEs with immediate, and forged packets that end one.
    may_receive: u64,
    /// Messages the network duplicated (UC): may be received twice.
    dup_allowance: u64,
    next_id: u64,
}

impl End {
    fn new(side: Side) -> End {
        let r = |len, a| side.keys.register_zeroed(PD, len, a).expect("alloc");
        let (local, exposed) = (r(REGION, ALL), r(REGION, ALL));
        let private = r(PRIVATE, Access::LOCAL_WRITE);
        private.fill(0, PRIVATE, PATTERN).expect("fill");
        End {
            side,
            local,
            exposed,
            private,
            sends: HashMap::new(),
            recvs: HashMap::new(),
            received: 0,
            may_receive: 0,
            dup_allowance: 0,
            next_id: 1,
        }
    }

    /// Polls both CQs and checks each completion against what was posted.
    fn poll(&mut self) {
        while let Some(wc) = self.side.send_cq.poll_one() {
            let n = self.sends.get_mut(&wc.wr_id);
            let n = n.unwrap_or_else(|| panic!("send completion for a WR never posted: {wc:?}"));
            *n += 1;
            assert_eq!(*n, 1, "send WR {} completed twice", wc.wr_id);
        }
        while let Some(wc) = self.side.recv_cq.poll_one() {
            self.check_recv(&wc);
        }
    }

    fn check_recv(&mut self, wc: &Wc) {
        let n = self.recvs.get_mut(&wc.wr_id);
        let n = n.unwrap_or_else(|| panic!("receive completion for a WR never posted: {wc:?}"));
        *n += 1;
        assert_eq!(*n, 1, "receive WR {} completed twice", wc.wr_id);
        if wc.status == WcStatus::Success {
            self.received += 1;
            assert!(
                self.received <= self.may_receive + self.dup_allowance,
                "{} successful receives, at most {} messages were sent ({} duplicated)",
                self.received,
                self.may_receive,
                self.dup_allowance
            );
        }
    }

    fn private_intact(&self) -> bool {
        let mut b = [0u8; PRIVATE];
        self.private.read(0, &mut b).is_ok() && b.iter().all(|&x| x == PATTERN)
    }
}

/// The pair and its scripted faults.
struct Pair {
    kind: QpType,
    net: SimNet,
    ends: [End; 2],
    /// Verdicts for the next packets sent (then `Pass`).
    verdicts: Arc<Mutex<VecDeque<Verdict>>>,
    /// UC only: message-ending packets the network duplicated, by
    /// receiving side. UC has no duplicate detection (as rxe: a FIRST or
    /// ONLY packet starts a message whatever its PSN), so a duplicated
    /// message may be received twice.
    dup_ends: Arc<Mutex<[u64; 2]>>,
    mtu: u32,
}

fn ip(i: usize) -> IpAddr {
    IpAddr::from([10, 0, 0, 1 + i as u8])
}

impl Pair {
    fn new(kind: QpType, seed: u64, mtu: Mtu) -> Pair {
        let mut net = SimNet::new(seed, Faults::default());
        let p = PairParams {
            mtu,
            timeout: 8,
            retry_cnt: 2,
            rnr_retry: 1,
            min_rnr_timer: 1,
            rd_atomic: 2,
            psn: (seed as u32) & 0xff_ffff,
            depth: 64,
            traffic_class: [0, 0],
        };
        let make = |cfg: QpConfig| {
            uroce_provider::sans_io::transport::new_qp(kind, cfg).expect("capacities")
        };
        let a = side_with(&mut net, ip(0), 0x11, &p, make);
        let b = side_with(&mut net, ip(1), 0x22, &p, make);
        let (pa, pb) = (p.psn, (p.psn + 0x1000) & 0xff_ffff);
        for (me, peer, rq, sq) in [(&a, &b, pb, pa), (&b, &a, pa, pb)] {
            let qp = net.qp(me.id);
            match kind {
                QpType::Rc => connect(qp, peer.ip, peer.qpn, rq, sq, &p),
                QpType::Uc => uc_connect(qp, peer.ip, peer.qpn, rq, sq, mtu, true),
                QpType::Ud => ud_up(qp, QKEY, sq),
            }
        }
        let verdicts: Arc<Mutex<VecDeque<Verdict>>> = Arc::default();
        let v = verdicts.clone();
        let dup_ends: Arc<Mutex<[u64; 2]>> = Arc::default();
        let d = dup_ends.clone();
        let uc = kind == QpType::Uc;
        net.set_filter(move |w: &Wire<'_>| {
            let verdict = v.lock().map_or(Verdict::Pass, |mut q| {
                q.pop_front().unwrap_or(Verdict::Pass)
            });
            let info = w.pkt.info;
            if uc
                && verdict == Verdict::Duplicate
                && info.is_request
                && info.position.ends_message()
                && (info.operation == uroce_wire::Operation::Send || info.has_imm())
            {
                if let Ok(mut d) = d.lock() {
                    d[usize::from(w.dst == ip(1))] += 1;
                }
            }
            verdict
        });
        Pair {
            kind,
            net,
            ends: [End::new(a), End::new(b)],
            verdicts,
            dup_ends,
            mtu: mtu.bytes(),
        }
    }

    fn check(&mut self) {
        let dups = self.dup_ends.lock().map_or([0; 2], |d| *d);
        for (e, dup) in self.ends.iter_mut().zip(dups) {
            e.dup_allowance = dup;
            e.poll();
            assert!(e.private_intact(), "a private region changed");
        }
    }

    /// Posts a send WR chosen by the input on side `s`.
    fn post_send(&mut self, s: usize, inp: &mut Input<'_>) {
        let kind = self.kind;
        let ops: &[WrOpcode] = match kind {
            QpType::Rc => &[
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
                WrOpcode::RdmaRead,
                WrOpcode::AtomicCmpAndSwp,
                WrOpcode::AtomicFetchAndAdd,
                WrOpcode::SendWithInv,
            ],
            QpType::Uc => &[
                WrOpcode::Send,
                WrOpcode::SendWithImm,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
            ],
            QpType::Ud => &[WrOpcode::Send, WrOpcode::SendWithImm],
        };
        let op = ops[inp.u8() as usize % ops.len()];
        let len = u32::from(inp.u16()) % (REGION as u32 / 2 + 1);
        let off = u64::from(inp.u16()) % (REGION as u64 / 2);
        let key_choice = inp.u8();
        let (me, peer) = (s, 1 - s);
        if self.ends[me].next_id > MAX_WRS {
            return;
        }
        let id = self.ends[me].next_id;
        let e = &self.ends[me];
        let p = &self.ends[peer];
        let atomic = matches!(op, WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd);
        let len = if atomic { 8 } else { len };
        let mut w = SendWr::new(id, op);
        w.flags = SendFlags::SIGNALED;
        if key_choice & 0x40 != 0 && len <= 64 && !atomic && op != WrOpcode::RdmaRead {
            w.flags |= SendFlags::INLINE;
            w.inline_data = vec![key_choice; len as usize].into();
        } else {
            w.sg_list = [sge(&e.local, off & !7, len)].into_iter().collect();
        }
        // The peer's exposed region, sometimes a wrong key or range.
        w.remote_addr = p.exposed.iova() + (off & !7);
        w.rkey = match key_choice & 3 {
            0 => p.private.rkey(),
            1 => inp.u32(),
            _ => p.exposed.rkey(),
        };
        w.compare_add = inp.u64();
        w.swap = inp.u64();
        w.imm_data = u32::from(key_choice);
        w.invalidate_rkey = p.exposed.rkey();
        if kind == QpType::Ud {
            w.ud = Some(UdDest {
                ip: p.side.ip,
                remote_qpn: p.side.qpn,
                remote_qkey: if key_choice & 8 != 0 { QKEY ^ 1 } else { QKEY },
                tclass: 0,
                hop_limit: 64,
            });
        }
        if e.side.sq.post(w).is_ok() {
            let e = &mut self.ends[me];
            e.sends.insert(id, 0);
            e.next_id += 1;
            if matches!(
                op,
                WrOpcode::Send
                    | WrOpcode::SendWithImm
                    | WrOpcode::SendWithInv
                    | WrOpcode::RdmaWriteWithImm
            ) {
                self.ends[peer].may_receive += 1;
            }
        }
    }

    fn post_recv(&mut self, s: usize, inp: &mut Input<'_>) {
        let len = u32::from(inp.u16()) % (REGION as u32 / 2 + 1);
        let off = u64::from(inp.u16()) % (REGION as u64 / 2);
        let e = &mut self.ends[s];
        if e.next_id > MAX_WRS {
            return;
        }
        let id = e.next_id | 1 << 32;
        let wr = RecvWr {
            wr_id: id,
            sg_list: [sge(&e.local, off, len)].into_iter().collect(),
        };
        if e.side.rq.post(wr).is_ok() {
            e.recvs.insert(id, 0);
            e.next_id += 1;
        }
    }

    /// Puts a forged packet on the wire from side `1 - s` to side `s`:
    /// an opcode of the pair's transport, a PSN near what `s` expects,
    /// extension headers filled from the input.
    fn inject(&mut self, s: usize, inp: &mut Input<'_>) {
        let transport = match self.kind {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        };
        let infos: Vec<&'static OpcodeInfo> =
            Opcode::all().filter(|i| i.transport == transport).collect();
        let info = infos[inp.u8() as usize % infos.len()];
        let (me, peer) = (s, 1 - s);
        let attr = self.net.qp(self.ends[me].side.id).attr();
        let base = if info.is_request {
            attr.rq_psn
        } else {
            attr.sq_psn
        };
        let delta = i32::from(inp.u8() as i8);
        let psn = Psn::new(base.wrapping_add(delta as u32));
        let mut h = Headers::new(BthRepr {
            opcode: Opcode(info.code),
            pkey: if inp.u8() == 0xff { 0x7001 } else { 0xffff },
            dest_qp: self.ends[me].side.qpn,
            psn,
            se: delta & 1 != 0,
            ack_req: delta & 2 != 0,
            ..BthRepr::default()
        });
        let e = &self.ends[me];
        let key = match inp.u8() & 3 {
            0 => e.private.rkey(),
            1 => inp.u32(),
            _ => e.exposed.rkey(),
        };
        let va = e
            .exposed
            .iova()
            .wrapping_add(u64::from(inp.u16()) % (REGION as u64 + 64));
        for ext in info.headers {
            match ext {
                Ext::Feth => {
                    h.feth = Some(uroce_wire::FethRepr {
                        placement: inp.u8() & 0xf,
                        selectivity: inp.u8() & 3,
                    })
                }
                Ext::Deth => {
                    h.deth = Some(DethRepr {
                        qkey: QKEY,
                        src_qp: self.ends[peer].side.qpn,
                    })
                }
                Ext::Reth => {
                    h.reth = Some(RethRepr {
                        va,
                        rkey: key,
                        dma_len: u32::from(inp.u16()),
                    })
                }
                Ext::AtomicEth => {
                    h.atomic_eth = Some(AtomicEthRepr {
                        va: va & !7,
                        rkey: key,
                        swap_add: inp.u64(),
                        compare: inp.u64(),
                    })
                }
                Ext::Aeth => {
                    h.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::from_byte(inp.u8()),
                        msn: inp.u32() & 0xff_ffff,
                    })
                }
                Ext::AtomicAckEth => h.atomic_ack = Some(AtomicAckEthRepr { orig: inp.u64() }),
                Ext::ImmDt => h.imm = Some(inp.u32()),
                Ext::Ieth => h.ieth = Some(key),
                Ext::CnpReserved => {}
            }
        }
        let plen = if info.has_payload {
            match inp.u8() % 4 {
                0 => self.mtu as usize,
                1 => 0,
                _ => usize::from(inp.u16()) % (self.mtu as usize + 1),
            }
        } else {
            0
        };
        let cfg = config(self.ends[peer].side.ip, self.ends[peer].side.qpn, 4);
        let mut buf = vec![0u8; self.mtu as usize + 256];
        let fill = inp.u8();
        if let Some(n) = cfg.emit(self.ends[me].side.ip, &h, plen, &mut buf, |d| {
            d.fill(fill);
            true
        }) {
            buf.truncate(n);
            let ends_message = info.is_request
                && info.position.ends_message()
                && (info.operation == uroce_wire::Operation::Send || info.has_imm());
            if ends_message {
                self.ends[me].may_receive += 1;
            }
            let (src, dst) = (self.ends[peer].side.ip, self.ends[me].side.ip);
            self.net.inject(src, dst, buf);
        }
    }

    fn move_to_error(&mut self, s: usize) {
        let a = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        let _ = self
            .net
            .qp(self.ends[s].side.id)
            .modify(&a, AttrMask::STATE);
    }

    /// Lets the network run until the QPs are done (bounded virtual
    /// time), then checks that every send WR completed.
    fn finish(&mut self) {
        self.verdicts.lock().map(|mut q| q.clear()).ok();
        let mut t = 0;
        while t < 120 {
            self.net.run_until(SEC, |_| false);
            self.check();
            if self.ends.iter().all(|e| e.sends.values().all(|&n| n == 1)) {
                break;
            }
            t += 1;
        }
        for (i, e) in self.ends.iter().enumerate() {
            let missing: Vec<_> = e
                .sends
                .iter()
                .filter(|(_, &n)| n == 0)
                .map(|(id, _)| *id)
                .collect();
            assert!(
                missing.is_empty(),
                "side {i}: send WRs {missing:?} never completed (QP {:?})",
                self.net.qp(e.side.id).state()
            );
        }
        // QPs in ERR flush their receive WRs: each completes too.
        for i in 0..2 {
            if self.net.qp(self.ends[i].side.id).state() == QpState::Err {
                let e = &self.ends[i];
                assert!(
                    e.recvs.values().all(|&n| n == 1),
                    "side {i}: a receive WR was not flushed"
                );
            }
        }
    }
}

/// Runs one fuzz case: a pair of `kind` QPs driven by `data`.
pub fn run(kind: QpType, data: &[u8]) {
    let mut inp = Input { data, pos: 0 };
    let seed = u64::from(inp.u16());
    let mtu = match inp.u8() % 3 {
        0 => Mtu::Mtu256,
        1 => Mtu::Mtu1024,
        _ => Mtu::Mtu4096,
    };
    let mut p = Pair::new(kind, seed, mtu);
    let mut steps = 0;
    while !inp.done() && steps < 256 {
        steps += 1;
        let op = inp.u8();
        let s = usize::from(op >> 7);
        match op & 0x7f {
            0..=29 => p.post_send(s, &mut inp),
            30..=49 => p.post_recv(s, &mut inp),
            50..=89 => p.inject(s, &mut inp),
            90..=109 => {
                let n = inp.u8() % 64;
                for _ in 0..n {
                    if !p.net.step() {
                        break;
                    }
                }
            }
            110..=119 => {
                let v = match inp.u8() % 3 {
                    0 => Verdict::Drop,
                    1 => Verdict::Duplicate,
                    _ => Verdict::Pass,
                };
                let n = inp.u8() % 8;
                if let Ok(mut q) = p.verdicts.lock() {
                    q.extend(std::iter::repeat_n(v, usize::from(n)));
                }
            }
            120..=121 => p.move_to_error(s),
            _ => {
                let ns = u64::from(inp.u16()) * 1000;
                p.net.run_until(ns, |_| false);
            }
        }
        p.check();
    }
    p.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted case does real work: a receive posted on b, a SEND and
    /// a WRITE from a, time; b receives the message.
    #[test]
    fn a_script_moves_data() {
        for kind in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let mut p = Pair::new(kind, 1, Mtu::Mtu1024);
            // post_recv(b): len 3000 at offset 0.
            p.post_recv(
                1,
                &mut Input {
                    data: &[0xb8, 0x0b, 0, 0],
                    pos: 0,
                },
            );
            // post_send(a): SEND of 2000 bytes, exposed key.
            p.post_send(
                0,
                &mut Input {
                    data: &[0, 0xd0, 0x07, 0, 0, 2],
                    pos: 0,
                },
            );
            p.net.run_until(SEC, |_| false);
            p.check();
            assert_eq!(p.ends[1].received, 1, "{kind:?}");
            assert_eq!(p.ends[0].sends.get(&1), Some(&1), "{kind:?}");
            p.finish();
        }
    }
}
