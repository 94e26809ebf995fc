//! Completion timestamps (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) over real
//! UDP between two devices on loopback addresses (127.103.2.x): taken
//! when the engine generates a completion, not when it is polled.

use std::time::Duration;
use uroce_verbs::*;

use crate::common::{open, qp, recv, T};

#[test]
fn completions_are_stamped_when_generated() {
    let (ca, cb) = (open("127.103.2.1"), open("127.103.2.2"));
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(16).unwrap(), cb.create_cq(16).unwrap());
    let (a, b) = (
        qp(&pa, &qa_cq, QpType::Rc, None),
        qp(&pb, &qb_cq, QpType::Rc, None),
    );
    let (ea, eb) = (a.endpoint(), b.endpoint());
    a.connect_with(&eb, &ConnectOptions::default()).unwrap();
    b.connect_with(&ea, &ConnectOptions::default()).unwrap();
    let src = pa.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(64, Access::LOCAL_WRITE).unwrap();

    // Not asked for: 0.
    b.post_recv(&[recv(1, &dst, 0, 64)]).unwrap();
    let mut s = SendWr::new(1, WrOpcode::Send);
    s.flags = SendFlags::SIGNALED;
    s.sg_list.push(src.sge(0, 8));
    a.post_send(std::slice::from_ref(&s)).unwrap();
    assert_eq!(qa_cq.wait(1, T)[0].timestamp, 0);
    assert_eq!(qb_cq.wait(1, T)[0].timestamp, 0);

    qa_cq.stamp_completions();
    qb_cq.stamp_completions();
    b.post_recv(&[recv(2, &dst, 0, 64)]).unwrap();
    let before = completion_clock_ns();
    a.post_send(&[s]).unwrap();
    // Both completions are generated while the test sleeps; polled after.
    let deadline = std::time::Instant::now() + T;
    while (qa_cq.pending() < 1 || qb_cq.pending() < 1) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let generated = completion_clock_ns();
    std::thread::sleep(Duration::from_millis(50));
    let (sa, rb) = (qa_cq.wait(1, T)[0], qb_cq.wait(1, T)[0]);
    for w in [sa, rb] {
        assert_eq!(w.status, WcStatus::Success);
        assert!(
            (before..=generated).contains(&w.timestamp),
            "{before} <= {} <= {generated}",
            w.timestamp
        );
    }
    // The receive completes after the send was posted, and the wall clock
    // names the same moment.
    let wall = completion_wallclock_ns(rb.timestamp);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let ago = now - wall;
    assert!(
        (50_000_000..10_000_000_000).contains(&ago),
        "generated {ago} ns ago"
    );
}
