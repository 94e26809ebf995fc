//! Errors that explain themselves, through the Rust API over real UDP
//! between two devices on loopback addresses (127.118.4.x): a READ beyond
//! the peer's region completes with REM_ACCESS_ERR, and both QPs say which
//! check failed (`QueuePair::last_error`, `QueuePair::error_cause`).

use std::time::Duration;
use uroce_verbs::*;

use crate::common;

const T: Duration = Duration::from_secs(20);

fn end(ip: &str) -> (Context, ProtectionDomain, CompletionQueue, QueuePair) {
    common::end(ip, QpType::Rc, 16, 0)
}

#[test]
fn a_read_beyond_the_region_is_explained_on_both_sides() {
    let (ai, bi) = ("127.118.4.1", "127.118.4.2");
    let (_ca, pa, cqa, a) = end(ai);
    let (_cb, pb, _cqb, b) = end(bi);
    let p = loopback::RcParams {
        mtu: Mtu::Mtu1024,
        rd_atomic: 1,
        timeout: 14,
    };
    loopback::connect_rc(&a, bi.parse().unwrap(), b.qp_num(), 7, 9, p).unwrap();
    loopback::connect_rc(&b, ai.parse().unwrap(), a.qp_num(), 9, 7, p).unwrap();
    assert!(a.last_error().is_none());
    let dst = pa.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let src = pb
        .alloc_mr(1024, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let mut w = SendWr::new(5, WrOpcode::RdmaRead);
    w.flags = SendFlags::SIGNALED;
    w.sg_list.push(dst.sge(0, 2048));
    w.remote_addr = src.addr();
    w.rkey = src.rkey();
    a.post_send(&[w]).map_err(|e| e.1).unwrap();
    let wc = cqa.wait(1, T);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    let e = a.last_error().expect("explained").to_string();
    assert!(
        e.contains(&format!(
            "IBV_WC_REM_ACCESS_ERR (requester): peer {bi} QP {:#08x} sent NAK remote access error (syndrome 0x62)",
            b.qp_num()
        )),
        "{e}"
    );
    assert!(e.contains("RdmaRead"), "{e}");
    // The responder's explanation is written by its engine thread.
    let end = std::time::Instant::now() + T;
    while b.error_cause().is_none() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = b
        .error_cause()
        .expect("the responder explained")
        .to_string();
    let want = format!(
        "RC_RDMA_READ_REQUEST PSN 0x000007: R_Key check: rkey {:#x} va {:#x} len 2048 needs REMOTE_READ: the range is outside the region [{:#x}, {:#x}) (1024 bytes, PD",
        src.rkey(),
        src.addr(),
        src.addr(),
        src.addr() + 1024
    );
    assert!(e.contains(&want), "{e}\nwanted: {want}");
}
