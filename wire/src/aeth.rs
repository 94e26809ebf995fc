//! ACK extended transport header (IBA 9.3.4, 4 bytes): syndrome (1), MSN (3).
//!
//! The syndrome (IBA table 43): bit 7 reserved; bits 6..5 the type
//! (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK); bits 4..0 the value: the
//! credit count for an ACK, the RNR timer code for an RNR NAK (table 45),
//! the NAK code for a NAK (table 44).

use crate::error::Result;
use crate::fields::*;
use core::fmt;

/// Length of the AETH.
pub const AETH_LEN: usize = 4;
/// Credit count meaning "end-to-end flow control not used / invalid".
pub const CREDITS_INVALID: u8 = 0x1f;

header_view!(
    /// A zero-copy view of an AETH.
    Aeth, AETH_LEN, "AETH"
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    pub fn syndrome(&self) -> u8 {
        self.b()[0]
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be24(self.b(), 1)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the raw syndrome.
    pub fn set_syndrome(&mut self, v: u8) {
        self.m()[0] = v
    }
    /// Sets the MSN (low 24 bits).
    pub fn set_msn(&mut self, v: u32) {
        put24(self.m(), 1, v & 0x00ff_ffff)
    }
}

/// NAK codes (IBA table 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error.
    PsnSequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error.
    RemoteAccessError,
    /// Remote operational error.
    RemoteOperationalError,
    /// Invalid RD request.
    InvalidRdRequest,
    /// A reserved code (5..=31), kept for round trips.
    Reserved(u8),
}

impl NakCode {
    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }
    /// From the 5-bit code.
    pub const fn from_code(c: u8) -> NakCode {
        match c & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Reserved(c),
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN sequence error"),
            NakCode::InvalidRequest => f.write_str("invalid request"),
            NakCode::RemoteAccessError => f.write_str("remote access error"),
            NakCode::RemoteOperationalError => f.write_str("remote operational error"),
            NakCode::InvalidRdRequest => f.write_str("invalid RD request"),
            NakCode::Reserved(c) => write!(f, "reserved NAK code {c}"),
        }
    }
}

/// The decoded syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with a credit count (0x1f: invalid).
    Ack {
        /// Credit count.
        credits: u8,
    },
    /// Receiver not ready, with the RNR timer code (table 45).
    RnrNak {
        /// Timer code, 0..=31.
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// Syndrome type 10 (reserved); the raw byte.
    Reserved(u8),
}

impl AethSyndrome {
    /// Decodes a syndrome byte (bit 7 ignored).
    pub const fn from_byte(b: u8) -> AethSyndrome {
        let v = b & 0x1f;
        match (b >> 5) & 0x3 {
            0 => AethSyndrome::Ack { credits: v },
            1 => AethSyndrome::RnrNak { timer: v },
            3 => AethSyndrome::Nak(NakCode::from_code(v)),
            _ => AethSyndrome::Reserved(b & 0x7f),
        }
    }
    /// Encodes to a syndrome byte.
    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(c) => 0x60 | c.code(),
            AethSyndrome::Reserved(b) => 0x40 | (b & 0x1f),
        }
    }
    /// "ack", "rnr_nak", "nak" or "reserved".
    pub const fn kind(self) -> &'static str {
        match self {
            AethSyndrome::Ack { .. } => "ack",
            AethSyndrome::RnrNak { .. } => "rnr_nak",
            AethSyndrome::Nak(_) => "nak",
            AethSyndrome::Reserved(_) => "reserved",
        }
    }
    /// The 5-bit value: credit count, RNR timer code or NAK code.
    pub const fn value(self) -> u8 {
        self.to_byte() & 0x1f
    }
}

/// RNR NAK timer values in microseconds, indexed by the 5-bit timer code
/// (IBA table 45). Code 0 is the longest, 655.36 ms.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR delay a timer code asks for, in nanoseconds.
pub const fn rnr_timer_ns(code: u8) -> u64 {
    RNR_TIMER_US[(code & 0x1f) as usize] as u64 * 1000
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Decoded syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl Default for AethRepr {
    fn default() -> Self {
        AethRepr {
            syndrome: AethSyndrome::Ack {
                credits: CREDITS_INVALID,
            },
            msn: 0,
        }
    }
}

impl AethRepr {
    /// Reads an AETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Aeth<T>) -> Result<AethRepr> {
        Ok(AethRepr {
            syndrome: AethSyndrome::from_byte(p.syndrome()),
            msn: p.msn(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }
    /// Writes an AETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Aeth<T>) {
        p.set_syndrome(self.syndrome.to_byte());
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let cases: [([u8; 4], AethSyndrome, u32); 6] = [
            ([0x1f, 0, 0, 7], AethSyndrome::Ack { credits: 31 }, 7),
            (
                [0x2c, 0x01, 0x00, 0x00],
                AethSyndrome::RnrNak { timer: 12 },
                0x10000,
            ),
            (
                [0x60, 0, 0, 1],
                AethSyndrome::Nak(NakCode::PsnSequenceError),
                1,
            ),
            (
                [0x61, 0, 0, 1],
                AethSyndrome::Nak(NakCode::InvalidRequest),
                1,
            ),
            (
                [0x62, 0xff, 0xff, 0xff],
                AethSyndrome::Nak(NakCode::RemoteAccessError),
                0xffffff,
            ),
            (
                [0x63, 0, 0, 0],
                AethSyndrome::Nak(NakCode::RemoteOperationalError),
                0,
            ),
        ];
        for (bytes, syn, msn) in cases {
            let r = AethRepr::parse(&Aeth::new_checked(&bytes[..]).unwrap()).unwrap();
            assert_eq!(r, AethRepr { syndrome: syn, msn });
            let mut out = [0u8; 4];
            r.emit(&mut Aeth::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
        assert_eq!(
            AethSyndrome::from_byte(0x64),
            AethSyndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x65),
            AethSyndrome::Nak(NakCode::Reserved(5))
        );
        assert_eq!(AethSyndrome::from_byte(0x45), AethSyndrome::Reserved(0x45));
        assert_eq!(AethSyndrome::from_byte(0x45).to_byte(), 0x45);
        assert_eq!(AethSyndrome::from_byte(0x2c).kind(), "rnr_nak");
        assert_eq!(AethSyndrome::from_byte(0x2c).value(), 12);
        assert!(Aeth::new_checked(&[0u8; 3][..]).is_err());
    }

    #[test]
    fn every_syndrome_round_trips() {
        for b in 0u8..=0x7f {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b);
        }
    }

    #[test]
    fn rnr_table() {
        assert_eq!(rnr_timer_ns(0), 655_360_000);
        assert_eq!(rnr_timer_ns(1), 10_000);
        assert_eq!(rnr_timer_ns(12), 640_000);
        assert_eq!(rnr_timer_ns(31), 491_520_000);
        // Strictly increasing from code 1.
        assert!(RNR_TIMER_US[1..].windows(2).all(|w| w[0] < w[1]));
    }
}
