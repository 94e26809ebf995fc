//! The minimizer: the smallest case that still trips the same oracle.
//!
//! First delta debugging over the steps (Zeller's ddmin: remove chunks
//! of halving size while the failure stays), then each packet's fields
//! put back to their valid values one at a time, keeping every change
//! after which the case still fails. Every trial runs the case afresh on
//! the target, so the result is a reproducer, not a guess.

use super::case::{Case, Dest, Icrc, PacketSpec, Step};

/// Shrinks `case` while `fails` holds; returns the smallest case found
/// and the number of trials run. `mtu` is the connection's (a READ's PSN
/// span depends on it): when packets are removed, the PSNs of the rest
/// are tried as they were and renumbered so that each keeps its place in
/// (or out of) sequence; when a post the target makes is removed, the
/// answers to the posts after it are tried moved up by its PSNs.
pub fn minimize(case: &Case, mtu: u32, mut fails: impl FnMut(&Case) -> bool) -> (Case, u32) {
    let mut trials = 0;
    let mut try_case = |c: &Case, trials: &mut u32| {
        *trials += 1;
        fails(c)
    };
    let mut cur = case.clone();
    // ddmin over the steps.
    let mut n = 2usize;
    while cur.steps.len() >= 2 {
        let len = cur.steps.len();
        let chunk = len.div_ceil(n);
        let mut reduced = false;
        let mut start = 0;
        while start < cur.steps.len() {
            let end = (start + chunk).min(cur.steps.len());
            let mut c = cur.clone();
            let removed = c.steps.drain(start..end).collect::<Vec<_>>();
            let mut renumbered = c.clone();
            let before = cur.packets().count();
            let deltas = cur.psn_deltas(mtu);
            // The deltas of the packets that stay.
            let first_removed = cur.steps[..start]
                .iter()
                .filter(|s| matches!(s, Step::Packet(_)))
                .count();
            let n_removed = removed
                .iter()
                .filter(|s| matches!(s, Step::Packet(_)))
                .count();
            let kept: Vec<i32> = (0..before)
                .filter(|&i| i < first_removed || i >= first_removed + n_removed)
                .map(|i| deltas[i])
                .collect();
            renumbered.renumber(&kept, mtu);
            let mut candidates = Vec::with_capacity(3);
            if removed.iter().any(|s| matches!(s, Step::Post(_))) {
                // Without a removed post's PSNs the answers after it move up.
                let mut rebased = renumbered.clone();
                rebased.rebase_responses(&cur, start..end, mtu);
                candidates.push(rebased);
            }
            candidates.extend([renumbered, c]);
            candidates.dedup();
            let mut hit = None;
            for cand in candidates {
                if !cand.steps.is_empty() && try_case(&cand, &mut trials) {
                    hit = Some(cand);
                    break;
                }
            }
            if let Some(c) = hit {
                cur = c;
                reduced = true;
                n = (n - 1).max(2);
            } else {
                start = end;
            }
        }
        if !reduced {
            if chunk <= 1 {
                break;
            }
            n = (n * 2).min(cur.steps.len());
        }
    }
    // Each packet's fields back to valid values, one at a time.
    for i in 0..cur.steps.len() {
        let Step::Packet(_) = &cur.steps[i] else {
            continue;
        };
        for simplify in SIMPLIFICATIONS {
            let mut c = cur.clone();
            let Step::Packet(p) = &mut c.steps[i] else {
                continue;
            };
            if !simplify(p) {
                continue;
            }
            if try_case(&c, &mut trials) {
                cur = c;
            }
        }
    }
    (cur, trials)
}

type Simplify = fn(&mut PacketSpec) -> bool;

/// Puts one field back; false when it already was.
const SIMPLIFICATIONS: &[Simplify] = &[
    |p| std::mem::replace(&mut p.icrc, Icrc::Right) != Icrc::Right,
    |p| p.truncate.take().is_some(),
    |p| p.raw_opcode.take().is_some(),
    |p| p.pad.take().is_some(),
    |p| std::mem::replace(&mut p.tver, 0) != 0,
    |p| std::mem::replace(&mut p.pkey, 0xffff) != 0xffff,
    |p| std::mem::replace(&mut p.dest, Dest::Target) != Dest::Target,
    |p| std::mem::replace(&mut p.migreq, false),
    |p| std::mem::replace(&mut p.se, false),
    |p| !std::mem::replace(&mut p.ack_req, true),
    |p| p.aeth.take().is_some() | p.atomic_ack.take().is_some(),
    |p| p.ieth.take().is_some() | p.deth.take().is_some(),
    |p| {
        let old = p.payload.0;
        p.payload.0 = old.min(8);
        old > 8
    },
    |p| std::mem::replace(&mut p.payload.1, 0) != 0,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Post, PostOp};
    use uroce_wire::Opcode;

    fn post(op: PostOp, len: u32) -> Step {
        Step::Post(Post {
            wr_id: 0,
            op,
            len,
            local_off: 0,
            remote_va: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
        })
    }

    /// A responder case fails when a READ RESPONSE ONLY answers the READ
    /// post's PSN exactly. Removing the 3-packet WRITE ahead of the READ
    /// moves the READ's PSN, so only with the answers moved up can the
    /// minimizer drop the WRITE and its ACK.
    #[test]
    fn removing_a_post_moves_the_answers_after_it() {
        let mut ack = PacketSpec::response(Opcode::RC_ACKNOWLEDGE, 2);
        ack.aeth = Some(Default::default());
        let case = Case {
            steps: vec![
                post(PostOp::Write, 3000),
                post(PostOp::Send, 10),
                post(PostOp::Read, 100),
                Step::Packet(ack),
                Step::Packet(PacketSpec::response(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 4)),
                Step::Wait(5),
            ],
        };
        let fails = |c: &Case| {
            let mut off = 0;
            let mut read_at = None;
            for w in c.posts() {
                if w.op == PostOp::Read {
                    read_at = Some(off as i32);
                }
                off += w.span(1024);
            }
            c.packets().any(|p| {
                p.resp
                    && p.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY.0
                    && Some(p.psn_off) == read_at
            })
        };
        assert!(fails(&case));
        let (min, _) = minimize(&case, 1024, fails);
        assert_eq!(min.steps.len(), 2, "{min:#?}");
        assert!(matches!(&min.steps[0], Step::Post(w) if w.op == PostOp::Read));
        assert!(matches!(&min.steps[1], Step::Packet(p) if p.psn_off == 0));
    }

    /// A case fails when it holds packet 3 followed (later) by packet 7
    /// with a wrong ICRC: the minimizer must find exactly those two, with
    /// every other field put back.
    #[test]
    fn ddmin_keeps_only_what_matters() {
        let mut steps = Vec::new();
        for i in 0..12 {
            let mut p = PacketSpec::new(Opcode(4), i);
            p.pkey = 0x7001;
            p.payload = (100, 7);
            if i == 7 {
                p.icrc = Icrc::Wrong(1);
            }
            steps.push(Step::Packet(p));
            steps.push(Step::Wait(10));
        }
        let case = Case { steps };
        let fails = |c: &Case| {
            let ps: Vec<&PacketSpec> = c.packets().collect();
            let a = ps.iter().position(|p| p.psn_off == 3);
            let b = ps
                .iter()
                .position(|p| p.psn_off == 7 && p.icrc != Icrc::Right);
            matches!((a, b), (Some(a), Some(b)) if a < b)
        };
        assert!(fails(&case));
        let (min, trials) = minimize(&case, 1024, fails);
        assert_eq!(min.steps.len(), 2, "{min:#?}");
        let ps: Vec<&PacketSpec> = min.packets().collect();
        assert_eq!((ps[0].psn_off, ps[1].psn_off), (3, 7));
        assert_eq!(ps[0].pkey, 0xffff);
        assert_eq!(ps[0].payload, (8, 0));
        assert!(ps[1].icrc != Icrc::Right);
        assert!(trials < 200, "{trials} trials");
    }
}
