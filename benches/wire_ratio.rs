//! The wire target as one robust figure: parse + ICRC verify of a packet
//! over `crc32fast::hash` alone on the bytes its ICRC covers, measured in
//! rotating short batches so that whatever else the machine does slows
//! every side alike. Two ways to verify: from the packet alone (the
//! prefix hashed apart), and in place in a receive buffer with headroom
//! (as the engine does: one pass). Prints, per payload size, the median
//! times and the medians of the per-round ratios.
//!
//! `cargo bench -p uroce-benches --bench wire_ratio`

use std::hint::black_box;
use std::time::Instant;
use uroce_benches::wire::*;
use uroce_wire::icrc::{self, HEADROOM};
use uroce_wire::packet;

const ROUNDS: usize = 301;
const BATCH: u32 = 2_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`, over one batch.
fn batch(f: &mut impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..BATCH {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(BATCH)
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is not used here.
    println!("payload  parse+verify  (ratio)  parse+verify in place  (ratio)  crc32fast alone");
    for len in SIZES {
        let ctx = known_ctx();
        let pkt = build(len, &ctx);
        let covered = vec![0x5au8; covered_len(pkt.len())];
        let mut ours = || {
            let p = packet::parse(black_box(&pkt)).unwrap();
            p.verify_icrc(black_box(&ctx)).unwrap();
            black_box(&p);
        };
        let mut rx = vec![0u8; HEADROOM];
        rx.extend_from_slice(&pkt);
        let mut in_place = || {
            icrc::verify_in_place(black_box(&ctx), black_box(&mut rx)).unwrap();
            let p = packet::parse(black_box(&rx[HEADROOM..])).unwrap();
            black_box(&p);
        };
        let mut yardstick = || {
            black_box(crc32fast::hash(black_box(&covered)));
        };
        // Warm up.
        for _ in 0..20 {
            batch(&mut ours);
            batch(&mut in_place);
            batch(&mut yardstick);
        }
        let (mut a, mut a2, mut b, mut r, mut r2) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            // Rotate the order, so that none always follows another.
            let mut t = [0.0; 3];
            for k in 0..3 {
                let which = (round + k) % 3;
                t[which] = match which {
                    0 => batch(&mut ours),
                    1 => batch(&mut in_place),
                    _ => batch(&mut yardstick),
                };
            }
            a.push(t[0]);
            a2.push(t[1]);
            b.push(t[2]);
            r.push(t[0] / t[2]);
            r2.push(t[1] / t[2]);
        }
        println!(
            "{len:>7}  {:>9.1} ns {:>6.3}x  {:>9.1} ns {:>6.3}x  {:>12.1} ns",
            median(&mut a),
            median(&mut r),
            median(&mut a2),
            median(&mut r2),
            median(&mut b),
        );
    }
}
