//! Differential fuzzing: the same cases against two targets (say uroce
//! and kernel rxe), every difference in what they let the fuzzer observe
//! reported and minimized.
//!
//! Compared per case: the kinds of answers each sent (ACK, each NAK code,
//! RNR NAK, READ response, atomic ACK, as a set: how many ACKs a
//! responder coalesces is its own business), the fuzzed QP's state, the
//! completions (status and queue, as a multiset), the exposed region's
//! bytes and whether the private region is intact. Where one side breaks
//! an oracle, the finding names the rule.

use super::case::Case;
use super::gen::Generator;
use super::minimize::minimize;
use super::target::{Target, TargetError};
use super::{run_case, Config, Outcome, Status};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use uroce_provider::types::QpState;
use uroce_wire::{AethSyndrome, NakCode, Operation};

/// What is compared of one side's run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The kinds of packets the target answered with.
    pub answers: BTreeSet<String>,
    /// The fuzzed QP's state afterwards.
    #[serde(with = "crate::serde_qp::QpStateDef")]
    pub state: QpState,
    /// Completions: (receive queue?, status), sorted.
    pub completions: Vec<(bool, u32)>,
    /// The exposed region.
    #[serde(skip)]
    pub exposed: Vec<u8>,
    /// The private region kept its pattern.
    pub private_intact: bool,
    /// The oracles this side broke (kinds).
    pub oracles: Vec<String>,
}

/// A name for an answer packet's kind.
pub fn answer_kind(bytes: &[u8]) -> String {
    let Ok(p) = uroce_wire::packet::parse(bytes) else {
        return "unparsable".into();
    };
    match p.info.operation {
        Operation::Acknowledge => match p.aeth().map(|a| a.syndrome) {
            Some(AethSyndrome::Ack { .. }) => "ACK".into(),
            Some(AethSyndrome::RnrNak { .. }) => "RNR NAK".into(),
            Some(AethSyndrome::Nak(c)) => match c {
                NakCode::PsnSequenceError => "NAK PSN sequence error".into(),
                NakCode::InvalidRequest => "NAK invalid request".into(),
                NakCode::RemoteAccessError => "NAK remote access error".into(),
                NakCode::RemoteOperationalError => "NAK remote operational error".into(),
                other => format!("NAK {other:?}"),
            },
            other => format!("AETH {other:?}"),
        },
        Operation::AtomicAcknowledge => "atomic ACK".into(),
        Operation::RdmaReadResponse => "READ response".into(),
        _ => p.info.name.to_string(),
    }
}

/// Summarizes a run.
pub fn answer(o: &Outcome) -> Answer {
    let mut completions: Vec<(bool, u32)> = o
        .obs
        .completions
        .iter()
        .map(|c| (c.recv, c.status))
        .collect();
    completions.sort_unstable();
    Answer {
        answers: o
            .packets
            .iter()
            .filter(|p| !p.sent)
            .map(|p| answer_kind(&p.bytes))
            .collect(),
        state: o.obs.qp_state,
        completions,
        exposed: o.obs.exposed.clone(),
        private_intact: o.obs.private_intact,
        oracles: o.kinds().iter().map(|k| k.to_string()).collect(),
    }
}

/// One observable that differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// What differs.
    pub what: String,
    /// The first target's value.
    pub a: String,
    /// The second target's.
    pub b: String,
}

/// The differences between two runs of one case.
pub fn differences(a: &Answer, b: &Answer) -> Vec<Difference> {
    let mut d = Vec::new();
    let mut add = |what: &str, x: String, y: String| {
        if x != y {
            d.push(Difference {
                what: what.into(),
                a: x,
                b: y,
            });
        }
    };
    let only = |x: &BTreeSet<String>, y: &BTreeSet<String>| {
        x.difference(y).cloned().collect::<Vec<_>>().join(", ")
    };
    if a.answers != b.answers {
        add(
            "answers only one side sent",
            only(&a.answers, &b.answers),
            only(&b.answers, &a.answers),
        );
    }
    add(
        "QP state",
        format!("{:?}", a.state),
        format!("{:?}", b.state),
    );
    add(
        "completions (receive queue?, status)",
        format!("{:?}", a.completions),
        format!("{:?}", b.completions),
    );
    if a.exposed != b.exposed {
        let at = a
            .exposed
            .iter()
            .zip(&b.exposed)
            .position(|(x, y)| x != y)
            .unwrap_or(a.exposed.len().min(b.exposed.len()));
        add(
            "exposed region",
            format!("{:02x?} at {at}", a.exposed.get(at)),
            format!("{:02x?} at {at}", b.exposed.get(at)),
        );
    }
    add(
        "private region intact",
        a.private_intact.to_string(),
        b.private_intact.to_string(),
    );
    add("oracles broken", a.oracles.join(", "), b.oracles.join(", "));
    d
}

/// A signature of a set of differences (what differs and how), by which
/// findings are told apart and minimized.
fn signature(d: &[Difference]) -> Vec<String> {
    d.iter()
        .map(|x| format!("{}: {} | {}", x.what, x.a, x.b))
        .collect()
}

/// A difference found, minimized.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DiffFinding {
    /// The two targets.
    pub targets: (String, String),
    /// Seed and case index.
    pub seed: u64,
    /// Case index.
    pub index: u64,
    /// Steps before minimizing.
    pub original_steps: usize,
    /// The minimized case.
    pub case: Case,
    /// What differs on it.
    pub differences: Vec<Difference>,
    /// The two sides' summaries.
    pub answers: (Answer, Answer),
}

/// The result of a differential run.
#[derive(Debug, Default)]
pub struct DiffReport {
    /// Cases run.
    pub cases: u64,
    /// Cases on which the targets differed.
    pub differing_cases: u64,
    /// Distinct differences, minimized, with both sides' runs of the
    /// minimized case.
    pub findings: Vec<(DiffFinding, Outcome, Outcome)>,
    /// Time taken.
    pub elapsed: Duration,
    /// A target stopped answering and the run ended there.
    pub target_died: bool,
}

/// Distinct differences kept at most (the rest are counted).
pub const MAX_FINDINGS: usize = 25;

/// Runs `cfg`'s cases against `a` and `b` and reports where they differ.
pub fn fuzz_diff(
    a: &mut dyn Target,
    b: &mut dyn Target,
    cfg: &Config,
    mut status: impl FnMut(&Status),
) -> Result<DiffReport, TargetError> {
    let gen = Generator::new(cfg.seed, cfg.mode);
    let start = Instant::now();
    let mut ticker = super::Ticker::new();
    let mut report = DiffReport::default();
    let mut seen: BTreeSet<Vec<String>> = BTreeSet::new();
    let probe = a.setup(cfg.qp_type, cfg.recvs)?;
    let run = |a: &mut dyn Target, b: &mut dyn Target, c: &Case| {
        let x = run_case(a, cfg.qp_type, cfg.recvs, c)?;
        let y = run_case(b, cfg.qp_type, cfg.recvs, c)?;
        Ok::<_, TargetError>((differences(&answer(&x), &answer(&y)), x, y))
    };
    for index in 0..cfg.cases {
        if cfg.time_limit.is_some_and(|l| start.elapsed() >= l) {
            break;
        }
        let case = gen.case(index, &probe);
        let (d, x, y) = run(a, b, &case)?;
        report.cases += 1;
        let dead = |o: &Outcome, t: &dyn Target| !o.obs.alive && !t.revives();
        if dead(&x, a) || dead(&y, b) {
            // A target died: nothing to minimize on, and the run ends.
            report.differing_cases += 1;
            let f = DiffFinding {
                targets: (a.name(), b.name()),
                seed: cfg.seed,
                index,
                original_steps: case.steps.len(),
                case: case.clone(),
                answers: (answer(&x), answer(&y)),
                differences: d,
            };
            report.findings.push((f, x, y));
            report.target_died = true;
            break;
        }
        if !d.is_empty() {
            report.differing_cases += 1;
            let sig = signature(&d);
            if report.findings.len() < MAX_FINDINGS && seen.insert(sig.clone()) {
                let (min, _) = if cfg.minimize {
                    minimize(&case, probe.mtu, |c| {
                        run(a, b, c)
                            .map(|(d, ..)| signature(&d) == sig)
                            .unwrap_or(false)
                    })
                } else {
                    (case.clone(), 0)
                };
                let Ok((d, x, y)) = run(a, b, &min) else {
                    // A trial killed a target: the run ends here.
                    report.target_died = true;
                    break;
                };
                let f = DiffFinding {
                    targets: (a.name(), b.name()),
                    seed: cfg.seed,
                    index,
                    original_steps: case.steps.len(),
                    case: min,
                    differences: d,
                    answers: (answer(&x), answer(&y)),
                };
                report.findings.push((f, x, y));
            }
        }
        if let Some(st) = ticker.tick(
            index + 1 == cfg.cases,
            report.cases,
            report.findings.len(),
            0,
        ) {
            status(&st);
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::Mode;
    use crate::sim::{PlantedBug, SimTarget};
    use uroce_provider::types::QpType;

    /// uroce against itself: no difference. uroce against uroce with a
    /// planted bug: the bug is a difference, minimized to its packets.
    #[test]
    fn differences_are_found_and_only_real_ones() {
        let cfg = Config {
            seed: 3,
            mode: Mode::Sequence,
            qp_type: QpType::Rc,
            cases: 300,
            time_limit: None,
            minimize: true,
            recvs: 8,
        };
        let (mut a, mut b) = (SimTarget::new(1, None), SimTarget::new(2, None));
        let r = fuzz_diff(&mut a, &mut b, &cfg, |_| {}).unwrap();
        assert_eq!(r.cases, 300);
        assert_eq!(
            r.differing_cases,
            0,
            "{:#?}",
            r.findings.first().map(|f| &f.0)
        );
        let mut c = SimTarget::new(2, Some(PlantedBug::WriteInsideSend));
        let r = fuzz_diff(&mut a, &mut c, &cfg, |_| {}).unwrap();
        let f = r
            .findings
            .iter()
            .map(|f| &f.0)
            .find(|f| {
                f.differences
                    .iter()
                    .any(|d| d.what == "private region intact")
            })
            .expect("the planted bug shows as a difference");
        assert_eq!(f.case.packets().count(), 2, "{:#?}", f.case);
    }
}
