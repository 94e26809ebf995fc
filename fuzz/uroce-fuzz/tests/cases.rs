//! The cases committed under fuzz/cases/ (reproducers of what the fuzzer
//! found in other stacks) still load and mean what their README entry
//! says, on uroce's own QP machines.

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
