//! The wire target as one robust figure: parse + ICRC verify of a packet
//! over `crc32fast::hash` alone on the bytes its ICRC covers, measured in
//! alternating short batches so that whatever else the machine does
//! slows both sides alike. Prints, per payload size, the median of the
//! per-round ratios and the two median times.
//!
//! `cargo bench -p uroce-benches --bench wire_ratio`

use std::hint::black_box;
use std::time::Instant;
use uroce_benches::wire::*;
use uroce_wire::packet;

const ROUNDS: usize = 301;
const BATCH: u32 = 2_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`, over one batch.
fn batch(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..BATCH {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(BATCH)
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is not used here.
    println!(
        "payload  parse+verify  crc32fast alone  ratio (median of {ROUNDS} alternating rounds)"
    );
    for len in SIZES {
        let ctx = known_ctx();
        let pkt = build(len, &ctx);
        let covered = vec![0x5au8; covered_len(pkt.len())];
        let ours = || {
            let p = packet::parse(black_box(&pkt)).unwrap();
            p.verify_icrc(black_box(&ctx)).unwrap();
            black_box(p.payload.len());
        };
        let yardstick = || {
            black_box(crc32fast::hash(black_box(&covered)));
        };
        // Warm up both.
        for _ in 0..20 {
            batch(ours);
            batch(yardstick);
        }
        let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Alternate which goes first, so neither always follows the other.
            let (x, y) = if round % 2 == 0 {
                let x = batch(ours);
                (x, batch(yardstick))
            } else {
                let y = batch(yardstick);
                (batch(ours), y)
            };
            a.push(x);
            b.push(y);
            r.push(x / y);
        }
        println!(
            "{len:>7}  {:>9.1} ns  {:>12.1} ns  {:>6.3}x",
            median(&mut a),
            median(&mut b),
            median(&mut r)
        );
    }
}
