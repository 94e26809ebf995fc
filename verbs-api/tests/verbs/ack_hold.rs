//! An RC ping-pong driven by polling applications sends each message's ACK
//! together with the answer, in one system call.
//!
//! Each side polls its receive CQ and then its send CQ, as UCX's rc_verbs
//! does (and so Open MPI and MPICH over it). The ACK of a received SEND
//! used to go out on the application's next empty poll, or on the engine
//! thread, in a system call of its own, just before the answer: two
//! `sendmmsg` per message where UD needs one, the peer's engine woken for
//! a lone ACK, and 42-45 µs per MPI message over rc_verbs against 13.5 µs
//! over ud_verbs. Now the pass that received the SEND holds its ACK back
//! (`ACK_HOLD_NS`) and the answering post carries it.

use std::time::{Duration, Instant};
use uroce_verbs::*;

const ROUNDS: u64 = 2000;
const T: Duration = Duration::from_secs(30);

struct Side {
    ctx: Context,
    _pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

fn side(ip: &str) -> Side {
    let ctx = Device::new("t", ip.parse().unwrap())
        .open()
        .expect("open device");
    let pd = ctx.alloc_pd().unwrap();
    let scq = ctx.create_cq(256).unwrap();
    let rcq = ctx.create_cq(256).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &scq,
            recv_cq: &rcq,
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let mr = pd
        .alloc_mr(2 * 64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    Side {
        ctx,
        _pd: pd,
        scq,
        rcq,
        qp,
        mr,
    }
}

fn post_recv(s: &Side) {
    s.qp.post_recv(&[RecvWr {
        wr_id: 0,
        sg_list: [s.mr.sge(64, 64)].into_iter().collect(),
    }])
    .unwrap();
}

/// Sends message `i` (8 bytes naming it), signaled every 16th so that the
/// send queue drains.
fn send(s: &Side, i: u64) {
    s.mr.write(0, &i.to_le_bytes()).unwrap();
    let mut w = SendWr::new(i, WrOpcode::Send);
    w.flags = if i % 16 == 0 {
        SendFlags::SIGNALED
    } else {
        SendFlags::empty()
    };
    w.sg_list = [s.mr.sge(0, 8)].into_iter().collect();
    s.qp.post_send(&[w]).unwrap();
}

/// Waits for message `i` as UCX does: the receive CQ, then the send CQ.
fn recv(s: &Side, i: u64) {
    let mut wc = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
    let t0 = Instant::now();
    loop {
        if s.rcq.poll(&mut wc).unwrap() > 0 {
            assert_eq!(wc[0].status, WcStatus::Success, "message {i}");
            let got = u64::from_le_bytes(s.mr.to_vec(64, 8).unwrap().try_into().unwrap());
            assert_eq!(got, i, "message {i}: wrong data");
            post_recv(s);
            return;
        }
        let n = s.scq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(w.status, WcStatus::Success, "send completion");
        }
        assert!(t0.elapsed() < T, "message {i} never arrived");
    }
}

#[test]
fn a_ping_pongs_acks_ride_with_the_answers() {
    let (a_ip, b_ip) = ("127.104.50.1", "127.104.50.2");
    let a = side(a_ip);
    let b = side(b_ip);
    let p = loopback::RcParams {
        mtu: Mtu::Mtu1024,
        rd_atomic: 1,
        timeout: 14,
    };
    loopback::connect_rc(&a.qp, b_ip.parse().unwrap(), b.qp.qp_num(), 100, 5000, p).unwrap();
    loopback::connect_rc(&b.qp, a_ip.parse().unwrap(), a.qp.qp_num(), 5000, 100, p).unwrap();
    for s in [&a, &b] {
        for _ in 0..8 {
            post_recv(s);
        }
    }
    let before = (a.ctx.counters(), b.ctx.counters());
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..ROUNDS {
                recv(&b, i);
                send(&b, i);
            }
        });
        for i in 0..ROUNDS {
            send(&a, i);
            recv(&a, i);
        }
    });
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    let calls = |after: &CounterSnapshot, before: &CounterSnapshot| {
        (after.tx_syscalls - before.tx_syscalls) as f64 / ROUNDS as f64
    };
    let (ka, kb) = (calls(&ca, &before.0), calls(&cb, &before.1));
    eprintln!("sendmmsg calls per message: initiator {ka:.2}, responder {kb:.2}");
    // One sendmmsg per message when each ACK rides with the answer; two
    // when ACKs go on their own. A late answer (the machine busy for more
    // than the hold) costs one more now and then: allow a third of them.
    assert!(
        ka < 1.34 && kb < 1.34,
        "sendmmsg calls per message: initiator {ka:.2}, responder {kb:.2}"
    );
}
