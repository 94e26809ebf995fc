//! Address handles (`struct ibv_ah`): where a UD send goes.

use crate::device::Context;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use std::net::IpAddr;
use std::sync::Arc;
use uroce_provider::device::{grh_source, AhHandle};
use uroce_provider::qp_attr::AddressVector;
use uroce_provider::types::{UdDest, Wc, WcFlags};

/// An address handle: a checked address vector to one peer.
#[derive(Debug)]
pub struct AddressHandle {
    av: AddressVector,
    ip: IpAddr,
    _pd: Arc<()>,
    /// Its place in the device's `max_ah`.
    _slot: AhHandle,
}

impl AddressHandle {
    /// The address vector it was made from.
    pub fn attr(&self) -> AddressVector {
        self.av
    }
    /// The peer's IP address.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }
    /// The destination of a UD send WR (`wr.ud.ah`, `remote_qpn`,
    /// `remote_qkey`): put it in [`crate::SendWr::ud`]. A `remote_qkey` with
    /// the high bit set sends with the QP's own Q_Key.
    pub fn ud_dest(&self, remote_qpn: u32, remote_qkey: u32) -> UdDest {
        UdDest {
            ip: self.ip,
            remote_qpn,
            remote_qkey,
            tclass: self.av.traffic_class,
            hop_limit: self.av.hop_limit,
        }
    }
}

impl ProtectionDomain {
    /// `ibv_create_ah`: the destination GID is the peer's RoCEv2 GID (its
    /// IP address, IPv4-mapped for IPv4), of the device's IP version, or
    /// a multicast group's (send to QP 0xFFFFFF; see
    /// [`crate::QueuePair::attach_mcast`]).
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle> {
        if av.port_num != 1 {
            return Err(Error::Invalid(format!(
                "port_num {}: the only port is 1",
                av.port_num
            )));
        }
        if av.sgid_index >= crate::device::GID_ENTRIES {
            return Err(Error::Invalid(format!(
                "sgid_index {}: the GID table's populated entries are 0..{}",
                av.sgid_index,
                crate::device::GID_ENTRIES
            )));
        }
        let ip = av.ip();
        if ip.is_unspecified() {
            return Err(Error::Invalid("dgid is zero".into()));
        }
        if ip.is_ipv4() != self.ctx.device().ip().is_ipv4() {
            return Err(Error::Invalid(format!(
                "dgid {ip} is of another IP version than the device's {}",
                self.ctx.device().ip()
            )));
        }
        let slot = self.ctx.inner.face.new_ah()?;
        Ok(AddressHandle {
            av: *av,
            ip,
            _pd: self.users.clone(),
            _slot: slot,
        })
    }

    /// `ibv_create_ah_from_wc`: an address handle back to the sender of a
    /// UD receive completion whose buffer starts with `grh` (its first 40
    /// bytes).
    pub fn create_ah_from_wc(&self, wc: &Wc, grh: &[u8]) -> Result<AddressHandle> {
        let av = self.ctx.init_ah_from_wc(1, wc, grh)?;
        self.create_ah(&av)
    }
}

impl Context {
    /// `ibv_init_ah_from_wc`: the address vector back to the sender of a UD
    /// receive completion. On RoCE the completion must carry a GRH
    /// (`IBV_WC_GRH`): for an IPv4 sender, bytes 20..40 hold its IPv4
    /// header (recognised by version and a valid checksum, as libibverbs
    /// does); otherwise the area is its IPv6 header.
    pub fn init_ah_from_wc(&self, port_num: u8, wc: &Wc, grh: &[u8]) -> Result<AddressVector> {
        if port_num != 1 {
            return Err(Error::Invalid(format!(
                "port_num {port_num}: the only port is 1"
            )));
        }
        if !wc.wc_flags.contains(WcFlags::GRH) {
            return Err(Error::Invalid(
                "the completion has no GRH (RoCE needs it to address a reply)".into(),
            ));
        }
        let src = grh_source(grh)
            .ok_or_else(|| Error::Invalid("the GRH area holds neither IPv4 nor IPv6".into()))?;
        let mut av = AddressVector::to_ip(src);
        av.sl = wc.sl;
        // As libibverbs: reply with the received traffic class; hop limit
        // 0xff.
        av.traffic_class = match src {
            IpAddr::V4(_) if grh.len() >= 22 => grh[21],
            IpAddr::V6(_) if grh.len() >= 2 => (grh[0] << 4) | (grh[1] >> 4),
            _ => 0,
        };
        av.hop_limit = 0xff;
        Ok(av)
    }
}
