//! RDMA ATOMIC WRITE and FLUSH (IBA 1.5) over real UDP between two devices
//! on loopback addresses (127.86.x): what they do, and the status each
//! refusal completes with (as kernel rxe answers them).

use std::time::Duration;
use uroce_verbs::wire::feth::{FLUSH_GLOBAL, FLUSH_MR, FLUSH_PERSISTENT, FLUSH_RANGE};
use uroce_verbs::*;

use crate::common;

const T: Duration = Duration::from_secs(20);
const BASE: Access = common::ALL;

struct End {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn end(ip: &str, t: QpType) -> End {
    let (ctx, pd, cq, qp) = common::end(ip, t, 32, 64);
    End { ctx, pd, cq, qp }
}

/// A connected RC pair; `b` allows `b_access` remotely and offers
/// `rd_atomic` responder resources.
fn pair(n: u8, b_access: Access, rd_atomic: u8) -> (End, End) {
    let (ai, bi) = (format!("127.86.{n}.1"), format!("127.86.{n}.2"));
    let (a, b) = (end(&ai, QpType::Rc), end(&bi, QpType::Rc));
    let o = |access| ConnectOptions {
        access,
        max_rd_atomic: rd_atomic,
        max_dest_rd_atomic: rd_atomic,
        ..ConnectOptions::default()
    };
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    a.qp.connect_with(&eb, &o(BASE)).unwrap();
    b.qp.connect_with(&ea, &o(b_access)).unwrap();
    (a, b)
}

fn post(e: &End, wr: SendWr) -> Wc {
    e.qp.post_send(&[wr]).unwrap();
    let w = e.cq.wait(1, T);
    assert_eq!(w.len(), 1, "no completion within {T:?}");
    w[0]
}

const FLUSHABLE: Access = BASE.union(Access::FLUSH_GLOBAL);

#[test]
fn atomic_write_lands_as_sent() {
    let (a, b) = pair(1, BASE, 4);
    let mr = b.pd.alloc_mr(64, BASE).unwrap();
    let bytes = [1, 2, 3, 4, 5, 6, 7, 8];
    let wc = post(
        &a,
        SendWr::atomic_write(1, mr.addr() + 16, mr.rkey(), bytes),
    );
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::AtomicWrite, 8)
    );
    assert_eq!(mr.to_vec(16, 8).unwrap(), bytes);
    assert_eq!(mr.to_vec(8, 8).unwrap(), [0; 8]);
    assert_eq!(mr.to_vec(24, 8).unwrap(), [0; 8]);
    // A READ after it sees it (the responder executes in order).
    let local = a.pd.alloc_mr(8, BASE).unwrap();
    let mut r = SendWr::new(2, WrOpcode::RdmaRead);
    r.flags = SendFlags::SIGNALED;
    r.sg_list.push(local.sge(0, 8));
    r.remote_addr = mr.addr() + 16;
    r.rkey = mr.rkey();
    assert_eq!(post(&a, r).status, WcStatus::Success);
    assert_eq!(local.to_vec(0, 8).unwrap(), bytes);
}

#[test]
fn atomic_write_refusals() {
    // Misaligned: invalid request.
    let (a, b) = pair(2, BASE, 4);
    let mr = b.pd.alloc_mr(64, BASE).unwrap();
    let wc = post(
        &a,
        SendWr::atomic_write(1, mr.addr() + 4, mr.rkey(), [9; 8]),
    );
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert_eq!(mr.to_vec(0, 16).unwrap(), [0; 16]);

    // A region without remote write: remote access error.
    let (a, b) = pair(3, BASE, 4);
    let ro =
        b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let wc = post(&a, SendWr::atomic_write(1, ro.addr(), ro.rkey(), [9; 8]));
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    // A QP without remote write: invalid request.
    let (a, b) = pair(4, Access::LOCAL_WRITE | Access::REMOTE_READ, 4);
    let mr = b.pd.alloc_mr(64, BASE).unwrap();
    let wc = post(&a, SendWr::atomic_write(1, mr.addr(), mr.rkey(), [9; 8]));
    assert_eq!(wc.status, WcStatus::RemInvReqErr);

    // No responder resources: invalid request.
    let (a, b) = pair(5, BASE, 0);
    let mr = b.pd.alloc_mr(64, BASE).unwrap();
    let wc = post(&a, SendWr::atomic_write(1, mr.addr(), mr.rkey(), [9; 8]));
    assert_eq!(wc.status, WcStatus::RemInvReqErr);

    // Not 8 bytes: a local length error, nothing sent.
    let (a, _b) = pair(6, BASE, 4);
    let mut w = SendWr::atomic_write(1, 0, 0, [0; 8]);
    w.inline_data.pop();
    assert_eq!(post(&a, w).status, WcStatus::LocLenErr);
}

#[test]
fn flush_range_and_region() {
    let (a, b) = pair(7, FLUSHABLE, 4);
    let mr = b.pd.alloc_mr(4096, FLUSHABLE).unwrap();
    for (id, level, addr, len) in [
        (1, FLUSH_RANGE, mr.addr() + 100, 200),
        (2, FLUSH_RANGE, mr.addr() + 4096, 0), // empty, at the end
        (3, FLUSH_MR, 0, 0),                   // the whole region
    ] {
        let wc = post(
            &a,
            SendWr::flush(id, addr, mr.rkey(), len, FLUSH_GLOBAL, level),
        );
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (id, WcStatus::Success, WcOpcode::Flush, len),
        );
    }
    // WRITE then FLUSH: the FLUSH completes after the WRITE's data is in.
    let src = a.pd.alloc_mr(64, BASE).unwrap();
    src.write(0, b"flushed").unwrap();
    let mut w = SendWr::new(4, WrOpcode::RdmaWrite);
    w.sg_list.push(src.sge(0, 7));
    w.remote_addr = mr.addr();
    w.rkey = mr.rkey();
    a.qp.post_send(&[w]).unwrap();
    let wc = post(
        &a,
        SendWr::flush(5, mr.addr(), mr.rkey(), 7, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    assert_eq!((wc.wr_id, wc.status), (5, WcStatus::Success));
    assert_eq!(mr.to_vec(0, 7).unwrap(), b"flushed");
}

#[test]
fn flush_refusals() {
    // The QP does not allow FLUSH: invalid request.
    let (a, b) = pair(8, BASE, 4);
    let mr = b.pd.alloc_mr(64, FLUSHABLE).unwrap();
    let wc = post(
        &a,
        SendWr::flush(1, mr.addr(), mr.rkey(), 8, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    assert_eq!(wc.status, WcStatus::RemInvReqErr);

    // The region does not: remote access error.
    let (a, b) = pair(9, FLUSHABLE, 4);
    let mr = b.pd.alloc_mr(64, BASE).unwrap();
    let wc = post(
        &a,
        SendWr::flush(1, mr.addr(), mr.rkey(), 8, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    // Past the region's end: remote access error.
    let (a, b) = pair(10, FLUSHABLE, 4);
    let mr = b.pd.alloc_mr(64, FLUSHABLE).unwrap();
    let wc = post(
        &a,
        SendWr::flush(1, mr.addr() + 60, mr.rkey(), 8, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    // An empty range still needs a valid R_Key.
    let (a, b) = pair(11, FLUSHABLE, 4);
    let mr = b.pd.alloc_mr(64, FLUSHABLE).unwrap();
    let wc = post(
        &a,
        SendWr::flush(1, mr.addr(), mr.rkey() ^ 1, 0, FLUSH_GLOBAL, FLUSH_RANGE),
    );
    assert_eq!(wc.status, WcStatus::RemAccessErr);

    // Persistence: the QP cannot offer it (no persistent memory).
    let (a, b) = pair(12, FLUSHABLE, 4);
    let mr = b.pd.alloc_mr(64, FLUSHABLE).unwrap();
    let wc = post(
        &a,
        SendWr::flush(1, mr.addr(), mr.rkey(), 8, FLUSH_PERSISTENT, FLUSH_RANGE),
    );
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert!(matches!(
        b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::FLUSH_PERSISTENT),
        Err(Error::NotSupported(_))
    ));
    drop(b.ctx);
}

#[test]
fn rc_only() {
    // UC has neither (IBA 1.5: RC, RD and XRC): refused at post time.
    let a = end("127.86.13.1", QpType::Uc);
    let b = end("127.86.13.2", QpType::Uc);
    a.qp.connect(&b.qp.endpoint()).unwrap();
    for wr in [
        SendWr::atomic_write(1, 0, 0, [0; 8]),
        SendWr::flush(2, 0, 0, 0, FLUSH_GLOBAL, FLUSH_RANGE),
    ] {
        assert!(matches!(a.qp.post_send(&[wr]), Err((0, Error::Invalid(_)))));
    }
}
