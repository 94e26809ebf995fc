//! The IP TTL uroce's packets leave with, read by plain sockets with
//! `IP_RECVTTL` on loopback addresses (127.110.x.y), as kernel rxe writes
//! it: a datagram to a multicast group carries its address handle's
//! `grh.hop_limit` (0 included: it stays on the host); a unicast packet
//! carries the route's TTL whatever the address handle or the RC path
//! asks, as the kernel replaces a unicast address vector's hop limit with
//! the route's when it resolves it (`ib_resolve_unicast_gid_dmac`). A
//! UD receive's GRH area shows the TTL as the datagram arrived, as rxe
//! copies the IP header.

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;
use uroce_verbs::*;

use crate::common::{open, qp, recv, recv_datagram, report_ip_field, two, ud_up, T};

const QKEY: u32 = 0x0123_4567;

/// A plain UDP socket on `ip`:4791 (a multicast group, joined on the
/// interface of `iface`), reporting each datagram's TTL.
fn listener(ip: Ipv4Addr, iface: Option<Ipv4Addr>) -> UdpSocket {
    let s = UdpSocket::bind((ip, 4791)).expect("bind UDP 4791");
    if let Some(i) = iface {
        s.join_multicast_v4(&ip, &i).expect("join the group");
    }
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    report_ip_field(&s, libc::IP_RECVTTL);
    s
}

/// The TTL of the next datagram `s` receives.
fn next_ttl(s: &UdpSocket) -> u8 {
    let d = recv_datagram(s, 0).expect("a datagram");
    d.ttl.expect("an IP_TTL control message")
}

/// The TTL of the host's routes (net.ipv4.ip_default_ttl).
fn route_ttl() -> u8 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_default_ttl")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(64)
}

/// Sends one UD datagram from `q` to `ip` (QP `qpn`) through an address
/// handle with hop limit `hop`.
fn send_ud(
    pd: &ProtectionDomain,
    q: &QueuePair,
    cq: &CompletionQueue,
    ip: Ipv4Addr,
    qpn: u32,
    hop: u8,
) {
    let mut av = AddressVector::to_ip(ip.into());
    av.hop_limit = hop;
    let ah = pd.create_ah(&av).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut w = SendWr::new(u64::from(hop), WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(mr.sge(0, 8));
    w.ud = Some(ah.ud_dest(qpn, QKEY));
    q.post_send(&[w]).unwrap();
    assert_eq!(cq.wait(1, T)[0].status, WcStatus::Success);
}

#[test]
fn multicast_datagrams_carry_the_address_handles_hop_limit() {
    let (dev, group) = (Ipv4Addr::new(127, 110, 1, 1), Ipv4Addr::new(239, 110, 1, 1));
    let a = open("127.110.1.1");
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let q = qp(&pd, &cq, QpType::Ud, None);
    ud_up(&q, QKEY, 0);
    let member = listener(group, Some(dev));
    // 64: what rdma_join_multicast's address vector says; 5: routed a
    // few hops; 1: this link only; 0: this host only (the kernel loops
    // it back to the host's members and sends nothing on a link).
    for hop in [64u8, 5, 1, 255, 0] {
        send_ud(&pd, &q, &cq, group, 0xff_ffff, hop);
        assert_eq!(
            next_ttl(&member),
            hop,
            "a datagram sent with hop limit {hop}"
        );
    }
}

#[test]
fn unicast_packets_carry_the_routes_ttl() {
    let a = open("127.110.2.1");
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    // UD: an address handle asking for hop limit 5 (and ibv_ud_pingpong's
    // 64, and 1).
    let peer = Ipv4Addr::new(127, 110, 2, 2);
    let plain = listener(peer, None);
    let q = qp(&pd, &cq, QpType::Ud, None);
    ud_up(&q, QKEY, 0);
    for hop in [5u8, 1, 64] {
        send_ud(&pd, &q, &cq, peer, 0x12, hop);
        assert_eq!(
            next_ttl(&plain),
            route_ttl(),
            "a UD datagram with hop limit {hop}"
        );
    }
    // RC: a path with hop limit 1 (ibv_rc_pingpong's); the first SEND
    // arrives at the plain socket, which never answers.
    let rc = qp(&pd, &cq, QpType::Rc, None);
    rc.modify(
        &QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: Access::empty(),
            ..QpAttr::default()
        },
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let mut av = AddressVector::to_ip(peer.into());
    av.hop_limit = 1;
    rc.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ah_attr: av,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: 0x34,
            rq_psn: 0,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..QpAttr::default()
        },
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    rc.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 1,
            rnr_retry: 1,
            max_rd_atomic: 1,
            ..QpAttr::default()
        },
        AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut w = SendWr::new(7, WrOpcode::Send);
    w.sg_list.push(mr.sge(0, 8));
    rc.post_send(&[w]).unwrap();
    assert_eq!(
        next_ttl(&plain),
        route_ttl(),
        "an RC packet on a path with hop limit 1"
    );
}

#[test]
fn the_grh_area_shows_the_ttl_as_received() {
    let group = Ipv4Addr::new(239, 110, 3, 1);
    let (_a, _b, apd, bpd, acq, bcq, aqp, bqp) = two("127.110.3.1", "127.110.3.2", QpType::Ud);
    ud_up(&aqp, QKEY, 0);
    ud_up(&bqp, QKEY, 0);
    bqp.attach_mcast(&group.to_ipv6_mapped().octets(), 0)
        .unwrap();
    let rmr = bpd.alloc_mr(4 * 128, Access::LOCAL_WRITE).unwrap();
    // To the group with hop limit 5 and 1, then to B itself (the route's).
    let sends = [(group, 0xff_ffff, 5u8, 5u8), (group, 0xff_ffff, 1, 1)];
    let unicast = (Ipv4Addr::new(127, 110, 3, 2), bqp.qp_num(), 9, route_ttl());
    for (k, &(to, qpn, hop, ttl)) in sends.iter().chain([&unicast]).enumerate() {
        bqp.post_recv(&[recv(k as u64, &rmr, k * 128, 128)])
            .unwrap();
        send_ud(&apd, &aqp, &acq, to, qpn, hop);
        let wc = bcq.wait(1, T);
        assert_eq!(wc[0].status, WcStatus::Success);
        let grh = rmr.to_vec(k * 128, 40).unwrap();
        assert_eq!(grh[20], 0x45, "an IPv4 header at offset 20");
        assert_eq!(
            grh[28], ttl,
            "the TTL of a datagram sent to {to} with hop limit {hop}"
        );
    }
}
