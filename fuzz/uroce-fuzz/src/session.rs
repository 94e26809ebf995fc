//! A fuzzing session as `uroce fuzz` runs it: a target named on the
//! command line, a live status line, findings written to a directory
//! with the command that replays each, and the replay itself.

use super::live::LiveTarget;
use super::replay::{Options as ReplayOptions, ReplayPlan};
use super::sim::{PlantedBug, SimTarget};
use super::target::{Target, TargetError};
use super::{fuzz, fuzz_cases, run_case, Config, Finding, Outcome, Report, Status};
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Which target to play against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// uroce's own QP machines on the simulated network, with a planted
    /// bug or none.
    Sim(Option<PlantedBug>),
    /// A live endpoint: its address, the fuzzer's address, the agent.
    Udp {
        /// The target device's address.
        target: IpAddr,
        /// The address the fuzzer sends from (and binds :4791).
        fuzzer: IpAddr,
        /// The agent's TCP address.
        agent: SocketAddr,
    },
}

impl TargetSpec {
    /// Parses `sim`, `sim:BUG` (`write-inside-send`, `long-read`,
    /// `ghost-ack`, `window-any-qp`) or
    /// `udp:IP` (with `fuzzer` and `agent`, which default to ... none: a
    /// live target needs both).
    pub fn parse(
        s: &str,
        fuzzer: Option<IpAddr>,
        agent: Option<SocketAddr>,
    ) -> Result<TargetSpec, String> {
        if s == "sim" {
            return Ok(TargetSpec::Sim(None));
        }
        if let Some(bug) = s.strip_prefix("sim:") {
            return PlantedBug::from_name(bug)
                .map(|b| TargetSpec::Sim(Some(b)))
                .ok_or_else(|| {
                    let planted = if cfg!(feature = "planted") {
                        ", or a planted mistake"
                    } else {
                        "; planted mistakes need uroce-fuzz's feature `planted`"
                    };
                    format!(
                        "unknown planted bug {bug:?} (write-inside-send, long-read, ghost-ack, window-any-qp{planted})"
                    )
                });
        }
        if let Some(ip) = s.strip_prefix("udp:") {
            let target: IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
            let fuzzer = fuzzer.ok_or("a udp target needs --fuzzer ADDRESS (the fuzzer's own)")?;
            let agent = agent.ok_or("a udp target needs --agent HOST:PORT (uroce-fuzz-agent)")?;
            return Ok(TargetSpec::Udp {
                target,
                fuzzer,
                agent,
            });
        }
        Err(format!("unknown target {s:?} (sim, sim:BUG, udp:IP)"))
    }

    /// The command-line words that name this target.
    pub fn args(&self) -> String {
        match self {
            TargetSpec::Sim(None) => "--target sim".into(),
            TargetSpec::Sim(Some(bug)) => format!("--target sim:{}", bug.name()),
            TargetSpec::Udp {
                target,
                fuzzer,
                agent,
            } => {
                format!("--target udp:{target} --fuzzer {fuzzer} --agent {agent}")
            }
        }
    }

    /// Opens the target.
    pub fn open(&self, seed: u64) -> Result<Box<dyn Target>, TargetError> {
        Ok(match self {
            TargetSpec::Sim(bug) => Box::new(SimTarget::new(seed, *bug)),
            TargetSpec::Udp {
                target,
                fuzzer,
                agent,
            } => Box::new(LiveTarget::new(*fuzzer, *target, *agent)?),
        })
    }
}

/// The live status line: rewritten in place on a terminal, a line every
/// 5 s otherwise (CI logs). Call `done` once the run is over.
struct StatusLine {
    tty: bool,
    last: Instant,
}

impl StatusLine {
    fn new() -> StatusLine {
        StatusLine {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
        }
    }
    fn show(&mut self, s: &Status) {
        if self.tty {
            eprint!("\r{s}   ");
        } else if self.last.elapsed() >= Duration::from_secs(5) {
            self.last = Instant::now();
            eprintln!("{s}");
        }
    }
    fn done(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

fn limit_text(cfg: &Config) -> String {
    cfg.time_limit
        .map_or(String::new(), |t| format!(", {} s", t.as_secs()))
}

/// Runs a session: `cfg` against `spec`, the status line on stderr,
/// findings into `out_dir`, a summary on `log`.
pub fn run(
    spec: &TargetSpec,
    cfg: &Config,
    out_dir: &Path,
    log: &mut dyn Write,
) -> Result<Report, TargetError> {
    let mut target = spec.open(cfg.seed)?;
    let _ = writeln!(
        log,
        "uroce fuzz: {:?} {:?} cases against {} (seed {}, up to {} cases{})",
        cfg.mode,
        cfg.qp_type,
        target.name(),
        cfg.seed,
        cfg.cases,
        limit_text(cfg)
    );
    let mut line = StatusLine::new();
    let report = fuzz(&mut *target, cfg, |s: &Status| line.show(s))?;
    line.done();
    let _ = writeln!(
        log,
        "{} cases in {:.1} s ({:.0}/s), {} (QP state, opcode, PSN class) combinations, {} findings",
        report.cases,
        report.elapsed.as_secs_f64(),
        report.cases as f64 / report.elapsed.as_secs_f64().max(1e-9),
        report.coverage.len(),
        report.findings.len()
    );
    if report.target_died {
        let _ = writeln!(log, "the target stopped answering: the run ended there");
    }
    if !report.unconfirmed.is_empty() {
        let _ = writeln!(
            log,
            "{} cases tripped an oracle that a run waiting {} ms for the answers did not: \
             late answers, not findings (cases {:?})",
            report.unconfirmed.len(),
            super::PATIENT_TAIL_US / 1000,
            report.unconfirmed
        );
    }
    print_findings(&report, spec, out_dir, log);
    Ok(report)
}

/// Saves each finding of `report` into `out_dir` and prints it with the
/// command that replays it.
fn print_findings(report: &Report, spec: &TargetSpec, out_dir: &Path, log: &mut dyn Write) {
    for (i, (f, packets)) in report.findings.iter().enumerate() {
        let name = format!("finding-{}", i + 1);
        let saved = f.save(out_dir, &name, packets);
        let kinds: Vec<String> = f.violations.iter().map(|v| format!("{v:?}")).collect();
        let _ = writeln!(
            log,
            "finding {}: {} (case {}, {} steps minimized to {} in {} trials)",
            i + 1,
            kinds.join(", "),
            f.index,
            f.original_steps,
            f.case.steps.len(),
            f.trials
        );
        for r in &f.rules {
            let _ = writeln!(log, "  rule: {r}");
        }
        print_steps(log, &f.case);
        match saved {
            Ok(json) => {
                let _ = writeln!(
                    log,
                    "  saved: {} and .pcap\n  replay: uroce fuzz replay {} {}",
                    json.display(),
                    json.display(),
                    spec.args()
                );
            }
            Err(e) => {
                let _ = writeln!(log, "  could not save it in {}: {e}", out_dir.display());
            }
        }
    }
}

/// A case's posts and packets, a line each. A response's PSN is counted
/// from the target's first request ("sq psn"), a request's from the PSN
/// the target expects.
fn print_steps(log: &mut dyn Write, case: &super::case::Case) {
    for s in &case.steps {
        match s {
            super::case::Step::Post(w) => {
                let _ = writeln!(
                    log,
                    "  post: {:?} {} bytes (wr_id {:#x})",
                    w.op, w.len, w.wr_id
                );
            }
            super::case::Step::Packet(p) => {
                let name = p.info().map_or("unknown opcode", |i| i.name);
                let base = if p.resp { "sq psn" } else { "psn" };
                let _ = writeln!(
                    log,
                    "  packet: {name} {base}{:+} {}",
                    p.psn_off,
                    describe(p)
                );
            }
            super::case::Step::Wait(_) => {}
        }
    }
}

/// The fields of a packet that are not the valid defaults, briefly.
fn describe(p: &super::case::PacketSpec) -> String {
    use super::case::{Dest, Icrc};
    let mut v = Vec::new();
    if let Some(r) = p.raw_opcode {
        v.push(format!("opcode byte {r:#04x}"));
    }
    if p.dest != Dest::Target {
        v.push(format!("dest {:?}", p.dest));
    }
    if let Icrc::Wrong(x) = p.icrc {
        v.push(format!("ICRC ^ {x:#x}"));
    }
    if let Some(t) = p.truncate {
        v.push(format!("cut to {t} bytes"));
    }
    if let Some(pad) = p.pad {
        v.push(format!("pad {pad}"));
    }
    if p.tver != 0 {
        v.push(format!("tver {}", p.tver));
    }
    if p.pkey != 0xffff {
        v.push(format!("pkey {:#06x}", p.pkey));
    }
    // The extension headers the opcode byte's layout carries (a field
    // the case leaves unset goes out as its default: offset 0, the valid
    // key, length 0).
    let headers = p.info().map_or(&[][..], |i| i.headers);
    if headers.contains(&uroce_wire::Ext::Reth) {
        let (off, key, len) = p.reth.unwrap_or((0, super::case::Key::Valid, 0));
        v.push(format!("RETH +{off} {key:?} len {len}"));
    }
    if headers.contains(&uroce_wire::Ext::AtomicEth) {
        let (off, key, ..) = p.atomic.unwrap_or((0, super::case::Key::Valid, 1, 0));
        v.push(format!("AtomicETH +{off} {key:?}"));
    }
    if headers.contains(&uroce_wire::Ext::Aeth) {
        let syn = uroce_wire::AethSyndrome::from_byte(p.aeth.map_or(0, |a| a.0));
        v.push(format!("AETH {syn:?}"));
    }
    if p.info().is_some_and(|i| i.has_payload) {
        v.push(format!("payload {}", p.payload.0));
    }
    v.join(", ")
}

/// Replays a saved finding on `spec`; returns the violations of the run.
pub fn replay(path: &Path, spec: &TargetSpec, log: &mut dyn Write) -> Result<usize, String> {
    let f = Finding::load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut target = spec.open(f.seed).map_err(|e| e.to_string())?;
    let out = run_case(&mut *target, f.qp_type, f.recvs, &f.case).map_err(|e| e.to_string())?;
    let _ = writeln!(
        log,
        "replayed {} ({} steps) on {}: QP {:?}, {} packets, {} answers",
        path.display(),
        f.case.steps.len(),
        target.name(),
        out.obs.qp_state,
        out.packets.iter().filter(|p| p.sent).count(),
        out.packets.iter().filter(|p| !p.sent).count()
    );
    print_outcome(&out, log);
    Ok(out.violations.len())
}

/// The answers of a run and the oracles it tripped.
fn print_outcome(out: &Outcome, log: &mut dyn Write) {
    let answers: Vec<String> = super::diff::answer_kinds(out);
    if !answers.is_empty() {
        let _ = writeln!(log, "  answers: {}", answers.join(", "));
    }
    for v in &out.violations {
        let _ = writeln!(log, "  {v:?}");
    }
    if out.violations.is_empty() {
        let _ = writeln!(log, "  no oracle tripped");
    }
}

/// Replays a capture's flow on `spec` ([`super::replay`]), then
/// `opts.mutate` mutants of it, findings into `out_dir`; returns the
/// oracles the replay tripped plus the mutants' findings.
pub fn replay_pcap(
    path: &Path,
    opts: &ReplayOptions,
    spec: &TargetSpec,
    out_dir: &Path,
    log: &mut dyn Write,
) -> Result<usize, String> {
    let plan = ReplayPlan::from_file(path, opts)?;
    let _ = write!(log, "uroce fuzz pcap {}: {plan}", path.display());
    let mut target = spec.open(opts.seed).map_err(|e| e.to_string())?;
    let recvs = plan.recvs();
    let out = run_case(&mut *target, plan.qp_type, recvs, &plan.case).map_err(|e| e.to_string())?;
    let sent = out.packets.iter().filter(|p| p.sent).count();
    let answers = out.packets.len() - sent;
    let _ = writeln!(
        log,
        "replayed on {} (QP {:#x}, PSN {:#08x}, region {:#x} + {} bytes): {sent} packets, {answers} answers",
        target.name(),
        out.conn.qpn,
        out.conn.rq_psn,
        out.conn.va,
        out.conn.len
    );
    for r in plan.out_of_range(out.conn.len) {
        let _ = writeln!(
            log,
            "  packet {} ({}): offset {} + {} bytes, outside the live region: the target must reject it",
            r.packet, r.opcode, r.offset, r.len
        );
    }
    let long = plan.over_mtu(out.conn.mtu);
    if long > 0 {
        let _ = writeln!(
            log,
            "  {long} packets longer than the live path MTU ({}): the target must reject them",
            out.conn.mtu
        );
    }
    let o = &out.obs;
    let changed = o
        .exposed
        .iter()
        .filter(|&&b| b != super::target::PATTERN)
        .count();
    let done: Vec<String> = o
        .completions
        .iter()
        .map(|c| {
            format!(
                "{} {} status {}",
                if c.recv { "recv" } else { "send" },
                c.wr_id,
                c.status
            )
        })
        .collect();
    let _ = writeln!(
        log,
        "  observed: QP {:?}, completions [{}], {changed} bytes of the region written, private region {}, control QP {}{}",
        o.qp_state,
        done.join(", "),
        if o.private_intact { "intact" } else { "CHANGED" },
        if o.control_ok { "ok" } else { "BROKEN" },
        if o.events.is_empty() { String::new() } else { format!(", events {}", o.events.join(" ")) }
    );
    print_outcome(&out, log);
    let mut tripped = out.violations.len();
    if opts.mutate > 0 {
        let cfg = Config {
            seed: opts.seed,
            mode: super::gen::Mode::Fields,
            qp_type: plan.qp_type,
            cases: opts.mutate,
            time_limit: None,
            minimize: true,
            recvs,
            skip_known_crashes: false,
        };
        let mut line = StatusLine::new();
        let mutant = |i: u64, probe: &super::target::Conn| plan.mutant(opts.seed, i, probe);
        let report = fuzz_cases(&mut *target, &cfg, mutant, |s: &Status| line.show(s))
            .map_err(|e| e.to_string())?;
        line.done();
        let _ = writeln!(
            log,
            "{} mutants (seed {}): {} findings{}",
            report.cases,
            opts.seed,
            report.findings.len(),
            if report.target_died {
                " (the target stopped answering)"
            } else {
                ""
            }
        );
        print_findings(&report, spec, out_dir, log);
        tripped += report.findings.len();
    }
    Ok(tripped)
}

/// Runs the attacks `which` (all if empty) against `spec`, printing a
/// table row on `log` as each ends.
pub fn attacks(
    spec: &TargetSpec,
    cfg: &super::attack::AttackConfig,
    which: &[&str],
    log: &mut dyn Write,
) -> Result<Vec<super::attack::AttackResult>, TargetError> {
    let mut target = spec.open(1)?;
    let _ = writeln!(
        log,
        "uroce fuzz attack: {:?} QPs on {}, at most {} packets each\n{:<19} {:<10} {:>7} {:>8}  detail",
        cfg.qp_type,
        target.name(),
        cfg.budget,
        "attack",
        "verdict",
        "packets",
        "time"
    );
    let results = super::attack::run(&mut *target, cfg, which, |r| {
        let _ = writeln!(
            log,
            "{:<19} {:<10} {:>7} {:>7.3}s  {}",
            r.name,
            r.verdict.to_string(),
            r.packets,
            r.elapsed.as_secs_f64(),
            r.detail
        );
    })?;
    let _ = writeln!(log, "what each attacker knows:");
    for (name, knows, _) in super::attack::ATTACKS {
        if results.iter().any(|r| r.name == *name) {
            let _ = writeln!(log, "  {name}: {knows}");
        }
    }
    Ok(results)
}

/// The default directory for findings.
pub fn default_out_dir() -> PathBuf {
    PathBuf::from("uroce-fuzz-findings")
}

/// Runs `cfg`'s cases against `a` and `b` (differential), the status line
/// on stderr, differences into `out_dir`, a summary on `log`.
pub fn run_diff(
    a: &TargetSpec,
    b: &TargetSpec,
    cfg: &Config,
    out_dir: &Path,
    log: &mut dyn Write,
) -> Result<super::diff::DiffReport, TargetError> {
    let mut ta = a.open(cfg.seed)?;
    let mut tb = b.open(cfg.seed)?;
    let _ = writeln!(
        log,
        "uroce fuzz: {:?} {:?} cases against {} and {} (seed {}, up to {} cases{})",
        cfg.mode,
        cfg.qp_type,
        ta.name(),
        tb.name(),
        cfg.seed,
        cfg.cases,
        limit_text(cfg)
    );
    let mut line = StatusLine::new();
    let report = super::diff::fuzz_diff(&mut *ta, &mut *tb, cfg, |s: &Status| line.show(s))?;
    line.done();
    let _ = writeln!(
        log,
        "{} cases in {:.1} s, {} differed; {} distinct differences{}{}",
        report.cases,
        report.elapsed.as_secs_f64(),
        report.differing_cases,
        report.findings.len(),
        if report.findings.len() >= super::diff::MAX_FINDINGS {
            " (the first ones kept)"
        } else {
            ""
        },
        if report.unreproduced > 0 {
            format!(
                ", {} more that did not come back when run again",
                report.unreproduced
            )
        } else {
            String::new()
        }
    );
    if report.target_died {
        let _ = writeln!(
            log,
            "a target stopped answering: the run ended there (the last difference)"
        );
    }
    for (i, (f, xa, xb)) in report.findings.iter().enumerate() {
        let name = format!("difference-{}", i + 1);
        let _ = writeln!(
            log,
            "difference {}: case {}, {} steps minimized to {}",
            i + 1,
            f.index,
            f.original_steps,
            f.case.steps.len()
        );
        print_steps(log, &f.case);
        for d in &f.differences {
            let _ = writeln!(log, "  {}: {} | {}", d.what, d.a, d.b);
        }
        let saved = std::fs::create_dir_all(out_dir).and_then(|_| {
            let json = out_dir.join(format!("{name}.json"));
            let text = serde_json::to_string_pretty(f).map_err(std::io::Error::other)?;
            std::fs::write(&json, text + "\n")?;
            // Each side's run as a finding of its own (replayable, with its pcap).
            for (side, spec, run) in [("a", a, xa), ("b", b, xb)] {
                let one = Finding {
                    target: if side == "a" {
                        f.targets.0.clone()
                    } else {
                        f.targets.1.clone()
                    },
                    seed: f.seed,
                    mode: cfg.mode,
                    qp_type: cfg.qp_type,
                    index: f.index,
                    recvs: cfg.recvs,
                    original_steps: f.original_steps,
                    trials: 0,
                    case: f.case.clone(),
                    violations: Vec::new(),
                    rules: Vec::new(),
                    conn: run.conn.clone(),
                    qp_state: run.obs.qp_state,
                };
                let j = one.save(out_dir, &format!("{name}-{side}"), &run.packets)?;
                let _ = writeln!(
                    log,
                    "  replay on {side}: uroce fuzz replay {} {}",
                    j.display(),
                    spec.args()
                );
            }
            Ok(json)
        });
        if let Err(e) = saved {
            let _ = writeln!(log, "  could not save it in {}: {e}", out_dir.display());
        }
    }
    Ok(report)
}
