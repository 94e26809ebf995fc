//! UD multicast over real UDP between loopback devices in one process:
//! `ibv_attach_mcast`/`ibv_detach_mcast` with the kernel's errors and
//! rxe's limits, and sends to a group reaching every attached QP of every
//! device, the sender's own included (device addresses 127.106.x.y).

use std::net::Ipv4Addr;
use std::time::Duration;
use uroce_verbs::*;

use crate::common::{open, qp, recv, ud_up, T};

const QKEY: u32 = 0x0123_4567;

/// The IPv4-mapped GID of `ip`.
fn gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// Nothing more arrives in `cq` within a while.
fn quiet(cq: &CompletionQueue) {
    std::thread::sleep(Duration::from_millis(150));
    assert!(cq.poll_one().is_none(), "an unexpected completion");
}

#[test]
fn attach_and_detach_answer_as_the_kernel() {
    let a = open("127.106.1.1");
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let ud = qp(&pd, &cq, QpType::Ud, None);
    let rc = qp(&pd, &cq, QpType::Rc, None);
    let attr = a.query_device();
    assert_eq!(
        (
            attr.max_mcast_grp,
            attr.max_mcast_qp_attach,
            attr.max_total_mcast_qp_attach
        ),
        (8192, 56, 8192 * 56)
    );
    let g = gid(Ipv4Addr::new(239, 106, 1, 1));
    // Not UD; not a multicast GID (unicast, and IPv6 on an IPv4 device).
    assert!(matches!(rc.attach_mcast(&g, 0), Err(Error::Invalid(_))));
    let unicast = gid(Ipv4Addr::new(127, 106, 1, 2));
    assert!(matches!(
        ud.attach_mcast(&unicast, 0),
        Err(Error::Invalid(_))
    ));
    // Detach of a group not attached.
    assert!(matches!(ud.detach_mcast(&g, 0), Err(Error::Invalid(_))));
    // Attach twice succeeds; one detach undoes it; a second is refused.
    ud.attach_mcast(&g, 0).unwrap();
    ud.attach_mcast(&g, 0xc001).unwrap();
    ud.detach_mcast(&g, 0).unwrap();
    assert!(matches!(ud.detach_mcast(&g, 0), Err(Error::Invalid(_))));
    // max_mcast_qp_attach QPs in one group, then ENOMEM.
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qps: Vec<QueuePair> = (0..attr.max_mcast_qp_attach + 1)
        .map(|_| {
            pd.create_qp(&QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap,
                qp_type: QpType::Ud,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap()
        })
        .collect();
    let (last, first) = qps.split_last().unwrap();
    for q in first {
        q.attach_mcast(&g, 0).unwrap();
    }
    let e = last.attach_mcast(&g, 0).unwrap_err();
    assert_eq!(e.errno(), 12, "{e}");
    // Destroying a QP detaches it: its place is free again.
    drop(qps);
    ud.attach_mcast(&g, 0).unwrap();
}

#[test]
fn a_send_to_a_group_reaches_every_attached_qp() {
    let (a, b) = (open("127.106.2.1"), open("127.106.2.2"));
    let group = Ipv4Addr::new(239, 106, 2, 1);
    let g = gid(group);
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    // The sender, one member beside it on its own device, two on B, one
    // on B that did not join.
    let sender = qp(&apd, &acq, QpType::Ud, None);
    let a2 = qp(&apd, &acq, QpType::Ud, None);
    let (b1, b2, b3) = (
        qp(&bpd, &bcq, QpType::Ud, None),
        qp(&bpd, &bcq, QpType::Ud, None),
        qp(&bpd, &bcq, QpType::Ud, None),
    );
    for q in [&sender, &a2, &b1, &b2, &b3] {
        ud_up(q, QKEY, 0);
    }
    let amr = apd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let bmr = bpd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    amr.write(0, b"to the group").unwrap();
    for (i, q) in [&a2, &b1, &b2, &b3].into_iter().enumerate() {
        let mr = if i == 0 { &amr } else { &bmr };
        q.post_recv(&[recv(10 + i as u64, mr, 512 * (i + 1), 40 + 64)])
            .unwrap();
    }
    for q in [&a2, &b1, &b2] {
        q.attach_mcast(&g, 0).unwrap();
    }
    let ah = apd.create_ah(&AddressVector::to_ip(group.into())).unwrap();
    let mut w = SendWr::new(1, WrOpcode::SendWithImm);
    w.flags = SendFlags::SIGNALED;
    w.imm_data = 0x0601_0203;
    w.sg_list.push(amr.sge(0, 12));
    w.ud = Some(ah.ud_dest(0xff_ffff, QKEY));
    sender.post_send(&[w]).unwrap();
    // The sender's completion, then A2's copy (looped back on A).
    let mut on_a = acq.wait(2, T);
    on_a.sort_by_key(|c| c.wr_id);
    assert_eq!(on_a.len(), 2, "{on_a:?}");
    assert_eq!(on_a[0].wr_id, 1);
    assert_eq!(on_a[0].status, WcStatus::Success);
    assert_eq!(on_a[1].wr_id, 10);
    assert_eq!(on_a[1].qp_num, a2.qp_num());
    let mut on_b = bcq.wait(2, T);
    on_b.sort_by_key(|c| c.wr_id);
    assert_eq!(on_b.len(), 2, "{on_b:?}");
    for (i, (wc, q)) in on_b.iter().zip([&b1, &b2]).enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.wr_id, 11 + i as u64);
        assert_eq!(wc.qp_num, q.qp_num());
        assert_eq!(wc.src_qp, sender.qp_num());
        assert_eq!(wc.byte_len, 40 + 12);
        assert_eq!(wc.imm_data, 0x0601_0203);
        assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
        let at = 512 * (i + 2);
        assert_eq!(bmr.to_vec(at + 40, 12).unwrap(), b"to the group");
        // The GRH area's IPv4 header: from A, to the group.
        let grh = bmr.to_vec(at, 40).unwrap();
        assert_eq!(grh[32..36], [127, 106, 2, 1]);
        assert_eq!(grh[36..40], group.octets());
    }
    quiet(&bcq);
    // After B1 and B2 detach, B's QPs get nothing; A2 still does.
    b1.detach_mcast(&g, 0).unwrap();
    b2.detach_mcast(&g, 0).unwrap();
    a2.post_recv(&[recv(20, &amr, 512, 40 + 64)]).unwrap();
    let mut w = SendWr::new(2, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(amr.sge(0, 12));
    w.ud = Some(ah.ud_dest(0xff_ffff, QKEY));
    sender.post_send(&[w]).unwrap();
    let mut on_a = acq.wait(2, T);
    on_a.sort_by_key(|c| c.wr_id);
    assert_eq!(on_a.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [2, 20]);
    quiet(&bcq);
    quiet(&acq);
}
