//! What the trace hooks cost: an RC pair on the simulated network (no
//! system calls, no sleeping: CPU-bound, so a hook's cost would show)
//! streams 64-byte SENDs, 64 at a time, and prints the median time per
//! message over many rounds. Run it with `UROCE_TRACE` unset (the hooks
//! off: each a relaxed load), set (on), and built from a tree without the
//! hooks, to compare:
//!
//! `cargo run --release -p uroce-provider --example trace_cost`
//!
//! Apart from the one line that opens the trace (`trace::init`, which a
//! device does as it opens; the simulated network has no device), it
//! uses only the provider's testing face, so the same file builds
//! against older trees without that line.

use std::time::Instant;
use uroce_provider::net::faults::Faults;
use uroce_provider::testing::{sge, signaled_wr, PairParams, RcPair};
use uroce_provider::types::{Access, WrOpcode};

const BATCH: u64 = 64;
const ROUNDS: usize = 2000;
const LEN: u32 = 64;

fn main() {
    uroce_provider::trace::init();
    let mut pair = RcPair::new(1, Faults::default(), PairParams::default());
    let src = pair.mr(true, LEN as usize, Access::LOCAL_WRITE);
    let dst = pair.mr(false, (LEN as u64 * BATCH) as usize, Access::LOCAL_WRITE);
    let mut per_msg = Vec::with_capacity(ROUNDS);
    let mut id = 0u64;
    for round in 0..ROUNDS + 200 {
        let t = Instant::now();
        for k in 0..BATCH {
            pair.post_recv(false, id, &[sge(&dst, k * u64::from(LEN), LEN)]);
            let wr = signaled_wr(id, WrOpcode::Send, &[sge(&src, 0, LEN)]);
            pair.post_send(true, wr);
            id += 1;
        }
        let got = pair.wait(false, false, BATCH as usize, 10_000_000_000);
        let sent = pair.wait(true, true, BATCH as usize, 10_000_000_000);
        assert_eq!((got.len(), sent.len()), (BATCH as usize, BATCH as usize));
        // The first 200 rounds warm up.
        if round >= 200 {
            per_msg.push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        }
    }
    per_msg.sort_by(f64::total_cmp);
    let q = |f: f64| per_msg[(f * (per_msg.len() - 1) as f64) as usize];
    println!(
        "UROCE_TRACE {}: {:.0} ns per 64-byte SEND (median of {ROUNDS} rounds of {BATCH}; p10 {:.0}, p90 {:.0})",
        if std::env::var_os("UROCE_TRACE").is_some() { "set" } else { "unset" },
        q(0.5),
        q(0.1),
        q(0.9)
    );
}
