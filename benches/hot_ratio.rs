//! The engine's two per-byte costs, each against what it replaced, in one
//! run: the copies into and out of registered memory (the x86-64 assembly
//! path of `memory::shared` against its portable loop of Rust atomics,
//! and plain `copy_from_slice` as the yardstick), and the ICRC of a
//! packet as the engine computes it (with the masked IP/UDP prefix's CRC
//! cached per context and length) against the computation from scratch.
//! Measured in rotating short batches, so that whatever else the machine
//! does slows every side alike; prints medians and the median of the
//! per-round ratios.
//!
//! `cargo bench -p uroce-benches --bench hot_ratio`

use std::hint::black_box;
use std::time::Instant;
use uroce_benches::wire::{build, covered_len, known_ctx, DST, SPORT, SRC};
use uroce_provider::sans_io::memory::shared::Shared;
use uroce_wire::icrc::{self, HEADROOM};

const ROUNDS: usize = 101;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Nanoseconds per call of `f`, over `n` calls.
fn batch(n: u32, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// Runs the contenders in rotating order; returns each one's median time
/// and the median of its per-round ratio to the first.
fn race(n: u32, fs: &mut [&mut dyn FnMut()]) -> Vec<(f64, f64)> {
    let k = fs.len();
    for f in fs.iter_mut() {
        batch(n, *f);
    }
    let mut times = vec![Vec::new(); k];
    let mut ratios = vec![Vec::new(); k];
    for round in 0..ROUNDS {
        let mut t = vec![0.0; k];
        for j in 0..k {
            let which = (round + j) % k;
            t[which] = batch(n, fs[which]);
        }
        for j in 0..k {
            times[j].push(t[j]);
            ratios[j].push(t[j] / t[0]);
        }
    }
    (0..k)
        .map(|j| (median(&mut times[j]), median(&mut ratios[j])))
        .collect()
}

fn copies() {
    println!("copy     size  portable loop      fast path (ratio)         memcpy (ratio)");
    for size in [1024usize, 4096, 65536] {
        // A region at an odd offset of an aligned backing, as a packet's
        // payload lands at any offset of a buffer.
        let mut backing = vec![0u64; size / 8 + 8];
        // SAFETY: inside `backing`, which outlives `region`; one thread.
        let region = unsafe { Shared::new((backing.as_mut_ptr() as *mut u8).add(3), size + 32) };
        let mut buf = vec![0x5au8; size + 64];
        let mut plain = vec![0u8; size + 64];
        let n = (4 << 20) / size as u32;
        let src = vec![0x11u8; size + 64];
        let mut other = vec![0u8; size + 64];
        let load = race(
            n,
            &mut [
                &mut || region.load_portable(black_box(5), &mut buf[1..1 + size]),
                &mut || region.load(black_box(5), &mut other[1..1 + size]),
                &mut || plain[1..1 + size].copy_from_slice(black_box(&src[5..5 + size])),
            ],
        );
        let store = race(
            n,
            &mut [
                &mut || region.store_portable(black_box(5), &src[1..1 + size]),
                &mut || region.store(black_box(5), &src[1..1 + size]),
                &mut || plain[5..5 + size].copy_from_slice(black_box(&src[1..1 + size])),
            ],
        );
        for (dir, r) in [("load ", load), ("store", store)] {
            println!(
                "{dir} {size:>6}  {:>9.1} ns  {:>9.1} ns ({:.3}x)  {:>9.1} ns ({:.3}x)",
                r[0].0, r[1].0, r[1].1, r[2].0, r[2].1
            );
        }
    }
}

/// The IPv4 and UDP headers of the benchmark's packets, as on the wire
/// (our socket's: ID 0, DF).
fn headers(udp_payload_len: usize) -> ([u8; 20], [u8; 8]) {
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + 8 + udp_payload_len) as u16).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&SRC.octets());
    ip[16..20].copy_from_slice(&DST.octets());
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&SPORT.to_be_bytes());
    udp[2..4].copy_from_slice(&uroce_wire::ROCEV2_UDP_PORT.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + udp_payload_len) as u16).to_be_bytes());
    (ip, udp)
}

fn icrcs() {
    println!();
    println!("ICRC  payload   from scratch     cached prefix (ratio)   crc32fast over what it covers (ratio)");
    for len in [64usize, 1024, 4096] {
        let ctx = known_ctx();
        let pkt = build(len, &ctx);
        let (ip, udp) = headers(pkt.len());
        let covered = vec![0x5au8; covered_len(pkt.len())];
        let n = 200_000 / (len as u32 / 64 + 4);
        // Sending: the ICRC written into a packet built in a buffer.
        let mut scratch = pkt.clone();
        let send = race(
            n,
            &mut [
                &mut || {
                    black_box(icrc::compute_with_ip_header(&ip, &udp, black_box(&pkt)).unwrap());
                },
                &mut || {
                    black_box(icrc::write(black_box(&ctx), &mut scratch).unwrap());
                },
                &mut || {
                    black_box(crc32fast::hash(black_box(&covered)));
                },
            ],
        );
        // Receiving: the ICRC of a packet in a receive buffer, the IPv4
        // identification solved for (the engine's check).
        let mut rx = vec![0u8; HEADROOM];
        rx.extend_from_slice(&pkt);
        let recv = race(
            n,
            &mut [
                &mut || {
                    black_box(icrc::compute_with_ip_header(&ip, &udp, black_box(&pkt)).unwrap());
                },
                &mut || {
                    black_box(
                        icrc::verify_unknown_ipv4_id_in_place(black_box(&ctx), &mut rx).unwrap(),
                    );
                },
                &mut || {
                    black_box(crc32fast::hash(black_box(&covered)));
                },
            ],
        );
        for (dir, r) in [("send", send), ("recv", recv)] {
            println!(
                "{dir}  {len:>6}  {:>9.1} ns  {:>9.1} ns ({:.3}x)  {:>9.1} ns ({:.3}x)",
                r[0].0, r[1].0, r[1].1, r[2].0, r[2].1
            );
        }
    }
}

fn main() {
    copies();
    icrcs();
}
