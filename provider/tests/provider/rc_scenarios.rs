//! Scripted loss scenarios on the simulated network (IBA 9.7 reliability
//! rules), each read as a script: what is dropped, what must happen.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::{Faults, Verdict, Wire};
use uroce_provider::testing::{sge, signaled_wr as wr, PairParams, RcPair};
use uroce_provider::types::*;
use uroce_wire::{Opcode, Operation};

const SEC: u64 = 1_000_000_000;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn pair() -> RcPair {
    RcPair::new(
        1,
        Faults::default(),
        PairParams {
            timeout: 10,
            ..Default::default()
        },
    )
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 13 + 1) as u8).collect()
}

/// Drops the `nth` (0-based) packet with opcode `op`, once; records every
/// packet's opcode.
fn drop_nth(p: &mut RcPair, op: Opcode, nth: usize) -> Arc<Mutex<Vec<Opcode>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let mut count = 0;
    p.net.set_filter(move |w: &Wire<'_>| {
        let o = w.pkt.bth.opcode;
        s.lock().unwrap().push(o);
        if o == op {
            count += 1;
            if count == nth + 1 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    seen
}

fn send_5_packets(p: &mut RcPair) -> (Arc<MrInner>, Vec<u8>) {
    let src = p.mr(true, 5000, ALL);
    let dst = p.mr(false, 5000, ALL);
    let d = data(5000);
    src.write(0, &d).unwrap();
    p.post_recv(false, 9, &[sge(&dst, 0, 5000)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 5000)]));
    (dst, d)
}

fn assert_one_success(p: &mut RcPair) {
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::Success);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!(r.len(), 1, "exactly one receive completion");
    assert_eq!(r[0].status, WcStatus::Success);
    p.settle(SEC);
    assert!(
        p.a.send_cq.is_empty() && p.b.recv_cq.is_empty(),
        "nothing completes twice"
    );
}

#[test]
fn lost_first_middle_last_packet() {
    for (op, nth) in [
        (Opcode::RC_SEND_FIRST, 0),
        (Opcode::RC_SEND_MIDDLE, 1),
        (Opcode::RC_SEND_LAST, 0),
    ] {
        let mut p = pair();
        drop_nth(&mut p, op, nth);
        let (dst, d) = send_5_packets(&mut p);
        assert_one_success(&mut p);
        let mut got = vec![0u8; 5000];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, d, "{op}");
        let b = p.b.counters.snapshot();
        if op != Opcode::RC_SEND_LAST {
            // The packet after the gap is out of sequence: exactly one NAK.
            assert_eq!(b.seq_naks_sent, 1, "{op}: one NAK per gap");
            assert_eq!(p.a.counters.snapshot().seq_naks_rcvd, 1);
        } else {
            // Nothing follows a lost LAST: the requester times out.
            assert_eq!(p.a.counters.snapshot().retry_timeouts, 1);
        }
    }
}

#[test]
fn lost_ack_resend_is_acked_without_executing_again() {
    let mut p = pair();
    drop_nth(&mut p, Opcode::RC_ACKNOWLEDGE, 0);
    let (_dst, _) = send_5_packets(&mut p);
    assert_one_success(&mut p);
    assert!(p.b.counters.snapshot().duplicate_requests >= 1);
    assert_eq!(p.a.counters.snapshot().retry_timeouts, 1);
}

#[test]
fn retransmissions_are_byte_identical() {
    let mut p = pair();
    type Sent = Arc<Mutex<Vec<(u32, Vec<u8>)>>>;
    let sent: Sent = Arc::default();
    let s = sent.clone();
    let mut dropped = false;
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.pkt.info.is_request {
            s.lock()
                .unwrap()
                .push((w.pkt.bth.psn.value(), w.pkt.bytes.to_vec()));
        }
        if w.pkt.bth.opcode == Opcode::RC_ACKNOWLEDGE && !dropped {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Pass
    });
    send_5_packets(&mut p);
    assert_one_success(&mut p);
    let sent = sent.lock().unwrap();
    assert!(sent.len() > 5, "something was resent");
    for (psn, bytes) in sent.iter() {
        let first = sent.iter().find(|(q, _)| q == psn).unwrap();
        assert_eq!(&first.1, bytes, "resend of PSN {psn:#x} differs");
    }
}

#[test]
fn lost_read_response_is_rerequested_for_the_rest() {
    let mut p = pair();
    let remote = p.mr(false, 5000, ALL);
    let local = p.mr(true, 5000, ALL);
    let d = data(5000);
    remote.write(0, &d).unwrap();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let r2 = reads.clone();
    let mut n = 0;
    p.net.set_filter(move |w: &Wire<'_>| {
        let h = &w.pkt.headers();
        if h.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
            r2.lock()
                .unwrap()
                .push((h.bth.psn.value(), h.reth.unwrap().dma_len));
        }
        if w.pkt.info.operation == Operation::RdmaReadResponse {
            n += 1;
            if n == 3 {
                return Verdict::Drop;
            }
        }
        Verdict::Pass
    });
    let mut w = wr(1, WrOpcode::RdmaRead, &[sge(&local, 0, 5000)]);
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    p.post_send(true, w);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s[0].status, WcStatus::Success);
    let mut got = vec![0u8; 5000];
    local.read(0, &mut got).unwrap();
    assert_eq!(got, d);
    let reads = reads.lock().unwrap();
    assert_eq!(reads.len(), 2, "{reads:?}");
    // The second request asks for what is missing: from the 3rd response on.
    assert_eq!(reads[1].0, (reads[0].0 + 2) & 0xff_ffff);
    assert_eq!(reads[1].1, 5000 - 2 * 1024);
}

/// Regression (interop with kernel rxe under loss, tests/interop): every
/// READ response that arrived after a hole re-requested the READ again —
/// the implied acknowledgement of the response went back to the hole once
/// per packet — so one lost response of a 1 MiB READ drew hundreds of
/// identical re-requests, and rxe replayed the rest of the READ for each.
#[test]
fn responses_after_a_hole_rerequest_once() {
    let mut p = pair();
    // The 3rd of 20 responses is lost; the rest are spread out so that
    // the requester runs between them.
    let reads = read_with(&mut p, 20, |n| {
        if n == 3 {
            Verdict::Drop
        } else {
            Verdict::Delay(n * 20_000)
        }
    });
    assert_eq!(reads.len(), 2, "one re-request for one hole: {reads:?}");
    assert_eq!(reads[1], (reads[0] + 2) & 0xff_ffff);
}

/// A READ of `npkts` 1 KiB responses, the `n`th (1-based) response
/// delivered after `verdict(n)`; returns the PSNs of the READ requests sent.
fn read_with(
    p: &mut RcPair,
    npkts: usize,
    mut verdict: impl FnMut(u64) -> Verdict + Send + 'static,
) -> Vec<u32> {
    let len = npkts * 1024;
    let remote = p.mr(false, len, ALL);
    let local = p.mr(true, len, ALL);
    let d = data(len);
    remote.write(0, &d).unwrap();
    let reads = Arc::new(Mutex::new(Vec::new()));
    let r2 = reads.clone();
    let mut n = 0u64;
    p.net.set_filter(move |w: &Wire<'_>| {
        let h = &w.pkt.headers();
        if h.bth.opcode == Opcode::RC_RDMA_READ_REQUEST {
            r2.lock().unwrap().push(h.bth.psn.value());
        }
        if w.pkt.info.operation == Operation::RdmaReadResponse {
            n += 1;
            return verdict(n);
        }
        Verdict::Pass
    });
    let mut w = wr(1, WrOpcode::RdmaRead, &[sge(&local, 0, len as u32)]);
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    p.post_send(true, w);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s[0].status, WcStatus::Success);
    let mut got = vec![0u8; len];
    local.read(0, &mut got).unwrap();
    assert!(got == d, "READ data differs");
    let r = reads.lock().unwrap().clone();
    r
}

#[test]
fn reordered_read_responses_are_placed_without_a_rerequest() {
    let mut p = pair();
    // Responses 10 us apart; every 8th held back 25 us, so that the next
    // two overtake it.
    let reads = read_with(&mut p, 100, |n| {
        Verdict::Delay(n * 10_000 + if n % 8 == 0 { 25_000 } else { 0 })
    });
    assert_eq!(
        reads.len(),
        1,
        "reordering alone asks for nothing again: {reads:?}"
    );
    assert_eq!(p.a.counters.snapshot().retry_timeouts, 0);
}

#[test]
fn a_lost_read_response_is_rerequested_once_when_later_ones_pass_it() {
    let mut p = pair();
    // The 5th of 200 responses is lost; the rest, 10 us apart, pass it:
    // one re-request from its PSN (not one per later response, and
    // without waiting for the ACK timer), and the packets placed after
    // the hole are not asked for by a second one.
    let reads = read_with(&mut p, 200, |n| {
        if n == 5 {
            Verdict::Drop
        } else {
            Verdict::Delay(n * 10_000)
        }
    });
    assert_eq!(reads.len(), 2, "one re-request for one hole: {reads:?}");
    assert_eq!(reads[1], (reads[0] + 4) & 0xff_ffff);
    assert_eq!(p.a.counters.snapshot().retry_timeouts, 0);
}

#[test]
fn duplicate_atomic_is_answered_from_the_replay_cache() {
    let mut p = pair();
    let word = p.mr(false, 8, ALL);
    let res = p.mr(true, 8, ALL);
    word.with_atomic_u64(0, |w| w.store(10, Ordering::SeqCst))
        .unwrap();
    // Lose the first atomic ACK: the requester resends the request, the
    // responder must answer from its cache and not add again.
    drop_nth(&mut p, Opcode::RC_ATOMIC_ACKNOWLEDGE, 0);
    let mut w = wr(1, WrOpcode::AtomicFetchAndAdd, &[sge(&res, 0, 8)]);
    w.remote_addr = word.iova();
    w.rkey = word.rkey();
    w.compare_add = 5;
    p.post_send(true, w);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s[0].status, WcStatus::Success);
    assert_eq!(
        word.with_atomic_u64(0, |w| w.load(Ordering::SeqCst))
            .unwrap(),
        15,
        "executed once"
    );
    assert_eq!(
        res.with_atomic_u64(0, |w| w.load(Ordering::SeqCst))
            .unwrap(),
        10,
        "original value replayed"
    );
    assert_eq!(p.b.counters.snapshot().duplicate_requests, 1);
}

#[test]
fn duplicated_packets_change_nothing() {
    let mut p = pair();
    p.net.set_filter(|_: &Wire<'_>| Verdict::Duplicate);
    let word = p.mr(false, 8, ALL);
    let res = p.mr(true, 8, ALL);
    let (dst, d) = send_5_packets(&mut p);
    let mut w = wr(2, WrOpcode::AtomicFetchAndAdd, &[sge(&res, 0, 8)]);
    w.remote_addr = word.iova();
    w.rkey = word.rkey();
    w.compare_add = 1;
    p.post_send(true, w);
    let s = p.wait(true, true, 2, 10 * SEC);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.wait(false, false, 1, SEC).len(), 1);
    p.settle(SEC);
    assert!(p.b.recv_cq.is_empty() && p.a.send_cq.is_empty());
    assert_eq!(
        word.with_atomic_u64(0, |w| w.load(Ordering::SeqCst))
            .unwrap(),
        1
    );
    let mut got = vec![0u8; 5000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, d);
}

#[test]
fn rnr_retry_exhausted() {
    let mut p = RcPair::new(
        1,
        Faults::default(),
        PairParams {
            rnr_retry: 2,
            min_rnr_timer: 1,
            ..Default::default()
        },
    );
    let src = p.mr(true, 8, ALL);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 8)]));
    let s = p.wait(true, true, 2, 10 * SEC);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(
        p.b.counters.snapshot().rnr_naks_sent,
        3,
        "first try + 2 retries"
    );
}

#[test]
fn rnr_waits_the_coded_time() {
    // min_rnr_timer 14 = 1.28 ms: the resend comes no earlier.
    let mut p = RcPair::new(
        1,
        Faults::default(),
        PairParams {
            min_rnr_timer: 14,
            ..Default::default()
        },
    );
    let src = p.mr(true, 8, ALL);
    let dst = p.mr(false, 8, ALL);
    let times = Arc::new(Mutex::new(Vec::new()));
    let t2 = times.clone();
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.pkt.info.is_request {
            t2.lock().unwrap().push(w.index);
        }
        Verdict::Pass
    });
    p.net.run_until(1_000_000, |_| false); // 1 ms: RNR NAKed, not resent yet
    assert_eq!(times.lock().unwrap().len(), 1, "no resend before 1.28 ms");
    p.post_recv(false, 1, &[sge(&dst, 0, 8)]);
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    assert_eq!(times.lock().unwrap().len(), 2);
}

#[test]
fn retry_exhausted_on_a_dead_path() {
    let mut p = RcPair::new(
        1,
        Faults::default(),
        PairParams {
            retry_cnt: 3,
            timeout: 8,
            ..Default::default()
        },
    );
    p.net.set_filter(|w: &Wire<'_>| {
        if w.pkt.info.is_request {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let src = p.mr(true, 8, ALL);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 8)]));
    let start = p.net.now();
    let s = p.wait(true, true, 2, 10 * SEC);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let a = p.a.counters.snapshot();
    assert_eq!(a.retry_timeouts, 4, "first try + 3 retries");
    // 4 timeouts of 4.096 us * 2^8 each.
    let elapsed = p.net.now().0 - start.0;
    assert!(elapsed >= 4 * 4096 * 256, "{elapsed}");
}

#[test]
fn psn_wrap_under_loss() {
    let mut p = RcPair::new(
        3,
        Faults {
            loss: 0.05,
            ..Faults::default()
        },
        PairParams {
            psn: 0xff_ffe0,
            timeout: 8,
            ..Default::default()
        },
    );
    let src = p.mr(true, 4096, ALL);
    let dst = p.mr(false, 4096 * 100, ALL);
    src.write(0, &data(4096)).unwrap();
    for i in 0..100u64 {
        let mut w = wr(i, WrOpcode::RdmaWrite, &[sge(&src, 0, 4096)]);
        w.remote_addr = dst.iova() + i * 4096;
        w.rkey = dst.rkey();
        p.post_send(true, w);
    }
    let s = p.wait(true, true, 100, 100 * SEC);
    assert_eq!(s.len(), 100);
    assert!(s
        .iter()
        .enumerate()
        .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::Success));
    for i in 0..100 {
        let mut got = vec![0u8; 4096];
        dst.read(i * 4096, &mut got).unwrap();
        assert_eq!(got, data(4096));
    }
}

/// A valid RC SEND_ONLY to `dqpn` from `src` to `dst` with the given PSN
/// and P_Key, ICRC computed as our engine's socket header.
fn forged_send(
    src: std::net::IpAddr,
    dst: std::net::IpAddr,
    dqpn: u32,
    psn: u32,
    pkey: u16,
) -> Vec<u8> {
    use uroce_wire::icrc::IpContext;
    use uroce_wire::packet::{emit, Headers};
    use uroce_wire::{BthRepr, Psn};
    let h = Headers::new(BthRepr {
        opcode: Opcode::RC_SEND_ONLY,
        pkey,
        dest_qp: dqpn,
        psn: Psn::new(psn),
        ack_req: true,
        ..BthRepr::default()
    });
    let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (src, dst) else {
        unreachable!()
    };
    let mut buf = vec![0u8; 128];
    let n = emit(
        &h,
        b"evil",
        &mut buf,
        &IpContext::for_socket_v4(s, d, 4791, 4791),
    )
    .unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn bad_packets_are_dropped_and_counted_never_acted_on() {
    let mut p = pair();
    let dst = p.mr(false, 64, ALL);
    p.post_recv(false, 1, &[sge(&dst, 0, 64)]);
    let (a, b) = (p.a.ip, p.b.ip);
    let epsn = p.net.qp(p.b.id).attr().rq_psn;
    let bqpn = p.b.qpn;
    // Bad ICRC.
    let mut bad = forged_send(a, b, bqpn, epsn, 0xffff);
    let n = bad.len();
    bad[n - 1] ^= 0x40;
    p.net.inject(a, b, bad);
    // Unknown destination QP.
    p.net
        .inject(a, b, forged_send(a, b, bqpn ^ 0x5a5a, epsn, 0xffff));
    // Wrong P_Key.
    p.net.inject(a, b, forged_send(a, b, bqpn, epsn, 0x1234));
    // Right everything, but from an address that is not the connected peer.
    let stranger: std::net::IpAddr = "10.0.0.9".parse().unwrap();
    p.net
        .inject(stranger, b, forged_send(stranger, b, bqpn, epsn, 0xffff));
    p.settle(SEC);
    let net = p.net.counters().snapshot();
    assert_eq!(net.icrc_errors, 1);
    assert_eq!(net.dropped_pkts, 1, "unknown QP");
    assert_eq!(
        p.b.counters.snapshot().dropped_pkts,
        2,
        "wrong P_Key, wrong peer"
    );
    assert!(p.b.recv_cq.is_empty(), "nothing was executed");
    assert_eq!(p.net.qp(p.b.id).attr().rq_psn, epsn);
    // The real peer's SEND still lands in the untouched receive WR.
    let src = p.mr(true, 8, ALL);
    src.write(0, b"goodgood").unwrap();
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    assert_eq!(p.wait(false, false, 1, SEC)[0].byte_len, 8);
}

#[test]
fn wrong_state_drops() {
    let mut p = pair();
    let (a, b) = (p.a.ip, p.b.ip);
    let epsn = p.net.qp(p.b.id).attr().rq_psn;
    let bqpn = p.b.qpn;
    let err = uroce_provider::qp_attr::QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    p.net
        .qp(p.b.id)
        .modify(&err, uroce_provider::qp_attr::AttrMask::STATE)
        .unwrap();
    p.net.inject(a, b, forged_send(a, b, bqpn, epsn, 0xffff));
    p.settle(SEC);
    assert_eq!(p.b.counters.snapshot().dropped_pkts, 1);
}

#[test]
fn reset_and_reuse_after_error() {
    use uroce_provider::qp_attr::{AttrMask, QpAttr};
    use uroce_provider::testing::connect;
    let mut p = pair();
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    // A bad rkey puts both QPs in ERR.
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 8)]);
    w.remote_addr = dst.iova();
    w.rkey = 0x1234_5678;
    p.post_send(true, w);
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::RemAccessErr);
    p.settle(SEC);
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    let params = PairParams::default();
    let (aip, bip, aqpn, bqpn) = (p.a.ip, p.b.ip, p.a.qpn, p.b.qpn);
    for (id, peer, dq, rq, sq) in [(p.a.id, bip, bqpn, 500, 700), (p.b.id, aip, aqpn, 700, 500)] {
        let qp = p.net.qp(id);
        qp.modify(&reset, AttrMask::STATE).unwrap();
        assert_eq!(qp.state(), QpState::Reset);
        connect(qp, peer, dq, rq, sq, &params);
    }
    p.post_recv(false, 3, &[sge(&dst, 0, 64)]);
    src.write(0, b"again!!!").unwrap();
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 8)]));
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!((r[0].wr_id, r[0].status), (3, WcStatus::Success));
    let mut got = [0u8; 8];
    dst.read(0, &mut got).unwrap();
    assert_eq!(&got, b"again!!!");
}

#[test]
fn per_link_faults_mtu_and_black_holes() {
    // One direction lossy, the other clean.
    let mut p = RcPair::new(
        5,
        Faults::default(),
        PairParams {
            timeout: 10,
            ..Default::default()
        },
    );
    let (a, b) = (p.a.ip, p.b.ip);
    p.net
        .set_link_faults(a, b, Faults::parse("loss=0.3,seed=9").unwrap());
    let (dst, d) = send_5_packets(&mut p);
    assert_one_success(&mut p);
    let mut got = vec![0u8; 5000];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, d);
    assert!(p.a.counters.snapshot().retransmits > 0);

    // A black hole shorter than the retry budget is survived.
    let mut p = RcPair::new(
        6,
        Faults::default(),
        PairParams {
            timeout: 12,
            ..Default::default()
        },
    );
    let (a, b) = (p.a.ip, p.b.ip);
    p.net.black_hole(a, b, 0, 50_000_000);
    send_5_packets(&mut p);
    assert_one_success(&mut p);
    assert!(
        p.net.now().0 >= 50_000_000,
        "delivered only after the black hole"
    );
    assert!(p.a.counters.snapshot().retry_timeouts >= 2);

    // A link MTU below the path MTU's packets loses them: retries run out.
    let mut p = RcPair::new(
        7,
        Faults::default(),
        PairParams {
            timeout: 8,
            retry_cnt: 2,
            mtu: Mtu::Mtu2048,
            ..Default::default()
        },
    );
    let (a, b) = (p.a.ip, p.b.ip);
    p.net.set_link_mtu(a, b, 1500);
    send_5_packets(&mut p);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s[0].status, WcStatus::RetryExcErr);
    // With a path MTU that fits, the same link works.
    let mut p = RcPair::new(
        8,
        Faults::default(),
        PairParams {
            mtu: Mtu::Mtu1024,
            ..Default::default()
        },
    );
    let (a, b) = (p.a.ip, p.b.ip);
    p.net.set_link_mtu(a, b, 1500);
    send_5_packets(&mut p);
    assert_one_success(&mut p);
}

#[test]
fn solicited_event_bit_on_the_last_packet_only() {
    let mut p = pair();
    let se: Arc<Mutex<Vec<(Opcode, bool)>>> = Arc::default();
    let s2 = se.clone();
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.pkt.info.is_request {
            s2.lock().unwrap().push((w.pkt.bth.opcode, w.pkt.bth.se));
        }
        Verdict::Pass
    });
    let src = p.mr(true, 3000, ALL);
    let dst = p.mr(false, 3000, ALL);
    p.post_recv(false, 1, &[sge(&dst, 0, 3000)]);
    let mut w = wr(1, WrOpcode::Send, &[sge(&src, 0, 3000)]);
    w.flags |= SendFlags::SOLICITED;
    p.post_send(true, w);
    assert_one_success(&mut p);
    assert_eq!(
        *se.lock().unwrap(),
        vec![
            (Opcode::RC_SEND_FIRST, false),
            (Opcode::RC_SEND_MIDDLE, false),
            (Opcode::RC_SEND_LAST, true)
        ]
    );
}

#[test]
fn write_with_imm_rnr_then_receive_posted() {
    // A WRITE with immediate finds no receive WR: RNR NAK. The receive
    // posted afterwards (with no buffer, or one smaller than the WRITE:
    // the data goes to the RETH's address) completes the resend, for a
    // one-packet and for a three-packet WRITE.
    for (len, sges) in [(64usize, 0u32), (3000, 16)] {
        let mut p = RcPair::new(
            1,
            Faults::default(),
            PairParams {
                min_rnr_timer: 1,
                ..Default::default()
            },
        );
        let src = p.mr(true, len, ALL);
        let dst = p.mr(false, len, ALL);
        let small = p.mr(false, 16, ALL);
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        src.write(0, &data).unwrap();
        let mut w = wr(1, WrOpcode::RdmaWriteWithImm, &[sge(&src, 0, len as u32)]);
        w.remote_addr = dst.iova();
        w.rkey = dst.rkey();
        w.imm_data = 0x1234;
        p.post_send(true, w);
        p.net.run_until(1_000_000, |_| false);
        assert!(p.b.counters.snapshot().rnr_naks_sent >= 1, "RNR NAKed");
        let recv: Vec<Sge> = (0..sges.min(1)).map(|_| sge(&small, 0, sges)).collect();
        p.post_recv(false, 7, &recv);
        let s = p.wait(true, true, 1, SEC);
        assert_eq!(s[0].status, WcStatus::Success, "len {len}");
        let r = p.wait(false, false, 1, SEC);
        assert_eq!(
            (r[0].status, r[0].opcode, r[0].byte_len, r[0].imm_data),
            (
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                len as u32,
                0x1234
            )
        );
        let mut got = vec![0u8; len];
        dst.read(0, &mut got).unwrap();
        assert_eq!(got, data);
    }
}

/// Regression (found by the fuzzer's reference model): the requester
/// took a READ response by its PSN and whether it ended the READ, not by
/// its opcode, so a LAST answering a one-packet READ (or a MIDDLE in a
/// FIRST's place) completed it successfully. The response of a one-packet
/// READ is held back, then delivered with its opcode byte rewritten (the
/// ONLY and LAST headers have the same layout) and its ICRC again.
fn read_answered_by(p: &mut RcPair, op: Opcode) -> WcStatus {
    let remote = p.mr(false, 1000, ALL);
    let local = p.mr(true, 1000, ALL);
    remote.write(0, &data(1000)).unwrap();
    let held: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let h = held.clone();
    p.net.set_filter(move |w: &Wire<'_>| {
        let mut h = h.lock().unwrap();
        if w.pkt.info.operation == Operation::RdmaReadResponse && h.is_empty() {
            h.push(w.pkt.bytes.to_vec());
            return Verdict::Drop;
        }
        Verdict::Pass
    });
    let mut w = wr(1, WrOpcode::RdmaRead, &[sge(&local, 0, 1000)]);
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    p.post_send(true, w);
    p.settle(100_000);
    let (a, b) = (p.a.ip, p.b.ip);
    let mut pkt = held.lock().unwrap()[0].clone();
    pkt[0] = op.0;
    let ctx = uroce_wire::icrc::IpContext::between(b, a, 4791, 4791);
    uroce_wire::icrc::write(&ctx, &mut pkt).unwrap();
    p.net.inject(b, a, pkt);
    let s = p.wait(true, true, 1, 10 * SEC);
    s[0].status
}

#[test]
fn a_read_response_out_of_its_opcode_sequence_is_not_taken() {
    let mut p = pair();
    let only = Opcode::RC_RDMA_READ_RESPONSE_ONLY;
    assert_eq!(read_answered_by(&mut p, only), WcStatus::Success);
    let mut p = pair();
    let status = read_answered_by(&mut p, Opcode::RC_RDMA_READ_RESPONSE_LAST);
    assert_ne!(status, WcStatus::Success, "a LAST without FIRST");
}
