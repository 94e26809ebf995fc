//! # uroce-fuzz
//!
//! A stateful RoCEv2 fuzzer: the engine behind `uroce fuzz`; and the
//! stateful pair harness of the cargo-fuzz targets ([`pair`]). A crate of
//! its own so that none of it is in uroce's device library: it uses
//! uroce-provider's public API and, with the feature `testing`, its
//! testing face (`uroce_provider::testing`) and its insides
//! (`uroce_provider::sans_io`: the QP machines, the memory model, the
//! simulated network) only.
//!
//! The fuzzer plays the peer of a [`Target`]: any RoCEv2 endpoint it can
//! send packets to and observe (a uroce device, kernel rxe, a NIC, through
//! the target agent; or uroce's own QP machines on the simulated network,
//! [`sim::SimTarget`]). For every case it sets up a fresh connection,
//! sends the case's packets (made with uroce's codec, each field relative
//! to the live connection: [`case`]), collects the target's answers,
//! observes the target and checks the [`oracle`]s. A case that trips one
//! is shrunk by the [`minimize`]r to the smallest case that still trips
//! the same oracle, and kept as a [`Finding`]: the case as JSON, a pcap
//! of the minimized run (the packets sent and the answers) and the
//! command that replays it.
//!
//! Everything is deterministic from the seed: case `i` of seed `s` is the
//! same case on every run and every target.
#![warn(missing_docs)]

pub mod attack;
#[cfg(feature = "planted")]
pub mod battery;
pub mod case;
pub mod diff;
pub mod gen;
pub mod input;
pub mod known;
pub mod live;
pub mod minimize;
pub mod model;
pub mod oracle;
pub mod pair;
pub mod replay;
pub mod session;
pub mod sim;
pub mod target;

mod serde_qp;

use case::{Case, Step};
use gen::{Generator, Mode};
use oracle::Violation;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use target::{Conn, Observation, Target, TargetError};
use uroce_provider::types::{QpState, QpType};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seed: the same seed makes the same cases.
    pub seed: u64,
    /// Generator.
    pub mode: Mode,
    /// Transport of the fuzzed QP.
    pub qp_type: QpType,
    /// Cases to run (at most).
    pub cases: u64,
    /// Stop after this long.
    pub time_limit: Option<Duration>,
    /// Shrink findings.
    pub minimize: bool,
    /// Receive WRs posted on the fuzzed QP per case.
    pub recvs: u32,
    /// Leave out the packets already known to crash a target's kernel
    /// ([`known::defuse`]), so that a campaign against it runs on.
    pub skip_known_crashes: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            seed: 1,
            mode: Mode::Fields,
            qp_type: QpType::Rc,
            cases: 1000,
            time_limit: None,
            minimize: true,
            recvs: 8,
            skip_known_crashes: false,
        }
    }
}

/// A packet of a case's run.
#[derive(Clone, Debug)]
pub struct Traced {
    /// Microseconds since the case began.
    pub us: u64,
    /// Sent by the fuzzer (else an answer of the target).
    pub sent: bool,
    /// The UDP payload.
    pub bytes: Vec<u8>,
}

/// One run of one case.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The connection it ran on.
    pub conn: Conn,
    /// What the target showed afterwards.
    pub obs: Observation,
    /// Packets, in order.
    pub packets: Vec<Traced>,
    /// Broken rules.
    pub violations: Vec<Violation>,
}

impl Outcome {
    /// The violations' kinds, sorted, without repeats.
    pub fn kinds(&self) -> Vec<&'static str> {
        let k: BTreeSet<&'static str> = self.violations.iter().map(|v| v.kind()).collect();
        k.into_iter().collect()
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// Runs `case` on a fresh connection of `qp_type`. A panic inside the
/// target (uroce's own code on the simulated network) is a finding, not
/// a crash of the fuzzer.
pub fn run_case(
    target: &mut dyn Target,
    qp_type: QpType,
    recvs: u32,
    case: &Case,
) -> Result<Outcome, TargetError> {
    run_case_waiting(target, qp_type, recvs, case, 0)
}

/// How long a finding's confirming run waits for answers after the case
/// (µs): a slow live target (a TCG guest on busy cores) answers after
/// the usual tail of a millisecond or two.
pub const PATIENT_TAIL_US: u32 = 300_000;

/// How many times a set of violation kinds may go unconfirmed before the
/// run stops minimizing cases that show it.
const MAX_UNCONFIRMED: u32 = 3;

/// [`run_case`], waiting at least `tail` µs for answers after the case.
fn run_case_waiting(
    target: &mut dyn Target,
    qp_type: QpType,
    recvs: u32,
    case: &Case,
    tail: u32,
) -> Result<Outcome, TargetError> {
    let conn = target.setup(qp_type, recvs)?;
    let mut packets = Vec::new();
    let mut us = 0u64;
    let run = catch_unwind(AssertUnwindSafe(|| {
        for step in &case.steps {
            match step {
                Step::Packet(p) => {
                    if let Some(bytes) = p.emit(&conn) {
                        target.send(&bytes);
                        packets.push(Traced {
                            us,
                            sent: true,
                            bytes,
                        });
                    }
                }
                Step::Post(w) => {
                    // A refused post is not an error of the run: the
                    // oracles see what did (not) complete.
                    let _ = target.post(w);
                }
                Step::Wait(w) => {
                    for a in target.wait(*w) {
                        packets.push(Traced {
                            us,
                            sent: false,
                            bytes: a,
                        });
                    }
                    us += u64::from(*w);
                }
            }
        }
        // The target's own requests (the fuzzer as responder) get time
        // to be retried and to fail: a requester with a 1 ms timeout and
        // 3 retries, on a kernel timer of 4 ms granularity.
        let tail = tail.max(if case.posts().next().is_some() {
            50_000
        } else {
            1_000
        });
        for a in target.wait(tail) {
            packets.push(Traced {
                us,
                sent: false,
                bytes: a,
            });
        }
        target.observe()
    }));
    let obs = match run {
        Ok(obs) => obs?,
        Err(p) => {
            let violations = vec![Violation::TargetDead(format!(
                "the target panicked: {}",
                panic_text(&*p)
            ))];
            return Ok(Outcome {
                obs: Observation::dead(Vec::new()),
                conn,
                packets,
                violations,
            });
        }
    };
    let mut obs = obs;
    obs.answers = Some(
        packets
            .iter()
            .filter(|p| !p.sent)
            .map(|p| p.bytes.clone())
            .collect(),
    );
    let violations = oracle::check(&conn, case, &obs);
    Ok(Outcome {
        conn,
        obs,
        packets,
        violations,
    })
}

/// A finding: a minimized case and what it breaks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Finding {
    /// Which target it was found on.
    pub target: String,
    /// Seed, mode and case index that produced it.
    pub seed: u64,
    /// Generator.
    pub mode: Mode,
    /// Transport.
    #[serde(with = "crate::serde_qp::QpTypeDef")]
    pub qp_type: QpType,
    /// Case index.
    pub index: u64,
    /// Receive WRs posted on the fuzzed QP.
    pub recvs: u32,
    /// Steps before minimizing.
    pub original_steps: usize,
    /// Trials the minimizer ran.
    pub trials: u32,
    /// The minimized case.
    pub case: Case,
    /// What the minimized case breaks.
    pub violations: Vec<Violation>,
    /// The IBA rules broken (where known).
    pub rules: Vec<String>,
    /// The connection of the minimized run.
    pub conn: Conn,
    /// The QP state after it.
    #[serde(with = "crate::serde_qp::QpStateDef")]
    pub qp_state: QpState,
}

impl Finding {
    /// A finding kept as it ran (the target cannot replay it).
    fn as_ran(
        target: &dyn Target,
        cfg: &Config,
        index: u64,
        case: Case,
        violations: Vec<Violation>,
        conn: Conn,
        qp_state: QpState,
    ) -> Finding {
        Finding {
            target: target.name(),
            seed: cfg.seed,
            mode: cfg.mode,
            qp_type: cfg.qp_type,
            index,
            recvs: cfg.recvs,
            original_steps: case.steps.len(),
            trials: 0,
            case,
            violations,
            rules: Vec::new(),
            conn,
            qp_state,
        }
    }

    /// Writes `<dir>/<name>.json` and `<dir>/<name>.pcap` (the minimized
    /// run: packets sent and answers); returns the JSON's path.
    pub fn save(&self, dir: &Path, name: &str, packets: &[Traced]) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let json = dir.join(format!("{name}.json"));
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&json, text + "\n")?;
        let mut cap = uroce_provider::sans_io::engine::capture::Capture::create(
            &dir.join(format!("{name}.pcap")),
        )
        .map_err(std::io::Error::other)?;
        let f = std::net::SocketAddr::new(self.conn.fuzzer, self.conn.src_port);
        let t = std::net::SocketAddr::new(self.conn.target, uroce_wire::ROCEV2_UDP_PORT);
        for p in packets {
            let (a, b) = if p.sent { (f, t) } else { (t, f) };
            cap.record(a, b, (0, true), (0, None), &p.bytes);
        }
        cap.finish().map_err(std::io::Error::other)?;
        Ok(json)
    }

    /// Reads a finding's JSON.
    pub fn load(path: &Path) -> std::io::Result<Finding> {
        let text = std::fs::read_to_string(path)?;
        serde_json::from_str(&text).map_err(std::io::Error::other)
    }
}

/// A live view of a run.
#[derive(Clone, Debug, Default)]
pub struct Status {
    /// Cases run.
    pub cases: u64,
    /// Distinct findings.
    pub findings: usize,
    /// Cases per second so far.
    pub rate: f64,
    /// (QP state, opcode, PSN class) combinations reached.
    pub coverage: usize,
    /// Time so far.
    pub elapsed: Duration,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} cases, {:.0}/s, {} findings, {} (state, opcode, PSN class) combinations, {:.1} s",
            self.cases,
            self.rate,
            self.findings,
            self.coverage,
            self.elapsed.as_secs_f64()
        )
    }
}

/// Paces the status callback (every 200 ms and at the last case) and
/// makes the [`Status`].
pub(crate) struct Ticker {
    start: Instant,
    last: Instant,
}

impl Ticker {
    pub(crate) fn new() -> Ticker {
        let now = Instant::now();
        Ticker {
            start: now,
            last: now,
        }
    }
    /// The status, if one is due.
    pub(crate) fn tick(
        &mut self,
        last_case: bool,
        cases: u64,
        findings: usize,
        coverage: usize,
    ) -> Option<Status> {
        if self.last.elapsed() < Duration::from_millis(200) && !last_case {
            return None;
        }
        self.last = Instant::now();
        let elapsed = self.start.elapsed();
        Some(Status {
            cases,
            findings,
            rate: cases as f64 / elapsed.as_secs_f64().max(1e-9),
            coverage,
            elapsed,
        })
    }
}

/// The PSN classes of a case's packets, against the model's expected PSN
/// (which moves on with every in-sequence request).
/// A response's class is against the PSNs the target's requests took.
pub fn psn_classes(case: &Case, conn: &Conn) -> Vec<(u8, &'static str)> {
    let sent = case.request_span(conn.mtu) as i32;
    case.packets()
        .zip(case.psn_deltas(conn.mtu))
        .map(|(p, d)| {
            let d = match (p.resp, d) {
                (true, d) if (0..sent).contains(&d) => 0,
                (true, d) if d >= sent => d - sent + 1,
                (_, d) => d,
            };
            let class = match d {
                0 => "expected",
                -128..=-1 => "duplicate",
                1..=128 => "ahead",
                _ if d.unsigned_abs() >= 1 << 22 => "far",
                _ => "out-of-window",
            };
            (p.raw_opcode.unwrap_or(p.opcode), class)
        })
        .collect()
}

/// The result of a run.
#[derive(Debug, Default)]
pub struct Report {
    /// Cases run.
    pub cases: u64,
    /// Distinct findings (by their violation kinds), minimized, with the
    /// packets of their minimized run.
    pub findings: Vec<(Finding, Vec<Traced>)>,
    /// (QP state after the case, opcode, PSN class) reached.
    pub coverage: BTreeSet<(String, u8, &'static str)>,
    /// Time taken.
    pub elapsed: Duration,
    /// The target stopped answering and the run ended there.
    pub target_died: bool,
    /// Cases whose violations a confirming run, waiting
    /// [`PATIENT_TAIL_US`] for the answers, did not show: answers later
    /// than the run looked, not findings (their case indexes).
    pub unconfirmed: Vec<u64>,
    last_case: Option<Case>,
    last_packets: Vec<Traced>,
}

/// Runs `cfg` against `target`; `status` is called about every 200 ms.
pub fn fuzz(
    target: &mut dyn Target,
    cfg: &Config,
    status: impl FnMut(&Status),
) -> Result<Report, TargetError> {
    let gen = Generator::new(cfg.seed, cfg.mode);
    fuzz_cases(target, cfg, |index, probe| gen.case(index, probe), status)
}

/// [`fuzz`] with the cases `make` gives: case `index` for the shape of
/// the first connection (`cfg.mode` only names them in findings).
pub fn fuzz_cases(
    target: &mut dyn Target,
    cfg: &Config,
    mut make: impl FnMut(u64, &Conn) -> Case,
    mut status: impl FnMut(&Status),
) -> Result<Report, TargetError> {
    let start = Instant::now();
    let mut ticker = Ticker::new();
    let mut report = Report::default();
    let mut seen_kinds: BTreeSet<Vec<&'static str>> = BTreeSet::new();
    let mut late_kinds: BTreeMap<Vec<&'static str>, u32> = BTreeMap::new();
    // Cases are generated against the first connection's shape (MTU,
    // region size, transport), which every later one shares; the PSNs,
    // keys and addresses they name are resolved on each case's own.
    let probe = target.setup(cfg.qp_type, cfg.recvs)?;
    for index in 0..cfg.cases {
        if cfg.time_limit.is_some_and(|l| start.elapsed() >= l) {
            break;
        }
        let mut case = make(index, &probe);
        if cfg.skip_known_crashes {
            known::defuse(&mut case);
        }
        let out = match run_case(target, cfg.qp_type, cfg.recvs, &case) {
            Ok(o) => o,
            Err(e) => {
                // The target stopped answering between cases: what the
                // previous case sent may still have been in its queues
                // (a slow guest handles packets late). Both cases are
                // kept, unminimized: a dead target cannot replay.
                let mut steps = report.last_case.take().map_or(Vec::new(), |c| c.steps);
                steps.push(Step::Wait(1_000_000));
                steps.extend(case.steps.iter().cloned());
                let why = format!(
                    "no answer when case {index} was set up, after case {}: {e}",
                    index.saturating_sub(1)
                );
                let f = Finding::as_ran(
                    target,
                    cfg,
                    index.saturating_sub(1),
                    Case { steps },
                    vec![Violation::TargetDead(why)],
                    probe.clone(),
                    QpState::Err,
                );
                report.findings.push((f, report.last_packets.clone()));
                report.target_died = true;
                break;
            }
        };
        report.cases += 1;
        for (op, class) in psn_classes(&case, &out.conn) {
            report
                .coverage
                .insert((format!("{:?}", out.obs.qp_state), op, class));
        }
        let kinds = out.kinds();
        if !kinds.is_empty() && seen_kinds.insert(kinds.clone()) {
            let dead = out
                .violations
                .iter()
                .any(|v| matches!(v, Violation::TargetDead(_)));
            if dead && !target.revives() {
                // Nothing to minimize on: the case is kept as it ran.
                let f = Finding::as_ran(
                    target,
                    cfg,
                    index,
                    case.clone(),
                    out.violations.clone(),
                    out.conn.clone(),
                    out.obs.qp_state,
                );
                report.findings.push((f, out.packets.clone()));
                report.target_died = true;
                break;
            }
            let (min, trials) = if cfg.minimize {
                minimize::minimize(&case, probe.mtu, |c| {
                    run_case(target, cfg.qp_type, cfg.recvs, c)
                        .map(|o| o.kinds() == kinds)
                        .unwrap_or(false)
                })
            } else {
                (case.clone(), 0)
            };
            // A trial may have killed a target that does not come back:
            // then the finding is the case as it first ran. On a live
            // target the last run waits longer for the answers: one that
            // only came late is no finding (the spec sets no deadline
            // for answers short of the requester's timeout).
            let tail = if target.answers_at_once() {
                0
            } else {
                PATIENT_TAIL_US
            };
            let (min, again) = match run_case_waiting(target, cfg.qp_type, cfg.recvs, &min, tail) {
                Ok(o) => (min, o),
                Err(_) => {
                    report.target_died = true;
                    (case.clone(), out.clone())
                }
            };
            if again.violations.is_empty() {
                // Later cases may still find these kinds for real; a few
                // more tries, so that a target that is always late does
                // not spend the run minimizing.
                report.unconfirmed.push(index);
                let n = late_kinds.entry(kinds.clone()).or_insert(0);
                *n += 1;
                if *n < MAX_UNCONFIRMED {
                    seen_kinds.remove(&kinds);
                }
            } else {
                let rules: BTreeSet<String> = again
                    .violations
                    .iter()
                    .map(|v| v.rule().to_string())
                    .filter(|r| !r.is_empty())
                    .collect();
                let finding = Finding {
                    original_steps: case.steps.len(),
                    trials,
                    rules: rules.into_iter().collect(),
                    ..Finding::as_ran(
                        target,
                        cfg,
                        index,
                        min,
                        again.violations.clone(),
                        again.conn.clone(),
                        again.obs.qp_state,
                    )
                };
                report.findings.push((finding, again.packets));
            }
            if report.target_died {
                break;
            }
        }
        report.last_case = Some(case.clone());
        report.last_packets = out.packets.clone();
        let (n, f, c) = (report.cases, report.findings.len(), report.coverage.len());
        if let Some(st) = ticker.tick(index + 1 == cfg.cases, n, f, c) {
            status(&st);
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

#[cfg(test)]
mod tests;
