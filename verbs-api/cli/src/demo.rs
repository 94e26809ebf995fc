//! `uroce demo`: two devices in one process, an RC QP pair between them,
//! and every RC operation, verified byte for byte and timed.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use uroce_verbs::loopback::{connect_rc, RcParams};
use uroce_verbs::*;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);
const TIMEOUT: Duration = Duration::from_secs(30);

/// What to run.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The two device addresses.
    pub addrs: (IpAddr, IpAddr),
    /// Ping-pong iterations.
    pub iters: u32,
    /// Bytes moved by the WRITE and READ throughput runs.
    pub bulk_bytes: usize,
    /// Message size of the throughput runs.
    pub msg_size: usize,
    /// Capture uroce0's traffic (both directions) to this pcap file.
    pub pcap: Option<std::path::PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            addrs: (
                "127.0.0.1".parse().expect("ip"),
                "127.0.0.2".parse().expect("ip"),
            ),
            iters: 1000,
            bulk_bytes: 256 << 20,
            msg_size: 1 << 20,
            pcap: None,
        }
    }
}

/// One line of the result table.
#[derive(Debug, Clone)]
pub struct DemoRow {
    /// Operation.
    pub op: &'static str,
    /// Message size.
    pub size: usize,
    /// Messages.
    pub count: u64,
    /// Mean latency per operation (µs), for ping-pong style rows.
    pub latency_us: Option<f64>,
    /// Throughput (MB/s = 10^6 bytes/s), for bulk rows.
    pub mbytes_per_s: Option<f64>,
    /// Data verified.
    pub verified: bool,
}

struct End {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn open(ip: IpAddr, name: &str) -> Result<End> {
    let ctx = Device::new(name, ip).open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4096)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })?;
    Ok(End { ctx, pd, cq, qp })
}

fn expect(cq: &CompletionQueue, n: usize, what: &str) -> Result<Vec<Wc>> {
    let wcs = cq.wait(n, TIMEOUT);
    if wcs.len() < n {
        return Err(Error::Engine(format!(
            "{what}: {} of {n} completions within {TIMEOUT:?}",
            wcs.len()
        )));
    }
    if let Some(bad) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        return Err(Error::Engine(format!(
            "{what}: wr {} completed with {}",
            bad.wr_id, bad.status
        )));
    }
    Ok(wcs)
}

fn wr(id: u64, op: WrOpcode, sge: Sge, signaled: bool) -> SendWr {
    let mut w = SendWr::new(id, op);
    if signaled {
        w.flags = SendFlags::SIGNALED;
    }
    w.sg_list.push(sge);
    w
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The table.
    pub rows: Vec<DemoRow>,
    /// Counters of the two devices at the end.
    pub counters: [(String, CounterSnapshot); 2],
}

/// Runs the demo.
pub fn run(opts: &DemoOptions) -> Result<DemoReport> {
    let (a, b) = connect(opts)?;
    let mut rows = ping_pong(&a, &b, opts.iters)?;
    rows.extend(bulk(&a, &b, opts)?);
    rows.extend(atomics(&a, &b, opts.iters)?);
    if opts.pcap.is_some() {
        a.ctx.stop_capture()?;
    }
    Ok(DemoReport {
        rows,
        counters: [
            ("uroce0".into(), a.ctx.counters()),
            ("uroce1".into(), b.ctx.counters()),
        ],
    })
}

/// The two ends (uroce0 capturing if asked), their QPs connected at the
/// smaller of the two ports' MTUs.
fn connect(opts: &DemoOptions) -> Result<(End, End)> {
    let a = open(opts.addrs.0, "uroce0")?;
    let b = open(opts.addrs.1, "uroce1")?;
    if let Some(p) = &opts.pcap {
        a.ctx.start_capture(p)?;
    }
    let mtu = a
        .ctx
        .query_port(1)?
        .active_mtu
        .min(b.ctx.query_port(1)?.active_mtu);
    let (pa, pb) = (
        uroce_provider::wire::Psn::random().value(),
        uroce_provider::wire::Psn::random().value(),
    );
    let p = RcParams {
        mtu,
        ..RcParams::default()
    };
    connect_rc(&a.qp, opts.addrs.1, b.qp.qp_num(), pa, pb, p)?;
    connect_rc(&b.qp, opts.addrs.0, a.qp.qp_num(), pb, pa, p)?;
    Ok((a, b))
}

/// SEND/RECV ping-pong at 2 bytes and 4 KiB, each ping's data checked.
fn ping_pong(a: &End, b: &End, iters: u32) -> Result<Vec<DemoRow>> {
    let mut rows = Vec::new();
    for size in [2usize, 4096] {
        let ma = a.pd.alloc_mr(size, ALL)?;
        let mb = b.pd.alloc_mr(size, ALL)?;
        let mut ok = true;
        let start = Instant::now();
        for i in 0..iters {
            let data = pattern(size, i as u8);
            ma.write(0, &data)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            b.qp.post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: [mb.sge(0, size as u32)].into_iter().collect(),
            }])
            .map_err(|e| e.1)?;
            a.qp.post_recv(&[RecvWr {
                wr_id: 2,
                sg_list: [ma.sge(0, size as u32)].into_iter().collect(),
            }])
            .map_err(|e| e.1)?;
            a.qp.post_send(&[wr(3, WrOpcode::Send, ma.sge(0, size as u32), false)])
                .map_err(|e| e.1)?;
            expect(&b.cq, 1, "ping")?;
            ok &= mb
                .to_vec(0, size)
                .map_err(|e| Error::Invalid(e.to_string()))?
                == data;
            b.qp.post_send(&[wr(4, WrOpcode::Send, mb.sge(0, size as u32), false)])
                .map_err(|e| e.1)?;
            expect(&a.cq, 1, "pong")?;
        }
        let el = start.elapsed();
        rows.push(DemoRow {
            op: "SEND/RECV ping-pong",
            size,
            count: iters as u64,
            latency_us: Some(el.as_secs_f64() * 1e6 / iters as f64 / 2.0),
            mbytes_per_s: None,
            verified: ok,
        });
        // Unsignaled sends retire with later signaled ones; drain stray CQEs.
        while a.cq.poll_one().is_some() {}
        while b.cq.poll_one().is_some() {}
    }
    Ok(rows)
}

/// RDMA WRITE and READ throughput, 16 in flight; the region written and
/// the one read back are checked at the end.
fn bulk(a: &End, b: &End, opts: &DemoOptions) -> Result<Vec<DemoRow>> {
    let size = opts.msg_size.max(1);
    let count = (opts.bulk_bytes / size).max(1);
    let src = a.pd.alloc_mr(size, ALL)?;
    let remote = b.pd.alloc_mr(size, ALL)?;
    let back = a.pd.alloc_mr(size, ALL)?;
    let data = pattern(size, 99);
    src.write(0, &data)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let mut rows = Vec::new();
    for (op, name, local) in [
        (WrOpcode::RdmaWrite, "RDMA WRITE", &src),
        (WrOpcode::RdmaRead, "RDMA READ", &back),
    ] {
        let depth = 16usize;
        let start = Instant::now();
        let mut posted = 0usize;
        let mut done = 0usize;
        while done < count {
            while posted < count && posted - done < depth {
                let mut w = wr(posted as u64, op, local.sge(0, size as u32), true);
                w.remote_addr = remote.addr();
                w.rkey = remote.rkey();
                a.qp.post_send(&[w]).map_err(|e| e.1)?;
                posted += 1;
            }
            done += expect(&a.cq, 1, name)?.len();
        }
        let el = start.elapsed();
        let landed = if op == WrOpcode::RdmaWrite {
            &remote
        } else {
            &back
        };
        let verified = landed
            .to_vec(0, size)
            .map_err(|e| Error::Invalid(e.to_string()))?
            == data;
        rows.push(DemoRow {
            op: name,
            size,
            count: count as u64,
            latency_us: None,
            mbytes_per_s: Some((count * size) as f64 / el.as_secs_f64() / 1e6),
            verified,
        });
    }
    Ok(rows)
}

/// Fetch-add then compare-swap, each checked against a local model.
fn atomics(a: &End, b: &End, iters: u32) -> Result<Vec<DemoRow>> {
    let word = b.pd.alloc_mr(8, ALL)?;
    let res = a.pd.alloc_mr(8, ALL)?;
    let w = word
        .atomic_u64(0)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    w.store(0, Ordering::SeqCst);
    let mut rows = Vec::new();
    for (op, name) in [
        (WrOpcode::AtomicFetchAndAdd, "ATOMIC FETCH_AND_ADD"),
        (WrOpcode::AtomicCmpAndSwp, "ATOMIC CMP_AND_SWP"),
    ] {
        let n = iters as u64;
        let mut ok = true;
        let start = Instant::now();
        for i in 0..n {
            let mut x = wr(i, op, res.sge(0, 8), true);
            x.remote_addr = word.addr();
            x.rkey = word.rkey();
            let before = w.load(Ordering::SeqCst);
            x.compare_add = if op == WrOpcode::AtomicFetchAndAdd {
                3
            } else {
                before
            };
            x.swap = before ^ 0x5555;
            a.qp.post_send(&[x]).map_err(|e| e.1)?;
            expect(&a.cq, 1, name)?;
            let got = res
                .atomic_u64(0)
                .map_err(|e| Error::Invalid(e.to_string()))?
                .load(Ordering::SeqCst);
            let after = w.load(Ordering::SeqCst);
            let want_after = if op == WrOpcode::AtomicFetchAndAdd {
                before + 3
            } else {
                before ^ 0x5555
            };
            ok &= got == before && after == want_after;
        }
        rows.push(DemoRow {
            op: name,
            size: 8,
            count: n,
            latency_us: Some(start.elapsed().as_secs_f64() * 1e6 / n as f64),
            mbytes_per_s: None,
            verified: ok,
        });
    }
    Ok(rows)
}

/// The counters of both devices side by side.
pub fn format_counters(c: &[(String, CounterSnapshot); 2]) -> String {
    let mut s = format!("{:<20} {:>12} {:>12}\n", "counter", c[0].0, c[1].0);
    for ((name, a), (_, b)) in c[0].1.entries().into_iter().zip(c[1].1.entries()) {
        s += &format!("{name:<20} {a:>12} {b:>12}\n");
    }
    s
}

/// The table as text.
pub fn format_table(rows: &[DemoRow]) -> String {
    let mut s = format!(
        "{:<22} {:>9} {:>7} {:>13} {:>12} {:>9}\n",
        "operation", "size", "count", "latency(us)", "MB/s", "verified"
    );
    for r in rows {
        s += &format!(
            "{:<22} {:>9} {:>7} {:>13} {:>12} {:>9}\n",
            r.op,
            r.size,
            r.count,
            r.latency_us.map_or("-".into(), |v| format!("{v:.2}")),
            r.mbytes_per_s.map_or("-".into(), |v| format!("{v:.0}")),
            if r.verified { "yes" } else { "NO" }
        );
    }
    s
}
