//! UD multicast on the simulated network: a send to a group and QP
//! 0xFFFFFF reaches every attached QP of every device (the sender's own
//! device included), each checking its own Q_Key; detach stops it; the
//! attach and detach errors and rxe's limits.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use uroce_provider::sans_io::endpoint::{
    GroupChange, McastError, MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MULTICAST_QPN,
};
use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::{Faults, SimNet};
use uroce_provider::sans_io::transport::ud::{UdQp, GRH_LEN};
use uroce_provider::testing::{config, sge, side_with, ud_up, PairParams, Side};
use uroce_provider::types::*;

const SEC: u64 = 1_000_000_000;
const QKEY: u32 = 0x0123_4567;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ud(net: &mut SimNet, at: &str, qpn: u32, qkey: u32) -> Side {
    let p = PairParams {
        depth: 64,
        ..PairParams::default()
    };
    let s = side_with(net, ip(at), qpn, &p, |cfg| Box::new(UdQp::new(cfg)));
    ud_up(net.qp(s.id), qkey, 0);
    s
}

fn mr(s: &Side, len: usize) -> Arc<MrInner> {
    s.keys
        .register_zeroed(1, len, Access::LOCAL_WRITE)
        .expect("alloc")
}

fn post_recv(s: &Side, m: &MrInner, wr_id: u64) {
    s.rq.post(RecvWr {
        wr_id,
        sg_list: [sge(m, 0, 256)].into_iter().collect(),
    })
    .expect("recv queue");
}

fn send_to_group(net: &mut SimNet, from: &Side, m: &MrInner, group: IpAddr, id: u64) {
    let mut w = SendWr::new(id, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list = [sge(m, 0, 5)].into_iter().collect();
    w.ud = Some(UdDest {
        ip: group,
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
        tclass: 0,
        hop_limit: 64,
    });
    from.sq.post(w).expect("send queue");
    net.run_until(SEC, |_| false);
}

fn contents(mr: &MrInner, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).unwrap();
    v
}

fn received(s: &Side) -> Vec<Wc> {
    let mut v = Vec::new();
    while let Some(wc) = s.recv_cq.poll_one() {
        v.push(wc);
    }
    v
}

#[test]
fn a_group_send_reaches_each_attached_qp_with_its_own_copy() {
    let mut net = SimNet::new(7, Faults::default());
    let group = ip("239.1.2.3");
    let sender = ud(&mut net, "10.0.0.1", 0x11, QKEY);
    let beside = ud(&mut net, "10.0.0.1", 0x12, QKEY);
    let b1 = ud(&mut net, "10.0.0.2", 0x21, QKEY);
    let b2 = ud(&mut net, "10.0.0.2", 0x22, QKEY);
    let wrong_qkey = ud(&mut net, "10.0.0.2", 0x23, 0x7777);
    let outside = ud(&mut net, "10.0.0.3", 0x31, QKEY);
    let mut mrs = Vec::new();
    for (i, s) in [&beside, &b1, &b2, &wrong_qkey, &outside]
        .iter()
        .enumerate()
    {
        let m = mr(s, 256);
        post_recv(s, &m, 100 + i as u64);
        mrs.push(m);
    }
    for s in [&beside, &b1, &b2, &wrong_qkey] {
        net.attach_mcast(s.id, group).unwrap();
    }
    let data = mr(&sender, 64);
    data.write(0, b"hello").unwrap();
    send_to_group(&mut net, &sender, &data, group, 1);
    let sent = sender.send_cq.poll_one().expect("send completion");
    assert_eq!(sent.status, WcStatus::Success);
    for (i, s) in [&beside, &b1, &b2].iter().enumerate() {
        let wc = received(s);
        assert_eq!(wc.len(), 1, "QP {:#x}: {wc:?}", s.qpn);
        assert_eq!(wc[0].wr_id, 100 + i as u64);
        assert_eq!(wc[0].src_qp, 0x11);
        assert_eq!(wc[0].qp_num, s.qpn);
        assert_eq!(contents(&mrs[i], GRH_LEN, 5), b"hello");
        // The GRH area's destination is the group.
        assert_eq!(contents(&mrs[i], 36, 4), [239, 1, 2, 3]);
    }
    // Its own Q_Key differs: dropped and counted on its device.
    assert!(received(&wrong_qkey).is_empty());
    assert_eq!(
        wrong_qkey.counters.qkey_violations.load(Ordering::Relaxed),
        1
    );
    assert!(received(&outside).is_empty());

    // Detached, B1 gets nothing more; the rest still do.
    assert_eq!(
        net.detach_mcast(b1.id, group).unwrap(),
        GroupChange::Unchanged
    );
    for (i, s) in [&beside, &b1, &b2].iter().enumerate() {
        post_recv(s, &mrs[i], 200 + i as u64);
    }
    send_to_group(&mut net, &sender, &data, group, 2);
    assert_eq!(received(&beside).len(), 1);
    assert!(received(&b1).is_empty());
    assert_eq!(received(&b2).len(), 1);
    // The last of a device to leave the group leaves it.
    net.detach_mcast(wrong_qkey.id, group).unwrap();
    assert_eq!(net.detach_mcast(b2.id, group).unwrap(), GroupChange::Left);
}

#[test]
fn attach_errors_and_limits_are_the_kernels() {
    let mut net = SimNet::new(1, Faults::default());
    let a = ud(&mut net, "10.0.0.1", 0x11, QKEY);
    let g = ip("239.0.0.1");
    // Not multicast, the other IP version.
    assert_eq!(
        net.attach_mcast(a.id, ip("10.0.0.9")),
        Err(McastError::NotMulticast(ip("10.0.0.9")))
    );
    assert!(matches!(
        net.attach_mcast(a.id, ip("ff02::1")),
        Err(McastError::WrongFamily(_))
    ));
    // An IPv4-mapped GID is its IPv4 group.
    assert_eq!(
        net.attach_mcast(a.id, ip("::ffff:239.0.0.1")),
        Ok(GroupChange::Joined)
    );
    assert_eq!(net.attach_mcast(a.id, g), Ok(GroupChange::Unchanged));
    assert_eq!(net.detach_mcast(a.id, g), Ok(GroupChange::Left));
    assert!(matches!(
        net.detach_mcast(a.id, g),
        Err(McastError::NotAttached { .. })
    ));
    // An RC QP cannot join.
    let rc = net.add(
        ip("10.0.0.1"),
        uroce_provider::sans_io::transport::rc::RcQp::new(config(ip("10.0.0.1"), 0x13, 4)),
    );
    assert_eq!(net.attach_mcast(rc, g), Err(McastError::NotUd(0x13)));
    // max_mcast_grp groups per device.
    for i in 0..MAX_MCAST_GRP as u32 {
        let grp = IpAddr::from((0xef00_0000u32 + i).to_be_bytes());
        net.attach_mcast(a.id, grp).unwrap();
    }
    assert_eq!(
        net.attach_mcast(a.id, ip("239.255.0.1")),
        Err(McastError::TooManyGroups)
    );
    // max_mcast_qp_attach QPs per group.
    let mut net = SimNet::new(1, Faults::default());
    let qps: Vec<Side> = (0..=MAX_MCAST_QP_ATTACH as u32)
        .map(|i| ud(&mut net, "10.0.0.1", 0x100 + i, QKEY))
        .collect();
    for s in &qps[..MAX_MCAST_QP_ATTACH] {
        net.attach_mcast(s.id, g).unwrap();
    }
    assert_eq!(
        net.attach_mcast(qps[MAX_MCAST_QP_ATTACH].id, g),
        Err(McastError::GroupFull)
    );
}
