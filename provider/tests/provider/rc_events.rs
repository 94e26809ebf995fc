//! Asynchronous events, completion notifications and shared receive
//! queues of RC QPs on the simulated network: COMM_EST, completion
//! channels (next / solicited-only arming, the SE bit), responder errors
//! (QP_ACCESS_ERR, QP_REQ_ERR), CQ overflow (CQ_ERR + QP_FATAL), SRQs
//! shared by two QPs (arrival order, SRQ limit, RNR on an empty SRQ,
//! LAST_WQE_REACHED without flushing the SRQ), and SQD draining
//! (SQ_DRAINED).

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uroce_provider::counters::Counters;
use uroce_provider::qp_attr::{AttrMask, QpAttr};
use uroce_provider::sans_io::cq::CompChannel;
use uroce_provider::sans_io::cq::CqInner;
use uroce_provider::sans_io::events::{AsyncEvent, AsyncEvents, EventElement, EventType};
use uroce_provider::sans_io::memory::{KeyTable, MrInner};
use uroce_provider::sans_io::net::sim::{Faults, QpId, SimNet, Verdict, Wire};
use uroce_provider::sans_io::transport::rc::{
    max_inflight_psns, QpConfig, RcQp, MAX_INFLIGHT_BYTES,
};
use uroce_provider::sans_io::transport::{QpMachine, RecvQueue, SendQueue};
use uroce_provider::testing::{
    config, connect, sge, signaled_wr as wr, to_rtr, to_rts, PairParams, RcPair,
};
use uroce_provider::types::*;
use uroce_wire::Opcode;

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const PD: u32 = 1;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

// ---------------------------------------------------------------------
// Fixtures: a "device" (address, key table, event queue, counters) on
// which QPs are built from parts the test chooses (CQs with a channel,
// CQs of depth 1, a shared receive queue).
// ---------------------------------------------------------------------

struct Dev {
    ip: IpAddr,
    keys: Arc<KeyTable>,
    events: Arc<AsyncEvents>,
    counters: Arc<Counters>,
}

/// One QP and the queues it was built with.
struct Ep {
    id: QpId,
    qpn: u32,
    sq: Arc<SendQueue>,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    rq: Arc<RecvQueue>,
}

impl Dev {
    fn new(ip: &str) -> Dev {
        Dev {
            ip: ip.parse().unwrap(),
            keys: Arc::new(KeyTable::new()),
            events: Arc::new(AsyncEvents::new().unwrap()),
            counters: Arc::new(Counters::default()),
        }
    }

    fn mr(&self, len: usize) -> Arc<MrInner> {
        self.keys.register_zeroed(PD, len, ALL).unwrap()
    }

    /// An RC QP (in RESET) built from the given CQs and receive queue.
    fn qp_with(
        &self,
        net: &mut SimNet,
        qpn: u32,
        send_cq: Arc<CqInner>,
        recv_cq: Arc<CqInner>,
        rq: Arc<RecvQueue>,
    ) -> Ep {
        let cfg = QpConfig {
            keys: self.keys.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            rq: rq.clone(),
            counters: self.counters.clone(),
            events: self.events.clone(),
            strict_source_port: false,
            state: Arc::default(),
            observer: uroce_provider::observe::Observer::process(),
            ..config(self.ip, qpn, 64)
        };
        let sq = cfg.sq.clone();
        let id = net.add(self.ip, RcQp::new(cfg));
        Ep {
            id,
            qpn,
            sq,
            send_cq,
            recv_cq,
            rq,
        }
    }

    /// An RC QP with plain CQs and its own receive queue.
    fn qp(&self, net: &mut SimNet, qpn: u32) -> Ep {
        self.qp_with(
            net,
            qpn,
            Arc::new(CqInner::new(256)),
            Arc::new(CqInner::new(256)),
            Arc::new(RecvQueue::new(64).unwrap()),
        )
    }
}

/// The PSN a QP starts sending with.
fn psn0(qpn: u32) -> u32 {
    qpn * 0x100
}

/// Brings `x` to RTS towards `y` (at `y_ip`).
fn link(net: &mut SimNet, x: &Ep, y_ip: IpAddr, y: &Ep) {
    connect(
        net.qp(x.id),
        y_ip,
        y.qpn,
        psn0(y.qpn),
        psn0(x.qpn),
        &PairParams::default(),
    );
}

fn modify_state(qp: &mut dyn QpMachine, state: QpState) {
    let a = QpAttr {
        qp_state: state,
        ..QpAttr::default()
    };
    qp.modify(&a, AttrMask::STATE).unwrap();
}

/// RTS -> SQD, asking for SQ_DRAINED or not.
fn to_sqd(qp: &mut dyn QpMachine, notify: bool) {
    let a = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: notify,
        ..QpAttr::default()
    };
    qp.modify(&a, AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
}

fn recv_wr(wr_id: u64, sges: &[Sge]) -> RecvWr {
    RecvWr {
        wr_id,
        sg_list: sges.iter().copied().collect(),
    }
}

/// Every asynchronous event waiting, oldest first.
fn drain(ev: &AsyncEvents) -> Vec<AsyncEvent> {
    let mut v = Vec::new();
    while let Some(e) = ev.get(Some(Duration::ZERO)) {
        v.push(e);
    }
    assert!(ev.is_empty());
    v
}

fn qp_ev(event_type: EventType, qpn: u32) -> AsyncEvent {
    AsyncEvent {
        event_type,
        element: EventElement::Qp(qpn),
    }
}

/// Every completion event waiting on a channel, as the CQs they name.
fn chan_events(ch: &CompChannel) -> Vec<Arc<CqInner>> {
    let mut v = Vec::new();
    while let Some(w) = ch.get(Some(Duration::ZERO)) {
        v.push(w.upgrade().expect("the CQ is alive"));
    }
    v
}

/// Runs until `cq` holds at least `n` completions (without taking them).
fn run_until_len(net: &mut SimNet, cq: &CqInner, n: usize) {
    assert!(
        net.run_until(SEC, |_| cq.len() >= n),
        "expected {n} completions, have {}",
        cq.len()
    );
}

fn poll_all(cq: &CqInner) -> Vec<Wc> {
    let mut v = Vec::new();
    while let Some(wc) = cq.poll_one() {
        v.push(wc);
    }
    v
}

/// Records (opcode, SE bit, RETH va) of every request packet.
type ReqLog = Arc<Mutex<Vec<(Opcode, bool, Option<u64>)>>>;

fn log_requests(net: &mut SimNet) -> ReqLog {
    let log: ReqLog = Arc::default();
    let l = log.clone();
    net.set_filter(move |w: &Wire<'_>| {
        if w.pkt.info.is_request {
            let h = &w.pkt.headers();
            l.lock()
                .unwrap()
                .push((h.bth.opcode, h.bth.se, h.reth.map(|r| r.va)));
        }
        Verdict::Pass
    });
    log
}

// ---------------------------------------------------------------------
// 1. COMM_EST
// ---------------------------------------------------------------------

#[test]
fn comm_est_once_when_the_first_request_reaches_a_qp_in_rtr() {
    let mut net = SimNet::new(1, Faults::default());
    let a = Dev::new("10.0.0.1");
    let b = Dev::new("10.0.0.2");
    let qa = a.qp(&mut net, 0x11);
    let qb = b.qp(&mut net, 0x22);
    link(&mut net, &qa, b.ip, &qb);
    to_rtr(
        net.qp(qb.id),
        a.ip,
        qa.qpn,
        psn0(qa.qpn),
        &PairParams::default(),
    );
    assert_eq!(net.qp(qb.id).state(), QpState::Rtr);
    assert!(drain(&a.events).is_empty() && drain(&b.events).is_empty());

    // A 3-packet SEND whose later packets are held back: the event comes
    // with the first packet, before the message completes.
    net.set_filter(|w: &Wire<'_>| match w.pkt.bth.opcode {
        Opcode::RC_SEND_MIDDLE | Opcode::RC_SEND_LAST => Verdict::Delay(100_000),
        _ => Verdict::Pass,
    });
    let src = a.mr(8192);
    let dst = b.mr(8192);
    qb.rq.post(recv_wr(1, &[sge(&dst, 0, 4096)])).unwrap();
    qb.rq.post(recv_wr(2, &[sge(&dst, 4096, 4096)])).unwrap();
    qa.sq
        .post(wr(10, WrOpcode::Send, &[sge(&src, 0, 3000)]))
        .unwrap();
    assert!(net.run_until(SEC, |_| !b.events.is_empty()));
    assert!(qb.recv_cq.is_empty(), "the event precedes the completion");
    assert_eq!(drain(&b.events), vec![qp_ev(EventType::CommEst, qb.qpn)]);
    net.clear_filter();

    run_until_len(&mut net, &qb.recv_cq, 1);
    run_until_len(&mut net, &qa.send_cq, 1);
    let r = poll_all(&qb.recv_cq);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].byte_len),
        (1, WcStatus::Success, 3000)
    );
    assert_eq!(poll_all(&qa.send_cq)[0].status, WcStatus::Success);

    // A second message, still in RTR: no second event.
    qa.sq
        .post(wr(11, WrOpcode::Send, &[sge(&src, 0, 100)]))
        .unwrap();
    run_until_len(&mut net, &qb.recv_cq, 1);
    run_until_len(&mut net, &qa.send_cq, 1);
    net.run_until(MS, |_| false);
    assert_eq!(net.qp(qb.id).state(), QpState::Rtr);
    assert!(drain(&b.events).is_empty(), "COMM_EST is reported once");

    // To RTS, and traffic both ways: nothing more on either side (a was
    // in RTS when its first packet came: no COMM_EST for it).
    to_rts(net.qp(qb.id), psn0(qb.qpn), &PairParams::default());
    qa.rq.post(recv_wr(3, &[sge(&src, 4096, 100)])).unwrap();
    qb.sq
        .post(wr(12, WrOpcode::Send, &[sge(&dst, 0, 100)]))
        .unwrap();
    run_until_len(&mut net, &qa.recv_cq, 1);
    run_until_len(&mut net, &qb.send_cq, 1);
    net.run_until(MS, |_| false);
    assert!(drain(&b.events).is_empty());
    assert!(drain(&a.events).is_empty());
}

// ---------------------------------------------------------------------
// 2. Completion channel
// ---------------------------------------------------------------------

#[test]
fn completion_channel_next_and_solicited_arming() {
    let mut net = SimNet::new(2, Faults::default());
    let a = Dev::new("10.0.0.1");
    let b = Dev::new("10.0.0.2");
    let ch = Arc::new(CompChannel::new().unwrap());
    let rcq = CqInner::with_channel(64, Some(ch.clone()), 0xC0FFEE, Some(b.events.clone()));
    assert!(rcq.has_channel());
    let qa = a.qp(&mut net, 0x11);
    let qb = b.qp_with(
        &mut net,
        0x22,
        Arc::new(CqInner::new(64)),
        rcq.clone(),
        Arc::new(RecvQueue::new(64).unwrap()),
    );
    link(&mut net, &qa, b.ip, &qb);
    link(&mut net, &qb, a.ip, &qa);
    let log = log_requests(&mut net);
    let src = a.mr(4096);
    let dst = b.mr(64 * 64);
    let mut next_recv = 0u64;
    let mut post_recv = |n: u64| {
        for _ in 0..n {
            qb.rq
                .post(recv_wr(next_recv, &[sge(&dst, next_recv * 64, 64)]))
                .unwrap();
            next_recv += 1;
        }
    };
    post_recv(16);
    // Posts a SEND (solicited or not, with or without immediate), runs
    // until it is received, returns the receive completion.
    let mut wr_id = 100;
    let mut send = |net: &mut SimNet, op: WrOpcode, solicited: bool| -> Wc {
        let mut w = wr(wr_id, op, &[sge(&src, 0, 32)]);
        wr_id += 1;
        if solicited {
            w.flags |= SendFlags::SOLICITED;
        }
        if op == WrOpcode::RdmaWriteWithImm {
            w.remote_addr = dst.iova() + 2048;
            w.rkey = dst.rkey();
            w.imm_data = 0xabcd;
        }
        qa.sq.post(w).unwrap();
        run_until_len(net, &rcq, 1);
        run_until_len(net, &qa.send_cq, 1);
        assert_eq!(poll_all(&qa.send_cq)[0].status, WcStatus::Success);
        let r = poll_all(&rcq);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].status, WcStatus::Success);
        r[0]
    };
    let mut delivered = 0;

    // Not armed: a completion queues no event.
    send(&mut net, WrOpcode::Send, false);
    assert!(ch.is_empty());

    // Armed for the next completion: exactly one event, naming the CQ.
    assert!(rcq.req_notify(false));
    send(&mut net, WrOpcode::Send, false);
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1);
    assert!(Arc::ptr_eq(&evs[0], &rcq));
    assert_eq!(evs[0].context(), 0xC0FFEE);
    evs[0].note_event_delivered();
    delivered += 1;
    assert_eq!(rcq.unacked_events(), 1);
    rcq.ack_events(1);
    assert_eq!(rcq.unacked_events(), 0);
    // One-shot: the next completion queues nothing.
    send(&mut net, WrOpcode::Send, false);
    assert!(ch.is_empty());

    // Solicited only: an unsolicited SEND queues nothing, a solicited one
    // does.
    rcq.req_notify(true);
    send(&mut net, WrOpcode::Send, false);
    assert!(ch.is_empty(), "unsolicited SEND while armed solicited-only");
    let r = send(&mut net, WrOpcode::Send, true);
    assert_eq!(r.opcode, WcOpcode::Recv);
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1);
    assert!(Arc::ptr_eq(&evs[0], &rcq));
    evs[0].note_event_delivered();
    delivered += 1;

    // The same for WRITE with immediate.
    rcq.req_notify(true);
    let r = send(&mut net, WrOpcode::RdmaWriteWithImm, false);
    assert_eq!((r.opcode, r.imm_data), (WcOpcode::RecvRdmaWithImm, 0xabcd));
    assert!(ch.is_empty(), "unsolicited WRITE_WITH_IMM");
    send(&mut net, WrOpcode::RdmaWriteWithImm, true);
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1);
    evs[0].note_event_delivered();
    delivered += 1;

    // Arming for "next" while armed solicited-only widens the arming.
    rcq.req_notify(true);
    rcq.req_notify(false);
    send(&mut net, WrOpcode::Send, false);
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1, "next arming overrides solicited-only");
    evs[0].note_event_delivered();
    delivered += 1;
    // ... and not the other way round.
    rcq.req_notify(false);
    rcq.req_notify(true);
    send(&mut net, WrOpcode::Send, false);
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1, "solicited-only arming does not narrow next");
    evs[0].note_event_delivered();
    delivered += 1;

    // The SE bit on the wire: set only on the WRs posted SOLICITED.
    let se: Vec<(Opcode, bool)> = log
        .lock()
        .unwrap()
        .iter()
        .map(|(o, se, _)| (*o, *se))
        .collect();
    use Opcode as O;
    assert_eq!(
        se,
        vec![
            (O::RC_SEND_ONLY, false),
            (O::RC_SEND_ONLY, false),
            (O::RC_SEND_ONLY, false),
            (O::RC_SEND_ONLY, false),
            (O::RC_SEND_ONLY, true),
            (O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, false),
            (O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, true),
            (O::RC_SEND_ONLY, false),
            (O::RC_SEND_ONLY, false),
        ]
    );

    // Solicited only: an error completion (the flush of the receive WRs
    // when the QP goes to ERR) queues an event too, once.
    rcq.req_notify(true);
    let waiting = qb.rq.len();
    assert!(waiting > 0);
    modify_state(net.qp(qb.id), QpState::Err);
    net.run_until(MS, |_| false);
    let r = poll_all(&rcq);
    assert_eq!(r.len(), waiting);
    assert!(r.iter().all(|w| w.status == WcStatus::WrFlushErr));
    let evs = chan_events(&ch);
    assert_eq!(evs.len(), 1, "one event for the flush");
    assert!(Arc::ptr_eq(&evs[0], &rcq));
    evs[0].note_event_delivered();
    delivered += 1;

    assert_eq!(rcq.unacked_events(), delivered - 1);
    rcq.ack_events(delivered - 1);
    assert_eq!(rcq.unacked_events(), 0);
    // The CQ never overflowed: no asynchronous events on b.
    assert!(drain(&b.events).is_empty());
}

// ---------------------------------------------------------------------
// 3. Responder errors
// ---------------------------------------------------------------------

/// Runs a pair until a's failed WR completes; returns (a's completion,
/// b's events, a's events).
fn run_error(p: &mut RcPair) -> (Wc, Vec<AsyncEvent>, Vec<AsyncEvent>) {
    let s = p.wait(true, true, 1, SEC);
    assert_eq!(s.len(), 1);
    p.settle(SEC);
    (s[0], drain(&p.b.events), drain(&p.a.events))
}

#[test]
fn bad_rkey_raises_qp_access_err_on_the_responder() {
    for op in [WrOpcode::RdmaWrite, WrOpcode::RdmaRead] {
        let mut p = RcPair::new(3, Faults::default(), PairParams::default());
        let src = p.mr(true, 64, ALL);
        let dst = p.mr(false, 64, ALL);
        let mut w = wr(1, op, &[sge(&src, 0, 8)]);
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey() ^ 0x5a5a_0000;
        p.post_send(true, w);
        let (s, bev, aev) = run_error(&mut p);
        assert_eq!((s.wr_id, s.status), (1, WcStatus::RemAccessErr), "{op:?}");
        assert_eq!(bev, vec![qp_ev(EventType::QpAccessErr, p.b.qpn)], "{op:?}");
        assert!(aev.is_empty(), "the requester learns by its completion");
        assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);
        assert_eq!(p.net.qp(p.a.id).state(), QpState::Err);
    }
}

#[test]
fn invalid_requests_raise_qp_req_err_on_the_responder() {
    // A WRITE to a QP without REMOTE_WRITE access (the MR allows it).
    let mut p = RcPair::new(4, Faults::default(), PairParams::default());
    let acc = QpAttr {
        qp_state: QpState::Rts,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..QpAttr::default()
    };
    p.net
        .qp(p.b.id)
        .modify(&acc, AttrMask::ACCESS_FLAGS)
        .unwrap();
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    src.write(0, b"forbidden").unwrap();
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 9)]);
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    p.post_send(true, w);
    let (s, bev, aev) = run_error(&mut p);
    assert_eq!(s.status, WcStatus::RemInvReqErr);
    assert_eq!(bev, vec![qp_ev(EventType::QpReqErr, p.b.qpn)]);
    assert!(aev.is_empty());
    let mut got = [0u8; 9];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, [0u8; 9], "nothing written");
    assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);

    // A SEND longer than the receive buffer: LOC_LEN_ERR on the receive
    // WR, QP_REQ_ERR, invalid request for the requester.
    let mut p = RcPair::new(5, Faults::default(), PairParams::default());
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    p.post_recv(false, 7, &[sge(&dst, 0, 10)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 40)]));
    let (s, bev, aev) = run_error(&mut p);
    assert_eq!(s.status, WcStatus::RemInvReqErr);
    assert_eq!(bev, vec![qp_ev(EventType::QpReqErr, p.b.qpn)]);
    assert!(aev.is_empty());
    let r = poll_all(&p.b.recv_cq);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wr_id, r[0].status), (7, WcStatus::LocLenErr));
}

// ---------------------------------------------------------------------
// 4. CQ overflow
// ---------------------------------------------------------------------

#[test]
fn recv_cq_overflow_raises_cq_err_and_qp_fatal() {
    recv_cq_overflow(0);
}

/// The same with a third receive WR, flushed (into the overflowed CQ)
/// when the QP goes to ERR: QP_FATAL must still be reported once.
#[test]
fn recv_cq_overflow_then_flush_reports_qp_fatal_once() {
    recv_cq_overflow(1);
}

/// Two SENDs into a receive CQ of depth 1, not polled, with `extra`
/// receive WRs more than the SENDs take.
fn recv_cq_overflow(extra: u64) {
    let mut net = SimNet::new(6, Faults::default());
    let a = Dev::new("10.0.0.1");
    let b = Dev::new("10.0.0.2");
    let rcq = CqInner::with_channel(1, None, 0, Some(b.events.clone()));
    let qa = a.qp(&mut net, 0x11);
    let qb = b.qp_with(
        &mut net,
        0x22,
        Arc::new(CqInner::new(64)),
        rcq.clone(),
        Arc::new(RecvQueue::new(64).unwrap()),
    );
    link(&mut net, &qa, b.ip, &qb);
    link(&mut net, &qb, a.ip, &qa);
    let src = a.mr(64);
    let dst = b.mr(64);
    qb.rq.post(recv_wr(1, &[sge(&dst, 0, 32)])).unwrap();
    qb.rq.post(recv_wr(2, &[sge(&dst, 32, 32)])).unwrap();
    for i in 0..extra {
        qb.rq.post(recv_wr(3 + i, &[sge(&dst, 0, 32)])).unwrap();
    }
    qa.sq
        .post(wr(10, WrOpcode::Send, &[sge(&src, 0, 8)]))
        .unwrap();
    qa.sq
        .post(wr(11, WrOpcode::Send, &[sge(&src, 0, 8)]))
        .unwrap();
    net.run_until(SEC, |_| qa.send_cq.len() >= 2 || !a.events.is_empty());
    net.run_until(10 * MS, |_| false);
    assert_eq!(
        drain(&b.events),
        vec![
            AsyncEvent {
                event_type: EventType::CqErr,
                element: EventElement::Cq(rcq.handle()),
            },
            qp_ev(EventType::QpFatal, qb.qpn),
        ]
    );
    assert_eq!(net.qp(qb.id).state(), QpState::Err);
    assert!(rcq.overflowed());
    assert_eq!(b.counters.snapshot().cq_overflows, 1 + extra);
    let r = poll_all(&rcq);
    assert_eq!(r.len(), 1, "the second completion was lost");
    assert_eq!((r[0].wr_id, r[0].status), (1, WcStatus::Success));
    let s = poll_all(&qa.send_cq);
    assert_eq!((s[0].wr_id, s[0].status), (10, WcStatus::Success));
    assert!(drain(&a.events).is_empty());
}

#[test]
fn send_cq_overflow_raises_cq_err_and_qp_fatal() {
    send_cq_overflow(2);
}

/// The same with a third WR, flushed (into the overflowed CQ) when the QP
/// goes to ERR: QP_FATAL must still be reported once.
#[test]
fn send_cq_overflow_then_flush_reports_qp_fatal_once() {
    send_cq_overflow(3);
}

/// `n` signaled WRITEs into a send CQ of depth 1, not polled.
fn send_cq_overflow(n: u64) {
    let mut net = SimNet::new(7, Faults::default());
    let a = Dev::new("10.0.0.1");
    let b = Dev::new("10.0.0.2");
    let scq = CqInner::with_channel(1, None, 0, Some(a.events.clone()));
    let qa = a.qp_with(
        &mut net,
        0x11,
        scq.clone(),
        Arc::new(CqInner::new(64)),
        Arc::new(RecvQueue::new(64).unwrap()),
    );
    let qb = b.qp(&mut net, 0x22);
    link(&mut net, &qa, b.ip, &qb);
    link(&mut net, &qb, a.ip, &qa);
    let src = a.mr(64);
    let dst = b.mr(64);
    for i in 0..n {
        let mut w = wr(10 + i, WrOpcode::RdmaWrite, &[sge(&src, 0, 8)]);
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey();
        qa.sq.post(w).unwrap();
    }
    net.run_until(SEC, |_| a.events.len() >= 2);
    net.run_until(10 * MS, |_| false);
    assert_eq!(
        drain(&a.events),
        vec![
            AsyncEvent {
                event_type: EventType::CqErr,
                element: EventElement::Cq(scq.handle()),
            },
            qp_ev(EventType::QpFatal, qa.qpn),
        ]
    );
    assert_eq!(net.qp(qa.id).state(), QpState::Err);
    // Every completion lost counts (the flushed ones too).
    assert_eq!(a.counters.snapshot().cq_overflows, n - 1);
    let s = poll_all(&scq);
    assert_eq!(
        (s.len(), s[0].wr_id, s[0].status),
        (1, 10, WcStatus::Success)
    );
    assert!(drain(&b.events).is_empty());
}

// ---------------------------------------------------------------------
// 5. Shared receive queue
// ---------------------------------------------------------------------

#[test]
fn srq_shared_by_two_qps() {
    let mut net = SimNet::new(8, Faults::default());
    let x = Dev::new("10.0.0.1");
    let p1 = Dev::new("10.0.0.2");
    let p2 = Dev::new("10.0.0.3");
    const SRQ: u32 = 0x5151;
    let srq = Arc::new(RecvQueue::new_srq(16, SRQ, x.events.clone()).unwrap());
    assert!(srq.is_srq());
    assert_eq!(srq.srq_handle(), SRQ);
    let rcq = Arc::new(CqInner::new(64));
    let scq = Arc::new(CqInner::new(64));
    let q1 = x.qp_with(&mut net, 0x31, scq.clone(), rcq.clone(), srq.clone());
    let q2 = x.qp_with(&mut net, 0x32, scq.clone(), rcq.clone(), srq.clone());
    let r1 = p1.qp(&mut net, 0x41);
    let r2 = p2.qp(&mut net, 0x42);
    link(&mut net, &q1, p1.ip, &r1);
    link(&mut net, &r1, x.ip, &q1);
    link(&mut net, &q2, p2.ip, &r2);
    link(&mut net, &r2, x.ip, &q2);

    let buf = x.mr(16 * 64);
    let post = |id: u64| {
        srq.post(recv_wr(id, &[sge(&buf, (id - 100) * 64, 64)]))
            .unwrap()
    };
    let read = |id: u64, len: usize| {
        let mut v = vec![0u8; len];
        buf.read(((id - 100) * 64) as usize, &mut v).unwrap();
        v
    };
    let s1 = p1.mr(64);
    let s2 = p2.mr(64);
    s1.write(0, b"from-p1!").unwrap();
    s2.write(0, b"from-p2!").unwrap();
    let send = |ep: &Ep, src: &MrInner, id: u64| {
        ep.sq
            .post(wr(id, WrOpcode::Send, &[sge(src, 0, 8)]))
            .unwrap();
    };
    for id in 100..104 {
        post(id);
    }
    assert!(srq.arm_limit(2));
    assert_eq!(srq.limit(), 2);

    // p2 posts first but its packet is held back: p1's SEND arrives
    // first and takes the first WR. Arrival order, not posting order.
    net.set_filter(|w: &Wire<'_>| {
        if w.pkt.info.is_request && w.pkt.bth.dest_qp == 0x32 {
            Verdict::Delay(50_000)
        } else {
            Verdict::Pass
        }
    });
    send(&r2, &s2, 1);
    send(&r1, &s1, 1);
    run_until_len(&mut net, &rcq, 1);
    let c = poll_all(&rcq);
    assert_eq!(c.len(), 1, "p2's SEND is still held back");
    assert_eq!((c[0].wr_id, c[0].qp_num, c[0].src_qp), (100, 0x31, 0x41));
    assert!(x.events.is_empty(), "3 WRs left, limit 2: no event");
    run_until_len(&mut net, &rcq, 1);
    let c = poll_all(&rcq);
    assert_eq!((c[0].wr_id, c[0].qp_num, c[0].src_qp), (101, 0x32, 0x42));
    assert_eq!(c[0].status, WcStatus::Success);
    assert_eq!(read(100, 8), b"from-p1!");
    assert_eq!(read(101, 8), b"from-p2!");
    assert!(x.events.is_empty(), "2 WRs left, limit 2: not below it");
    assert_eq!(srq.limit(), 2);
    net.clear_filter();

    // The next WR taken leaves 1 < 2: one SRQ_LIMIT_REACHED, disarmed.
    send(&r1, &s1, 2);
    run_until_len(&mut net, &rcq, 1);
    let c = poll_all(&rcq);
    assert_eq!((c[0].wr_id, c[0].qp_num), (102, 0x31));
    assert_eq!(
        drain(&x.events),
        vec![AsyncEvent {
            event_type: EventType::SrqLimitReached,
            element: EventElement::Srq(SRQ),
        }]
    );
    assert_eq!(srq.limit(), 0);
    send(&r2, &s2, 2);
    run_until_len(&mut net, &rcq, 1);
    let c = poll_all(&rcq);
    assert_eq!((c[0].wr_id, c[0].qp_num), (103, 0x32));
    assert!(drain(&x.events).is_empty(), "the limit fires once");
    assert!(srq.is_empty());
    run_until_len(&mut net, &r1.send_cq, 2);
    run_until_len(&mut net, &r2.send_cq, 2);
    assert!(poll_all(&r1.send_cq)
        .iter()
        .chain(poll_all(&r2.send_cq).iter())
        .all(|w| w.status == WcStatus::Success));

    // An empty SRQ: RNR NAKs until a WR is posted (rnr_retry 7: forever).
    send(&r1, &s1, 3);
    net.run_until(5 * MS, |_| false);
    assert!(rcq.is_empty() && r1.send_cq.is_empty());
    let rnr = x.counters.snapshot().rnr_naks_sent;
    assert!(rnr >= 2, "RNR NAKs sent: {rnr}");
    assert_eq!(p1.counters.snapshot().rnr_naks_rcvd, rnr);
    post(104);
    run_until_len(&mut net, &rcq, 1);
    run_until_len(&mut net, &r1.send_cq, 1);
    let c = poll_all(&rcq);
    assert_eq!(
        (c[0].wr_id, c[0].qp_num, c[0].status),
        (104, 0x31, WcStatus::Success)
    );
    assert_eq!(poll_all(&r1.send_cq)[0].status, WcStatus::Success);
    assert_eq!(read(104, 8), b"from-p1!");

    // q1 to ERR: LAST_WQE_REACHED for q1 only, and the SRQ's WRs stay.
    post(105);
    post(106);
    modify_state(net.qp(q1.id), QpState::Err);
    net.run_until(MS, |_| false);
    assert_eq!(
        drain(&x.events),
        vec![qp_ev(EventType::QpLastWqeReached, 0x31)]
    );
    assert!(rcq.is_empty(), "no flush of the SRQ's WRs");
    assert_eq!(srq.len(), 2);
    // The other QP still receives from them.
    send(&r2, &s2, 3);
    run_until_len(&mut net, &rcq, 1);
    let c = poll_all(&rcq);
    assert_eq!(
        (c[0].wr_id, c[0].qp_num, c[0].status),
        (105, 0x32, WcStatus::Success)
    );
    assert_eq!(read(105, 8), b"from-p2!");
    assert_eq!(srq.len(), 1);
    assert!(drain(&x.events).is_empty());
}

#[test]
fn srq_qp_error_raises_its_error_then_last_wqe_reached() {
    let mut net = SimNet::new(9, Faults::default());
    let x = Dev::new("10.0.0.1");
    let p1 = Dev::new("10.0.0.2");
    let srq = Arc::new(RecvQueue::new_srq(16, 9, x.events.clone()).unwrap());
    let q1 = x.qp_with(
        &mut net,
        0x31,
        Arc::new(CqInner::new(64)),
        Arc::new(CqInner::new(64)),
        srq.clone(),
    );
    let r1 = p1.qp(&mut net, 0x41);
    link(&mut net, &q1, p1.ip, &r1);
    link(&mut net, &r1, x.ip, &q1);
    let buf = x.mr(64);
    srq.post(recv_wr(1, &[sge(&buf, 0, 64)])).unwrap();
    let src = p1.mr(64);
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 8)]);
    w.remote_addr = buf.iova();
    w.rkey = 0xdead_0000;
    r1.sq.post(w).unwrap();
    run_until_len(&mut net, &r1.send_cq, 1);
    net.run_until(MS, |_| false);
    assert_eq!(poll_all(&r1.send_cq)[0].status, WcStatus::RemAccessErr);
    assert_eq!(
        drain(&x.events),
        vec![
            qp_ev(EventType::QpAccessErr, 0x31),
            qp_ev(EventType::QpLastWqeReached, 0x31)
        ]
    );
    assert_eq!(srq.len(), 1, "the SRQ keeps its WR");
    assert!(q1.recv_cq.is_empty());
}

// ---------------------------------------------------------------------
// 6. SQD
// ---------------------------------------------------------------------

/// Half a full window: two WRs fill it.
const WR_LEN: u32 = MAX_INFLIGHT_BYTES / 2;
/// The pair's path MTU.
const MTU: u32 = 1024;
/// Packets per WR.
const WR_PKTS: usize = (WR_LEN / MTU) as usize;

/// A pair with 5 WRITEs of half a window each: 4 posted and a window of
/// PSNs (WRs 0 and 1) in flight, then RTS -> SQD, then the 5th posted.
/// Returns the pair, the request log and the remote region.
fn sqd_setup(seed: u64, notify: bool) -> (RcPair, ReqLog, Arc<MrInner>) {
    let mut p = RcPair::new(seed, Faults::default(), PairParams::default());
    let src = p.mr(true, WR_LEN as usize, ALL);
    src.write(0, &vec![0x77; WR_LEN as usize]).unwrap();
    let dst = p.mr(false, 5 * WR_LEN as usize, ALL);
    let log = log_requests(&mut p.net);
    let post = |p: &RcPair, i: u64| {
        let mut w = wr(i, WrOpcode::RdmaWrite, &[sge(&src, 0, WR_LEN)]);
        w.remote_addr = dst.iova() + i * WR_LEN as u64;
        w.rkey = dst.rkey();
        p.post_send(true, w);
    };
    for i in 0..4 {
        post(&p, i);
    }
    assert!(p.net.step());
    assert_eq!(max_inflight_psns(MTU) as usize, 2 * WR_PKTS);
    assert_eq!(log.lock().unwrap().len(), 2 * WR_PKTS, "a window in flight");
    to_sqd(p.net.qp(p.a.id), notify);
    let at = p.net.qp(p.a.id).attr();
    assert_eq!(at.qp_state, QpState::Sqd);
    assert!(at.sq_draining, "WRs in flight: draining");
    post(&p, 4);
    (p, log, dst)
}

/// The WRs (by remote offset) whose first packet went out.
fn started(log: &ReqLog, dst: &MrInner) -> Vec<u64> {
    log.lock()
        .unwrap()
        .iter()
        .filter_map(|(_, _, va)| va.map(|v| (v - dst.iova()) / WR_LEN as u64))
        .collect()
}

#[test]
fn sqd_drains_in_flight_wrs_starts_none_and_reports_sq_drained_once() {
    let (mut p, log, dst) = sqd_setup(10, true);
    assert!(p.net.run_until(SEC, |_| !p.a.events.is_empty()));
    assert_eq!(
        p.a.send_cq.len(),
        2,
        "SQ_DRAINED once the started WRs have completed"
    );
    assert_eq!(
        drain(&p.a.events),
        vec![qp_ev(EventType::SqDrained, p.a.qpn)]
    );
    assert!(!p.net.qp(p.a.id).attr().sq_draining);
    p.settle(SEC);
    let s = poll_all(&p.a.send_cq);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    assert_eq!(started(&log, &dst), vec![0, 1], "no WR started in SQD");
    assert_eq!(log.lock().unwrap().len(), 2 * WR_PKTS);
    assert_eq!(p.a.sq.outstanding(), 3);
    assert!(drain(&p.a.events).is_empty(), "reported once");
    assert!(drain(&p.b.events).is_empty());

    // SQD -> SQD changes nothing and reports nothing.
    let a = QpAttr {
        qp_state: QpState::Sqd,
        timeout: 15,
        ..QpAttr::default()
    };
    p.net
        .qp(p.a.id)
        .modify(&a, AttrMask::STATE | AttrMask::TIMEOUT)
        .unwrap();
    p.settle(SEC);
    assert!(drain(&p.a.events).is_empty());
    assert_eq!(log.lock().unwrap().len(), 2 * WR_PKTS);

    // SQD -> RTS: the rest go, in order.
    modify_state(p.net.qp(p.a.id), QpState::Rts);
    assert!(!p.net.qp(p.a.id).attr().sq_draining);
    let s = p.wait(true, true, 3, SEC);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    assert_eq!(started(&log, &dst), vec![0, 1, 2, 3, 4]);
    assert_eq!(log.lock().unwrap().len(), 5 * WR_PKTS);
    let mut got = vec![0u8; 5 * WR_LEN as usize];
    dst.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0x77));
    p.settle(SEC);
    assert!(drain(&p.a.events).is_empty());
    assert!(drain(&p.b.events).is_empty());
}

#[test]
fn sqd_without_notify_drains_silently() {
    let (mut p, log, dst) = sqd_setup(11, false);
    p.settle(SEC);
    assert!(drain(&p.a.events).is_empty());
    let at = p.net.qp(p.a.id).attr();
    assert_eq!(at.qp_state, QpState::Sqd);
    assert!(!at.sq_draining, "drained");
    assert_eq!(poll_all(&p.a.send_cq).len(), 2);
    assert_eq!(started(&log, &dst), vec![0, 1]);
    modify_state(p.net.qp(p.a.id), QpState::Rts);
    assert_eq!(p.wait(true, true, 3, SEC).len(), 3);
    assert!(drain(&p.a.events).is_empty());
}

#[test]
fn sqd_with_nothing_in_flight_is_drained_at_once() {
    let mut p = RcPair::new(12, Faults::default(), PairParams::default());
    to_sqd(p.net.qp(p.a.id), true);
    assert!(!p.net.qp(p.a.id).attr().sq_draining);
    assert_eq!(
        drain(&p.a.events),
        vec![qp_ev(EventType::SqDrained, p.a.qpn)]
    );
    // A WR posted in SQD waits for RTS.
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    p.post_recv(false, 1, &[sge(&dst, 0, 64)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.settle(SEC);
    assert_eq!(p.net.packets_sent(), 0);
    assert!(p.a.send_cq.is_empty());
    modify_state(p.net.qp(p.a.id), QpState::Rts);
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    assert!(drain(&p.a.events).is_empty());
}

/// Draining a WR that needs several round trips (more PSNs than may be in
/// flight) must keep the retransmission timer and retry budget fresh as
/// ACKs arrive, as in RTS: a healthy path must not fail with
/// RETRY_EXC_ERR while the queue drains.
#[test]
fn sqd_drain_of_a_long_write_keeps_the_retry_timer_fresh() {
    let params = PairParams {
        mtu: Mtu::Mtu256,
        timeout: 4, // 65.5 µs, raised to the 4 ms floor
        retry_cnt: 1,
        ..Default::default()
    };
    let faults = Faults {
        delay_ns: 1_500_000, // RTT 3 ms: 7 windows take 21 ms
        ..Faults::default()
    };
    const LEN: u32 = 400 * 256; // 400 packets: 7 windows of 64
    for sqd in [false, true] {
        let mut p = RcPair::new(13, faults, params);
        let src = p.mr(true, LEN as usize, ALL);
        let dst = p.mr(false, LEN as usize, ALL);
        let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, LEN)]);
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey();
        p.post_send(true, w);
        assert!(p.net.step());
        if sqd {
            to_sqd(p.net.qp(p.a.id), true);
        }
        let s = p.wait(true, true, 1, SEC);
        assert_eq!(
            (s.len(), s[0].status),
            (1, WcStatus::Success),
            "sqd {sqd}: retry timeouts {}",
            p.a.counters.snapshot().retry_timeouts
        );
        assert_eq!(p.a.counters.snapshot().retry_timeouts, 0, "sqd {sqd}");
        if sqd {
            assert_eq!(
                drain(&p.a.events),
                vec![qp_ev(EventType::SqDrained, p.a.qpn)]
            );
        }
    }
}

/// A tiny ACK timeout (`timeout` 4, 65.5 µs: the `ibverbs` crate's
/// default) waits at least a jiffy, as on rxe: a peer that answers 2 ms
/// later (a descheduled process) is not retried into `RETRY_EXC_ERR`.
#[test]
fn a_tiny_ack_timeout_waits_a_jiffy() {
    let params = PairParams {
        timeout: 4,
        retry_cnt: 0,
        ..Default::default()
    };
    let faults = Faults {
        delay_ns: 1_000_000, // RTT 2 ms
        ..Faults::default()
    };
    let mut p = RcPair::new(14, faults, params);
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    for i in 0..3 {
        let mut w = wr(i, WrOpcode::RdmaWrite, &[sge(&src, 0, 64)]);
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey();
        p.post_send(true, w);
        let s = p.wait(true, true, 1, SEC);
        assert_eq!((s.len(), s[0].status), (1, WcStatus::Success), "write {i}");
    }
    assert_eq!(p.a.counters.snapshot().retry_timeouts, 0);
}
