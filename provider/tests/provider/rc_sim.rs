//! RC operations end to end on the simulated network (no faults).

use uroce_provider::sans_io::memory::MrInner;
use uroce_provider::sans_io::net::sim::Faults;
use uroce_provider::testing::{sge, signaled_wr as wr, PairParams, RcPair};
use uroce_provider::types::*;

const SEC: u64 = 1_000_000_000;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn fill(mr: &MrInner, data: &[u8]) {
    mr.write(0, data).unwrap();
}

fn contents(mr: &MrInner, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(off, &mut v).unwrap();
    v
}

fn sizes(mtu: u32) -> Vec<usize> {
    let m = mtu as usize;
    vec![0, 1, m - 1, m, m + 1, 3 * m, 1 << 20]
}

#[test]
fn send_recv_all_sizes_and_mtus() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu1024, Mtu::Mtu4096] {
        let mut p = RcPair::new(
            1,
            Faults::default(),
            PairParams {
                mtu,
                ..Default::default()
            },
        );
        for (i, len) in sizes(mtu.bytes()).into_iter().enumerate() {
            let src = p.mr(true, len.max(1), ALL);
            let dst = p.mr(false, len + 64, ALL);
            let data = pattern(len, i as u8);
            fill(&src, &data);
            p.post_recv(false, 100 + i as u64, &[sge(&dst, 0, len as u32 + 64)]);
            p.post_send(
                true,
                wr(i as u64, WrOpcode::Send, &[sge(&src, 0, len as u32)]),
            );
            let s = p.wait(true, true, 1, 10 * SEC);
            let r = p.wait(false, false, 1, 10 * SEC);
            assert_eq!(s.len(), 1, "mtu {mtu:?} len {len}");
            assert_eq!(
                (s[0].status, s[0].opcode, s[0].wr_id),
                (WcStatus::Success, WcOpcode::Send, i as u64)
            );
            assert_eq!(r[0].status, WcStatus::Success);
            assert_eq!(
                (r[0].opcode, r[0].byte_len, r[0].wr_id),
                (WcOpcode::Recv, len as u32, 100 + i as u64)
            );
            assert!(r[0].wc_flags.is_empty());
            assert_eq!(contents(&dst, 0, len), data, "mtu {mtu:?} len {len}");
        }
    }
}

#[test]
fn send_with_imm_and_multiple_sges_both_sides() {
    let mut p = RcPair::new(2, Faults::default(), PairParams::default());
    let src = p.mr(true, 10_000, ALL);
    let dst = p.mr(false, 10_000, ALL);
    let data = pattern(10_000, 7);
    fill(&src, &data);
    // Gather 3000 bytes from three pieces; scatter into four pieces.
    let g = [
        sge(&src, 0, 1000),
        sge(&src, 5000, 1500),
        sge(&src, 9000, 500),
    ];
    let s = [
        sge(&dst, 100, 700),
        sge(&dst, 2000, 1),
        sge(&dst, 3000, 2000),
        sge(&dst, 8000, 999),
    ];
    p.post_recv(false, 9, &s);
    let mut w = wr(1, WrOpcode::SendWithImm, &g);
    w.imm_data = 0xdead_beef;
    p.post_send(true, w);
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!(r[0].byte_len, 3000);
    assert_eq!(r[0].imm_data, 0xdead_beef);
    assert!(r[0].wc_flags.contains(WcFlags::WITH_IMM));
    let mut sent = data[..1000].to_vec();
    sent.extend_from_slice(&data[5000..6500]);
    sent.extend_from_slice(&data[9000..9500]);
    let mut got = contents(&dst, 100, 700);
    got.extend(contents(&dst, 2000, 1));
    got.extend(contents(&dst, 3000, 2000));
    got.extend(contents(&dst, 8000, 299));
    assert_eq!(got, sent);
}

#[test]
fn rdma_write_and_write_with_imm() {
    for mtu in [Mtu::Mtu256, Mtu::Mtu4096] {
        let mut p = RcPair::new(
            3,
            Faults::default(),
            PairParams {
                mtu,
                ..Default::default()
            },
        );
        for (i, len) in sizes(mtu.bytes()).into_iter().enumerate() {
            let src = p.mr(true, len.max(1), ALL);
            let dst = p.mr(false, len + 16, ALL);
            let data = pattern(len, 3 + i as u8);
            fill(&src, &data);
            let imm = i % 2 == 1;
            let mut w = wr(
                i as u64,
                if imm {
                    WrOpcode::RdmaWriteWithImm
                } else {
                    WrOpcode::RdmaWrite
                },
                &[sge(&src, 0, len as u32)],
            );
            w.remote_addr = dst.iova() + 8;
            w.rkey = dst.rkey();
            w.imm_data = i as u32;
            if imm {
                p.post_recv(false, 50, &[]);
            }
            p.post_send(true, w);
            let s = p.wait(true, true, 1, 10 * SEC);
            assert_eq!(
                (s[0].status, s[0].opcode),
                (WcStatus::Success, WcOpcode::RdmaWrite),
                "{mtu:?} {len}"
            );
            assert_eq!(contents(&dst, 8, len), data);
            assert_eq!(
                contents(&dst, 0, 8),
                vec![0; 8],
                "no write before the target"
            );
            assert_eq!(
                contents(&dst, 8 + len, 8),
                vec![0; 8],
                "no write after the target"
            );
            if imm {
                let r = p.wait(false, false, 1, SEC);
                assert_eq!(
                    (r[0].status, r[0].opcode, r[0].imm_data),
                    (WcStatus::Success, WcOpcode::RecvRdmaWithImm, i as u32)
                );
                assert_eq!(r[0].byte_len, len as u32);
            } else {
                assert!(p.b.recv_cq.is_empty());
            }
        }
    }
}

#[test]
fn rdma_read_all_sizes() {
    let mut p = RcPair::new(4, Faults::default(), PairParams::default());
    for (i, len) in sizes(1024).into_iter().enumerate() {
        let remote = p.mr(false, len.max(1), ALL);
        let local = p.mr(true, len + 8, ALL);
        let data = pattern(len, 9 + i as u8);
        fill(&remote, &data);
        let mut w = wr(i as u64, WrOpcode::RdmaRead, &[sge(&local, 4, len as u32)]);
        w.remote_addr = remote.iova();
        w.rkey = remote.rkey();
        p.post_send(true, w);
        let s = p.wait(true, true, 1, 10 * SEC);
        assert_eq!(
            (s[0].status, s[0].opcode, s[0].byte_len),
            (WcStatus::Success, WcOpcode::RdmaRead, len as u32),
            "len {len}"
        );
        assert_eq!(contents(&local, 4, len), data);
    }
}

#[test]
fn atomics_and_local_coherence() {
    let mut p = RcPair::new(5, Faults::default(), PairParams::default());
    let remote = p.mr(false, 64, ALL);
    let local = p.mr(true, 64, ALL);
    remote
        .with_atomic_u64(8, |w| w.store(100, std::sync::atomic::Ordering::SeqCst))
        .unwrap();
    // fetch-add 5: old 100
    let mut w = wr(1, WrOpcode::AtomicFetchAndAdd, &[sge(&local, 0, 8)]);
    w.remote_addr = remote.iova() + 8;
    w.rkey = remote.rkey();
    w.compare_add = 5;
    p.post_send(true, w);
    // compare-swap 105 -> 7: succeeds, old 105
    let mut w = wr(2, WrOpcode::AtomicCmpAndSwp, &[sge(&local, 8, 8)]);
    w.remote_addr = remote.iova() + 8;
    w.rkey = remote.rkey();
    w.compare_add = 105;
    w.swap = 7;
    p.post_send(true, w);
    // compare-swap 1 -> 9: fails, old 7
    let mut w = wr(3, WrOpcode::AtomicCmpAndSwp, &[sge(&local, 16, 8)]);
    w.remote_addr = remote.iova() + 8;
    w.rkey = remote.rkey();
    w.compare_add = 1;
    w.swap = 9;
    p.post_send(true, w);
    let s = p.wait(true, true, 3, SEC);
    assert_eq!(
        s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    assert_eq!(s[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(s[1].opcode, WcOpcode::CompSwap);
    let get = |off| {
        local
            .with_atomic_u64(off, |w| w.load(std::sync::atomic::Ordering::SeqCst))
            .unwrap()
    };
    assert_eq!((get(0), get(8), get(16)), (100, 105, 7));
    // A local atomic on the same word sees the remote result.
    assert_eq!(
        remote
            .with_atomic_u64(8, |w| w.fetch_add(1, std::sync::atomic::Ordering::SeqCst))
            .unwrap(),
        7
    );
}

#[test]
fn inline_and_unsignaled() {
    let mut p = RcPair::new(6, Faults::default(), PairParams::default());
    let dst = p.mr(false, 256, ALL);
    for i in 0..4u64 {
        p.post_recv(false, i, &[sge(&dst, i * 64, 64)]);
        let mut w = SendWr::new(i, WrOpcode::Send);
        w.flags = SendFlags::INLINE
            | if i == 3 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
        w.inline_data = pattern(40, i as u8).into_iter().collect();
        p.post_send(true, w);
    }
    let s = p.wait(true, true, 1, SEC);
    p.settle(SEC);
    assert_eq!(s.len(), 1, "only the signaled WR completes");
    assert_eq!(s[0].wr_id, 3);
    assert!(p.a.send_cq.is_empty());
    assert_eq!(
        p.a.sq.outstanding(),
        0,
        "unsignaled WRs retired with the signaled one"
    );
    let r = p.wait(false, false, 4, SEC);
    assert_eq!(r.len(), 4);
    for i in 0..4u64 {
        assert_eq!(contents(&dst, i as usize * 64, 40), pattern(40, i as u8));
    }
}

#[test]
fn send_with_invalidate() {
    // A peer may invalidate only memory windows of type 2 and regions
    // registered for remote invalidation; an ordinary MR named in the IETH
    // stays registered, the receive WR completes with REM_INV_REQ_ERR and
    // the responder goes to ERR with no NAK (IBA 9.9.3 class J, as rxe):
    // the message is acknowledged, so the requester's SEND succeeds, and
    // its next request is never answered (RETRY_EXC_ERR).
    let mut p = RcPair::new(7, Faults::default(), PairParams::default());
    let target = p.mr(false, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    let src = p.mr(true, 64, ALL);
    p.post_recv(false, 1, &[sge(&dst, 0, 64)]);
    let mut w = wr(1, WrOpcode::SendWithInv, &[sge(&src, 0, 10)]);
    w.invalidate_rkey = target.rkey();
    p.post_send(true, w);
    assert_eq!(p.wait(true, true, 1, SEC)[0].status, WcStatus::Success);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!((r[0].wr_id, r[0].status), (1, WcStatus::RemInvReqErr));
    assert!(!r[0].wc_flags.contains(WcFlags::WITH_INV));
    assert!(
        target.is_valid(),
        "an ordinary MR is not revoked by the peer"
    );
    assert!(p.b.keys.find_rkey(target.rkey()).is_some());
    assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);
    assert_eq!(p.b.counters.snapshot().err_naks_sent, 0, "no NAK");
    assert_eq!(p.net.qp(p.a.id).state(), QpState::Rts);
    let e = p.b.state.error_cause().unwrap().to_string();
    assert!(e.contains("no NAK (IBA class J)"), "{e}");
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 1)]));
    let s = p.wait(true, true, 1, 600 * SEC);
    assert_eq!((s[0].wr_id, s[0].status), (2, WcStatus::RetryExcErr));
}

/// A READ or atomic whose local buffer (L_Key) is bad is sent anyway, as
/// rxe and NICs send it (rdma-unit-test's ReadInvalidRKeyAndInvalidLKey,
/// FetchAddInvalidLKeyAndInvalidRKey, CompareSwapInvalidLKey...): with
/// the R_Key bad too, the responder's NAK decides (REM_ACCESS_ERR); with
/// only the L_Key bad, the remote atomic executes and placing its result
/// fails (LOC_PROT_ERR, QP to ERR). Before, uroce failed them before
/// sending anything.
#[test]
fn a_read_or_atomic_with_a_bad_lkey_is_sent_anyway() {
    for op in [
        WrOpcode::RdmaRead,
        WrOpcode::AtomicFetchAndAdd,
        WrOpcode::AtomicCmpAndSwp,
    ] {
        for bad_rkey in [true, false] {
            let mut p = RcPair::new(17, Faults::default(), PairParams::default());
            let local = p.mr(true, 64, ALL);
            let remote = p.mr(false, 64, ALL);
            remote.write(0, &5u64.to_ne_bytes()).unwrap();
            let bad = Sge {
                addr: local.iova(),
                length: 8,
                lkey: local.lkey() ^ 0x77,
            };
            let mut w = wr(1, op, &[bad]);
            w.remote_addr = remote.iova();
            w.rkey = remote.rkey() ^ if bad_rkey { 0x5a5a } else { 0 };
            w.compare_add = 5;
            w.swap = 9;
            p.post_send(true, w);
            let s = p.wait(true, true, 1, 5 * SEC);
            let want = if bad_rkey {
                WcStatus::RemAccessErr
            } else {
                WcStatus::LocProtErr
            };
            assert_eq!((s[0].wr_id, s[0].status), (1, want), "{op:?} {bad_rkey}");
            assert!(p.net.packets_sent() > 0, "the request went");
            assert_eq!(p.net.qp(p.a.id).state(), QpState::Err);
            let word = u64::from_ne_bytes(contents(&remote, 0, 8).try_into().unwrap());
            let executed = match (bad_rkey, op) {
                (true, _) | (_, WrOpcode::RdmaRead) => 5,
                (_, WrOpcode::AtomicFetchAndAdd) => 10,
                _ => 9,
            };
            assert_eq!(word, executed, "{op:?} {bad_rkey}: the remote side");
            assert_eq!(contents(&local, 0, 8), vec![0; 8], "nothing placed");
            // The local error is explained: the SGE whose L_Key fails.
            if !bad_rkey {
                let e = p.a.last_error();
                assert!(e.contains("IBV_WC_LOC_PROT_ERR"), "{e}");
                assert!(e.contains("lkey"), "{e}");
            }
        }
    }
}

/// A WRITE with immediate whose R_Key is bad consumes the responder's
/// receive WR, which completes with REM_ACCESS_ERR (rxe: the WQE is taken
/// before the R_Key check; rdma-unit-test's WriteImmDataInvalidRKey);
/// before, uroce flushed it.
#[test]
fn a_write_with_immediate_and_a_bad_rkey_completes_the_receive_rem_access_err() {
    let mut p = RcPair::new(18, Faults::default(), PairParams::default());
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    let rbuf = p.mr(false, 64, ALL);
    p.post_recv(false, 7, &[sge(&rbuf, 0, 64)]);
    p.post_recv(false, 8, &[sge(&rbuf, 0, 64)]);
    let mut w = wr(1, WrOpcode::RdmaWriteWithImm, &[sge(&src, 0, 8)]);
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey() ^ 0x5a5a;
    w.imm_data = 0x1234;
    p.post_send(true, w);
    let s = p.wait(true, true, 1, 5 * SEC);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
    let r = p.wait(false, false, 2, SEC);
    assert_eq!(
        r.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(7, WcStatus::RemAccessErr), (8, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);
}

/// A SEND posted and at once followed by a modify to ERR goes out before
/// the QP flushes, as a NIC sends the WQEs it fetched before the modify
/// (librpma's examples 12 and 12scch post an unsignaled SEND and then
/// disconnect): the peer receives it, every time; the WR itself is then
/// flushed, and a WR posted after the modify is not sent.
#[test]
fn a_send_posted_before_a_modify_to_err_is_delivered() {
    for seed in 0..20 {
        let mut p = RcPair::new(100 + seed, Faults::default(), PairParams::default());
        let src = p.mr(true, 64, ALL);
        let dst = p.mr(false, 128, ALL);
        src.write(0, b"last words").unwrap();
        p.post_recv(false, 9, &[sge(&dst, 0, 64)]);
        p.post_recv(false, 10, &[sge(&dst, 64, 64)]);
        let mut w = wr(1, WrOpcode::Send, &[sge(&src, 0, 10)]);
        w.flags = SendFlags::empty();
        p.post_send(true, w);
        let attr = uroce_provider::qp_attr::QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        p.net
            .qp(p.a.id)
            .modify(&attr, uroce_provider::qp_attr::AttrMask::STATE)
            .unwrap();
        assert_eq!(p.net.qp(p.a.id).state(), QpState::Err);
        p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 10)]));
        let r = p.wait(false, false, 1, SEC);
        assert_eq!(
            (r.len(), r[0].wr_id, r[0].status),
            (1, 9, WcStatus::Success)
        );
        assert_eq!(contents(&dst, 0, 10), b"last words");
        let s = p.wait(true, true, 2, SEC);
        assert_eq!(
            s.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
        );
        p.settle(SEC);
        assert!(p.b.recv_cq.poll_one().is_none(), "WR 2 was not sent");
    }
}

fn error_then_flush(p: &mut RcPair, expect: WcStatus) {
    let s = p.wait(true, true, 2, 5 * SEC);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_eq!((s[0].wr_id, s[0].status), (1, expect));
    assert_eq!((s[1].wr_id, s[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(p.net.qp(p.a.id).state(), QpState::Err);
    // WRs posted after the error are flushed too.
    p.post_send(true, wr(3, WrOpcode::Send, &[]));
    let s = p.wait(true, true, 1, SEC);
    assert_eq!((s[0].wr_id, s[0].status), (3, WcStatus::WrFlushErr));
}

#[test]
fn remote_access_errors() {
    // bad rkey, out of bounds, missing right, PD mismatch (another table's key)
    for case in 0..4 {
        let mut p = RcPair::new(8, Faults::default(), PairParams::default());
        let src = p.mr(true, 64, ALL);
        let remote = p.mr(
            false,
            64,
            if case == 2 {
                Access::LOCAL_WRITE | Access::REMOTE_READ
            } else {
                ALL
            },
        );
        let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 16)]);
        w.remote_addr = remote.iova() + if case == 1 { 56 } else { 0 };
        w.rkey = match case {
            0 => remote.rkey() ^ 0x5a5a,
            3 => src.rkey(), // a key of the requester's own context
            _ => remote.rkey(),
        };
        p.post_send(true, w);
        p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 1)]));
        error_then_flush(&mut p, WcStatus::RemAccessErr);
        assert_eq!(
            p.net.qp(p.b.id).state(),
            QpState::Err,
            "responder goes to ERR too"
        );
        assert_eq!(contents(&remote, 0, 64), vec![0; 64], "nothing written");
    }
}

#[test]
fn receive_too_small() {
    let mut p = RcPair::new(9, Faults::default(), PairParams::default());
    let src = p.mr(true, 4096, ALL);
    let dst = p.mr(false, 4096, ALL);
    p.post_recv(false, 77, &[sge(&dst, 0, 100)]);
    p.post_recv(false, 78, &[sge(&dst, 0, 100)]);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 2000)]));
    p.post_send(true, wr(2, WrOpcode::Send, &[sge(&src, 0, 1)]));
    error_then_flush(&mut p, WcStatus::RemInvReqErr);
    let r = p.wait(false, false, 2, SEC);
    assert_eq!((r[0].wr_id, r[0].status), (77, WcStatus::LocLenErr));
    assert_eq!((r[1].wr_id, r[1].status), (78, WcStatus::WrFlushErr));
}

#[test]
fn misaligned_atomic() {
    let mut p = RcPair::new(10, Faults::default(), PairParams::default());
    let remote = p.mr(false, 64, ALL);
    let local = p.mr(true, 64, ALL);
    let mut w = wr(1, WrOpcode::AtomicFetchAndAdd, &[sge(&local, 0, 8)]);
    w.remote_addr = remote.iova() + 4;
    w.rkey = remote.rkey();
    p.post_send(true, w);
    p.post_send(true, wr(2, WrOpcode::Send, &[]));
    error_then_flush(&mut p, WcStatus::RemInvReqErr);
}

#[test]
fn local_protection_errors() {
    // bad lkey; SGE beyond the MR; READ into a region without LOCAL_WRITE
    for case in 0..3 {
        let mut p = RcPair::new(11, Faults::default(), PairParams::default());
        let src = p.mr(true, 64, if case == 2 { Access::empty() } else { ALL });
        let remote = p.mr(false, 64, ALL);
        let s = match case {
            0 => Sge {
                addr: src.iova(),
                length: 8,
                lkey: src.lkey() ^ 1,
            },
            1 => sge(&src, 60, 8),
            _ => sge(&src, 0, 8),
        };
        let mut w = wr(
            1,
            if case == 2 {
                WrOpcode::RdmaRead
            } else {
                WrOpcode::RdmaWrite
            },
            &[s],
        );
        w.remote_addr = remote.iova();
        w.rkey = remote.rkey();
        p.post_send(true, w);
        p.post_send(true, wr(2, WrOpcode::Send, &[]));
        error_then_flush(&mut p, WcStatus::LocProtErr);
        // A READ's buffer receives its response: the request goes anyway
        // (a_read_or_atomic_with_a_bad_lkey_is_sent_anyway).
        let sent = p.net.packets_sent();
        assert_eq!(sent > 0, case == 2, "sent {sent}");
    }
}

#[test]
fn rnr_then_success() {
    let mut p = RcPair::new(12, Faults::default(), PairParams::default());
    let src = p.mr(true, 64, ALL);
    let dst = p.mr(false, 64, ALL);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, 8)]));
    p.net.run_until(SEC / 100, |_| false);
    assert!(p.a.send_cq.is_empty());
    assert!(p.b.counters.snapshot().rnr_naks_sent >= 1);
    p.post_recv(false, 5, &[sge(&dst, 0, 64)]);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s[0].status, WcStatus::Success);
    assert_eq!(p.wait(false, false, 1, SEC)[0].wr_id, 5);
}

#[test]
fn rd_atomic_limit_and_fence() {
    let mut p = RcPair::new(
        13,
        Faults::default(),
        PairParams {
            rd_atomic: 1,
            ..Default::default()
        },
    );
    let remote = p.mr(false, 8192, ALL);
    let local = p.mr(true, 8192, ALL);
    fill(&remote, &pattern(8192, 1));
    for i in 0..4u64 {
        let mut w = wr(i, WrOpcode::RdmaRead, &[sge(&local, i * 2048, 2048)]);
        w.remote_addr = remote.iova() + i * 2048;
        w.rkey = remote.rkey();
        p.post_send(true, w);
    }
    // A fenced WRITE after the reads writes back what the reads fetched.
    let mut w = wr(9, WrOpcode::RdmaWrite, &[sge(&local, 0, 8192)]);
    w.flags |= SendFlags::FENCE;
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    p.post_send(true, w);
    let s = p.wait(true, true, 5, 10 * SEC);
    assert_eq!(
        s.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 9]
    );
    assert!(s.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(contents(&remote, 0, 8192), pattern(8192, 1));
}

#[test]
fn many_messages_in_order_with_wrap() {
    let mut p = RcPair::new(
        14,
        Faults::default(),
        PairParams {
            psn: 0xff_fff0,
            ..Default::default()
        },
    );
    let src = p.mr(true, 4096, ALL);
    let dst = p.mr(false, 4096 * 64, ALL);
    fill(&src, &pattern(4096, 5));
    for i in 0..200u64 {
        let slot = (i % 64) * 4096;
        if i % 2 == 0 {
            p.post_recv(false, i, &[sge(&dst, slot, 4096)]);
            p.post_send(true, wr(i, WrOpcode::Send, &[sge(&src, 0, 3000)]));
        } else {
            let mut w = wr(i, WrOpcode::RdmaWrite, &[sge(&src, 0, 2500)]);
            w.remote_addr = dst.iova() + slot;
            w.rkey = dst.rkey();
            p.post_send(true, w);
        }
        if i % 50 == 49 {
            let s = p.wait(true, true, 50, 10 * SEC);
            assert_eq!(
                s.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
                ((i - 49)..=i).collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(p.wait(false, false, 100, SEC).len(), 100);
}

#[test]
fn read_never_sees_a_later_write() {
    // A READ and a WRITE to the same bytes, posted back to back (no fence):
    // the responder executes in order, so the READ returns the old bytes
    // even though its responses are still going out when the WRITE arrives.
    let mut p = RcPair::new(15, Faults::default(), PairParams::default());
    // 8 KiB: small enough that the WRITE goes out at once behind the READ.
    const N: usize = 8 << 10;
    let remote = p.mr(false, N, ALL);
    let local = p.mr(true, N, ALL);
    let src = p.mr(true, N, ALL);
    fill(&remote, &pattern(N, 1));
    fill(&src, &pattern(N, 2));
    let mut r = wr(1, WrOpcode::RdmaRead, &[sge(&local, 0, N as u32)]);
    r.remote_addr = remote.iova();
    r.rkey = remote.rkey();
    let mut w = wr(2, WrOpcode::RdmaWrite, &[sge(&src, 0, N as u32)]);
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    p.post_send(true, r);
    p.post_send(true, w);
    let s = p.wait(true, true, 2, 10 * SEC);
    assert!(s.iter().all(|w| w.status == WcStatus::Success), "{s:?}");
    assert_eq!(
        contents(&local, 0, N),
        pattern(N, 1),
        "READ saw the later WRITE"
    );
    assert_eq!(contents(&remote, 0, N), pattern(N, 2));
}

#[test]
fn every_packet_carries_the_paths_traffic_class() {
    // The QP's path traffic class (ah_attr.grh.traffic_class at RTR) is
    // the IP TOS of all its packets: requests, ACKs and READ responses.
    use uroce_provider::sans_io::net::sim::{Verdict, Wire};
    let mut p = RcPair::new(
        1,
        Faults::default(),
        PairParams {
            traffic_class: [0x68, 0x2a],
            ..Default::default()
        },
    );
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    p.net.set_filter(move |w: &Wire<'_>| {
        s2.lock().unwrap().push((w.src, w.tclass));
        Verdict::Pass
    });
    let src = p.mr(true, 4096, ALL);
    let dst = p.mr(false, 4096, ALL);
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, 3000)]);
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    p.post_send(true, w);
    let mut r = wr(2, WrOpcode::RdmaRead, &[sge(&src, 0, 3000)]);
    r.remote_addr = dst.iova();
    r.rkey = dst.rkey();
    p.post_send(true, r);
    assert_eq!(p.wait(true, true, 2, SEC).len(), 2);
    let seen = seen.lock().unwrap();
    assert!(seen.len() >= 6, "{seen:?}");
    let a_ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
    for (src, tc) in seen.iter() {
        assert_eq!(*tc, if *src == a_ip { 0x68 } else { 0x2a });
    }
}
