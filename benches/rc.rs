//! RC over UDP between two loopback devices in one process, next to the
//! same machine's raw UDP as the yardstick (one datagram per syscall).
//!
//! * `rc_write/{4K,64K,1M}`: RDMA WRITE throughput, 16 WRs in flight.
//! * `udp_stream/{4K,64K,1M}`: the same bytes as 4 KiB datagrams (the size
//!   of our packets at MTU 4096), sendto/recv one datagram per call.
//! * `rc_pingpong/{2,4096}`: one SEND/RECV round trip per iteration.
//! * `udp_pingpong/{2,4096}`: one UDP datagram round trip per iteration.
//! * `rc_pingpong_idle_qps/{0,256,1024}`: the 2-byte round trip with that
//!   many more connected, idle QP pairs on the same devices.
//!
//! Run: `cargo bench -p uroce-benches --bench rc`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::net::UdpSocket;
use std::time::{Duration, Instant};
use uroce_benches::rc::*;
use uroce_verbs::loopback::{connect_rc, RcParams};
use uroce_verbs::*;

fn pair() -> (End, End) {
    let (ai, bi) = ("127.20.0.1", "127.20.0.2");
    let (a, b) = (end(ai), end(bi));
    connect(&a.qp, ai.parse().unwrap(), &b.qp, bi.parse().unwrap(), 1, 2);
    (a, b)
}

fn bench_rc(c: &mut Criterion) {
    let (a, b) = pair();
    let mut g = c.benchmark_group("rc_write");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for (name, size) in [("4K", 4096usize), ("64K", 64 << 10), ("1M", 1 << 20)] {
        let src = a.pd.alloc_mr(size, ALL).unwrap();
        let dst = b.pd.alloc_mr(size, ALL).unwrap();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |bch| {
            bch.iter_custom(|iters| {
                let start = Instant::now();
                let (mut posted, mut done) = (0u64, 0u64);
                while done < iters {
                    while posted < iters && posted - done < 16 {
                        let mut w = SendWr::new(posted, WrOpcode::RdmaWrite);
                        w.flags = SendFlags::SIGNALED;
                        w.sg_list.push(src.sge(0, size as u32));
                        w.remote_addr = dst.addr();
                        w.rkey = dst.rkey();
                        a.qp.post_send(&[w]).map_err(|e| e.1).unwrap();
                        posted += 1;
                    }
                    wait1(&a.cq);
                    done += 1;
                }
                start.elapsed()
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rc_pingpong");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for size in [2usize, 4096] {
        let ma = a.pd.alloc_mr(size, ALL).unwrap();
        let mb = b.pd.alloc_mr(size, ALL).unwrap();
        g.bench_function(BenchmarkId::from_parameter(size), |bch| {
            bch.iter(|| pingpong_once(&a, &b, &ma, &mb, size))
        });
        // Drain send completions left behind.
        while a.cq.poll_one().is_some() {}
        while b.cq.poll_one().is_some() {}
    }
    g.finish();
}

/// The 2-byte ping-pong with `n` more connected QP pairs on the same two
/// devices, all idle: what an idle QP costs the engine's loop.
fn bench_idle_qps(c: &mut Criterion) {
    let (a, b) = pair();
    let ma = a.pd.alloc_mr(2, ALL).unwrap();
    let mb = b.pd.alloc_mr(2, ALL).unwrap();
    let mut idle = Vec::new();
    let mut g = c.benchmark_group("rc_pingpong_idle_qps");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for n in [0usize, 256, 1024] {
        while idle.len() < n {
            let qa = a.pd.create_qp(&qp_init(&a.cq)).unwrap();
            let qb = b.pd.create_qp(&qp_init(&b.cq)).unwrap();
            let p = RcParams::default();
            connect_rc(&qa, "127.20.0.2".parse().unwrap(), qb.qp_num(), 1, 2, p).unwrap();
            connect_rc(&qb, "127.20.0.1".parse().unwrap(), qa.qp_num(), 2, 1, p).unwrap();
            idle.push((qa, qb));
        }
        g.bench_function(BenchmarkId::from_parameter(n), |bch| {
            bch.iter(|| pingpong_once(&a, &b, &ma, &mb, 2))
        });
        while a.cq.poll_one().is_some() {}
        while b.cq.poll_one().is_some() {}
    }
    g.finish();
}

fn udp_pair(a: &str, b: &str) -> (UdpSocket, UdpSocket) {
    let sa = UdpSocket::bind((a, 0)).unwrap();
    let sb = UdpSocket::bind((b, 0)).unwrap();
    sa.connect(sb.local_addr().unwrap()).unwrap();
    sb.connect(sa.local_addr().unwrap()).unwrap();
    sa.set_nonblocking(true).unwrap();
    sb.set_nonblocking(true).unwrap();
    (sa, sb)
}

/// Busy-polls a non-blocking socket for one datagram.
fn recv_spin(s: &UdpSocket, buf: &mut [u8], deadline: Instant) -> Option<usize> {
    loop {
        match s.recv(buf) {
            Ok(n) => return Some(n),
            Err(_) if Instant::now() > deadline => return None,
            Err(_) => std::hint::spin_loop(),
        }
    }
}

/// Raw UDP with the same flow control idea as RC: the receiver reports
/// its count every 8 datagrams and the sender keeps at most 32 in
/// flight (a report that does not come within 5 ms counts the rest lost).
fn bench_udp(c: &mut Criterion) {
    const WINDOW: u64 = 32;
    let mut g = c.benchmark_group("udp_stream");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    let (sa, sb) = udp_pair("127.20.1.1", "127.20.1.2");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let rx = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        let mut count = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            if sb.recv(&mut buf).is_ok() {
                count += 1;
                if count.is_multiple_of(8) {
                    let _ = sb.send(&count.to_le_bytes());
                }
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let mut sent = 0u64;
    let mut acked = 0u64;
    for (name, size) in [("4K", 4096usize), ("64K", 64 << 10), ("1M", 1 << 20)] {
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::from_parameter(name), |bch| {
            let buf = [0x5au8; 4096];
            let mut ack = [0u8; 8];
            bch.iter_custom(|iters| {
                let total = iters * (size as u64).div_ceil(4096);
                let start = Instant::now();
                for _ in 0..total {
                    while sent - acked >= WINDOW {
                        match recv_spin(&sa, &mut ack, Instant::now() + Duration::from_millis(5)) {
                            Some(8) => acked = acked.max(u64::from_le_bytes(ack)),
                            _ => acked = sent, // lost: count it gone
                        }
                    }
                    if sa.send(&buf).is_ok() {
                        sent += 1;
                    }
                    while let Ok(8) = sa.recv(&mut ack) {
                        acked = acked.max(u64::from_le_bytes(ack));
                    }
                }
                start.elapsed()
            })
        });
    }
    g.finish();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rx.join().unwrap();

    let mut g = c.benchmark_group("udp_pingpong");
    g.measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
    for size in [2usize, 4096] {
        let (sa, sb) = udp_pair("127.20.2.1", "127.20.2.2");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                match sb.recv(&mut buf) {
                    Ok(n) => {
                        let _ = sb.send(&buf[..n]);
                    }
                    Err(_) => std::hint::spin_loop(),
                }
            }
        });
        let buf = vec![0x5au8; size];
        let mut rbuf = [0u8; 4096];
        g.bench_function(BenchmarkId::from_parameter(size), |bch| {
            bch.iter(|| {
                sa.send(&buf).unwrap();
                recv_spin(&sa, &mut rbuf, Instant::now() + Duration::from_secs(1)).expect("echo");
            })
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        echo.join().unwrap();
    }
    g.finish();
}

criterion_group!(benches, bench_rc, bench_idle_qps, bench_udp);
criterion_main!(benches);
