//! Packets already known to crash a target's kernel, left out of a
//! campaign on request (`uroce fuzz --skip-known-crashes`): once a crash
//! is recorded (its case under `fuzz/cases/`), a campaign that hits it
//! again learns nothing more and ends there, with its other transports
//! and modes unrun. Each entry says which stack it crashes and how.

use crate::case::{Case, Step};

/// RDMA WRITE FIRST/ONLY opcodes (RC and UC): the ones carrying a RETH.
const WRITE_WITH_RETH: [u8; 6] = [0x06, 0x0a, 0x0b, 0x26, 0x2a, 0x2b];

/// Makes `case` safe for a target with a known crash, in place; returns
/// how many packets it changed.
///
/// Kernel rxe (6.1 panics; 6.12 logs a WARNING): an RDMA WRITE (RC or
/// UC) whose RETH names a DMA length of 0 but which carries a payload
/// makes its responder skip the R_Key lookup and copy with no MR
/// (`fuzz/cases/rxe-write-len0-payload.json`). Such a packet keeps its
/// headers and loses its payload: an empty WRITE, which every stack takes.
/// A packet whose opcode byte is overwritten into such a WRITE (its RETH
/// then read from whatever follows the BTH) loses its payload too.
pub fn defuse(case: &mut Case) -> usize {
    let mut changed = 0;
    for step in case.steps.iter_mut() {
        let Step::Packet(p) = step else { continue };
        let op = p.raw_opcode.unwrap_or(p.opcode);
        if !WRITE_WITH_RETH.contains(&op) || p.payload.0 == 0 {
            continue;
        }
        let named_len = match (p.raw_opcode, p.reth) {
            // The RETH the packet was built with is the one read.
            (None, Some((_, _, len))) => Some(len),
            // Another opcode's headers, or none, read as a RETH.
            _ => None,
        };
        if named_len.is_none_or(|len| len == 0) {
            p.payload.0 = 0;
            changed += 1;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Key, PacketSpec};
    use uroce_wire::Opcode;

    fn write(op: Opcode, len: u32, payload: u16) -> PacketSpec {
        let mut p = PacketSpec::new(op, 0);
        p.reth = Some((0, Key::Valid, len));
        p.payload = (payload, 0);
        p
    }

    /// The rxe crash case, on RC and UC, loses its payload; WRITEs that
    /// name their length, and other opcodes, are left alone.
    #[test]
    fn the_zero_length_write_with_a_payload_is_defused() {
        let mut case = Case {
            steps: vec![
                Step::Packet(write(Opcode::RC_RDMA_WRITE_ONLY, 0, 130)),
                Step::Packet(write(Opcode::UC_RDMA_WRITE_ONLY, 0, 130)),
                Step::Packet(write(Opcode::RC_RDMA_WRITE_ONLY, 130, 130)),
                Step::Packet(write(Opcode::RC_SEND_ONLY, 0, 130)),
                Step::Wait(1),
            ],
        };
        assert_eq!(defuse(&mut case), 2);
        let lens: Vec<u16> = case.packets().map(|p| p.payload.0).collect();
        assert_eq!(lens, [0, 0, 130, 130]);
        // A SEND whose opcode byte becomes a WRITE ONLY: its RETH is read
        // from the payload.
        let mut p = write(Opcode::RC_SEND_ONLY, 0, 64);
        p.reth = None;
        p.raw_opcode = Some(Opcode::RC_RDMA_WRITE_ONLY.0);
        let mut case = Case {
            steps: vec![Step::Packet(p)],
        };
        assert_eq!(defuse(&mut case), 1);
        // The committed crash case is one of them.
        let f = crate::Finding::load(
            &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../cases/rxe-write-len0-payload.json"),
        )
        .expect("case");
        let mut case = f.case.clone();
        assert_eq!(defuse(&mut case), 1);
    }
}
