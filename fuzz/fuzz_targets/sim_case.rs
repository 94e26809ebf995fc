//! Coverage-guided fuzzing of uroce's own QP machines with `uroce fuzz`'s
//! case model: the input is a case (`uroce_fuzz::input::FuzzInput`: the
//! transport, RC, UC or UD, the sim target's seed, the receive WRs and up
//! to 64 steps of packets relative to the connection, posts and waits),
//! run on a fresh sim target and judged by `uroce_fuzz::oracle::check`;
//! a violation is a crash. Seeds: the generator's cases
//! (`fuzz/seeds_sim/`, or `cargo run -p uroce-fuzz --example
//! sim_case_seeds -- write DIR N`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use uroce_fuzz::input::FuzzInput;

fuzz_target!(|input: FuzzInput| {
    let out = input.run().expect("the sim target sets up");
    if !out.violations.is_empty() {
        let rules: Vec<&str> = out.violations.iter().map(|v| v.rule()).collect();
        let msg = format!(
            "oracle: {:?} (rules: {rules:?}) on {:?} QP, seed {}, case {:?}",
            out.violations, input.qp_type, input.seed, input.case
        );
        // UROCE_SIM_CASE_REPORT=1: a violation is printed (one line,
        // "sim_case finding: ...") instead of being a crash, so that a
        // run goes on and counts them; a panic inside uroce or the
        // model still stops it.
        if std::env::var_os("UROCE_SIM_CASE_REPORT").is_some_and(|v| !v.is_empty()) {
            eprintln!("sim_case finding: {msg}");
        } else {
            panic!("{msg}");
        }
    }
});
