//! The cases committed under fuzz/cases/ (reproducers of what the fuzzer
//! found in other stacks) still load and mean what their entry in the book
//! (docs/src/found.md) says, on uroce's own QP machines.

use std::path::PathBuf;
use uroce_fuzz::diff::answer_kind;
use uroce_fuzz::sim::SimTarget;
use uroce_fuzz::{run_case, Finding};
use uroce_provider::types::QpState;

fn case(name: &str) -> Finding {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../cases")
        .join(name);
    Finding::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one packet that crashes kernel rxe 6.1 and makes 6.12 log a
/// kernel WARNING (an RDMA WRITE ONLY with a RETH DMA length of 0 and a
/// payload: rxe skips the R_Key check for a zero-length access, then
/// copies the payload with no MR: 6.1 dereferences NULL, 6.12 catches it
/// in rxe_mr_copy with a WARN and NAKs remote access error).
/// A correct responder answers it with NAK invalid request and moves the
/// QP to ERR, with nothing written: the file replays that packet.
#[test]
fn the_rxe_crash_case_is_an_invalid_request_for_uroce() {
    let f = case("rxe-write-len0-payload.json");
    let packets: Vec<_> = f.case.packets().collect();
    assert_eq!(packets.len(), 1, "one packet");
    let p = packets[0];
    assert_eq!(p.opcode, uroce_wire::Opcode::RC_RDMA_WRITE_ONLY.0);
    assert_eq!(p.reth.map(|r| r.2), Some(0), "DMA length 0");
    assert!(p.payload.0 > 0, "with a payload");

    let mut t = SimTarget::new(1, None);
    let out = run_case(&mut t, f.qp_type, f.recvs, &f.case).expect("sim target");
    let answers: Vec<String> = out
        .packets
        .iter()
        .filter(|p| !p.sent)
        .map(|p| answer_kind(&p.bytes))
        .collect();
    assert_eq!(answers, ["NAK invalid request"]);
    assert_eq!(out.obs.qp_state, QpState::Err);
    assert!(out.violations.is_empty(), "{:?}", out.violations);
}

/// Replays a committed rxe case on uroce's own QP machines: the reference
/// model and every oracle accept what uroce does; returns its answers.
fn replay_clean(name: &str) -> (Vec<String>, uroce_fuzz::Outcome) {
    let f = case(name);
    let mut t = SimTarget::new(1, None);
    let out = run_case(&mut t, f.qp_type, f.recvs, &f.case).expect("sim target");
    assert!(out.violations.is_empty(), "{name}: {:?}", out.violations);
    let answers = out
        .packets
        .iter()
        .filter(|p| !p.sent)
        .map(|p| answer_kind(&p.bytes))
        .collect();
    (answers, out)
}

/// rxe checks an access through a memory window against the window's MR,
/// not the window: one byte just past a type 1 window (inside its MR) is
/// written and ACKed. uroce bounds the access by the window (IBA
/// 10.6.7.2): NAK remote access error, nothing written, the QP in ERR.
#[test]
fn an_access_past_a_window_is_a_remote_access_error_for_uroce() {
    let (answers, out) = replay_clean("rxe-mw-beyond-window.json");
    assert_eq!(answers, ["NAK remote access error"]);
    assert_eq!(out.obs.qp_state, QpState::Err);
}

/// rxe ACKs a SEND with Invalidate whose key cannot be invalidated (and
/// fails the receive, and enters ERR): IBA 9.9.3 class J sends no NAK.
/// uroce does the same (it NAKed it before).
#[test]
fn a_failed_send_with_invalidate_is_acked_as_rxe_acks_it() {
    let (answers, out) = replay_clean("rxe-send-inv-acked.json");
    assert_eq!(answers, ["ACK"]);
    assert_eq!(out.obs.qp_state, QpState::Err);
}

/// rxe answers a duplicate that comes before any request executed with an
/// ACK for PSN 0xffffff. uroce acknowledges at most the PSN before the
/// expected one, which the model accepts.
#[test]
fn an_early_duplicate_is_acknowledged_inside_the_window_by_uroce() {
    let (answers, _) = replay_clean("rxe-dup-ack-ffffff.json");
    assert!(!answers.is_empty(), "the duplicate is answered");
    assert!(answers.iter().all(|a| a.starts_with("ACK")), "{answers:?}");
}

/// As requester, rxe completes a SEND with success when an ATOMIC
/// ACKNOWLEDGE arrives at its last PSN. uroce's requester does not
/// take a response of the wrong kind as the SEND's acknowledgement.
#[test]
fn an_atomic_ack_does_not_complete_a_send_for_uroce() {
    let (_, out) = replay_clean("rxe-atomic-ack-completes-send.json");
    let send: Vec<_> = out.obs.completions.iter().filter(|c| !c.recv).collect();
    // The SEND waits for its real ACK, which never comes: retry exceeded.
    assert_eq!(send.len(), 1, "{send:?}");
    assert_eq!((send[0].wr_id, send[0].status), (256, 12), "{send:?}");
}

/// The UC twin of the rxe crash (a UC RDMA WRITE ONLY, DMA length 0,
/// with a payload: rxe 6.1 panics in rxe_mr_copy). A UC responder drops
/// a malformed WRITE without an answer; uroce does, and its QP stays up.
#[test]
fn the_uc_rxe_crash_case_is_dropped_by_uroce() {
    let f = case("rxe-uc-write-len0-payload.json");
    let p = f.case.packets().next().expect("a packet");
    assert_eq!(p.opcode, uroce_wire::Opcode::UC_RDMA_WRITE_ONLY.0);
    assert_eq!((p.reth.map(|r| r.2), p.payload.0 > 0), (Some(0), true));
    let (answers, out) = replay_clean("rxe-uc-write-len0-payload.json");
    assert!(answers.is_empty(), "{answers:?}");
    assert_eq!(out.obs.qp_state, QpState::Rts);
    assert!(out.obs.private_intact);
}
