//! The planted-mistake battery (issue #25, item 4): the fuzzer's recall,
//! measured.
//!
//! Every [`Mistake`] of the provider (`uroce_provider::planted`, feature
//! `planted`) is planted in turn in the simulated target's fuzzed QP
//! (`--target sim:<mistake>`), and the documented modes run against it
//! with fixed seeds and budgets ([`RUNS`]), one after the other, until a
//! case trips an oracle ([`crate::oracle::check`]). The battery reports
//! for each mistake whether it was found, by which run and oracle, after
//! how many cases; and the recall (found / total). The clean target runs
//! every run's full budget too: it must give no finding, or a finding on
//! a planted target proves nothing.
//!
//! A mistake the oracles cannot see yet is listed in [`KNOWN_MISSED`]
//! with the reason; the battery (`tests/battery.rs`) fails when any other
//! mistake is missed.

use crate::attack::{AttackConfig, Verdict as AttackVerdict};
use crate::case::Case;
use crate::gen::{Generator, Mode};
use crate::run_case;
use crate::sim::{PlantedBug, SimTarget};
use crate::target::Target;
use std::time::{Duration, Instant};
use uroce_provider::planted::Mistake;
use uroce_provider::types::QpType;

/// What a run of the battery drives: a generator of `uroce fuzz`, or
/// `uroce fuzz attack`'s attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Driver {
    /// `uroce fuzz --mode MODE`: cases judged by the oracles.
    Fuzz(Mode),
    /// `uroce fuzz attack`: every attack, judged by its verdict.
    Attack,
}

/// One run of the battery: a mode (or the attacks) on a transport, its
/// seed and its budget (cases; for the attacks: packets per attack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Generator or attacks.
    pub driver: Driver,
    /// Transport of the fuzzed QP.
    pub qp_type: QpType,
    /// Seed of the generator and of the simulated network.
    pub seed: u64,
    /// Cases at most (attacks: packets per attack).
    pub cases: u64,
    /// Receive WRs posted on the fuzzed QP per case.
    pub recvs: u32,
}

impl Run {
    const fn new(mode: Mode, qp_type: QpType, seed: u64, cases: u64) -> Run {
        Run {
            driver: Driver::Fuzz(mode),
            qp_type,
            seed,
            cases,
            recvs: RECVS,
        }
    }

    const fn attack(qp_type: QpType, budget: u64) -> Run {
        Run {
            driver: Driver::Attack,
            qp_type,
            seed: 1,
            cases: budget,
            recvs: RECVS,
        }
    }

    /// `mode/transport`, as the report prints it.
    pub fn label(&self) -> String {
        let mode = match self.driver {
            Driver::Fuzz(Mode::Fields) => "fields",
            Driver::Fuzz(Mode::Sequence) => "sequence",
            Driver::Fuzz(Mode::Responder) => "responder",
            Driver::Fuzz(Mode::Keys) => "keys",
            Driver::Fuzz(Mode::Duplicates) => "duplicates",
            Driver::Attack => "attack",
        };
        let qp = format!("{:?}", self.qp_type).to_lowercase();
        if self.recvs == RECVS {
            format!("{mode}/{qp}")
        } else {
            format!("{mode}/{qp}/{}recv", self.recvs)
        }
    }
}

/// Receive WRs posted on the fuzzed QP per case (as `uroce fuzz`'s
/// default).
const RECVS: u32 = 8;

/// The documented modes on the transports they apply to, in the order
/// the battery tries them, with the budgets CI runs (`uroce fuzz`'s
/// modes: fields, sequence, keys and duplicates on RC, UC and UD;
/// responder on RC).
pub const RUNS: &[Run] = &[
    Run::new(Mode::Sequence, QpType::Rc, 1, 1000),
    Run::new(Mode::Fields, QpType::Rc, 1, 1000),
    Run::new(Mode::Keys, QpType::Rc, 1, 1000),
    Run::new(Mode::Duplicates, QpType::Rc, 1, 1000),
    Run::new(Mode::Responder, QpType::Rc, 1, 1000),
    // One receive WR: SENDs past it meet an empty receive queue (RNR).
    Run {
        recvs: 1,
        ..Run::new(Mode::Sequence, QpType::Rc, 1, 1000)
    },
    Run::new(Mode::Sequence, QpType::Uc, 1, 500),
    Run::new(Mode::Fields, QpType::Uc, 1, 500),
    Run::new(Mode::Keys, QpType::Uc, 1, 500),
    Run::new(Mode::Duplicates, QpType::Uc, 1, 500),
    Run::new(Mode::Sequence, QpType::Ud, 1, 500),
    Run::new(Mode::Fields, QpType::Ud, 1, 500),
    Run::new(Mode::Keys, QpType::Ud, 1, 500),
    Run::new(Mode::Duplicates, QpType::Ud, 1, 500),
    Run::attack(QpType::Rc, 256),
    Run::attack(QpType::Uc, 256),
];

/// Mistakes the oracles are known to miss today, with the reason: printed
/// as "missed (known)". The issue is not done while this list is not
/// empty.
pub const KNOWN_MISSED: &[(Mistake, &str)] = &[];

/// Why `m` is known to be missed, if it is.
pub fn known_missed(m: Mistake) -> Option<&'static str> {
    KNOWN_MISSED
        .iter()
        .find(|(k, _)| *k == m)
        .map(|(_, why)| *why)
}

/// What a run of the battery found on one target.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The run that found it.
    pub run: Run,
    /// Cases of that run it took (the finding's included).
    pub cases: u64,
    /// The oracles' violation kinds on the finding case.
    pub oracles: Vec<&'static str>,
    /// The IBA rules they name (where known).
    pub rules: Vec<&'static str>,
    /// The case (empty for an attack).
    pub case: Case,
    /// What else the report says (the attacks that succeeded).
    pub detail: String,
}

/// One target's result: the first hit, if any, and the cases run.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The planted mistake (`None`: the clean target).
    pub mistake: Option<Mistake>,
    /// The first finding.
    pub hit: Option<Hit>,
    /// Cases that tripped an oracle (the clean target: all of them; a
    /// planted one: the finding's).
    pub flagged: u64,
    /// Cases run over all runs.
    pub cases: u64,
    /// Time taken.
    pub elapsed: Duration,
}

/// The oracles' violation kinds and rules when `case` runs on a fresh
/// clean simulated target of `run`.
fn on_clean(run: &Run, case: &Case) -> (Vec<&'static str>, Vec<&'static str>) {
    let mut target = SimTarget::new(run.seed, None);
    let Ok(out) = run_case(&mut target, run.qp_type, run.recvs, case) else {
        return (Vec::new(), Vec::new());
    };
    (out.kinds(), rules_of(&out.violations))
}

/// The IBA rules `violations` name (where known), sorted, without repeats.
fn rules_of(violations: &[crate::oracle::Violation]) -> Vec<&'static str> {
    let mut rules: Vec<&'static str> = violations
        .iter()
        .map(|v| v.rule())
        .filter(|r| !r.is_empty())
        .collect();
    rules.sort();
    rules.dedup();
    rules
}

/// Fuzzes the simulated target with `mistake` planted (or none) through
/// `runs`. With a mistake it stops at the first case that trips an
/// oracle the same case does not trip on the clean target (a mistake is
/// found only by what it changes, never by an oracle's false alarm).
/// The clean target runs every case, and its first finding is kept.
pub fn hunt(mistake: Option<Mistake>, runs: &[Run]) -> Outcome {
    let start = Instant::now();
    let outcome = |hit, flagged, cases| Outcome {
        mistake,
        hit,
        flagged,
        cases,
        elapsed: start.elapsed(),
    };
    let mut total = 0;
    let mut flagged = 0;
    let mut first = None;
    let bug = mistake.map(PlantedBug::Mistake);
    for run in runs {
        let Driver::Fuzz(mode) = run.driver else {
            if let Some(hit) = attack(run, mistake) {
                total += hit.cases;
                flagged += 1;
                if mistake.is_some() {
                    return outcome(Some(hit), flagged, total);
                }
                first.get_or_insert(hit);
            } else {
                total += crate::attack::ATTACKS.len() as u64;
            }
            continue;
        };
        let mut target = SimTarget::new(run.seed, bug);
        let Ok(probe) = target.setup(run.qp_type, run.recvs) else {
            continue;
        };
        let gen = Generator::new(run.seed, mode);
        for index in 0..run.cases {
            let case = gen.case(index, &probe);
            total += 1;
            let Ok(out) = run_case(&mut target, run.qp_type, run.recvs, &case) else {
                continue;
            };
            if out.violations.is_empty() {
                continue;
            }
            let (mut oracles, mut rules) = (out.kinds(), rules_of(&out.violations));
            if mistake.is_some() {
                // Only what the clean target does not also trip.
                let (clean, clean_rules) = on_clean(run, &case);
                oracles.retain(|k| !clean.contains(k));
                rules.retain(|r| !clean_rules.contains(r));
                if oracles.is_empty() {
                    continue;
                }
            }
            flagged += 1;
            let hit = Hit {
                run: *run,
                cases: index + 1,
                oracles,
                rules,
                case,
                detail: String::new(),
            };
            if mistake.is_some() {
                return outcome(Some(hit), flagged, total);
            }
            first.get_or_insert(hit);
        }
    }
    outcome(first, flagged, total)
}

/// Runs every attack of `uroce fuzz attack` on the simulated target with
/// `mistake` planted. A hit: an attack whose verdict differs from the
/// clean target's (on which some succeed by design: a fixed QPN, one
/// packet kills an RC QP as IBA has it; the attacks' own tests pin
/// those). The clean target itself has no hit. `Hit::cases` counts the
/// attacks run up to the first that differs.
fn attack(run: &Run, mistake: Option<Mistake>) -> Option<Hit> {
    let mistake = mistake?;
    let cfg = AttackConfig {
        qp_type: run.qp_type,
        budget: run.cases,
        spoof: None,
    };
    let verdicts = |bug: Option<Mistake>| -> Vec<(String, AttackVerdict)> {
        let mut t = SimTarget::new(run.seed, bug.map(PlantedBug::Mistake));
        crate::attack::run(&mut t, &cfg, &[], |_| {})
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.name, r.verdict))
            .collect()
    };
    let clean = verdicts(None);
    let planted = verdicts(Some(mistake));
    let changed: Vec<String> = planted
        .iter()
        .filter(|v| !clean.contains(v))
        .map(|(name, verdict)| format!("{name}: {verdict:?}"))
        .collect();
    let index = planted.iter().position(|v| !clean.contains(v))?;
    Some(Hit {
        run: *run,
        cases: index as u64 + 1,
        oracles: vec!["attack verdict"],
        rules: Vec::new(),
        case: Case { steps: Vec::new() },
        detail: changed.join(", "),
    })
}

/// The whole battery: the clean target and every mistake, on `threads`
/// threads (each plants its own mistake: the selection is per thread).
/// Outcomes in [`Mistake::ALL`]'s order, the clean target's first.
pub fn run_all(runs: &[Run], threads: usize) -> Vec<Outcome> {
    let targets: Vec<Option<Mistake>> = std::iter::once(None)
        .chain(Mistake::ALL.iter().copied().map(Some))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&m) = targets.get(i) else { break };
                let out = hunt(m, runs);
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, out));
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, o)| o).collect()
}

/// The battery's verdict on its outcomes.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    /// Mistakes found.
    pub found: usize,
    /// Mistakes planted.
    pub total: usize,
    /// Mistakes missed that are not in [`KNOWN_MISSED`]: failures.
    pub unexpected_misses: Vec<Mistake>,
    /// Mistakes found that [`KNOWN_MISSED`] still lists (the list should
    /// lose them).
    pub stale_known: Vec<Mistake>,
    /// The clean target's finding, if it had one: a failure.
    pub clean_finding: Option<String>,
}

impl Verdict {
    /// Whether the battery passes: no unexpected miss, nothing found on
    /// the clean target.
    pub fn passed(&self) -> bool {
        self.unexpected_misses.is_empty() && self.clean_finding.is_none()
    }
}

/// Writes the report (a line per target, then the recall) to `out` and
/// returns the verdict.
pub fn report(outcomes: &[Outcome], out: &mut dyn std::io::Write) -> Verdict {
    let mut v = Verdict::default();
    let _ = writeln!(
        out,
        "{:<27} {:<15} {:<14} {:>6}  oracle",
        "target", "result", "run", "cases"
    );
    for o in outcomes {
        let name = o
            .mistake
            .map_or("sim (clean)".to_string(), |m| m.name().into());
        let result = match (&o.hit, o.mistake) {
            (Some(_), None) => "FINDING".to_string(),
            (None, None) => "clean".to_string(),
            (Some(_), Some(m)) if known_missed(m).is_some() => "found (stale)".into(),
            (Some(_), Some(_)) => "found".into(),
            (None, Some(m)) if known_missed(m).is_some() => "missed (known)".into(),
            (None, Some(_)) => "MISSED".into(),
        };
        match &o.hit {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "{name:<27} {result:<15} {:<14} {:>6}  {}{}",
                    h.run.label(),
                    h.cases,
                    h.oracles.join(", "),
                    if h.detail.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", h.detail)
                    }
                );
                for rule in &h.rules {
                    let _ = writeln!(out, "{:<60}  {rule}", "");
                }
            }
            None => {
                let why = o.mistake.and_then(known_missed).unwrap_or("");
                let _ = writeln!(
                    out,
                    "{name:<27} {result:<15} {:<14} {:>6}  {why}",
                    "-", o.cases
                );
            }
        }
        match (o.mistake, &o.hit) {
            (None, Some(h)) => {
                v.clean_finding = Some(format!(
                    "{} cases of {} tripped an oracle; the first: {} case {}: {} ({})",
                    o.flagged,
                    o.cases,
                    h.run.label(),
                    h.cases - 1,
                    h.oracles.join(", "),
                    serde_json::to_string(&h.case).unwrap_or_default()
                ))
            }
            (None, None) => {}
            (Some(m), hit) => {
                v.total += 1;
                match (hit.is_some(), known_missed(m).is_some()) {
                    (true, false) => v.found += 1,
                    (true, true) => {
                        v.found += 1;
                        v.stale_known.push(m);
                    }
                    (false, false) => v.unexpected_misses.push(m),
                    (false, true) => {}
                }
            }
        }
    }
    let secs: f64 = outcomes.iter().map(|o| o.elapsed.as_secs_f64()).sum();
    let cases: u64 = outcomes.iter().map(|o| o.cases).sum();
    let _ = writeln!(
        out,
        "recall: {}/{} mistakes found ({} cases, {:.1} s of fuzzing)",
        v.found, v.total, cases, secs
    );
    if !v.stale_known.is_empty() {
        let names: Vec<&str> = v.stale_known.iter().map(|m| m.name()).collect();
        let _ = writeln!(
            out,
            "found although listed as missed (known): {} (take them off KNOWN_MISSED)",
            names.join(", ")
        );
    }
    v
}
