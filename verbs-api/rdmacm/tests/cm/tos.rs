//! `rdma_set_option(RDMA_OPTION_ID_TOS)` through the Rust CM: the traffic
//! class set on the active id is the path traffic class of both QPs of
//! the connection (the REQ's path carries it), over real engines on
//! loopback (127.103.4.x). The traffic class is the one the route was
//! resolved with. And `RDMA_OPTION_ID_ACK_TIMEOUT`: each side's own QP
//! timeout at RTS, not negotiated.

use crate::{addr, expect};
use uroce_rdmacm::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use uroce_verbs::{QpCap, QpInitAttr, QpState, QpType};

const SERVER: &str = "127.103.4.1";
const CLIENT: &str = "127.103.4.2";

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("tos0={SERVER},tos1={CLIENT}")
}

fn rc_qp(
    id: &CmId,
) -> (
    uroce_verbs::Context,
    uroce_verbs::ProtectionDomain,
    uroce_verbs::CompletionQueue,
    std::sync::Arc<uroce_verbs::QueuePair>,
) {
    let ctx = id.context().expect("a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8).unwrap();
    let qp = id
        .create_qp(
            &pd,
            &QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: true,
                srq: None,
            },
        )
        .unwrap();
    (ctx, pd, cq, qp)
}

#[test]
fn each_sides_ack_timeout_is_its_own_qps() {
    crate::init();
    let port = 19302;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER, port)).unwrap();
    listen.listen(4).unwrap();
    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp).unwrap();
    cid.resolve_addr(Some(addr(CLIENT, 0)), addr(SERVER, port))
        .unwrap();
    expect(&cch, CmEventType::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, CmEventType::RouteResolved);
    let c = rc_qp(&cid);
    // pyverbs' test_rdmacm_async_traffic sets 21 on both sides and reads
    // it back from each QP once connected.
    cid.set_ack_timeout(21).unwrap();
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let sid = req.id.clone();
    let s = rc_qp(&sid);
    sid.set_ack_timeout(9).unwrap();
    sid.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established);
    expect(&sch, CmEventType::Established);
    assert_eq!(c.3.query().unwrap().timeout, 21, "the active side's own");
    assert_eq!(s.3.query().unwrap().timeout, 9, "the passive side's own");
    cid.disconnect().unwrap();
    expect(&sch, CmEventType::Disconnected);
    expect(&cch, CmEventType::Disconnected);
    // RC ids only, as the kernel's rdma_set_ack_timeout.
    let ud = CmId::new(&cch, PortSpace::Udp).unwrap();
    assert!(ud.set_ack_timeout(14).is_err());
}

#[test]
fn the_ids_tos_is_both_qps_traffic_class() {
    crate::init();
    let port = 19301;
    let sch = EventChannel::new().unwrap();
    let listen = CmId::new(&sch, PortSpace::Tcp).unwrap();
    listen.bind_addr(addr(SERVER, port)).unwrap();
    listen.listen(4).unwrap();

    let cch = EventChannel::new().unwrap();
    let cid = CmId::new(&cch, PortSpace::Tcp).unwrap();
    assert_eq!(cid.tos(), 0);
    cid.set_tos(0x68);
    cid.resolve_addr(Some(addr(CLIENT, 0)), addr(SERVER, port))
        .unwrap();
    expect(&cch, CmEventType::AddrResolved);
    cid.resolve_route().unwrap();
    expect(&cch, CmEventType::RouteResolved);
    // As the kernel (cma_resolve_iboe_route): the route took the TOS when
    // it was resolved; a later set_option changes the id, not the route.
    cid.set_tos(0x20);
    assert_eq!((cid.tos(), cid.route_tos()), (0x20, 0x68));

    let c = rc_qp(&cid);
    cid.connect(&ConnParam::default()).unwrap();
    let req = expect(&sch, CmEventType::ConnectRequest);
    let sid = req.id.clone();
    assert_eq!(
        sid.init_qp_attr(QpState::Rtr)
            .unwrap()
            .0
            .ah_attr
            .traffic_class,
        0x68,
        "the REQ's path"
    );
    let s = rc_qp(&sid);
    sid.accept(&ConnParam::default()).unwrap();
    expect(&cch, CmEventType::Established);
    expect(&sch, CmEventType::Established);
    for qp in [&c.3, &s.3] {
        let a = qp.query().unwrap();
        assert_eq!(a.qp_state, QpState::Rts);
        assert_eq!(a.ah_attr.traffic_class, 0x68);
    }
    cid.disconnect().unwrap();
    expect(&sch, CmEventType::Disconnected);
    expect(&cch, CmEventType::Disconnected);
}
