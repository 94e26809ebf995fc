//! Whole-packet codec costs: parse + ICRC verify (known IPv4 header), the
//! socket path (unknown IPv4 ID: the ID solver runs), building a packet,
//! and the yardstick, `crc32fast::hash` alone over the bytes the ICRC
//! covers. RC_RDMA_WRITE_ONLY (BTH + RETH) with 64 B, 1 KiB and 4 KiB
//! payloads. Throughput is counted in UDP payload bytes (BTH to ICRC) for
//! every case, so the GB/s figures compare like with like.
//!
//! `cargo bench -p uroce-benches --bench wire`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::Duration;
use uroce_benches::wire::*;
use uroce_wire::icrc::{self, HEADROOM};
use uroce_wire::packet;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50);
    for len in SIZES {
        let ctx = known_ctx();
        let pkt = build(len, &ctx);
        g.throughput(Throughput::Bytes(pkt.len() as u64));

        // (a) parse + ICRC verify, IP header fully known.
        g.bench_with_input(BenchmarkId::new("parse_verify", len), &pkt, |b, pkt| {
            b.iter(|| {
                let p = packet::parse(black_box(pkt)).unwrap();
                p.verify_icrc(black_box(&ctx)).unwrap();
                black_box(p.payload.len())
            })
        });

        // (a') the engine's way: the datagram lies after HEADROOM bytes of
        // the receive buffer, and the ICRC is computed in place in one pass.
        let mut rx = vec![0u8; HEADROOM];
        rx.extend_from_slice(&pkt);
        g.bench_function(BenchmarkId::new("parse_verify_in_place", len), |b| {
            b.iter(|| {
                icrc::verify_in_place(black_box(&ctx), black_box(&mut rx)).unwrap();
                let p = packet::parse(black_box(&rx[HEADROOM..])).unwrap();
                black_box(p.payload.len())
            })
        });

        // Breakdown of (a): parsing alone, and the ICRC alone.
        g.bench_with_input(BenchmarkId::new("parse_only", len), &pkt, |b, pkt| {
            b.iter(|| black_box(packet::parse(black_box(pkt)).unwrap().payload.len()))
        });
        g.bench_with_input(BenchmarkId::new("icrc_only", len), &pkt, |b, pkt| {
            b.iter(|| uroce_wire::icrc::compute(black_box(&ctx), black_box(pkt)).unwrap())
        });

        // (b) parse + socket verification: the packet carries ID 0xb7e3,
        // the receiver assumes 0, so the CRC mismatches and the ID solver
        // runs.
        let rxe_pkt = build(len, &rxe_ctx());
        g.bench_with_input(
            BenchmarkId::new("parse_verify_socket", len),
            &rxe_pkt,
            |b, pkt| {
                b.iter(|| {
                    let p = packet::parse(black_box(pkt)).unwrap();
                    let sol = p.verify_icrc_socket(black_box(&ctx)).unwrap();
                    debug_assert_eq!(sol.ident, 0xb7e3);
                    black_box(sol)
                })
            },
        );

        // (c) build: headers, payload copy, pad, ICRC.
        let h = headers(len);
        let data = payload(len);
        let mut out = vec![0u8; pkt.len()];
        g.bench_function(BenchmarkId::new("emit", len), |b| {
            b.iter(|| {
                packet::emit(black_box(&h), black_box(&data), &mut out, &ctx).unwrap();
                black_box(out[out.len() - 1])
            })
        });

        // (d) yardstick: one crc32fast::hash over as many bytes as the ICRC
        // covers (8 LRH + 20 IPv4 + 8 UDP + the packet less its ICRC).
        let covered = vec![0x5au8; covered_len(pkt.len())];
        g.bench_with_input(
            BenchmarkId::new("crc32fast_alone", len),
            &covered,
            |b, bytes| b.iter(|| crc32fast::hash(black_box(bytes))),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
