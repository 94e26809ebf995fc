//! The generator's cases for the coverage-guided `sim_case` cargo-fuzz
//! target (fuzz/fuzz_targets/sim_case.rs), in its input format
//! (`uroce_fuzz::input`).
//!
//! ```sh
//! # N cases of every (transport, mode) as seed files in DIR
//! cargo run --release -p uroce-fuzz --example sim_case_seeds -- write DIR N
//! # the generator alone for SECONDS (or CASES cases, if fewer) on the
//! # sim target (RC, UC and UD, every mode, in turn): the baseline a
//! # coverage-guided campaign is compared with
//! cargo run --release -p uroce-fuzz --example sim_case_seeds -- run SECONDS [CASES]
//! ```

use std::time::{Duration, Instant};
use uroce_fuzz::gen::{Generator, Mode};
use uroce_fuzz::input::FuzzInput;
use uroce_fuzz::sim::SimTarget;
use uroce_fuzz::target::Target;
use uroce_provider::types::QpType;

/// Every (transport, mode) the generator has.
const KINDS: [(QpType, Mode, &str); 7] = [
    (QpType::Rc, Mode::Fields, "rc_fields"),
    (QpType::Rc, Mode::Sequence, "rc_sequence"),
    (QpType::Rc, Mode::Responder, "rc_responder"),
    (QpType::Uc, Mode::Fields, "uc_fields"),
    (QpType::Uc, Mode::Sequence, "uc_sequence"),
    (QpType::Ud, Mode::Fields, "ud_fields"),
    (QpType::Ud, Mode::Sequence, "ud_sequence"),
];

/// The sim target's seed for case `i` (its PSNs differ from case to case).
fn seed(i: u64) -> u32 {
    (i as u32).wrapping_mul(0x9e37_79b9) | 1
}

fn input(kind: usize, i: u64) -> FuzzInput {
    let (qp, mode, _) = KINDS[kind];
    let seed = seed(i);
    let conn = SimTarget::new(u64::from(seed), None)
        .setup(qp, 8)
        .expect("the sim target sets up");
    FuzzInput {
        seed,
        qp_type: qp,
        recvs: 8,
        case: Generator::new(1, mode).case(i, &conn),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["write", dir, n] => {
            let n: u64 = n.parse().expect("N: a number");
            std::fs::create_dir_all(dir).expect("create DIR");
            for (k, &(_, _, name)) in KINDS.iter().enumerate() {
                for i in 0..n {
                    let path = format!("{dir}/{name}_{i:04}");
                    std::fs::write(&path, input(k, i).encode()).expect("write a seed");
                }
            }
            println!("{} seeds in {dir}", n * KINDS.len() as u64);
        }
        ["run", secs, ref cases @ ..] => {
            let limit = Duration::from_secs(secs.parse().expect("SECONDS: a number"));
            let cases: u64 = cases
                .first()
                .map_or(u64::MAX, |c| c.parse().expect("CASES"));
            let start = Instant::now();
            let (mut runs, mut findings) = (0u64, 0u64);
            while start.elapsed() < limit && runs < cases {
                let i = runs / KINDS.len() as u64;
                let out = input((runs % KINDS.len() as u64) as usize, i)
                    .run()
                    .expect("sim");
                if !out.violations.is_empty() {
                    findings += 1;
                    eprintln!(
                        "{:?} case {i}: {:?}",
                        KINDS[(runs % 7) as usize].2,
                        out.violations
                    );
                }
                runs += 1;
            }
            println!(
                "{runs} generator cases in {:.0} s, {findings} with violations",
                start.elapsed().as_secs_f64()
            );
        }
        _ => {
            eprintln!("usage: sim_case_seeds write DIR N | run SECONDS [CASES]");
            std::process::exit(2);
        }
    }
}
