//! Many active QPs: a 2-byte SEND/RECV ping-pong that goes round-robin
//! over N connected RC QP pairs, against the same ping-pong on one pair.
//!
//! Two loopback devices in one process, A (127.90.200.1) and B
//! (127.90.200.2; the second octet from UROCE_QP_SCALE_NET), one CQ each (sends and receives; sized for every QP's
//! pre-posted receive and a full send queue on every QP), every QP with one
//! receive posted. Message m goes on pair i = m mod N: A posts a signaled
//! 2-byte SEND on its QP i; B sees the receive completion, reposts the
//! receive and answers with a SEND on its QP i; A waits for that receive
//! completion (and reposts). Send completions are drained as they come. A
//! single thread drives both sides, polling A's CQ, then B's, in turn (an
//! empty poll makes progress on that device from this thread, as an
//! application's does): deterministic, and it fits a 2-core machine.
//!
//! Time per round trip = elapsed / messages, over a time-bounded run of
//! whole rounds (every pair the same number of times) after a warm-up that
//! touches every pair. Three runs:
//!   * 1 QP: one pair, alone on the devices (the yardstick);
//!   * N QPs: N pairs (N = 1000), round-robin;
//!   * 1 QP of N: pair 0 alone again, with the other N - 1 connected and
//!     idle (what the idle pairs cost, as opposed to the round-robin).
//!
//! The last line is what benches/perftest.sh parses:
//! `qp_scale: 1 QP 12.3 us/round trip, 1000 QPs 13.1 us/round trip, ratio 1.07x (target <= 1.5x)`
//!
//! Environment: UROCE_QP_SCALE_SECS (default 2) seconds per run,
//! UROCE_QP_SCALE_QPS (default 1000) pairs, UROCE_QP_SCALE_NET (default
//! 90) the addresses' second octet (so that runs side by side do not meet).
//!
//! Run: `cargo bench -p uroce-benches --bench qp_scale`.

use std::net::IpAddr;
use std::time::{Duration, Instant};
use uroce_benches::rc::{connect, ALL};
use uroce_verbs::*;

/// The message size.
const MSG: usize = 2;
/// Send queue depth of every QP.
const SQ: u32 = 32;
/// A round trip that takes longer than this is a failure.
const STUCK: Duration = Duration::from_secs(20);

/// One side: a device, a PD, one CQ, a buffer (a receive slot per QP, then
/// the bytes it sends) and its QPs.
struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    mr: MemoryRegion,
    qps: Vec<QueuePair>,
    /// Signaled SENDs not completed yet, per QP.
    sq_out: Vec<u32>,
    name: &'static str,
    /// The device's address.
    ip: IpAddr,
}

impl Side {
    fn open(name: &'static str, ip: &str, max_qps: usize) -> Side {
        let ip: IpAddr = ip.parse().unwrap();
        let ctx = Device::new(name, ip).open().expect("open device");
        let pd = ctx.alloc_pd().unwrap();
        // Every QP's receive and a full send queue on every QP.
        let cqe = (max_qps * (SQ as usize + 1) + 64) as u32;
        let cq = ctx.create_cq(cqe).unwrap();
        let mr = pd.alloc_mr((max_qps + 1) * MSG, ALL).unwrap();
        mr.write(max_qps * MSG, &[0x5a; MSG]).unwrap();
        Side {
            ctx,
            pd,
            cq,
            mr,
            qps: Vec::new(),
            sq_out: Vec::new(),
            name,
            ip,
        }
    }

    fn new_qp(&mut self) -> &QueuePair {
        let qp = self
            .pd
            .create_qp(&QpInitAttr {
                send_cq: &self.cq,
                recv_cq: &self.cq,
                cap: QpCap {
                    max_send_wr: SQ,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        self.qps.push(qp);
        self.sq_out.push(0);
        self.qps.last().unwrap()
    }

    fn post_recv(&self, i: usize) {
        self.qps[i]
            .post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: [self.mr.sge(i * MSG, MSG as u32)].into_iter().collect(),
            }])
            .map_err(|e| e.1)
            .unwrap();
    }

    fn post_send(&mut self, i: usize) {
        let mut w = SendWr::new(i as u64, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(self.mr.sge(self.mr.len() - MSG, MSG as u32));
        self.qps[i].post_send(&[w]).map_err(|e| e.1).unwrap();
        self.sq_out[i] += 1;
    }

    /// One poll: a completion, or (when there is none) progress on the
    /// device from this thread. Send completions are counted off here;
    /// returns the QP index of a receive completion (reposted).
    fn poll(&mut self) -> Option<usize> {
        let Some(wc) = self.cq.poll_one() else {
            assert!(!self.cq.overflowed(), "{}: CQ overflowed", self.name);
            self.cq.progress();
            return None;
        };
        assert_eq!(
            wc.status,
            WcStatus::Success,
            "{}: {wc:?}; counters {:?}",
            self.name,
            self.ctx.counters()
        );
        let i = wc.wr_id as usize;
        match wc.opcode {
            WcOpcode::Recv => {
                self.post_recv(i);
                Some(i)
            }
            _ => {
                self.sq_out[i] -= 1;
                None
            }
        }
    }
}

/// Connects one more pair and posts its receives.
fn add_pair(a: &mut Side, b: &mut Side) {
    let k = a.qps.len() as u32;
    let (ai, bi) = (a.ip, b.ip);
    let qa = a.new_qp();
    let qb = b.new_qp();
    connect(qa, ai, qb, bi, 0x1000 + k, 0x80_0000 + k);
    a.post_recv(a.qps.len() - 1);
    b.post_recv(b.qps.len() - 1);
}

/// One round trip on pair i.
fn round_trip(a: &mut Side, b: &mut Side, i: usize) {
    let start = Instant::now();
    while a.sq_out[i] >= SQ {
        a.poll();
        if let Some(j) = b.poll() {
            panic!("B received on QP {j} with nothing in flight");
        }
        assert!(start.elapsed() < STUCK, "A's send queue {i} stays full");
    }
    a.post_send(i);
    loop {
        if let Some(j) = b.poll() {
            assert_eq!(j, i, "B received on the wrong QP");
            while b.sq_out[j] >= SQ {
                b.poll();
                assert!(a.poll().is_none(), "A received before B answered");
                assert!(start.elapsed() < STUCK, "B's send queue {j} stays full");
            }
            b.post_send(j);
        }
        if let Some(j) = a.poll() {
            assert_eq!(j, i, "A received on the wrong QP");
            return;
        }
        assert!(
            start.elapsed() < STUCK,
            "round trip on pair {i} took over {STUCK:?}; A {:?}, B {:?}",
            a.ctx.counters(),
            b.ctx.counters()
        );
    }
}

/// Round-robin over pairs 0..n: whole rounds for at least `secs` seconds
/// after a warm-up; returns (round trips, time per round trip).
fn run(a: &mut Side, b: &mut Side, n: usize, secs: f64) -> (u64, Duration) {
    // Warm-up: every pair a few times, and at least 0.3 s.
    let t = Instant::now();
    let mut k = 0usize;
    while k < 4 * n || t.elapsed() < Duration::from_millis(300) {
        round_trip(a, b, k % n);
        k += 1;
    }
    let t = Instant::now();
    let mut msgs = 0u64;
    loop {
        for i in 0..n {
            round_trip(a, b, i);
        }
        msgs += n as u64;
        if t.elapsed().as_secs_f64() >= secs && msgs >= 1000 {
            break;
        }
    }
    (msgs, t.elapsed() / msgs as u32)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let secs: f64 = std::env::var("UROCE_QP_SCALE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s: &f64| s > 0.0)
        .unwrap_or(2.0);
    let n: usize = std::env::var("UROCE_QP_SCALE_QPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(1000);
    let net: u8 = std::env::var("UROCE_QP_SCALE_NET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90);
    let (a_ip, b_ip) = (format!("127.{net}.200.1"), format!("127.{net}.200.2"));
    let mut a = Side::open("qpsA", &a_ip, n);
    let mut b = Side::open("qpsB", &b_ip, n);
    println!(
        "qp_scale: {MSG} B SEND/RECV round trips, round-robin over RC QP pairs between \
         {a_ip} and {b_ip}, one thread polling both sides, {secs} s per run"
    );

    add_pair(&mut a, &mut b);
    let (m1, one) = run(&mut a, &mut b, 1, secs);
    println!("  1 QP: {m1} round trips, {:.2} us each", us(one));

    let t = Instant::now();
    while a.qps.len() < n {
        add_pair(&mut a, &mut b);
    }
    println!(
        "  connected {} more pairs in {:.2} s",
        n - 1,
        t.elapsed().as_secs_f64()
    );
    let (mn, many) = run(&mut a, &mut b, n, secs);
    println!(
        "  {n} QPs round-robin: {mn} round trips, {:.2} us each",
        us(many)
    );
    let (mi, idle) = run(&mut a, &mut b, 1, secs);
    println!(
        "  1 QP of {n} (the others idle): {mi} round trips, {:.2} us each ({:.2}x the 1-QP figure)",
        us(idle),
        idle.as_secs_f64() / one.as_secs_f64()
    );
    let ca = a.ctx.counters();
    let cb = b.ctx.counters();
    println!(
        "  retransmits A {} B {}, dropped packets A {} B {}",
        ca.retransmits, cb.retransmits, ca.dropped_pkts, cb.dropped_pkts
    );
    let ratio = many.as_secs_f64() / one.as_secs_f64();
    println!(
        "qp_scale: 1 QP {:.2} us/round trip, {n} QPs {:.2} us/round trip, ratio {ratio:.2}x (target <= 1.5x)",
        us(one),
        us(many)
    );
}
