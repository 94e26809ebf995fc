//! Stateful fuzzing of a connected UC pair on the simulated network:
//! posts, forged packets, drops and time chosen by the fuzzer, with the
//! invariants of `uroce_fuzz::pair` checked after every step.
#![no_main]
use libfuzzer_sys::fuzz_target;
use uroce_provider::types::QpType;

fuzz_target!(|data: &[u8]| {
    uroce_fuzz::pair::run(QpType::Uc, data);
});
