//! Multicast on UD ids (`rdma_join_multicast`, `rdma_leave_multicast`),
//! as the kernel's CMA does it on RoCE.

use super::id::IdState;
use super::{CmEventType, CmId, UdParam, RDMA_UDP_QKEY};
use std::net::{IpAddr, SocketAddr};
use uroce_verbs::{AddressVector, Error, QpType, Result};

impl CmId {
    /// `rdma_join_multicast` on RoCE, as the kernel's CMA does it
    /// (`cma_iboe_join_multicast`): no SA, the MGID is the group's IPv4
    /// address, IPv4-mapped; the id's QP (unless `send_only`) is attached
    /// to it as librdmacm does on the event; then
    /// [`CmEventType::MulticastJoin`] reports where to send (QP 0xFFFFFF,
    /// Q_Key `RDMA_UDP_QKEY`, hop limit 64), or `MulticastError` with the
    /// attach's error. EINVAL for an id not bound, not UD, or the zero
    /// address; IPv6 groups are refused (EOPNOTSUPP) as the kernel refuses
    /// them on RoCE v2.
    pub fn join_multicast(&self, addr: SocketAddr, send_only: bool) -> Result<()> {
        let mut st = self.inner.st.lock();
        if !matches!(st.state, IdState::AddrBound | IdState::AddrResolved) {
            return Err(Error::Invalid("join_multicast needs a bound id".into()));
        }
        if self.inner.qp_type != QpType::Ud {
            return Err(Error::Invalid("join_multicast needs a UD id".into()));
        }
        if addr.ip().is_unspecified() {
            return Err(Error::Invalid("join_multicast: the zero address".into()));
        }
        let IpAddr::V4(v4) = addr.ip().to_canonical() else {
            return Err(Error::NotSupported(
                "IPv6 multicast on RoCE v2 (the kernel's CMA refuses it too)",
            ));
        };
        if st
            .src
            .is_some_and(|s| s.is_ipv6() && !s.ip().is_unspecified())
        {
            return Err(Error::Invalid("an IPv4 group on an IPv6 id".into()));
        }
        let mgid = v4.to_ipv6_mapped().octets();
        let attached = match (&st.qp, send_only) {
            (Some(qp), false) => qp.attach_mcast(&mgid, 0),
            _ => Ok(()),
        };
        if attached.is_ok() {
            st.mcast.push((addr, mgid, send_only));
        }
        drop(st);
        let ud = UdParam {
            private_data: Vec::new(),
            ah_attr: AddressVector {
                dgid: mgid,
                hop_limit: 64,
                ..AddressVector::default()
            },
            qp_num: uroce_provider::device::MULTICAST_QPN,
            qkey: RDMA_UDP_QKEY,
        };
        let (event, status) = match attached {
            Ok(()) => (CmEventType::MulticastJoin, 0),
            Err(e) => (CmEventType::MulticastError, -e.errno()),
        };
        self.ready(event, status, Some(ud));
        Ok(())
    }

    /// `rdma_leave_multicast`: detaches the id's QP from a group it joined
    /// (EADDRNOTAVAIL for an address not joined, as librdmacm answers).
    pub fn leave_multicast(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        let at = st
            .mcast
            .iter()
            .position(|(a, ..)| a.ip() == addr.ip())
            .ok_or_else(|| Error::AddrNotAvailable(addr.ip().to_string()))?;
        let (_, mgid, send_only) = st.mcast.remove(at);
        // As librdmacm: the detach's own error (a QP destroyed since,
        // which detached it) is not the caller's.
        if let (Some(qp), false) = (&st.qp, send_only) {
            let _ = qp.detach_mcast(&mgid, 0);
        }
        Ok(())
    }
}
