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

/// The kinds ([`answer_kind`]) of the packets the target sent in a run,
/// in order (into a list, or a set).
pub(crate) fn answer_kinds<C: FromIterator<String>>(o: &Outcome) -> C {
    o.packets
        .iter()
        .filter(|p| !p.sent)
        .map(|p| answer_kind(&p.bytes))
        .collect()
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
        answers: answer_kinds(o),
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
    /// Differences that did not come back when their case was run again
    /// (a live target's timing: an answer late for one run, in time for
    /// the next): counted in `differing_cases`, not kept as findings.
    pub unreproduced: u64,
}

/// Runs of a minimized case, after the first, that may show its
/// difference again before it counts as unreproduced.
pub const RERUNS: usize = 2;

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
        let mut case = gen.case(index, &probe);
        if cfg.skip_known_crashes {
            crate::known::defuse(&mut case);
        }
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
                // The kept case must show a difference when it runs: a
                // difference that comes and goes with a live target's
                // timing can leave the minimizer's last accepted trial
                // without one. Such a case is run again a few times, and
                // counted, not kept, if it never differs.
                let mut again = run(a, b, &min);
                for _ in 0..RERUNS {
                    if !matches!(&again, Ok((d, ..)) if d.is_empty()) {
                        break;
                    }
                    again = run(a, b, &min);
                }
                let Ok((d, x, y)) = again else {
                    // A trial killed a target: the run ends here.
                    report.target_died = true;
                    break;
                };
                if d.is_empty() {
                    report.unreproduced += 1;
                } else {
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
    use crate::target::{Conn, Observation};
    use uroce_provider::types::QpType;

    /// uroce's QP machines, except that the first case observed shows
    /// the QP in SQD: a difference that is not there when the case runs
    /// again, as a live target's late answer is.
    struct OnceOff {
        sim: SimTarget,
        observed: u32,
    }

    impl Target for OnceOff {
        fn name(&self) -> String {
            "sim, once off".into()
        }
        fn setup(&mut self, qp_type: QpType, recvs: u32) -> Result<Conn, TargetError> {
            self.sim.setup(qp_type, recvs)
        }
        fn send(&mut self, packet: &[u8]) {
            self.sim.send(packet)
        }
        fn wait(&mut self, us: u32) -> Vec<Vec<u8>> {
            self.sim.wait(us)
        }
        fn observe(&mut self) -> Result<Observation, TargetError> {
            let mut o = self.sim.observe()?;
            self.observed += 1;
            if self.observed == 1 {
                o.qp_state = QpState::Sqd;
            }
            Ok(o)
        }
        fn revives(&self) -> bool {
            true
        }
    }

    /// A difference that does not come back when its case is run again
    /// is counted as unreproduced, not reported as a finding with no
    /// difference in it.
    #[test]
    fn a_difference_that_does_not_come_back_is_not_a_finding() {
        let cfg = Config {
            seed: 3,
            mode: Mode::Sequence,
            qp_type: QpType::Rc,
            cases: 20,
            time_limit: None,
            minimize: true,
            recvs: 8,
            skip_known_crashes: false,
        };
        let mut a = SimTarget::new(1, None);
        let mut b = OnceOff {
            sim: SimTarget::new(2, None),
            observed: 0,
        };
        let r = fuzz_diff(&mut a, &mut b, &cfg, |_| {}).unwrap();
        assert_eq!(r.differing_cases, 1);
        assert_eq!(r.unreproduced, 1);
        assert!(
            r.findings.is_empty(),
            "{:#?}",
            r.findings.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
    }

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
            skip_known_crashes: false,
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
