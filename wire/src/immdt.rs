//! Immediate data extended transport header (IBA 9.3.5, 4 bytes).

use crate::error::Result;
use crate::fields::*;

/// Length of ImmDt.
pub const IMMDT_LEN: usize = 4;

header_view!(
    /// A zero-copy view of ImmDt.
    ImmDt, IMMDT_LEN, "ImmDt"
);

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// The immediate value, as the 4 wire bytes read big-endian.
    ///
    /// (verbs hands `imm_data` to applications in network byte order: a
    /// `__be32`. This is the same 32 bits; the API layer decides how to
    /// present them.)
    pub fn imm(&self) -> u32 {
        be32(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        put32(self.m(), 0, v)
    }
}

/// ImmDt fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImmDtRepr {
    /// Immediate data.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Reads ImmDt.
    pub fn parse<T: AsRef<[u8]>>(p: &ImmDt<T>) -> Result<ImmDtRepr> {
        Ok(ImmDtRepr { imm: p.imm() })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        IMMDT_LEN
    }
    /// Writes ImmDt.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ImmDt<T>) {
        p.set_imm(self.imm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn golden() {
        let b = [0x12, 0x34, 0x56, 0x78];
        let r = ImmDtRepr::parse(&ImmDt::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.imm, 0x1234_5678);
        let mut out = [0u8; 4];
        r.emit(&mut ImmDt::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(ImmDt::new_checked(&b[..3]).is_err());
    }
}
