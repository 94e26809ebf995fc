//! Memory windows (type 1 and 2), re-registration and CQ resizing over
//! real UDP between two devices on loopback addresses (127.81.x): what a
//! window grants, what it refuses and with which status, and what a peer
//! sees after invalidation, deallocation or re-registration.

use std::time::Duration;
use uroce_verbs::*;

use crate::common::{open, qp};

const T: Duration = Duration::from_secs(20);
const LEN: usize = 4096;

struct End {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// LOCAL_WRITE | MW_BIND, no remote access of its own: peers reach it
    /// only through windows.
    mr: MemoryRegion,
}

fn end(ip: &str) -> End {
    let ctx = open(ip);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = qp(&pd, &cq, QpType::Rc, None);
    let mr = pd
        .alloc_mr(LEN, Access::LOCAL_WRITE | Access::MW_BIND)
        .unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn connect(a: &QueuePair, a_ip: &str, b: &QueuePair, b_ip: &str) {
    let p = uroce_verbs::loopback::RcParams {
        mtu: Mtu::Mtu1024,
        rd_atomic: 4,
        timeout: 14,
    };
    let c = uroce_verbs::loopback::connect_rc;
    c(a, b_ip.parse().unwrap(), b.qp_num(), 100, 5000, p).unwrap();
    c(b, a_ip.parse().unwrap(), a.qp_num(), 5000, 100, p).unwrap();
}

fn pair(n: u8) -> (End, End) {
    let (ai, bi) = (format!("127.81.{n}.1"), format!("127.81.{n}.2"));
    let (a, b) = (end(&ai), end(&bi));
    connect(&a.qp, &ai, &b.qp, &bi);
    (a, b)
}

fn one(cq: &CompletionQueue) -> Wc {
    let w = cq.wait(1, T);
    assert_eq!(w.len(), 1, "no completion within {T:?}");
    w[0]
}

/// An RDMA WRITE of `len` bytes from `src` at offset 0 to `raddr`/`rkey`.
fn write(from: &End, raddr: u64, rkey: u32, len: u32, id: u64) -> Wc {
    let mut wr = SendWr::new(id, WrOpcode::RdmaWrite);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(from.mr.sge(0, len));
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    from.qp.post_send(&[wr]).unwrap();
    one(&from.cq)
}

fn read(from: &End, raddr: u64, rkey: u32, len: u32, id: u64) -> Wc {
    let mut wr = SendWr::new(id, WrOpcode::RdmaRead);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(from.mr.sge(0, len));
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    from.qp.post_send(&[wr]).unwrap();
    one(&from.cq)
}

/// Binds type 1 window `mw` to `range` of `e`'s region with `access`,
/// waits for the bind's completion; returns the window's new key.
fn bind1(e: &End, mw: &MemoryWindow, range: std::ops::Range<usize>, access: Access) -> u32 {
    let k =
        e.qp.bind_mw(mw, Some((&e.mr, range)), access, 1, SendFlags::SIGNALED)
            .unwrap();
    let wc = one(&e.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    k
}

fn post(e: &End, wr: SendWr) -> Wc {
    e.qp.post_send(&[wr]).unwrap();
    one(&e.cq)
}

#[test]
fn type1_bind_grants_exactly_the_window() {
    let (a, b) = pair(1);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let before = mw.rkey();
    let rkey =
        b.qp.bind_mw(
            &mw,
            Some((&b.mr, 1024..1536)),
            Access::REMOTE_WRITE,
            9,
            SendFlags::SIGNALED,
        )
        .unwrap();
    assert_eq!(rkey, inc_rkey(before));
    assert_eq!(mw.rkey(), rkey);
    let wc = one(&b.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (9, WcStatus::Success, WcOpcode::BindMw)
    );
    assert!(mw.is_bound());
    assert_eq!(b.mr.bound_windows(), 1);

    a.mr.write(0, &[0x5a; 512]).unwrap();
    let base = b.mr.addr() + 1024;
    assert_eq!(write(&a, base, rkey, 512, 1).status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(1024, 512).unwrap(), vec![0x5a; 512]);
    assert_eq!(
        b.mr.to_vec(1023, 1).unwrap(),
        [0],
        "nothing before the window"
    );
    assert_eq!(b.mr.to_vec(1536, 1).unwrap(), [0], "nothing after it");

    // The region's own R_Key grants nothing: it has no remote access.
    assert_eq!(
        write(&a, base, b.mr.rkey(), 8, 2).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn type1_refusals_and_unbind() {
    // Past the window's end.
    let (a, b) = pair(2);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bind1(&b, &mw, 0..256, Access::REMOTE_WRITE);
    assert_eq!(
        write(&a, b.mr.addr() + 200, rkey, 64, 1).status,
        WcStatus::RemAccessErr
    );

    // An access the window does not grant (READ).
    let (a, b) = pair(3);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let rkey = bind1(&b, &mw, 0..256, Access::REMOTE_WRITE);
    assert_eq!(
        read(&a, b.mr.addr(), rkey, 8, 1).status,
        WcStatus::RemAccessErr
    );

    // The old key after a rebind, then an unbind (zero length).
    let (a, b) = pair(4);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let k1 = bind1(&b, &mw, 0..256, Access::REMOTE_WRITE);
    let k2 = bind1(&b, &mw, 0..256, Access::REMOTE_WRITE);
    assert_ne!(k1, k2);
    assert_eq!(write(&a, b.mr.addr(), k2, 8, 1).status, WcStatus::Success);
    b.qp.bind_mw(&mw, None, Access::empty(), 3, SendFlags::SIGNALED)
        .unwrap();
    assert_eq!(one(&b.cq).status, WcStatus::Success);
    assert!(!mw.is_bound());
    assert_eq!(b.mr.bound_windows(), 0);
    assert_eq!(
        write(&a, b.mr.addr(), k1, 8, 2).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn bind_errors_complete_with_mw_bind_err() {
    // A region without MW_BIND.
    let (_a, b) = pair(5);
    let plain = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    b.qp.bind_mw(
        &mw,
        Some((&plain, 0..64)),
        Access::REMOTE_READ,
        1,
        SendFlags::SIGNALED,
    )
    .unwrap();
    let wc = one(&b.cq);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::MwBindErr, WcOpcode::BindMw)
    );
    assert_eq!(b.qp.state(), QpState::Err);

    // Remote write through a region without local write (C10-74).
    let (_a, b) = pair(6);
    let ro = b.pd.alloc_mr(64, Access::MW_BIND).unwrap();
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, _) = mw.bind_wr(1, &ro, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::MwBindErr);

    // A type 2 window bound twice (it must be invalidated first).
    let (_a, b) = pair(7);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, _) = mw.bind_wr(1, &b.mr, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    let (wr, _) = mw.bind_wr(2, &b.mr, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::MwBindErr);

    // A window of another PD.
    let (_a, b) = pair(8);
    let other = b._ctx.alloc_pd().unwrap();
    let mw = other.alloc_mw(MwType::Type2).unwrap();
    let (wr, _) = mw.bind_wr(1, &b.mr, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::MwBindErr);

    // LOCAL_INV of a type 1 window's key: a local QP operation error.
    let (_a, b) = pair(9);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let mut inv = SendWr::new(1, WrOpcode::LocalInv);
    inv.flags = SendFlags::SIGNALED;
    inv.invalidate_rkey = mw.rkey();
    assert_eq!(post(&b, inv).status, WcStatus::LocQpOpErr);

    // ibv_bind_mw is for type 1 windows only.
    let (_a, b) = pair(10);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    assert!(b
        .qp
        .bind_mw(
            &mw,
            Some((&b.mr, 0..64)),
            Access::REMOTE_WRITE,
            1,
            SendFlags::SIGNALED
        )
        .is_err());
}

#[test]
fn type2_local_invalidate_and_rebind() {
    let (a, b) = pair(11);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, rkey) = mw.bind_wr(1, &b.mr, 0..128, Access::REMOTE_WRITE | Access::REMOTE_READ);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    b.mr.write(0, b"window").unwrap();
    assert_eq!(read(&a, b.mr.addr(), rkey, 6, 1).status, WcStatus::Success);
    assert_eq!(a.mr.to_vec(0, 6).unwrap(), b"window");

    let mut inv = SendWr::new(2, WrOpcode::LocalInv);
    inv.flags = SendFlags::SIGNALED;
    inv.invalidate_rkey = rkey;
    let wc = post(&b, inv);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert!(!mw.is_bound());

    // Free again: a new bind with the next key works; the old key does not.
    let (wr, new_rkey) = mw.bind_wr(3, &b.mr, 0..128, Access::REMOTE_WRITE);
    assert_eq!(new_rkey, inc_rkey(rkey));
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    assert_eq!(mw.rkey(), new_rkey);
    assert_eq!(
        write(&a, b.mr.addr(), new_rkey, 8, 4).status,
        WcStatus::Success
    );
    assert_eq!(
        write(&a, b.mr.addr(), rkey, 8, 5).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn type2_remote_invalidate_by_send_with_inv() {
    let (a, b) = pair(12);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, rkey) = mw.bind_wr(1, &b.mr, 0..128, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    b.qp.post_recv(&[RecvWr {
        wr_id: 70,
        sg_list: [b.mr.sge(2048, 64)].into_iter().collect(),
    }])
    .unwrap();
    let mut s = SendWr::new(2, WrOpcode::SendWithInv);
    s.flags = SendFlags::SIGNALED;
    s.sg_list.push(a.mr.sge(0, 16));
    s.invalidate_rkey = rkey;
    assert_eq!(post(&a, s).status, WcStatus::Success);
    let r = one(&b.cq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (70, WcStatus::Success, WcOpcode::Recv)
    );
    assert!(r.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(r.invalidated_rkey, rkey);
    assert!(!mw.is_bound());
    assert_eq!(
        write(&a, b.mr.addr(), rkey, 8, 3).status,
        WcStatus::RemAccessErr
    );
}

#[test]
fn send_with_inv_of_a_type1_key_is_refused() {
    let (a, b) = pair(13);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    // Bound before the peer's SEND comes (the bind runs on b's send
    // queue, independently of what b receives).
    let rkey = bind1(&b, &mw, 0..64, Access::REMOTE_WRITE);
    assert!(mw.is_bound());
    b.qp.post_recv(&[RecvWr {
        wr_id: 70,
        sg_list: [b.mr.sge(2048, 64)].into_iter().collect(),
    }])
    .unwrap();
    let mut s = SendWr::new(2, WrOpcode::SendWithInv);
    s.flags = SendFlags::SIGNALED;
    s.sg_list.push(a.mr.sge(0, 16));
    s.invalidate_rkey = rkey;
    // IBA class J, as rxe: no NAK; the SEND is acknowledged, and b's
    // receive WR completes in error.
    assert_eq!(post(&a, s).status, WcStatus::Success);
    let r = one(&b.cq);
    assert_eq!((r.wr_id, r.status), (70, WcStatus::RemInvReqErr));
    assert!(mw.is_bound(), "nothing was invalidated");
    assert_eq!(b.qp.state(), QpState::Err);
}

#[test]
fn type2_window_serves_only_the_qp_that_bound_it() {
    // B has two QPs in one PD: the window bound through qp1 is refused
    // to the peer of qp2.
    let (a, b) = pair(14);
    let qp2 = qp(&b.pd, &b.cq, QpType::Rc, None);
    let a2_ctx = open("127.81.14.3");
    let a2_pd = a2_ctx.alloc_pd().unwrap();
    let a2_cq = a2_ctx.create_cq(16).unwrap();
    let a2_qp = qp(&a2_pd, &a2_cq, QpType::Rc, None);
    let a2_mr = a2_pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    connect(&a2_qp, "127.81.14.3", &qp2, "127.81.14.2");

    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, rkey) = mw.bind_wr(1, &b.mr, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    assert_eq!(write(&a, b.mr.addr(), rkey, 8, 1).status, WcStatus::Success);

    let mut wr = SendWr::new(2, WrOpcode::RdmaWrite);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(a2_mr.sge(0, 8));
    wr.remote_addr = b.mr.addr();
    wr.rkey = rkey;
    a2_qp.post_send(&[wr]).unwrap();
    assert_eq!(one(&a2_cq).status, WcStatus::RemAccessErr);
}

#[test]
fn dealloc_and_dereg_with_windows() {
    let (a, b) = pair(15);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let (wr, rkey) = mw.bind_wr(1, &b.mr, 0..64, Access::REMOTE_WRITE);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    assert_eq!(write(&a, b.mr.addr(), rkey, 8, 1).status, WcStatus::Success);
    drop(mw);
    assert_eq!(b.mr.bound_windows(), 0);
    assert_eq!(
        write(&a, b.mr.addr(), rkey, 8, 2).status,
        WcStatus::RemAccessErr
    );

    // Re-registration waits for the windows to go.
    let (_a, mut b) = pair(16);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    bind1(&b, &mw, 0..64, Access::REMOTE_READ);
    assert!(matches!(
        b.mr.rereg(None, Some(Access::LOCAL_WRITE)),
        Err(Error::Busy(_))
    ));
}

#[test]
fn rereg_access_and_pd_keep_keys_and_memory() {
    let (a, mut b) = pair(17);
    let (lkey, rkey) = (b.mr.lkey(), b.mr.rkey());
    b.mr.write(0, b"kept").unwrap();
    b.mr.rereg(None, Some(Access::LOCAL_WRITE | Access::REMOTE_READ))
        .unwrap();
    assert_eq!((b.mr.lkey(), b.mr.rkey()), (lkey, rkey));
    assert_eq!(b.mr.to_vec(0, 4).unwrap(), b"kept");
    assert_eq!(read(&a, b.mr.addr(), rkey, 4, 1).status, WcStatus::Success);
    assert_eq!(a.mr.to_vec(0, 4).unwrap(), b"kept");
    // Access taken away: the peer's next READ is refused.
    b.mr.rereg(None, Some(Access::LOCAL_WRITE)).unwrap();
    assert_eq!(
        read(&a, b.mr.addr(), rkey, 4, 2).status,
        WcStatus::RemAccessErr
    );

    // Another PD: the QP's PD no longer matches.
    let (a, mut b) = pair(18);
    b.mr.rereg(None, Some(Access::LOCAL_WRITE | Access::REMOTE_WRITE))
        .unwrap();
    assert_eq!(
        write(&a, b.mr.addr(), b.mr.rkey(), 8, 1).status,
        WcStatus::Success
    );
    let other = b._ctx.alloc_pd().unwrap();
    b.mr.rereg(Some(&other), None).unwrap();
    assert_eq!(
        write(&a, b.mr.addr(), b.mr.rkey(), 8, 2).status,
        WcStatus::RemAccessErr
    );
    // The PD the region moved to is busy while it is there.
    assert!(other.destroy().is_err());
}

#[test]
fn resize_cq_counts_what_waits_and_reset_cleans() {
    let (a, b) = pair(19);
    assert!(a.cq.resize(0).is_err());
    a.cq.resize(4).unwrap();
    assert_eq!(a.cq.cqe(), 4);
    for id in 0..3 {
        let mut wr = SendWr::new(id, WrOpcode::RdmaWrite);
        wr.flags = SendFlags::SIGNALED;
        wr.sg_list.push(a.mr.sge(0, 0));
        wr.remote_addr = b.mr.addr();
        wr.rkey = b.mr.rkey();
        a.qp.post_send(&[wr]).unwrap();
    }
    // Wait for the three completions without taking them.
    let end = std::time::Instant::now() + T;
    while a.cq.pending() < 3 {
        assert!(std::time::Instant::now() < end, "completions did not come");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(a.cq.resize(2), Err(Error::Invalid(_))), "3 wait");
    assert_eq!(a.cq.cqe(), 4, "a refused resize changes nothing");
    a.cq.resize(3).unwrap();
    a.cq.resize(64).unwrap();
    assert_eq!(a.cq.pending(), 3);

    // RESET removes the QP's completions from its CQ.
    a.qp.modify(
        &QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        },
        AttrMask::STATE,
    )
    .unwrap();
    assert_eq!(a.cq.pending(), 0, "the reset QP's completions are gone");
    assert!(a.cq.poll_one().is_none());
}
