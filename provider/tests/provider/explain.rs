//! Errors that explain themselves: each error completion, and each move of
//! a QP to ERR, leaves one line saying which check failed on which side
//! (kept per QP, printed with `UROCE_EXPLAIN=1`). Each scenario provokes
//! one error on the simulated network and reads the explanation.

use uroce_provider::sans_io::net::sim::{Faults, Verdict, Wire};
use uroce_provider::testing::{sge, signaled_wr as wr, PairParams, RcPair};
use uroce_provider::types::*;

const SEC: u64 = 1_000_000_000;

fn pair(p: PairParams) -> RcPair {
    RcPair::new(7, Faults::default(), p)
}

/// A WRITE of `len` bytes at offset `off` of a region of 4096 bytes on b
/// registered with `access`, its R_Key changed by `rkey_xor`. Returns the
/// requester's completion status and b's region (iova, rkey).
fn write_to_b(
    p: &mut RcPair,
    access: Access,
    rkey_xor: u32,
    off: u64,
    len: u32,
) -> (WcStatus, u64, u32) {
    let src = p.mr(true, 4096, Access::LOCAL_WRITE);
    let dst = p.mr(false, 4096, access);
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, len)]);
    w.remote_addr = dst.iova() + off;
    w.rkey = dst.rkey() ^ rkey_xor;
    p.post_send(true, w);
    let c = p.wait(true, true, 1, 5 * SEC);
    assert_eq!(c.len(), 1);
    p.settle(SEC / 10);
    (c[0].status, dst.iova(), dst.rkey())
}

#[test]
fn a_wrong_rkey_names_the_key_on_the_responder_and_the_nak_on_the_requester() {
    let mut p = pair(PairParams::default());
    let (status, _, rkey) = write_to_b(
        &mut p,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        0x5a00,
        0,
        64,
    );
    assert_eq!(status, WcStatus::RemAccessErr);
    let bad = rkey ^ 0x5a00;
    let a = p.a.last_error();
    assert!(a.contains("IBV_WC_REM_ACCESS_ERR (requester)"), "{a}");
    assert!(
        a.contains(
            "peer 10.0.0.2 QP 0x000022 sent NAK remote access error (syndrome 0x62) for PSN 0x"
        ),
        "{a}"
    );
    assert!(a.contains(&format!("rkey {bad:#x}")), "{a}");
    let b =
        p.b.state
            .error_cause()
            .expect("b is in ERR, explained")
            .to_string();
    assert!(b.contains("(responder)"), "{b}");
    assert!(
        b.contains(&format!("R_Key check: rkey {bad:#x} va 0x")),
        "{b}"
    );
    assert!(
        b.contains("len 64 needs REMOTE_WRITE: no memory region has this key"),
        "{b}"
    );
    assert!(
        b.contains(
            "NAK remote access error (syndrome 0x62) sent to peer 10.0.0.1 QP 0x000011 for PSN 0x"
        ),
        "{b}"
    );
}

#[test]
fn an_out_of_bounds_write_names_the_regions_bounds() {
    let mut p = pair(PairParams::default());
    let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (status, iova, rkey) = write_to_b(&mut p, rights, 0, 4090, 100);
    assert_eq!(status, WcStatus::RemAccessErr);
    let b = p.b.state.error_cause().expect("explained").to_string();
    let want = format!(
        "rkey {rkey:#x} va {:#x} len 100 needs REMOTE_WRITE: the range is outside the region [{iova:#x}, {:#x}) (4096 bytes, PD 1) rights LOCAL_WRITE|REMOTE_WRITE",
        iova + 4090,
        iova + 4096
    );
    assert!(b.contains(&want), "{b}\nwanted: {want}");
}

#[test]
fn missing_rights_name_the_right_and_the_regions_rights() {
    let mut p = pair(PairParams::default());
    let (status, _, _) = write_to_b(&mut p, Access::LOCAL_WRITE | Access::REMOTE_READ, 0, 0, 8);
    assert_eq!(status, WcStatus::RemAccessErr);
    let b = p.b.state.error_cause().expect("explained").to_string();
    assert!(
        b.contains("rights LOCAL_WRITE|REMOTE_READ lacks REMOTE_WRITE"),
        "{b}"
    );
}

#[test]
fn a_bad_lkey_is_a_local_protection_error_naming_the_sge() {
    let mut p = pair(PairParams::default());
    let src = p.mr(true, 256, Access::LOCAL_WRITE);
    let mut s = sge(&src, 200, 100);
    p.post_send(true, wr(3, WrOpcode::Send, &[s]));
    let c = p.wait(true, true, 1, SEC);
    assert_eq!(c[0].status, WcStatus::LocProtErr);
    let a = p.a.last_error();
    s.addr = src.iova() + 200;
    let want = format!(
        "IBV_WC_LOC_PROT_ERR (local): Send WR 0x3: SGE 0: lkey {:#x} addr {:#x} len 100: the range is outside the region [{:#x}, {:#x})",
        src.lkey(),
        s.addr,
        src.iova(),
        src.iova() + 256
    );
    assert!(a.contains(&want), "{a}\nwanted: {want}");
}

#[test]
fn retry_exceeded_names_the_silent_peer_and_since_when() {
    let mut p = pair(PairParams {
        timeout: 14, // 67 ms
        retry_cnt: 2,
        ..Default::default()
    });
    // One exchange, so that the peer was heard from; then b falls silent.
    let src = p.mr(true, 64, Access::LOCAL_WRITE);
    let dst = p.mr(false, 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 8)]);
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    p.post_send(true, w.clone());
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    let (a_ip, b_ip) = (p.a.ip, p.b.ip);
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.src == b_ip && w.dst == a_ip {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    w.wr_id = 2;
    p.post_send(true, w);
    let c = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(c[0].status, WcStatus::RetryExcErr);
    let a = p.a.last_error();
    assert!(
        a.contains(
            "IBV_WC_RETRY_EXC_ERR (requester): no ACK from peer 10.0.0.2 QP 0x000022 for PSN 0x"
        ),
        "{a}"
    );
    assert!(
        a.contains("2 retries of the 67.108 ms local ACK timeout (timeout 14) spent (retry_cnt 2)"),
        "{a}"
    );
    // Three timeouts (the first send and two retries) of 67 ms: the peer
    // was last heard from about 200 ms before.
    let since = a.split("last packet from it ").nth(1).expect(&a);
    let ms: f64 = since.split(' ').next().unwrap().parse().unwrap();
    assert!((190.0..260.0).contains(&ms), "{a}");
}

#[test]
fn rnr_retry_exceeded_names_the_rnr_nak_and_the_retries() {
    let mut p = pair(PairParams {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..Default::default()
    });
    let src = p.mr(true, 64, Access::LOCAL_WRITE);
    p.post_send(true, wr(5, WrOpcode::Send, &[sge(&src, 0, 16)]));
    let c = p.wait(true, true, 1, 5 * SEC);
    assert_eq!(c[0].status, WcStatus::RnrRetryExcErr);
    let a = p.a.last_error();
    assert!(
        a.contains(
            "IBV_WC_RNR_RETRY_EXC_ERR (requester): peer 10.0.0.2 QP 0x000022 answered PSN 0x"
        ),
        "{a}"
    );
    assert!(a.contains("with an RNR NAK (syndrome 0x21, RNR timer 1: 0.010 ms) after rnr_retry 1 retries were spent"), "{a}");
    assert!(a.contains("last packet from it 0.000 ms ago"), "{a}");
}

#[test]
fn flushes_say_why_the_qp_is_in_err() {
    let mut p = pair(PairParams::default());
    let (status, _, _) = write_to_b(&mut p, Access::LOCAL_WRITE, 0, 0, 8);
    assert_eq!(status, WcStatus::RemAccessErr);
    // The move to ERR, explained by its cause.
    let cause = p.a.state.error_cause().expect("a is in ERR").to_string();
    assert!(
        cause.starts_with("QP 0x000011 IBV_WC_REM_ACCESS_ERR (requester): peer 10.0.0.2"),
        "{cause}"
    );
    // A WR posted now is flushed, and says why.
    let src = p.mr(true, 64, Access::LOCAL_WRITE);
    p.post_send(true, wr(9, WrOpcode::Send, &[sge(&src, 0, 8)]));
    let c = p.wait(true, true, 1, SEC);
    assert_eq!(c[0].status, WcStatus::WrFlushErr);
    let a = p.a.last_error();
    assert!(a.starts_with("QP 0x000011 IBV_WC_WR_FLUSH_ERR (local): WRs posted to the QP in ERR are flushed; it is in ERR: QP 0x000011 IBV_WC_REM_ACCESS_ERR (requester): peer 10.0.0.2"), "{a}");
    assert!(a.contains("IBV_WC_REM_ACCESS_ERR"), "{a}");
    // The responder's receive WR is flushed with the responder's reason.
    let b = p.b.state.error_cause().unwrap().to_string();
    assert!(b.contains("lacks REMOTE_WRITE"), "{b}");
}

#[test]
fn the_application_moving_a_qp_to_err_is_said_so() {
    let mut p = pair(PairParams::default());
    let mut a = uroce_provider::qp_attr::QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    a.qp_state = QpState::Err;
    p.net
        .qp(p.a.id)
        .modify(&a, uroce_provider::qp_attr::AttrMask::STATE)
        .unwrap();
    let e = p.a.last_error();
    assert!(e.contains("ibv_modify_qp moved it to ERR"), "{e}");
}

#[test]
fn a_send_longer_than_the_receive_wr_names_both_lengths() {
    let mut p = pair(PairParams::default());
    let src = p.mr(true, 4096, Access::LOCAL_WRITE);
    let dst = p.mr(false, 4096, Access::LOCAL_WRITE);
    p.post_recv(false, 0x77, &[sge(&dst, 0, 1000)]);
    p.post_send(true, wr(4, WrOpcode::Send, &[sge(&src, 0, 3000)]));
    let c = p.wait(true, true, 1, 5 * SEC);
    assert_eq!(c[0].status, WcStatus::RemInvReqErr);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!(r[0].status, WcStatus::LocLenErr);
    let b = p.b.state.error_cause().unwrap().to_string();
    assert!(
        b.contains("IBV_WC_LOC_LEN_ERR (responder): RC_SEND_FIRST PSN"),
        "{b}"
    );
    assert!(
        b.contains(
            "length: the SEND's 1024 bytes so far exceed the receive WR's 1000 bytes of buffers"
        ),
        "{b}"
    );
    assert!(b.contains("NAK invalid request (syndrome 0x61)"), "{b}");
    let a = p.a.last_error();
    assert!(a.contains("IBV_WC_REM_INV_REQ_ERR (requester): peer 10.0.0.2 QP 0x000022 sent NAK invalid request (syndrome 0x61)"), "{a}");
    assert!(a.contains("the WR 0x4 was a Send of 3000 bytes"), "{a}");
}

#[test]
fn a_write_the_qp_does_not_allow_names_its_access_flags() {
    let mut p = pair(PairParams::default());
    let attr = uroce_provider::qp_attr::QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..Default::default()
    };
    p.net
        .qp(p.b.id)
        .modify(
            &attr,
            uroce_provider::qp_attr::AttrMask::STATE
                | uroce_provider::qp_attr::AttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let (status, _, _) = write_to_b(&mut p, Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0, 0, 8);
    assert_eq!(status, WcStatus::RemInvReqErr);
    let b = p.b.state.error_cause().unwrap().to_string();
    assert!(b.contains("RC_RDMA_WRITE_ONLY PSN 0x123456: op validity: the QP's access flags (LOCAL_WRITE|REMOTE_READ) do not allow it"), "{b}");
}

mod ud {
    use super::SEC;
    use uroce_provider::sans_io::net::sim::{Faults, SimNet};
    use uroce_provider::sans_io::transport::ud::UdQp;
    use uroce_provider::testing::{sge, side_with, ud_up, PairParams};
    use uroce_provider::types::*;

    const QKEY: u32 = 0x1111_1111;

    #[test]
    fn a_datagram_longer_than_its_receive_buffer_and_a_bad_lkey_are_explained() {
        let mut net = SimNet::new(3, Faults::default());
        let p = PairParams::default();
        let a = side_with(&mut net, "10.0.0.1".parse().unwrap(), 0x11, &p, |c| {
            Box::new(UdQp::new(c))
        });
        // Taken from an SRQ, a receive WR too small completes in error
        // (class E; one of the QP's own is left in place, class D).
        let events =
            std::sync::Arc::new(uroce_provider::sans_io::events::AsyncEvents::new().unwrap());
        let srq = std::sync::Arc::new(
            uroce_provider::sans_io::transport::RecvQueue::new_srq(16, 5, events).unwrap(),
        );
        let q = srq.clone();
        let b = side_with(
            &mut net,
            "10.0.0.2".parse().unwrap(),
            0x22,
            &p,
            move |mut c| {
                c.rq = q;
                Box::new(UdQp::new(c))
            },
        );
        ud_up(net.qp(a.id), QKEY, 0);
        ud_up(net.qp(b.id), QKEY, 0);
        let src = a
            .keys
            .register_zeroed(1, 1024, Access::LOCAL_WRITE)
            .unwrap();
        let dst = b
            .keys
            .register_zeroed(1, 1024, Access::LOCAL_WRITE)
            .unwrap();
        srq.post(RecvWr {
            wr_id: 0x55,
            sg_list: [sge(&dst, 0, 100)].into_iter().collect(),
        })
        .unwrap();
        let mut w = SendWr::new(1, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list = [sge(&src, 0, 200)].into_iter().collect();
        w.ud = Some(UdDest {
            ip: b.ip,
            remote_qpn: b.qpn,
            remote_qkey: QKEY,
            tclass: 0,
            hop_limit: 64,
        });
        a.sq.post(w.clone()).unwrap();
        net.run_until(SEC, |_| false);
        assert_eq!(b.recv_cq.poll_one().unwrap().status, WcStatus::LocLenErr);
        let e = b.last_error();
        assert!(e.contains("IBV_WC_LOC_LEN_ERR (responder): datagram PSN 0x000000 from 10.0.0.1 QP 0x000011: length: 40 bytes of GRH + 200 of payload exceed receive WR 0x55's 100 bytes of buffers"), "{e}");
        assert_eq!(b.state.error_cause(), None, "a UD QP stays up");

        // A bad lkey: the send queue error (SQE), explained.
        w.wr_id = 2;
        w.sg_list[0].lkey ^= 0xff;
        a.sq.post(w).unwrap();
        net.run_until(SEC, |_| false);
        assert_eq!(a.send_cq.poll_one().unwrap().status, WcStatus::Success);
        assert_eq!(a.send_cq.poll_one().unwrap().status, WcStatus::LocProtErr);
        let e = a.last_error();
        assert!(
            e.contains("IBV_WC_LOC_PROT_ERR (local): Send WR 0x2: SGE 0: lkey"),
            "{e}"
        );
        assert!(e.contains("no memory region has this key"), "{e}");
        assert!(e.contains("the QP moves to SQE"), "{e}");
    }
}
