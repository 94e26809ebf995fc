//! The connection manager's Rust API over real engines on loopback: two
//! devices in this process (`UROCE_DEVICES`), connected through REQ / REP
//! / RTU on QP1, data over the connected QPs, then DREQ / DREP; the
//! failure paths (no listener, a rejecting listener, nobody at the
//! address) and UD through SIDR.

use crate::{addr, expect};
use std::time::Duration;
use uroce_rdmacm::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use uroce_verbs::{
    Access, AttrMask, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCap, QpInitAttr,
    QpState, QpType, QueuePair, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode,
};

const SERVER: &str = "127.0.31.1";
const CLIENT: &str = "127.0.31.2";
/// A pair of its own for the test that silences its server.
const SERVER2: &str = "127.0.31.3";
const CLIENT2: &str = "127.0.31.4";

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("cms={SERVER},cmc={CLIENT},cm6=::1,cms2={SERVER2},cmc2={CLIENT2}")
}

/// The verbs objects of one end.
pub(crate) struct End {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    pub(crate) mr: MemoryRegion,
    qp: std::sync::Arc<QueuePair>,
}

pub(crate) fn end(id: &CmId, qp_type: QpType) -> End {
    let ctx = id.context().expect("an id with a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let mr = pd
        .alloc_mr(
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let qp = id
        .create_qp(
            &pd,
            &QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type,
                sq_sig_all: true,
                srq: None,
            },
        )
        .unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        mr,
        qp,
    }
}

impl End {
    pub(crate) fn post_recv(&self, at: usize) {
        let mut w = RecvWr {
            wr_id: 1,
            sg_list: Default::default(),
        };
        w.sg_list.push(self.mr.sge(at, 2048));
        self.qp.post_recv(&[w]).unwrap();
    }
    pub(crate) fn wait(&self) -> uroce_verbs::Wc {
        let wc = self.cq.wait(1, Duration::from_secs(20));
        assert_eq!(wc.len(), 1, "a completion within 20 s");
        wc[0]
    }
    pub(crate) fn send(&self, len: u32, ud: Option<uroce_verbs::UdDest>) {
        let mut w = SendWr::new(7, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(self.mr.sge(0, len));
        w.ud = ud;
        self.qp.post_send(&[w]).unwrap();
    }
}

fn client_to(port: u16, ps: PortSpace) -> (EventChannel, CmId) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, ps).unwrap();
    id.resolve_addr(Some(addr(CLIENT, 0)), addr(SERVER, port))
        .unwrap();
    expect(&ch, CmEventType::AddrResolved);
    id.resolve_route().unwrap();
    expect(&ch, CmEventType::RouteResolved);
    (ch, id)
}

#[test]
fn rc_connect_send_and_disconnect() {
    crate::init();
    let port = 7471;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER, port)).unwrap();
    listen.listen(8).unwrap();
    // A second listener on the same port is refused: the same address is
    // EADDRINUSE, the wildcard EADDRNOTAVAIL (as the kernel's CMA).
    let other = CmId::new(&sch, PortSpace::Tcp).unwrap();
    let e = other.bind_addr(addr(SERVER, port)).unwrap_err();
    assert_eq!(e.errno(), 98, "{e}");
    let e = other.bind_addr(addr("0.0.0.0", port)).unwrap_err();
    assert_eq!(e.errno(), 99, "{e}");

    let (cch, cid) = client_to(port, PortSpace::Tcp);
    let c = end(&cid, QpType::Rc);
    c.post_recv(0);
    cid.connect(&ConnParam {
        private_data: b"hello from the client".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();

    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&listen));
    assert_eq!(&req.conn.private_data[..21], b"hello from the client");
    assert_eq!(req.conn.qp_num, c.qp.qp_num());
    // The peer's address comes from the CMA header.
    assert_eq!(req.id.dst_addr().unwrap().ip(), addr(CLIENT, 0).ip());
    assert_eq!(req.id.dst_addr(), cid.src_addr());
    let sid = req.id.clone();
    // Before accept, the REQ already settles RTR and RTS: the kernel's CM
    // answers rdma_init_qp_attr so, and programs that move their own QP
    // (sideway's CM users) rely on it.
    let (rtr, m) = sid.init_qp_attr(QpState::Rtr).unwrap();
    assert_eq!(rtr.dest_qp_num, c.qp.qp_num());
    assert!(m.contains(AttrMask::AV | AttrMask::DEST_QPN | AttrMask::RQ_PSN));
    let (_, m) = sid.init_qp_attr(QpState::Rts).unwrap();
    assert!(m.contains(AttrMask::SQ_PSN));
    let s = end(&sid, QpType::Rc);
    s.post_recv(0);
    sid.accept(&ConnParam {
        private_data: b"welcome".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();

    let est = expect(&cch, CmEventType::Established);
    // The client sends from the PSN the server's RTR expects.
    assert_eq!(cid.init_qp_attr(QpState::Rts).unwrap().0.sq_psn, rtr.rq_psn);
    assert_eq!(&est.conn.private_data[..7], b"welcome");
    assert_eq!(est.conn.qp_num, s.qp.qp_num());
    expect(&sch, CmEventType::Established);

    // Data both ways over the connected QPs.
    c.mr.write(0, b"ping").unwrap();
    c.send(4, None);
    let wc = s.wait();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4));
    let mut got = [0u8; 4];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"ping");
    assert_eq!(c.wait().status, WcStatus::Success);

    cid.disconnect().unwrap();
    expect(&sch, CmEventType::Disconnected);
    expect(&cch, CmEventType::Disconnected);
    sid.disconnect().unwrap();
    expect(&cch, CmEventType::TimewaitExit);
    expect(&sch, CmEventType::TimewaitExit);
    drop(s);
}

#[test]
fn a_port_bound_on_the_wildcard_conflicts_with_every_address() {
    crate::init();
    let port = 7479;
    let ch = EventChannel::new().unwrap();
    let any = CmId::new(&ch, PortSpace::Tcp).unwrap();
    any.bind_addr(addr("0.0.0.0", port)).unwrap();
    let one = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let e = one.bind_addr(addr(SERVER, port)).unwrap_err();
    assert_eq!(e.errno(), 99, "{e}");
    // Another port space, or the port once the wildcard id is gone, is free.
    let udp = CmId::new(&ch, PortSpace::Udp).unwrap();
    udp.bind_addr(addr(SERVER, port)).unwrap();
    drop(any);
    one.bind_addr(addr(SERVER, port)).unwrap();
}

#[test]
fn nobody_listening_is_rejected_with_reason_8() {
    crate::init();
    // The server's device is up (its CM answers), but nothing listens.
    let _server = uroce_verbs::Device::by_name("cms")
        .unwrap()
        .open_shared()
        .unwrap();
    let (cch, cid) = client_to(7472, PortSpace::Tcp);
    let _c = end(&cid, QpType::Rc);
    cid.connect(&ConnParam::default()).unwrap();
    let e = expect(&cch, CmEventType::Rejected);
    assert_eq!(e.status, 8, "invalid service ID");
}

#[test]
fn a_listener_can_reject_with_private_data() {
    crate::init();
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER, 7473)).unwrap();
    listen.listen(1).unwrap();
    let (cch, cid) = client_to(7473, PortSpace::Tcp);
    let _c = end(&cid, QpType::Rc);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    req.id.reject(b"go away").unwrap();
    let e = expect(&cch, CmEventType::Rejected);
    assert_eq!(e.status, 28, "consumer reject");
    assert_eq!(&e.conn.private_data[..7], b"go away");
}

#[test]
fn private_data_limits_are_the_man_pages() {
    crate::init();
    let (_cch, cid) = client_to(7474, PortSpace::Tcp);
    let _c = end(&cid, QpType::Rc);
    // rdma_connect: 56 bytes in the TCP port space (92 - the CMA header).
    let too_long = ConnParam {
        private_data: vec![0; 57],
        ..ConnParam::default()
    };
    assert!(cid.connect(&too_long).is_err());
}

#[test]
fn nobody_at_the_address_is_unreachable() {
    crate::init();
    // A device address nobody has bound: the REQ and its retries vanish.
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(Some(addr(CLIENT, 0)), addr("127.0.31.99", 7475))
        .unwrap();
    expect(&ch, CmEventType::AddrResolved);
    id.resolve_route().unwrap();
    expect(&ch, CmEventType::RouteResolved);
    let _c = end(&id, QpType::Rc);
    let t0 = std::time::Instant::now();
    id.connect(&ConnParam::default()).unwrap();
    let e = expect(&ch, CmEventType::Unreachable);
    assert_eq!(e.status, -110, "-ETIMEDOUT");
    // 5 tries of ~200 ms (UROCE_CM_RESPONSE_TIMEOUT=14), not 15 x 4 s.
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn ud_through_sidr() {
    crate::init();
    let port = 7476;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Udp).unwrap();
    listen.bind_addr(addr(SERVER, port)).unwrap();
    listen.listen(1).unwrap();
    let (cch, cid) = client_to(port, PortSpace::Udp);
    let c = end(&cid, QpType::Ud);
    cid.connect(&ConnParam {
        private_data: b"sidr".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.conn.private_data[..4], b"sidr");
    let sid = req.id.clone();
    let s = end(&sid, QpType::Ud);
    s.post_recv(0);
    sid.accept(&ConnParam::default()).unwrap();
    let e = expect(&cch, CmEventType::Established);
    let ud = e.ud.expect("UD parameters");
    assert_eq!(ud.qp_num, s.qp.qp_num());
    // A datagram to the resolved QP.
    let ah = c.pd.create_ah(&ud.ah_attr).unwrap();
    c.mr.write(0, b"datagram").unwrap();
    c.send(8, Some(ah.ud_dest(ud.qp_num, ud.qkey)));
    let wc = s.wait();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 48));
    let mut got = [0u8; 8];
    s.mr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
}

/// IPv6: the CMA header carries 16-byte addresses and the GIDs are the
/// addresses themselves; one device on ::1 connects to itself.
#[test]
fn ipv6_connects_to_itself() {
    crate::init();
    let port = 7477;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr("::1", port)).unwrap();
    listen.listen(1).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(None, addr("::1", port)).unwrap();
    expect(&cch, CmEventType::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, CmEventType::RouteResolved);
    let c = end(&cid, QpType::Rc);
    cid.connect(&ConnParam {
        private_data: b"v6".to_vec(),
        ..ConnParam::default()
    })
    .unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    assert_eq!(&req.conn.private_data[..2], b"v6");
    assert_eq!(req.id.dst_addr(), cid.src_addr());
    let sid = req.id.clone();
    let s = end(&sid, QpType::Rc);
    s.post_recv(0);
    sid.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established);
    expect(&sch, CmEventType::Established);
    c.mr.write(0, b"six!").unwrap();
    c.send(4, None);
    assert_eq!(s.wait().status, WcStatus::Success);
    let mut got = [0u8; 4];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"six!");
    cid.disconnect().unwrap();
    expect(&sch, CmEventType::Disconnected);
}

/// The peer goes silent (a killed process: its device sends nothing
/// more): our DREQ is resent until the retries run out, and the
/// connection still ends in DISCONNECTED, then TIMEWAIT_EXIT.
#[test]
fn a_silent_peer_still_ends_in_disconnected() {
    crate::init();
    let port = 7478;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER2, port)).unwrap();
    listen.listen(1).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(addr(CLIENT2, 0)), addr(SERVER2, port))
        .unwrap();
    expect(&cch, CmEventType::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, CmEventType::RouteResolved);
    let _c = end(&cid, QpType::Rc);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let sid = req.id.clone();
    let _s = end(&sid, QpType::Rc);
    sid.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established);
    expect(&sch, CmEventType::Established);
    // The server's device drops everything it would send from now on.
    let sctx = sid.context().unwrap();
    sctx.set_faults(Some(uroce_verbs::Faults {
        loss: 1.0,
        ..uroce_verbs::Faults::default()
    }))
    .unwrap();
    let before = cid.context().unwrap().counters().cm_retries;
    let t0 = std::time::Instant::now();
    cid.disconnect().unwrap();
    expect(&cch, CmEventType::Disconnected);
    expect(&cch, CmEventType::TimewaitExit);
    // Four resends of the DREQ (UROCE_CM_RETRIES=4), ~200 ms apart.
    let resent = cid.context().unwrap().counters().cm_retries - before;
    assert!(resent >= 4, "{resent} DREQ retries");
    assert!(t0.elapsed() > Duration::from_millis(500));
    sctx.set_faults(None).unwrap();
}

/// rdma_destroy_id right after rdma_disconnect (perftest -R's server,
/// which then exits) returns only once the peer has answered the DREQ:
/// uroce's CM ends with the program, so nothing would answer the peer
/// later. When destroy() returns, the client already has DISCONNECTED.
#[test]
fn destroy_after_disconnect_waits_for_the_peers_answer() {
    crate::init();
    let port = 7479;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER, port)).unwrap();
    listen.listen(1).unwrap();
    let (cch, cid) = client_to(port, PortSpace::Tcp);
    let _c = end(&cid, QpType::Rc);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let sid = req.id.clone();
    let s = end(&sid, QpType::Rc);
    sid.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established);
    expect(&sch, CmEventType::Established);
    sid.disconnect().unwrap();
    // The request event still holds the id: destroy() does not wait for
    // the last clone (rdma_destroy_id with events unacknowledged).
    sid.destroy();
    let e = cch
        .get_event_timeout(Some(Duration::ZERO))
        .unwrap()
        .expect("DISCONNECTED before the server's destroy returned");
    assert_eq!(e.event, CmEventType::Disconnected);
    drop((req, sid, s));
}

/// A SEND posted and at once followed by rdma_disconnect reaches the
/// peer, every time: the disconnect's modify to ERR first sends what was
/// posted before it, as a NIC sends the WQEs it fetched, and only then
/// the DREQ goes (librpma's examples 12 and 12scch hung about one run in
/// four when the SEND was flushed instead).
#[test]
fn a_send_posted_just_before_disconnect_reaches_the_peer() {
    crate::init();
    for round in 0..20u16 {
        let port = 7500 + round;
        let sch = EventChannel::new().unwrap();
        let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
        listen.bind_addr(addr(SERVER, port)).unwrap();
        listen.listen(1).unwrap();
        let (cch, cid) = client_to(port, PortSpace::Tcp);
        let c = end(&cid, QpType::Rc);
        cid.connect(&ConnParam::default()).unwrap();
        let req = expect(&sch, CmEventType::ConnectRequest);
        let sid = req.id.clone();
        let s = end(&sid, QpType::Rc);
        s.post_recv(0);
        sid.accept(&ConnParam::default()).unwrap();
        expect(&cch, CmEventType::Established);
        expect(&sch, CmEventType::Established);
        c.mr.write(0, b"last words").unwrap();
        let mut w = SendWr::new(9, WrOpcode::Send);
        w.sg_list.push(c.mr.sge(0, 10));
        c.qp.post_send(&[w]).unwrap();
        cid.disconnect().unwrap();
        let wc = s.wait();
        assert_eq!(
            (wc.status, wc.byte_len),
            (WcStatus::Success, 10),
            "round {round}"
        );
        let mut got = [0u8; 10];
        s.mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"last words", "round {round}");
        expect(&sch, CmEventType::Disconnected);
        sid.disconnect().unwrap();
        drop((req, sid, s, c, cid, listen));
    }
}
