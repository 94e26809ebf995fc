//! UC (unreliable connected) QPs on the simulated network: operations end
//! to end, what a lost or bad packet costs (the message, never the QP, and
//! never an answer on the wire), local errors and SQE, flush, and a lossy
//! reordering network.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uroce_provider::qp_attr::{AddressVector, AttrMask, QpAttr};
use uroce_provider::sans_io::events::{EventElement, EventType};
use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::{Faults, SimNet, Verdict, Wire};
use uroce_provider::sans_io::transport::uc::UcQp;
use uroce_provider::sans_io::transport::{Nanos, RecvQueue};
use uroce_provider::testing::{sge, side_with, signaled_wr as wr, uc_connect, PairParams, Side};
use uroce_provider::types::*;
use uroce_wire::packet::{self, Headers};
use uroce_wire::{BthRepr, IpContext, Opcode, Psn, RethRepr, Transport};

const SEC: u64 = 1_000_000_000;
const PD: u32 = 1;
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
/// First PSN of a's sends (b's start 0x1000 later); close to the 24-bit
/// wrap so that longer tests cross it.
const PSN_A: u32 = 0xff_fff0;
const PSN_B: u32 = 0x00_0ff0;

/// Two UC QPs, `a` and `b`, connected on a simulated network.
struct Uc {
    net: SimNet,
    a: Side,
    b: Side,
}

fn ips(v6: bool) -> (IpAddr, IpAddr) {
    if v6 {
        ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
    } else {
        ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap())
    }
}

impl Uc {
    fn new(mtu: Mtu) -> Uc {
        Uc::build(1, Faults::default(), mtu, false, 256, None)
    }

    /// `srq`: b takes its receive WRs from this queue.
    fn build(
        seed: u64,
        faults: Faults,
        mtu: Mtu,
        v6: bool,
        depth: u32,
        srq: Option<Arc<RecvQueue>>,
    ) -> Uc {
        let mut net = SimNet::new(seed, faults);
        let (a_ip, b_ip) = ips(v6);
        let p = PairParams {
            mtu,
            depth,
            ..PairParams::default()
        };
        let a = side_with(&mut net, a_ip, 0x11, &p, |cfg| Box::new(UcQp::new(cfg)));
        let b = side_with(&mut net, b_ip, 0x22, &p, |mut cfg| {
            if let Some(q) = srq {
                cfg.rq = q;
            }
            Box::new(UcQp::new(cfg))
        });
        uc_connect(net.qp(a.id), b_ip, b.qpn, PSN_B, PSN_A, mtu, true);
        uc_connect(net.qp(b.id), a_ip, a.qpn, PSN_A, PSN_B, mtu, true);
        net.trace = Some(Vec::new());
        Uc { net, a, b }
    }

    fn side(&self, on_a: bool) -> &Side {
        if on_a {
            &self.a
        } else {
            &self.b
        }
    }
    fn mr(&self, on_a: bool, len: usize, access: Access) -> Arc<MrInner> {
        self.side(on_a)
            .keys
            .register_zeroed(PD, len, access)
            .expect("alloc")
    }
    fn post_recv(&self, on_a: bool, wr_id: u64, sges: &[Sge]) {
        self.side(on_a)
            .rq
            .post(RecvWr {
                wr_id,
                sg_list: sges.iter().copied().collect(),
            })
            .expect("recv queue full");
    }
    fn post_send(&self, on_a: bool, w: SendWr) {
        self.side(on_a).sq.post(w).expect("send queue full");
    }
    /// Runs until the network is idle (UC has no timers).
    fn run(&mut self) {
        self.net.run_until(10 * SEC, |_| false);
    }
    fn sends(&self, on_a: bool) -> Vec<Wc> {
        drain(&self.side(on_a).send_cq)
    }
    fn recvs(&self, on_a: bool) -> Vec<Wc> {
        drain(&self.side(on_a).recv_cq)
    }
    fn state(&mut self, on_a: bool) -> QpState {
        let id = self.side(on_a).id;
        self.net.qp(id).state()
    }
    fn dropped_msgs(&self, on_a: bool) -> u64 {
        self.side(on_a)
            .counters
            .uc_dropped_msgs
            .load(Ordering::Relaxed)
    }
    fn modify_state(&mut self, on_a: bool, to: QpState) {
        let id = self.side(on_a).id;
        let attr = QpAttr {
            qp_state: to,
            ..QpAttr::default()
        };
        self.net
            .qp(id)
            .modify(&attr, AttrMask::STATE)
            .expect("modify");
    }
    /// Every packet delivered so far, parsed: (source, destination, opcode,
    /// PSN, SE, AckReq, payload length).
    fn wire(&self) -> Vec<(IpAddr, IpAddr, Opcode, u32, bool, bool, usize)> {
        self.net
            .trace
            .as_ref()
            .unwrap()
            .iter()
            .map(|(_, s, d, b)| {
                let p = packet::parse(b).expect("parses");
                let h = &p.bth;
                (
                    *s,
                    *d,
                    h.opcode,
                    h.psn.value(),
                    h.se,
                    h.ack_req,
                    p.payload.len(),
                )
            })
            .collect()
    }
    /// Asserts that only UC request packets from a to b were ever on the
    /// wire, AckReq never set, and b sent nothing.
    fn assert_only_uc_requests_a_to_b(&self) {
        for (s, d, op, psn, _, ack_req, _) in self.wire() {
            let info = op.info().unwrap();
            assert_eq!((s, d), (self.a.ip, self.b.ip), "{op:?} psn {psn:#x}");
            assert_eq!(info.transport, Transport::Uc, "{op:?}");
            assert!(info.is_request, "{op:?}");
            assert!(!ack_req, "AckReq set on {op:?} psn {psn:#x}");
        }
        assert_eq!(self.b.counters.sent_pkts.load(Ordering::Relaxed), 0);
    }
}

fn drain(cq: &uroce_provider::sans_io::cq::CqInner) -> Vec<Wc> {
    let mut v = Vec::new();
    while let Some(wc) = cq.poll_one() {
        v.push(wc);
    }
    v
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 8) as u8)
        })
        .collect()
}

fn contents(mr: &MrInner, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).unwrap();
    v
}

fn sizes(mtu: usize) -> Vec<usize> {
    vec![0, 1, mtu - 1, mtu, mtu + 1, 3 * mtu, 3 * mtu + 7]
}

fn npkts(len: usize, mtu: usize) -> u32 {
    len.div_ceil(mtu).max(1) as u32
}

/// Checks the opcodes and PSNs of the packets of a run of messages with
/// `op` (first packet at PSN `psn`), each `solicited` or not.
fn check_message_packets(
    pkts: &[(IpAddr, IpAddr, Opcode, u32, bool, bool, usize)],
    mut psn: Psn,
    msgs: &[(usize, bool)],
    mtu: usize,
    ops: [Opcode; 4],
) {
    let [first, middle, last, only] = ops;
    let mut i = 0;
    for &(len, solicited) in msgs {
        let n = npkts(len, mtu);
        for k in 0..n {
            let (_, _, op, p, se, _, plen) = pkts[i];
            let want = match (k, n) {
                (_, 1) => only,
                (0, _) => first,
                (k, n) if k + 1 == n => last,
                _ => middle,
            };
            assert_eq!(op, want, "len {len} packet {k}");
            assert_eq!(p, psn.value(), "len {len} packet {k}");
            assert_eq!(se, solicited && k + 1 == n, "SE of len {len} packet {k}");
            let expect_len = (len - (k as usize * mtu).min(len)).min(mtu);
            assert_eq!(plen, expect_len);
            psn = psn.next();
            i += 1;
        }
    }
    assert_eq!(i, pkts.len(), "no other packets");
}

#[test]
fn send_and_send_with_imm_single_and_multi_packet() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024] {
        let m = mtu.bytes() as usize;
        let mut p = Uc::new(mtu);
        let mut sent = Vec::new();
        for (i, len) in sizes(m).into_iter().enumerate() {
            for imm in [false, true] {
                let id = (i * 2 + imm as usize) as u64;
                let src = p.mr(true, len.max(1), RW);
                let dst = p.mr(false, len + 64, RW);
                let data = pattern(len, id as u8);
                src.write(0, &data).unwrap();
                p.post_recv(false, 100 + id, &[sge(&dst, 0, len as u32 + 64)]);
                let op = if imm {
                    WrOpcode::SendWithImm
                } else {
                    WrOpcode::Send
                };
                let mut w = wr(id, op, &[sge(&src, 0, len as u32)]);
                w.imm_data = 0xab00_0000 | id as u32;
                let solicited = id % 3 == 0;
                if solicited {
                    w.flags |= SendFlags::SOLICITED;
                }
                p.post_send(true, w);
                p.run();
                let s = p.sends(true);
                assert_eq!(s.len(), 1, "{mtu:?} len {len}");
                assert_eq!(
                    (s[0].status, s[0].opcode, s[0].wr_id),
                    (WcStatus::Success, WcOpcode::Send, id)
                );
                let r = p.recvs(false);
                assert_eq!(r.len(), 1, "{mtu:?} len {len}");
                let r = r[0];
                assert_eq!(
                    (r.status, r.opcode, r.wr_id, r.byte_len),
                    (WcStatus::Success, WcOpcode::Recv, 100 + id, len as u32),
                    "{mtu:?} len {len}"
                );
                assert_eq!((r.qp_num, r.src_qp), (p.b.qpn, p.a.qpn));
                assert_eq!(r.wc_flags.contains(WcFlags::WITH_IMM), imm);
                if imm {
                    assert_eq!(r.imm_data, 0xab00_0000 | id as u32);
                }
                assert_eq!(contents(&dst, 0, len), data, "{mtu:?} len {len}");
                assert_eq!(contents(&dst, len, 64), vec![0; 64], "nothing past the end");
                sent.push((len, solicited, imm));
            }
        }
        p.assert_only_uc_requests_a_to_b();
        let pkts = p.wire();
        let mut psn = Psn::new(PSN_A);
        let mut i = 0;
        for (len, solicited, imm) in sent {
            let n = npkts(len, m) as usize;
            let last = if imm {
                Opcode::UC_SEND_LAST_WITH_IMMEDIATE
            } else {
                Opcode::UC_SEND_LAST
            };
            let only = if imm {
                Opcode::UC_SEND_ONLY_WITH_IMMEDIATE
            } else {
                Opcode::UC_SEND_ONLY
            };
            check_message_packets(
                &pkts[i..i + n],
                psn,
                &[(len, solicited)],
                m,
                [Opcode::UC_SEND_FIRST, Opcode::UC_SEND_MIDDLE, last, only],
            );
            psn = psn.add(n as u32);
            i += n;
        }
        assert_eq!(i, pkts.len());
        assert_eq!(p.dropped_msgs(false), 0);
        // The PSNs crossed the 24-bit wrap and both ends agree.
        let (a, b) = (p.a.id, p.b.id);
        assert_eq!(p.net.qp(a).attr().sq_psn, psn.value());
        assert_eq!(p.net.qp(b).attr().rq_psn, psn.value());
    }
}

#[test]
fn write_and_write_with_imm_single_and_multi_packet() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu4096] {
        let m = mtu.bytes() as usize;
        let mut p = Uc::new(mtu);
        let mut psn = Psn::new(PSN_A);
        for (i, len) in sizes(m).into_iter().enumerate() {
            for imm in [false, true] {
                let id = (i * 2 + imm as usize) as u64;
                let src = p.mr(true, len.max(1), RW);
                let dst = p.mr(false, len + 16, RW);
                let data = pattern(len, 7 + id as u8);
                src.write(0, &data).unwrap();
                let op = if imm {
                    WrOpcode::RdmaWriteWithImm
                } else {
                    WrOpcode::RdmaWrite
                };
                let mut w = wr(id, op, &[sge(&src, 0, len as u32)]);
                w.remote_addr = dst.iova() + 8;
                w.rkey = dst.rkey();
                w.imm_data = id as u32;
                // A receive WR is there for both; only WITH_IMM takes it.
                p.post_recv(false, 500 + id, &[]);
                p.post_send(true, w);
                p.net.trace = Some(Vec::new());
                p.run();
                let s = p.sends(true);
                assert_eq!(
                    (s.len(), s[0].status, s[0].opcode),
                    (1, WcStatus::Success, WcOpcode::RdmaWrite),
                    "{mtu:?} {len}"
                );
                let r = p.recvs(false);
                if imm {
                    assert_eq!(r.len(), 1, "{mtu:?} {len}");
                    assert_eq!(
                        (r[0].status, r[0].opcode, r[0].byte_len, r[0].imm_data),
                        (
                            WcStatus::Success,
                            WcOpcode::RecvRdmaWithImm,
                            len as u32,
                            id as u32
                        )
                    );
                    // Receive WRs are taken in order; plain WRITEs take none.
                    assert_eq!(r[0].wr_id, 500 + i as u64);
                    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
                    assert_eq!(r[0].src_qp, p.a.qpn);
                } else {
                    assert!(r.is_empty(), "plain WRITE completes nothing at b");
                }
                assert_eq!(contents(&dst, 0, 8), vec![0; 8]);
                assert_eq!(contents(&dst, 8, len), data, "{mtu:?} {len}");
                assert_eq!(contents(&dst, 8 + len, 8), vec![0; 8]);
                p.assert_only_uc_requests_a_to_b();
                let last = if imm {
                    Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE
                } else {
                    Opcode::UC_RDMA_WRITE_LAST
                };
                let only = if imm {
                    Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                } else {
                    Opcode::UC_RDMA_WRITE_ONLY
                };
                check_message_packets(
                    &p.wire(),
                    psn,
                    &[(len, false)],
                    m,
                    [
                        Opcode::UC_RDMA_WRITE_FIRST,
                        Opcode::UC_RDMA_WRITE_MIDDLE,
                        last,
                        only,
                    ],
                );
                psn = psn.add(npkts(len, m));
            }
        }
        assert_eq!(p.b.rq.len(), 7, "one WR left by every plain WRITE");
    }
}

#[test]
fn inline_send_and_unsignaled_wrs() {
    let mut p = Uc::new(Mtu::Mtu256);
    let dst = p.mr(false, 4096, RW);
    p.post_recv(false, 1, &[sge(&dst, 0, 1024)]);
    p.post_recv(false, 2, &[sge(&dst, 1024, 1024)]);
    let mut w = SendWr::new(10, WrOpcode::Send);
    w.flags = SendFlags::INLINE | SendFlags::SIGNALED;
    w.inline_data = pattern(200, 1).into_iter().collect();
    p.post_send(true, w);
    // Unsignaled: retired silently, still delivered.
    let mut w = SendWr::new(11, WrOpcode::Send);
    w.flags = SendFlags::INLINE;
    w.inline_data = pattern(100, 2).into_iter().collect();
    p.post_send(true, w);
    p.run();
    let s = p.sends(true);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].wr_id, s[0].status), (10, WcStatus::Success));
    assert_eq!(p.a.sq.outstanding(), 0);
    let r = p.recvs(false);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        vec![(1, 200), (2, 100)]
    );
    assert_eq!(contents(&dst, 0, 200), pattern(200, 1));
    assert_eq!(contents(&dst, 1024, 100), pattern(100, 2));
}

/// Drops the `nth` (0-based) packet with opcode `op` from a to b, once.
fn drop_nth(p: &mut Uc, op: Opcode, nth: usize) {
    let mut count = 0;
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.pkt.bth.opcode == op {
            count += 1;
            if count == nth + 1 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
}

/// Two SENDs of 4 packets (1024 bytes at MTU 256) and one receive WR.
fn two_sends_one_recv(p: &mut Uc) -> (Arc<MrInner>, Vec<u8>) {
    let src = p.mr(true, 2048, RW);
    let dst = p.mr(false, 2048, RW);
    src.write(0, &pattern(2048, 9)).unwrap();
    p.post_recv(false, 7, &[sge(&dst, 0, 2048)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 1024)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 1024, 1000)]));
    (dst, pattern(2048, 9)[1024..2024].to_vec())
}

fn assert_second_message_in_the_same_wr(p: &mut Uc, dst: &MrInner, second: &[u8]) {
    // The sender never learns: both WRs succeed.
    let s = p.sends(true);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // The first message does not complete; its WR takes the second.
    let r = p.recvs(false);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (7, WcStatus::Success, 1000)
    );
    assert_eq!(contents(dst, 0, 1000), second);
    assert_eq!(p.dropped_msgs(false), 1);
    assert_eq!(p.state(false), QpState::Rts);
    p.assert_only_uc_requests_a_to_b();
}

#[test]
fn dropped_middle_drops_the_message_and_its_wr_takes_the_next() {
    let mut p = Uc::new(Mtu::Mtu256);
    let (dst, second) = two_sends_one_recv(&mut p);
    drop_nth(&mut p, Opcode::UC_SEND_MIDDLE, 0);
    p.run();
    assert_second_message_in_the_same_wr(&mut p, &dst, &second);
    // 8 packets sent, one lost, all the rest received.
    assert_eq!(p.a.counters.sent_pkts.load(Ordering::Relaxed), 8);
    assert_eq!(p.b.counters.rcvd_pkts.load(Ordering::Relaxed), 7);
}

#[test]
fn dropped_first_drops_the_message() {
    let mut p = Uc::new(Mtu::Mtu256);
    let (dst, second) = two_sends_one_recv(&mut p);
    drop_nth(&mut p, Opcode::UC_SEND_FIRST, 0);
    p.run();
    assert_second_message_in_the_same_wr(&mut p, &dst, &second);
}

#[test]
fn dropped_last_drops_the_message_and_the_next_first_resyncs() {
    let mut p = Uc::new(Mtu::Mtu256);
    let (dst, second) = two_sends_one_recv(&mut p);
    drop_nth(&mut p, Opcode::UC_SEND_LAST, 0);
    p.run();
    assert_second_message_in_the_same_wr(&mut p, &dst, &second);
}

#[test]
fn psn_resync_after_a_gap_of_whole_messages() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 4096, RW);
    let dst = p.mr(false, 4096, RW);
    src.write(0, &pattern(4096, 3)).unwrap();
    // Messages 0..3 (1 + 3 + 1 packets) vanish entirely: b sees a PSN gap
    // of five at the ONLY of message 3, and takes it.
    let lost = Arc::new(Mutex::new(0));
    let l = lost.clone();
    p.net.set_filter(move |_: &Wire<'_>| {
        let mut l = l.lock().unwrap();
        if *l < 5 {
            *l += 1;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    p.post_recv(false, 1, &[sge(&dst, 0, 4096)]);
    p.post_recv(false, 2, &[sge(&dst, 0, 4096)]);
    p.post_send(true, wr(0, WrOpcode::Send, &[sge(&src, 0, 10)]));
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 700)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 20)]));
    p.post_send(true, wr(3, WrOpcode::Send, &[sge(&src, 100, 30)]));
    p.post_send(true, wr(4, WrOpcode::Send, &[sge(&src, 0, 600)]));
    p.run();
    assert_eq!(*lost.lock().unwrap(), 5);
    assert_eq!(p.sends(true).len(), 5);
    let r = p.recvs(false);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 30), (2, WcStatus::Success, 600)]
    );
    assert_eq!(contents(&dst, 0, 600), pattern(4096, 3)[..600]);
    // Nothing was seen of the lost messages: nothing counted as dropped.
    assert_eq!(p.dropped_msgs(false), 0);
    let (a, b) = (p.a.id, p.b.id);
    let next = Psn::new(PSN_A).add(1 + 3 + 1 + 1 + 3).value();
    assert_eq!(p.net.qp(a).attr().sq_psn, next);
    assert_eq!(p.net.qp(b).attr().rq_psn, next);
}

#[test]
fn stray_middle_and_last_are_dropped_until_a_first() {
    // A sender that starts in the middle (a hostile or broken peer): b
    // drops MIDDLE/LAST packets without a FIRST, even at the expected PSN.
    let mut p = Uc::new(Mtu::Mtu256);
    let dst = p.mr(false, 4096, RW);
    p.post_recv(false, 1, &[sge(&dst, 0, 4096)]);
    let mut psn = Psn::new(PSN_A);
    for op in [Opcode::UC_SEND_MIDDLE, Opcode::UC_SEND_LAST] {
        inject(&mut p, op, psn, &[1u8; 256], None);
        psn = psn.next();
    }
    // A WRITE MIDDLE inside a SEND message breaks it too, even when a
    // SEND LAST follows at the PSN the message expected.
    inject(&mut p, Opcode::UC_SEND_FIRST, psn, &[2u8; 256], None);
    inject(
        &mut p,
        Opcode::UC_RDMA_WRITE_MIDDLE,
        psn.add(1),
        &[3u8; 256],
        None,
    );
    inject(&mut p, Opcode::UC_SEND_LAST, psn.add(1), &[4u8; 10], None);
    // An ONLY starts afresh.
    inject(&mut p, Opcode::UC_SEND_ONLY, psn.add(3), &[5u8; 50], None);
    p.run();
    let r = p.recvs(false);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].wr_id, r[0].byte_len), (1, 50));
    assert_eq!(contents(&dst, 0, 50), vec![5u8; 50]);
    assert_eq!(p.dropped_msgs(false), 2);
    assert_eq!(p.state(false), QpState::Rts);
}

#[test]
fn bad_payload_lengths_drop_the_message() {
    let mut p = Uc::new(Mtu::Mtu256);
    let dst = p.mr(false, 4096, RW);
    for i in 0..8 {
        p.post_recv(false, i, &[sge(&dst, 0, 4096)]);
    }
    let reth = |len| {
        Some(RethRepr {
            va: dst.iova(),
            rkey: dst.rkey(),
            dma_len: len,
        })
    };
    let full = [1u8; 256];
    let mut psn = Psn::new(PSN_A);
    let mut send = |p: &mut Uc, op, payload: &[u8], r: Option<RethRepr>| {
        inject(p, op, psn, payload, r);
        psn = psn.next();
    };
    // FIRST shorter than the MTU.
    send(&mut p, Opcode::UC_SEND_FIRST, &full[..100], None);
    send(&mut p, Opcode::UC_SEND_LAST, &full[..10], None);
    // MIDDLE shorter than the MTU.
    send(&mut p, Opcode::UC_SEND_FIRST, &full, None);
    send(&mut p, Opcode::UC_SEND_MIDDLE, &full[..255], None);
    send(&mut p, Opcode::UC_SEND_LAST, &full[..10], None);
    // Empty LAST.
    send(&mut p, Opcode::UC_SEND_FIRST, &full, None);
    send(&mut p, Opcode::UC_SEND_LAST, &[], None);
    // ONLY longer than the MTU.
    send(&mut p, Opcode::UC_SEND_ONLY, &[1u8; 260], None);
    // WRITEs whose payload does not add up to the RETH length.
    send(&mut p, Opcode::UC_RDMA_WRITE_ONLY, &full[..50], reth(100));
    send(&mut p, Opcode::UC_RDMA_WRITE_FIRST, &full, reth(300));
    send(
        &mut p,
        Opcode::UC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        &full[..100],
        None,
    );
    // A good one.
    send(&mut p, Opcode::UC_SEND_FIRST, &full, None);
    send(&mut p, Opcode::UC_SEND_LAST, &full[..4], None);
    p.run();
    let r = p.recvs(false);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(0, WcStatus::Success, 260)]
    );
    assert_eq!(p.dropped_msgs(false), 6);
    assert_eq!(
        contents(&dst, 260, 100),
        vec![0; 100],
        "the short WRITE ONLY wrote nothing"
    );
    assert_eq!(p.state(false), QpState::Rts);
}

/// Puts a UC packet from a to b on the wire.
fn inject(p: &mut Uc, op: Opcode, psn: Psn, payload: &[u8], reth: Option<RethRepr>) {
    let mut h = Headers::new(BthRepr {
        opcode: op,
        pkey: 0xffff,
        dest_qp: p.b.qpn,
        psn,
        ..BthRepr::default()
    });
    let info = op.info().unwrap();
    if info.has(uroce_wire::Ext::Reth) {
        h.reth = Some(reth.unwrap_or(RethRepr {
            va: 0,
            rkey: 0,
            dma_len: payload.len() as u32,
        }));
    }
    if info.has_imm() {
        h.imm = Some(0x1234);
    }
    let ctx = match (p.a.ip, p.b.ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpContext::for_socket_v4(s, d, 4791, 4791),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpContext::v6(s, d, 4791, 4791),
        _ => unreachable!(),
    };
    let mut buf = vec![0u8; 4096 + 256];
    let n = packet::emit(&h, payload, &mut buf, &ctx).expect("emit");
    buf.truncate(n);
    p.net.inject(p.a.ip, p.b.ip, buf);
}

#[test]
fn write_with_bad_rkey_or_access_is_dropped_silently_and_the_qp_keeps_working() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 1024, RW);
    src.write(0, &pattern(1024, 5)).unwrap();
    let dst = p.mr(false, 1024, RW);
    let ro = p.mr(false, 1024, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let bad = |id, rkey: u32, addr: u64, len: u32| {
        let mut w = wr(id, WrOpcode::RdmaWriteWithImm, &[sge(&src, 0, len)]);
        w.rkey = rkey;
        w.remote_addr = addr;
        w.imm_data = id as u32;
        w
    };
    p.post_recv(false, 1, &[]);
    p.post_send(true, bad(1, dst.rkey() ^ 0x5a5a, dst.iova(), 1000)); // unknown key
    p.post_send(true, bad(2, ro.rkey(), ro.iova(), 1000)); // no REMOTE_WRITE
    p.post_send(true, bad(3, dst.rkey(), dst.iova() + 100, 1000)); // past the end
    p.post_send(true, bad(4, dst.rkey(), dst.iova(), 1000)); // good
    p.run();
    assert!(p.sends(true).iter().all(|w| w.status == WcStatus::Success));
    let r = p.recvs(false);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!((r[0].wr_id, r[0].imm_data, r[0].byte_len), (1, 4, 1000));
    assert_eq!(contents(&dst, 0, 1000), pattern(1024, 5)[..1000]);
    assert_eq!(contents(&ro, 0, 1024), vec![0; 1024]);
    assert_eq!(p.dropped_msgs(false), 3);
    assert_eq!(p.state(false), QpState::Rts);
    assert!(
        p.b.events.get(Some(Duration::ZERO)).is_none(),
        "no error event"
    );
    p.assert_only_uc_requests_a_to_b();

    // A QP without REMOTE_WRITE drops WRITEs, and still receives SENDs.
    let id = p.b.id;
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: Access::LOCAL_WRITE,
        ..QpAttr::default()
    };
    p.net
        .qp(id)
        .modify(&attr, AttrMask::STATE | AttrMask::ACCESS_FLAGS)
        .unwrap();
    let mut w = wr(5, WrOpcode::RdmaWrite, &[sge(&src, 0, 10)]);
    w.rkey = dst.rkey();
    w.remote_addr = dst.iova() + 1010;
    p.post_send(true, w);
    p.post_recv(false, 2, &[sge(&dst, 2000 - 1024, 0)]);
    p.post_recv(false, 3, &[sge(&dst, 1020, 4)]);
    p.post_send(true, wr(6, WrOpcode::Send, &[sge(&src, 0, 0)]));
    p.run();
    assert_eq!(contents(&dst, 1010, 10), vec![0; 10]);
    assert_eq!(p.dropped_msgs(false), 4);
    let r = p.recvs(false);
    assert_eq!((r.len(), r[0].wr_id, r[0].byte_len), (1, 2, 0));
}

#[test]
fn send_without_a_receive_wr_is_dropped_and_counted() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 1024, RW);
    src.write(0, &pattern(1024, 1)).unwrap();
    let dst = p.mr(false, 1024, RW);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 600)]));
    p.post_send(true, wr(2, WrOpcode::RdmaWriteWithImm, &[sge(&src, 0, 0)]));
    p.run();
    assert_eq!(p.sends(true).len(), 2);
    assert!(p.recvs(false).is_empty());
    assert_eq!(p.dropped_msgs(false), 2);
    assert_eq!(p.state(false), QpState::Rts);
    p.assert_only_uc_requests_a_to_b();
    p.post_recv(false, 9, &[sge(&dst, 0, 1024)]);
    p.post_send(true, wr(3, WrOpcode::Send, &[sge(&src, 0, 600)]));
    p.run();
    let r = p.recvs(false);
    assert_eq!((r.len(), r[0].wr_id, r[0].byte_len), (1, 9, 600));
    assert_eq!(contents(&dst, 0, 600), pattern(1024, 1)[..600]);
}

#[test]
fn send_too_long_completes_loc_len_err_and_the_qp_stays_up() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 4096, RW);
    src.write(0, &pattern(4096, 2)).unwrap();
    let dst = p.mr(false, 4096, RW);
    p.post_recv(false, 1, &[sge(&dst, 0, 600)]);
    p.post_recv(false, 2, &[sge(&dst, 1000, 100)]);
    p.post_recv(false, 3, &[sge(&dst, 2000, 2000)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 3000)])); // 12 packets
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 101)])); // one, 1 too long
    p.post_send(true, wr(3, WrOpcode::Send, &[sge(&src, 0, 1500)]));
    p.run();
    assert!(p.sends(true).iter().all(|w| w.status == WcStatus::Success));
    let r = p.recvs(false);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::LocLenErr),
            (2, WcStatus::LocLenErr),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(r[2].byte_len, 1500);
    assert_eq!(contents(&dst, 2000, 1500), pattern(4096, 2)[..1500]);
    assert_eq!(p.state(false), QpState::Rts);
    assert_eq!(p.dropped_msgs(false), 2);
    p.assert_only_uc_requests_a_to_b();
}

#[test]
fn read_on_uc_is_a_local_qp_op_error_then_sqe_and_recovery() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 1024, RW);
    let dst = p.mr(false, 1024, RW);
    let mut rd = wr(1, WrOpcode::RdmaRead, &[sge(&src, 0, 8)]);
    rd.rkey = dst.rkey();
    rd.remote_addr = dst.iova();
    p.post_send(true, rd);
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.post_send(true, wr(3, WrOpcode::AtomicFetchAndAdd, &[sge(&src, 0, 8)]));
    p.run();
    let s = p.sends(true);
    assert_eq!(
        s.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::LocQpOpErr, WcOpcode::RdmaRead),
            (2, WcStatus::WrFlushErr, WcOpcode::Send),
            (3, WcStatus::WrFlushErr, WcOpcode::FetchAdd)
        ]
    );
    assert_eq!(p.state(true), QpState::Sqe);
    assert_eq!(p.a.sq.outstanding(), 0);
    assert!(p.wire().is_empty(), "nothing was sent");
    // Posted in SQE: flushed.
    p.post_send(true, wr(4, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.run();
    assert_eq!(p.sends(true)[0].status, WcStatus::WrFlushErr);
    // The receive side works on in SQE.
    let back = p.mr(false, 64, RW);
    back.write(0, b"from b").unwrap();
    p.post_recv(true, 50, &[sge(&src, 100, 64)]);
    p.post_send(false, wr(60, WrOpcode::Send, &[sge(&back, 0, 6)]));
    p.run();
    let r = p.recvs(true);
    assert_eq!(
        (r.len(), r[0].wr_id, r[0].status),
        (1, 50, WcStatus::Success)
    );
    assert_eq!(contents(&src, 100, 6), b"from b");
    // SQE -> RTS: sending resumes.
    p.modify_state(true, QpState::Rts);
    src.write(0, b"again!").unwrap();
    p.post_recv(false, 70, &[sge(&dst, 0, 64)]);
    p.post_send(true, wr(5, WrOpcode::Send, &[sge(&src, 0, 6)]));
    p.run();
    assert_eq!(p.sends(true)[0].status, WcStatus::Success);
    let r = p.recvs(false);
    assert_eq!((r.len(), r[0].wr_id, r[0].byte_len), (1, 70, 6));
    assert_eq!(contents(&dst, 0, 6), b"again!");
}

#[test]
fn local_protection_and_length_errors_move_to_sqe() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 1024, RW);
    // An SGE past the end of its region.
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 1000, 100)]));
    p.run();
    let s = p.sends(true);
    assert_eq!((s[0].wr_id, s[0].status), (1, WcStatus::LocProtErr));
    assert_eq!(p.state(true), QpState::Sqe);
    p.modify_state(true, QpState::Rts);
    // An unknown lkey, unsignaled: errors complete anyway.
    let mut w = SendWr::new(2, WrOpcode::RdmaWrite);
    w.sg_list.push(Sge {
        addr: src.iova(),
        length: 8,
        lkey: src.lkey() ^ 1,
    });
    p.post_send(true, w);
    p.run();
    let s = p.sends(true);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::LocProtErr));
    assert_eq!(p.state(true), QpState::Sqe);
    assert_eq!(p.a.sq.outstanding(), 0);
    assert!(p.wire().is_empty());
}

#[test]
fn err_sends_what_was_posted_then_flushes_and_reset_discards() {
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 4096, RW);
    let buf = p.mr(true, 4096, RW);
    for i in 0..3u64 {
        p.post_send(true, wr(i, WrOpcode::Send, &[sge(&src, 0, 1000)]));
        p.post_recv(true, 10 + i, &[sge(&buf, 0, 100)]);
    }
    // One packet of WR 0 goes out (into our buffer, not the network):
    // the WR is in progress when the QP fails.
    let mut out = vec![0u8; 4096 + 256];
    let id = p.a.id;
    let t = p.net.qp(id).poll_transmit(Nanos(0), &mut out).unwrap();
    let first = packet::parse(&out[..t.len]).unwrap();
    assert_eq!(first.bth.opcode, Opcode::UC_SEND_FIRST);
    // The modify to ERR lets the WRs posted before it go out first (as a
    // NIC sends the WQEs it fetched): the rest of WR 0 and WRs 1 and 2,
    // which UC completes once sent; the receive WRs are flushed.
    p.modify_state(true, QpState::Err);
    assert_eq!(p.state(true), QpState::Err);
    p.run();
    let s = p.sends(true);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (0, WcStatus::Success),
            (1, WcStatus::Success),
            (2, WcStatus::Success)
        ]
    );
    let r = p.recvs(true);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.a.sq.outstanding(), 0);
    // Posted in ERR: flushed as well; packets to a QP in ERR are dropped.
    p.post_send(true, wr(3, WrOpcode::Send, &[sge(&src, 0, 10)]));
    p.post_recv(true, 13, &[sge(&buf, 0, 100)]);
    p.post_send(false, wr(99, WrOpcode::Send, &[]));
    p.run();
    assert_eq!(p.sends(true)[0].wr_id, 3);
    assert_eq!(p.recvs(true)[0].wr_id, 13);
    assert!(p.a.counters.dropped_pkts.load(Ordering::Relaxed) >= 1);
    // Three messages of four packets, the first taken by hand above;
    // nothing posted in ERR.
    assert_eq!(p.a.counters.sent_pkts.load(Ordering::Relaxed), 12);
    // RESET discards what is posted, without completions.
    p.post_send(true, wr(4, WrOpcode::Send, &[]));
    p.post_recv(true, 14, &[]);
    p.modify_state(true, QpState::Reset);
    assert_eq!(p.state(true), QpState::Reset);
    assert!(p.sends(true).is_empty());
    assert!(p.recvs(true).is_empty());
    assert_eq!(p.a.sq.outstanding(), 0);
    assert!(p.a.rq.is_empty());
}

#[test]
fn a_dropped_sends_wr_is_flushed_on_err() {
    // The WR a dropped SEND held back completes with WR_FLUSH_ERR, first.
    let mut p = Uc::new(Mtu::Mtu256);
    let src = p.mr(true, 2048, RW);
    let dst = p.mr(false, 2048, RW);
    p.post_recv(false, 1, &[sge(&dst, 0, 2048)]);
    p.post_recv(false, 2, &[sge(&dst, 0, 2048)]);
    drop_nth(&mut p, Opcode::UC_SEND_LAST, 0);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 1000)]));
    p.run();
    assert!(p.recvs(false).is_empty());
    p.modify_state(false, QpState::Err);
    let r = p.recvs(false);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
}

#[test]
fn srq_wrs_are_not_flushed_and_last_wqe_reached_is_reported() {
    let events = Arc::new(uroce_provider::sans_io::events::AsyncEvents::new().unwrap());
    let srq = Arc::new(RecvQueue::new_srq(16, 5, events).unwrap());
    let mut p = Uc::build(
        1,
        Faults::default(),
        Mtu::Mtu256,
        false,
        64,
        Some(srq.clone()),
    );
    let src = p.mr(true, 2048, RW);
    let dst = p.mr(false, 4096, RW);
    src.write(0, &pattern(2048, 4)).unwrap();
    for i in 0..4 {
        srq.post(RecvWr {
            wr_id: i,
            sg_list: [sge(&dst, i * 1024, 1024)].into_iter().collect(),
        })
        .unwrap();
    }
    // A SEND whose LAST is lost: its SRQ WR cannot go back to the SRQ and
    // completes in error (class E, as rxe); the next SEND takes WR 1.
    drop_nth(&mut p, Opcode::UC_SEND_LAST, 0);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 600)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 700)]));
    p.run();
    let r = p.recvs(false);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::RemInvReqErr), (1, WcStatus::Success)]
    );
    assert_eq!(contents(&dst, 1024, 700), pattern(2048, 4)[..700]);
    p.modify_state(false, QpState::Err);
    p.run();
    assert!(p.recvs(false).is_empty(), "SRQ WRs are not flushed");
    assert_eq!(srq.len(), 2);
    let mut seen = Vec::new();
    while let Some(e) = p.b.events.get(Some(Duration::ZERO)) {
        seen.push(e.event_type);
    }
    assert!(seen.contains(&EventType::QpLastWqeReached), "{seen:?}");
}

#[test]
fn comm_est_on_the_first_packet_in_rtr() {
    let mut net = SimNet::new(1, Faults::default());
    let (a_ip, b_ip) = ips(false);
    let p = PairParams {
        mtu: Mtu::Mtu256,
        ..PairParams::default()
    };
    let a = side_with(&mut net, a_ip, 0x11, &p, |cfg| Box::new(UcQp::new(cfg)));
    let b = side_with(&mut net, b_ip, 0x22, &p, |cfg| Box::new(UcQp::new(cfg)));
    uc_connect(net.qp(a.id), b_ip, b.qpn, PSN_B, PSN_A, p.mtu, true);
    uc_connect(net.qp(b.id), a_ip, a.qpn, PSN_A, PSN_B, p.mtu, false);
    assert_eq!(net.qp(b.id).state(), QpState::Rtr);
    assert!(b.events.get(Some(Duration::ZERO)).is_none());
    b.rq.post(RecvWr::default()).unwrap();
    a.sq.post(wr(1, WrOpcode::Send, &[])).unwrap();
    net.run_until(SEC, |_| false);
    let e = b.events.get(Some(Duration::ZERO)).expect("COMM_EST");
    assert_eq!(
        (e.event_type, e.element),
        (EventType::CommEst, EventElement::Qp(b.qpn))
    );
    assert_eq!(b.recv_cq.poll_one().unwrap().status, WcStatus::Success);
    assert_eq!(net.qp(a.id).poll_timeout(), None);
    assert_eq!(net.qp(b.id).poll_timeout(), None);
}

#[test]
fn uc_refuses_rc_only_attributes() {
    let mut net = SimNet::new(1, Faults::default());
    let (a_ip, b_ip) = ips(false);
    let p = PairParams::default();
    let a = side_with(&mut net, a_ip, 0x11, &p, |cfg| Box::new(UcQp::new(cfg)));
    let qp = net.qp(a.id);
    assert_eq!(qp.qp_type(), QpType::Uc);
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: RW,
        ..QpAttr::default()
    };
    qp.modify(
        &attr,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.ah_attr = AddressVector::to_ip(b_ip);
    let rtr =
        AttrMask::STATE | AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
    assert!(qp
        .modify(&attr, rtr | AttrMask::MAX_DEST_RD_ATOMIC)
        .is_err());
    assert!(qp.modify(&attr, rtr | AttrMask::MIN_RNR_TIMER).is_err());
    // An IPv6 peer for an IPv4 device.
    let mut v6 = attr;
    v6.ah_attr = AddressVector::to_ip("fd00::2".parse().unwrap());
    assert!(qp.modify(&v6, rtr).is_err());
    qp.modify(&attr, rtr).unwrap();
    attr.qp_state = QpState::Rts;
    assert!(qp
        .modify(
            &attr,
            AttrMask::STATE | AttrMask::SQ_PSN | AttrMask::TIMEOUT
        )
        .is_err());
    qp.modify(&attr, AttrMask::STATE | AttrMask::SQ_PSN)
        .unwrap();
    assert_eq!(qp.state(), QpState::Rts);
}

#[test]
fn ipv6_pair() {
    let mut p = Uc::build(2, Faults::default(), Mtu::Mtu1024, true, 64, None);
    let src = p.mr(true, 8192, RW);
    let dst = p.mr(false, 8192, RW);
    let data = pattern(8192, 6);
    src.write(0, &data).unwrap();
    p.post_recv(false, 1, &[sge(&dst, 0, 4096)]);
    p.post_recv(false, 2, &[]);
    p.post_send(true, wr(1, WrOpcode::SendWithImm, &[sge(&src, 0, 3000)]));
    let mut w = wr(2, WrOpcode::RdmaWriteWithImm, &[sge(&src, 4096, 4096)]);
    w.remote_addr = dst.iova() + 4096;
    w.rkey = dst.rkey();
    w.imm_data = 77;
    p.post_send(true, w);
    p.run();
    assert_eq!(p.sends(true).len(), 2);
    let r = p.recvs(false);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Recv, 3000),
            (2, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 4096)
        ]
    );
    assert_eq!(contents(&dst, 0, 3000), data[..3000]);
    assert_eq!(contents(&dst, 4096, 4096), data[4096..]);
    assert!(p.a.ip.is_ipv6());
    p.assert_only_uc_requests_a_to_b();
    assert_eq!(p.wire().len(), 3 + 4);
    assert_eq!(p.net.counters().icrc_errors.load(Ordering::Relaxed), 0);
}

/// xorshift64*: a small deterministic generator for the tests.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
}

#[test]
fn many_messages_over_a_lossy_reordering_network() {
    const N: usize = 400;
    const SLOT: usize = 2048;
    let mtu = Mtu::Mtu256;
    let m = mtu.bytes() as usize;
    let faults = Faults {
        // Every packet leaves at once (UC does not pace): a held-back one
        // arrives after all the others.
        reorder: 0.05,
        reorder_ns: 30_000,
        ..Faults::default()
    };
    let mut p = Uc::build(7, faults, mtu, false, 1024, None);
    p.net.trace = None;
    // 5% loss, decided and recorded here: (PSN -> lost).
    let lost: Arc<Mutex<HashMap<u32, bool>>> = Arc::default();
    let l = lost.clone();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    p.net.set_filter(move |w: &Wire<'_>| {
        let drop = rng.chance(0.05);
        l.lock().unwrap().insert(w.pkt.bth.psn.value(), drop);
        if drop {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let src = p.mr(true, N * SLOT, RW);
    let dst = p.mr(false, N * SLOT, RW); // WRITE targets, one slot each
    let rbuf = p.mr(false, N * SLOT, RW); // receive buffers, one per WR
    let mut rng = Rng(42);
    let mut msgs = Vec::new(); // (is_write, len, first PSN, packets)
    let mut psn = Psn::new(PSN_A);
    for k in 0..N {
        let len = 4 + rng.below(5 * m as u64 - 4) as usize;
        let mut data = pattern(len, k as u8);
        data[..4].copy_from_slice(&(k as u32).to_le_bytes());
        src.write(k * SLOT, &data).unwrap();
        let is_write = rng.below(2) == 0;
        let mut w = wr(
            k as u64,
            if is_write {
                WrOpcode::RdmaWriteWithImm
            } else {
                WrOpcode::Send
            },
            &[sge(&src, (k * SLOT) as u64, len as u32)],
        );
        w.imm_data = k as u32;
        w.remote_addr = dst.iova() + (k * SLOT) as u64;
        w.rkey = dst.rkey();
        p.post_recv(
            false,
            1000 + k as u64,
            &[sge(&rbuf, (k * SLOT) as u64, SLOT as u32)],
        );
        p.post_send(true, w);
        let n = npkts(len, m);
        msgs.push((is_write, len, data, psn, n));
        psn = psn.add(n);
    }
    p.run();
    let total_pkts: u32 = msgs.iter().map(|x| x.4).sum();
    // The sender knows nothing of the loss.
    let s = p.sends(true);
    assert_eq!(s.len(), N);
    assert!(s
        .iter()
        .enumerate()
        .all(|(k, w)| w.wr_id == k as u64 && w.status == WcStatus::Success));
    let lost = lost.lock().unwrap().clone();
    assert_eq!(lost.len(), total_pkts as usize, "PSNs do not repeat");
    let n_lost = lost.values().filter(|d| **d).count() as u64;
    assert!(n_lost > 0);
    // Packet counts add up.
    let sent = p.a.counters.sent_pkts.load(Ordering::Relaxed);
    let rcvd = p.b.counters.rcvd_pkts.load(Ordering::Relaxed);
    assert_eq!(sent, total_pkts as u64);
    assert_eq!(rcvd + n_lost, sent);
    assert_eq!(p.b.counters.sent_pkts.load(Ordering::Relaxed), 0);
    // Every message that completes is whole, exact, once, and none of
    // its packets was lost.
    let r = p.recvs(false);
    let mut done = BTreeSet::new();
    for wc in &r {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        let slot = (wc.wr_id - 1000) as usize;
        let k = if wc.opcode == WcOpcode::RecvRdmaWithImm {
            wc.imm_data as usize
        } else {
            let mut b = [0u8; 4];
            rbuf.read(slot * SLOT, &mut b).unwrap();
            u32::from_le_bytes(b) as usize
        };
        assert!(k < N, "{wc:?}");
        let (is_write, len, data, first, n) = &msgs[k];
        assert!(done.insert(k), "message {k} completed twice");
        assert_eq!(wc.byte_len as usize, *len, "message {k}");
        if *is_write {
            assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
            assert_eq!(&contents(&dst, k * SLOT, *len), data, "message {k}");
        } else {
            assert_eq!(wc.opcode, WcOpcode::Recv);
            assert_eq!(&contents(&rbuf, slot * SLOT, *len), data, "message {k}");
        }
        for i in 0..*n {
            assert!(!lost[&first.add(i).value()], "message {k} lost a packet");
        }
    }
    let intact = msgs
        .iter()
        .filter(|(_, _, _, first, n)| (0..*n).all(|i| !lost[&first.add(i).value()]))
        .count();
    assert!(
        done.len() * 10 >= intact * 7,
        "{} of {intact} intact messages completed",
        done.len()
    );
    assert!(done.len() < N);
    let dropped = p.dropped_msgs(false);
    assert!(dropped > 0);
    assert_eq!(p.state(false), QpState::Rts);
    // Every receive WR is accounted for: completed now, or flushed at ERR
    // (including one a dropped SEND may hold).
    p.modify_state(false, QpState::Err);
    let flushed = p.recvs(false);
    assert!(flushed.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(r.len() + flushed.len(), N);
}

#[test]
fn random_packets_never_break_the_responder() {
    let mtu = Mtu::Mtu256;
    let mut p = Uc::new(mtu);
    let dst = p.mr(false, 8192, RW);
    for i in 0..64 {
        let len = [0u32, 10, 256, 300, 1024][i % 5];
        p.post_recv(false, i as u64, &[sge(&dst, 0, len)]);
    }
    let uc: Vec<Opcode> = (0x20..=0x2b).map(Opcode).collect();
    let mut rng = Rng(5);
    for _ in 0..3000 {
        let op = if rng.below(20) == 0 {
            Opcode::RC_SEND_ONLY
        } else {
            uc[rng.below(uc.len() as u64) as usize]
        };
        let id = p.b.id;
        let epsn = Psn::new(p.net.qp(id).attr().rq_psn);
        let psn = match rng.below(4) {
            0 => epsn.add(rng.below(3) as u32),
            1 => epsn.sub(rng.below(3) as u32),
            _ => epsn,
        };
        let plen = [0usize, 1, 255, 256, 257, 100][rng.below(6) as usize];
        let reth = RethRepr {
            va: if rng.below(2) == 0 {
                dst.iova() + rng.below(8192)
            } else {
                rng.next()
            },
            rkey: if rng.below(3) == 0 {
                rng.next() as u32
            } else {
                dst.rkey()
            },
            dma_len: [0u32, 1, 256, 700, u32::MAX][rng.below(5) as usize],
        };
        inject(&mut p, op, psn, &vec![0x77; plen], Some(reth));
        if rng.below(8) == 0 {
            p.run();
        }
    }
    p.run();
    assert_eq!(p.state(false), QpState::Rts);
    assert_eq!(p.b.counters.sent_pkts.load(Ordering::Relaxed), 0);
    let done = p.recvs(false);
    for wc in &done {
        assert!(
            matches!(wc.status, WcStatus::Success | WcStatus::LocLenErr),
            "{wc:?}"
        );
    }
    let completed = done.len();
    // Every receive WR is accounted for.
    p.modify_state(false, QpState::Err);
    let flushed = p.recvs(false);
    assert!(flushed.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(completed + flushed.len(), 64);
    // Reconnected, b takes a real message.
    p.modify_state(false, QpState::Reset);
    let (a_ip, a_qpn, id) = (p.a.ip, p.a.qpn, p.b.id);
    uc_connect(p.net.qp(id), a_ip, a_qpn, PSN_A, PSN_B, mtu, true);
    let src = p.mr(true, 100, RW);
    src.write(0, &[9u8; 100]).unwrap();
    let fresh = p.mr(false, 100, RW);
    p.post_recv(false, 999, &[sge(&fresh, 0, 100)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 100)]));
    p.run();
    let r = p.recvs(false);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        vec![(999, 100)]
    );
    assert_eq!(contents(&fresh, 0, 100), vec![9u8; 100]);
}
