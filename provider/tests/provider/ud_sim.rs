//! UD (unreliable datagram) QPs on the simulated network: datagrams with
//! their GRH area over IPv4 and IPv6, one QP talking to several, Q_Keys,
//! what a missing or small receive buffer costs, local errors and SQE,
//! solicited events, flush, duplicates, and a lossy, duplicating,
//! corrupting, reordering network.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uroce_provider::qp_attr::{AddressVector, AttrMask, ModifyError, QpAttr, QKEY_CONTROLLED};
use uroce_provider::sans_io::cq::CompChannel;
use uroce_provider::sans_io::cq::CqInner;
use uroce_provider::sans_io::events::{EventElement, EventType};
use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::{Faults, SimNet, Verdict};
use uroce_provider::sans_io::transport::ud::{grh_source, UdQp, GRH_LEN};
use uroce_provider::sans_io::transport::{Nanos, QpConfig, RecvQueue};
use uroce_provider::testing::{sge, side_with, ud_up, PairParams, Side};
use uroce_provider::types::*;
use uroce_wire::packet::{self, Headers, ParsedPacket};
use uroce_wire::{BthRepr, DethRepr, IpContext, Opcode, Psn};

const SEC: u64 = 1_000_000_000;
const PD: u32 = 1;
/// The Q_Key rdma-core's ud_pingpong uses.
const QKEY: u32 = 0x1111_1111;
/// First PSN of a's datagrams: close to the 24-bit wrap.
const PSN_A: u32 = 0xff_fffd;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn n(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A UD endpoint at `ip` (queues 512 deep); `edit` may change its
/// configuration before the QP is built.
fn ud_side(net: &mut SimNet, ip: IpAddr, qpn: u32, edit: impl FnOnce(&mut QpConfig)) -> Side {
    let p = PairParams {
        depth: 512,
        ..PairParams::default()
    };
    side_with(net, ip, qpn, &p, |mut cfg| {
        edit(&mut cfg);
        Box::new(UdQp::new(cfg))
    })
}

/// A network (seeded) with UD QPs 0x11 at 10.0.0.1 and 0x22 at 10.0.0.2,
/// both in RTS with Q_Key [`QKEY`].
fn pair(seed: u64) -> (SimNet, Side, Side) {
    let mut net = SimNet::new(seed, Faults::default());
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |_| {});
    up(&mut net, &a, QKEY, 0);
    up(&mut net, &b, QKEY, 0);
    (net, a, b)
}

/// RESET -> INIT -> RTR -> RTS with the attributes UD takes.
fn up(net: &mut SimNet, s: &Side, qkey: u32, sq_psn: u32) {
    ud_up(net.qp(s.id), qkey, sq_psn);
}

fn modify_state(net: &mut SimNet, s: &Side, to: QpState) {
    let attr = QpAttr {
        qp_state: to,
        ..QpAttr::default()
    };
    net.qp(s.id).modify(&attr, AttrMask::STATE).expect("modify");
}

fn state(net: &mut SimNet, s: &Side) -> QpState {
    net.qp(s.id).state()
}

fn mr(s: &Side, len: usize) -> Arc<MrInner> {
    s.keys
        .register_zeroed(PD, len, Access::LOCAL_WRITE)
        .expect("alloc")
}

fn post_recv(s: &Side, wr_id: u64, sges: &[Sge]) {
    s.rq.post(RecvWr {
        wr_id,
        sg_list: sges.iter().copied().collect(),
    })
    .expect("recv queue full");
}

/// Where `to` is, with our usual Q_Key.
fn dest(to: &Side) -> UdDest {
    UdDest {
        ip: to.ip,
        remote_qpn: to.qpn,
        remote_qkey: QKEY,
        tclass: 0,
        hop_limit: 64,
    }
}

/// A signaled UD send WR.
fn ud_wr(id: u64, op: WrOpcode, sges: &[Sge], to: UdDest) -> SendWr {
    let mut w = SendWr::new(id, op);
    w.flags = SendFlags::SIGNALED;
    w.sg_list = sges.iter().copied().collect();
    w.ud = Some(to);
    w
}

fn run(net: &mut SimNet) {
    net.run_until(10 * SEC, |_| false);
}

fn drain(cq: &CqInner) -> Vec<Wc> {
    let mut v = Vec::new();
    while let Some(wc) = cq.poll_one() {
        v.push(wc);
    }
    v
}

fn contents(mr: &MrInner, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).unwrap();
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

/// The packets delivered so far (source, destination, UDP payload).
fn delivered(net: &SimNet) -> Vec<(IpAddr, IpAddr, Vec<u8>)> {
    net.trace
        .as_ref()
        .expect("trace on")
        .iter()
        .map(|(_, s, d, b)| (*s, *d, b.clone()))
        .collect()
}

fn ctx(src: IpAddr, dst: IpAddr) -> IpContext {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpContext::for_socket_v4(s, d, 4791, 4791),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpContext::v6(s, d, 4791, 4791),
        _ => unreachable!(),
    }
}

/// A UD packet as a hostile or broken peer might send it.
#[allow(clippy::too_many_arguments)]
fn ud_packet(
    src: IpAddr,
    dst: IpAddr,
    op: Opcode,
    dest_qp: u32,
    psn: u32,
    deth: Option<DethRepr>,
    pkey: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut h = Headers::new(BthRepr {
        opcode: op,
        pkey,
        dest_qp,
        psn: Psn::new(psn),
        ..BthRepr::default()
    });
    let info = op.info().unwrap();
    if info.has(uroce_wire::Ext::Deth) {
        h.deth = Some(deth.unwrap_or(DethRepr {
            qkey: QKEY,
            src_qp: 0x77,
        }));
    }
    if info.has(uroce_wire::Ext::Reth) {
        h.reth = Some(uroce_wire::RethRepr::default());
    }
    if info.has_imm() {
        h.imm = Some(0x1234);
    }
    if info.has(uroce_wire::Ext::Ieth) {
        h.ieth = Some(1);
    }
    if info.has(uroce_wire::Ext::Aeth) {
        h.aeth = Some(uroce_wire::AethRepr::default());
    }
    if info.has(uroce_wire::Ext::AtomicEth) {
        h.atomic_eth = Some(uroce_wire::AtomicEthRepr::default());
    }
    if info.has(uroce_wire::Ext::AtomicAckEth) {
        h.atomic_ack = Some(uroce_wire::AtomicAckEthRepr::default());
    }
    if info.has(uroce_wire::Ext::Feth) {
        h.feth = Some(uroce_wire::FethRepr::default());
    }
    let mut buf = vec![0u8; 8192];
    let n = packet::emit(&h, payload, &mut buf, &ctx(src, dst)).expect("emit");
    buf.truncate(n);
    buf
}

/// Checks the GRH area of a datagram from `src` to `dst` whose UDP payload
/// was `udp_len` bytes (sent by a simulated socket: DF, ID 0, TTL 64).
fn check_grh(grh: &[u8], src: IpAddr, dst: IpAddr, udp_len: usize) {
    assert_eq!(grh.len(), GRH_LEN);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            assert_eq!(grh[..20], [0u8; 20], "20 zero bytes before the IPv4 header");
            let h = &grh[20..];
            assert_eq!(h[0], 0x45, "version 4, IHL 5");
            assert_eq!(h[1], 0, "TOS");
            assert_eq!(u16::from_be_bytes([h[2], h[3]]) as usize, 28 + udp_len);
            assert_eq!(u16::from_be_bytes([h[4], h[5]]), 0, "ID");
            assert_eq!(u16::from_be_bytes([h[6], h[7]]), 0x4000, "DF");
            assert_eq!((h[8], h[9]), (64, 17), "TTL, protocol");
            // The checksum: the ones' complement sum of all ten words is
            // 0xffff.
            let mut sum: u32 = (0..10)
                .map(|i| u32::from(u16::from_be_bytes([h[2 * i], h[2 * i + 1]])))
                .sum();
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "IPv4 header checksum");
            assert_eq!(h[12..16], s.octets());
            assert_eq!(h[16..20], d.octets());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let vtf = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
            assert_eq!(vtf, 6 << 28, "version 6, traffic class 0, flow label 0");
            assert_eq!(u16::from_be_bytes([grh[4], grh[5]]) as usize, 8 + udp_len);
            assert_eq!((grh[6], grh[7]), (17, 64), "next header, hop limit");
            assert_eq!(grh[8..24], s.octets());
            assert_eq!(grh[24..40], d.octets());
        }
        _ => unreachable!(),
    }
    assert_eq!(grh_source(grh), Some(src));
}

/// a sends b datagrams of several sizes, with and without immediate data,
/// inline and from memory, signaled and not; b's receive buffers get the
/// GRH area and the payload at offset 40.
fn pair_roundtrip(v6: bool) {
    let (a_ip, b_ip) = if v6 {
        (ip("fd00::1"), ip("fd00::2"))
    } else {
        (ip("10.0.0.1"), ip("10.0.0.2"))
    };
    let mut net = SimNet::new(1, Faults::default());
    let a = ud_side(&mut net, a_ip, 0x11, |_| {});
    let b = ud_side(&mut net, b_ip, 0x22, |_| {});
    up(&mut net, &a, QKEY, PSN_A);
    up(&mut net, &b, QKEY, 0);
    net.trace = Some(Vec::new());
    const SLOT: usize = 8192;
    let lens = [0usize, 1, 61, 1000, 4095, 4096];
    let src = mr(&a, lens.len() * 2 * SLOT);
    let dst = mr(&b, (lens.len() * 2 + 1) * SLOT);
    // (wr_id, len, imm, signaled, data)
    let mut sent = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        for imm in [false, true] {
            let k = i * 2 + imm as usize;
            let data = pattern(len, k as u8);
            src.write(k * SLOT, &data).unwrap();
            post_recv(
                &b,
                100 + k as u64,
                &[sge(&dst, (k * SLOT) as u64, 40 + 4096)],
            );
            let op = if imm {
                WrOpcode::SendWithImm
            } else {
                WrOpcode::Send
            };
            let mut w = ud_wr(
                k as u64,
                op,
                &[sge(&src, (k * SLOT) as u64, len as u32)],
                dest(&b),
            );
            w.imm_data = 0xab00_0000 | k as u32;
            let signaled = k % 5 != 3;
            if !signaled {
                w.flags -= SendFlags::SIGNALED;
            }
            a.sq.post(w).unwrap();
            sent.push((k as u64, len, imm, signaled, data));
        }
    }
    // And one inline datagram.
    let k = sent.len();
    let mut w = ud_wr(k as u64, WrOpcode::Send, &[], dest(&b));
    w.flags |= SendFlags::INLINE;
    w.inline_data.extend_from_slice(b"inline datagram");
    a.sq.post(w).unwrap();
    post_recv(
        &b,
        100 + k as u64,
        &[sge(&dst, (k * SLOT) as u64, 40 + 100)],
    );
    sent.push((k as u64, 15, false, true, b"inline datagram".to_vec()));
    run(&mut net);

    // The sender: signaled WRs complete in order, unsignaled ones retire.
    let s = drain(&a.send_cq);
    let want: Vec<_> = sent
        .iter()
        .filter(|x| x.3)
        .map(|x| (x.0, WcStatus::Success, WcOpcode::Send, x.1 as u32))
        .collect();
    assert_eq!(
        s.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        want
    );
    assert_eq!(a.sq.outstanding(), 0);
    assert_eq!(n(&a.counters.sent_pkts), sent.len() as u64);
    assert_eq!(
        net.qp(a.id).attr().sq_psn,
        Psn::new(PSN_A).add(sent.len() as u32).value()
    );

    // The wire: one UD packet per WR, consecutive PSNs across the wrap.
    let wire = delivered(&net);
    assert_eq!(wire.len(), sent.len());
    let r = drain(&b.recv_cq);
    assert_eq!(r.len(), sent.len());
    for (i, ((s_ip, d_ip, bytes), (wr_id, len, imm, _, data))) in wire.iter().zip(&sent).enumerate()
    {
        assert_eq!((*s_ip, *d_ip), (a_ip, b_ip));
        let p = packet::parse(bytes).unwrap();
        let h = &p.headers();
        let op = if *imm {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        assert_eq!(h.bth.opcode, op);
        assert_eq!(h.bth.dest_qp, b.qpn);
        assert_eq!(h.bth.pkey, 0xffff);
        assert_eq!(h.bth.psn, Psn::new(PSN_A).add(i as u32));
        assert!(!h.bth.ack_req && !h.bth.se);
        assert_eq!(
            h.deth,
            Some(DethRepr {
                qkey: QKEY,
                src_qp: a.qpn
            })
        );
        assert_eq!(h.imm, imm.then_some(0xab00_0000 | *wr_id as u32));
        assert_eq!(p.payload, &data[..]);

        // The receiver.
        let wc = &r[i];
        assert_eq!(wc.wr_id, 100 + wr_id);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert_eq!(wc.byte_len as usize, 40 + len);
        assert_eq!(wc.src_qp, a.qpn);
        assert_eq!(wc.qp_num, b.qpn);
        if *imm {
            assert_eq!(wc.wc_flags, WcFlags::GRH | WcFlags::WITH_IMM);
            assert_eq!(wc.imm_data, 0xab00_0000 | *wr_id as u32);
        } else {
            assert_eq!(wc.wc_flags, WcFlags::GRH);
        }
        let off = *wr_id as usize * SLOT;
        check_grh(&contents(&dst, off, 40), a_ip, b_ip, bytes.len());
        assert_eq!(&contents(&dst, off + 40, *len), data);
        // Nothing written past the datagram.
        assert_eq!(contents(&dst, off + 40 + len, 16), vec![0; 16]);
    }
    assert_eq!(n(&b.counters.sent_pkts), 0, "UD never answers");
    assert_eq!(n(&b.counters.rcvd_pkts), sent.len() as u64);
    assert_eq!(state(&mut net, &b), QpState::Rts);
}

#[test]
fn ipv4_pair_delivers_datagrams_with_their_grh() {
    pair_roundtrip(false);
}

#[test]
fn ipv6_pair_delivers_datagrams_with_their_grh() {
    pair_roundtrip(true);
}

#[test]
fn one_qp_hears_two_senders_and_answers_each_from_the_grh() {
    let mut net = SimNet::new(2, Faults::default());
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |_| {});
    let c = ud_side(&mut net, ip("10.0.0.3"), 0x33, |_| {});
    for (s, psn) in [(&a, 1), (&b, 2), (&c, 3)] {
        up(&mut net, s, QKEY, psn);
    }
    let cbuf = mr(&c, 4096);
    post_recv(&c, 1, &[sge(&cbuf, 0, 1024)]);
    post_recv(&c, 2, &[sge(&cbuf, 1024, 1024)]);
    let mut bufs = Vec::new();
    for (s, msg) in [(&a, &b"hello from a"[..]), (&b, &b"b says hi"[..])] {
        let m = mr(s, 1024);
        m.write(0, msg).unwrap();
        post_recv(s, 50, &[sge(&m, 512, 512)]);
        s.sq.post(ud_wr(
            7,
            WrOpcode::Send,
            &[sge(&m, 0, msg.len() as u32)],
            dest(&c),
        ))
        .unwrap();
        bufs.push((m, msg));
    }
    run(&mut net);
    let r = drain(&c.recv_cq);
    assert_eq!(r.len(), 2);
    // Answer each sender where the GRH and src_qp say it is.
    let creply = mr(&c, 1024);
    let mut seen = HashSet::new();
    for (i, wc) in r.iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        let off = (wc.wr_id as usize - 1) * 1024;
        let grh = contents(&cbuf, off, 40);
        let from = grh_source(&grh).expect("GRH names the sender");
        let msg = contents(&cbuf, off + 40, wc.byte_len as usize - 40);
        let (who, qpn) = if from == a.ip {
            (&a, a.qpn)
        } else {
            (&b, b.qpn)
        };
        assert_eq!(from, who.ip);
        assert_eq!(wc.src_qp, qpn, "src_qp names the sending QP");
        assert!(seen.insert(qpn));
        let mut reply = b"re: ".to_vec();
        reply.extend_from_slice(&msg);
        creply.write(i * 128, &reply).unwrap();
        c.sq.post(ud_wr(
            20 + i as u64,
            WrOpcode::SendWithImm,
            &[sge(&creply, (i * 128) as u64, reply.len() as u32)],
            UdDest {
                ip: from,
                remote_qpn: wc.src_qp,
                remote_qkey: QKEY,
                tclass: 0,
                hop_limit: 64,
            },
        ))
        .unwrap();
    }
    run(&mut net);
    for (s, (m, msg)) in [&a, &b].into_iter().zip(&bufs) {
        let r = drain(&s.recv_cq);
        assert_eq!(r.len(), 1, "one reply each");
        assert_eq!((r[0].wr_id, r[0].src_qp), (50, c.qpn));
        let mut want = b"re: ".to_vec();
        want.extend_from_slice(msg);
        assert_eq!(r[0].byte_len as usize, 40 + want.len());
        assert_eq!(contents(m, 512 + 40, want.len()), want);
        assert_eq!(grh_source(&contents(m, 512, 40)), Some(c.ip));
    }
}

#[test]
fn a_qkey_mismatch_is_dropped_and_counted() {
    let (mut net, a, b) = pair(3);
    let src = mr(&a, 64);
    src.write(0, b"payload").unwrap();
    let dst = mr(&b, 256);
    post_recv(&b, 1, &[sge(&dst, 0, 256)]);
    let wrong = UdDest {
        remote_qkey: QKEY ^ 1,
        tclass: 0,
        hop_limit: 64,
        ..dest(&b)
    };
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 7)], wrong))
        .unwrap();
    run(&mut net);
    // UD is unreliable: the sender learns nothing.
    assert_eq!(drain(&a.send_cq)[0].status, WcStatus::Success);
    assert!(drain(&b.recv_cq).is_empty());
    assert_eq!(n(&b.counters.qkey_violations), 1);
    assert_eq!(b.rq.len(), 1, "the receive WR was not consumed");
    assert_eq!(state(&mut net, &b), QpState::Rts);
    a.sq.post(ud_wr(2, WrOpcode::Send, &[sge(&src, 0, 7)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!((r.len(), r[0].wr_id, r[0].byte_len), (1, 1, 47));
    assert_eq!(contents(&dst, 40, 7), b"payload");
    assert_eq!(n(&b.counters.qkey_violations), 1);
}

#[test]
fn a_wr_qkey_with_the_high_bit_sends_the_qps_own() {
    let (mut net, a, b) = pair(4);
    net.trace = Some(Vec::new());
    let src = mr(&a, 64);
    let dst = mr(&b, 1024);
    for i in 0..4 {
        post_recv(&b, i, &[sge(&dst, i * 256, 256)]);
    }
    let controlled = UdDest {
        remote_qkey: QKEY_CONTROLLED | 0x1234,
        tclass: 0,
        hop_limit: 64,
        ..dest(&b)
    };
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 8)], controlled))
        .unwrap();
    run(&mut net);
    assert_eq!(drain(&b.recv_cq).len(), 1, "sent with the QP's Q_Key");
    // With another Q_Key on a's QP (RTS -> RTS may change it), a
    // controlled WR Q_Key sends that one, which b refuses; a WR naming
    // b's Q_Key gets through.
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qkey: 0x0bad_0bad,
        ..QpAttr::default()
    };
    net.qp(a.id)
        .modify(&attr, AttrMask::STATE | AttrMask::QKEY)
        .unwrap();
    assert_eq!(net.qp(a.id).attr().qkey, 0x0bad_0bad);
    a.sq.post(ud_wr(2, WrOpcode::Send, &[sge(&src, 0, 8)], controlled))
        .unwrap();
    a.sq.post(ud_wr(3, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!(r.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1]);
    assert_eq!(n(&b.counters.qkey_violations), 1);
    let qkeys: Vec<u32> = delivered(&net)
        .iter()
        .map(|(_, _, b)| packet::parse(b).unwrap().deth().unwrap().qkey)
        .collect();
    assert_eq!(qkeys, vec![QKEY, 0x0bad_0bad, QKEY]);
    // Setting a controlled Q_Key on the QP is refused (unprivileged).
    let attr = QpAttr {
        qp_state: QpState::Rts,
        qkey: QKEY_CONTROLLED | 1,
        ..QpAttr::default()
    };
    assert!(matches!(
        net.qp(a.id).modify(&attr, AttrMask::STATE | AttrMask::QKEY),
        Err(ModifyError::BadValue {
            attr: "IBV_QP_QKEY",
            ..
        })
    ));
    assert_eq!(net.qp(a.id).attr().qkey, 0x0bad_0bad);
}

#[test]
fn without_a_receive_wr_a_datagram_is_dropped_and_counted() {
    let (mut net, a, b) = pair(5);
    net.trace = Some(Vec::new());
    let src = mr(&a, 64);
    for i in 0..4u8 {
        src.write(i as usize * 16, &[i; 16]).unwrap();
    }
    for i in 0..3 {
        a.sq.post(ud_wr(i, WrOpcode::Send, &[sge(&src, i * 16, 16)], dest(&b)))
            .unwrap();
    }
    run(&mut net);
    assert_eq!(drain(&a.send_cq).len(), 3);
    assert!(drain(&b.recv_cq).is_empty());
    assert_eq!(n(&b.counters.ud_no_recv_drops), 3);
    assert_eq!(state(&mut net, &b), QpState::Rts);
    // Once a WR is posted, the next datagram lands in it.
    let dst = mr(&b, 256);
    post_recv(&b, 9, &[sge(&dst, 0, 256)]);
    a.sq.post(ud_wr(3, WrOpcode::Send, &[sge(&src, 48, 16)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!((r.len(), r[0].wr_id, r[0].byte_len), (1, 9, 56));
    assert_eq!(contents(&dst, 40, 16), vec![3u8; 16]);
    assert_eq!(n(&b.counters.ud_no_recv_drops), 3);
    // A datagram lost for want of a WR is not a duplicate if it comes
    // again: the network repeating the first one delivers it, once.
    let first = delivered(&net)[0].2.clone();
    post_recv(&b, 10, &[sge(&dst, 0, 256)]);
    net.inject(a.ip, b.ip, first.clone());
    net.inject(a.ip, b.ip, first);
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!((r.len(), r[0].wr_id), (1, 10));
    assert_eq!(contents(&dst, 40, 16), vec![0u8; 16]);
    assert_eq!(n(&b.counters.duplicate_requests), 1);
}

#[test]
fn local_send_errors_complete_in_error_move_to_sqe_and_recover() {
    let mut net = SimNet::new(6, Faults::default());
    // a's port runs at 1024 bytes.
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |cfg| {
        cfg.limits.active_mtu = Mtu::Mtu1024;
    });
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |_| {});
    up(&mut net, &a, QKEY, 100);
    up(&mut net, &b, QKEY, 0);
    net.trace = Some(Vec::new());
    assert_eq!(net.qp(a.id).attr().path_mtu, Mtu::Mtu1024);
    let src = mr(&a, 4096);
    src.write(0, &pattern(4096, 9)).unwrap();
    let dst = mr(&b, 64 * 2048);
    for i in 0..64 {
        post_recv(&b, i, &[sge(&dst, i * 2048, 2048)]);
    }
    let ok = |id| ud_wr(id, WrOpcode::Send, &[sge(&src, 0, 1024)], dest(&b));
    let v6 = UdDest {
        ip: ip("fd00::2"),
        ..dest(&b)
    };
    let mut no_dest = ok(0);
    no_dest.ud = None;
    let mut write = ok(0);
    write.opcode = WrOpcode::RdmaWrite;
    let mut bad_lkey = ok(0);
    bad_lkey.sg_list[0].lkey ^= 1;
    let mut long_inline = ud_wr(0, WrOpcode::Send, &[], dest(&b));
    long_inline.flags |= SendFlags::INLINE;
    long_inline.inline_data.extend_from_slice(&[1u8; 1025]);
    let mut unsignaled_too_long = ud_wr(0, WrOpcode::Send, &[sge(&src, 0, 1025)], dest(&b));
    unsignaled_too_long.flags = SendFlags::empty();
    let cases: Vec<(SendWr, WcStatus, WcOpcode)> = vec![
        (
            ud_wr(0, WrOpcode::Send, &[sge(&src, 0, 1025)], dest(&b)),
            WcStatus::LocLenErr,
            WcOpcode::Send,
        ),
        (unsignaled_too_long, WcStatus::LocLenErr, WcOpcode::Send),
        (long_inline, WcStatus::LocLenErr, WcOpcode::Send),
        (no_dest, WcStatus::LocQpOpErr, WcOpcode::Send),
        (write, WcStatus::LocQpOpErr, WcOpcode::RdmaWrite),
        (
            ud_wr(0, WrOpcode::Send, &[sge(&src, 0, 8)], v6),
            WcStatus::LocQpOpErr,
            WcOpcode::Send,
        ),
        (bad_lkey, WcStatus::LocProtErr, WcOpcode::Send),
    ];
    let mut wr_id = 0u64;
    let mut good = 0usize;
    for (mut bad, status, opcode) in cases {
        // A good WR, the bad one, and one more behind it.
        let first = wr_id;
        a.sq.post(ok(first)).unwrap();
        bad.wr_id = first + 1;
        a.sq.post(bad).unwrap();
        a.sq.post(ok(first + 2)).unwrap();
        wr_id += 3;
        run(&mut net);
        good += 1;
        let s = drain(&a.send_cq);
        assert_eq!(
            s.iter()
                .map(|w| (w.wr_id, w.status, w.opcode))
                .collect::<Vec<_>>(),
            vec![
                (first, WcStatus::Success, WcOpcode::Send),
                (first + 1, status, opcode),
                (first + 2, WcStatus::WrFlushErr, WcOpcode::Send)
            ],
            "{status:?}"
        );
        assert_eq!(s[0].byte_len, 1024);
        assert_eq!(state(&mut net, &a), QpState::Sqe);
        assert_eq!(a.sq.outstanding(), 0);
        // Posted in SQE: flushed.
        a.sq.post(ok(wr_id)).unwrap();
        wr_id += 1;
        run(&mut net);
        assert_eq!(drain(&a.send_cq)[0].status, WcStatus::WrFlushErr);
        // The receive queue works on in SQE.
        let back = mr(&b, 16);
        let abuf = mr(&a, 64);
        post_recv(&a, 500, &[sge(&abuf, 0, 64)]);
        b.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&back, 0, 16)], dest(&a)))
            .unwrap();
        run(&mut net);
        assert_eq!(drain(&b.send_cq).len(), 1);
        let r = drain(&a.recv_cq);
        assert_eq!((r.len(), r[0].status), (1, WcStatus::Success));
        modify_state(&mut net, &a, QpState::Rts);
        // Only the good datagram of each round went out, with consecutive
        // PSNs.
        let r = drain(&b.recv_cq);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].byte_len, 40 + 1024);
        let from_a: Vec<u32> = delivered(&net)
            .iter()
            .filter(|(s, _, _)| *s == a.ip)
            .map(|(_, _, b)| packet::parse(b).unwrap().bth.psn.value())
            .collect();
        assert_eq!(from_a, (100..100 + good as u32).collect::<Vec<_>>());
    }
    // Recovered: the next WR goes out.
    a.sq.post(ok(999)).unwrap();
    run(&mut net);
    assert_eq!(drain(&a.send_cq)[0].status, WcStatus::Success);
    assert_eq!(drain(&b.recv_cq).len(), 1);
}

/// A datagram too long for the receive WR at the head (GRH + payload) is
/// dropped and counted, and the WR stays for the next datagram (IBA
/// 9.9.3 class D, rxe since 6.10); before, uroce completed the WR with
/// LOC_LEN_ERR.
#[test]
fn a_datagram_too_long_for_the_receive_wr_is_dropped_and_the_wr_stays() {
    let (mut net, a, b) = pair(7);
    let src = mr(&a, 256);
    src.write(0, &pattern(256, 1)).unwrap();
    let dst = mr(&b, 1024);
    // One byte short of 100 bytes of payload, then exactly enough across
    // SGEs that split the GRH and the payload.
    post_recv(&b, 1, &[sge(&dst, 0, 40 + 99)]);
    post_recv(
        &b,
        3,
        &[sge(&dst, 300, 17), sge(&dst, 400, 60), sge(&dst, 500, 63)],
    );
    // 100 bytes: dropped, WR 1 stays; 0 bytes: WR 1 holds it; 100 bytes:
    // WR 3.
    for (id, len) in [(1, 100u32), (2, 0), (3, 100)] {
        a.sq.post(ud_wr(id, WrOpcode::Send, &[sge(&src, 0, len)], dest(&b)))
            .unwrap();
    }
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!(
        r.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        vec![(1, WcStatus::Success, 40), (3, WcStatus::Success, 140)]
    );
    assert_eq!(n(&b.counters.ud_too_long_drops), 1);
    assert_eq!(grh_source(&contents(&dst, 0, 40)), Some(a.ip));
    assert_eq!(contents(&dst, 40, 99), vec![0; 99], "no payload written");
    let mut got = contents(&dst, 300, 17);
    got.extend(contents(&dst, 400, 60));
    got.extend(contents(&dst, 500, 63));
    assert_eq!(grh_source(&got[..40]), Some(a.ip));
    assert_eq!(got[40..], pattern(256, 1)[..100]);
    // Not even room for the GRH: dropped, and the WR is still there.
    post_recv(&b, 4, &[sge(&dst, 600, 39)]);
    a.sq.post(ud_wr(4, WrOpcode::Send, &[], dest(&b))).unwrap();
    run(&mut net);
    assert!(drain(&b.recv_cq).is_empty());
    assert_eq!((n(&b.counters.ud_too_long_drops), b.rq.len()), (2, 1));
    assert_eq!(state(&mut net, &b), QpState::Rts);
}

#[test]
fn a_bad_receive_lkey_is_a_local_protection_error_and_err() {
    let (mut net, a, b) = pair(8);
    let src = mr(&a, 64);
    let dst = mr(&b, 256);
    let mut bad = sge(&dst, 0, 256);
    bad.lkey ^= 0x100;
    post_recv(&b, 1, &[bad]);
    post_recv(&b, 2, &[sge(&dst, 0, 256)]);
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(state(&mut net, &b), QpState::Err);
}

#[test]
fn the_se_bit_wakes_a_cq_armed_for_solicited_completions() {
    let mut net = SimNet::new(9, Faults::default());
    let ch = Arc::new(CompChannel::new().unwrap());
    let rcq = CqInner::with_channel(64, Some(ch.clone()), 0x5e, None);
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |cfg| {
        cfg.recv_cq = rcq.clone();
    });
    up(&mut net, &a, QKEY, 0);
    up(&mut net, &b, QKEY, 0);
    net.trace = Some(Vec::new());
    let src = mr(&a, 64);
    let dst = mr(&b, 64 * 64);
    for i in 0..8 {
        post_recv(&b, i, &[sge(&dst, i * 64, 64)]);
    }
    assert!(rcq.req_notify(true));
    let send = |net: &mut SimNet, id: u64, op: WrOpcode, solicited: bool| {
        let mut w = ud_wr(id, op, &[sge(&src, 0, 8)], dest(&b));
        if solicited {
            w.flags |= SendFlags::SOLICITED;
        }
        a.sq.post(w).unwrap();
        run(net);
        let r = drain(&rcq);
        assert_eq!((r.len(), r[0].status), (1, WcStatus::Success));
    };
    send(&mut net, 1, WrOpcode::Send, false);
    send(&mut net, 2, WrOpcode::SendWithImm, false);
    assert!(
        ch.is_empty(),
        "unsolicited datagrams while armed solicited-only"
    );
    send(&mut net, 3, WrOpcode::Send, true);
    let ev = ch.get(Some(Duration::ZERO)).expect("a completion event");
    assert!(Arc::ptr_eq(&ev.upgrade().unwrap(), &rcq));
    // One-shot.
    send(&mut net, 4, WrOpcode::SendWithImm, true);
    assert!(ch.is_empty());
    rcq.req_notify(true);
    send(&mut net, 5, WrOpcode::SendWithImm, true);
    assert_eq!(ch.len(), 1);
    let se: Vec<bool> = delivered(&net)
        .iter()
        .map(|(_, _, b)| packet::parse(b).unwrap().bth.se)
        .collect();
    assert_eq!(se, vec![false, false, true, true, true]);
}

/// A modify to ERR first sends what was posted before it, as a NIC sends
/// the WQEs it fetched (librpma posts a SEND and at once disconnects):
/// those datagrams go out and complete; then everything else flushes in
/// posting order, receive WRs too.
#[test]
fn err_sends_what_was_posted_before_flushes_the_rest_and_reset_discards() {
    let (mut net, a, b) = pair(10);
    let src = mr(&a, 64);
    let buf = mr(&a, 1024);
    let bbuf = mr(&b, 1024);
    for i in 0..3u64 {
        let mut w = ud_wr(i, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b));
        if i == 1 {
            w.flags = SendFlags::empty();
        }
        a.sq.post(w).unwrap();
        post_recv(&a, 10 + i, &[sge(&buf, 0, 100)]);
        post_recv(&b, 20 + i, &[sge(&bbuf, 100 * i, 100)]);
    }
    modify_state(&mut net, &a, QpState::Err);
    assert_eq!(state(&mut net, &a), QpState::Err);
    run(&mut net);
    let s = drain(&a.send_cq);
    assert_eq!(
        s.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (0, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let got = drain(&b.recv_cq);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (20, WcStatus::Success),
            (21, WcStatus::Success),
            (22, WcStatus::Success)
        ]
    );
    let r = drain(&a.recv_cq);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(a.sq.outstanding(), 0);
    assert_eq!(n(&a.counters.sent_pkts), 3);
    // Posted in ERR: flushed; datagrams to a QP in ERR are dropped.
    a.sq.post(ud_wr(3, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    post_recv(&a, 13, &[sge(&buf, 0, 100)]);
    b.sq.post(ud_wr(99, WrOpcode::Send, &[], dest(&a))).unwrap();
    run(&mut net);
    assert_eq!(drain(&a.send_cq)[0].wr_id, 3);
    assert_eq!(drain(&a.recv_cq)[0].wr_id, 13);
    assert_eq!(n(&a.counters.dropped_pkts), 1);
    assert_eq!(n(&a.counters.sent_pkts), 3);
    // RESET discards without completions; the QP comes back up.
    a.sq.post(ud_wr(4, WrOpcode::Send, &[], dest(&b))).unwrap();
    post_recv(&a, 14, &[]);
    modify_state(&mut net, &a, QpState::Reset);
    assert!(drain(&a.send_cq).is_empty() && drain(&a.recv_cq).is_empty());
    assert_eq!(a.sq.outstanding(), 0);
    assert!(a.rq.is_empty());
    let attr = net.qp(a.id).attr();
    assert_eq!(
        (attr.qp_state, attr.qkey, attr.sq_psn),
        (QpState::Reset, 0, 0)
    );
    // (A PSN b has not seen from a: b drops repeats.)
    up(&mut net, &a, QKEY, 100);
    let bbuf = mr(&b, 64);
    post_recv(&b, 1, &[sge(&bbuf, 0, 64)]);
    a.sq.post(ud_wr(5, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    assert_eq!(drain(&a.send_cq)[0].status, WcStatus::Success);
    assert_eq!(drain(&b.recv_cq)[0].wr_id, 1);
}

#[test]
fn an_srqs_wrs_are_not_flushed_and_last_wqe_reached_is_reported() {
    let mut net = SimNet::new(11, Faults::default());
    let events = Arc::new(uroce_provider::sans_io::events::AsyncEvents::new().unwrap());
    let srq = Arc::new(RecvQueue::new_srq(16, 5, events).unwrap());
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    let q = srq.clone();
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, move |cfg| cfg.rq = q);
    up(&mut net, &a, QKEY, 0);
    up(&mut net, &b, QKEY, 0);
    let src = mr(&a, 64);
    let dst = mr(&b, 1024);
    for i in 0..3 {
        srq.post(RecvWr {
            wr_id: i,
            sg_list: [sge(&dst, i * 256, 256)].into_iter().collect(),
        })
        .unwrap();
    }
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    assert_eq!(drain(&b.recv_cq)[0].wr_id, 0);
    modify_state(&mut net, &b, QpState::Err);
    run(&mut net);
    assert!(drain(&b.recv_cq).is_empty());
    assert_eq!(srq.len(), 2);
    let e = b.events.get(Some(Duration::ZERO)).expect("an event");
    assert_eq!(e.event_type, EventType::QpLastWqeReached);
    assert_eq!(e.element, EventElement::Qp(b.qpn));
}

#[test]
fn sqd_starts_no_new_datagram_and_reports_drained() {
    let (mut net, a, b) = pair(12);
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    net.qp(a.id)
        .modify(&attr, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    let e = a.events.get(Some(Duration::ZERO)).expect("SQ_DRAINED");
    assert_eq!(e.event_type, EventType::SqDrained);
    let src = mr(&a, 64);
    let dst = mr(&b, 64);
    post_recv(&b, 1, &[sge(&dst, 0, 64)]);
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    assert!(drain(&a.send_cq).is_empty());
    assert_eq!(n(&a.counters.sent_pkts), 0);
    // Receiving goes on in SQD.
    let abuf = mr(&a, 64);
    post_recv(&a, 7, &[sge(&abuf, 0, 64)]);
    b.sq.post(ud_wr(2, WrOpcode::Send, &[], dest(&a))).unwrap();
    run(&mut net);
    assert_eq!(drain(&a.recv_cq).len(), 1);
    modify_state(&mut net, &a, QpState::Rts);
    run(&mut net);
    assert_eq!(drain(&a.send_cq)[0].status, WcStatus::Success);
    assert_eq!(drain(&b.recv_cq)[0].wr_id, 1);
}

#[test]
fn datagrams_the_network_duplicates_are_delivered_once() {
    let mut net = SimNet::new(13, Faults::default());
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    // A second QP at a's address, and a third sender elsewhere, both
    // starting at a's PSN.
    let a2 = ud_side(&mut net, ip("10.0.0.1"), 0x12, |_| {});
    let c = ud_side(&mut net, ip("10.0.0.3"), 0x11, |_| {});
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |_| {});
    for s in [&a, &a2, &c] {
        up(&mut net, s, QKEY, PSN_A);
    }
    up(&mut net, &b, QKEY, 0);
    net.trace = Some(Vec::new());
    net.set_filter(|_| Verdict::Duplicate);
    const N: u64 = 20;
    let src = mr(&a, 4 * N as usize);
    let dst = mr(&b, 128 * 64);
    for i in 0..64 {
        post_recv(&b, i, &[sge(&dst, i * 128, 128)]);
    }
    for i in 0..N {
        src.write(4 * i as usize, &(i as u32).to_le_bytes())
            .unwrap();
        a.sq.post(ud_wr(i, WrOpcode::Send, &[sge(&src, 4 * i, 4)], dest(&b)))
            .unwrap();
    }
    run(&mut net);
    assert_eq!(delivered(&net).len(), 2 * N as usize, "every packet twice");
    let r = drain(&b.recv_cq);
    let got: Vec<u32> = r
        .iter()
        .map(|wc| {
            let mut x = [0u8; 4];
            dst.read(wc.wr_id as usize * 128 + 40, &mut x).unwrap();
            u32::from_le_bytes(x)
        })
        .collect();
    assert_eq!(got, (0..N as u32).collect::<Vec<_>>(), "each datagram once");
    assert_eq!(n(&b.counters.duplicate_requests), N);
    net.clear_filter();
    // The network repeating an older datagram later: still a duplicate.
    let old = delivered(&net)[10].2.clone();
    net.inject(a.ip, b.ip, old);
    run(&mut net);
    assert!(drain(&b.recv_cq).is_empty());
    assert_eq!(n(&b.counters.duplicate_requests), N + 1);
    // The same PSN from another QP at the same address, and from the same
    // QP number at another address, are different datagrams.
    let m2 = mr(&a2, 4);
    let mc = mr(&c, 4);
    a2.sq
        .post(ud_wr(1, WrOpcode::Send, &[sge(&m2, 0, 4)], dest(&b)))
        .unwrap();
    c.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&mc, 0, 4)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    let mut srcs: Vec<u32> = r.iter().map(|w| w.src_qp).collect();
    srcs.sort();
    assert_eq!(srcs, vec![0x11, 0x12]);
    assert_eq!(n(&b.counters.duplicate_requests), N + 1);
}

/// splitmix64.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Datagram `seq` of sender `who`: (who, seq, len) in the first 12 bytes,
/// seeded bytes, and an FNV-1a hash of everything before it in the last
/// eight. 20..=1024 bytes.
fn datagram(who: u32, seq: u32) -> Vec<u8> {
    let h = mix(((who as u64) << 32) | seq as u64);
    let len = 20 + (h % 1005) as usize;
    let mut d = Vec::with_capacity(len);
    d.extend_from_slice(&who.to_le_bytes());
    d.extend_from_slice(&seq.to_le_bytes());
    d.extend_from_slice(&(len as u32).to_le_bytes());
    d.extend((0..len - 20).map(|i| (mix(h ^ i as u64) >> 7) as u8));
    let sum = fnv1a(&d);
    d.extend_from_slice(&sum.to_le_bytes());
    d
}

#[test]
fn datagrams_over_a_lossy_network_arrive_intact_and_once() {
    const N: u32 = 2000; // per sender
    const BATCH: u32 = 100;
    const SLOT: usize = 1100;
    const RQ: usize = 512;
    let faults = Faults {
        loss: 0.10,
        duplicate: 0.02,
        corrupt: 0.01,
        reorder: 0.05,
        reorder_ns: 30_000,
        jitter_ns: 5_000,
        ..Faults::default()
    };
    let mut net = SimNet::new(17, faults);
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |_| {});
    let c = ud_side(&mut net, ip("10.0.0.3"), 0x33, |_| {});
    let b = ud_side(&mut net, ip("10.0.0.2"), 0x22, |_| {});
    up(&mut net, &a, QKEY, 0xff_ff00); // crosses the PSN wrap
    up(&mut net, &c, QKEY, 0x12_3456);
    up(&mut net, &b, QKEY, 0);
    net.trace = Some(Vec::new());
    let senders = [&a, &c];
    let src = [mr(&a, BATCH as usize * SLOT), mr(&c, BATCH as usize * SLOT)];
    let rbuf = mr(&b, RQ * SLOT);
    let mut next_recv = 0u64;
    let mut got = HashSet::new();
    for batch in 0..N / BATCH {
        // Keep b's receive queue full (every WR taken completes at once,
        // so a slot is free again when its WR has completed).
        while b.rq.len() < RQ {
            let off = (next_recv as usize % RQ) * SLOT;
            post_recv(&b, next_recv, &[sge(&rbuf, off as u64, SLOT as u32)]);
            next_recv += 1;
        }
        for (who, s) in senders.iter().enumerate() {
            for k in 0..BATCH {
                let d = datagram(who as u32, batch * BATCH + k);
                let off = k as usize * SLOT;
                src[who].write(off, &d).unwrap();
                let mut w = ud_wr(
                    k as u64,
                    WrOpcode::Send,
                    &[sge(&src[who], off as u64, d.len() as u32)],
                    dest(&b),
                );
                if k % 2 == 1 {
                    w.flags = SendFlags::empty();
                }
                s.sq.post(w).unwrap();
            }
        }
        run(&mut net);
        for s in senders {
            let sc = drain(&s.send_cq);
            assert_eq!(sc.len(), BATCH as usize / 2);
            assert!(sc.iter().all(|w| w.status == WcStatus::Success));
            assert_eq!(s.sq.outstanding(), 0);
        }
        for wc in drain(&b.recv_cq) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert_eq!(wc.wc_flags, WcFlags::GRH);
            let off = (wc.wr_id as usize % RQ) * SLOT;
            let len = wc.byte_len as usize - GRH_LEN;
            assert!((20..=1024).contains(&len), "{wc:?}");
            let d = contents(&rbuf, off + GRH_LEN, len);
            let (body, sum) = d.split_at(len - 8);
            assert_eq!(fnv1a(body).to_le_bytes(), sum, "checksum of {wc:?}");
            let who = u32::from_le_bytes(d[0..4].try_into().unwrap());
            let seq = u32::from_le_bytes(d[4..8].try_into().unwrap());
            assert!(who < 2 && seq < N, "{who} {seq}");
            assert_eq!(d, datagram(who, seq), "datagram {who}/{seq}");
            let s = senders[who as usize];
            assert_eq!(wc.src_qp, s.qpn);
            assert_eq!(grh_source(&contents(&rbuf, off, GRH_LEN)), Some(s.ip));
            assert!(got.insert((who, seq)), "datagram {who}/{seq} twice");
        }
    }
    let received = got.len() as u64;
    let sent = n(&a.counters.sent_pkts) + n(&c.counters.sent_pkts);
    assert_eq!(sent, 2 * N as u64);
    // Account for every copy the network delivered to b: each intact one
    // was received or recognised as a duplicate, each damaged one was
    // caught by the ICRC check or the parser.
    let to_b: Vec<_> = delivered(&net)
        .into_iter()
        .filter(|(_, d, _)| *d == b.ip)
        .collect();
    let mut intact = HashSet::new();
    let mut intact_copies = 0u64;
    let mut last_from_a = None;
    let mut overtaken = 0;
    for (s, d, bytes) in &to_b {
        let ok = packet::parse(bytes)
            .ok()
            .filter(|p: &ParsedPacket<'_>| p.verify_icrc(&ctx(*s, *d)).is_ok());
        if let Some(p) = ok {
            let psn = p.bth.psn;
            intact_copies += 1;
            // First arrivals from a behind an earlier arrival: reordered.
            if intact.insert((*s, psn.value())) && *s == a.ip {
                if last_from_a.is_some_and(|l: Psn| !psn.is_after(l)) {
                    overtaken += 1;
                }
                last_from_a = Some(psn);
            }
        }
    }
    assert!(overtaken > 10, "the network reordered ({overtaken})");
    let dups = n(&b.counters.duplicate_requests);
    let damaged = net.counters().icrc_errors.load(Ordering::Relaxed)
        + net.counters().malformed_pkts.load(Ordering::Relaxed);
    assert_eq!(received, intact.len() as u64, "every intact datagram, once");
    assert_eq!(dups, intact_copies - received);
    assert_eq!(to_b.len() as u64, received + dups + damaged);
    assert_eq!(n(&b.counters.rcvd_pkts), intact_copies);
    assert!(dups > 0 && damaged > 0);
    assert_eq!(n(&b.counters.ud_no_recv_drops), 0);
    assert_eq!(n(&b.counters.qkey_violations), 0);
    assert_eq!(n(&b.counters.dropped_pkts), 0);
    // About 10% lost and 1% damaged.
    let ratio = received as f64 / sent as f64;
    assert!((0.85..0.93).contains(&ratio), "{received} of {sent}");
    assert_eq!(state(&mut net, &b), QpState::Rts);
}

#[test]
fn stray_and_malformed_packets_never_break_a_ud_qp() {
    let (mut net, a, b) = pair(18);
    let dst = mr(&b, 64 * 512);
    for i in 0..64 {
        // Most hold any datagram; one too long for the others waits.
        let len = [340u32, 340, 340, 200, 340, 256][i as usize % 6];
        post_recv(&b, i, &[sge(&dst, i * 512, len)]);
    }
    let mut x = 1u64;
    let mut next = || {
        x = mix(x);
        x
    };
    let mut ud_ok = 0;
    for i in 0..2000u32 {
        let r = next();
        let op = match r % 8 {
            0 => Opcode((next() % 0x20) as u8),        // RC
            1 => Opcode(0x20 + (next() % 0x0c) as u8), // UC
            2 => Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
            _ => Opcode::UD_SEND_ONLY,
        };
        if op.info().is_none() {
            continue;
        }
        let qkey = if next() % 5 == 0 { next() as u32 } else { QKEY };
        let pkey = if next() % 7 == 0 { 0x1234 } else { 0xffff };
        let plen = (next() % 300) as usize;
        let has_payload = op.info().unwrap().has_payload;
        let payload = vec![0x5a; if has_payload { plen } else { 0 }];
        let deth = DethRepr {
            qkey,
            src_qp: next() as u32 & 0xff_ffff,
        };
        let pkt = ud_packet(a.ip, b.ip, op, b.qpn, i, Some(deth), pkey, &payload);
        if op.info().unwrap().transport == uroce_wire::Transport::Ud
            && qkey == QKEY
            && pkey == 0xffff
        {
            ud_ok += 1;
        }
        net.inject(a.ip, b.ip, pkt);
        if next() % 16 == 0 {
            // Bytes that do not parse.
            let junk: Vec<u8> = (0..next() % 64).map(|_| next() as u8).collect();
            net.inject(a.ip, b.ip, junk);
        }
        if i % 100 == 0 {
            run(&mut net);
        }
    }
    run(&mut net);
    assert_eq!(state(&mut net, &b), QpState::Rts);
    assert_eq!(n(&b.counters.sent_pkts), 0);
    let done = drain(&b.recv_cq);
    assert!(ud_ok > 64);
    assert_eq!(done.len(), 64, "every WR used by a valid datagram");
    for wc in &done {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    // Those too long for the WR at the head were dropped, leaving it.
    assert!(n(&b.counters.ud_too_long_drops) > 0);
    assert!(n(&b.counters.dropped_pkts) > 0);
    assert!(n(&b.counters.qkey_violations) > 0);
    // The QP still works.
    let src = mr(&a, 8);
    src.write(0, b"still ok").unwrap();
    post_recv(&b, 100, &[sge(&dst, 0, 64)]);
    a.sq.post(ud_wr(1, WrOpcode::Send, &[sge(&src, 0, 8)], dest(&b)))
        .unwrap();
    run(&mut net);
    let r = drain(&b.recv_cq);
    assert_eq!((r.len(), r[0].wr_id), (1, 100));
    assert_eq!(contents(&dst, 40, 8), b"still ok");
}

#[test]
fn ud_modify_rules_and_attributes() {
    let mut net = SimNet::new(19, Faults::default());
    let a = ud_side(&mut net, ip("10.0.0.1"), 0x11, |cfg| {
        cfg.limits.active_mtu = Mtu::Mtu2048;
    });
    let qp = net.qp(a.id);
    // RESET -> INIT needs a Q_Key; UD takes no access flags.
    let init = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        ..QpAttr::default()
    };
    assert!(qp
        .modify(
            &init,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT
        )
        .is_err());
    assert!(qp
        .modify(
            &init,
            AttrMask::STATE
                | AttrMask::PKEY_INDEX
                | AttrMask::PORT
                | AttrMask::QKEY
                | AttrMask::ACCESS_FLAGS
        )
        .is_err());
    assert_eq!(qp.state(), QpState::Reset);
    qp.modify(
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
    )
    .unwrap();
    // INIT -> RTR takes no address vector or destination QP.
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AddressVector::to_ip(ip("10.0.0.2")),
        dest_qp_num: 5,
        ..QpAttr::default()
    };
    assert!(qp.modify(&rtr, AttrMask::STATE | AttrMask::AV).is_err());
    assert!(qp
        .modify(&rtr, AttrMask::STATE | AttrMask::DEST_QPN)
        .is_err());
    qp.modify(&rtr, AttrMask::STATE).unwrap();
    // RTR -> RTS needs the SQ PSN.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x42,
        ..QpAttr::default()
    };
    assert!(qp.modify(&rts, AttrMask::STATE).is_err());
    qp.modify(&rts, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
    let at = qp.attr();
    assert_eq!(at.qp_state, QpState::Rts);
    assert_eq!(at.qkey, QKEY);
    assert_eq!(at.sq_psn, 0x42);
    assert_eq!(at.path_mtu, Mtu::Mtu2048);
    assert_eq!(at.port_num, 1);
    assert_eq!(at.cap.max_send_wr, 512);
    assert!(qp.poll_timeout().is_none());
    qp.handle_timeout(Nanos(1));
    // RTS -> SQE is the QP's own doing, not the application's.
    let sqe = QpAttr {
        qp_state: QpState::Sqe,
        ..QpAttr::default()
    };
    assert!(qp.modify(&sqe, AttrMask::STATE).is_err());
    assert_eq!(qp.qp_type(), QpType::Ud);
}

#[test]
fn a_datagram_carries_its_traffic_class_into_the_receivers_grh() {
    // The address handle's traffic class is each packet's IP TOS (IPv4)
    // or traffic class (IPv6), ECN bits included; the receiver's GRH
    // area reports what its IP header said.
    for v6 in [false, true] {
        let (a_ip, b_ip) = if v6 {
            (ip("fd00::1"), ip("fd00::2"))
        } else {
            (ip("10.0.0.1"), ip("10.0.0.2"))
        };
        let mut net = SimNet::new(1, Faults::default());
        let a = ud_side(&mut net, a_ip, 0x11, |_| {});
        let b = ud_side(&mut net, b_ip, 0x22, |_| {});
        up(&mut net, &a, QKEY, 0);
        up(&mut net, &b, QKEY, 0);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = seen.clone();
        net.set_filter(move |w: &uroce_provider::sans_io::net::sim::Wire<'_>| {
            s2.lock().unwrap().push(w.tclass);
            uroce_provider::sans_io::net::sim::Verdict::Pass
        });
        let src = mr(&a, 64);
        let dst = mr(&b, 2 * 128);
        for (k, tc) in [0xb8u8, 0x03].into_iter().enumerate() {
            post_recv(&b, k as u64, &[sge(&dst, k as u64 * 128, 128)]);
            let to = UdDest {
                tclass: tc,
                hop_limit: 64,
                ..dest(&b)
            };
            a.sq.post(ud_wr(k as u64, WrOpcode::Send, &[sge(&src, 0, 8)], to))
                .unwrap();
        }
        run(&mut net);
        assert_eq!(*seen.lock().unwrap(), vec![0xb8, 0x03]);
        assert_eq!(drain(&b.recv_cq).len(), 2);
        for (k, tc) in [0xb8u8, 0x03].into_iter().enumerate() {
            let grh = contents(&dst, k * 128, 40);
            let got = if v6 {
                (u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]) >> 20) as u8
            } else {
                grh[21]
            };
            assert_eq!(got, tc, "v6 {v6}");
        }
    }
}
