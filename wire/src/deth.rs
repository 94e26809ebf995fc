//! Datagram extended transport header (IBA 9.3.2, 8 bytes):
//! Q_Key (4), reserved (1), source QP (3).

use crate::error::Result;
use crate::fields::*;

/// Length of the DETH.
pub const DETH_LEN: usize = 8;

header_view!(
    /// A zero-copy view of a DETH.
    Deth, DETH_LEN, "DETH"
);

impl<T: AsRef<[u8]>> Deth<T> {
    /// Queue key.
    pub fn qkey(&self) -> u32 {
        be32(self.b(), 0)
    }
    /// Source QP number.
    pub fn src_qp(&self) -> u32 {
        be24(self.b(), 5)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Sets the Q_Key.
    pub fn set_qkey(&mut self, v: u32) {
        put32(self.m(), 0, v)
    }
    /// Sets the source QP (low 24 bits); clears the reserved byte.
    pub fn set_src_qp(&mut self, v: u32) {
        self.m()[4] = 0;
        put24(self.m(), 5, v & 0x00ff_ffff)
    }
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Reads a DETH.
    pub fn parse<T: AsRef<[u8]>>(p: &Deth<T>) -> Result<DethRepr> {
        Ok(DethRepr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }
    /// Writes a DETH.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Deth<T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn golden() {
        let b = [0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x01, 0x2c];
        let r = DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qp: 0x12c
            }
        );
        let mut out = [0xffu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert!(Deth::new_checked(&b[..7]).is_err());
    }
}
