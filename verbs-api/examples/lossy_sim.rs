//! A test on the simulated network: the same RC state machines the engine
//! runs over UDP, driven deterministically (virtual time, a seeded RNG)
//! through a network that loses 2%, duplicates 1% and reorders 1% of
//! packets. Every message still arrives once, in order, intact; the
//! requester's counters show the go-back-N work that took. The same seed
//! gives the same run, packet for packet: a failure found this way
//! reproduces.
//!
//! ```text
//! cargo run --example lossy_sim [SEED]
//! ```

use uroce_provider::sans_io::net::sim::Faults;
use uroce_provider::testing::{sge, signaled_wr, PairParams, RcPair};
use uroce_verbs::{Access, WcStatus, WrOpcode};

const MESSAGES: usize = 200;
const SIZE: usize = 3000; // three 1024-byte packets each

fn main() {
    let seed: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let faults = Faults {
        loss: 0.02,
        duplicate: 0.01,
        reorder: 0.01,
        reorder_ns: 200_000,
        delay_ns: 20_000,
        seed,
        ..Faults::default()
    };
    let mut pair = RcPair::new(seed, faults, PairParams::default());
    let src = pair.mr(true, MESSAGES * SIZE, Access::LOCAL_WRITE);
    let dst = pair.mr(false, MESSAGES * SIZE, Access::LOCAL_WRITE);
    // Twenty messages in flight at a time, as a program with a bounded
    // send queue would have: go-back-N resends at most that window.
    let (mut recvd, mut sent) = (Vec::new(), Vec::new());
    for batch in (0..MESSAGES).collect::<Vec<_>>().chunks(20) {
        for &m in batch {
            let bytes: Vec<u8> = (0..SIZE).map(|i| (m * 31 + i) as u8).collect();
            src.write(m * SIZE, &bytes).expect("write");
            let at = (m * SIZE) as u64;
            pair.post_recv(false, m as u64, &[sge(&dst, at, SIZE as u32)]);
            pair.post_send(
                true,
                signaled_wr(m as u64, WrOpcode::Send, &[sge(&src, at, SIZE as u32)]),
            );
        }
        // Up to 10 s of virtual time each; all of it takes well under a
        // second of real time.
        recvd.extend(pair.wait(false, false, batch.len(), 10_000_000_000));
        sent.extend(pair.wait(true, true, batch.len(), 10_000_000_000));
    }
    for (m, wc) in recvd.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status),
            (m as u64, WcStatus::Success),
            "in order, intact"
        );
        let mut got = vec![0u8; SIZE];
        dst.read(m * SIZE, &mut got).expect("read");
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, &b)| b == (m * 31 + i) as u8),
            "message {m}"
        );
    }
    let c = pair.a.counters.snapshot();
    println!(
        "seed {seed}: {MESSAGES} messages of {SIZE} bytes delivered in order in {:.1} ms of virtual time;",
        pair.net.now().0 as f64 / 1e6
    );
    println!(
        "  {} packets on the wire, {} retransmitted, {} retry timeouts, {} sequence NAKs received",
        pair.net.packets_sent(),
        c.retransmits,
        c.retry_timeouts,
        c.seq_naks_rcvd
    );
}
