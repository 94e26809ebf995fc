//! `packet::parse` on arbitrary bytes, then everything that can be asked
//! of the result, and the ICRC functions (fixed IPv4 and IPv6 contexts).
//! Under `cfg(fuzzing)` ICRC verification always passes, so the fuzzer
//! gets past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::harness;

fuzz_target!(|data: &[u8]| {
    harness::parse_never_panics(data);
});
