//! Many RC QPs on one device share its in-flight budget (the endpoint's
//! response to hundreds of QPs bursting into one receiver), on the
//! simulated network, which runs the production endpoint.

use std::net::IpAddr;
use uroce_provider::sans_io::net::sim::{Faults, SimNet};
use uroce_provider::sans_io::transport::rc::RcQp;
use uroce_provider::testing::{connect, sge, side_with, signaled_wr, PairParams, Side};
use uroce_provider::types::*;

const QPS: u32 = 32;
const MSGS: u64 = 24;
const LEN: usize = 8192;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Runs QPS pairs each writing MSGS messages of LEN bytes (8 packets at
/// MTU 1024) with the sending device's budget at `budget`; returns the
/// most PSNs that device had in flight at once, after checking every
/// byte arrived.
fn run(budget: u32) -> u32 {
    let p = PairParams {
        depth: 64,
        ..PairParams::default()
    };
    let mut net = SimNet::new(7, Faults::default());
    let (a_ip, b_ip) = (ip("10.0.0.1"), ip("10.0.0.2"));
    let mut pairs: Vec<(Side, Side)> = Vec::new();
    for i in 0..QPS {
        let a = side_with(&mut net, a_ip, 0x100 + i, &p, |c| Box::new(RcQp::new(c)));
        let b = side_with(&mut net, b_ip, 0x200 + i, &p, |c| Box::new(RcQp::new(c)));
        connect(net.qp(a.id), b_ip, b.qpn, 1000, 5000, &p);
        connect(net.qp(b.id), a_ip, a.qpn, 5000, 1000, &p);
        pairs.push((a, b));
    }
    net.set_budget(a_ip, budget);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mut mrs = Vec::new();
    for (i, (a, b)) in pairs.iter().enumerate() {
        let src = a.keys.register_zeroed(1, LEN, all).unwrap();
        let dst = b.keys.register_zeroed(1, LEN * MSGS as usize, all).unwrap();
        src.write(0, &vec![i as u8 + 1; LEN]).unwrap();
        for m in 0..MSGS {
            let mut w = signaled_wr(m, WrOpcode::RdmaWrite, &[sge(&src, 0, LEN as u32)]);
            w.remote_addr = dst.iova() + m * LEN as u64;
            w.rkey = dst.rkey();
            a.sq.post(w).unwrap();
        }
        mrs.push((src, dst));
    }
    let mut peak = 0;
    let mut done = 0;
    let ok = net.run_until(10_000_000_000, |n| {
        peak = peak.max(n.inflight(a_ip));
        for (a, _) in &pairs {
            while let Some(wc) = a.send_cq.poll_one() {
                assert_eq!(wc.status, WcStatus::Success);
                done += 1;
            }
        }
        done == QPS as u64 * MSGS
    });
    assert!(ok, "{done} of {} WRITEs completed", QPS as u64 * MSGS);
    for (i, (_, dst)) in mrs.iter().enumerate() {
        let mut got = vec![0u8; LEN * MSGS as usize];
        dst.read(0, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == i as u8 + 1), "QP {i}'s data");
    }
    assert_eq!(net.inflight(a_ip), 0);
    peak
}

/// With a budget of 64 PSNs, 32 QPs that could each have 64 in flight
/// keep at most the budget plus one first packet per QP in flight, and
/// every WRITE completes; with the budget lifted they go far past it.
#[test]
fn qps_share_the_device_in_flight_budget() {
    let tight = run(64);
    assert!(tight <= 64 + QPS, "peak {tight} with a budget of 64");
    let free = run(u32::MAX);
    assert!(free > 4 * (64 + QPS), "peak {free} without a budget");
}
