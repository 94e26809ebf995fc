//! Whole RoCEv2 packets: the UDP payload from the BTH to the ICRC.
//!
//! [`parse`] checks the lengths, the headers the opcode table says the
//! opcode carries, the pad count, and hands back the BTH, the extension
//! headers (read on demand: [`ParsedPacket::reth`], ..., or all at once,
//! [`ParsedPacket::headers`]), the payload (pad stripped) and the stored
//! ICRC; [`ParsedPacket::verify_icrc`] checks
//! the ICRC against an IP context. [`emit`] writes a whole packet with the
//! right pad and ICRC into a caller's buffer; [`emit_headers`] and
//! [`finish`] split that in two so that a sender can place the payload
//! straight from registered memory between them.

use crate::aeth::{Aeth, AethRepr, AETH_LEN};
use crate::atomic::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN,
};
use crate::bth::{Bth, BthRepr, BTH_LEN};
use crate::deth::{Deth, DethRepr, DETH_LEN};
use crate::error::{check_len, Error, Result};
use crate::feth::{Feth, FethRepr, FETH_LEN};
use crate::icrc::{self, IpContext, Ipv4IdSolution};
use crate::ieth::{Ieth, IethRepr, IETH_LEN};
use crate::immdt::{ImmDt, ImmDtRepr, IMMDT_LEN};
use crate::opcode::{Ext, OpcodeInfo};
use crate::reth::{Reth, RethRepr, RETH_LEN};
use crate::ICRC_LEN;

/// Every header of a packet, as plain values. Extension headers the opcode
/// does not carry are `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// Base transport header.
    pub bth: BthRepr,
    /// Datagram ETH (UD).
    pub deth: Option<DethRepr>,
    /// FLUSH ETH.
    pub feth: Option<FethRepr>,
    /// RDMA ETH.
    pub reth: Option<RethRepr>,
    /// Atomic ETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// ACK ETH.
    pub aeth: Option<AethRepr>,
    /// Atomic ACK ETH.
    pub atomic_ack: Option<AtomicAckEthRepr>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Invalidate ETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl Headers {
    /// Headers with just a BTH.
    pub fn new(bth: BthRepr) -> Headers {
        Headers {
            bth,
            ..Headers::default()
        }
    }

    fn present(&self, ext: Ext) -> bool {
        match ext {
            Ext::Deth => self.deth.is_some(),
            Ext::Feth => self.feth.is_some(),
            Ext::Reth => self.reth.is_some(),
            Ext::AtomicEth => self.atomic_eth.is_some(),
            Ext::Aeth => self.aeth.is_some(),
            Ext::AtomicAckEth => self.atomic_ack.is_some(),
            Ext::ImmDt => self.imm.is_some(),
            Ext::Ieth => self.ieth.is_some(),
            Ext::CnpReserved => true,
        }
    }

    /// The opcode's table row, after checking that exactly the headers it
    /// carries are present.
    pub fn check(&self) -> Result<&'static OpcodeInfo> {
        let info = self.bth.opcode.checked_info()?;
        // The CNP's reserved bytes are not a field: nothing to compare.
        for ext in Ext::ALL.into_iter().filter(|&e| e != Ext::CnpReserved) {
            match (info.has(ext), self.present(ext)) {
                (true, false) => {
                    return Err(Error::MissingHeader {
                        opcode: info.code,
                        ext,
                    })
                }
                (false, true) => {
                    return Err(Error::UnexpectedHeader {
                        opcode: info.code,
                        ext,
                    })
                }
                _ => {}
            }
        }
        Ok(info)
    }

    /// Length of the BTH and extension headers.
    pub fn header_len(&self) -> Result<usize> {
        Ok(BTH_LEN + self.check()?.ext_len())
    }
}

/// The pad that brings `payload_len` to a multiple of four.
#[inline]
pub const fn pad_for(payload_len: usize) -> u8 {
    ((4 - (payload_len % 4)) % 4) as u8
}

/// A parsed packet borrowing the UDP payload it came from. The BTH is
/// decoded; the extension headers are read when asked for (one table
/// lookup and a few loads each), since most packets' handlers need one or
/// none of them. [`parse`] has checked that every header the opcode
/// carries is there, so the accessors cannot fail for those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedPacket<'a> {
    /// Base transport header.
    pub bth: BthRepr,
    /// The opcode's table row.
    pub info: &'static OpcodeInfo,
    /// The payload, pad stripped.
    pub payload: &'a [u8],
    /// The ICRC value stored in the packet.
    pub icrc: u32,
    /// The whole UDP payload (BTH to ICRC).
    pub bytes: &'a [u8],
}

impl<'a> ParsedPacket<'a> {
    /// Length of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        BTH_LEN + self.info.ext_len()
    }
    /// The `N` bytes of extension header `ext`, if the opcode carries it.
    #[inline]
    fn ext<const N: usize>(&self, ext: Ext) -> Option<&'a [u8; N]> {
        let at = self.info.ext_offset(ext)?;
        self.bytes.get(at..)?.first_chunk()
    }
    /// Datagram ETH (UD).
    pub fn deth(&self) -> Option<DethRepr> {
        let b = self.ext::<DETH_LEN>(Ext::Deth)?;
        DethRepr::parse(&Deth::new_unchecked(b)).ok()
    }
    /// FLUSH ETH.
    pub fn feth(&self) -> Option<FethRepr> {
        let b = self.ext::<FETH_LEN>(Ext::Feth)?;
        FethRepr::parse(&Feth::new_unchecked(b)).ok()
    }
    /// RDMA ETH.
    pub fn reth(&self) -> Option<RethRepr> {
        let b = self.ext::<RETH_LEN>(Ext::Reth)?;
        RethRepr::parse(&Reth::new_unchecked(b)).ok()
    }
    /// Atomic ETH.
    pub fn atomic_eth(&self) -> Option<AtomicEthRepr> {
        let b = self.ext::<ATOMIC_ETH_LEN>(Ext::AtomicEth)?;
        AtomicEthRepr::parse(&AtomicEth::new_unchecked(b)).ok()
    }
    /// ACK ETH.
    pub fn aeth(&self) -> Option<AethRepr> {
        let b = self.ext::<AETH_LEN>(Ext::Aeth)?;
        AethRepr::parse(&Aeth::new_unchecked(b)).ok()
    }
    /// Atomic ACK ETH.
    pub fn atomic_ack(&self) -> Option<AtomicAckEthRepr> {
        let b = self.ext::<ATOMIC_ACK_ETH_LEN>(Ext::AtomicAckEth)?;
        AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b)).ok()
    }
    /// Immediate data.
    pub fn imm(&self) -> Option<u32> {
        let b = self.ext::<IMMDT_LEN>(Ext::ImmDt)?;
        Some(ImmDtRepr::parse(&ImmDt::new_unchecked(b)).ok()?.imm)
    }
    /// Invalidate ETH: the R_Key to invalidate.
    pub fn ieth(&self) -> Option<u32> {
        let b = self.ext::<IETH_LEN>(Ext::Ieth)?;
        Some(IethRepr::parse(&Ieth::new_unchecked(b)).ok()?.rkey)
    }
    /// Every header as plain values.
    pub fn headers(&self) -> Headers {
        Headers {
            bth: self.bth,
            deth: self.deth(),
            feth: self.feth(),
            reth: self.reth(),
            atomic_eth: self.atomic_eth(),
            aeth: self.aeth(),
            atomic_ack: self.atomic_ack(),
            imm: self.imm(),
            ieth: self.ieth(),
        }
    }
    /// Verifies the ICRC for a fully known IP context.
    pub fn verify_icrc(&self, ctx: &IpContext) -> Result<()> {
        icrc::verify(ctx, self.bytes)
    }
    /// Verifies the ICRC of a packet from a UDP socket, where the IPv4
    /// identification is unknown ([`icrc::verify_unknown_ipv4_id`]).
    pub fn verify_icrc_socket(&self, ctx: &IpContext) -> Result<Ipv4IdSolution> {
        icrc::verify_unknown_ipv4_id(ctx, self.bytes)
    }
}

/// Parses a UDP payload holding one RoCEv2 packet (BTH .. ICRC). Checks the
/// length of every header, that TVer is 0, that the opcode is one RoCE
/// uses, the pad count and the length rules; does not check the ICRC.
pub fn parse(buf: &[u8]) -> Result<ParsedPacket<'_>> {
    // The BTH as an array: its decoder then needs no bounds checks.
    let (Some(b), true) = (
        buf.first_chunk::<BTH_LEN>(),
        buf.len() >= BTH_LEN + ICRC_LEN,
    ) else {
        return Err(Error::Truncated {
            what: "BTH+ICRC",
            need: BTH_LEN + ICRC_LEN,
            have: buf.len(),
        });
    };
    let bth = BthRepr::parse(&Bth::new_unchecked(b))?;
    let info = bth.opcode.checked_info()?;
    let hdr_len = BTH_LEN + info.ext_len();
    check_len(info.name, buf, hdr_len + ICRC_LEN)?;
    let area = buf.len() - hdr_len - ICRC_LEN;
    let pad = bth.pad as usize;
    if !info.has_payload {
        if area != 0 {
            return Err(Error::LengthMismatch(
                "payload on an opcode that carries none",
            ));
        }
        if pad != 0 {
            return Err(Error::BadPad { pad: bth.pad, area });
        }
    } else if area % 4 != 0 || pad > area {
        return Err(Error::BadPad { pad: bth.pad, area });
    }
    let payload = &buf[hdr_len..hdr_len + area - pad];
    let icrc = icrc::stored(buf).unwrap_or(0);
    Ok(ParsedPacket {
        bth,
        info,
        payload,
        icrc,
        bytes: buf,
    })
}

/// Parses and verifies the ICRC against a fully known IP context.
pub fn parse_verified<'a>(buf: &'a [u8], ctx: &IpContext) -> Result<ParsedPacket<'a>> {
    let p = parse(buf)?;
    p.verify_icrc(ctx)?;
    Ok(p)
}

/// Length of the whole UDP payload for these headers and a payload of
/// `payload_len` bytes: headers + payload + pad + ICRC.
pub fn packet_len(h: &Headers, payload_len: usize) -> Result<usize> {
    Ok(h.header_len()? + payload_len + pad_for(payload_len) as usize + ICRC_LEN)
}

/// Writes the BTH and extension headers at the start of `buf`, with the pad
/// count for `payload_len`; returns the header length. The payload goes at
/// `buf[header_len..]`; then call [`finish`].
pub fn emit_headers(h: &Headers, payload_len: usize, buf: &mut [u8]) -> Result<usize> {
    let info = h.check()?;
    if !info.has_payload && payload_len != 0 {
        return Err(Error::LengthMismatch(
            "payload on an opcode that carries none",
        ));
    }
    let hdr_len = BTH_LEN + info.ext_len();
    let need = hdr_len + payload_len + pad_for(payload_len) as usize + ICRC_LEN;
    if buf.len() < need {
        return Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        });
    }
    let mut bth = h.bth;
    bth.pad = pad_for(payload_len);
    bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
    let mut off = BTH_LEN;
    for &ext in info.headers {
        let b = &mut buf[off..off + ext.len()];
        // `check` guaranteed presence; a missing one would be a bug, but we
        // write zeros rather than panic.
        match ext {
            Ext::Deth => h.deth.unwrap_or_default().emit(&mut Deth::new_unchecked(b)),
            Ext::Feth => h.feth.unwrap_or_default().emit(&mut Feth::new_unchecked(b)),
            Ext::Reth => h.reth.unwrap_or_default().emit(&mut Reth::new_unchecked(b)),
            Ext::AtomicEth => h
                .atomic_eth
                .unwrap_or_default()
                .emit(&mut AtomicEth::new_unchecked(b)),
            Ext::Aeth => h.aeth.unwrap_or_default().emit(&mut Aeth::new_unchecked(b)),
            Ext::AtomicAckEth => h
                .atomic_ack
                .unwrap_or_default()
                .emit(&mut AtomicAckEth::new_unchecked(b)),
            Ext::ImmDt => ImmDtRepr {
                imm: h.imm.unwrap_or(0),
            }
            .emit(&mut ImmDt::new_unchecked(b)),
            Ext::Ieth => IethRepr {
                rkey: h.ieth.unwrap_or(0),
            }
            .emit(&mut Ieth::new_unchecked(b)),
            Ext::CnpReserved => b.fill(0),
        }
        off += ext.len();
    }
    Ok(hdr_len)
}

/// Completes a packet whose headers ([`emit_headers`]) and payload are in
/// place: zeroes the pad bytes and writes the ICRC. Returns the packet's
/// total length.
pub fn finish(
    buf: &mut [u8],
    header_len: usize,
    payload_len: usize,
    ctx: &IpContext,
) -> Result<usize> {
    let pad = pad_for(payload_len) as usize;
    let total = header_len + payload_len + pad + ICRC_LEN;
    if buf.len() < total {
        return Err(Error::BufferTooSmall {
            need: total,
            have: buf.len(),
        });
    }
    buf[header_len + payload_len..header_len + payload_len + pad].fill(0);
    icrc::write(ctx, &mut buf[..total])?;
    Ok(total)
}

/// Writes a whole packet (headers, payload, pad, ICRC) into `buf`; returns
/// its length.
pub fn emit(h: &Headers, payload: &[u8], buf: &mut [u8], ctx: &IpContext) -> Result<usize> {
    let hdr_len = emit_headers(h, payload.len(), buf)?;
    buf[hdr_len..hdr_len + payload.len()].copy_from_slice(payload);
    finish(buf, hdr_len, payload.len(), ctx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{AethSyndrome, NakCode};
    use crate::opcode::Opcode;
    use crate::psn::Psn;
    use core::net::Ipv4Addr;

    fn ctx() -> IpContext {
        IpContext::for_socket_v4(
            Ipv4Addr::new(127, 0, 0, 1),
            Ipv4Addr::new(127, 0, 0, 2),
            0xc001,
            4791,
        )
    }

    fn bth(op: Opcode) -> BthRepr {
        BthRepr {
            opcode: op,
            pkey: 0xffff,
            dest_qp: 0x12,
            psn: Psn::new(0x345),
            ack_req: true,
            ..BthRepr::default()
        }
    }

    /// ICRC.md example 1, parsed as a whole packet.
    #[test]
    fn example1_whole_packet() {
        let pkt = [
            0x04, 0x50, 0x80, 0x01, 0x00, 0x1d, 0x3a, 0x6a, 0x80, 0x1b, 0x4b, 0x3d, 0xdd, 0xe4,
            0xeb, 0x00, 0xea, 0xdd, 0x47, 0x88,
        ];
        let p = parse(&pkt).unwrap();
        assert_eq!(p.payload, &[0xdd, 0xe4, 0xeb]);
        assert_eq!(p.icrc, 0x8847_ddea);
        assert_eq!(p.info.name, "RC_SEND_ONLY");
        let ctx = IpContext {
            ip: crate::icrc::IpFields::V4 {
                src: Ipv4Addr::new(192, 168, 10, 1),
                dst: Ipv4Addr::new(192, 168, 10, 2),
                ident: 0xec3b,
                flags_frag: crate::icrc::IPV4_DF,
            },
            src_port: 0xc113,
            dst_port: 4791,
        };
        p.verify_icrc(&ctx).unwrap();
        // rebuild byte for byte
        let mut out = [0u8; 64];
        let n = emit(&p.headers(), p.payload, &mut out, &ctx).unwrap();
        assert_eq!(&out[..n], &pkt[..]);
    }

    #[test]
    fn rdma_write_first_golden() {
        let mut h = Headers::new(bth(Opcode::RC_RDMA_WRITE_FIRST));
        h.reth = Some(RethRepr {
            va: 0x1000,
            rkey: 0xaabbccdd,
            dma_len: 8192,
        });
        let mut out = [0u8; 64];
        let n = emit(&h, &[1, 2, 3, 4, 5, 6, 7, 8], &mut out, &ctx()).unwrap();
        assert_eq!(n, 12 + 16 + 8 + 4);
        assert_eq!(
            &out[..36],
            &[
                0x06, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00, 0x03, 0x45, // BTH
                0, 0, 0, 0, 0, 0, 0x10, 0x00, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0x20,
                0x00, // RETH
                1, 2, 3, 4, 5, 6, 7, 8
            ][..]
        );
        let p = parse_verified(&out[..n], &ctx()).unwrap();
        assert_eq!(p.headers(), h);
    }

    #[test]
    fn builder_rejects_wrong_headers() {
        let h = Headers::new(bth(Opcode::RC_RDMA_WRITE_ONLY));
        let mut out = [0u8; 64];
        assert_eq!(
            emit(&h, &[], &mut out, &ctx()),
            Err(Error::MissingHeader {
                opcode: 0x0a,
                ext: Ext::Reth
            })
        );
        let mut h = Headers::new(bth(Opcode::RC_SEND_ONLY));
        h.imm = Some(1);
        assert!(matches!(
            emit(&h, &[], &mut out, &ctx()),
            Err(Error::UnexpectedHeader { .. })
        ));
        let h = Headers::new(bth(Opcode(0x15)));
        assert_eq!(
            emit(&h, &[], &mut out, &ctx()),
            Err(Error::UnknownOpcode(0x15))
        );
        let mut h = Headers::new(bth(Opcode::RC_ACKNOWLEDGE));
        h.aeth = Some(AethRepr::default());
        assert!(matches!(
            emit(&h, &[1], &mut out, &ctx()),
            Err(Error::LengthMismatch(_))
        ));
        let h = Headers::new(bth(Opcode::RC_SEND_ONLY));
        assert_eq!(
            emit(&h, &[0; 100], &mut out, &ctx()),
            Err(Error::BufferTooSmall {
                need: 116,
                have: 64
            })
        );
    }

    #[test]
    fn parser_errors() {
        let mut h = Headers::new(bth(Opcode::RC_ACKNOWLEDGE));
        h.aeth = Some(AethRepr {
            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
            msn: 9,
        });
        let mut out = [0u8; 64];
        let n = emit(&h, &[], &mut out, &ctx()).unwrap();
        assert_eq!(n, 20);
        let p = parse_verified(&out[..n], &ctx()).unwrap();
        assert_eq!(p.headers(), h);
        // truncated AETH
        assert!(matches!(parse(&out[..15]), Err(Error::Truncated { .. })));
        // payload on ACK
        let mut long = out[..n].to_vec();
        long.splice(16..16, [0u8; 4]);
        assert!(matches!(parse(&long), Err(Error::LengthMismatch(_))));
        // pad on ACK
        let mut bad = out[..n].to_vec();
        bad[1] |= 0x10;
        assert!(matches!(
            parse(&bad),
            Err(Error::BadPad { pad: 1, area: 0 })
        ));
        // unknown opcode
        let mut bad = out[..n].to_vec();
        bad[0] = 0x40;
        assert_eq!(parse(&bad), Err(Error::UnknownOpcode(0x40)));
        // version
        let mut bad = out[..n].to_vec();
        bad[1] |= 0x02;
        assert_eq!(parse(&bad), Err(Error::BadVersion(2)));
        // ICRC
        let mut bad = out[..n].to_vec();
        bad[19] ^= 1;
        assert!(matches!(
            parse_verified(&bad, &ctx()),
            Err(Error::IcrcMismatch { .. })
        ));
        // payload area not aligned / pad larger than payload
        let h = Headers::new(bth(Opcode::RC_SEND_ONLY));
        let n = emit(&h, &[7, 7], &mut out, &ctx()).unwrap();
        assert_eq!(n, 20);
        let mut bad = out[..n].to_vec();
        bad.insert(13, 0);
        assert!(matches!(parse(&bad), Err(Error::BadPad { .. })));
        let mut bad = out[..16].to_vec();
        bad[1] = 0x30; // pad 3 with a 0-byte area
        bad.truncate(16);
        assert!(matches!(
            parse(&bad),
            Err(Error::BadPad { pad: 3, area: 0 })
        ));
    }

    #[test]
    fn cnp() {
        let h = Headers::new(BthRepr {
            opcode: Opcode::CNP,
            dest_qp: 0x11,
            pkey: 0xffff,
            becn: true,
            ..BthRepr::default()
        });
        let mut out = [0u8; 64];
        let n = emit(&h, &[], &mut out, &ctx()).unwrap();
        assert_eq!(n, 12 + 16 + 4);
        assert_eq!(parse_verified(&out[..n], &ctx()).unwrap().headers(), h);
    }
}
