//! `uroce stat`: the live state of every uroce process of this user, as
//! `rdma resource show` and `rdma statistic` show kernel devices.
//!
//! Each process serves its state on a socket of its own (see
//! [`uroce_provider::stat`]); this asks every one (or one PID),
//! removes the sockets of processes that died without removing them, and
//! prints the answers as text, or as JSON (`--json`: an array of
//! [`ProcessState`]), once or every second (`--watch`).

use std::fmt::Write as _;
use std::io::{self, Write};
use std::time::Duration;
use uroce_provider::stat::{self, Answer, DeviceState, ProcessState, QpStat};

/// What `uroce stat` was asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatOptions {
    /// Only this process.
    pub pid: Option<u32>,
    /// Print JSON.
    pub json: bool,
    /// Print again every second until interrupted.
    pub watch: bool,
}

/// The answers of every uroce process of this user (or of `pid` alone).
pub fn collect(pid: Option<u32>) -> Vec<Answer> {
    match pid {
        None => stat::query_all(),
        Some(pid) => {
            let path = stat::socket_of(pid).unwrap_or_default();
            let state = stat::query_pid(pid);
            vec![Answer { pid, path, state }]
        }
    }
}

/// The states among `answers` as a JSON array, one process each.
pub fn render_json(answers: &[Answer]) -> String {
    let states: Vec<&ProcessState> = answers
        .iter()
        .filter_map(|a| a.state.as_ref().ok())
        .collect();
    serde_json::to_string_pretty(&states).unwrap_or_default()
}

/// The answers as text: a block per process, a line per object.
pub fn render_text(answers: &[Answer]) -> String {
    let mut out = String::new();
    if answers.is_empty() {
        let dirs: Vec<String> = stat::socket_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let _ = writeln!(
            out,
            "no uroce process of this user serves its state (sockets in {})",
            dirs.join(", ")
        );
    }
    for a in answers {
        match &a.state {
            Ok(p) => process_text(&mut out, p),
            Err(e) => {
                let _ = writeln!(out, "pid {} error: {e}", a.pid);
            }
        }
    }
    out
}

fn process_text(out: &mut String, p: &ProcessState) {
    let _ = writeln!(out, "pid {} comm {}", p.pid, p.comm);
    if p.devices.is_empty() {
        let _ = writeln!(out, "  no open device");
    }
    for d in &p.devices {
        device_text(out, d);
    }
}

fn device_text(out: &mut String, d: &DeviceState) {
    let _ = writeln!(
        out,
        "  dev {} addr {} port {} state {} mtu {} netdev-mtu {} io {}",
        d.name, d.addr, d.port, d.port_state, d.active_mtu, d.netdev_mtu, d.io_path
    );
    for pd in &d.pds {
        let _ = writeln!(
            out,
            "    pd pdn {} mrs {} qps {} srqs {}",
            pd.pdn, pd.mrs, pd.qps, pd.srqs
        );
    }
    for m in &d.mrs {
        let access = if m.access.is_empty() {
            "-".to_owned()
        } else {
            m.access.join(",")
        };
        let _ = writeln!(
            out,
            "    mr pdn {} lkey {:#010x} rkey {:#010x} iova {:#x} mrlen {} access {access}",
            m.pdn, m.lkey, m.rkey, m.iova, m.length
        );
    }
    for c in &d.cqs {
        let _ = writeln!(
            out,
            "    cq cqn {} cqe {} pending {} unacked-events {}",
            c.cqn, c.cqe, c.pending, c.unacked_events
        );
    }
    for s in &d.srqs {
        let _ = writeln!(
            out,
            "    srq srqn {} pdn {} wrs {}/{} max-sge {} limit {}",
            s.srqn, s.pdn, s.posted, s.max_wr, s.max_sge, s.limit
        );
    }
    for q in &d.qps {
        qp_text(out, q);
    }
    counters_text(out, &d.counters);
}

fn qp_text(out: &mut String, q: &QpStat) {
    let _ = write!(out, "    qp lqpn {:#08x}", q.qpn);
    if let Some(a) = &q.dest_addr {
        let _ = write!(out, " rqpn {:#08x} raddr {a}", q.dest_qpn);
    }
    let _ = write!(out, " type {} state {} pdn {}", q.qp_type, q.state, q.pdn);
    let _ = write!(
        out,
        " mtu {} sq-psn {:#08x} rq-psn {:#08x} sq-wrs {}/{}",
        q.path_mtu, q.sq_psn, q.rq_psn, q.sq_wrs, q.max_send_wr
    );
    match q.srq {
        Some(s) => {
            let _ = write!(out, " srqn {s}");
        }
        None => {
            let _ = write!(out, " rq-wrs {}/{}", q.rq_wrs, q.max_recv_wr);
        }
    }
    let _ = writeln!(
        out,
        " inflight-psns {} retrans {} timeouts {} rnr-naks {} seq-naks {} cqn {}/{}",
        q.inflight_psns,
        q.retransmits,
        q.retry_timeouts,
        q.rnr_naks_rcvd,
        q.seq_naks_rcvd,
        q.send_cq,
        q.recv_cq
    );
    if let Some(e) = &q.last_error {
        let _ = writeln!(out, "      last-error {e}");
    }
}

/// The non-zero counters (`--json` has them all), several to a line.
fn counters_text(out: &mut String, counters: &[(String, u64)]) {
    let mut line = String::from("    stat");
    let mut any = false;
    for (k, v) in counters.iter().filter(|(_, v)| *v != 0) {
        if line.len() > 90 {
            let _ = writeln!(out, "{line}");
            line = String::from("        ");
        }
        let _ = write!(line, " {k} {v}");
        any = true;
    }
    if !any {
        line.push_str(" (all counters 0)");
    }
    let _ = writeln!(out, "{line}");
}

/// Runs `uroce stat`. Fails when a single PID was asked for and did not
/// answer.
pub fn run(o: StatOptions) -> io::Result<()> {
    loop {
        let answers = collect(o.pid);
        let text = if o.json {
            render_json(&answers) + "\n"
        } else {
            render_text(&answers)
        };
        let mut stdout = io::stdout().lock();
        if o.watch {
            // Clear the screen and home the cursor, as watch(1) does.
            write!(stdout, "\x1b[H\x1b[2J")?;
            if !o.json {
                writeln!(stdout, "every 1s: uroce stat (Ctrl-C to end)\n")?;
            }
        }
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        drop(stdout);
        if !o.watch {
            if let (Some(_), Some(Answer { state: Err(e), .. })) = (o.pid, answers.first()) {
                return Err(io::Error::new(e.kind(), e.to_string()));
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
