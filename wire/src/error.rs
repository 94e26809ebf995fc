//! The codec's typed errors.

use crate::opcode::Ext;

/// Result alias for the codec.
pub type Result<T> = core::result::Result<T, Error>;

/// Why a buffer is not a well-formed RoCEv2 packet (or cannot hold one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends before the named header or field does.
    #[error("truncated: {what} needs {need} bytes, {have} available")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// BTH TVer is not 0 (IBA 9.2.4: packets with another version are dropped).
    #[error("unsupported transport header version {0}")]
    BadVersion(u8),
    /// The opcode is reserved or not used by RoCE.
    #[error("unknown or reserved opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// A header the opcode requires is missing (reported by builders when
    /// a `Headers` value lacks it).
    #[error("opcode {opcode:#04x} requires a {ext} header")]
    MissingHeader {
        /// The opcode.
        opcode: u8,
        /// The missing extension header.
        ext: Ext,
    },
    /// A header is present that the opcode does not carry.
    #[error("opcode {opcode:#04x} does not carry a {ext} header")]
    UnexpectedHeader {
        /// The opcode.
        opcode: u8,
        /// The header.
        ext: Ext,
    },
    /// The pad count does not fit the packet (more pad than payload area,
    /// pad on an opcode without payload, or payload area not 4-byte aligned).
    #[error("bad pad count {pad} for a payload area of {area} bytes")]
    BadPad {
        /// BTH PadCnt.
        pad: u8,
        /// Bytes between the last header and the ICRC.
        area: usize,
    },
    /// An opcode without payload carries payload bytes, or lengths disagree.
    #[error("length mismatch: {0}")]
    LengthMismatch(&'static str),
    /// The ICRC does not match the packet.
    #[error("ICRC mismatch: packet carries {found:#010x}, computed {computed:#010x}")]
    IcrcMismatch {
        /// The value in the packet.
        found: u32,
        /// The value computed (for the assumed IP header).
        computed: u32,
    },
    /// A caller-supplied buffer is too small for what is to be written.
    #[error("buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes required.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A field value cannot be encoded (e.g. a QPN over 24 bits).
    #[error("value out of range: {0}")]
    OutOfRange(&'static str),
    /// A MAD that is not a CM MAD uroce takes (wrong version, class or
    /// method, unknown attribute), or a malformed CMA header.
    #[error("not a CM MAD: {0}")]
    BadMad(&'static str),
    /// The frame is not IPv4/IPv6 UDP, or its IP/UDP header is malformed.
    #[error("not a RoCEv2 frame: {0}")]
    NotRoce(&'static str),
}

/// Checks that `buf` holds at least `need` bytes.
#[inline]
pub(crate) fn check_len(what: &'static str, buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::Truncated {
            what,
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
