//! Invalidate extended transport header (IBA 9.3.6, 4 bytes): the R_Key
//! that SEND with invalidate asks the responder to invalidate.

use crate::error::Result;
use crate::fields::*;

/// Length of the IETH.
pub const IETH_LEN: usize = 4;

header_view!(
    /// A zero-copy view of an IETH.
    Ieth, IETH_LEN, "IETH"
);

impl<T: AsRef<[u8]>> Ieth<T> {
    /// R_Key to invalidate.
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Sets the R_Key.
    pub fn set_rkey(&mut self, v: u32) {
        put32(self.m(), 0, v)
    }
}

/// IETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IethRepr {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl IethRepr {
    /// Reads an IETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Ieth<T>) -> Result<IethRepr> {
        Ok(IethRepr { rkey: p.rkey() })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        IETH_LEN
    }
    /// Writes an IETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ieth<T>) {
        p.set_rkey(self.rkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn golden() {
        let b = [0xca, 0xfe, 0xf0, 0x0d];
        let r = IethRepr::parse(&Ieth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.rkey, 0xcafe_f00d);
        let mut out = [0u8; 4];
        r.emit(&mut Ieth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(Ieth::new_checked(&b[..2]).is_err());
    }
}
