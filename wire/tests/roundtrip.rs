//! Property tests of the whole-packet codec: emit/parse round trips for
//! every opcode in the table, ICRC coverage of every unmasked bit, and
//! parsing arbitrary or mutated bytes without panicking. The checks live
//! in `uroce_wire::harness`, shared with the fuzz targets in `fuzz/`.

use core::net::{Ipv4Addr, Ipv6Addr};
use proptest::prelude::*;
use uroce_wire::aeth::AethSyndrome;
use uroce_wire::harness;
use uroce_wire::icrc::{IpContext, IpFields, IPV4_DF};
use uroce_wire::opcode::{Ext, Opcode, OpcodeInfo};
use uroce_wire::packet::{self, Headers};
use uroce_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, FethRepr, Psn, RethRepr, ICRC_LEN,
};

/// Arbitrary values for every field any opcode can carry; [`Fields::headers`]
/// picks those the opcode has.
#[derive(Debug, Clone)]
struct Fields {
    bth: BthRepr,
    deth: DethRepr,
    reth: RethRepr,
    atomic_eth: AtomicEthRepr,
    aeth: AethRepr,
    atomic_ack: AtomicAckEthRepr,
    imm: u32,
    ieth: u32,
    feth: FethRepr,
}

impl Fields {
    fn headers(&self, info: &OpcodeInfo) -> Headers {
        let mut h = Headers::new(BthRepr {
            opcode: Opcode(info.code),
            ..self.bth
        });
        for &ext in info.headers {
            match ext {
                Ext::Deth => h.deth = Some(self.deth),
                Ext::Feth => h.feth = Some(self.feth),
                Ext::Reth => h.reth = Some(self.reth),
                Ext::AtomicEth => h.atomic_eth = Some(self.atomic_eth),
                Ext::Aeth => h.aeth = Some(self.aeth),
                Ext::AtomicAckEth => h.atomic_ack = Some(self.atomic_ack),
                Ext::ImmDt => h.imm = Some(self.imm),
                Ext::Ieth => h.ieth = Some(self.ieth),
                Ext::CnpReserved => {}
            }
        }
        h
    }
}

const U24: u32 = 1 << 24;

fn arb_bth() -> impl Strategy<Value = BthRepr> {
    (any::<[bool; 5]>(), 0u8..4, any::<u16>(), 0..U24, 0..U24).prop_map(
        |([se, migreq, fecn, becn, ack_req], pad, pkey, dest_qp, psn)| BthRepr {
            opcode: Opcode::RC_SEND_ONLY, // replaced per opcode
            se,
            migreq,
            pad, // overwritten by emit
            tver: 0,
            pkey,
            fecn,
            becn,
            dest_qp,
            ack_req,
            psn: Psn::new(psn),
        },
    )
}

fn arb_fields() -> impl Strategy<Value = Fields> {
    (
        arb_bth(),
        (any::<u32>(), 0..U24),
        any::<(u64, u32, u32)>(),
        any::<(u64, u32, u64, u64)>(),
        (any::<u8>(), 0..U24),
        any::<(u64, u32, u32)>(),
        (0u8..16, 0u8..4),
    )
        .prop_map(
            |(
                bth,
                (qkey, src_qp),
                (va, rkey, dma_len),
                (ava, arkey, swap_add, compare),
                (syn, msn),
                (orig, imm, ieth),
                (placement, selectivity),
            )| Fields {
                bth,
                deth: DethRepr { qkey, src_qp },
                reth: RethRepr { va, rkey, dma_len },
                atomic_eth: AtomicEthRepr {
                    va: ava,
                    rkey: arkey,
                    swap_add,
                    compare,
                },
                // Every syndrome byte (bit 7 is reserved and not kept).
                aeth: AethRepr {
                    syndrome: AethSyndrome::from_byte(syn),
                    msn,
                },
                atomic_ack: AtomicAckEthRepr { orig },
                imm,
                ieth,
                feth: FethRepr {
                    placement,
                    selectivity,
                },
            },
        )
}

fn arb_ctx() -> impl Strategy<Value = IpContext> {
    let v4 = (
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        prop_oneof![Just(IPV4_DF), Just(0u16), any::<u16>()],
    )
        .prop_map(|(s, d, ident, flags_frag)| IpFields::V4 {
            src: Ipv4Addr::from(s),
            dst: Ipv4Addr::from(d),
            ident,
            flags_frag,
        });
    let v6 = (any::<u128>(), any::<u128>()).prop_map(|(s, d)| IpFields::V6 {
        src: Ipv6Addr::from(s),
        dst: Ipv6Addr::from(d),
    });
    (prop_oneof![v4, v6], any::<u16>(), any::<u16>()).prop_map(|(ip, src_port, dst_port)| {
        IpContext {
            ip,
            src_port,
            dst_port,
        }
    })
}

/// Payload lengths 0..=4096, with the short and pad-boundary cases drawn
/// more often than a uniform choice would.
fn arb_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => proptest::collection::vec(any::<u8>(), 0..=8),
        1 => proptest::collection::vec(any::<u8>(), 4088..=4096),
        2 => proptest::collection::vec(any::<u8>(), 0..=4096),
    ]
}

fn opcodes() -> Vec<&'static OpcodeInfo> {
    Opcode::all().collect()
}

/// A valid packet of a random opcode with a short payload, for mutation.
fn arb_packet() -> impl Strategy<Value = Vec<u8>> {
    (
        0..opcodes().len(),
        arb_fields(),
        proptest::collection::vec(any::<u8>(), 0..=64),
        prop_oneof![Just(harness::FUZZ_CTX_V4), Just(harness::FUZZ_CTX_V6)],
    )
        .prop_map(|(i, f, payload, ctx)| {
            let info = opcodes()[i];
            let payload = if info.has_payload { &payload[..] } else { &[] };
            harness::emit_vec(&f.headers(info), payload, &ctx, 0).unwrap()
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    FlipBit(usize),
    SetOpcode(u8),
    SetValidOpcode(usize),
    SetPad(u8),
    SetTver(u8),
    Append(Vec<u8>),
    Remove(usize, usize),
}

fn arb_mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        any::<usize>().prop_map(Mutation::FlipBit),
        any::<u8>().prop_map(Mutation::SetOpcode),
        any::<usize>().prop_map(Mutation::SetValidOpcode),
        (0u8..4).prop_map(Mutation::SetPad),
        (0u8..16).prop_map(Mutation::SetTver),
        proptest::collection::vec(any::<u8>(), 1..=8).prop_map(Mutation::Append),
        (any::<usize>(), 1usize..=8).prop_map(|(at, n)| Mutation::Remove(at, n)),
    ]
}

fn mutate(pkt: &mut Vec<u8>, m: &Mutation) {
    let len = pkt.len();
    match *m {
        Mutation::Truncate(n) => pkt.truncate(n % (len + 1)),
        Mutation::FlipBit(b) => pkt[(b / 8) % len] ^= 1 << (b % 8),
        Mutation::SetOpcode(op) => pkt[0] = op,
        Mutation::SetValidOpcode(i) => pkt[0] = opcodes()[i % opcodes().len()].code,
        Mutation::SetPad(pad) if len > 1 => pkt[1] = (pkt[1] & !0x30) | (pad << 4),
        Mutation::SetTver(v) if len > 1 => pkt[1] = (pkt[1] & !0x0f) | v,
        Mutation::SetPad(_) | Mutation::SetTver(_) => {}
        Mutation::Append(ref extra) => {
            let at = len.saturating_sub(ICRC_LEN);
            pkt.splice(at..at, extra.iter().copied());
        }
        Mutation::Remove(at, n) => {
            let at = at % len;
            pkt.drain(at..(at + n).min(len));
        }
    }
}

/// Bytes that get past the BTH checks more often than uniform ones: an
/// opcode from the table (or any byte), TVer 0, and a length near what the
/// opcode needs.
fn arb_plausible_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            3 => (0..opcodes().len()).prop_map(|i| opcodes()[i].code),
            1 => any::<u8>(),
        ],
        any::<u8>(),
        -8isize..=24,
        proptest::collection::vec(any::<u8>(), 200),
    )
        .prop_map(|(op, flags, extra, mut bytes)| {
            let ext = Opcode(op).info().map_or(0, |i| i.ext_len());
            let len = (12 + ext + 4).saturating_add_signed(extra).min(bytes.len());
            bytes.truncate(len);
            if let Some(b) = bytes.first_mut() {
                *b = op;
            }
            if let Some(b) = bytes.get_mut(1) {
                *b = flags & 0xf0;
            }
            bytes
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// emit then parse gives the same headers and payload for every
    /// opcode, the ICRC verifies, and a sample of single-bit flips (all of
    /// the headers and ICRC, some of the payload) is caught.
    #[test]
    fn every_opcode_round_trips(
        f in arb_fields(),
        payload in arb_payload(),
        ctx in arb_ctx(),
        flips in proptest::collection::vec(any::<usize>(), 4),
        ctx_bit in any::<usize>(),
    ) {
        for info in Opcode::all() {
            let h = f.headers(info);
            let payload = if info.has_payload { &payload[..] } else { &[] };
            let mut pkt = harness::emit_parse_roundtrip(&h, payload, &ctx);
            let hdr_bits = (12 + info.ext_len()) * 8;
            let icrc_bits = (pkt.len() - ICRC_LEN) * 8..pkt.len() * 8;
            harness::check_bit_flips(&mut pkt, &ctx, (0..hdr_bits).step_by(3).chain(icrc_bits.step_by(5)).chain(flips.iter().copied()));
            harness::check_context_flip(&pkt, &ctx, ctx_bit);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Short packets of every opcode: every single-bit flip outside BTH
    /// byte 4 makes the ICRC fail; flips inside it do not.
    #[test]
    fn every_bit_is_covered(
        f in arb_fields(),
        payload in proptest::collection::vec(any::<u8>(), 0..=9),
        ctx in arb_ctx(),
    ) {
        for info in Opcode::all() {
            let h = f.headers(info);
            let payload = if info.has_payload { &payload[..] } else { &[] };
            let mut pkt = harness::emit_parse_roundtrip(&h, payload, &ctx);
            let bits = pkt.len() * 8;
            harness::check_bit_flips(&mut pkt, &ctx, 0..bits);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..=200)) {
        harness::parse_never_panics(&data);
        harness::parse_emit_parse(&data);
    }

    #[test]
    fn plausible_bytes(data in arb_plausible_bytes()) {
        harness::parse_never_panics(&data);
        harness::parse_emit_parse(&data);
    }

    #[test]
    fn mutated_packets(
        mut pkt in arb_packet(),
        muts in proptest::collection::vec(arb_mutation(), 1..=3),
    ) {
        for m in &muts {
            if pkt.is_empty() {
                break;
            }
            mutate(&mut pkt, m);
        }
        harness::parse_never_panics(&pkt);
        harness::parse_emit_parse(&pkt);
    }
}

/// The harness accepts what it should: valid packets of every opcode pass
/// `parse_emit_parse` with an actual round trip (not by failing to parse).
#[test]
fn harness_sees_valid_packets() {
    for info in Opcode::all() {
        let f = Fields {
            bth: BthRepr {
                opcode: Opcode(info.code),
                pkey: 0xffff,
                dest_qp: 0x12_3456,
                psn: Psn::new(0xff_fff0),
                ..BthRepr::default()
            },
            deth: DethRepr {
                qkey: 0x1111_1111,
                src_qp: 2,
            },
            reth: RethRepr::default(),
            atomic_eth: AtomicEthRepr::default(),
            aeth: AethRepr::default(),
            atomic_ack: AtomicAckEthRepr::default(),
            imm: 7,
            ieth: 9,
            feth: FethRepr {
                placement: 1,
                selectivity: 1,
            },
        };
        let payload: &[u8] = if info.has_payload { &[1, 2, 3] } else { &[] };
        let pkt = harness::emit_vec(&f.headers(info), payload, &harness::FUZZ_CTX_V4, 0).unwrap();
        let p = packet::parse(&pkt).unwrap();
        p.verify_icrc(&harness::FUZZ_CTX_V4).unwrap();
        harness::parse_never_panics(&pkt);
        harness::parse_emit_parse(&pkt);
        // Reserved bits set by a peer are ignored, not an error.
        let mut noisy = pkt.clone();
        noisy[4] |= 0x3f;
        noisy[8] |= 0x7f;
        // And the FETH's reserved bits (31-6).
        if let Some(at) = info.ext_offset(Ext::Feth) {
            noisy[at..at + 3].fill(0xff);
            noisy[at + 3] |= 0xc0;
        }
        harness::parse_emit_parse(&noisy);
    }
}
