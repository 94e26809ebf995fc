//! The verbs checker (`UROCE_CHECK`, here turned on by
//! `provider::check::enable`) through the Rust API: each planted mistake
//! is reported once, and the same traffic done right is not (one test:
//! the report count is the process's); a report shows the caller's frames.

use std::time::{Duration, Instant};
use uroce_provider::check::{self, Category};
use uroce_verbs::*;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

struct End {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn end(ip: &str, depth: u32) -> End {
    let ctx = Device::new("t", ip.parse().unwrap()).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
    }
}

fn pair(a_ip: &str, b_ip: &str) -> (End, End) {
    let (a, b) = (end(a_ip, 8), end(b_ip, 8));
    let connect = uroce_verbs::loopback::connect_rc;
    let p = uroce_verbs::loopback::RcParams::default();
    connect(&a.qp, b_ip.parse().unwrap(), b.qp.qp_num(), 1, 2, p).unwrap();
    connect(&b.qp, a_ip.parse().unwrap(), a.qp.qp_num(), 2, 1, p).unwrap();
    (a, b)
}

fn wait(cq: &CompletionQueue) -> Wc {
    let stop = Instant::now() + Duration::from_secs(10);
    let mut wc = [Wc::new(0, WcStatus::GeneralErr, WcOpcode::Send, 0)];
    while Instant::now() < stop {
        if cq.poll(&mut wc).unwrap() == 1 {
            return wc[0];
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    panic!("no completion");
}

fn send(id: u64, op: WrOpcode, sge: Sge, signaled: bool) -> SendWr {
    let mut w = SendWr::new(id, op);
    if signaled {
        w.flags = SendFlags::SIGNALED;
    }
    w.sg_list.push(sge);
    w
}

fn recv(id: u64, sge: Sge) -> RecvWr {
    let mut r = RecvWr {
        wr_id: id,
        ..RecvWr::default()
    };
    r.sg_list.push(sge);
    r
}

#[inline(never)]
fn the_application_call() -> check::Caller {
    let c = check::Caller::here();
    std::hint::black_box(&c);
    c
}

#[test]
fn a_report_shows_the_callers_frames_only() {
    let frames = the_application_call().frames();
    // Neither the backtrace machinery's frames nor uroce's, and the
    // listing stops at the runtime (here the test harness) under the
    // test's own frames.
    let first = frames.first().expect("a frame");
    assert!(
        first.starts_with("check::the_application_call"),
        "{frames:?}"
    );
    assert!(frames.iter().all(|f| !f.contains("std::")), "{frames:?}");
    assert!(frames.len() <= 3, "{frames:?}");
}

#[test]
fn planted_mistakes_are_reported_once_and_clean_traffic_not() {
    check::enable(Category::ALL.iter().fold(0, |m, c| m | *c as u32));
    let (a, b) = pair("127.117.2.1", "127.117.2.2");
    let src = a.pd.alloc_mr(4096, ALL).unwrap();
    let dst = b.pd.alloc_mr(4096, ALL).unwrap();
    let base = check::reports();

    // A SEND whose buffer changes while it waits for a receive WR (RNR
    // NAKs, retried) is reported when it completes.
    a.qp.post_send(&[send(1, WrOpcode::Send, src.sge(0, 512), true)])
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    src.write(10, b"changed").unwrap();
    b.qp.post_recv(&[recv(1, dst.sge(0, 512))]).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    assert_eq!(check::reports(), base + 1, "the changed buffer");

    // Clean: the buffer changes after the completion.
    b.qp.post_recv(&[recv(2, dst.sge(0, 512))]).unwrap();
    a.qp.post_send(&[send(2, WrOpcode::Send, src.sge(0, 512), true)])
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    src.write(10, b"again").unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    // Clean: a signaled WRITE every 4, its completion polled.
    let remote = |mut w: SendWr| {
        w.remote_addr = dst.addr();
        w.rkey = dst.rkey();
        w
    };
    for i in 0..24 {
        let last = i % 4 == 3;
        let w = remote(send(10 + i, WrOpcode::RdmaWrite, src.sge(0, 64), last));
        a.qp.post_send(&[w]).unwrap();
        if last {
            assert_eq!(wait(&a.cq).status, WcStatus::Success);
        }
    }
    assert_eq!(check::reports(), base + 1, "clean traffic draws no report");

    // Twelve unsignaled WRITEs on a queue of 8, none reaped: uroce takes
    // them all, a NIC refuses the ninth; reported once.
    for i in 0..12 {
        let w = remote(send(100 + i, WrOpcode::RdmaWrite, src.sge(0, 64), false));
        a.qp.post_send(&[w]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(check::reports(), base + 2, "the send queue overrun");
    let w = remote(send(200, WrOpcode::RdmaWrite, src.sge(0, 64), true));
    a.qp.post_send(&[w]).unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);

    // A region deregistered under a SEND still outstanding.
    let other = a.pd.alloc_mr(4096, ALL).unwrap();
    a.qp.post_send(&[send(300, WrOpcode::Send, other.sge(0, 64), true)])
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    other.dereg();
    assert_eq!(check::reports(), base + 3, "the deregistration");
    b.qp.post_recv(&[recv(3, dst.sge(0, 512))]).unwrap();
    // (It fails: its region is gone; receive 3 waits on.)
    wait(&a.cq);

    // A region deregistered while a receive WR posted to it waits: a
    // message completing into it is reported (one that never comes, as
    // when the QP is destroyed first, would not be).
    let (c, d) = pair("127.117.2.3", "127.117.2.4");
    let (csrc, rbuf) = (
        c.pd.alloc_mr(4096, ALL).unwrap(),
        d.pd.alloc_mr(4096, ALL).unwrap(),
    );
    d.qp.post_recv(&[recv(4, rbuf.sge(0, 512))]).unwrap();
    rbuf.dereg();
    assert_eq!(check::reports(), base + 3, "not yet: no message came");
    c.qp.post_send(&[send(5, WrOpcode::Send, csrc.sge(0, 64), true)])
        .unwrap();
    assert_ne!(wait(&d.cq).status, WcStatus::Success);
    assert_eq!(
        check::reports(),
        base + 4,
        "the receive into a deregistered region"
    );

    // A receive WR's buffer written by the program before a message
    // arrives into it (the message overwrites it): reported when the
    // engine places the message.
    let (e, f) = pair("127.121.2.1", "127.121.2.2");
    let (esrc, fbuf) = (
        e.pd.alloc_mr(4096, ALL).unwrap(),
        f.pd.alloc_mr(4096, ALL).unwrap(),
    );
    f.qp.post_recv(&[recv(6, fbuf.sge(0, 512))]).unwrap();
    fbuf.write(5, b"mine").unwrap();
    e.qp.post_send(&[send(7, WrOpcode::Send, esrc.sge(0, 512), true)])
        .unwrap();
    assert_eq!(wait(&f.cq).status, WcStatus::Success);
    assert_eq!(wait(&e.cq).status, WcStatus::Success);
    assert_eq!(check::reports(), base + 5, "the receive buffer written");

    // Clean: receive WRs sharing one buffer, which the engine writes
    // for each message; the program writes it only after they complete.
    // And a READ whose target changes after its completion.
    f.qp.post_recv(&[recv(8, fbuf.sge(1024, 512)), recv(9, fbuf.sge(1024, 512))])
        .unwrap();
    for i in 0..2 {
        esrc.write(0, &[b'a' + i as u8; 512]).unwrap();
        e.qp.post_send(&[send(10 + i, WrOpcode::Send, esrc.sge(0, 512), true)])
            .unwrap();
        assert_eq!(wait(&e.cq).status, WcStatus::Success);
        assert_eq!(wait(&f.cq).status, WcStatus::Success);
    }
    fbuf.write(1024, b"after").unwrap();
    let mut r = send(12, WrOpcode::RdmaRead, esrc.sge(2048, 512), true);
    r.remote_addr = fbuf.addr();
    r.rkey = fbuf.rkey();
    e.qp.post_send(&[r]).unwrap();
    assert_eq!(wait(&e.cq).status, WcStatus::Success);
    esrc.write(2048, b"after").unwrap();
    assert_eq!(check::reports(), base + 5, "clean traffic draws no report");
}
