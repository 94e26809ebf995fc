//! The model's rules, case by case, and a survey of its verdicts on
//! uroce's own QP machines.

use super::*;
use crate::gen::{Generator, Mode};
use crate::sim::SimTarget;
use std::collections::BTreeMap;

/// Runs `n` cases of each mode and transport on the sim target and
/// prints the model's verdicts (`UROCE_MODEL_SURVEY=N`).
#[test]
#[ignore = "a survey, run by hand"]
fn survey() {
    let n: u64 = std::env::var("UROCE_MODEL_SURVEY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for qp in [QpType::Rc, QpType::Uc, QpType::Ud] {
        for mode in [Mode::Fields, Mode::Sequence] {
            let mut t = SimTarget::new(1, None);
            let gen = Generator::new(7, mode);
            let probe = crate::target::Target::setup(&mut t, qp, 8).expect("sim");
            let mut tally: BTreeMap<String, u64> = BTreeMap::new();
            let mut shown = 0;
            for i in 0..n {
                let case = gen.case(i, &probe);
                let out = crate::run_case(&mut t, qp, 8, &case).expect("sim");
                let v = judge(&out.conn, &case, &out.obs);
                let key = match &v {
                    Verdict::Legal => "legal".to_string(),
                    Verdict::Open(w) => format!("open: {w}"),
                    Verdict::Illegal(m) => format!("ILLEGAL {}", m[0].rule),
                };
                if let (Verdict::Illegal(m), true) = (&v, shown < 3) {
                    shown += 1;
                    println!(
                        "--- {qp:?} {mode:?} case {i}: {m:#?}\n{}",
                        serde_json::to_string(&case).unwrap_or_default()
                    );
                }
                *tally.entry(key).or_default() += 1;
            }
            println!("{qp:?} {mode:?}: {tally:?}");
        }
    }
}
