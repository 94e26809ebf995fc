//! Property checks shared by the property tests (`wire/tests/roundtrip.rs`)
//! and the fuzz targets (`fuzz/`): one harness, run under `cargo test` on
//! generated inputs and under libFuzzer on mutated ones.
//!
//! Every function panics (asserts) when the property it names is broken
//! and returns normally otherwise. Not part of the codec's API: the checks
//! allocate and panic, which the codec itself never does. Compiled only
//! with the feature `harness` (the wire tests and the cargo-fuzz targets
//! enable it).
//!
//! Under `cfg(fuzzing)` ICRC verification always succeeds, so the checks
//! that expect a *failure* to verify are skipped there.

use crate::bth::BTH_LEN;
use crate::error::Error;
use crate::icrc::{self, IpContext, IpFields, Ipv4IdSolution, IPV4_DF};
use crate::opcode::Ext;
use crate::packet::{self, pad_for, Headers, ParsedPacket};
use crate::ICRC_LEN;
use core::net::{Ipv4Addr, Ipv6Addr};

/// The fixed IPv4 context the fuzz targets verify and emit with.
pub const FUZZ_CTX_V4: IpContext = IpContext::for_socket_v4(
    Ipv4Addr::new(10, 0, 0, 1),
    Ipv4Addr::new(10, 0, 0, 2),
    0xc000,
    crate::ROCEV2_UDP_PORT,
);

/// The fixed IPv6 context the fuzz targets verify and emit with.
pub const FUZZ_CTX_V6: IpContext = IpContext::v6(
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
    0xc001,
    crate::ROCEV2_UDP_PORT,
);

/// Largest UDP payload whose ICRC can be computed for both IP versions
/// (the IPv4 total length must fit 16 bits).
pub const MAX_UDP_PAYLOAD: usize = 65535 - 20 - 8;

/// Emits a whole packet into a fresh buffer of exactly
/// [`packet::packet_len`] bytes, pre-filled with `fill` (to show that
/// nothing of the buffer's old contents survives).
pub fn emit_vec(h: &Headers, payload: &[u8], ctx: &IpContext, fill: u8) -> crate::Result<Vec<u8>> {
    let n = packet::packet_len(h, payload.len())?;
    let mut buf = vec![fill; n];
    let written = packet::emit(h, payload, &mut buf, ctx)?;
    assert_eq!(written, n, "emit wrote a length other than packet_len");
    Ok(buf)
}

/// Runs [`packet::parse`] and everything that can be asked of its result
/// on arbitrary bytes, plus the ICRC functions on the same bytes. Nothing
/// may panic; what parses must be self-consistent.
pub fn parse_never_panics(data: &[u8]) {
    let _ = icrc::stored(data);
    for ctx in [&FUZZ_CTX_V4, &FUZZ_CTX_V6] {
        let _ = icrc::compute(ctx, data);
        let _ = icrc::verify(ctx, data);
        let _ = icrc::verify_unknown_ipv4_id(ctx, data);
        let _ = packet::parse_verified(data, ctx);
    }
    // The first byte chooses how the rest splits into IP header, UDP
    // header and UDP payload.
    if let Some((&k, rest)) = data.split_first() {
        let ip_len = (k as usize % 64).min(rest.len());
        let (ip, rest) = rest.split_at(ip_len);
        let udp_len = 8.min(rest.len());
        let (udp, payload) = rest.split_at(udp_len);
        let _ = icrc::compute_with_ip_header(ip, udp, payload);
    }
    let Ok(p) = packet::parse(data) else {
        return;
    };
    check_parsed(&p, data);
    let _ = p.verify_icrc(&FUZZ_CTX_V4);
    let _ = p.verify_icrc_socket(&FUZZ_CTX_V4);
    let _ = p.verify_icrc_socket(&FUZZ_CTX_V6);
}

/// What [`packet::parse`] promises about a packet it accepted.
fn check_parsed(p: &ParsedPacket<'_>, data: &[u8]) {
    assert!(core::ptr::eq(p.bytes, data), "bytes is not the input");
    assert_eq!(p.info.code, p.bth.opcode.0);
    assert_eq!(
        p.headers().check(),
        Ok(p.info),
        "headers disagree with opcode"
    );
    assert_eq!(p.bth.tver, 0);
    assert_eq!(
        p.header_len() + p.payload.len() + p.bth.pad as usize + ICRC_LEN,
        data.len(),
        "lengths do not add up"
    );
    assert_eq!(p.bth.pad, pad_for(p.payload.len()));
    assert!(p.info.has_payload || p.payload.is_empty());
    assert_eq!(
        p.payload.as_ptr(),
        data[p.header_len()..].as_ptr(),
        "payload does not follow the headers"
    );
    assert_eq!(Some(p.icrc), icrc::stored(data));
}

/// Bits of an accepted packet that [`packet::parse`] does not report and
/// [`packet::emit`] writes itself: reserved bits (BTH Resv6a and Resv7,
/// the DETH reserved byte, AETH bit 7, FETH bits 31-6, the CNP's reserved
/// bytes), the pad
/// bytes and the ICRC. One mask byte per packet byte, set bits ignored.
pub fn ignored_bits(p: &ParsedPacket<'_>) -> Vec<u8> {
    let mut mask = vec![0u8; p.bytes.len()];
    mask[4] = 0x3f; // Resv6a
    mask[8] = 0x7f; // Resv7
    let mut off = BTH_LEN;
    for &ext in p.info.headers {
        match ext {
            Ext::Deth => mask[off + 4] = 0xff,
            Ext::Aeth => mask[off] = 0x80,
            Ext::Feth => {
                mask[off..off + 3].fill(0xff);
                mask[off + 3] = 0xc0;
            }
            Ext::CnpReserved => mask[off..off + ext.len()].fill(0xff),
            _ => {}
        }
        off += ext.len();
    }
    mask[off + p.payload.len()..].fill(0xff); // pad and ICRC
    mask
}

/// Whenever [`packet::parse`] accepts `data`: emitting its headers and
/// payload gives a packet of the same length that parses to the same
/// headers and payload and verifies; it equals `data` except in
/// [`ignored_bits`]; and emitting is canonical (emit ∘ parse ∘ emit =
/// emit), for both fuzz contexts.
pub fn parse_emit_parse(data: &[u8]) {
    let Ok(p) = packet::parse(data) else {
        return;
    };
    check_parsed(&p, data);
    let mask = ignored_bits(&p);
    for ctx in [&FUZZ_CTX_V4, &FUZZ_CTX_V6] {
        let out = match emit_vec(&p.headers(), p.payload, ctx, 0xa5) {
            Ok(out) => out,
            Err(Error::OutOfRange(_)) if data.len() > MAX_UDP_PAYLOAD => return,
            Err(e) => panic!("re-emitting parsed headers failed: {e}"),
        };
        assert_eq!(out.len(), data.len(), "re-emitted length differs");
        for (i, ((a, b), m)) in data.iter().zip(&out).zip(&mask).enumerate() {
            assert_eq!(
                (a ^ b) & !m,
                0,
                "re-emitted byte {i} differs outside ignored bits: {a:#04x} vs {b:#04x}"
            );
        }
        let q = packet::parse(&out).expect("re-emitted packet does not parse");
        assert_eq!(q.headers(), p.headers(), "headers changed in a round trip");
        assert_eq!(q.payload, p.payload, "payload changed in a round trip");
        q.verify_icrc(ctx)
            .expect("re-emitted packet fails its ICRC check");
        let again = emit_vec(&q.headers(), q.payload, ctx, 0x5a).expect("second emit failed");
        assert_eq!(again, out, "emit is not canonical");
    }
}

/// The round trip from values: emits `h` (whose `bth.pad` is ignored) with
/// `payload` for `ctx`; checks that the packet parses back to the same
/// headers (with the pad the payload needs) and payload, that its ICRC
/// verifies (also through the unknown-IPv4-ID solver, which must find
/// the context's ID when the flags are DF or 0), that the two-step builder
/// ([`packet::emit_headers`] + [`packet::finish`]) writes the same bytes,
/// and that too small a buffer is an error. Returns the packet.
pub fn emit_parse_roundtrip(h: &Headers, payload: &[u8], ctx: &IpContext) -> Vec<u8> {
    let pkt = emit_vec(h, payload, ctx, 0).expect("emit failed");
    let other_fill = emit_vec(h, payload, ctx, 0xff).expect("emit failed");
    assert_eq!(pkt, other_fill, "emit depends on the buffer's old contents");

    // Two-step build into a larger buffer.
    let mut big = vec![0x3cu8; pkt.len() + 7];
    let hl = packet::emit_headers(h, payload.len(), &mut big).expect("emit_headers failed");
    big[hl..hl + payload.len()].copy_from_slice(payload);
    let n = packet::finish(&mut big, hl, payload.len(), ctx).expect("finish failed");
    assert_eq!(
        &big[..n],
        &pkt[..],
        "emit_headers + finish differ from emit"
    );

    // Too small a buffer.
    let mut short = vec![0u8; pkt.len() - 1];
    assert!(matches!(
        packet::emit(h, payload, &mut short, ctx),
        Err(Error::BufferTooSmall { .. })
    ));

    let p = packet::parse(&pkt).expect("emitted packet does not parse");
    check_parsed(&p, &pkt);
    let mut want = *h;
    want.bth.pad = pad_for(payload.len());
    assert_eq!(p.headers(), want, "headers changed in a round trip");
    assert_eq!(p.payload, payload, "payload changed in a round trip");
    p.verify_icrc(ctx)
        .expect("emitted packet fails its ICRC check");
    packet::parse_verified(&pkt, ctx).expect("parse_verified failed");

    // The socket path: exact for IPv6; for IPv4 it solves for the ID,
    // assuming DF or no flags.
    match ctx.ip {
        IpFields::V4 {
            ident, flags_frag, ..
        } if flags_frag == IPV4_DF || flags_frag == 0 => {
            let sol = p
                .verify_icrc_socket(ctx)
                .expect("emitted packet fails the socket ICRC check");
            assert_eq!(sol, Ipv4IdSolution { ident, flags_frag });
        }
        IpFields::V4 { .. } => {
            // Other flags: no promise either way, but no panic.
            let _ = p.verify_icrc_socket(ctx);
        }
        IpFields::V6 { .. } => {
            let sol = p
                .verify_icrc_socket(ctx)
                .expect("emitted packet fails the socket ICRC check");
            assert_eq!(
                sol,
                Ipv4IdSolution {
                    ident: 0,
                    flags_frag: 0
                }
            );
        }
    }
    pkt
}

/// Flips each listed bit of `pkt` (bit `i` is bit `7 - i % 8` of byte
/// `i / 8`, i.e. in wire order; indices wrap around the packet's length)
/// one at a time and checks that [`icrc::verify`] fails, except for the
/// masked BTH byte 4 (FECN, BECN, Resv6a), where it must still pass.
/// `pkt` is restored before returning. A no-op under `cfg(fuzzing)`.
pub fn check_bit_flips(pkt: &mut [u8], ctx: &IpContext, bits: impl IntoIterator<Item = usize>) {
    if cfg!(fuzzing) || pkt.is_empty() {
        return;
    }
    icrc::verify(ctx, pkt).expect("packet does not verify before flipping");
    let nbits = pkt.len() * 8;
    for bit in bits {
        let bit = bit % nbits;
        let (byte, mask) = (bit / 8, 0x80u8 >> (bit % 8));
        pkt[byte] ^= mask;
        let r = icrc::verify(ctx, pkt);
        pkt[byte] ^= mask;
        if byte == 4 {
            assert_eq!(
                r,
                Ok(()),
                "flipping masked BTH byte 4 bit {bit} broke the ICRC"
            );
        } else {
            assert!(
                matches!(r, Err(Error::IcrcMismatch { .. })),
                "flipping bit {bit} (byte {byte}) of a {}-byte packet went unnoticed",
                pkt.len()
            );
        }
    }
}

/// Checks that verifying `pkt` against `ctx` with one bit of the context
/// flipped fails: every context field is covered by the ICRC. `bit`
/// selects the field bit (wrapping). A no-op under `cfg(fuzzing)`.
pub fn check_context_flip(pkt: &[u8], ctx: &IpContext, bit: usize) {
    if cfg!(fuzzing) {
        return;
    }
    let mut c = *ctx;
    match &mut c.ip {
        IpFields::V4 {
            src,
            dst,
            ident,
            flags_frag,
        } => match bit % 128 {
            b @ 0..=31 => *src = Ipv4Addr::from(u32::from(*src) ^ (1 << b)),
            b @ 32..=63 => *dst = Ipv4Addr::from(u32::from(*dst) ^ (1 << (b - 32))),
            b @ 64..=79 => *ident ^= 1 << (b - 64),
            b @ 80..=95 => *flags_frag ^= 1 << (b - 80),
            b @ 96..=111 => c.src_port ^= 1 << (b - 96),
            b => c.dst_port ^= 1 << (b - 112),
        },
        IpFields::V6 { src, dst } => match bit % 288 {
            b @ 0..=127 => *src = Ipv6Addr::from(u128::from(*src) ^ (1 << b)),
            b @ 128..=255 => *dst = Ipv6Addr::from(u128::from(*dst) ^ (1 << (b - 128))),
            b @ 256..=271 => c.src_port ^= 1 << (b - 256),
            b => c.dst_port ^= 1 << (b - 272),
        },
    }
    assert!(
        matches!(icrc::verify(&c, pkt), Err(Error::IcrcMismatch { .. })),
        "context bit {bit} is not covered by the ICRC"
    );
}
