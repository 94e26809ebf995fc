//! The common MAD header (IBA 13.4.3, 24 bytes) and the constants of the
//! General Services Interface: MADs travel as UD SEND ONLY packets to QP1
//! with the GSI Q_Key, 256 bytes each.

use crate::error::Result;
use crate::fields::*;

/// Bytes in a MAD.
pub const MAD_LEN: usize = 256;
/// Bytes in the common MAD header.
pub const MAD_HDR_LEN: usize = 24;
/// Management class of Communication Management.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// The CM class version (IBA 1.2 and later).
pub const CM_CLASS_VERSION: u8 = 2;
/// MAD base version.
pub const MAD_BASE_VERSION: u8 = 1;
/// Method `Send` (CM messages are all Sends).
pub const METHOD_SEND: u8 = 0x03;
/// The GSI QP.
pub const GSI_QPN: u32 = 1;
/// The GSI Q_Key (IBA 13.5.1.1).
pub const GSI_QKEY: u32 = 0x8001_0000;

header_view!(
    /// A zero-copy view of the common MAD header.
    MadHeader, MAD_HDR_LEN, "MAD header"
);

impl<T: AsRef<[u8]>> MadHeader<T> {
    /// Base version.
    pub fn base_version(&self) -> u8 {
        self.b()[0]
    }
    /// Management class.
    pub fn mgmt_class(&self) -> u8 {
        self.b()[1]
    }
    /// Class version.
    pub fn class_version(&self) -> u8 {
        self.b()[2]
    }
    /// R bit (bit 7) and method.
    pub fn method(&self) -> u8 {
        self.b()[3]
    }
    /// Status.
    pub fn status(&self) -> u16 {
        be16(self.b(), 4)
    }
    /// Class-specific field.
    pub fn class_specific(&self) -> u16 {
        be16(self.b(), 6)
    }
    /// Transaction ID.
    pub fn tid(&self) -> u64 {
        be64(self.b(), 8)
    }
    /// Attribute ID.
    pub fn attr_id(&self) -> u16 {
        be16(self.b(), 16)
    }
    /// Attribute modifier.
    pub fn attr_mod(&self) -> u32 {
        be32(self.b(), 20)
    }
}

/// Common MAD header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MadHeaderRepr {
    /// Base version (1).
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// R bit and method.
    pub method: u8,
    /// Status.
    pub status: u16,
    /// Class-specific.
    pub class_specific: u16,
    /// Transaction ID.
    pub tid: u64,
    /// Attribute ID.
    pub attr_id: u16,
    /// Attribute modifier.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// Reads the header.
    pub fn parse<T: AsRef<[u8]>>(p: &MadHeader<T>) -> Result<MadHeaderRepr> {
        Ok(MadHeaderRepr {
            base_version: p.base_version(),
            mgmt_class: p.mgmt_class(),
            class_version: p.class_version(),
            method: p.method(),
            status: p.status(),
            class_specific: p.class_specific(),
            tid: p.tid(),
            attr_id: p.attr_id(),
            attr_mod: p.attr_mod(),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        MAD_HDR_LEN
    }
    /// Writes the header (the reserved field as 0).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut MadHeader<T>) {
        let b = p.m();
        b[0] = self.base_version;
        b[1] = self.mgmt_class;
        b[2] = self.class_version;
        b[3] = self.method;
        put16(b, 4, self.status);
        put16(b, 6, self.class_specific);
        put64(b, 8, self.tid);
        put16(b, 16, self.attr_id);
        put16(b, 18, 0);
        put32(b, 20, self.attr_mod);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden() {
        let bytes: [u8; 24] = [
            1, 7, 2, 3, 0, 0, 0, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0, 0x10, 0, 0,
            0, 0, 0, 0,
        ];
        let h = MadHeaderRepr::parse(&MadHeader::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(
            h,
            MadHeaderRepr {
                base_version: 1,
                mgmt_class: MGMT_CLASS_CM,
                class_version: 2,
                method: METHOD_SEND,
                tid: 0x1122_3344_5566_7788,
                attr_id: 0x10,
                ..MadHeaderRepr::default()
            }
        );
        let mut out = [0xffu8; 24];
        h.emit(&mut MadHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
        assert!(MadHeader::new_checked(&bytes[..23]).is_err());
    }
}
