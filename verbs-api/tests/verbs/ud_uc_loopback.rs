//! UD and UC over real UDP between loopback devices, in one process.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;
use uroce_verbs::*;

use crate::common::{recv, two, ud_up, T};

const QKEY: u32 = 0x1111_1111;

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[test]
fn ud_send_grh_reply_and_qkeys() {
    let (ai, bi) = ("127.10.24.1", "127.10.24.2");
    let (a, _b, apd, bpd, acq, bcq, aqp, bqp) = two(ai, bi, QpType::Ud);
    // A controlled Q_Key needs privilege.
    let e = aqp
        .modify(
            &QpAttr {
                qp_state: QpState::Init,
                qkey: 0x8000_0001,
                ..QpAttr::default()
            },
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        )
        .unwrap_err();
    assert!(e.to_string().contains("IBV_QP_QKEY"), "{e}");
    ud_up(&aqp, QKEY, 0x42);
    ud_up(&bqp, QKEY, 0x42);
    let smr = apd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let rmr = bpd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let amr = apd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    smr.write(0, b"hello over UD").unwrap();
    bqp.post_recv(&[recv(7, &rmr, 0, 40 + 64)]).unwrap();
    let ah = apd
        .create_ah(&AddressVector::to_ip(bi.parse().unwrap()))
        .unwrap();
    let mut w = SendWr::new(1, WrOpcode::SendWithImm);
    w.flags = SendFlags::SIGNALED;
    w.imm_data = 0xdead_beef;
    w.sg_list.push(smr.sge(0, 13));
    w.ud = Some(ah.ud_dest(bqp.qp_num(), QKEY));
    aqp.post_send(&[w]).unwrap();
    assert_eq!(acq.wait(1, T)[0].status, WcStatus::Success);
    let wc = bcq.wait(1, T);
    assert_eq!(wc.len(), 1);
    let wc = wc[0];
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(wc.wr_id, 7);
    assert_eq!(wc.byte_len, 40 + 13);
    assert_eq!(wc.src_qp, aqp.qp_num());
    assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    // The L3 header type where mlx5 reports it (UCX's ud_verbs reads it).
    assert_eq!(wc.sl, 2, "an IPv4 packet");
    assert_eq!(wc.imm_data, 0xdead_beef);
    let grh = rmr.to_vec(0, 40).unwrap();
    assert!(grh[..20].iter().all(|&b| b == 0));
    let ip = &grh[20..40];
    assert_eq!(ip[0], 0x45);
    assert_eq!(ipv4_checksum(ip), 0, "valid IPv4 header checksum");
    assert_eq!(ip[9], 17);
    assert_eq!(&ip[12..16], &ai.parse::<Ipv4Addr>().unwrap().octets());
    assert_eq!(&ip[16..20], &bi.parse::<Ipv4Addr>().unwrap().octets());
    assert_eq!(rmr.to_vec(40, 13).unwrap(), b"hello over UD");

    // Reply to the sender found from the completion and its GRH.
    let back = bpd.create_ah_from_wc(&wc, &grh).unwrap();
    assert_eq!(back.ip(), ai.parse::<IpAddr>().unwrap());
    aqp.post_recv(&[recv(8, &amr, 0, 40 + 64)]).unwrap();
    let bsmr = bpd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    bsmr.write(0, b"pong").unwrap();
    let mut w = SendWr::new(2, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(bsmr.sge(0, 4));
    // The high bit: use the QP's own Q_Key.
    w.ud = Some(back.ud_dest(wc.src_qp, 0x8000_0000));
    bqp.post_send(&[w]).unwrap();
    assert_eq!(bcq.wait(1, T)[0].status, WcStatus::Success);
    let wc = acq.wait(1, T);
    assert_eq!(wc[0].wr_id, 8);
    assert_eq!(amr.to_vec(40, 4).unwrap(), b"pong");

    // A wrong Q_Key is dropped and counted; nothing completes.
    aqp.post_recv(&[recv(9, &amr, 0, 40 + 64)]).unwrap();
    let mut w = SendWr::new(3, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(bsmr.sge(0, 4));
    w.ud = Some(back.ud_dest(aqp.qp_num(), 0x2222));
    bqp.post_send(&[w]).unwrap();
    assert_eq!(bcq.wait(1, T).len(), 1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(acq.poll_one().is_none());
    assert_eq!(a.counters().qkey_violations, 1);

    // Larger than the path MTU, and the operations UD lacks (RDMA READ,
    // WRITE, atomics): posted, as rxe and NICs take them, and completed
    // in error (LOC_LEN_ERR, a NIC's answer; LOC_QP_OP_ERR, rxe's); the
    // QP goes to SQE and comes back to RTS (rdma-unit-test's
    // SendLargerThanMtu, LoopbackUdQpTest.{Read,Write,FetchAdd,CompareSwap}).
    let mut long = SendWr::new(4, WrOpcode::Send);
    long.flags = SendFlags::SIGNALED;
    long.sg_list.push(smr.sge(0, 4097));
    long.ud = Some(ah.ud_dest(bqp.qp_num(), QKEY));
    let mut cases = vec![(long, WcStatus::LocLenErr)];
    for op in [
        WrOpcode::RdmaRead,
        WrOpcode::RdmaWrite,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::AtomicCmpAndSwp,
    ] {
        let mut w = SendWr::new(5, op);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(smr.sge(0, 8));
        w.remote_addr = rmr.addr();
        w.rkey = rmr.rkey();
        cases.push((w, WcStatus::LocQpOpErr));
    }
    for (w, status) in cases {
        let op = w.opcode;
        aqp.post_send(&[w]).unwrap();
        let wc = acq.wait(1, T);
        assert_eq!((wc[0].status, wc[0].opcode), (status, op.wc_opcode()));
        assert_eq!(aqp.state(), QpState::Sqe);
        aqp.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                ..QpAttr::default()
            },
            AttrMask::STATE,
        )
        .unwrap();
    }
    // A UD SEND needs a destination.
    let w = SendWr::new(6, WrOpcode::Send);
    assert!(aqp.post_send(&[w]).is_err());
    // An IPv6 multicast GID on an IPv4 device: EINVAL.
    assert!(matches!(
        aqp.attach_mcast(&[0xff; 16], 0),
        Err(Error::Invalid(_))
    ));
}

#[test]
fn ud_without_receive_is_dropped_and_counted() {
    let (ai, bi) = ("127.10.25.1", "127.10.25.2");
    let (_a, b, apd, bpd, acq, bcq, aqp, bqp) = two(ai, bi, QpType::Ud);
    ud_up(&aqp, QKEY, 0x42);
    ud_up(&bqp, QKEY, 0x42);
    let smr = apd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rmr = bpd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    let ah = apd
        .create_ah(&AddressVector::to_ip(bi.parse().unwrap()))
        .unwrap();
    let send = |id: u64, byte: u8| {
        smr.write(0, &[byte; 16]).unwrap();
        let mut w = SendWr::new(id, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(smr.sge(0, 16));
        w.ud = Some(ah.ud_dest(bqp.qp_num(), QKEY));
        aqp.post_send(&[w]).unwrap();
        assert_eq!(acq.wait(1, T)[0].status, WcStatus::Success);
    };
    send(1, 0x11);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.counters().ud_no_recv_drops, 1);
    bqp.post_recv(&[recv(1, &rmr, 0, 256)]).unwrap();
    send(2, 0x22);
    let wc = bcq.wait(1, T);
    assert_eq!(wc[0].byte_len, 56);
    assert_eq!(rmr.to_vec(40, 16).unwrap(), vec![0x22; 16]);
}

#[test]
fn uc_send_and_write_with_immediate() {
    let (ai, bi) = ("127.10.26.1", "127.10.26.2");
    let (_a, b, apd, bpd, acq, bcq, aqp, bqp) = two(ai, bi, QpType::Uc);
    let up = |q: &QueuePair, peer: &str, peer_qpn: u32, sq: u32, rq: u32| {
        q.modify(
            &QpAttr {
                qp_state: QpState::Init,
                qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                ..QpAttr::default()
            },
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: QpState::Rtr,
                ah_attr: AddressVector::to_ip(peer.parse().unwrap()),
                path_mtu: Mtu::Mtu1024,
                dest_qp_num: peer_qpn,
                rq_psn: rq,
                ..QpAttr::default()
            },
            AttrMask::STATE
                | AttrMask::AV
                | AttrMask::PATH_MTU
                | AttrMask::DEST_QPN
                | AttrMask::RQ_PSN,
        )
        .unwrap();
        q.modify(
            &QpAttr {
                qp_state: QpState::Rts,
                sq_psn: sq,
                ..QpAttr::default()
            },
            AttrMask::STATE | AttrMask::SQ_PSN,
        )
        .unwrap();
    };
    up(&aqp, bi, bqp.qp_num(), 100, 200);
    up(&bqp, ai, aqp.qp_num(), 200, 100);
    let len = 5000usize;
    let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
    let smr = apd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
    smr.write(0, &data).unwrap();
    let rmr = bpd
        .alloc_mr(2 * len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    bqp.post_recv(&[recv(1, &rmr, 0, len as u32), recv(2, &rmr, 0, 0)])
        .unwrap();
    let mut w = SendWr::new(10, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(smr.sge(0, len as u32));
    aqp.post_send(&[w]).unwrap();
    let mut w = SendWr::new(11, WrOpcode::RdmaWriteWithImm);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(smr.sge(0, len as u32));
    w.remote_addr = rmr.addr() + len as u64;
    w.rkey = rmr.rkey();
    w.imm_data = 0x1234;
    aqp.post_send(&[w]).unwrap();
    let s = acq.wait(2, T);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    let r = bcq.wait(2, T);
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].byte_len),
        (1, WcOpcode::Recv, len as u32)
    );
    assert_eq!(
        (r[1].wr_id, r[1].opcode, r[1].imm_data),
        (2, WcOpcode::RecvRdmaWithImm, 0x1234)
    );
    assert_eq!(rmr.to_vec(0, len).unwrap(), data);
    assert_eq!(rmr.to_vec(len, len).unwrap(), data);
    // UC cannot READ.
    let w = SendWr::new(12, WrOpcode::RdmaRead);
    assert!(aqp.post_send(&[w]).is_err());
    // No acknowledgements: b sent nothing back.
    assert_eq!(b.counters().sent_pkts, 0);
}
