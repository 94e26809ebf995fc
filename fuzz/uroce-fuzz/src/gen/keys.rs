//! [`super::Mode::Keys`]: key confusion, aimed at every key the target
//! exposes ([`Conn::keys`]), and on UD the Q_Key and source QP.
//!
//! RC and UC: one to three requests (WRITE ±imm, READ, atomics, ATOMIC
//! WRITE, FLUSH, SEND with Invalidate — those of the transport) carrying
//! a key the target exposes: one that lacks the right the operation
//! needs (read-only, write-only, no-atomic, local-only), of another PD,
//! of a deregistered region, of an unbound or invalidated window, a
//! window bound to another QP, a window's key with another tag, or the
//! valid keys; over a range inside the key's, straddling its start or
//! end, just past it, zero-length or longer than it. A SEND with
//! Invalidate may invalidate a window the next request then uses; a
//! multi-packet WRITE may name the key in its FIRST. Then,
//! half the time, a valid WRITE: does the QP still serve?
//!
//! UD: SENDs whose DETH carries another Q_Key (one bit off, the
//! controlled Q_Key's high bit flipped or set, 0, random) and another
//! source QP (0, 1, the highest, random), then a valid SEND.

use super::dup::{message, Class};
use super::{requests, valid};
use crate::case::{Case, Key, PacketSpec, Step};
use crate::target::Conn;
use rand::rngs::SmallRng;
use rand::Rng;
use uroce_provider::types::QpType;
use uroce_wire::{Opcode, Operation, Position};

/// The operations a key-confusion request may carry on `t`.
fn key_ops(t: QpType) -> Vec<Opcode> {
    requests(t)
        .into_iter()
        .filter(|o| {
            o.info().is_some_and(|i| {
                i.position == Position::Only
                    && (i.operation != Operation::Send || i.has_ieth())
                    && i.operation != Operation::Acknowledge
            })
        })
        .collect()
}

/// A key to aim at: mostly an exposed one, sometimes a window's key with
/// another tag, the private or the valid one.
pub(crate) fn pick_key(rng: &mut SmallRng, conn: &Conn) -> Key {
    let n = conn.keys.len();
    match rng.random_range(0..10) {
        0 => Key::Valid,
        1 => Key::Private,
        2 if n > 0 => {
            // Another tag on an exposed key's index (a window's stale or
            // future key; for a region, a key that names nothing).
            let k = conn.keys[rng.random_range(0..n)].key;
            Key::Raw(k ^ rng.random_range(1..=0xffu32))
        }
        _ if n > 0 => Key::Exposed(rng.random_range(0..n) as u8),
        _ => Key::Private,
    }
}

/// The range (offset from the key's address, length) a request of
/// `max_len` bytes at most aims at, around a key range of `len` bytes.
pub(crate) fn pick_range(rng: &mut SmallRng, len: u32, max_len: u32) -> (i64, u32) {
    let len64 = i64::from(len);
    let small = |rng: &mut SmallRng| rng.random_range(1..=64u32);
    match rng.random_range(0..7) {
        // Inside.
        0 | 1 => {
            let dma = rng.random_range(0..=len.min(max_len));
            let off = rng.random_range(0..=(len - dma) / 8) * 8;
            (i64::from(off), dma)
        }
        // Straddling the start.
        2 => {
            let before = small(rng);
            (-i64::from(before), before + small(rng))
        }
        // Straddling the end.
        3 => {
            let inside = small(rng).min(len.max(1));
            (len64 - i64::from(inside), inside + small(rng))
        }
        // Just past the end (zero-length or not).
        4 => (len64, [0, 1, 8][rng.random_range(0..3)]),
        // The whole range, or one byte more.
        5 => (0, len.min(max_len) + rng.random_range(0..=1)),
        // Zero-length anywhere near.
        _ => (rng.random_range(-8..=len64 + 8), 0),
    }
}

/// The length the key `k` addresses on `conn` (the exposed region's for
/// the valid and private keys, 0 for a raw one).
fn key_len(k: Key, conn: &Conn) -> u32 {
    match k {
        Key::Valid | Key::Private => conn.len,
        Key::Exposed(i) => conn.keys.get(usize::from(i)).map_or(0, |e| e.len),
        Key::Raw(_) => 0,
    }
}

/// One request of `op` at `psn_off` aimed at `key` over a mutated range.
pub(crate) fn key_request(
    op: Opcode,
    psn_off: i32,
    key: Key,
    conn: &Conn,
    rng: &mut SmallRng,
) -> PacketSpec {
    let mut p = valid(op, psn_off, conn, rng);
    let Some(info) = op.info() else { return p };
    let len = key_len(key, conn);
    match info.operation {
        Operation::CompareSwap | Operation::FetchAdd => {
            let off = match rng.random_range(0..5) {
                0 | 1 => i64::from(rng.random_range(0..len.max(8) / 8) * 8),
                2 => i64::from(len),
                3 => -8,
                _ => i64::from(len) - 4,
            };
            p.atomic = Some((off, key, rng.random(), rng.random()));
        }
        Operation::AtomicWrite => {
            let (off, _) = pick_range(rng, len, 8);
            p.reth = Some((off, key, 8));
            p.payload.0 = 8;
        }
        Operation::RdmaWrite => {
            // A WRITE ONLY's payload is its DMA length (at most the MTU).
            let (off, dma) = pick_range(rng, len, conn.mtu);
            let dma = dma.min(conn.mtu);
            p.reth = Some((off, key, dma));
            p.payload.0 = dma as u16;
        }
        Operation::RdmaReadRequest | Operation::Flush => {
            let (off, dma) = pick_range(rng, len, 3 * conn.mtu);
            p.reth = Some((off, key, dma));
        }
        Operation::Send => p.ieth = Some(key),
        _ => {}
    }
    p
}

/// A key-confusion case.
pub(crate) fn keys_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    if conn.qp_type == QpType::Ud {
        return qkey_case(rng, conn);
    }
    let ops = key_ops(conn.qp_type);
    let mut steps = Vec::new();
    let mut psn = 0i32;
    let mut prev = None;
    for _ in 0..rng.random_range(1..=3) {
        let op = ops[rng.random_range(0..ops.len())];
        // Now and then the key the last request used (a window a SEND
        // with Invalidate just invalidated, say).
        let key = match prev {
            Some(k) if rng.random_range(0..3) == 0 => k,
            _ => pick_key(rng, conn),
        };
        prev = Some(key);
        if rng.random_range(0..4) == 0 {
            // A multi-packet WRITE whose FIRST names the key: the DMA
            // length is the message's, the range around the key's.
            let class = [Class::Write, Class::WriteImm][rng.random_range(0..2)];
            let mut m = message(class, rng.random_range(2..=3), psn, conn, rng);
            if let Some((_, _, total)) = m.first().and_then(|p| p.reth) {
                let (off, _) = pick_range(rng, key_len(key, conn), total);
                m[0].reth = Some((off, key, total));
            }
            psn += m.len() as i32;
            steps.extend(m.into_iter().map(Step::Packet));
            continue;
        }
        let p = key_request(op, psn, key, conn, rng);
        psn += crate::case::psn_span(&p, conn.mtu);
        steps.push(Step::Packet(p));
        if rng.random() {
            steps.push(Step::Wait(rng.random_range(1..2_000)));
        }
    }
    if rng.random() {
        let write = Opcode::all()
            .find(|i| {
                i.transport == super::transport(conn.qp_type)
                    && i.operation == Operation::RdmaWrite
                    && i.position == Position::Only
                    && !i.has_imm()
            })
            .map(|i| Opcode(i.code));
        if let Some(w) = write {
            steps.push(Step::Packet(valid(w, psn, conn, rng)));
        }
    }
    steps.push(Step::Wait(5_000));
    Case { steps }
}

/// A Q_Key other than `qkey`.
fn other_qkey(rng: &mut SmallRng, qkey: u32) -> u32 {
    match rng.random_range(0..5) {
        0 => qkey ^ (1 << rng.random_range(0..31)),
        // The controlled Q_Key bit (IBA 10.2.4.4): flipped, or set.
        1 => qkey ^ 0x8000_0000,
        2 => 0x8000_0000 | rng.random::<u32>(),
        3 => 0,
        _ => rng.random::<u32>() | 1,
    }
}

/// UD: Q_Key and source QP mismatches, then a valid SEND.
fn qkey_case(rng: &mut SmallRng, conn: &Conn) -> Case {
    let sends: Vec<Opcode> = requests(QpType::Ud);
    let mut steps = Vec::new();
    for i in 0..rng.random_range(1..=3) {
        let op = sends[rng.random_range(0..sends.len())];
        let mut p = valid(op, i, conn, rng);
        let qkey = if rng.random_range(0..4) == 0 {
            None
        } else {
            Some(other_qkey(rng, conn.qkey))
        };
        let src = match rng.random_range(0..5) {
            0 => 0,
            1 => 1,
            2 => 0xff_ffff,
            3 => rng.random::<u32>() & 0xff_ffff,
            _ => conn.fuzzer_qpn,
        };
        p.deth = Some((qkey, src));
        steps.push(Step::Packet(p));
    }
    if rng.random() {
        steps.push(Step::Packet(valid(sends[0], 3, conn, rng)));
    }
    steps.push(Step::Wait(5_000));
    Case { steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Dest;
    use crate::gen::{Generator, Mode};
    use crate::sim::{PlantedBug, SimTarget};
    use crate::target::{access, Target, EXPOSED_KEYS};
    use crate::{fuzz, run_case, Config, Violation};
    use uroce_wire::AethSyndrome;

    /// Whether the target answered `case`'s one request with an ACK, a
    /// READ response or an atomic ACK (not a NAK, nor nothing).
    fn accepted(t: &mut SimTarget, case: &Case) -> bool {
        let out = run_case(t, QpType::Rc, 4, case).expect("sim target");
        assert_eq!(out.violations, [], "{case:?}");
        out.packets.iter().filter(|p| !p.sent).any(|p| {
            let Ok(pkt) = uroce_wire::packet::parse(&p.bytes) else {
                return false;
            };
            match pkt.info.operation {
                Operation::RdmaReadResponse | Operation::AtomicAcknowledge => true,
                Operation::Acknowledge => {
                    matches!(
                        pkt.aeth().map(|a| a.syndrome),
                        Some(AethSyndrome::Ack { .. })
                    )
                }
                _ => false,
            }
        })
    }

    /// The sim lists every key of `EXPOSED_KEYS`, and uroce's responder
    /// accepts a WRITE, a READ and an atomic through each exactly when the
    /// table says the key grants it, and none straddling its end.
    #[test]
    fn the_sim_exposes_every_key_with_the_rights_it_claims() {
        let mut t = SimTarget::new(1, None);
        let conn = t.setup(QpType::Rc, 4).expect("set up");
        let names: Vec<&str> = conn.keys.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, EXPOSED_KEYS);
        let ops = [
            (Opcode::RC_RDMA_WRITE_ONLY, access::REMOTE_WRITE),
            (Opcode::RC_RDMA_READ_REQUEST, access::REMOTE_READ),
            (Opcode::RC_FETCH_ADD, access::REMOTE_ATOMIC),
        ];
        let mut granted = 0;
        for (i, k) in conn.keys.iter().enumerate() {
            for (op, need) in ops {
                // Eight bytes at the start, and straddling the end (an
                // atomic: just past it, aligned).
                let atomic = op == Opcode::RC_FETCH_ADD;
                let end = i64::from(k.len) - if atomic { 0 } else { 4 };
                for off in [0, end] {
                    let mut p = PacketSpec::new(op, 0);
                    let key = Key::Exposed(i as u8);
                    if atomic {
                        p.atomic = Some((off, key, 1, 0));
                    } else {
                        p.reth = Some((off, key, 8));
                        p.payload.0 = if op == Opcode::RC_RDMA_WRITE_ONLY {
                            8
                        } else {
                            0
                        };
                    }
                    let want = k.grants(need, k.va.wrapping_add(off as u64), 8);
                    let case = Case {
                        steps: vec![Step::Packet(p), Step::Wait(2_000)],
                    };
                    let got = accepted(&mut t, &case);
                    assert_eq!(got, want, "{} {op:?} +{off}: {k:?}", k.name);
                    granted += usize::from(got);
                }
            }
        }
        // read-only: READ; write-only: WRITE; no-atomic: both; zero-based,
        // window1, window2: all three (each at offset 0 only).
        assert_eq!(granted, 1 + 1 + 2 + 3 * 3);
    }

    /// The keys mode aims at every exposed key, with ranges inside and
    /// straddling the start and the end, with every operation of RC.
    #[test]
    fn keys_mode_aims_at_every_key_and_range() {
        let mut t = SimTarget::new(1, None);
        let conn = t.setup(QpType::Rc, 4).expect("set up");
        let g = Generator::new(3, Mode::Keys);
        let (mut keys, mut ops) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        let (mut start, mut end, mut inside, mut invalidate) = (0, 0, 0, 0);
        for i in 0..2_000 {
            for p in g.case(i, &conn).packets() {
                ops.insert(p.opcode);
                let range = p.reth.map(|(o, k, l)| (o, k, i64::from(l)));
                let range = range.or(p.atomic.map(|(o, k, ..)| (o, k, 8)));
                if let Some((off, Key::Exposed(k), len)) = range {
                    keys.insert(k);
                    let klen = i64::from(conn.keys[usize::from(k)].len);
                    start += usize::from(off < 0 && off + len > 0);
                    end += usize::from(off < klen && off + len > klen);
                    inside += usize::from(off >= 0 && off + len <= klen && len > 0);
                }
                if let Some(Key::Exposed(k)) = p.ieth {
                    keys.insert(k);
                    invalidate += 1;
                }
            }
        }
        assert_eq!(keys.len(), conn.keys.len(), "{keys:?}");
        assert!(
            start > 50 && end > 50 && inside > 50,
            "{start} {end} {inside}"
        );
        assert!(invalidate > 50, "{invalidate}");
        for op in key_ops(QpType::Rc) {
            assert!(ops.contains(&op.0), "{op:?}");
        }
        assert!(ops.contains(&Opcode::RC_RDMA_WRITE_FIRST.0));
    }

    /// The fields mode aims some of its RETH and AtomicETH key mutations
    /// at the exposed keys.
    #[test]
    fn fields_mode_uses_the_exposed_keys() {
        let mut t = SimTarget::new(1, None);
        let conn = t.setup(QpType::Rc, 4).expect("set up");
        let g = Generator::new(3, Mode::Fields);
        let (mut reth, mut atomic) = (0, 0);
        for i in 0..3_000 {
            for p in g.case(i, &conn).packets() {
                reth += usize::from(matches!(p.reth, Some((_, Key::Exposed(_), _))));
                atomic += usize::from(matches!(p.atomic, Some((_, Key::Exposed(_), ..))));
            }
        }
        assert!(reth > 20 && atomic > 5, "{reth} {atomic}");
    }

    /// UD: the keys mode sends other Q_Keys (the controlled bit flipped
    /// among them) and other source QPs, to the fuzzed QP.
    #[test]
    fn ud_keys_mode_mismatches_qkey_and_source_qp() {
        let mut t = SimTarget::new(1, None);
        let conn = t.setup(QpType::Ud, 4).expect("set up");
        let g = Generator::new(3, Mode::Keys);
        let (mut qkey, mut high, mut src, mut right) = (0, 0, 0, 0);
        for i in 0..500 {
            for p in g.case(i, &conn).packets() {
                assert_eq!(p.dest, Dest::Target);
                let (q, s) = p.deth.expect("a DETH");
                let q = q.unwrap_or(conn.qkey);
                qkey += usize::from(q != conn.qkey);
                high += usize::from(q ^ conn.qkey == 0x8000_0000);
                src += usize::from(s != conn.fuzzer_qpn);
                right += usize::from(q == conn.qkey && s == conn.fuzzer_qpn);
            }
        }
        assert!(
            qkey > 200 && high > 20 && src > 200 && right > 50,
            "{qkey} {high} {src} {right}"
        );
    }

    /// A responder that checks a type 2 window against the wrong QP is
    /// found by the keys mode: the window bound to another QP lets the
    /// fuzzer write its memory.
    #[test]
    fn a_window_checked_for_the_wrong_qp_is_found() {
        let mut t = SimTarget::new(2, Some(PlantedBug::WindowAnyQp));
        let cfg = Config {
            seed: 5,
            mode: Mode::Keys,
            qp_type: QpType::Rc,
            cases: 400,
            time_limit: None,
            minimize: true,
            recvs: 4,
            skip_known_crashes: false,
        };
        let r = fuzz(&mut t, &cfg, |_| {}).expect("sim target");
        let (f, _) = r
            .findings
            .iter()
            .find(|(f, _)| f.violations.contains(&Violation::PrivateRegionChanged))
            .expect("found");
        let p = f.case.packets().next().expect("a packet");
        let other = EXPOSED_KEYS.iter().position(|&n| n == "window2-other-qp");
        assert_eq!(p.reth.map(|r| r.1), other.map(|i| Key::Exposed(i as u8)));
        // Without the bug, the same run finds nothing.
        let mut clean = SimTarget::new(2, None);
        let r = fuzz(&mut clean, &cfg, |_| {}).expect("sim target");
        assert!(r.findings.is_empty());
    }
}
