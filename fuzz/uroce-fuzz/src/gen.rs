//! Case generators, deterministic from a seed.
//!
//! * [`Mode::Fields`]: one packet that a correct responder accepts (a
//!   SEND, WRITE, READ or atomic of the QP's transport, in sequence, with
//!   the valid key and a range inside the region), then one to three of
//!   its fields mutated: opcode (known and unknown codes, or a header
//!   layout that does not match the opcode byte), PSN (duplicate, ahead,
//!   far, wrapped), destination QP, BTH flags, pad, version, partition
//!   key, the RETH's address, key and length, the AtomicETH's alignment,
//!   the payload length against the MTU and the DMA length, truncation
//!   and the ICRC. A mutated RETH or AtomicETH key may be one of the
//!   target's exposed keys ([`Conn::keys`]) over a range around its
//!   bounds, as in [`Mode::Keys`].
//! * [`Mode::Sequence`]: a run of 2 to 24 requests from a model of the
//!   transport's requester: mostly in sequence (multi-packet SENDs and
//!   WRITEs with their FIRST/MIDDLE/LAST packets, READs advancing the PSN
//!   by their response count), with duplicates, gaps, opcode-sequence
//!   violations (a message interrupted by another, a MIDDLE without a
//!   FIRST) and waits interleaved.
//! * [`Mode::Responder`] (RC): the fuzzer is the responder. The target
//!   posts one to four SENDs, WRITEs, READs and atomics; the fuzzer
//!   answers them from a model of a correct responder (ACKs, some
//!   coalesced, READ responses, atomic ACKs, with the right PSNs and
//!   MSNs), then breaks one to three things: ghost ACKs (for PSNs never
//!   sent), duplicates, sequence NAKs, error NAKs, RNR NAKs, implied NAKs
//!   (a READ's responses left out before a later ACK), partial, reordered
//!   and over-long READ responses, atomic ACKs for the wrong PSN,
//!   response opcodes swapped, and the header mutations of the other
//!   modes.
//! * [`Mode::Keys`]: key confusion aimed at every key the target exposes
//!   (rights lacking, another PD, deregistered, windows unbound,
//!   invalidated or bound to another QP, ranges straddling the bounds);
//!   on UD, Q_Key and source-QP mismatches (`gen/keys.rs`).
//! * [`Mode::Duplicates`]: duplicates (of whole and of partly executed
//!   messages), PSNs ahead and a FIRST or ONLY while a message is in
//!   progress, for every opcode class of the transport (`gen/dup.rs`).

mod dup;
mod keys;

use super::case::{Case, Dest, Icrc, Key, PacketSpec, Post, PostOp, Step};
use super::target::Conn;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use uroce_provider::types::QpType;
use uroce_wire::{Opcode, Operation, Position, Transport};

/// What the generator makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Field mutation of single packets.
    Fields,
    /// Stateful request sequences.
    Sequence,
    /// The fuzzer answers the target's requests (RC).
    Responder,
    /// Key confusion (RC, UC); Q_Key and source-QP mismatches (UD).
    Keys,
    /// Duplicates, PSNs ahead, messages interrupted.
    Duplicates,
}

impl Mode {
    /// Every mode's name, as [`Mode::from_name`] takes it.
    pub const NAMES: [&'static str; 5] = ["fields", "sequence", "responder", "keys", "duplicates"];

    /// Parses a name of [`Mode::NAMES`] (or `seq`, `dup`).
    pub fn from_name(s: &str) -> Option<Mode> {
        match s {
            "fields" => Some(Mode::Fields),
            "sequence" | "seq" => Some(Mode::Sequence),
            "responder" => Some(Mode::Responder),
            "keys" => Some(Mode::Keys),
            "duplicates" | "dup" => Some(Mode::Duplicates),
            _ => None,
        }
    }
}

/// The generator: case `i` of seed `s` is always the same case.
#[derive(Debug)]
pub struct Generator {
    seed: u64,
    mode: Mode,
}

fn transport(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
    }
}

/// Request opcodes of a transport.
fn requests(t: QpType) -> Vec<Opcode> {
    Opcode::all()
        .filter(|i| i.transport == transport(t) && i.is_request)
        .map(|i| Opcode(i.code))
        .collect()
}

impl Generator {
    /// A generator of `mode` cases from `seed`.
    pub fn new(seed: u64, mode: Mode) -> Generator {
        Generator { seed, mode }
    }

    /// Case number `index` for `conn`.
    pub fn case(&self, index: u64, conn: &Conn) -> Case {
        let mut rng = SmallRng::seed_from_u64(
            self.seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(index),
        );
        match self.mode {
            Mode::Fields => fields_case(&mut rng, conn),
            Mode::Sequence => sequence_case(&mut rng, conn),
            Mode::Responder => responder_case(&mut rng, conn),
            Mode::Keys => keys::keys_case(&mut rng, conn),
            Mode::Duplicates => dup::dup_case(&mut rng, conn),
        }
    }
}

/// A packet of `op` at `psn_off` that a correct responder accepts.
pub fn valid(op: Opcode, psn_off: i32, conn: &Conn, rng: &mut SmallRng) -> PacketSpec {
    let mut p = PacketSpec::new(op, psn_off);
    let Some(info) = op.info() else { return p };
    let mtu = conn.mtu as u16;
    let region = conn.len;
    let len = match info.position {
        Position::First | Position::Middle => mtu,
        _ => rng.random_range(0..=mtu.min(256)),
    };
    if info.has_payload {
        p.payload = (len, rng.random());
    }
    if info.operation == Operation::AtomicWrite {
        p.payload.0 = 8;
    }
    match info.operation {
        Operation::RdmaWrite | Operation::AtomicWrite | Operation::RdmaReadRequest => {
            let dma = match info.operation {
                Operation::AtomicWrite => 8,
                Operation::RdmaReadRequest => rng.random_range(0..=region.min(3 * conn.mtu)),
                _ if info.position == Position::First => 3 * conn.mtu,
                _ => u32::from(len),
            };
            let off = u64::from(rng.random_range(0..=(region - dma.min(region)) / 8)) * 8;
            p.reth = Some((off as i64, Key::Valid, dma));
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            let off = u64::from(rng.random_range(0..region / 8)) * 8;
            p.atomic = Some((off as i64, Key::Valid, rng.random(), rng.random()));
        }
        _ => {}
    }
    if info.has_imm() {
        p.imm = Some(rng.random());
    }
    if p.has_feth() {
        // A FLUSH's placement type and selectivity from the length drawn
        // above (drawing more would change every later case): mostly
        // global visibility of the range, now and then persistence, both,
        // none (reserved), or the whole region.
        use uroce_wire::feth::{FLUSH_GLOBAL as G, FLUSH_PERSISTENT as P};
        let placement = [G, G, P, G | P, 0, G, G][usize::from(len) % 7];
        p.feth = Some((placement, u8::from(len % 3 == 0)));
    }
    if matches!(conn.qp_type, QpType::Ud) {
        p.deth = Some((None, conn.fuzzer_qpn));
    }
    p
}

pub(crate) fn one_mutation(p: &mut PacketSpec, rng: &mut SmallRng, conn: &Conn) {
    mutate(p, rng, conn);
    // Only a FLUSH has a FETH (the input format keeps it only there).
    if !p.has_feth() {
        p.feth = None;
    }
}

fn mutate(p: &mut PacketSpec, rng: &mut SmallRng, conn: &Conn) {
    let ops: Vec<Opcode> = Opcode::all().map(|i| Opcode(i.code)).collect();
    match rng.random_range(0..20) {
        0 => p.opcode = ops[rng.random_range(0..ops.len())].0,
        1 => p.opcode = rng.random(),
        2 => p.raw_opcode = Some(ops[rng.random_range(0..ops.len())].0),
        3 => {
            p.psn_off = match rng.random_range(0..5) {
                0 => -1,
                1 => -rng.random_range(2..200),
                2 => rng.random_range(1..64),
                3 => rng.random_range(1 << 20..1 << 23),
                _ => (1 << 23) + rng.random_range(-2..2),
            }
        }
        4 => {
            p.dest = match rng.random_range(0..3) {
                0 => Dest::Control,
                1 => Dest::Raw(rng.random_range(0..0x1_0000)),
                _ => Dest::Raw(rng.random()),
            }
        }
        5 => p.se = !p.se,
        6 => p.ack_req = !p.ack_req,
        7 => p.migreq = !p.migreq,
        8 => p.pad = Some(rng.random_range(0..4)),
        9 => p.tver = rng.random_range(1..16),
        10 => p.pkey = rng.random(),
        11 | 12 => {
            let (mut off, mut key, mut len) = p.reth.unwrap_or((0, Key::Valid, 0));
            match rng.random_range(0..8) {
                0 => off = -(rng.random_range(1..4096) as i64),
                1 => off = i64::from(conn.len) - rng.random_range(0..64),
                2 => off = rng.random::<i64>(),
                3 => key = Key::Private,
                4 => key = Key::Raw(rng.random()),
                5 => len = rng.random(),
                6 => len = conn.len + rng.random_range(1..4096),
                _ => {
                    // An exposed key over a range around its bounds.
                    key = keys::pick_key(rng, conn);
                    let klen = match key {
                        Key::Exposed(i) => conn.keys[usize::from(i)].len,
                        _ => conn.len,
                    };
                    (off, len) = keys::pick_range(rng, klen, len.max(1));
                }
            }
            p.reth = Some((off, key, len));
        }
        13 => {
            let (off, key, s, c) = p.atomic.unwrap_or((0, Key::Valid, 0, 0));
            p.atomic = Some(match rng.random_range(0..4) {
                0 => (off + rng.random_range(1..8), key, s, c),
                1 => (off, Key::Private, s, c),
                2 => (i64::from(conn.len) - 4, key, s, c),
                _ => {
                    let key = keys::pick_key(rng, conn);
                    let klen = match key {
                        Key::Exposed(i) => conn.keys[usize::from(i)].len,
                        _ => conn.len,
                    };
                    (i64::from(rng.random_range(0..=klen / 8) * 8), key, s, c)
                }
            });
        }
        14 | 15 => {
            let mtu = conn.mtu as u16;
            p.payload.0 = match rng.random_range(0..4) {
                0 => 0,
                1 => mtu + 1,
                2 => rng.random_range(0..=mtu.saturating_mul(2)),
                _ => mtu - rng.random_range(1..4),
            }
        }
        16 | 17 => p.icrc = Icrc::Wrong(rng.random::<u32>() | 1),
        18 => p.truncate = Some(rng.random_range(0..40)),
        _ => {
            p.aeth = Some((rng.random(), rng.random()));
            p.ieth = Some(if rng.random() {
                Key::Private
            } else {
                Key::Raw(rng.random())
            });
            p.deth = Some((Some(rng.random()), rng.random()));
        }
    }
}

fn fields_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    let ops: Vec<Opcode> = requests(conn.qp_type)
        .into_iter()
        .filter(|o| o.info().is_some_and(|i| i.position == Position::Only))
        .collect();
    let op = ops[rng.random_range(0..ops.len())];
    let mut p = valid(op, 0, conn, rng);
    for _ in 0..rng.random_range(1..=3) {
        one_mutation(&mut p, rng, conn);
    }
    let mut steps = vec![Step::Packet(p), Step::Wait(2_000)];
    // Half the time, a valid request afterwards: is the QP still serving?
    if rng.random() {
        let next = valid(Opcode(ops[0].0), 0, conn, rng);
        steps.push(Step::Packet(next));
        steps.push(Step::Wait(2_000));
    }
    Case { steps }
}

fn sequence_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    let reqs = requests(conn.qp_type);
    let by = |op: Operation, pos: Position| {
        reqs.iter()
            .copied()
            .filter(|o| {
                o.info()
                    .is_some_and(|i| i.operation == op && i.position == pos)
            })
            .collect::<Vec<_>>()
    };
    let mut steps = Vec::new();
    let mut psn = 0i32;
    let n = rng.random_range(2..=24);
    // A message in progress: (operation, packets still to come).
    let mut open: Option<(Operation, u32)> = None;
    for _ in 0..n {
        let roll = rng.random_range(0..100);
        let op = if let (Some((o, left)), true) = (open, roll < 70) {
            // Continue the open message (MIDDLE or LAST).
            let pos = if left > 1 {
                Position::Middle
            } else {
                Position::Last
            };
            let c = by(o, pos);
            open = if left > 1 { Some((o, left - 1)) } else { None };
            c.get(rng.random_range(0..c.len().max(1))).copied()
        } else if roll < 85 || reqs.is_empty() {
            // A new message, possibly interrupting the open one.
            let first_or_only: Vec<Opcode> = reqs
                .iter()
                .copied()
                .filter(|o| o.info().is_some_and(|i| i.position.starts_message()))
                .collect();
            let o = first_or_only[rng.random_range(0..first_or_only.len())];
            let info = o.info().expect("from the table");
            open = (info.position == Position::First)
                .then(|| (info.operation, rng.random_range(1..4)));
            Some(o)
        } else {
            // Any request opcode at all: sequence violations.
            Some(reqs[rng.random_range(0..reqs.len())])
        };
        let Some(op) = op else { continue };
        let psn_off = match rng.random_range(0..20) {
            0 => psn - rng.random_range(1..4),
            1 => psn + rng.random_range(1..4),
            2 => psn + rng.random_range(1 << 22..1 << 23),
            _ => psn,
        };
        let mut p = valid(op, psn_off, conn, rng);
        if rng.random_range(0..10) == 0 {
            one_mutation(&mut p, rng, conn);
        }
        if psn_off == psn {
            psn += super::case::psn_span(&p, conn.mtu);
        }
        steps.push(Step::Packet(p));
        if rng.random_range(0..6) == 0 {
            steps.push(Step::Wait(rng.random_range(1..5_000)));
        }
    }
    steps.push(Step::Wait(5_000));
    Case { steps }
}

/// An ACK-class AETH syndrome: ACK with an invalid credit count (no
/// end-to-end flow control), as most responders send.
const ACK: u8 = 0x1f;

/// The valid answers to `posts` (each with the PSN offset its request
/// starts at): what a correct responder sends, one message after another.
fn answers(posts: &[(Post, i32)], conn: &Conn, rng: &mut SmallRng) -> Vec<PacketSpec> {
    let mtu = conn.mtu;
    let mut out = Vec::new();
    for (msn, (w, start)) in posts.iter().enumerate() {
        let msn = msn as u32 + 1;
        let last = start + w.span(mtu) as i32 - 1;
        match w.op {
            PostOp::Send | PostOp::Write => {
                let mut a = PacketSpec::response(Opcode::RC_ACKNOWLEDGE, last);
                a.aeth = Some((ACK, msn));
                out.push(a);
            }
            PostOp::CompareSwap | PostOp::FetchAdd => {
                let mut a = PacketSpec::response(Opcode::RC_ATOMIC_ACKNOWLEDGE, *start);
                a.aeth = Some((ACK, msn));
                a.atomic_ack = Some(rng.random());
                out.push(a);
            }
            PostOp::Read => {
                let n = w.span(mtu);
                let fill = rng.random();
                for i in 0..n {
                    let op = match crate::model::answer::packet_position(i, n) {
                        Position::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        Position::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        Position::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                        Position::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let mut a = PacketSpec::response(op, start + i as i32);
                    let len = (w.len - i * mtu).min(mtu);
                    a.payload = (len as u16, fill);
                    a.aeth = Some((ACK, msn));
                    out.push(a);
                }
            }
        }
    }
    out
}

fn responder_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    let mtu = conn.mtu;
    let mut steps = Vec::new();
    let mut posts = Vec::new();
    let mut psn = 0i32;
    for i in 0..rng.random_range(1..=4u64) {
        let op = [
            PostOp::Send,
            PostOp::Write,
            PostOp::Read,
            PostOp::CompareSwap,
            PostOp::FetchAdd,
        ][rng.random_range(0..5)];
        let atomic = matches!(op, PostOp::CompareSwap | PostOp::FetchAdd);
        let len = if atomic {
            8
        } else {
            rng.random_range(0..=(3 * mtu).min(conn.len))
        };
        let local_off = if atomic {
            rng.random_range(0..conn.len / 8) * 8
        } else {
            rng.random_range(0..=conn.len - len)
        };
        let w = Post {
            wr_id: 0x100 + i,
            op,
            len,
            local_off,
            remote_va: 0x7f00_0000_0000 + u64::from(rng.random::<u16>()) * 8,
            rkey: 0x4242,
            swap_add: rng.random(),
            compare: rng.random(),
        };
        posts.push((w.clone(), psn));
        psn += w.span(mtu) as i32;
        steps.push(Step::Post(w));
    }
    let span = psn;
    steps.push(Step::Wait(1_000));
    if conn.qp_type != QpType::Rc {
        // UC and UD requests get no answers: the posts alone (what goes
        // out, how each completes, the ones the transport has no
        // operation for).
        steps.push(Step::Wait(5_000));
        return Case { steps };
    }
    let mut ans = answers(&posts, conn, rng);
    // Coalesced ACKs: a plain ACK before another answer may be left out.
    let mut i = 0;
    while i + 1 < ans.len() {
        if ans[i].opcode == Opcode::RC_ACKNOWLEDGE.0 && rng.random_range(0..3) == 0 {
            ans.remove(i);
        } else {
            i += 1;
        }
    }
    for _ in 0..rng.random_range(1..=3) {
        mutate_answers(&mut ans, &posts, span, conn, rng);
    }
    for a in ans {
        steps.push(Step::Packet(a));
        if rng.random_range(0..4) == 0 {
            steps.push(Step::Wait(rng.random_range(1..500)));
        }
    }
    steps.push(Step::Wait(5_000));
    Case { steps }
}

/// Breaks the answers one way.
fn mutate_answers(
    ans: &mut Vec<PacketSpec>,
    posts: &[(Post, i32)],
    span: i32,
    conn: &Conn,
    rng: &mut SmallRng,
) {
    let ack = |op: Opcode, psn: i32, syn: u8| {
        let mut a = PacketSpec::response(op, psn);
        a.aeth = Some((syn, 1));
        a
    };
    let pick = |rng: &mut SmallRng, n: usize| rng.random_range(0..n.max(1));
    let at = pick(rng, ans.len() + 1).min(ans.len());
    let psn_of = |ans: &[PacketSpec], i: usize| ans.get(i).map_or(0, |a| a.psn_off);
    match rng.random_range(0..12) {
        // Ghost ACK: a PSN never sent (just past the last, far ahead, or
        // before the first).
        0 => {
            let psn = match rng.random_range(0..3) {
                0 => span + rng.random_range(0..64),
                1 => (1 << 23) + rng.random_range(-2..2),
                _ => -rng.random_range(1..64),
            };
            ans.insert(at, ack(Opcode::RC_ACKNOWLEDGE, psn, ACK));
        }
        // A duplicate of an answer, later.
        1 if !ans.is_empty() => {
            let i = pick(rng, ans.len());
            let d = ans[i].clone();
            let j = rng.random_range(i..=ans.len());
            ans.insert(j, d);
        }
        // A sequence NAK (the requester resends from there).
        2 => {
            let psn = psn_of(ans, at);
            ans.insert(at, ack(Opcode::RC_ACKNOWLEDGE, psn, 0x60));
        }
        // An error NAK: invalid request, remote access, remote operation,
        // or a reserved NAK code.
        3 => {
            let code = [0x61, 0x62, 0x63, 0x64, 0x6f][rng.random_range(0..5)];
            let psn = psn_of(ans, at);
            ans.insert(at, ack(Opcode::RC_ACKNOWLEDGE, psn, code));
        }
        // An RNR NAK with some timer.
        4 => {
            let psn = psn_of(ans, at);
            // Short timers (10 us .. 2.56 ms): the target's retries end
            // within the case (timer 0 is 655 ms).
            let timer = rng.random_range(1..=16);
            ans.insert(at, ack(Opcode::RC_ACKNOWLEDGE, psn, 0x20 | timer));
        }
        // Implied NAK: a READ's responses left out (a later answer then
        // acknowledges past it).
        5 => {
            let reads: Vec<&(Post, i32)> =
                posts.iter().filter(|(w, _)| w.op == PostOp::Read).collect();
            if let Some((w, s)) = reads.get(pick(rng, reads.len())) {
                let end = s + w.span(conn.mtu) as i32;
                ans.retain(|a| !(a.psn_off >= *s && a.psn_off < end && is_read_response(a)));
                if ans.last().is_none_or(|a| a.psn_off < end) {
                    ans.push(ack(Opcode::RC_ACKNOWLEDGE, span - 1, ACK));
                }
            }
        }
        // Partial READ: one response left out.
        6 => {
            let r: Vec<usize> = (0..ans.len())
                .filter(|&i| is_read_response(&ans[i]))
                .collect();
            if let Some(&i) = r.get(pick(rng, r.len())) {
                ans.remove(i);
            }
        }
        // Reordered: two answers swapped.
        7 if ans.len() >= 2 => {
            let i = pick(rng, ans.len() - 1);
            let j = rng.random_range(i + 1..ans.len());
            ans.swap(i, j);
        }
        // A READ response with another length than the request's.
        8 => {
            let r: Vec<usize> = (0..ans.len())
                .filter(|&i| is_read_response(&ans[i]))
                .collect();
            if let Some(&i) = r.get(pick(rng, r.len())) {
                let l = &mut ans[i].payload.0;
                *l = match rng.random_range(0..3) {
                    0 => l.saturating_add(rng.random_range(1..64)),
                    1 => l.saturating_sub(rng.random_range(1..64)),
                    _ => conn.mtu as u16 + 8,
                };
            }
        }
        // An atomic ACK for the wrong PSN.
        9 => {
            let r: Vec<usize> = (0..ans.len())
                .filter(|&i| ans[i].opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE.0)
                .collect();
            if let Some(&i) = r.get(pick(rng, r.len())) {
                ans[i].psn_off += [-1, 1, span][rng.random_range(0..3)];
            } else {
                let mut a = ack(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn_of(ans, at), ACK);
                a.atomic_ack = Some(rng.random());
                ans.insert(at, a);
            }
        }
        // A response opcode swapped for another.
        10 if !ans.is_empty() => {
            let i = pick(rng, ans.len());
            ans[i].opcode = rng.random_range(0x0d..=0x12);
        }
        // A header mutation as the other modes make.
        _ if !ans.is_empty() => {
            let i = pick(rng, ans.len());
            one_mutation(&mut ans[i], rng, conn);
        }
        _ => {}
    }
}

fn is_read_response(a: &PacketSpec) -> bool {
    (0x0d..=0x10).contains(&a.opcode)
}
