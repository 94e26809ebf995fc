//! `sim_case` campaign findings that were uroce's bugs, fixed: each
//! input (a libFuzzer crash file under tests/sim_case/) now runs clean,
//! the reference model included.

use uroce_fuzz::input::FuzzInput;

fn violations(bytes: &[u8]) -> Vec<uroce_fuzz::oracle::Violation> {
    FuzzInput::decode(bytes).run().expect("sim").violations
}

/// uroce's requester, with a WRITE and a SEND outstanding, got an ATOMIC
/// ACKNOWLEDGE at the SEND's PSN (after a later SEND went out at it). It
/// took it as a coalesced ACK: the WRITE and the first SEND completed
/// with success, acknowledged by a response of the wrong kind. Such a
/// response is discarded whole (IBA 9.7.5.2); the WRITE ends in
/// RETRY_EXC_ERR, as the model says.
#[test]
fn an_atomic_ack_at_a_sends_psn_acknowledges_nothing() {
    let v = violations(include_bytes!("sim_case/atomic-ack-at-a-send.bin"));
    assert!(v.is_empty(), "{v:#?}");
}

/// An ATOMIC ACKNOWLEDGE the fuzzer sent before the case posted the
/// FETCH AND ADD that took its PSN: the sim target handled the post
/// first (a step transmitted before it delivered), so the early answer
/// completed the atomic with its value, against the case's order. The
/// sim target now handles an injected packet at once.
#[test]
fn a_packet_step_is_handled_before_the_post_after_it() {
    let v = violations(include_bytes!("sim_case/atomic-ack-before-its-atomic.bin"));
    assert!(v.is_empty(), "{v:#?}");
}
