//! FLUSH extended transport header (IBA 1.5 annex / IBA vol. 1 rev. 1.6,
//! 4 bytes): what an RDMA FLUSH asks for. One big-endian word: bits 3-0
//! the placement type, bits 5-4 the selectivity level, the rest reserved
//! (sent as zero, ignored on receipt), as kernel rxe reads and writes it.

use crate::error::Result;
use crate::fields::*;

/// Length of the FETH.
pub const FETH_LEN: usize = 4;

/// Placement type: make the data globally visible.
pub const FLUSH_GLOBAL: u8 = 1;
/// Placement type: make the data persistent.
pub const FLUSH_PERSISTENT: u8 = 2;
/// Selectivity level: the range the RETH names.
pub const FLUSH_RANGE: u8 = 0;
/// Selectivity level: the whole memory region the R_Key names.
pub const FLUSH_MR: u8 = 1;

header_view!(
    /// A zero-copy view of a FETH.
    Feth, FETH_LEN, "FETH"
);

impl<T: AsRef<[u8]>> Feth<T> {
    /// Placement type (bits 3-0).
    pub fn placement(&self) -> u8 {
        (be32(self.b(), 0) & 0xf) as u8
    }
    /// Selectivity level (bits 5-4).
    pub fn selectivity(&self) -> u8 {
        ((be32(self.b(), 0) >> 4) & 0x3) as u8
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Feth<T> {
    /// Sets both fields, reserved bits zero.
    pub fn set(&mut self, placement: u8, selectivity: u8) {
        put32(
            self.m(),
            0,
            u32::from(placement & 0xf) | u32::from(selectivity & 0x3) << 4,
        )
    }
}

/// FETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FethRepr {
    /// Placement type ([`FLUSH_GLOBAL`], [`FLUSH_PERSISTENT`], or both).
    pub placement: u8,
    /// Selectivity level ([`FLUSH_RANGE`] or [`FLUSH_MR`]).
    pub selectivity: u8,
}

impl FethRepr {
    /// Reads a FETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Feth<T>) -> Result<FethRepr> {
        Ok(FethRepr {
            placement: p.placement(),
            selectivity: p.selectivity(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        FETH_LEN
    }
    /// Writes a FETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Feth<T>) {
        p.set(self.placement, self.selectivity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn golden() {
        // rxe's feth_init: plt | sel << 4, big-endian.
        let b = [0, 0, 0, 0x11];
        let r = FethRepr::parse(&Feth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!((r.placement, r.selectivity), (FLUSH_GLOBAL, FLUSH_MR));
        let mut out = [0xffu8; 4];
        r.emit(&mut Feth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        // Reserved bits are ignored on receipt.
        let r2 = FethRepr::parse(&Feth::new_unchecked(&[0xff, 0xff, 0xff, 0xc2][..])).unwrap();
        assert_eq!((r2.placement, r2.selectivity), (FLUSH_PERSISTENT, 0));
        assert!(Feth::new_checked(&b[..2]).is_err());
    }
}
