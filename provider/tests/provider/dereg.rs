//! Deregistration while the engine still holds a region in a message in
//! progress (issue #12, memory soundness): after `deregister` returns, no
//! byte of the region is read or written again, and the work request or
//! message that needed it completes with the status the spec names.
//!
//! Each region here is registered over memory the test owns (as `ibv_reg_mr`
//! on `malloc`ed memory does), poisoned once deregistered: the poison must
//! survive, and no packet sent afterwards may carry the region's bytes.

use std::net::IpAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use uroce_provider::sans_io::events::EventType;
use uroce_provider::sans_io::memory::{Backing, KeyTable, MrInner};
use uroce_provider::sans_io::net::sim::{Faults, Verdict, Wire};
use uroce_provider::testing::{sge, signaled_wr as wr, PairParams, RcPair};
use uroce_provider::types::*;
use uroce_wire::{Opcode, Operation};

const SEC: u64 = 1_000_000_000;
const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);
const POISON: u8 = 0x5a;
const LEN: usize = 5 * 1024;

/// Memory owned by the test and registered as external memory.
struct External {
    mem: Box<[u8]>,
    mr: Arc<MrInner>,
    keys: Arc<KeyTable>,
}

impl External {
    fn new(keys: &Arc<KeyTable>, fill: u8, iova: u64) -> External {
        let mut mem = vec![fill; LEN].into_boxed_slice();
        let ptr = NonNull::new(mem.as_mut_ptr()).unwrap();
        // SAFETY: `mem` lives in the returned value, which outlives the
        // registration (deregistered in `dereg_and_poison` or at drop), and
        // the test touches it only after deregistration.
        let mr = unsafe { keys.register(1, ptr, LEN, iova, ALL, Backing::External) };
        External {
            mem,
            mr,
            keys: keys.clone(),
        }
    }

    /// Deregisters, then writes the poison over the memory, as a program
    /// that frees and reuses it would.
    fn dereg_and_poison(&mut self) {
        self.keys.deregister(&self.mr);
        self.mem.fill(POISON);
    }

    fn poison_intact(&self) -> bool {
        self.mem.iter().all(|&b| b == POISON)
    }
}

impl Drop for External {
    fn drop(&mut self) {
        self.keys.deregister(&self.mr);
    }
}

fn pair() -> RcPair {
    RcPair::new(
        7,
        Faults::default(),
        PairParams {
            timeout: 10,
            retry_cnt: 3,
            ..Default::default()
        },
    )
}

/// Steps the network until `cond` holds (bounded).
fn step_until(p: &mut RcPair, mut cond: impl FnMut(&RcPair) -> bool) {
    for _ in 0..100_000 {
        if cond(p) {
            return;
        }
        assert!(p.net.step(), "network went idle first");
    }
    panic!("condition never held");
}

/// Loses every packet after the first of each message (FIRST passes)
/// until the returned flag is cleared: the receiver then holds a message
/// in progress, and the rest comes again by retransmission.
fn hold_after_first(p: &mut RcPair) -> Arc<AtomicBool> {
    let hold = Arc::new(AtomicBool::new(true));
    let h = hold.clone();
    p.net.set_filter(move |w: &Wire<'_>| {
        let pos = w.pkt.info.position;
        if h.load(Ordering::Relaxed) && w.pkt.info.has_payload && !pos.starts_message() {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    });
    hold
}

fn received(p: &RcPair, on_a: bool) -> u64 {
    let s = if on_a { &p.a } else { &p.b };
    s.counters.snapshot().rcvd_pkts
}

fn events(side: &uroce_provider::testing::Side) -> Vec<EventType> {
    let mut v = Vec::new();
    while let Some(e) = side.events.get(Some(std::time::Duration::ZERO)) {
        v.push(e.event_type);
    }
    v
}

/// A peer's 5-packet WRITE has delivered its FIRST packet when the target
/// region is deregistered and freed: the MIDDLE packets must not land in
/// the freed memory. The responder answers with a remote access error NAK
/// (the R_Key no longer names a region) and goes to ERR; the requester's
/// WR completes with REM_ACCESS_ERR.
#[test]
fn dereg_during_an_open_multi_packet_write() {
    let mut p = pair();
    let src = p.mr(true, LEN, ALL);
    src.write(0, &[0xab; LEN]).unwrap();
    let mut dst = External::new(&p.b.keys, 0, 0x10_0000_0000);
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src, 0, LEN as u32)]);
    w.remote_addr = dst.mr.iova();
    w.rkey = dst.mr.rkey();
    let hold = hold_after_first(&mut p);
    p.post_send(true, w);
    step_until(&mut p, |p| received(p, false) >= 1);
    dst.dereg_and_poison();
    hold.store(false, Ordering::Relaxed);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
    p.settle(SEC);
    assert!(dst.poison_intact(), "a packet landed after deregistration");
    assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);
    assert!(events(&p.b).contains(&EventType::QpAccessErr));
    assert_eq!(p.b.counters.snapshot().err_naks_sent, 1);
}

/// Our READ's local sink is deregistered and freed after its first
/// response was placed: later responses are not placed, the READ
/// completes with LOC_PROT_ERR and the QP goes to ERR.
#[test]
fn dereg_of_the_sink_during_a_pending_read() {
    let mut p = pair();
    let remote = p.mr(false, LEN, ALL);
    remote.write(0, &[0xcd; LEN]).unwrap();
    let mut sink = External::new(&p.a.keys, 0, 0x20_0000_0000);
    let mut w = wr(1, WrOpcode::RdmaRead, &[sge(&sink.mr, 0, LEN as u32)]);
    w.remote_addr = remote.iova();
    w.rkey = remote.rkey();
    let hold = hold_after_first(&mut p);
    p.post_send(true, w);
    step_until(&mut p, |p| received(p, true) >= 1);
    assert_eq!(sink.mem[0], 0xcd, "first response placed");
    sink.dereg_and_poison();
    hold.store(false, Ordering::Relaxed);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::LocProtErr);
    p.settle(SEC);
    assert!(sink.poison_intact());
    assert_eq!(p.net.qp(p.a.id).state(), QpState::Err);
}

/// The region a READ is answered from is deregistered between two of its
/// response packets: the next response becomes a remote access error NAK,
/// no later response carries the region's bytes, and the requester's
/// READ completes with REM_ACCESS_ERR.
#[test]
fn dereg_of_the_source_while_read_responses_go_out() {
    let mut p = pair();
    let sink = p.mr(true, LEN, ALL);
    let src = Arc::new(Mutex::new(External::new(&p.b.keys, 0xef, 0x30_0000_0000)));
    let (rkey, iova) = {
        let s = src.lock().unwrap();
        (s.mr.rkey(), s.mr.iova())
    };
    let s2 = src.clone();
    let responses = Arc::new(Mutex::new(Vec::new()));
    let r2 = responses.clone();
    p.net.set_filter(move |w: &Wire<'_>| {
        let op = w.pkt.bth.opcode;
        if w.pkt.info.operation == Operation::RdmaReadResponse {
            r2.lock().unwrap().push(w.pkt.payload.to_vec());
            if op == Opcode::RC_RDMA_READ_RESPONSE_FIRST {
                // The application deregisters and frees just after the
                // first response left.
                s2.lock().unwrap().dereg_and_poison();
            }
        }
        Verdict::Pass
    });
    let mut w = wr(1, WrOpcode::RdmaRead, &[sge(&sink, 0, LEN as u32)]);
    w.remote_addr = iova;
    w.rkey = rkey;
    p.post_send(true, w);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::RemAccessErr);
    p.settle(SEC);
    let r = responses.lock().unwrap();
    assert_eq!(r.len(), 1, "only the response sent before deregistration");
    assert!(r[0].iter().all(|&b| b == 0xef));
    assert!(src.lock().unwrap().poison_intact());
    assert_eq!(p.net.qp(p.b.id).state(), QpState::Err);
    assert_eq!(p.b.counters.snapshot().err_naks_sent, 1);
}

/// A WRITE's packets are all lost, and its source region is deregistered
/// and freed before the retransmission: the retransmission must not send
/// the freed memory. The WR completes with LOC_PROT_ERR.
#[test]
fn dereg_with_a_retransmit_queued() {
    let mut p = pair();
    let dst = p.mr(false, LEN, ALL);
    let mut src = External::new(&p.a.keys, 0x77, 0x40_0000_0000);
    let lose = Arc::new(AtomicBool::new(true));
    let l2 = lose.clone();
    let after: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let a2 = after.clone();
    let a_ip: IpAddr = p.a.ip;
    p.net.set_filter(move |w: &Wire<'_>| {
        if w.src != a_ip {
            return Verdict::Pass;
        }
        if l2.load(Ordering::Relaxed) {
            return Verdict::Drop;
        }
        a2.lock().unwrap().push(w.pkt.payload.to_vec());
        Verdict::Pass
    });
    let mut w = wr(1, WrOpcode::RdmaWrite, &[sge(&src.mr, 0, LEN as u32)]);
    w.remote_addr = dst.iova();
    w.rkey = dst.rkey();
    p.post_send(true, w);
    step_until(&mut p, |p| p.a.counters.snapshot().sent_pkts >= 5);
    src.dereg_and_poison();
    lose.store(false, Ordering::Relaxed);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::LocProtErr);
    p.settle(SEC);
    let sent = after.lock().unwrap();
    assert!(
        sent.iter().all(|pl| pl.is_empty()),
        "a packet with payload left after deregistration: {} bytes",
        sent.iter().map(Vec::len).sum::<usize>()
    );
    let mut got = vec![0u8; LEN];
    dst.read(0, &mut got).unwrap();
    assert!(got.iter().all(|&b| b == 0), "nothing was written remotely");
}

/// A receive WR's buffer is deregistered while a SEND is being scattered
/// into it: the WR completes with LOC_PROT_ERR (its own buffers are bad),
/// the requester sees a remote operational error.
#[test]
fn dereg_of_a_receive_buffer_mid_message() {
    let mut p = pair();
    let src = p.mr(true, LEN, ALL);
    src.write(0, &[0x42; LEN]).unwrap();
    let mut rbuf = External::new(&p.b.keys, 0, 0x50_0000_0000);
    p.post_recv(false, 9, &[sge(&rbuf.mr, 0, LEN as u32)]);
    let hold = hold_after_first(&mut p);
    p.post_send(true, wr(1, WrOpcode::Send, &[sge(&src, 0, LEN as u32)]));
    step_until(&mut p, |p| received(p, false) >= 1);
    rbuf.dereg_and_poison();
    hold.store(false, Ordering::Relaxed);
    let s = p.wait(true, true, 1, 10 * SEC);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].status, WcStatus::RemOpErr);
    let r = p.wait(false, false, 1, SEC);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].wr_id, r[0].status), (9, WcStatus::LocProtErr));
    p.settle(SEC);
    assert!(rbuf.poison_intact());
}
