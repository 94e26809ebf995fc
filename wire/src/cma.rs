//! The RDMA IP CM Service (IBA Annex A11) as Linux's rdma_cm uses it on
//! RoCE: service IDs made from a port space and a port, and the CMA header
//! that a REQ or SIDR_REQ carries ahead of the user's private data.
//!
//! The user's private-data room follows: REQ 92 - 36 = 56 bytes, SIDR_REQ
//! 216 - 36 = 180; the replies carry no header (REP 196, REJ 148, DREQ
//! 220, DREP 224, SIDR_REP 136). `RDMA_PS_IB` ids carry no CMA header at
//! all (92 bytes of REQ private data).

use crate::error::{Error, Result};
use crate::fields::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// rdma_cm port spaces (`enum rdma_port_space`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum PortSpace {
    Ipoib = 0x0002,
    Tcp = 0x0106,
    Udp = 0x0111,
    Ib = 0x013F,
}

impl PortSpace {
    /// The port space with this number.
    pub fn from_u16(v: u16) -> Option<PortSpace> {
        Some(match v {
            0x0002 => PortSpace::Ipoib,
            0x0106 => PortSpace::Tcp,
            0x0111 => PortSpace::Udp,
            0x013F => PortSpace::Ib,
            _ => return None,
        })
    }
}

/// The CM service ID of `port` in `ps` (the kernel's
/// `cma_get_service_id`): TCP port 7471 is 0x0000_0000_0106_1D2F.
pub fn service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps as u64) << 16) | u64::from(port)
}

/// The port space and port of an rdma_cm service ID (`None` for any other
/// service ID).
pub fn parse_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    Some((PortSpace::from_u16((sid >> 16) as u16)?, sid as u16))
}

/// Bytes in the CMA header.
pub const CMA_HDR_LEN: usize = 36;
/// The CMA header version rdma_cm sends.
pub const CMA_VERSION: u8 = 0;

header_view!(
    /// A zero-copy view of the CMA header.
    CmaHeader, CMA_HDR_LEN, "CMA header"
);

impl<T: AsRef<[u8]>> CmaHeader<T> {
    /// CMA version.
    pub fn cma_version(&self) -> u8 {
        self.b()[0]
    }
    /// IP version (4 or 6), from the top nibble.
    pub fn ip_version(&self) -> u8 {
        self.b()[1] >> 4
    }
    /// The active side's port.
    pub fn port(&self) -> u16 {
        be16(self.b(), 2)
    }
    fn addr(&self, at: usize, v4: bool) -> IpAddr {
        let b = self.b();
        if v4 {
            IpAddr::V4(Ipv4Addr::new(
                b[at + 12],
                b[at + 13],
                b[at + 14],
                b[at + 15],
            ))
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&b[at..at + 16]);
            IpAddr::V6(Ipv6Addr::from(a))
        }
    }
}

/// CMA header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeaderRepr {
    /// The active side's port.
    pub port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The passive side's address.
    pub dst: IpAddr,
}

impl CmaHeaderRepr {
    /// Reads the header: version 0 and IP version 4 or 6 only.
    pub fn parse<T: AsRef<[u8]>>(p: &CmaHeader<T>) -> Result<CmaHeaderRepr> {
        if p.cma_version() != CMA_VERSION {
            return Err(Error::BadMad("CMA header version is not 0"));
        }
        let v4 = match p.ip_version() {
            4 => true,
            6 => false,
            _ => return Err(Error::BadMad("CMA header IP version is not 4 or 6")),
        };
        Ok(CmaHeaderRepr {
            port: p.port(),
            src: p.addr(4, v4),
            dst: p.addr(20, v4),
        })
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        CMA_HDR_LEN
    }
    /// Writes the header; both addresses must be of one family.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut CmaHeader<T>) -> Result<()> {
        let (v, s, d) = match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => (4u8, s.to_ipv6_compatible(), d.to_ipv6_compatible()),
            (IpAddr::V6(s), IpAddr::V6(d)) => (6u8, s, d),
            _ => return Err(Error::OutOfRange("CMA header addresses of two families")),
        };
        let b = p.m();
        b[0] = CMA_VERSION;
        b[1] = v << 4;
        put16(b, 2, self.port);
        // An IPv4 address sits in the last 4 of its 16 bytes, zeros before.
        b[4..20].copy_from_slice(&s.octets());
        b[20..36].copy_from_slice(&d.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids() {
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0106_1d2f);
        assert_eq!(parse_service_id(0x0106_1d2f), Some((PortSpace::Tcp, 7471)));
        assert_eq!(parse_service_id(0x013f_0001), Some((PortSpace::Ib, 1)));
        assert_eq!(parse_service_id(0x1_0106_1d2f), None);
        assert_eq!(parse_service_id(0x0107_0000), None);
    }

    #[test]
    fn golden_v4_and_v6() {
        let mut g = [0u8; 36];
        g[1] = 0x40;
        g[2..4].copy_from_slice(&7471u16.to_be_bytes());
        g[16..20].copy_from_slice(&[10, 99, 0, 1]);
        g[32..36].copy_from_slice(&[10, 99, 0, 2]);
        let r = CmaHeaderRepr::parse(&CmaHeader::new_checked(&g[..]).unwrap()).unwrap();
        assert_eq!(
            r,
            CmaHeaderRepr {
                port: 7471,
                src: "10.99.0.1".parse().unwrap(),
                dst: "10.99.0.2".parse().unwrap(),
            }
        );
        let mut out = [0xffu8; 36];
        r.emit(&mut CmaHeader::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, g);

        let v6 = CmaHeaderRepr {
            port: 1,
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        let mut out = [0u8; 36];
        v6.emit(&mut CmaHeader::new_unchecked(&mut out[..]))
            .unwrap();
        assert_eq!(out[1], 0x60);
        assert_eq!(out[19], 1);
        assert_eq!(out[35], 2);
        assert_eq!(
            CmaHeaderRepr::parse(&CmaHeader::new_checked(&out[..]).unwrap()).unwrap(),
            v6
        );
        // Mixed families, bad versions.
        let mixed = CmaHeaderRepr {
            port: 1,
            src: "10.0.0.1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
        };
        assert!(mixed
            .emit(&mut CmaHeader::new_unchecked(&mut out[..]))
            .is_err());
        g[0] = 1;
        assert!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&g[..]).unwrap()).is_err());
        g[0] = 0;
        g[1] = 0x50;
        assert!(CmaHeaderRepr::parse(&CmaHeader::new_checked(&g[..]).unwrap()).is_err());
        assert!(CmaHeader::new_checked(&g[..35]).is_err());
    }
}
