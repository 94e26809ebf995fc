//! A fuzz case as bytes: the input format of the coverage-guided
//! `sim_case` cargo-fuzz target (`fuzz/fuzz_targets/sim_case.rs`).
//!
//! libFuzzer mutates bytes; [`FuzzInput::decode`] reads them as a case
//! (the transport, the receive WRs, the sim target's seed and the steps)
//! and [`FuzzInput::encode`] writes a case back, so that the generator's
//! cases ([`crate::gen`]) become the campaign's seeds: decoding what
//! `encode` wrote gives the same case. Every field has a fixed width
//! (integers little-endian, as `arbitrary` reads them; bytes past the end
//! read as zero), so a mutated byte changes one field of one step and
//! the layout of the rest stays put:
//!
//! ```text
//! input  = seed:u32 qp:u8 recvs:u8 step*          (at most MAX_STEPS steps)
//! step   = tag:u8 (tag % 3: 0 packet, 1 wait, 2 post) then its body
//! packet = opcode:u8 flags:u16 raw_opcode:u8 psn_off:i32 dest:key
//!          pad:u8 tver:u8 pkey:u16
//!          reth(off:i64 key len:u32) atomic(off:i64 key swap_add:u64 compare:u64)
//!          aeth(syndrome:u8 msn:u32) atomic_ack:u64 imm:u32 ieth:key
//!          deth(qkey:u32 src_qp:u32) payload(len:u16 fill:u8) icrc_xor:u32 truncate:u16
//!          [feth:u8]  (only after an opcode with a FETH, RDMA FLUSH: bit 7
//!                      present, bits 3-0 placement type, bits 5-4 selectivity)
//! key    = which:u8 (% 3: valid/target, private/control, raw) value:u32
//! wait   = us:u16
//! post   = op:u8 (% 5) len:u32 local_off:u32 remote_va:u64 rkey:u32
//!          swap_add:u64 compare:u64
//! ```
//!
//! A post's work request ID is not in the input: the `n`th post of a
//! case is `0x100 + n`, as the generator numbers them, so that no two
//! share one (the oracles tell completions apart by their IDs).
//!
//! `flags` says which optional fields are present (see [`flag`]); an
//! absent field's bytes are still there and ignored. With the `arbitrary`
//! feature [`FuzzInput`] implements `arbitrary::Arbitrary` by decoding
//! the rest of the input, which is what `fuzz_target!(|input: FuzzInput|
//! ...)` uses.

use super::case::{Case, Dest, Icrc, Key, PacketSpec, Post, PostOp, Step};
use super::sim::{PlantedBug, SimTarget};
use super::target::TargetError;
use super::{run_case, Outcome};
use uroce_provider::types::QpType;

/// Steps read at most: a case's cost is bounded whatever the input's
/// length.
pub const MAX_STEPS: usize = 64;

/// Receive WRs posted on the fuzzed QP at most.
pub const MAX_RECVS: u32 = 16;

/// A case and what it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuzzInput {
    /// Seed of the sim target (its PSNs and network).
    pub seed: u32,
    /// Transport of the fuzzed QP.
    pub qp_type: QpType,
    /// Receive WRs posted at set-up.
    pub recvs: u32,
    /// The steps.
    pub case: Case,
}

/// Bits of a packet's `flags` field.
pub mod flag {
    /// `raw_opcode` is present.
    pub const RAW_OPCODE: u16 = 1 << 0;
    /// BTH SE.
    pub const SE: u16 = 1 << 1;
    /// BTH AckReq.
    pub const ACK_REQ: u16 = 1 << 2;
    /// BTH MigReq.
    pub const MIGREQ: u16 = 1 << 3;
    /// `pad` is present.
    pub const PAD: u16 = 1 << 4;
    /// A response to the target's requester.
    pub const RESP: u16 = 1 << 5;
    /// The ICRC is XORed with `icrc_xor`.
    pub const ICRC_WRONG: u16 = 1 << 6;
    /// `truncate` is present.
    pub const TRUNCATE: u16 = 1 << 7;
    /// The RETH fields are present.
    pub const RETH: u16 = 1 << 8;
    /// The AtomicETH fields are present.
    pub const ATOMIC: u16 = 1 << 9;
    /// The AETH fields are present.
    pub const AETH: u16 = 1 << 10;
    /// `atomic_ack` is present.
    pub const ATOMIC_ACK: u16 = 1 << 11;
    /// `imm` is present.
    pub const IMM: u16 = 1 << 12;
    /// `ieth` is present.
    pub const IETH: u16 = 1 << 13;
    /// The DETH's source QP is present.
    pub const DETH: u16 = 1 << 14;
    /// The DETH's Q_Key is present (else the connection's).
    pub const DETH_QKEY: u16 = 1 << 15;
}

/// Reads fixed-width fields; past the end every byte is zero.
struct Reader<'a> {
    data: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = N.min(self.data.len());
        b[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn key(&mut self) -> (u8, u32) {
        (self.u8() % 4, self.u32())
    }
}

fn key_of((which, v): (u8, u32)) -> Key {
    match which {
        0 => Key::Valid,
        1 => Key::Private,
        2 => Key::Raw(v),
        _ => Key::Exposed(v as u8),
    }
}

fn key_bytes(k: Key) -> (u8, u32) {
    match k {
        Key::Valid => (0, 0),
        Key::Private => (1, 0),
        Key::Raw(v) => (2, v),
        Key::Exposed(i) => (3, u32::from(i)),
    }
}

const POST_OPS: [PostOp; 5] = [
    PostOp::Send,
    PostOp::Write,
    PostOp::Read,
    PostOp::CompareSwap,
    PostOp::FetchAdd,
];

const QP_TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

fn read_packet(r: &mut Reader<'_>) -> PacketSpec {
    let opcode = r.u8();
    let f = r.u16();
    let has = |bit: u16| f & bit != 0;
    let raw_opcode = r.u8();
    let psn_off = r.u32() as i32;
    let dest = match r.key() {
        (0, _) => Dest::Target,
        (1, _) => Dest::Control,
        (_, q) => Dest::Raw(q),
    };
    let (pad, tver, pkey) = (r.u8(), r.u8(), r.u16());
    let reth = (r.u64() as i64, key_of(r.key()), r.u32());
    let atomic = (r.u64() as i64, key_of(r.key()), r.u64(), r.u64());
    let aeth = (r.u8(), r.u32());
    let atomic_ack = r.u64();
    let imm = r.u32();
    let ieth = key_of(r.key());
    let (qkey, src_qp) = (r.u32(), r.u32());
    let payload = (r.u16(), r.u8());
    let icrc_xor = r.u32();
    let truncate = r.u16();
    let probe = PacketSpec::new(uroce_wire::Opcode(opcode), 0);
    let feth = if probe.has_feth() {
        let b = r.u8();
        (b & 0x80 != 0).then_some((b & 0xf, (b >> 4) & 0x3))
    } else {
        None
    };
    PacketSpec {
        opcode,
        raw_opcode: has(flag::RAW_OPCODE).then_some(raw_opcode),
        psn_off,
        dest,
        se: has(flag::SE),
        ack_req: has(flag::ACK_REQ),
        migreq: has(flag::MIGREQ),
        pad: has(flag::PAD).then_some(pad),
        tver,
        pkey,
        reth: has(flag::RETH).then_some(reth),
        atomic: has(flag::ATOMIC).then_some(atomic),
        aeth: has(flag::AETH).then_some(aeth),
        atomic_ack: has(flag::ATOMIC_ACK).then_some(atomic_ack),
        imm: has(flag::IMM).then_some(imm),
        ieth: has(flag::IETH).then_some(ieth),
        deth: has(flag::DETH).then_some((has(flag::DETH_QKEY).then_some(qkey), src_qp)),
        payload,
        icrc: if has(flag::ICRC_WRONG) {
            Icrc::Wrong(icrc_xor)
        } else {
            Icrc::Right
        },
        truncate: has(flag::TRUNCATE).then_some(truncate),
        resp: has(flag::RESP),
        data: None,
        feth,
    }
}

/// The work request ID of a case's `n`th post.
pub fn wr_id(n: usize) -> u64 {
    0x100 + n as u64
}

fn read_post(r: &mut Reader<'_>, n: usize) -> Post {
    Post {
        wr_id: wr_id(n),
        op: POST_OPS[usize::from(r.u8()) % POST_OPS.len()],
        len: r.u32(),
        local_off: r.u32(),
        remote_va: r.u64(),
        rkey: r.u32(),
        swap_add: r.u64(),
        compare: r.u64(),
    }
}

/// Writes fixed-width fields.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn key(&mut self, (which, v): (u8, u32)) {
        self.u8(which);
        self.u32(v);
    }
}

fn write_packet(w: &mut Writer, p: &PacketSpec) {
    let mut f = 0u16;
    let mut set = |bit: u16, on: bool| {
        if on {
            f |= bit;
        }
    };
    set(flag::RAW_OPCODE, p.raw_opcode.is_some());
    set(flag::SE, p.se);
    set(flag::ACK_REQ, p.ack_req);
    set(flag::MIGREQ, p.migreq);
    set(flag::PAD, p.pad.is_some());
    set(flag::RESP, p.resp);
    set(flag::ICRC_WRONG, matches!(p.icrc, Icrc::Wrong(_)));
    set(flag::TRUNCATE, p.truncate.is_some());
    set(flag::RETH, p.reth.is_some());
    set(flag::ATOMIC, p.atomic.is_some());
    set(flag::AETH, p.aeth.is_some());
    set(flag::ATOMIC_ACK, p.atomic_ack.is_some());
    set(flag::IMM, p.imm.is_some());
    set(flag::IETH, p.ieth.is_some());
    set(flag::DETH, p.deth.is_some());
    set(flag::DETH_QKEY, p.deth.is_some_and(|d| d.0.is_some()));
    w.u8(p.opcode);
    w.u16(f);
    w.u8(p.raw_opcode.unwrap_or(0));
    w.u32(p.psn_off as u32);
    w.key(match p.dest {
        Dest::Target => (0, 0),
        Dest::Control => (1, 0),
        Dest::Raw(q) => (2, q),
    });
    w.u8(p.pad.unwrap_or(0));
    w.u8(p.tver);
    w.u16(p.pkey);
    let (off, k, len) = p.reth.unwrap_or((0, Key::Valid, 0));
    w.u64(off as u64);
    w.key(key_bytes(k));
    w.u32(len);
    let (off, k, swap_add, compare) = p.atomic.unwrap_or((0, Key::Valid, 0, 0));
    w.u64(off as u64);
    w.key(key_bytes(k));
    w.u64(swap_add);
    w.u64(compare);
    let (syn, msn) = p.aeth.unwrap_or((0, 0));
    w.u8(syn);
    w.u32(msn);
    w.u64(p.atomic_ack.unwrap_or(0));
    w.u32(p.imm.unwrap_or(0));
    w.key(key_bytes(p.ieth.unwrap_or(Key::Valid)));
    let (qkey, src_qp) = p.deth.unwrap_or((None, 0));
    w.u32(qkey.unwrap_or(0));
    w.u32(src_qp);
    w.u16(p.payload.0);
    w.u8(p.payload.1);
    w.u32(match p.icrc {
        Icrc::Right => 0,
        Icrc::Wrong(x) => x,
    });
    w.u16(p.truncate.unwrap_or(0));
    if p.has_feth() {
        w.u8(p
            .feth
            .map_or(0, |(pl, sel)| 0x80 | (pl & 0xf) | (sel & 0x3) << 4));
    }
}

fn write_post(w: &mut Writer, p: &Post) {
    w.u8(POST_OPS.iter().position(|&o| o == p.op).unwrap_or(0) as u8);
    w.u32(p.len);
    w.u32(p.local_off);
    w.u64(p.remote_va);
    w.u32(p.rkey);
    w.u64(p.swap_add);
    w.u64(p.compare);
}

impl FuzzInput {
    /// Reads an input; every byte string is one (missing bytes read as
    /// zero, steps past [`MAX_STEPS`] are ignored).
    pub fn decode(data: &[u8]) -> FuzzInput {
        let mut r = Reader { data };
        let seed = r.u32();
        let qp_type = QP_TYPES[usize::from(r.u8()) % QP_TYPES.len()];
        let recvs = u32::from(r.u8()) % (MAX_RECVS + 1);
        let mut steps = Vec::new();
        let mut posts = 0;
        while !r.data.is_empty() && steps.len() < MAX_STEPS {
            steps.push(match r.u8() % 3 {
                0 => Step::Packet(read_packet(&mut r)),
                1 => Step::Wait(u32::from(r.u16())),
                _ => {
                    posts += 1;
                    Step::Post(read_post(&mut r, posts - 1))
                }
            });
        }
        FuzzInput {
            seed,
            qp_type,
            recvs,
            case: Case { steps },
        }
    }

    /// The bytes [`FuzzInput::decode`] reads back as this input, for an
    /// input it can hold: at most [`MAX_STEPS`] steps, waits below
    /// 65,536 µs (longer ones are cut), at most [`MAX_RECVS`] receive
    /// WRs, posts numbered as [`wr_id`] numbers them and no payload bytes
    /// of a capture (`PacketSpec::data`, which is dropped). Every
    /// generator case is one.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.seed);
        w.u8(QP_TYPES
            .iter()
            .position(|&t| t == self.qp_type)
            .unwrap_or(0) as u8);
        w.u8(self.recvs.min(MAX_RECVS) as u8);
        for s in self.case.steps.iter().take(MAX_STEPS) {
            match s {
                Step::Packet(p) => {
                    w.u8(0);
                    write_packet(&mut w, p);
                }
                Step::Wait(us) => {
                    w.u8(1);
                    w.u16((*us).min(u32::from(u16::MAX)) as u16);
                }
                Step::Post(p) => {
                    w.u8(2);
                    write_post(&mut w, p);
                }
            }
        }
        w.0
    }

    /// Runs the case on a fresh sim target (uroce's own QP machines) and
    /// judges it with [`crate::oracle::check`].
    pub fn run(&self) -> Result<Outcome, TargetError> {
        self.run_planted(None)
    }

    /// [`FuzzInput::run`] on a sim target with `bug` planted (how the
    /// target's check is tested).
    pub fn run_planted(&self, bug: Option<PlantedBug>) -> Result<Outcome, TargetError> {
        let mut target = SimTarget::new(u64::from(self.seed), bug);
        run_case(&mut target, self.qp_type, self.recvs, &self.case)
    }
}

#[cfg(feature = "arbitrary")]
impl<'a> arbitrary::Arbitrary<'a> for FuzzInput {
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let rest = u.len();
        Ok(FuzzInput::decode(u.bytes(rest)?))
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (0, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{Generator, Mode};
    use crate::target::Target;

    /// Every generator case reads back as itself: the generator's modes
    /// are the campaign's seeds.
    #[test]
    fn generator_cases_round_trip() {
        let mut t = SimTarget::new(7, None);
        for (qp, modes) in [
            (
                QpType::Rc,
                &[
                    Mode::Fields,
                    Mode::Sequence,
                    Mode::Responder,
                    Mode::Keys,
                    Mode::Duplicates,
                ][..],
            ),
            (QpType::Uc, &[Mode::Fields, Mode::Sequence, Mode::Keys][..]),
            (QpType::Ud, &[Mode::Fields, Mode::Sequence, Mode::Keys][..]),
        ] {
            let conn = t.setup(qp, 8).expect("sim");
            for &mode in modes {
                let gen = Generator::new(3, mode);
                for i in 0..300 {
                    let input = FuzzInput {
                        seed: 7,
                        qp_type: qp,
                        recvs: 8,
                        case: gen.case(i, &conn),
                    };
                    assert_eq!(FuzzInput::decode(&input.encode()), input, "{mode:?} {i}");
                }
            }
        }
    }

    /// A FLUSH's FETH is a byte after its packet, and only its: the
    /// packets after it keep their places.
    #[test]
    fn a_flush_carries_its_feth() {
        let mut flush = PacketSpec::new(uroce_wire::Opcode::RC_FLUSH, 0);
        flush.reth = Some((0, Key::Valid, 64));
        let send = PacketSpec::new(uroce_wire::Opcode::RC_SEND_ONLY, 1);
        let input = |feth| {
            let mut f = flush.clone();
            f.feth = feth;
            FuzzInput {
                seed: 1,
                qp_type: QpType::Rc,
                recvs: 1,
                case: Case {
                    steps: vec![Step::Packet(f), Step::Packet(send.clone())],
                },
            }
        };
        for feth in [None, Some((0, 0)), Some((1, 0)), Some((2, 1)), Some((3, 1))] {
            let i = input(feth);
            assert_eq!(FuzzInput::decode(&i.encode()), i, "{feth:?}");
        }
        // One byte more than without a FLUSH.
        let mut two_sends = input(None);
        two_sends.case.steps[0] = Step::Packet(send.clone());
        assert_eq!(input(None).encode().len(), two_sends.encode().len() + 1);
    }

    /// Any bytes are an input, of bounded size, whose posts have IDs of
    /// their own.
    #[test]
    fn any_bytes_decode() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for len in [0usize, 1, 5, 6, 7, 50, 200, 5000, 100_000] {
            let data: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let input = FuzzInput::decode(&data);
            assert!(input.case.steps.len() <= MAX_STEPS);
            assert!(input.recvs <= MAX_RECVS);
            let ids: Vec<u64> = input.case.posts().map(|p| p.wr_id).collect();
            let distinct: std::collections::HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), ids.len(), "posts share a work request ID");
        }
    }

    /// A version of 64 is 0 in the BTH's four bits: the packet is not
    /// dropped for it (found by `sim_case`: a UD SEND with `tver` 64
    /// completed a receive the oracle had ruled out).
    #[test]
    fn only_the_sent_version_bits_count() {
        let mut t = SimTarget::new(5, None);
        let conn = t.setup(QpType::Ud, 8).expect("sim");
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let mut p = crate::gen::valid(uroce_wire::Opcode::UD_SEND_ONLY, 0, &conn, &mut rng);
        p.tver = 64;
        assert!(!p.silently_dropped(&conn));
        p.tver = 65;
        assert!(p.silently_dropped(&conn));
        p.tver = 64;
        let input = FuzzInput {
            seed: 5,
            qp_type: QpType::Ud,
            recvs: 8,
            case: Case {
                steps: vec![Step::Packet(p), Step::Wait(2_000)],
            },
        };
        assert_eq!(input.run().expect("sim").violations, []);
    }

    /// A raw destination QP that is the fuzzed QP's number reaches it
    /// (found by the generator's baseline run: a SEND to `Raw(0x111)`
    /// completed a receive the oracle had ruled out).
    #[test]
    fn a_raw_destination_may_be_the_target() {
        let mut t = SimTarget::new(5, None);
        let conn = t.setup(QpType::Uc, 8).expect("sim");
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let mut p = crate::gen::valid(uroce_wire::Opcode::UC_SEND_ONLY, 0, &conn, &mut rng);
        p.dest = Dest::Raw(conn.qpn);
        assert!(!p.silently_dropped(&conn));
        let input = FuzzInput {
            seed: 5,
            qp_type: QpType::Uc,
            recvs: 8,
            case: Case {
                steps: vec![Step::Packet(p), Step::Wait(2_000)],
            },
        };
        let out = input.run().expect("sim");
        assert_eq!(out.obs.completions.len(), 1);
        assert_eq!(out.violations, []);
    }

    /// A WRITE inside a SEND message, as bytes: clean on uroce's QP,
    /// a violation where `sim:write-inside-send` is planted (what makes
    /// the cargo-fuzz target fail).
    #[test]
    fn decoded_cases_are_judged() {
        let mut t = SimTarget::new(9, None);
        let conn = t.setup(QpType::Rc, 8).expect("sim");
        let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(1);
        let first = crate::gen::valid(uroce_wire::Opcode::RC_SEND_FIRST, 0, &conn, &mut rng);
        let write = crate::gen::valid(uroce_wire::Opcode::RC_RDMA_WRITE_ONLY, 1, &conn, &mut rng);
        let input = FuzzInput {
            seed: 9,
            qp_type: QpType::Rc,
            recvs: 8,
            case: Case {
                steps: vec![Step::Packet(first), Step::Packet(write), Step::Wait(2_000)],
            },
        };
        let bytes = input.encode();
        let clean = FuzzInput::decode(&bytes).run().expect("sim");
        assert_eq!(clean.violations, []);
        let planted = FuzzInput::decode(&bytes)
            .run_planted(Some(PlantedBug::WriteInsideSend))
            .expect("sim");
        assert!(!planted.violations.is_empty());
    }
}
