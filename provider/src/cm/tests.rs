//! The CM agent on the simulated network: two devices' QP1s, with loss,
//! duplication and scripted drops.

use super::gsi::GsiQp;
use super::*;
use crate::net::sim::{Faults, SimNet, Verdict};
use parking_lot::Mutex;
use uroce_wire::cm::CmAttr;
use uroce_wire::mad::MAD_LEN;

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";
const SID: u64 = 0x0106_1d2f;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Pair {
    net: SimNet,
    a: Arc<Mutex<CmAgent>>,
    b: Arc<Mutex<CmAgent>>,
    counters: Arc<Counters>,
    /// A's events go to a sink: [`Pair::run`] leaves them alone.
    a_sink: bool,
}

/// Two agents with short timeouts (exponent 14: 67 ms, lifetime 10).
fn pair(seed: u64, faults: Faults) -> Pair {
    pair_with_sink(seed, faults, None)
}

/// [`pair`], with A's events going to `sink_a` as the engine hands them
/// out (the drop-in library's way) instead of staying in the agent.
fn pair_with_sink(seed: u64, faults: Faults, sink_a: Option<gsi::Sink>) -> Pair {
    let counters = Arc::new(Counters::default());
    let mut net = SimNet::new(seed, faults);
    let mk = |addr: &str, guid: u64| {
        let mut cfg = CmConfig::new(ip(addr), guid);
        cfg.response_timeout = 14;
        cfg.packet_lifetime = 10;
        cfg.max_retries = 4;
        Arc::new(Mutex::new(CmAgent::new(cfg, counters.clone())))
    };
    let a = mk(A, 0xa);
    let b = mk(B, 0xb);
    let a_sink = sink_a.is_some();
    net.add(
        ip(A),
        GsiQp::new(a.clone(), ip(A), counters.clone(), sink_a, None),
    );
    net.add(
        ip(B),
        GsiQp::new(b.clone(), ip(B), counters.clone(), None, None),
    );
    Pair {
        net,
        a,
        b,
        counters,
        a_sink,
    }
}

#[allow(clippy::field_reassign_with_default)] // many fields, a few set
fn req(qpn: u32, psn: u32) -> ReqRepr {
    let mut r = ReqRepr::default();
    r.service_id = SID;
    r.local_qpn = qpn;
    r.starting_psn = psn;
    r.responder_resources = 4;
    r.initiator_depth = 4;
    r.path_mtu = 5;
    r.retry_count = 7;
    r.rnr_retry_count = 7;
    r.pkey = 0xffff;
    r.private_data[..5].copy_from_slice(b"hello");
    r
}

#[allow(clippy::field_reassign_with_default)]
fn rep(qpn: u32, psn: u32) -> RepRepr {
    let mut r = RepRepr::default();
    r.local_qpn = qpn;
    r.starting_psn = psn;
    r.responder_resources = 4;
    r.initiator_depth = 4;
    r.rnr_retry_count = 7;
    r.private_data[..5].copy_from_slice(b"world");
    r
}

/// What each side saw, with the users' standard answers applied: the
/// passive side accepts every REQ, the active side establishes on REP.
#[derive(Default, Debug)]
struct Seen {
    a: Vec<CmEvent>,
    b: Vec<CmEvent>,
}

impl Pair {
    fn now(&self) -> Nanos {
        self.net.now()
    }
    /// Runs until `done` or `limit_ns` of virtual time; users answer as
    /// `Seen` says.
    fn run(&mut self, seen: &mut Seen, limit_ns: u64, done: impl Fn(&Seen) -> bool) -> bool {
        let end = self.net.now().plus(limit_ns);
        loop {
            let now = self.net.now();
            for (agent, log, passive) in
                [(&self.a, &mut seen.a, false), (&self.b, &mut seen.b, true)]
            {
                if !passive && self.a_sink {
                    continue;
                }
                let mut g = agent.lock();
                while let Some(e) = g.poll_event() {
                    match &e {
                        CmEvent::ReqReceived { conn, .. } if passive => {
                            g.accept(now, *conn, &rep(0x222, 200)).unwrap();
                        }
                        CmEvent::RepReceived { conn, .. } if !passive => {
                            g.establish(*conn, &[]).unwrap();
                        }
                        _ => {}
                    }
                    log.push(e);
                }
            }
            if done(seen) {
                return true;
            }
            if self.net.now() > end || !self.net.step() {
                return done(seen);
            }
        }
    }
}

fn has(log: &[CmEvent], f: impl Fn(&CmEvent) -> bool) -> bool {
    log.iter().any(f)
}

fn established(log: &[CmEvent]) -> bool {
    has(log, |e| matches!(e, CmEvent::Established { .. }))
}

fn connect(p: &mut Pair) -> u32 {
    p.b.lock().listen(SID).unwrap();
    let now = p.now();
    p.a.lock().connect(now, ip(B), &req(0x111, 100)).unwrap()
}

#[test]
fn connects_and_disconnects() {
    let mut p = pair(1, Faults::default());
    let conn = connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    // The passive side saw the REQ's fields and private data.
    let CmEvent::ReqReceived { req, src, .. } = &seen.b[0] else {
        panic!("{:?}", seen.b)
    };
    assert_eq!((req.local_qpn, req.starting_psn, *src), (0x111, 100, ip(A)));
    assert_eq!(&req.private_data[..5], b"hello");
    assert_eq!(req.local_ca_guid, 0xa);
    let CmEvent::RepReceived { rep, .. } = &seen.a[0] else {
        panic!("{:?}", seen.a)
    };
    assert_eq!((rep.local_qpn, rep.starting_psn), (0x222, 200));
    assert_eq!(&rep.private_data[..5], b"world");
    assert_eq!(p.a.lock().state(conn), Some(ConnState::Established));
    let now = p.now();
    p.a.lock().disconnect(now, conn, b"bye").unwrap();
    assert!(p.run(&mut seen, 1_000_000_000, |s| {
        has(&s.a, |e| matches!(e, CmEvent::TimewaitExit { .. }))
            && has(&s.b, |e| matches!(e, CmEvent::TimewaitExit { .. }))
    }));
    let bye = seen.b.iter().find_map(|e| match e {
        CmEvent::Disconnected { private_data, .. } => Some(private_data[..3].to_vec()),
        _ => None,
    });
    assert_eq!(bye.as_deref(), Some(&b"bye"[..]));
    assert!(p.a.lock().is_empty() && p.b.lock().is_empty());
    assert_eq!(p.counters.cm_retries.load(Ordering::Relaxed), 0);
}

use std::sync::atomic::Ordering;

#[test]
fn connects_through_loss_and_duplication() {
    let mut made = 0;
    for seed in 0..40 {
        let faults = Faults {
            loss: 0.3,
            duplicate: 0.2,
            ..Faults::default()
        };
        let mut p = pair(seed, faults);
        let conn = connect(&mut p);
        let mut seen = Seen::default();
        let ok = p.run(&mut seen, 5_000_000_000, |s| {
            established(&s.b) || has(&s.a, |e| matches!(e, CmEvent::Unreachable { .. }))
        });
        assert!(ok, "seed {seed}: {seen:?}");
        if !established(&seen.b) {
            continue; // 4 retries can all be lost at 30% loss
        }
        made += 1;
        // Exactly one REQ event and one REP event, whatever was duplicated.
        let reqs = seen
            .b
            .iter()
            .filter(|e| matches!(e, CmEvent::ReqReceived { .. }))
            .count();
        let reps = seen
            .a
            .iter()
            .filter(|e| matches!(e, CmEvent::RepReceived { .. }))
            .count();
        assert_eq!((reqs, reps), (1, 1), "seed {seed}");
        assert_eq!(p.a.lock().state(conn), Some(ConnState::Established));
        let now = p.now();
        p.a.lock().disconnect(now, conn, &[]).unwrap();
        let ok = p.run(&mut seen, 5_000_000_000, |s| {
            has(&s.a, |e| matches!(e, CmEvent::Disconnected { .. }))
                && has(&s.b, |e| matches!(e, CmEvent::Disconnected { .. }))
        });
        assert!(ok, "seed {seed}: {seen:?}");
    }
    assert!(made >= 30, "only {made} of 40 connected");
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut p = pair(2, Faults::default());
    let now = p.now();
    let conn = p.a.lock().connect(now, ip(B), &req(0x111, 1)).unwrap();
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| !s.a.is_empty()));
    match &seen.a[0] {
        CmEvent::Rejected { conn: c, rej } => {
            assert_eq!(*c, conn);
            assert_eq!(rej.reason, reason::INVALID_SERVICE_ID);
        }
        e => panic!("{e:?}"),
    }
    assert!(p.a.lock().is_empty() && p.b.lock().is_empty());
}

#[test]
fn the_user_can_reject_with_private_data() {
    let mut p = pair(3, Faults::default());
    p.b.lock().listen(SID).unwrap();
    let now = p.now();
    p.a.lock().connect(now, ip(B), &req(0x111, 1)).unwrap();
    // Step until B has the REQ, reject it by hand.
    let b = p.b.clone();
    let got = p.net.run_until(1_000_000_000, |_| b.lock().has_events());
    assert!(got);
    let e = b.lock().poll_event().unwrap();
    let CmEvent::ReqReceived { conn, .. } = e else {
        panic!("{e:?}")
    };
    b.lock()
        .reject(conn, reason::CONSUMER_REJECT, b"no")
        .unwrap();
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| !s.a.is_empty()));
    let CmEvent::Rejected { rej, .. } = &seen.a[0] else {
        panic!("{:?}", seen.a)
    };
    assert_eq!(rej.reason, reason::CONSUMER_REJECT);
    assert_eq!(&rej.private_data[..2], b"no");
}

/// Drops every MAD of one attribute from `src`.
fn drop_attr(net: &mut SimNet, src: IpAddr, attr: CmAttr) {
    net.set_filter(move |w| {
        let mad = w.pkt.payload;
        let id = mad.get(16..18).map(|b| u16::from_be_bytes([b[0], b[1]]));
        if w.src == src && id == Some(attr as u16) {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
}

/// Drops the first MAD of `attr` on the network (either direction).
fn drop_first(net: &mut SimNet, attr: CmAttr) {
    let mut dropped = false;
    net.set_filter(move |w| {
        let id = w
            .pkt
            .payload
            .get(16..18)
            .map(|b| u16::from_be_bytes([b[0], b[1]]));
        if id == Some(attr as u16) && !dropped {
            dropped = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
}

#[test]
fn a_lost_rep_is_resent_then_unreachable() {
    let mut p = pair(4, Faults::default());
    drop_attr(&mut p.net, ip(B), CmAttr::Rep);
    let conn = connect(&mut p);
    let mut seen = Seen::default();
    let start = p.now();
    // B gives up on its own, or hears A's timeout REJ first (A started
    // its clock first).
    assert!(p.run(&mut seen, 10_000_000_000, |s| {
        has(&s.a, |e| matches!(e, CmEvent::Unreachable { .. }))
            && has(&s.b, |e| match e {
                CmEvent::Unreachable { .. } => true,
                CmEvent::Rejected { rej, .. } => rej.reason == reason::TIMEOUT,
                _ => false,
            })
    }));
    assert!(seen.a.contains(&CmEvent::Unreachable { conn }));
    // Four retries of a ~70 ms wait each on both sides, not seconds.
    let took = p.now().0 - start.0;
    assert!((300_000_000..3_000_000_000).contains(&took), "{took}");
    assert!(p.counters.cm_retries.load(Ordering::Relaxed) >= 4);
    // Duplicate REQs while the REP was outstanding did not make a second
    // connection.
    let reqs = seen
        .b
        .iter()
        .filter(|e| matches!(e, CmEvent::ReqReceived { .. }))
        .count();
    assert_eq!(reqs, 1);
    assert!(p.a.lock().is_empty() && p.b.lock().is_empty());
}

#[test]
fn a_lost_rtu_is_recovered_by_the_rep_retry() {
    let mut p = pair(5, Faults::default());
    // Drop the first RTU only.
    drop_first(&mut p.net, CmAttr::Rtu);
    connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 2_000_000_000, |s| established(&s.b)));
    assert!(p.counters.cm_retries.load(Ordering::Relaxed) >= 1);
    assert!(p.counters.cm_duplicates.load(Ordering::Relaxed) >= 1);
}

#[test]
fn a_dead_peer_makes_the_dreq_time_out() {
    let mut p = pair(6, Faults::default());
    let conn = connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    // B is gone: nothing it would send arrives.
    drop_attr(&mut p.net, ip(B), CmAttr::Drep);
    let now = p.now();
    p.a.lock().disconnect(now, conn, &[]).unwrap();
    assert!(p.run(&mut seen, 10_000_000_000, |s| {
        has(&s.a, |e| matches!(e, CmEvent::TimewaitExit { .. }))
    }));
    assert!(has(&seen.a, |e| matches!(e, CmEvent::Disconnected { .. })));
}

#[test]
fn the_drep_goes_twice_so_one_loss_costs_no_dreq_resend() {
    let mut p = pair(16, Faults::default());
    let conn = connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    // The first DREP is lost; its copy ends A's disconnect.
    drop_first(&mut p.net, CmAttr::Drep);
    let now = p.now();
    p.a.lock().disconnect(now, conn, &[]).unwrap();
    assert!(p.run(&mut seen, 1_000_000_000, |s| {
        has(&s.a, |e| matches!(e, CmEvent::Disconnected { .. }))
    }));
    assert_eq!(p.a.lock().state(conn), Some(ConnState::TimeWait));
    assert_eq!(p.counters.cm_retries.load(Ordering::Relaxed), 0);
    // Only the copy arrived: nothing to count as a duplicate.
    assert_eq!(p.counters.cm_duplicates.load(Ordering::Relaxed), 0);
}

/// The user sees DISCONNECTED only once the DREPs that answered the
/// peer's DREQ are on the wire: DISCONNECTED often ends the program, and
/// with the program ends the CM that would send them (perftest -R's
/// server did exit between the two, and the kernel peer then resent its
/// DREQ to nobody for 100 s).
#[test]
fn events_wait_for_the_mads_sent_with_them() {
    use std::sync::atomic::AtomicUsize;
    // A's user, in the sink: establishes on REP; logs each event with
    // the DREPs A had put on the wire by then.
    let a_cell: Arc<Mutex<Option<Arc<Mutex<CmAgent>>>>> = Arc::new(Mutex::new(None));
    let dreps_from_a = Arc::new(AtomicUsize::new(0));
    let log: Arc<Mutex<Vec<(CmEvent, usize)>>> = Arc::default();
    let sink: gsi::Sink = {
        let (a_cell, dreps, log) = (a_cell.clone(), dreps_from_a.clone(), log.clone());
        Arc::new(move |events| {
            for e in events {
                if let CmEvent::RepReceived { conn, .. } = &e {
                    let a = a_cell.lock().clone().expect("set");
                    a.lock().establish(*conn, &[]).unwrap();
                }
                log.lock().push((e, dreps.load(Ordering::Relaxed)));
            }
        })
    };
    let mut p = pair_with_sink(21, Faults::default(), Some(sink));
    *a_cell.lock() = Some(p.a.clone());
    let counted = dreps_from_a.clone();
    p.net.set_filter(move |w| {
        let id = w
            .pkt
            .payload
            .get(16..18)
            .map(|b| u16::from_be_bytes([b[0], b[1]]));
        if w.src == ip(A) && id == Some(CmAttr::Drep as u16) {
            counted.fetch_add(1, Ordering::Relaxed);
        }
        Verdict::Pass
    });
    connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    let conn_b = seen
        .b
        .iter()
        .find_map(|e| match e {
            CmEvent::Established { conn } => Some(*conn),
            _ => None,
        })
        .unwrap();
    let now = p.now();
    p.b.lock().disconnect(now, conn_b, &[]).unwrap();
    let l = log.clone();
    let ok = p.run(&mut seen, 1_000_000_000, move |_| {
        l.lock()
            .iter()
            .any(|(e, _)| matches!(e, CmEvent::Disconnected { .. }))
    });
    assert!(ok, "{:?} {:?}", log.lock(), seen);
    let log = log.lock();
    let at = log
        .iter()
        .find_map(|(e, n)| matches!(e, CmEvent::Disconnected { .. }).then_some(*n));
    assert_eq!(at, Some(2), "{log:?}");
}

#[test]
fn a_slow_user_gets_an_mra_and_the_peer_waits() {
    let mut p = pair(7, Faults::default());
    p.b.lock().listen(SID).unwrap();
    let now = p.now();
    let conn = p.a.lock().connect(now, ip(B), &req(0x111, 1)).unwrap();
    // B's user does not answer for 150 ms: A's REQ is resent, B MRAs it.
    let b = p.b.clone();
    let start = p.now().0;
    p.net
        .run_until(150_000_000, |n| n.now().0 > start + 150_000_000);
    assert_eq!(p.a.lock().state(conn), Some(ConnState::MraRcvd));
    let e = b.lock().poll_event().unwrap();
    let CmEvent::ReqReceived { conn: bc, .. } = e else {
        panic!("{e:?}")
    };
    assert!(b.lock().poll_event().is_none(), "one REQ event");
    // Another second: A keeps waiting (the MRA asked for 2^24 x 4 us).
    let start = p.now().0;
    p.net
        .run_until(1_000_000_000, |n| n.now().0 > start + 1_000_000_000);
    assert_eq!(p.a.lock().state(conn), Some(ConnState::MraRcvd));
    let now = p.now();
    b.lock().accept(now, bc, &rep(0x222, 2)).unwrap();
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
}

#[test]
fn a_stale_req_is_rejected_and_the_old_connection_ends() {
    let mut p = pair(8, Faults::default());
    connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    // A "restarts": a new agent state, same QPN, new comm ID.
    let now = p.now();
    let mut cfg = p.a.lock().config().clone();
    cfg.ca_guid = 0xa;
    *p.a.lock() = CmAgent::new(cfg, p.counters.clone());
    p.a.lock().connect(now, ip(B), &req(0x111, 5)).unwrap();
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 2_000_000_000, |s| {
        !s.a.is_empty() && has(&s.b, |e| matches!(e, CmEvent::Disconnected { .. }))
    }));
    let CmEvent::Rejected { rej, .. } = &seen.a[0] else {
        panic!("{:?}", seen.a)
    };
    assert_eq!(rej.reason, reason::STALE_CONN);
}

#[test]
fn sidr_resolves_a_service_and_refuses_an_unknown_one() {
    let mut p = pair(9, Faults::default());
    p.b.lock().listen(SID).unwrap();
    let now = p.now();
    let id = p.a.lock().sidr_request(now, ip(B), SID, 0, b"who").unwrap();
    let b = p.b.clone();
    assert!(p.net.run_until(1_000_000_000, |_| b.lock().has_events()));
    let e = b.lock().poll_event().unwrap();
    let CmEvent::SidrReqReceived { conn, req, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(&req.private_data[..3], b"who");
    let now = p.now();
    b.lock()
        .sidr_reply(now, conn, SIDR_OK, 0x333, 0x1234_5678, b"ok")
        .unwrap();
    let a = p.a.clone();
    assert!(p.net.run_until(1_000_000_000, |_| a.lock().has_events()));
    let e = a.lock().poll_event().unwrap();
    let CmEvent::SidrRepReceived { conn, rep } = e else {
        panic!("{e:?}")
    };
    assert_eq!(conn, id);
    assert_eq!(
        (rep.status, rep.qpn, rep.qkey),
        (SIDR_OK, 0x333, 0x1234_5678)
    );
    let now = p.now();
    p.a.lock()
        .sidr_request(now, ip(B), SID + 1, 0, &[])
        .unwrap();
    assert!(p.net.run_until(1_000_000_000, |_| a.lock().has_events()));
    let e = a.lock().poll_event().unwrap();
    let CmEvent::SidrRepReceived { rep, .. } = e else {
        panic!("{e:?}")
    };
    assert_eq!(rep.status, SIDR_UNSUPPORTED);
}

#[test]
fn malformed_and_unmatched_mads_are_dropped_and_counted() {
    let counters = Arc::new(Counters::default());
    let mut agent = CmAgent::new(CmConfig::new(ip(A), 1), counters.clone());
    let now = Nanos(0);
    // Random bytes, short buffers, a wrong class.
    let mut rng = 0x1234_5678u64;
    for len in [0, 1, 23, 24, 100, 255, 256, 300] {
        let mut b = vec![0u8; len];
        for x in &mut b {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1);
            *x = (rng >> 33) as u8;
        }
        agent.handle_mad(now, ip(B), 1, &b);
    }
    assert_eq!(counters.cm_malformed_mads.load(Ordering::Relaxed), 8);
    // Well-formed replies that name no connection.
    for msg in [
        CmMessage::Rep(rep(1, 1)),
        CmMessage::Rtu(RtuRepr::default()),
        CmMessage::Drep(DrepRepr::default()),
        CmMessage::Rej(RejRepr::default()),
        CmMessage::Mra(MraRepr::default()),
    ] {
        let mut b = [0u8; MAD_LEN];
        CmMad { tid: 1, msg }.emit(&mut b).unwrap();
        agent.handle_mad(now, ip(B), 1, &b);
    }
    assert_eq!(counters.cm_dropped_mads.load(Ordering::Relaxed), 5);
    assert!(agent.poll_event().is_none() && agent.is_empty());
    // A DREQ for nothing is answered with a DREP all the same.
    let mut b = [0u8; MAD_LEN];
    CmMad {
        tid: 9,
        msg: CmMessage::Dreq(DreqRepr::default()),
    }
    .emit(&mut b)
    .unwrap();
    agent.handle_mad(now, ip(B), 1, &b);
    let out = agent.poll_transmit().unwrap();
    assert!(matches!(out.mad.msg, CmMessage::Drep(_)) && out.mad.tid == 9);
}

#[test]
fn req_floods_are_bounded() {
    let counters = Arc::new(Counters::default());
    let mut agent = CmAgent::new(CmConfig::new(ip(A), 1), counters);
    agent.listen(SID).unwrap();
    for i in 0..(MAX_CONNS as u32 + 100) {
        let mut r = req(i + 2, 1);
        r.local_comm_id = i + 1;
        let mut b = [0u8; MAD_LEN];
        CmMad {
            tid: 1,
            msg: CmMessage::Req(r),
        }
        .emit(&mut b)
        .unwrap();
        agent.handle_mad(Nanos(0), ip(B), 1, &b);
    }
    assert_eq!(agent.len(), MAX_CONNS);
    let rejs = std::iter::from_fn(|| agent.poll_transmit())
        .filter(|o| matches!(o.mad.msg, CmMessage::Rej(r) if r.reason == reason::NO_RESOURCES))
        .count();
    assert_eq!(rejs, 100);
}

/// Every MAD of a connection leaves with the traffic class of the REQ's
/// primary path, on both sides (the kernel's CM sends with the address
/// vector of that path): REQ, REP, RTU, DREQ, DREP.
#[test]
fn mads_carry_the_paths_traffic_class() {
    let counters = Arc::new(Counters::default());
    let mut a = CmAgent::new(CmConfig::new(ip(A), 0xa), counters.clone());
    let mut b = CmAgent::new(CmConfig::new(ip(B), 0xb), counters);
    b.listen(SID).unwrap();
    let now = Nanos(0);
    let mut r = req(0x111, 100);
    r.primary.traffic_class = 0xb8;
    let conn = a.connect(now, ip(B), &r).unwrap();
    // Hands what `from` sends to `to`; the kinds and traffic classes.
    let shuttle = |from: &mut CmAgent, src: &str, to: &mut CmAgent| {
        let mut sent = Vec::new();
        while let Some(out) = from.poll_transmit() {
            let mut m = [0u8; MAD_LEN];
            out.mad.emit(&mut m).unwrap();
            to.handle_mad(now, ip(src), 1, &m);
            sent.push((std::mem::discriminant(&out.mad.msg), out.tclass));
        }
        sent
    };
    let kind = |m: CmMessage| std::mem::discriminant(&m);
    let req_sent = shuttle(&mut a, A, &mut b);
    assert_eq!(req_sent, [(kind(CmMessage::Req(r)), 0xb8)]);
    let Some(CmEvent::ReqReceived { conn: bconn, .. }) = b.poll_event() else {
        panic!("no REQ event");
    };
    b.accept(now, bconn, &rep(0x222, 200)).unwrap();
    let rep_sent = shuttle(&mut b, B, &mut a);
    assert_eq!(rep_sent, [(kind(CmMessage::Rep(rep(0, 0))), 0xb8)]);
    a.establish(conn, &[]).unwrap();
    let rtu = shuttle(&mut a, A, &mut b);
    assert_eq!(rtu, [(kind(CmMessage::Rtu(RtuRepr::default())), 0xb8)]);
    a.disconnect(now, conn, &[]).unwrap();
    let dreq = shuttle(&mut a, A, &mut b);
    assert_eq!(dreq, [(kind(CmMessage::Dreq(DreqRepr::default())), 0xb8)]);
    let drep = shuttle(&mut b, B, &mut a);
    let d = (kind(CmMessage::Drep(DrepRepr::default())), 0xb8);
    assert_eq!(drep, [d, d]);
}

/// A DREQ sent again at once (`resend_last`, what a process about to exit
/// does while it lingers) reaches a peer whose first DREQ was lost, long
/// before the retry at the response timeout, and spends no retry.
#[test]
fn a_lost_dreq_sent_again_at_once_disconnects_the_peer() {
    let mut p = pair(7, Faults::default());
    let conn = connect(&mut p);
    let mut seen = Seen::default();
    assert!(p.run(&mut seen, 1_000_000_000, |s| established(&s.b)));
    // The first packet from A after this point (the DREQ) is lost.
    let dropped = Arc::new(Mutex::new(false));
    let d = dropped.clone();
    p.net.set_filter(move |w| {
        let mut d = d.lock();
        if w.src == ip(A) && !*d {
            *d = true;
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    let now = p.now();
    p.a.lock().disconnect(now, conn, &[]).unwrap();
    let retries = p.counters.cm_retries.load(Ordering::Relaxed);
    p.a.lock().resend_last(conn);
    // Before A's own retry, whose timer (this pair's REP asks for a
    // response timeout of 4 µs, plus twice the packet lifetime) fires at
    // about 8 ms: the run ends as soon as both sides are disconnected.
    let t0 = p.now();
    assert!(p.run(&mut seen, 1_000_000, |s| {
        has(&s.b, |e| matches!(e, CmEvent::Disconnected { .. }))
            && has(&s.a, |e| matches!(e, CmEvent::Disconnected { .. }))
    }));
    assert!(*dropped.lock(), "the first DREQ was dropped");
    assert!(p.now().0 - t0.0 < 1_000_000);
    assert_eq!(p.counters.cm_retries.load(Ordering::Relaxed), retries);
}

/// The processes of a shared device as a test sets them.
#[derive(Debug)]
struct FakeGroup {
    slot: u32,
    live: u64,
    /// Service ID -> the listener's slot.
    listeners: Mutex<HashMap<u64, u32>>,
}

impl CmGroup for FakeGroup {
    fn slot(&self) -> u32 {
        self.slot
    }
    fn is_live(&self, slot: u32) -> bool {
        self.live & (1 << slot) != 0
    }
    fn alone(&self) -> bool {
        self.live == 1 << self.slot
    }
    fn claim(&self, service_id: u64) -> Option<Box<dyn std::fmt::Debug + Send>> {
        let mut l = self.listeners.lock();
        if l.contains_key(&service_id) {
            return None;
        }
        l.insert(service_id, self.slot);
        Some(Box::new(()))
    }
    fn listener(&self, service_id: u64) -> Option<u32> {
        self.listeners.lock().get(&service_id).copied()
    }
    fn write_forward_header(&self, slot: u32, _: SocketAddr, _: u8, buf: &mut [u8]) -> usize {
        buf[0] = slot as u8;
        1
    }
}

fn mad_bytes(msg: CmMessage) -> Vec<u8> {
    let mut b = vec![0u8; MAD_LEN];
    CmMad { tid: 7, msg }.emit(&mut b).unwrap();
    b
}

/// On a shared device each MAD goes to the process it names: a reply by
/// the slot in the communication ID it names as the receiver's, a REQ by
/// its service's listener; one for a process that has gone is answered
/// here as the kernel's CM answers from time-wait.
#[test]
#[allow(clippy::field_reassign_with_default)]
fn a_shared_devices_agent_routes_each_mad_to_its_owner() {
    const OTHER_SID: u64 = 0x77;
    let g = Arc::new(FakeGroup {
        slot: 1,
        live: 0b0111,
        listeners: Mutex::new(HashMap::from([(OTHER_SID, 2)])),
    });
    let counters = Arc::new(Counters::default());
    let mut a = CmAgent::new(CmConfig::new(ip(A), 0xa), counters.clone()).with_group(g.clone());
    let now = Nanos(0);
    // Its IDs carry its slot; a listen is the device's.
    let id = a.connect(now, ip(B), &req(0x40_0001, 1)).unwrap();
    assert_eq!(id >> COMM_SLOT_SHIFT, 1);
    assert_eq!(a.listen(OTHER_SID), Err(CmError::InUse));
    a.listen(SID).unwrap();
    assert_eq!(g.listener(SID), Some(1));
    while a.poll_transmit().is_some() {}
    let src = ip(B);
    let theirs = |qpn: u32, sid: u64| {
        let mut r = req(qpn, 1);
        r.service_id = sid;
        r.local_comm_id = qpn;
        r.local_ca_guid = 0xb;
        r
    };
    let other_req = theirs(0x50_0001, OTHER_SID);
    assert_eq!(
        a.handle_mad(now, src, 1, &mad_bytes(CmMessage::Req(other_req))),
        Route::Forward(2)
    );
    assert_eq!(
        a.handle_mad(
            now,
            src,
            1,
            &mad_bytes(CmMessage::Req(theirs(0x50_0002, SID)))
        ),
        Route::Here
    );
    assert!(matches!(a.poll_event(), Some(CmEvent::ReqReceived { .. })));
    let mut r = rep(0x50_0003, 1);
    r.local_comm_id = 0x1234;
    r.remote_comm_id = 2 << COMM_SLOT_SHIFT | 5;
    assert_eq!(
        a.handle_mad(now, src, 1, &mad_bytes(CmMessage::Rep(r))),
        Route::Forward(2)
    );
    let rtu = RtuRepr {
        local_comm_id: 0x1234,
        remote_comm_id: 9,
        ..RtuRepr::default()
    };
    assert_eq!(
        a.handle_mad(now, src, 1, &mad_bytes(CmMessage::Rtu(rtu))),
        Route::Forward(0)
    );
    assert_eq!(counters.cm_forwarded.load(Ordering::Relaxed), 3);
    assert!(
        a.poll_transmit().is_none(),
        "a forwarded MAD is not answered"
    );
    // Slot 3 is nobody's: its DREQ gets a DREP, its REP a REJ (timeout).
    let gone = 3 << COMM_SLOT_SHIFT | 1;
    let mut dreq = DreqRepr::default();
    dreq.local_comm_id = 0x99;
    dreq.remote_comm_id = gone;
    assert_eq!(
        a.handle_mad(now, src, 1, &mad_bytes(CmMessage::Dreq(dreq))),
        Route::Here
    );
    let out = a.poll_transmit().expect("a DREP");
    assert!(
        matches!(out.mad.msg, CmMessage::Drep(d) if d.local_comm_id == gone && d.remote_comm_id == 0x99)
    );
    while a.poll_transmit().is_some() {}
    r.remote_comm_id = gone;
    assert_eq!(
        a.handle_mad(now, src, 1, &mad_bytes(CmMessage::Rep(r))),
        Route::Here
    );
    let out = a.poll_transmit().expect("a REJ");
    assert!(matches!(out.mad.msg, CmMessage::Rej(j)
        if j.reason == reason::TIMEOUT && j.local_comm_id == gone && j.remote_comm_id == 0x1234));
    assert_eq!(counters.cm_orphans.load(Ordering::Relaxed), 2);
}
