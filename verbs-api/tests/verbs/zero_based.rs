//! Zero-based memory (`IBV_ACCESS_ZERO_BASED`) and regions registered at
//! another iova (`ibv_reg_mr_iova`), over real UDP between two devices on
//! loopback addresses (127.103.1.x): a zero-based R_Key addresses its
//! region, or its type 2 window, from offset 0.

use std::time::Duration;
use uroce_verbs::wire::feth::{FLUSH_GLOBAL, FLUSH_RANGE};
use uroce_verbs::*;

use crate::common;

const T: Duration = Duration::from_secs(20);
const LEN: usize = 4096;
const REMOTE: Access = common::ALL.union(Access::FLUSH_GLOBAL);

struct End {
    _ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    /// The requester's buffer (by virtual address).
    mr: MemoryRegion,
}

fn end(ip: &str) -> End {
    let (ctx, pd, cq, qp) = common::end(ip, QpType::Rc, 32, 64);
    let mr = pd.alloc_mr(LEN, REMOTE | Access::MW_BIND).unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

fn pair(n: u8) -> (End, End) {
    let (ai, bi) = (
        format!("127.103.1.{}", 2 * n),
        format!("127.103.1.{}", 2 * n + 1),
    );
    let (a, b) = (end(&ai), end(&bi));
    let o = ConnectOptions {
        access: REMOTE,
        max_rd_atomic: 4,
        max_dest_rd_atomic: 4,
        ..ConnectOptions::default()
    };
    let (ea, eb) = (a.qp.endpoint(), b.qp.endpoint());
    a.qp.connect_with(&eb, &o).unwrap();
    b.qp.connect_with(&ea, &o).unwrap();
    (a, b)
}

fn post(e: &End, wr: SendWr) -> Wc {
    e.qp.post_send(&[wr]).unwrap();
    let w = e.cq.wait(1, T);
    assert_eq!(w.len(), 1, "no completion within {T:?}");
    w[0]
}

fn rdma(op: WrOpcode, sge: Sge, raddr: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(1, op);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(sge);
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    wr
}

/// WRITE, READ, fetch-add and FLUSH at `base + off` through `rkey` land
/// at offset `off` of `target`.
fn check_ops(a: &End, target: &MemoryRegion, base: u64, rkey: u32, off: usize) {
    a.mr.write(0, &[0x6b; 64]).unwrap();
    let w = post(
        a,
        rdma(
            WrOpcode::RdmaWrite,
            a.mr.sge(0, 64),
            base + off as u64,
            rkey,
        ),
    );
    assert_eq!(w.status, WcStatus::Success, "WRITE");
    assert_eq!(target.to_vec(off, 64).unwrap(), vec![0x6b; 64]);
    assert_eq!(target.to_vec(off - 1, 1).unwrap(), [0], "nothing before");

    target.write(off + 64, b"read me").unwrap();
    let w = post(
        a,
        rdma(
            WrOpcode::RdmaRead,
            a.mr.sge(100, 7),
            base + off as u64 + 64,
            rkey,
        ),
    );
    assert_eq!(w.status, WcStatus::Success, "READ");
    assert_eq!(a.mr.to_vec(100, 7).unwrap(), b"read me");

    let word = off + 128;
    target
        .atomic_u64(word)
        .unwrap()
        .store(40, std::sync::atomic::Ordering::SeqCst);
    let mut fa = rdma(
        WrOpcode::AtomicFetchAndAdd,
        a.mr.sge(200, 8),
        base + word as u64,
        rkey,
    );
    fa.compare_add = 2;
    assert_eq!(post(a, fa).status, WcStatus::Success, "fetch-add");
    assert_eq!(a.mr.to_vec(200, 8).unwrap(), 40u64.to_le_bytes());
    assert_eq!(
        target
            .atomic_u64(word)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst),
        42
    );

    let f = SendWr::flush(1, base + off as u64, rkey, 64, FLUSH_GLOBAL, FLUSH_RANGE);
    assert_eq!(post(a, f).status, WcStatus::Success, "FLUSH");
}

/// A WRITE of 2 bytes at `raddr` through `rkey` is refused (and the QP
/// goes to ERR).
fn refused(a: &End, raddr: u64, rkey: u32) {
    let w = post(a, rdma(WrOpcode::RdmaWrite, a.mr.sge(0, 2), raddr, rkey));
    assert_eq!(w.status, WcStatus::RemAccessErr, "{raddr:#x}");
}

#[test]
fn zero_based_region_is_addressed_from_offset_0() {
    let (a, b) = pair(1);
    let zb = b.pd.alloc_mr(LEN, REMOTE | Access::ZERO_BASED).unwrap();
    assert_eq!(zb.addr(), 0, "its keys address it from 0");
    check_ops(&a, &zb, 0, zb.rkey(), 512);

    // Its L_Key addresses it from 0 too: a SEND gathered from offset 512.
    let mut r = RecvWr {
        wr_id: 9,
        sg_list: Default::default(),
    };
    r.sg_list.push(a.mr.sge(1024, 64));
    a.qp.post_recv(&[r]).unwrap();
    let mut s = SendWr::new(2, WrOpcode::Send);
    s.flags = SendFlags::SIGNALED;
    s.sg_list.push(zb.sge(512, 64));
    assert_eq!(zb.sge(512, 64).addr, 512);
    assert_eq!(post(&b, s).status, WcStatus::Success);
    let w = a.cq.wait(1, T);
    assert_eq!(w[0].status, WcStatus::Success);
    assert_eq!(a.mr.to_vec(1024, 64).unwrap(), vec![0x6b; 64]);
    refused(&a, LEN as u64 - 1, zb.rkey());
}

#[test]
fn region_at_another_iova() {
    let (a, b) = pair(2);
    let mut buf = vec![0u8; LEN];
    let iova = 0x7700_0000_0000 + (buf.as_ptr() as u64 & 0xfff);
    // SAFETY: `buf` outlives the region (dropped first, below) and is not
    // touched through Rust references while registered.
    let mr = unsafe { b.pd.reg_mr_iova_raw(buf.as_mut_ptr(), LEN, iova, REMOTE) }.unwrap();
    assert_eq!(mr.addr(), iova);
    check_ops(&a, &mr, iova, mr.rkey(), 256);
    // Its virtual address is not its address through the keys.
    refused(&a, buf.as_ptr() as u64, mr.rkey());
    drop(mr);
    drop(buf);
}

#[test]
fn zero_based_type2_window_is_addressed_from_its_start() {
    let (a, b) = pair(3);
    let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
    let access = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (wr, rkey) = mw.bind_wr(7, &b.mr, 1024..2048, access | Access::ZERO_BASED);
    assert_eq!(post(&b, wr).status, WcStatus::Success);
    // Offset `off` of the window is offset 1024 + off of the region.
    a.mr.write(0, &[0x3c; 64]).unwrap();
    let w = post(&a, rdma(WrOpcode::RdmaWrite, a.mr.sge(0, 64), 16, rkey));
    assert_eq!(w.status, WcStatus::Success);
    assert_eq!(b.mr.to_vec(1024 + 16, 64).unwrap(), vec![0x3c; 64]);
    b.mr.write(1024 + 200, b"window").unwrap();
    let w = post(&a, rdma(WrOpcode::RdmaRead, a.mr.sge(300, 6), 200, rkey));
    assert_eq!(w.status, WcStatus::Success);
    assert_eq!(a.mr.to_vec(300, 6).unwrap(), b"window");
    // Its end is offset 1024; the region's address is outside it.
    refused(&a, 1023, rkey);
}

#[test]
fn zero_based_type1_bind_is_refused() {
    let (_a, b) = pair(4);
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let access = Access::REMOTE_WRITE | Access::ZERO_BASED;
    b.qp.bind_mw(&mw, Some((&b.mr, 0..256)), access, 1, SendFlags::SIGNALED)
        .unwrap();
    let w = b.cq.wait(1, T);
    assert_eq!(w[0].status, WcStatus::MwBindErr);
}
