//! Completion channels, asynchronous events and shared receive queues over
//! real UDP between loopback devices.

use std::os::fd::RawFd;
use std::time::Duration;
use uroce_verbs::*;

use crate::common::{connect, open, qp, recv, two, ALL, T};

fn send(id: u64, mr: &MemoryRegion, len: u32, flags: SendFlags) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::Send);
    w.flags = flags | SendFlags::SIGNALED;
    w.sg_list.push(mr.sge(0, len));
    w
}

fn readable(fd: RawFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// Waits for an async event of `ty`, skipping others.
fn wait_event(ctx: &Context, ty: EventType) -> AsyncEvent {
    let end = std::time::Instant::now() + T;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let ev = ctx
            .get_async_event_timeout(left)
            .unwrap_or_else(|| panic!("no {ty:?} event"));
        if ev.event_type == ty {
            return ev;
        }
    }
}

#[test]
fn completion_channel_blocks_and_its_fd_polls() {
    let (ai, bi) = ("127.10.20.1", "127.10.20.2");
    let (a, b) = (open(ai), open(bi));
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let acq = a.create_cq(64).unwrap();
    let ch = b.create_comp_channel().unwrap();
    let bcq = b.create_cq_with(64, 0xfeed, Some(&ch)).unwrap();
    let (aqp, bqp) = (
        qp(&apd, &acq, QpType::Rc, None),
        qp(&bpd, &bcq, QpType::Rc, None),
    );
    connect(&aqp, ai, &bqp, bi);
    let smr = apd.alloc_mr(64, ALL).unwrap();
    let rmr = bpd.alloc_mr(64, ALL).unwrap();
    for i in 0..4 {
        bqp.post_recv(&[recv(i, &rmr, 0, 64)]).unwrap();
    }
    // Not armed: a completion queues no event.
    aqp.post_send(&[send(1, &smr, 8, SendFlags::empty())])
        .unwrap();
    assert_eq!(bcq.wait(1, T).len(), 1);
    assert!(!readable(ch.fd(), 50));
    assert_eq!(ch.try_get_cq_event(), Err(Error::WouldBlock));

    // Armed: a thread blocked in get_cq_event wakes with our CQ.
    bcq.req_notify(false).unwrap();
    let waiter = std::thread::spawn(move || {
        let ev = ch.get_cq_event().unwrap();
        (ch, ev)
    });
    std::thread::sleep(Duration::from_millis(50));
    aqp.post_send(&[send(2, &smr, 8, SendFlags::empty())])
        .unwrap();
    let (ch, ev) = waiter.join().unwrap();
    assert!(ev.is_for(&bcq));
    assert_eq!(ev.cq_context(), 0xfeed);
    let wc = bcq.wait(1, T);
    assert_eq!(wc[0].status, WcStatus::Success);

    // Solicited only: an unsolicited SEND queues nothing, a solicited one
    // does, and the fd turns readable.
    bcq.req_notify(true).unwrap();
    aqp.post_send(&[send(3, &smr, 8, SendFlags::empty())])
        .unwrap();
    assert_eq!(bcq.wait(1, T).len(), 1);
    assert!(!readable(ch.fd(), 50));
    aqp.post_send(&[send(4, &smr, 8, SendFlags::SOLICITED)])
        .unwrap();
    assert!(readable(ch.fd(), 5000));
    let ev = ch.get_cq_event_timeout(T).unwrap().unwrap();
    assert!(ev.is_for(&bcq));
    assert_eq!(bcq.wait(1, T).len(), 1);
    assert!(!readable(ch.fd(), 0));
    assert_eq!(acq.wait(4, T).len(), 4);

    // Two events delivered, none acknowledged: the CQ cannot go yet.
    drop(bqp);
    let bcq = match bcq.destroy() {
        Err((cq, Error::Busy(_))) => cq,
        other => panic!("destroy with unacked events: {other:?}"),
    };
    bcq.ack_events(2);
    let ch = match ch.destroy() {
        Err((ch, Error::Busy(_))) => ch,
        other => panic!("channel destroy while a CQ uses it: {other:?}"),
    };
    bcq.destroy().unwrap();
    ch.destroy().unwrap();
    // A CQ without a channel cannot be armed.
    assert!(acq.req_notify(false).is_err());
}

#[test]
fn async_events_port_comm_est_access_error_and_cq_overflow() {
    let (ai, bi) = ("127.10.21.1", "127.10.21.2");
    let (a, b) = (open(ai), open(bi));
    // Opening raises no event: a kernel device reports PORT_ACTIVE only
    // when the port changes state, and a program's first event is the
    // one it waits for.
    assert!(matches!(a.try_get_async_event(), Err(Error::WouldBlock)));
    assert!(!readable(b.async_fd(), 0));

    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let acq = a.create_cq(64).unwrap();
    let bcq = b.create_cq(1).unwrap();
    let (aqp, bqp) = (
        qp(&apd, &acq, QpType::Rc, None),
        qp(&bpd, &bcq, QpType::Rc, None),
    );
    // b stays in RTR: the first packet it receives establishes
    // communication.
    let p = loopback::RcParams::default();
    loopback::connect_rc(&aqp, bi.parse().unwrap(), bqp.qp_num(), 10, 20, p).unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    bqp.modify(
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AddressVector::to_ip(ai.parse().unwrap()),
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: aqp.qp_num(),
        rq_psn: 10,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..QpAttr::default()
    };
    bqp.modify(
        &rtr,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )
    .unwrap();
    let smr = apd.alloc_mr(64, ALL).unwrap();
    let rmr = bpd.alloc_mr(64, ALL).unwrap();
    bqp.post_recv(&[recv(1, &rmr, 0, 64), recv(2, &rmr, 0, 64)])
        .unwrap();
    aqp.post_send(&[send(1, &smr, 8, SendFlags::empty())])
        .unwrap();
    let ev = wait_event(&b, EventType::CommEst);
    assert_eq!(ev.element, EventElement::Qp(bqp.qp_num()));

    // A WRITE to a QP without REMOTE_WRITE: invalid request at b
    // (QP_REQ_ERR), remote invalid request at a.
    let mut w = SendWr::new(2, WrOpcode::RdmaWrite);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(smr.sge(0, 8));
    w.remote_addr = rmr.addr();
    w.rkey = rmr.rkey();
    aqp.post_send(&[w]).unwrap();
    let ev = wait_event(&b, EventType::QpReqErr);
    assert_eq!(ev.element, EventElement::Qp(bqp.qp_num()));
    let wc = acq.wait(2, T);
    assert_eq!(wc[1].status, WcStatus::RemInvReqErr);
    assert_eq!(bqp.query().unwrap().qp_state, QpState::Err);
    // b's CQ (depth 1) got the SEND's completion, then the flush of the
    // second receive overflowed it: CQ_ERR for the CQ.
    let ev = wait_event(&b, EventType::CqErr);
    assert_eq!(ev.element, EventElement::Cq(bcq.handle()));
    assert!(bcq.overflowed());
}

#[test]
fn access_error_reports_qp_access_err() {
    let (ai, bi) = ("127.10.22.1", "127.10.22.2");
    let (_a, b, apd, bpd, acq, _bcq, aqp, bqp) = two(ai, bi, QpType::Rc);
    connect(&aqp, ai, &bqp, bi);
    let smr = apd.alloc_mr(64, ALL).unwrap();
    let rmr = bpd.alloc_mr(64, ALL).unwrap();
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(smr.sge(0, 8));
    w.remote_addr = rmr.addr();
    w.rkey = rmr.rkey() ^ 0x5a5a;
    aqp.post_send(&[w]).unwrap();
    let ev = wait_event(&b, EventType::QpAccessErr);
    assert_eq!(ev.element, EventElement::Qp(bqp.qp_num()));
    assert_eq!(acq.wait(1, T)[0].status, WcStatus::RemAccessErr);
    // Both QPs went to ERR on their own (no modify call): the verbs layer
    // sees the engine's state, not a mirror of the last modify.
    assert_eq!(bqp.state(), QpState::Err);
    assert_eq!(aqp.state(), QpState::Err);
}

#[test]
fn srq_shared_by_two_rc_qps_with_limit_and_last_wqe() {
    let (si, c1, c2) = ("127.10.23.1", "127.10.23.2", "127.10.23.3");
    let (s, x, y) = (open(si), open(c1), open(c2));
    let spd = s.alloc_pd().unwrap();
    let scq = s.create_cq(256).unwrap();
    let srq = spd
        .create_srq(&SrqAttr {
            max_wr: 32,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let sq1 = qp(&spd, &scq, QpType::Rc, Some(&srq));
    let sq2 = qp(&spd, &scq, QpType::Rc, Some(&srq));
    assert_eq!(sq1.cap().max_recv_wr, 0);
    assert!(sq1.post_recv(&[]).is_err(), "a QP with an SRQ has no RQ");
    let (xpd, ypd) = (x.alloc_pd().unwrap(), y.alloc_pd().unwrap());
    let (xcq, ycq) = (x.create_cq(64).unwrap(), y.create_cq(64).unwrap());
    let (xqp, yqp) = (
        qp(&xpd, &xcq, QpType::Rc, None),
        qp(&ypd, &ycq, QpType::Rc, None),
    );
    connect(&xqp, c1, &sq1, si);
    connect(&yqp, c2, &sq2, si);
    let rmr = spd.alloc_mr(32 * 64, ALL).unwrap();
    for i in 0..8u64 {
        srq.post_recv(&[recv(i, &rmr, i as usize * 64, 64)])
            .unwrap();
    }
    // Arm: fewer than 5 left fires once.
    srq.modify(
        &SrqAttr {
            srq_limit: 5,
            ..SrqAttr::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    assert_eq!(srq.query().srq_limit, 5);
    // Resizing (IBV_SRQ_MAX_WR, as rxe): never below the 8 posted nor the
    // armed limit; growing keeps what is posted.
    let max_wr = |n| SrqAttr {
        max_wr: n,
        ..SrqAttr::default()
    };
    for n in [0, 4, 7] {
        let r = srq.modify(&max_wr(n), SrqAttrMask::MAX_WR);
        assert!(matches!(r, Err(Error::Invalid(_))), "max_wr {n}: {r:?}");
    }
    assert_eq!(srq.query().max_wr, 32);
    srq.modify(&max_wr(48), SrqAttrMask::MAX_WR).unwrap();
    assert_eq!((srq.query().max_wr, srq.len()), (48, 8));
    let xmr = xpd.alloc_mr(64, ALL).unwrap();
    let ymr = ypd.alloc_mr(64, ALL).unwrap();
    xmr.write(0, &[0xaa; 64]).unwrap();
    ymr.write(0, &[0xbb; 64]).unwrap();
    for i in 0..3 {
        xqp.post_send(&[send(i, &xmr, 64, SendFlags::empty())])
            .unwrap();
        yqp.post_send(&[send(i, &ymr, 64, SendFlags::empty())])
            .unwrap();
    }
    let wcs = scq.wait(6, T);
    assert_eq!(wcs.len(), 6);
    let mut used = std::collections::HashSet::new();
    for wc in &wcs {
        assert_eq!(wc.status, WcStatus::Success);
        assert!(used.insert(wc.wr_id), "each SRQ WR used once");
        let who = if wc.qp_num == sq1.qp_num() {
            0xaa
        } else {
            assert_eq!(wc.qp_num, sq2.qp_num());
            0xbb
        };
        let got = rmr.to_vec(wc.wr_id as usize * 64, 64).unwrap();
        assert!(got.iter().all(|&b| b == who), "data of QP {:#x}", wc.qp_num);
    }
    let ev = wait_event(&s, EventType::SrqLimitReached);
    assert_eq!(ev.element, EventElement::Srq(srq.handle()));
    assert_eq!(srq.query().srq_limit, 0, "the limit disarms when it fires");
    assert_eq!(srq.len(), 2);

    // Empty SRQ: the sender is RNR-NAKed until a WR is posted.
    xqp.post_send(&[send(10, &xmr, 64, SendFlags::empty())])
        .unwrap();
    xqp.post_send(&[send(11, &xmr, 64, SendFlags::empty())])
        .unwrap();
    xqp.post_send(&[send(12, &xmr, 64, SendFlags::empty())])
        .unwrap();
    assert_eq!(scq.wait(2, T).len(), 2);
    std::thread::sleep(Duration::from_millis(30));
    assert!(s.counters().rnr_naks_sent > 0, "RNR NAK for an empty SRQ");
    srq.post_recv(&[recv(20, &rmr, 0, 64)]).unwrap();
    let wc = scq.wait(1, T);
    assert_eq!(wc[0].wr_id, 20);
    assert_eq!(xcq.wait(6, T).len(), 6);

    // One QP to ERR: LAST_WQE_REACHED for it; the SRQ's WRs stay for the
    // other.
    srq.post_recv(&[recv(21, &rmr, 64, 64)]).unwrap();
    sq1.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        },
        AttrMask::STATE,
    )
    .unwrap();
    let ev = wait_event(&s, EventType::QpLastWqeReached);
    assert_eq!(ev.element, EventElement::Qp(sq1.qp_num()));
    assert_eq!(srq.len(), 1);
    yqp.post_send(&[send(30, &ymr, 64, SendFlags::empty())])
        .unwrap();
    let wc = scq.wait(1, T);
    assert_eq!((wc[0].wr_id, wc[0].qp_num), (21, sq2.qp_num()));
    // Busy while QPs use it.
    let srq = match srq.destroy() {
        Err((srq, Error::Busy(_))) => srq,
        other => panic!("{other:?}"),
    };
    drop((sq1, sq2));
    srq.destroy().unwrap();
}

/// RTS -> SQD with `en_sqd_async_notify` through the verbs API: a thread
/// blocked in `get_async_event` wakes with SQ_DRAINED once the WRITE
/// started before the transition has completed; a WR posted in SQD is
/// accepted but not started, and SQD -> RTS starts it.
#[test]
fn blocking_get_async_event_wakes_on_sq_drained() {
    let (ai, bi) = ("127.10.24.101", "127.10.24.102");
    let (a, _b, apd, bpd, acq, _bcq, aqp, bqp) = two(ai, bi, QpType::Rc);
    connect(&aqp, ai, &bqp, bi);
    let smr = apd.alloc_mr(1 << 20, ALL).unwrap();
    smr.write(0, &vec![0x5a; 1 << 20]).unwrap();
    let rmr = bpd.alloc_mr(1 << 20, ALL).unwrap();
    let write = |id: u64| {
        let mut w = SendWr::new(id, WrOpcode::RdmaWrite);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(smr.sge(0, 1 << 20));
        w.remote_addr = rmr.addr();
        w.rkey = rmr.rkey();
        w
    };
    std::thread::scope(|s| {
        let waiter = s.spawn(|| a.get_async_event().unwrap());
        // Nothing has happened yet: the waiter is still blocked.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished());
        aqp.post_send(&[write(1)]).unwrap();
        // SQD finishes the WRs it has started and starts no new ones:
        // move to SQD once WR 1's first packet has landed.
        let end = std::time::Instant::now() + T;
        while rmr.to_vec(0, 1).unwrap()[0] != 0x5a {
            assert!(std::time::Instant::now() < end, "WRITE never started");
            std::hint::spin_loop();
        }
        let sqd = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: true,
            ..QpAttr::default()
        };
        aqp.modify(&sqd, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY)
            .unwrap();
        // In SQD a newly posted WR waits.
        aqp.post_send(&[write(2)]).unwrap();
        let ev = waiter.join().unwrap();
        assert_eq!(ev.event_type, EventType::SqDrained);
        assert_eq!(ev.element, EventElement::Qp(aqp.qp_num()));
    });
    let c = acq.wait(1, T);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
    assert!(
        acq.wait(1, Duration::from_millis(100)).is_empty(),
        "WR 2 waits in SQD"
    );
    assert_eq!(aqp.query().unwrap().qp_state, QpState::Sqd);
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    aqp.modify(&rts, AttrMask::STATE).unwrap();
    let c = acq.wait(1, T);
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::Success));
    assert_eq!(rmr.to_vec(0, 1 << 20).unwrap(), vec![0x5a; 1 << 20]);
}

/// Two contexts of one device (`ibv_open_device` twice, as two UCX
/// contexts do): each has its own descriptor, and an event about a QP
/// goes to the context that created the QP, only.
#[test]
fn each_context_has_its_own_async_events() {
    let (ai, bi) = ("127.102.1.1", "127.102.1.2");
    let a = open(ai);
    let b1 = open(bi);
    let b2 = b1.new_context().unwrap();
    assert_ne!(b1.async_fd(), b2.async_fd());
    let (apd, bpd) = (a.alloc_pd().unwrap(), b2.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(64).unwrap(), b2.create_cq(64).unwrap());
    let (aqp, bqp) = (
        qp(&apd, &acq, QpType::Rc, None),
        qp(&bpd, &bcq, QpType::Rc, None),
    );
    connect(&aqp, ai, &bqp, bi);
    let smr = apd.alloc_mr(64, ALL).unwrap();
    let rmr = bpd.alloc_mr(64, ALL).unwrap();
    let mut w = SendWr::new(1, WrOpcode::RdmaWrite);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(smr.sge(0, 8));
    w.remote_addr = rmr.addr();
    w.rkey = rmr.rkey() ^ 0x5a5a;
    aqp.post_send(&[w]).unwrap();
    assert_eq!(acq.wait(1, T)[0].status, WcStatus::RemAccessErr);
    assert!(readable(b2.async_fd(), 5000));
    let ev = b2.try_get_async_event().unwrap();
    assert_eq!(ev.event_type, EventType::QpAccessErr);
    assert_eq!(ev.element, EventElement::Qp(bqp.qp_num()));
    // The other context of the device heard nothing.
    assert!(!readable(b1.async_fd(), 0));
    assert!(matches!(b1.try_get_async_event(), Err(Error::WouldBlock)));
    // Events of objects made through the first context stay its own.
    drop(b2);
    let pd1 = b1.alloc_pd().unwrap();
    let cq1 = b1.create_cq(4).unwrap();
    let srq = pd1
        .create_srq(&SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let qp1 = qp(&pd1, &cq1, QpType::Rc, Some(&srq));
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    qp1.modify(&err, AttrMask::STATE).unwrap();
    let ev = wait_event(&b1, EventType::QpLastWqeReached).element;
    assert_eq!(ev, EventElement::Qp(qp1.qp_num()));
}

/// `ibv_modify_srq(IBV_SRQ_MAX_WR)` grows an SRQ in place, as rxe does
/// (rdma-unit-test's `SrqTest.ModifyMaxWr`): the WRs a full queue refused
/// fit afterwards, and those posted before stay and are received.
#[test]
fn an_srq_grows_with_modify_max_wr() {
    let (ai, bi) = ("127.10.27.1", "127.10.27.2");
    let (a, b) = (open(ai), open(bi));
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let srq = bpd
        .create_srq(&SrqAttr {
            max_wr: 4,
            max_sge: 1,
            srq_limit: 0,
        })
        .unwrap();
    let rmr = bpd.alloc_mr(16 * 64, ALL).unwrap();
    for i in 0..4u64 {
        srq.post_recv(&[recv(i, &rmr, i as usize * 64, 64)])
            .unwrap();
    }
    let full = srq.post_recv(&[recv(4, &rmr, 4 * 64, 64)]);
    assert!(matches!(full, Err((0, Error::NoMemory(_)))), "{full:?}");
    let grow = SrqAttr {
        max_wr: 8,
        ..SrqAttr::default()
    };
    srq.modify(&grow, SrqAttrMask::MAX_WR).unwrap();
    assert_eq!(srq.query().max_wr, 8);
    for i in 4..8u64 {
        srq.post_recv(&[recv(i, &rmr, i as usize * 64, 64)])
            .unwrap();
    }
    assert!(srq.post_recv(&[recv(8, &rmr, 8 * 64, 64)]).is_err());
    let (aqp, bqp) = (
        qp(&apd, &acq, QpType::Rc, None),
        qp(&bpd, &bcq, QpType::Rc, Some(&srq)),
    );
    connect(&aqp, ai, &bqp, bi);
    let smr = apd.alloc_mr(64, ALL).unwrap();
    for i in 0..8 {
        aqp.post_send(&[send(i, &smr, 8, SendFlags::empty())])
            .unwrap();
    }
    let wcs = bcq.wait(8, T);
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success));
    assert!(srq.is_empty());
}
