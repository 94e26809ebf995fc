//! UC over real UDP between loopback devices, in one process.

use std::time::Duration;
use uroce_verbs::*;

const T: Duration = Duration::from_secs(20);

fn open(ip: &str) -> Context {
    Device::new("t", ip.parse().unwrap())
        .open()
        .expect("open device")
}

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn qp(pd: &ProtectionDomain, cq: &CompletionQueue, t: QpType) -> QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(),
        qp_type: t,
        sq_sig_all: false,
        srq: None,
    })
    .unwrap()
}

fn recv(id: u64, mr: &MemoryRegion, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: [mr.sge(off, len)].into_iter().collect(),
    }
}

#[test]
fn uc_send_and_write_with_immediate() {
    let (ai, bi) = ("127.10.26.1", "127.10.26.2");
    let (a, b) = (open(ai), open(bi));
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (aqp, bqp) = (qp(&apd, &acq, QpType::Uc), qp(&bpd, &bcq, QpType::Uc));
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
