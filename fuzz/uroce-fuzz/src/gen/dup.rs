//! [`super::Mode::Duplicates`]: duplicates, PSNs ahead and interrupted
//! messages, for every opcode class of the transport (SEND, SEND with
//! immediate, WRITE, WRITE with immediate, READ, compare-and-swap,
//! fetch-and-add, ATOMIC WRITE, FLUSH).
//!
//! A case is zero to two valid messages, then one message of a class
//! (SENDs and WRITEs of one to three packets) and one scenario:
//! * **duplicate**: the message in full, then again (whole, one packet
//!   of it, a READ from one of its middle PSNs with the range moved on, an
//!   atomic with other operands, a WRITE or SEND with other bytes) or an
//!   earlier message again;
//! * **partly executed**: the first packets of a multi-packet message,
//!   duplicates of some of them, then the rest;
//! * **ahead**: a packet of the message at a PSN ahead of the expected
//!   one (1 to 3, far, just under half the PSN space), then the message
//!   in sequence, and sometimes the early packet again;
//! * **interrupted**: the first packets of a multi-packet message, then a
//!   FIRST or ONLY of any class at the next PSN (and its rest), then
//!   sometimes the rest of the interrupted message;
//! * **older duplicate mid-message**: the first packets of a message, a
//!   duplicate of an earlier message, then the rest.
//!
//! Then, half the time, a valid request at the next PSN in sequence.

use super::{requests, transport, valid};
use crate::case::{psn_span, Case, Key, PacketSpec, Step};
use crate::target::Conn;
use rand::rngs::SmallRng;
use rand::Rng;
use uroce_provider::types::QpType;
use uroce_wire::{Opcode, Operation, Position};

/// An opcode class: what a message does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm,
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate.
    WriteImm,
    /// RDMA READ.
    Read,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
    /// ATOMIC WRITE.
    AtomicWrite,
    /// FLUSH.
    Flush,
}

impl Class {
    /// Every class.
    pub(crate) const ALL: [Class; 9] = [
        Class::Send,
        Class::SendImm,
        Class::Write,
        Class::WriteImm,
        Class::Read,
        Class::CompareSwap,
        Class::FetchAdd,
        Class::AtomicWrite,
        Class::Flush,
    ];

    fn operation(self) -> Operation {
        match self {
            Class::Send | Class::SendImm => Operation::Send,
            Class::Write | Class::WriteImm => Operation::RdmaWrite,
            Class::Read => Operation::RdmaReadRequest,
            Class::CompareSwap => Operation::CompareSwap,
            Class::FetchAdd => Operation::FetchAdd,
            Class::AtomicWrite => Operation::AtomicWrite,
            Class::Flush => Operation::Flush,
        }
    }

    /// Whether its messages may span several packets.
    fn multi(self) -> bool {
        matches!(
            self,
            Class::Send | Class::SendImm | Class::Write | Class::WriteImm
        )
    }

    /// The class's opcode at `pos` on `t` (immediate data on the packet
    /// that ends the message only).
    pub(crate) fn opcode(self, t: QpType, pos: Position) -> Option<Opcode> {
        let imm = matches!(self, Class::SendImm | Class::WriteImm) && pos.ends_message();
        requests(t)
            .into_iter()
            .find(|o| {
                o.info().is_some_and(|i| {
                    i.operation == self.operation()
                        && i.position == pos
                        && i.has_imm() == imm
                        && !i.has_ieth()
                })
            })
            .filter(|o| o.info().is_some_and(|i| i.transport == transport(t)))
    }

    /// The classes `t` has.
    pub(crate) fn of(t: QpType) -> Vec<Class> {
        Class::ALL
            .into_iter()
            .filter(|c| c.opcode(t, Position::Only).is_some())
            .collect()
    }
}

/// The packets of one valid message of `class` in `n` packets (1 for a
/// class that has no multi-packet messages) from PSN offset `psn`.
pub(crate) fn message(
    class: Class,
    n: u32,
    psn: i32,
    conn: &Conn,
    rng: &mut SmallRng,
) -> Vec<PacketSpec> {
    let t = conn.qp_type;
    let n = if class.multi() { n.max(1) } else { 1 };
    if n == 1 {
        let Some(op) = class.opcode(t, Position::Only) else {
            return Vec::new();
        };
        let mut p = valid(op, psn, conn, rng);
        match class {
            Class::AtomicWrite => p.payload.0 = 8,
            Class::Flush => {
                let dma = rng.random_range(0..=conn.len.min(conn.mtu));
                let off = rng.random_range(0..=(conn.len - dma) / 8) * 8;
                p.reth = Some((i64::from(off), Key::Valid, dma));
            }
            _ => {}
        }
        return vec![p];
    }
    let mtu = conn.mtu;
    let last_len = rng.random_range(1..=mtu);
    let total = (n - 1) * mtu + last_len;
    let off = rng.random_range(0..=conn.len.saturating_sub(total) / 8) * 8;
    (0..n)
        .filter_map(|i| {
            let pos = match i {
                0 => Position::First,
                i if i + 1 == n => Position::Last,
                _ => Position::Middle,
            };
            let mut p = valid(class.opcode(t, pos)?, psn + i as i32, conn, rng);
            p.payload.0 = if pos == Position::Last { last_len } else { mtu } as u16;
            p.reth = (pos == Position::First && class.operation() == Operation::RdmaWrite)
                .then_some((i64::from(off), Key::Valid, total));
            Some(p)
        })
        .collect()
}

/// PSNs `m` takes in sequence.
fn span(m: &[PacketSpec], mtu: u32) -> i32 {
    m.iter().map(|p| psn_span(p, mtu)).sum()
}

/// A duplicate of the executed message `m` (as a correct requester may
/// resend it, or a confused one): whole, one packet, a READ resumed from
/// a later PSN, an atomic with other operands, data with other bytes.
fn duplicate(m: &[PacketSpec], conn: &Conn, rng: &mut SmallRng) -> Vec<PacketSpec> {
    let mut d: Vec<PacketSpec> = match rng.random_range(0..3) {
        0 => m.to_vec(),
        _ => m
            .get(rng.random_range(0..m.len().max(1)))
            .cloned()
            .into_iter()
            .collect(),
    };
    for p in &mut d {
        match p.info().map(|i| i.operation) {
            Some(Operation::RdmaReadRequest) if rng.random() => {
                // From a later PSN of the READ, the range moved on as far
                // (IBA 9.7.5.1.3.2: a duplicate READ may resume).
                let (off, k, len) = p.reth.unwrap_or((0, Key::Valid, 0));
                let n = psn_span(p, conn.mtu);
                let skip = rng.random_range(0..n);
                let moved = (skip as u32 * conn.mtu).min(len);
                p.psn_off += skip;
                p.reth = Some((off + i64::from(moved), k, len - moved));
            }
            Some(Operation::CompareSwap | Operation::FetchAdd) if rng.random() => {
                if let Some(a) = &mut p.atomic {
                    (a.2, a.3) = (rng.random(), rng.random());
                }
            }
            _ if rng.random() => p.payload.1 = p.payload.1.wrapping_add(1),
            _ => {}
        }
    }
    d
}

fn pick<T: Copy>(rng: &mut SmallRng, v: &[T]) -> T {
    v[rng.random_range(0..v.len())]
}

/// A duplicates case.
pub(crate) fn dup_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    let classes = Class::of(conn.qp_type);
    let multi: Vec<Class> = classes.iter().copied().filter(|c| c.multi()).collect();
    // UD has no multi-packet messages: its packets are each a message.
    let has_multi = conn.qp_type != QpType::Ud;
    let mtu = conn.mtu;
    let mut out: Vec<PacketSpec> = Vec::new();
    let mut psn = 0i32;
    let mut done: Vec<Vec<PacketSpec>> = Vec::new();
    for _ in 0..rng.random_range(0..=2) {
        let m = message(pick(rng, &classes), rng.random_range(1..=3), psn, conn, rng);
        psn += span(&m, mtu);
        out.extend(m.iter().cloned());
        done.push(m);
    }
    let scenario = if has_multi {
        rng.random_range(0..5)
    } else {
        pick(rng, &[0, 2])
    };
    let class = if scenario == 0 || scenario == 2 || !has_multi {
        pick(rng, &classes)
    } else {
        pick(rng, &multi)
    };
    let n = if has_multi {
        rng.random_range(2..=3)
    } else {
        1
    };
    let m = message(class, n, psn, conn, rng);
    let cut = rng.random_range(1..m.len().max(2)).min(m.len());
    let mut waits = Vec::new();
    match scenario {
        // Duplicate of the whole message, or of an earlier one.
        0 => {
            out.extend(m.iter().cloned());
            waits.push(out.len());
            let old = match done.len() {
                0 => &m,
                k if rng.random() => &done[rng.random_range(0..k)],
                _ => &m,
            };
            out.extend(duplicate(old, conn, rng));
            psn += span(&m, mtu);
        }
        // Partly executed: its first packets, duplicates of them, the rest.
        1 => {
            out.extend(m[..cut].iter().cloned());
            waits.push(out.len());
            out.extend(duplicate(&m[..cut], conn, rng));
            out.extend(m[cut..].iter().cloned());
            psn += span(&m, mtu);
        }
        // A packet ahead, then the message in sequence.
        2 => {
            let ahead = pick(rng, &[1, 2, 3, 1 << 20, (1 << 23) - 1]);
            let mut early = m[rng.random_range(0..m.len())].clone();
            early.psn_off = psn + span(&m, mtu) - 1 + ahead;
            out.push(early.clone());
            waits.push(out.len());
            out.extend(m.iter().cloned());
            if rng.random() {
                out.push(early);
            }
            psn += span(&m, mtu);
        }
        // A FIRST or ONLY while the message is in progress.
        3 => {
            out.extend(m[..cut].iter().cloned());
            let at = psn + cut as i32;
            let other = message(pick(rng, &classes), rng.random_range(1..=3), at, conn, rng);
            // The interrupting message whole, or only its first packet
            // (then the valid request after the case interrupts it too).
            let whole = rng.random();
            let other = if whole { &other[..] } else { &other[..1] };
            out.extend(other.iter().cloned());
            psn = at + span(other, mtu);
            if whole && rng.random() {
                // The rest of the interrupted message, in sequence.
                for p in &m[cut..] {
                    out.push(PacketSpec {
                        psn_off: psn,
                        ..p.clone()
                    });
                    psn += 1;
                }
            }
        }
        // An earlier message's duplicate while this one is in progress.
        _ => {
            out.extend(m[..cut].iter().cloned());
            waits.push(out.len());
            let old = done.last().map_or(&m[..cut], |d| &d[..]);
            out.extend(duplicate(old, conn, rng));
            out.extend(m[cut..].iter().cloned());
            psn += span(&m, mtu);
        }
    }
    let mut steps = Vec::new();
    for (i, p) in out.into_iter().enumerate() {
        if waits.contains(&i) && rng.random() {
            steps.push(Step::Wait(rng.random_range(1..2_000)));
        }
        steps.push(Step::Packet(p));
    }
    if rng.random() {
        if let Some(c) = classes.first() {
            let next = message(*c, 1, psn, conn, rng);
            steps.extend(next.into_iter().map(Step::Packet));
        }
    }
    steps.push(Step::Wait(5_000));
    Case { steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{Generator, Mode};
    use crate::sim::SimTarget;
    use crate::target::Target;
    use std::collections::BTreeSet;

    /// The class of a request packet (None: SEND with Invalidate, or not
    /// a request).
    fn class_of(p: &PacketSpec) -> Option<Class> {
        let i = p.info()?;
        Class::ALL.into_iter().find(|c| {
            c.operation() == i.operation
                && !i.has_ieth()
                && (i.has_imm() == matches!(c, Class::SendImm | Class::WriteImm)
                    || !i.position.ends_message())
                && (c.multi() || i.position == Position::Only)
        })
    }

    /// What the duplicates mode made over `n` cases on `t`: the classes
    /// sent as duplicates and ahead, and how many cases had a duplicate
    /// inside a partly executed message, and a FIRST or ONLY while a
    /// message was in progress.
    fn survey(t: QpType, n: u64) -> (BTreeSet<String>, BTreeSet<String>, usize, usize) {
        let mut sim = SimTarget::new(1, None);
        let conn = sim.setup(t, 4).expect("set up");
        let g = Generator::new(9, Mode::Duplicates);
        let (mut dup, mut ahead) = (BTreeSet::new(), BTreeSet::new());
        let (mut partial, mut interrupted) = (0, 0);
        for i in 0..n {
            let case = g.case(i, &conn);
            let deltas = case.psn_deltas(conn.mtu);
            // Whether a message is open (its FIRST or MIDDLE in sequence).
            let mut open = false;
            let mut saw_partial = false;
            let mut saw_interrupt = false;
            for (p, d) in case.packets().zip(deltas) {
                let (Some(c), Some(info)) = (class_of(p), p.info()) else {
                    continue;
                };
                let name = format!("{c:?}");
                match d {
                    0 => {
                        saw_interrupt |= open && info.position.starts_message();
                        open = !info.position.ends_message();
                    }
                    d if d < 0 => {
                        saw_partial |= open;
                        dup.insert(name);
                    }
                    _ => {
                        ahead.insert(name);
                    }
                }
            }
            partial += usize::from(saw_partial);
            interrupted += usize::from(saw_interrupt);
        }
        (dup, ahead, partial, interrupted)
    }

    /// RC: every opcode class is sent as a duplicate and ahead; duplicates
    /// arrive inside partly executed messages; FIRSTs and ONLYs interrupt
    /// messages in progress.
    #[test]
    fn rc_duplicates_cover_every_class() {
        let (dup, ahead, partial, interrupted) = survey(QpType::Rc, 2_000);
        let all: BTreeSet<String> = Class::ALL.iter().map(|c| format!("{c:?}")).collect();
        assert_eq!(dup, all);
        assert_eq!(ahead, all);
        assert!(
            partial > 100 && interrupted > 100,
            "{partial} {interrupted}"
        );
    }

    /// UC: its four classes, the same ways; UD: its two, duplicated and
    /// ahead.
    #[test]
    fn uc_and_ud_duplicates_cover_their_classes() {
        let (dup, ahead, partial, interrupted) = survey(QpType::Uc, 1_000);
        let uc: BTreeSet<String> = ["Send", "SendImm", "Write", "WriteImm"]
            .map(String::from)
            .into();
        assert_eq!((&dup, &ahead), (&uc, &uc));
        assert!(partial > 50 && interrupted > 50, "{partial} {interrupted}");
        let (dup, ahead, ..) = survey(QpType::Ud, 500);
        let ud: BTreeSet<String> = ["Send", "SendImm"].map(String::from).into();
        assert_eq!((&dup, &ahead), (&ud, &ud));
    }

    /// A message is what its class says: a multi-packet WRITE's FIRST
    /// names the whole DMA length, and its packets take one PSN each.
    #[test]
    fn messages_are_valid() {
        let mut sim = SimTarget::new(1, None);
        let conn = sim.setup(QpType::Rc, 4).expect("set up");
        let mut rng = rand::SeedableRng::seed_from_u64(4);
        for class in Class::ALL {
            let m = message(class, 3, 10, &conn, &mut rng);
            let n = if class.multi() { 3 } else { 1 };
            assert_eq!(m.len(), n, "{class:?}");
            for (i, p) in m.iter().enumerate() {
                assert_eq!(p.psn_off, 10 + i as i32);
                // (A FIRST or MIDDLE has no immediate: SEND's and SEND
                // with immediate's are the same packet.)
                let c = class_of(p).expect("a request");
                if p.info().is_some_and(|i| i.position.ends_message()) {
                    assert_eq!(c, class, "{p:?}");
                }
                assert_eq!(c.operation(), class.operation(), "{p:?}");
            }
            if class.operation() == Operation::RdmaWrite {
                let total: u32 = m.iter().map(|p| u32::from(p.payload.0)).sum();
                assert_eq!(m[0].reth.map(|r| r.2), Some(total));
                assert!(m[1..].iter().all(|p| p.reth.is_none()));
            }
        }
    }
}
