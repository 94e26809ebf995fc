//! RDMA extended transport header (IBA 9.3.3, 16 bytes):
//! virtual address (8), R_Key (4), DMA length (4).

use crate::error::Result;
use crate::fields::*;

/// Length of the RETH.
pub const RETH_LEN: usize = 16;

header_view!(
    /// A zero-copy view of a RETH.
    Reth, RETH_LEN, "RETH"
);

impl<T: AsRef<[u8]>> Reth<T> {
    /// Virtual address.
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// DMA length: the whole message's length.
    pub fn dma_len(&self) -> u32 {
        be32(self.b(), 12)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(self.m(), 0, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        put32(self.m(), 8, v)
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        put32(self.m(), 12, v)
    }
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RethRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

impl RethRepr {
    /// Reads a RETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Reth<T>) -> Result<RethRepr> {
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }
    /// Writes a RETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Reth<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: [u8; 16] = [
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x00,
        0x00,
    ];

    #[test]
    fn golden() {
        let r = RethRepr::parse(&Reth::new_checked(&GOLDEN[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            RethRepr {
                va: 0x7f12_3456_789a,
                rkey: 0xdead_beef,
                dma_len: 65536
            }
        );
        let mut out = [0u8; 16];
        r.emit(&mut Reth::new_unchecked(&mut out[..]));
        assert_eq!(out, GOLDEN);
        assert!(Reth::new_checked(&GOLDEN[..15]).is_err());
    }
}
