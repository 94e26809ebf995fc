//! Atomic extended transport header (IBA 9.3.3.2, 28 bytes: VA, R_Key,
//! Swap(or Add) data, Compare data) and the atomic acknowledge extended
//! transport header (IBA 9.5.4, 8 bytes: original remote data).

use crate::error::Result;
use crate::fields::*;

/// Length of the AtomicETH.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Length of the AtomicAckETH.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

header_view!(
    /// A zero-copy view of an AtomicETH.
    AtomicEth, ATOMIC_ETH_LEN, "AtomicETH"
);

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Virtual address (must be 8-byte aligned).
    pub fn va(&self) -> u64 {
        be64(self.b(), 0)
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        be32(self.b(), 8)
    }
    /// Swap value (compare-swap) or addend (fetch-add).
    pub fn swap_add(&self) -> u64 {
        be64(self.b(), 12)
    }
    /// Compare value (compare-swap only).
    pub fn compare(&self) -> u64 {
        be64(self.b(), 20)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Sets the virtual address.
    pub fn set_va(&mut self, v: u64) {
        put64(self.m(), 0, v)
    }
    /// Sets the remote key.
    pub fn set_rkey(&mut self, v: u32) {
        put32(self.m(), 8, v)
    }
    /// Sets the swap/add value.
    pub fn set_swap_add(&mut self, v: u64) {
        put64(self.m(), 12, v)
    }
    /// Sets the compare value.
    pub fn set_compare(&mut self, v: u64) {
        put64(self.m(), 20, v)
    }
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEthRepr {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value or addend.
    pub swap_add: u64,
    /// Compare value.
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Reads an AtomicETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicEth<T>) -> Result<AtomicEthRepr> {
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }
    /// Writes an AtomicETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicEth<T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

header_view!(
    /// A zero-copy view of an AtomicAckETH.
    AtomicAckEth, ATOMIC_ACK_ETH_LEN, "AtomicAckETH"
);

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// The remote data before the atomic operation.
    pub fn orig(&self) -> u64 {
        be64(self.b(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Sets the original remote data.
    pub fn set_orig(&mut self, v: u64) {
        put64(self.m(), 0, v)
    }
}

/// AtomicAckETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicAckEthRepr {
    /// Original remote data.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Reads an AtomicAckETH.
    pub fn parse<T: AsRef<[u8]>>(p: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr> {
        Ok(AtomicAckEthRepr { orig: p.orig() })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }
    /// Writes an AtomicAckETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut AtomicAckEth<T>) {
        p.set_orig(self.orig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_golden() {
        let mut b = [0u8; 28];
        b[..8].copy_from_slice(&0x1000_2000_3000_4008u64.to_be_bytes());
        b[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        b[12..20].copy_from_slice(&0xaaaa_bbbb_cccc_ddddu64.to_be_bytes());
        b[20..28].copy_from_slice(&7u64.to_be_bytes());
        let r = AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            AtomicEthRepr {
                va: 0x1000_2000_3000_4008,
                rkey: 0x0102_0304,
                swap_add: 0xaaaa_bbbb_cccc_dddd,
                compare: 7
            }
        );
        let mut out = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(AtomicEth::new_checked(&b[..27]).is_err());
    }

    #[test]
    fn atomic_ack_golden() {
        let b = [0, 0, 0, 0, 0, 0, 0x01, 0x00];
        let r = AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.orig, 256);
        let mut out = [0xffu8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(AtomicAckEth::new_checked(&b[..7]).is_err());
    }
}
