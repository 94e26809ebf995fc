//! What the diagnostic tools cost, off and on, against the same code
//! with them compiled out (`--cfg uroce_no_diag`, see
//! `uroce_provider::diag`), measured in one run:
//!
//! `bash benches/diag_cost.sh [ROUNDS]` builds this example (of the
//! package `uroce-benches`) twice (normally, and with the tools compiled
//! out) and runs `diag_cost --compare YARDSTICK_EXE --rounds ROUNDS`.
//!
//! Without arguments the example measures four workloads in its own
//! process, with the environment as it is, and prints one line per
//! workload (`name nanoseconds-per-message`):
//!
//! * `sim_send64`, `sim_write64k`: an RC pair on the simulated network
//!   (no system calls, no sleeping: CPU-bound, so that a hook's cost
//!   shows), 64-byte SENDs and 64 KiB WRITEs, 64 at a time, at MTU 4096.
//!   These drive the transports directly: the timeline's hooks,
//!   the explanations' recorder and the per-QP tally `uroce stat` reads
//!   are on this path; the checker's are not (it sits at the verbs calls).
//! * `udp_send64`, `udp_write64k`: the same traffic between two devices on
//!   UDP loopback (127.122.0.1 and .2), through the device's verbs calls
//!   and its engine thread: every hook is on this path, the checker's too,
//!   and `uroce stat`'s server answers from it (SENDs 64 at a time,
//!   WRITEs 16).
//!
//! Each is the median over many batches of the time per message.
//!
//! With `--compare YARDSTICK_EXE` it is the driver: each round runs this
//! executable once per configuration (all off, `UROCE_CHECK=1`,
//! `UROCE_EXPLAIN=1`, `UROCE_TRACE=FILE`, `uroce stat` polled every
//! 10 ms, all on; in an order that rotates from round to round) with the
//! yardstick before, between and after them. Each run's ratio is against
//! the mean of the yardstick runs just before and after it, and the
//! yardstick's own inner runs, against their neighbours, show the noise
//! floor. The yardstick runs with `UROCE_TRACE` set and must write
//! nothing (and the trace rows something), so that a build with the
//! tools cannot pass for it. It prints one table: per configuration and workload the median
//! time and the median of the ratios with their quartiles, minimum and
//! maximum.
//! Nothing is asserted about time.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce_provider::device::{CqHandle, Device, QpHandle, QpSpec};
use uroce_provider::qp_attr::{AddressVector, AttrMask, QpAttr, QpCap};
use uroce_provider::sans_io::net::faults::Faults;
use uroce_provider::testing::{sge, signaled_wr, PairParams, RcPair};
use uroce_provider::types::{
    Access, Mtu, QpState, QpType, RecvWr, Wc, WcOpcode, WcStatus, WrOpcode,
};

/// The workloads, in the order a measuring run prints them.
const WORKLOADS: [(&str, &str); 4] = [
    ("sim_send64", "sim SEND 64 B"),
    ("sim_write64k", "sim WRITE 64 KiB"),
    ("udp_send64", "UDP SEND 64 B"),
    ("udp_write64k", "UDP WRITE 64 KiB"),
];

/// The loopback addresses of the UDP workloads.
const ADDRS: [&str; 2] = ["127.122.0.1", "127.122.0.2"];

/// How often the `uroce stat` row asks the process for its state.
const STAT_PERIOD: Duration = Duration::from_millis(10);

/// The environment variables of the tools, cleared in every child.
const TOOL_ENV: [&str; 4] = ["UROCE_CHECK", "UROCE_EXPLAIN", "UROCE_TRACE", "UROCE_STAT"];

/// Batches measured per workload (a quarter in `UROCE_DIAG_QUICK`).
fn batches(full: usize) -> usize {
    if std::env::var_os("UROCE_DIAG_QUICK").is_some() {
        full / 4
    } else {
        full
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => measure(),
        Some("--compare") if args.len() >= 2 => {
            let rounds = match args.get(2).map(String::as_str) {
                Some("--rounds") => args.get(3).and_then(|r| r.parse().ok()).unwrap_or(8),
                _ => 8,
            };
            compare(Path::new(&args[1]), rounds);
        }
        _ => {
            eprintln!("usage: diag_cost [--compare YARDSTICK_EXE [--rounds N]]");
            std::process::exit(2);
        }
    }
}

// ------------------------------------------------------------- measuring

fn measure() {
    let figures = [
        sim(WrOpcode::Send, 64, 64, batches(1000)),
        sim(WrOpcode::RdmaWrite, 64 << 10, 64, batches(50)),
    ];
    let ends = udp_pair();
    let figures = figures.into_iter().chain([
        udp(&ends, WrOpcode::Send, 64, 64, batches(300)),
        udp(&ends, WrOpcode::RdmaWrite, 64 << 10, 16, batches(100)),
    ]);
    for ((name, _), ns) in WORKLOADS.iter().zip(figures) {
        println!("{name} {ns:.1}");
    }
}

/// Waits until the trace's writer has caught up (with `UROCE_TRACE`),
/// so that a workload does not pay for the events of the one before.
fn trace_caught_up() {
    for _ in 0..20 {
        let t = Instant::now();
        uroce_provider::trace::flush();
        // A flush gives up after half a second.
        if t.elapsed() < Duration::from_millis(400) {
            return;
        }
    }
}

/// The median of the per-batch time per message; the first tenth of the
/// batches warms up.
fn median_per_msg(n: usize, per_batch: u64, mut batch: impl FnMut()) -> f64 {
    let mut per_msg = Vec::with_capacity(n);
    for round in 0..n + n / 10 {
        let t = Instant::now();
        batch();
        if round >= n / 10 {
            per_msg.push(t.elapsed().as_nanos() as f64 / per_batch as f64);
        }
    }
    trace_caught_up();
    per_msg.sort_by(f64::total_cmp);
    per_msg[per_msg.len() / 2]
}

/// The space a message of `len` bytes takes in a destination region:
/// itself and the 4 KiB its start moves through (see [`offsets`]).
fn slot(len: u32) -> u64 {
    u64::from(len) + 4096
}

/// Where message `id`, the `k`th of its batch, is read from (an offset
/// of the source region) and written to (of the destination region).
///
/// The start moves through the 64 cache lines of a page, at the source
/// and (in another order) at the destination: how fast a copy runs
/// depends on where its source and destination lie relative to each
/// other and to the packet buffers (a 64 KiB WRITE on the simulated
/// network took 16 or 31 µs depending on the heap's layout alone, which
/// differs between the two builds compared). Spread over every
/// placement, each batch costs their mean, whatever the layout.
fn offsets(id: u64, k: u64, len: u32) -> (u64, u64) {
    let from = (id % 64) * 64;
    let to = k * slot(len) + (id * 7 % 64) * 64;
    (from, to)
}

/// Messages of `len` bytes, `per_batch` at a time, on the simulated
/// network.
fn sim(op: WrOpcode, len: u32, per_batch: u64, n: usize) -> f64 {
    uroce_provider::trace::init();
    let p = PairParams {
        mtu: Mtu::Mtu4096,
        ..PairParams::default()
    };
    let mut pair = RcPair::new(1, Faults::default(), p);
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let src = pair.mr(true, len as usize + 4096, access);
    let dst = pair.mr(false, (slot(len) * per_batch) as usize, access);
    let mut id = 0u64;
    median_per_msg(n, per_batch, || {
        for k in 0..per_batch {
            let (from, to) = offsets(id, k, len);
            let mut wr = signaled_wr(id, op, &[sge(&src, from, len)]);
            if op == WrOpcode::Send {
                pair.post_recv(false, id, &[sge(&dst, to, len)]);
            } else {
                wr.remote_addr = dst.iova() + to;
                wr.rkey = dst.rkey();
            }
            pair.post_send(true, wr);
            id += 1;
        }
        if op == WrOpcode::Send {
            let got = pair.wait(false, false, per_batch as usize, 10_000_000_000);
            assert_eq!(got.len(), per_batch as usize, "receive completions");
        }
        let sent = pair.wait(true, true, per_batch as usize, 10_000_000_000);
        assert_eq!(sent.len(), per_batch as usize, "send completions");
    })
}

/// One device's side of the UDP pair.
struct End {
    dev: Device,
    cq: CqHandle,
    qp: QpHandle,
    mr: uroce_provider::device::MrHandle,
}

/// Two devices on loopback with one connected RC QP each and a 2 MiB
/// region each.
fn udp_pair() -> [End; 2] {
    let ends = ADDRS.map(|a| {
        let ip: IpAddr = a.parse().expect("an address");
        let dev = Device::open(ip).unwrap_or_else(|e| panic!("opening {ip}: {e}"));
        let pd = dev.alloc_pd();
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = dev.reg_zeroed(pd, 2 << 20, access).expect("a region");
        let cq = dev.create_cq(1024, None, 0).expect("a CQ");
        let spec = QpSpec {
            qp_type: QpType::Rc,
            pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        let qp = dev.create_qp(&spec).expect("a QP");
        End { dev, cq, qp, mr }
    });
    for (me, peer) in [(0, 1), (1, 0)] {
        connect(&ends[me].qp, ends[peer].dev.ip(), ends[peer].qp.qp_num());
    }
    ends
}

/// RESET -> INIT -> RTR -> RTS towards `peer` (rc_pingpong's attributes
/// at MTU 4096; both sides start at PSN 0).
fn connect(qp: &QpHandle, peer: IpAddr, dest_qpn: u32) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
    qp.modify(&a, init).expect("RESET->INIT");
    a.qp_state = QpState::Rtr;
    a.ah_attr = AddressVector::to_ip(peer);
    a.path_mtu = Mtu::Mtu4096;
    a.dest_qp_num = dest_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    qp.modify(&a, AttrMask::to_rtr(true)).expect("INIT->RTR");
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    qp.modify(&a, AttrMask::to_rts(true)).expect("RTR->RTS");
}

/// Polls `cq` until `n` completions came (busy, as perftest does, but
/// yielding the CPU when none is there).
fn poll_n(cq: &CqHandle, n: usize) {
    let mut wc = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 16];
    let (mut got, start) = (0, Instant::now());
    while got < n {
        let k = cq.poll(&mut wc);
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::Success, "completion {c:?}");
        }
        got += k;
        if k == 0 {
            // Two engine threads and this one share the cores: let the
            // engines run rather than spin through this thread's slice.
            std::thread::yield_now();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "completions lost"
        );
    }
}

/// Messages of `len` bytes from the first end to the second, `per_batch`
/// at a time.
fn udp(ends: &[End; 2], op: WrOpcode, len: u32, per_batch: u64, n: usize) -> f64 {
    let [a, b] = ends;
    let mut id = 0u64;
    median_per_msg(n, per_batch, || {
        for k in 0..per_batch {
            let (from, to) = offsets(id, k, len);
            let mut wr = signaled_wr(id, op, &[a.mr.sge(from, len)]);
            if op == WrOpcode::Send {
                let recv = RecvWr {
                    wr_id: id,
                    sg_list: [b.mr.sge(to, len)].into_iter().collect(),
                };
                b.qp.post_recv(&[recv]).map_err(|e| e.1).expect("post_recv");
            } else {
                wr.remote_addr = b.mr.iova() + to;
                wr.rkey = b.mr.rkey();
            }
            a.qp.post_send(&[wr]).map_err(|e| e.1).expect("post_send");
            id += 1;
        }
        if op == WrOpcode::Send {
            poll_n(&b.cq, per_batch as usize);
        }
        poll_n(&a.cq, per_batch as usize);
    })
}

// ------------------------------------------------------------- driving

/// One row of the table: which executable, with which tools.
struct Config {
    name: &'static str,
    /// The yardstick's executable (else this one).
    yardstick: bool,
    env: &'static [(&'static str, &'static str)],
    trace: bool,
    stat: bool,
}

const CONFIGS: [Config; 6] = [
    Config {
        yardstick: false,
        name: "all off",
        env: &[],
        trace: false,
        stat: false,
    },
    Config {
        yardstick: false,
        name: "UROCE_CHECK=1",
        env: &[("UROCE_CHECK", "1")],
        trace: false,
        stat: false,
    },
    Config {
        yardstick: false,
        name: "UROCE_EXPLAIN=1",
        env: &[("UROCE_EXPLAIN", "1")],
        trace: false,
        stat: false,
    },
    Config {
        yardstick: false,
        name: "UROCE_TRACE=FILE",
        env: &[],
        trace: true,
        stat: false,
    },
    Config {
        yardstick: false,
        name: "uroce stat polled /10 ms",
        env: &[],
        trace: false,
        stat: true,
    },
    Config {
        yardstick: false,
        name: "all on",
        env: &[("UROCE_CHECK", "1"), ("UROCE_EXPLAIN", "1")],
        trace: true,
        stat: true,
    },
];

/// The yardstick runs with `UROCE_TRACE` set too: it must write nothing,
/// which shows that its hooks are compiled out.
const YARDSTICK: Config = Config {
    yardstick: true,
    name: "compiled out",
    env: &[],
    trace: true,
    stat: false,
};

/// One child run's figures by workload, and how many `uroce stat`
/// answers it gave.
struct Run {
    ns: BTreeMap<String, f64>,
    stat_answers: u64,
}

fn run(exe: &Path, c: &Config, scratch: &Path) -> Run {
    let mut cmd = Command::new(exe);
    for v in TOOL_ENV {
        cmd.env_remove(v);
    }
    cmd.envs(c.env.iter().copied());
    let trace = scratch.join("trace.json");
    if c.trace {
        cmd.env("UROCE_TRACE", &trace);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    let (stop, answers) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let poller = c.stat.then(|| {
        let (pid, stop, answers) = (child.id(), stop.clone(), answers.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if uroce_provider::stat::query_pid(pid).is_ok() {
                    answers.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(STAT_PERIOD);
            }
        })
    });
    let out = child.wait_with_output().expect("the child's output");
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = poller {
        let _ = p.join();
    }
    if c.trace {
        let written = std::fs::metadata(&trace).map_or(0, |m| m.len());
        let _ = std::fs::remove_file(&trace);
        assert_eq!(
            c.yardstick,
            written == 0,
            "{} wrote {written} bytes of trace: {}",
            exe.display(),
            if c.yardstick {
                "it is not built with --cfg uroce_no_diag"
            } else {
                "its trace is off"
            }
        );
    }
    assert!(
        out.status.success(),
        "{} ({}) failed",
        exe.display(),
        c.name
    );
    let ns = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    Run {
        ns,
        stat_answers: answers.load(Ordering::Relaxed),
    }
}

/// Per row and workload: the times and the per-round ratios.
#[derive(Default)]
struct Cell {
    ns: Vec<f64>,
    ratio: Vec<f64>,
}

/// The `q` quantile of `v` (0.5: the median), interpolated.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let at = q * (v.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (at - lo as f64)
}

fn median(v: &[f64]) -> f64 {
    quantile(v, 0.5)
}

fn compare(yard: &Path, rounds: usize) {
    let me = std::env::current_exe().expect("this executable");
    let scratch = std::env::temp_dir().join(format!("uroce-diag-cost-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).expect("a scratch directory");
    // Rows: the yardstick, the yardstick against its neighbours, then
    // the configurations.
    let mut cells: Vec<BTreeMap<&str, Cell>> =
        (0..CONFIGS.len() + 2).map(|_| Default::default()).collect();
    let mut stat_answers = 0;
    for round in 0..rounds {
        // The yardstick runs between every two configurations (and
        // first and last): each run is compared with the yardstick's runs
        // just before and after it, seconds apart, so that what the
        // machine's other work does to both is alike.
        let mut yards = vec![run(yard, &YARDSTICK, &scratch)];
        let mut runs = Vec::new();
        for j in 0..CONFIGS.len() {
            let i = (round + j) % CONFIGS.len();
            runs.push((i, run(&me, &CONFIGS[i], &scratch)));
            yards.push(run(yard, &YARDSTICK, &scratch));
        }
        for (w, _) in WORKLOADS {
            let y: Vec<f64> = yards.iter().map(|r| r.ns[w]).collect();
            let mut put = |row: usize, ns: f64, ratio: f64| {
                let c = cells[row].entry(w).or_default();
                c.ns.push(ns);
                c.ratio.push(ratio);
            };
            for (k, &ns) in y.iter().enumerate() {
                put(0, ns, 1.0);
                if k > 0 && k + 1 < y.len() {
                    put(1, ns, ns / ((y[k - 1] + y[k + 1]) / 2.0));
                }
            }
            for (k, (i, r)) in runs.iter().enumerate() {
                put(i + 2, r.ns[w], r.ns[w] / ((y[k] + y[k + 1]) / 2.0));
            }
        }
        stat_answers += runs.iter().map(|(_, r)| r.stat_answers).sum::<u64>();
        eprintln!("diag_cost: round {} of {rounds} done", round + 1);
    }
    let _ = std::fs::remove_dir(&scratch);
    print_table(&cells, rounds, stat_answers);
}

fn print_table(cells: &[BTreeMap<&str, Cell>], rounds: usize, stat_answers: u64) {
    let mut head = String::from("| tools |");
    let mut rule = String::from("| --- |");
    for (_, title) in WORKLOADS {
        head.push_str(&format!(" {title} |"));
        rule.push_str(" ---: |");
    }
    println!("{head}\n{rule}");
    let names = [
        "compiled out (yardstick)",
        "compiled out, against its neighbours",
    ]
    .into_iter()
    .chain(CONFIGS.iter().map(|c| c.name));
    for (row, name) in names.enumerate() {
        let mut line = format!("| {name} |");
        for (w, _) in WORKLOADS {
            let c = &cells[row][w];
            if row == 0 {
                line.push_str(&format!(" {:.0} ns |", median(&c.ns)));
                continue;
            }
            let q = |f| quantile(&c.ratio, f);
            line.push_str(&format!(
                " {:.0} ns, {:.3} [{:.2}-{:.2}] ({:.2}-{:.2}) |",
                median(&c.ns),
                q(0.5),
                q(0.25),
                q(0.75),
                q(0.0),
                q(1.0)
            ));
        }
        println!("{line}");
    }
    println!(
        "\n{rounds} rounds. A cell: the median time per message; the median of the ratios of \
         each run to the yardstick (the mean of the compiled-out runs just before and after it), \
         [their middle half] and (their minimum-maximum). `uroce stat` answered {stat_answers} \
         requests in all."
    );
}
