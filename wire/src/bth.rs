//! Base transport header (IBA 9.2, 12 bytes).
//!
//! ```text
//!  0       opcode
//!  1       SE(1) M(1) PadCnt(2) TVer(4)
//!  2..4    P_Key
//!  4       FECN(1) BECN(1) Resv6a(6)
//!  5..8    DestQP (24)
//!  8       AckReq(1) Resv7(7)
//!  9..12   PSN (24)
//! ```

use crate::error::{check_len, Error, Result};
use crate::fields::*;
use crate::opcode::Opcode;
use crate::psn::Psn;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const ECN: usize = 4;
    pub const DQPN: usize = 5;
    pub const ACKREQ: usize = 8;
    pub const PSN: usize = 9;
}

/// Length of the BTH.
pub const BTH_LEN: usize = 12;
/// The default (full-membership) partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Mask of a 24-bit QP number.
pub const QPN_MASK: u32 = 0x00ff_ffff;

/// A zero-copy view of a BTH.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length.
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }
    /// Wraps a buffer after checking it holds a whole BTH.
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        check_len("BTH", buffer.as_ref(), BTH_LEN)?;
        Ok(Bth { buffer })
    }
    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// OpCode.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.b()[field::OPCODE])
    }
    /// Solicited Event.
    pub fn se(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }
    /// MigReq.
    pub fn migreq(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }
    /// Pad count (0..=3).
    pub fn pad(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 0x3
    }
    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        be16(self.b(), field::PKEY)
    }
    /// Forward explicit congestion notification.
    pub fn fecn(&self) -> bool {
        self.b()[field::ECN] & 0x80 != 0
    }
    /// Backward explicit congestion notification.
    pub fn becn(&self) -> bool {
        self.b()[field::ECN] & 0x40 != 0
    }
    /// Destination QP number.
    pub fn dest_qp(&self) -> u32 {
        be24(self.b(), field::DQPN)
    }
    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACKREQ] & 0x80 != 0
    }
    /// Packet sequence number.
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.b(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    fn m(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    fn set_bit(&mut self, at: usize, mask: u8, on: bool) {
        let b = &mut self.m()[at];
        *b = if on { *b | mask } else { *b & !mask };
    }
    /// Sets the opcode.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.m()[field::OPCODE] = v.0;
    }
    /// Sets SE.
    pub fn set_se(&mut self, v: bool) {
        self.set_bit(field::FLAGS, 0x80, v)
    }
    /// Sets MigReq.
    pub fn set_migreq(&mut self, v: bool) {
        self.set_bit(field::FLAGS, 0x40, v)
    }
    /// Sets the pad count (low two bits of `v`).
    pub fn set_pad(&mut self, v: u8) {
        let b = &mut self.m()[field::FLAGS];
        *b = (*b & !0x30) | ((v & 3) << 4);
    }
    /// Sets TVer (low four bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.m()[field::FLAGS];
        *b = (*b & !0x0f) | (v & 0x0f);
    }
    /// Sets the P_Key.
    pub fn set_pkey(&mut self, v: u16) {
        put16(self.m(), field::PKEY, v)
    }
    /// Sets FECN.
    pub fn set_fecn(&mut self, v: bool) {
        self.set_bit(field::ECN, 0x80, v)
    }
    /// Sets BECN.
    pub fn set_becn(&mut self, v: bool) {
        self.set_bit(field::ECN, 0x40, v)
    }
    /// Sets the destination QP (low 24 bits).
    pub fn set_dest_qp(&mut self, v: u32) {
        put24(self.m(), field::DQPN, v & QPN_MASK)
    }
    /// Sets AckReq.
    pub fn set_ack_req(&mut self, v: bool) {
        self.set_bit(field::ACKREQ, 0x80, v)
    }
    /// Sets the PSN.
    pub fn set_psn(&mut self, v: Psn) {
        put24(self.m(), field::PSN, v.value())
    }
}

/// The BTH's fields as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BthRepr {
    /// OpCode.
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// Migration request.
    pub migreq: bool,
    /// Pad count. The packet builder overwrites it from the payload length.
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN.
    pub fecn: bool,
    /// BECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// PSN.
    pub psn: Psn,
}

impl BthRepr {
    /// Reads a BTH. Reserved bits are ignored, as the spec asks of receivers.
    /// A TVer other than 0 is [`Error::BadVersion`].
    pub fn parse<T: AsRef<[u8]>>(p: &Bth<T>) -> Result<BthRepr> {
        if p.tver() != 0 {
            return Err(Error::BadVersion(p.tver()));
        }
        Ok(BthRepr {
            opcode: p.opcode(),
            se: p.se(),
            migreq: p.migreq(),
            pad: p.pad(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }
    /// Writes the BTH, reserved bits zero.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Bth<T>) {
        let b = &mut p.m()[..BTH_LEN];
        b.fill(0);
        p.set_opcode(self.opcode);
        p.set_se(self.se);
        p.set_migreq(self.migreq);
        p.set_pad(self.pad);
        p.set_tver(self.tver);
        p.set_pkey(self.pkey);
        p.set_fecn(self.fecn);
        p.set_becn(self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The BTH of the RC SEND_ONLY in shared/roce-check/ICRC.md example 1
    // (bytes built by scapy): MigReq, pad 1, P_Key 0x8001, AckReq.
    const GOLDEN: [u8; 12] = [
        0x04, 0x50, 0x80, 0x01, 0x00, 0x1d, 0x3a, 0x6a, 0x80, 0x1b, 0x4b, 0x3d,
    ];

    #[test]
    fn parse_golden() {
        let p = Bth::new_checked(&GOLDEN[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode::RC_SEND_ONLY);
        assert!(!r.se && r.migreq);
        assert_eq!(r.pad, 1);
        assert_eq!(r.tver, 0);
        assert_eq!(r.pkey, 0x8001);
        assert!(!r.fecn && !r.becn);
        assert_eq!(r.dest_qp, 0x1d3a6a);
        assert!(r.ack_req);
        assert_eq!(r.psn, Psn::new(0x1b4b3d));
        let mut out = [0xaau8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(out, GOLDEN);
    }

    #[test]
    fn every_bit() {
        let r = BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_FIRST,
            se: true,
            migreq: false,
            pad: 3,
            tver: 0,
            pkey: 0xffff,
            fecn: true,
            becn: true,
            dest_qp: 0xabcdef,
            ack_req: false,
            psn: Psn::new(0xffffff),
        };
        let mut out = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut out[..]));
        assert_eq!(
            out,
            [0x06, 0xb0, 0xff, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x00, 0xff, 0xff, 0xff]
        );
        assert_eq!(BthRepr::parse(&Bth::new_checked(&out[..]).unwrap()), Ok(r));
    }

    #[test]
    fn errors() {
        assert!(matches!(
            Bth::new_checked(&[0u8; 11][..]),
            Err(Error::Truncated {
                need: 12,
                have: 11,
                ..
            })
        ));
        let mut b = GOLDEN;
        b[1] |= 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(Error::BadVersion(1))
        );
    }
}
