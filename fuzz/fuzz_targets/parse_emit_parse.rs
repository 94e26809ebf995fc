//! Whatever `packet::parse` accepts re-emits to a packet that parses to
//! the same headers and payload, equals the input outside reserved bits,
//! pad and ICRC, and is canonical.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::harness;

fuzz_target!(|data: &[u8]| {
    harness::parse_emit_parse(data);
});
