//! Addresses and ports (`rdma_bind_addr`, `rdma_set_afonly`) and their
//! resolution to a device (`rdma_resolve_addr`, `rdma_resolve_route`).

use super::id::{IdInner, IdState};
use super::{CmEventType, CmId};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Weak};
use uroce_provider::device::{claim_port, port_holder, PortAddr, PortClaim};
use uroce_verbs::{devices, Context, Device, Error, Result};

/// An address that binds no particular device, as the kernel's CMA
/// treats it (`cma_any_addr`): the wildcard, and a loopback address
/// (127/8, ::1) that no uroce device has (but see `names_own_netdev`).
/// An id bound to one listens on every device and picks its device when
/// it resolves a destination, as on the wildcard. (libfabric's verbs
/// provider binds 127.0.0.1 to ask for "any device".)
pub fn binds_any(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_unspecified() || (loopback_of_no_device(ip) && !sysfs_view())
}

/// A loopback address (127/8, ::1) that no uroce device has.
fn loopback_of_no_device(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    ip.is_loopback() && !devices().is_ok_and(|d| d.iter().any(|d| d.ip().to_canonical() == ip))
}

/// Whether the program runs under `uroce exec`'s sysfs view
/// (`UROCE_SYSFS` set).
fn sysfs_view() -> bool {
    std::env::var_os("UROCE_SYSFS").is_some_and(|v| !v.is_empty())
}

/// Whether `ip` is, to this program, an address of a device's own
/// network interface that no device has: under `uroce exec`'s sysfs view
/// (`UROCE_SYSFS` set), which names the interface holding a device's
/// address as its netdev (`lo` for 127.x), a program may take that
/// interface's address for the device's, as the pyverbs tests read
/// `ip addr show lo` (127.0.0.1). The kernel's CMA resolves a destination
/// on the device's own netdev to the device itself (`cma_resolve_loopback`),
/// and so does [`CmId::resolve_addr`] for these. Without the view uroce
/// names no netdev, and a loopback address no device has is nobody's (an
/// unreachable peer).
///
/// "No device" is the host's: the process knows only the devices its
/// `UROCE_DEVICES` names, and a loopback address none of them has may be
/// another process's device (a server on 127.0.0.1, its client on
/// 127.0.0.2), which holds the address's UDP port 4791 (`port_holder`).
/// That address is a peer's: the program resolves it as a remote
/// destination, and cannot bind it (EADDRNOTAVAIL, as another device's
/// address).
///
/// Bound to one, an id binds the device (as the kernel's
/// `cma_bind_loopback`: the first device, of the address's family here),
/// and keeps the address as its own (`rdma_get_local_addr`).
fn names_own_netdev(ip: IpAddr) -> bool {
    loopback_of_no_device(ip) && sysfs_view() && port_holder(ip.to_canonical()).is_none()
}

/// The uroce device (opened, shared in the process) that has `ip` (or
/// whose netdev has it, see [`names_own_netdev`]).
fn context_for(ip: IpAddr) -> Result<Context> {
    if names_own_netdev(ip) {
        return device_towards(ip)?.open_shared();
    }
    let ip = ip.to_canonical();
    let devs = devices()?;
    let dev = devs
        .iter()
        .find(|d| d.ip().to_canonical() == ip)
        .ok_or_else(|| Error::AddrNotAvailable(ip.to_string()))?;
    dev.open_shared()
}

/// The device to reach `dst` from: the one that has `dst`, else the one
/// the kernel's route to `dst` leaves from, else the only one (of the
/// right family).
pub(crate) fn device_towards(dst: IpAddr) -> Result<Device> {
    let devs = devices()?;
    let dst = dst.to_canonical();
    if let Some(d) = devs.iter().find(|d| d.ip().to_canonical() == dst) {
        return Ok(d.clone());
    }
    // A kernel socket even under librspreload (see kernel_udp_socket).
    let domain = if dst.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    if let Ok(sock) =
        uroce_provider::device::kernel_udp_socket(domain).map(std::net::UdpSocket::from)
    {
        if sock.connect(SocketAddr::new(dst, 9)).is_ok() {
            if let Ok(local) = sock.local_addr() {
                if let Some(d) = devs.iter().find(|d| d.ip() == local.ip()) {
                    return Ok(d.clone());
                }
            }
        }
    }
    let same: Vec<_> = devs
        .iter()
        .filter(|d| d.ip().is_ipv4() == dst.is_ipv4())
        .collect();
    match same.as_slice() {
        [d, ..] => Ok((*d).clone()),
        [] => Err(Error::AddrNotAvailable(dst.to_string())),
    }
}

/// (address, port space, port) -> the id bound there, and whether it is
/// restricted to its address family (the kernel's `afonly`, fixed at
/// bind time).
type PortTable = Mutex<HashMap<(IpAddr, u16, u16), (Weak<IdInner>, bool)>>;

/// The kernel CMA's `afonly` for an id bound without `rdma_set_afonly`:
/// an IPv4 id is restricted to IPv4; an IPv6 id to IPv6 only if the
/// host's `net.ipv6.bindv6only` says so (default 0: an IPv6 wildcard
/// also takes IPv4, and conflicts with an IPv4 bind of its port).
pub(super) fn afonly_default(ip: IpAddr) -> bool {
    ip.is_ipv4()
        || std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "1")
}

/// Ports this process has bound, per (device address, port space).
fn ports() -> &'static PortTable {
    static P: std::sync::OnceLock<PortTable> = std::sync::OnceLock::new();
    P.get_or_init(Default::default)
}

/// `port` of port space `ps` at `ip` claimed for the host (see
/// [`claim_port`]); `None` when another process holds it. Without a
/// place for the locks (no private directory), the process's own table
/// is all there is.
fn host_port(ps: u16, ip: IpAddr, port: u16, afonly: bool) -> Option<Option<PortClaim>> {
    let addr = if binds_any(ip) {
        PortAddr::Any {
            v6: ip.is_ipv6() && !ip.to_canonical().is_ipv4(),
            afonly,
        }
    } else {
        PortAddr::Ip(ip.to_canonical())
    };
    match claim_port(ps, addr, port) {
        Ok(Some(c)) => Some(Some(c)),
        Ok(None) => None,
        Err(_) => Some(None),
    }
}

impl CmId {
    /// Reserves `port` (0: an ephemeral one) at `ip`, in this process's
    /// table and for the host's processes, as the kernel's port space.
    fn reserve_port(
        &self,
        ip: IpAddr,
        port: u16,
        afonly: bool,
    ) -> Result<(u16, Option<PortClaim>)> {
        let mut p = ports().lock();
        p.retain(|_, (w, _)| w.strong_count() > 0);
        let ps = self.inner.ps as u16;
        // As the kernel's CMA (cma_check_port, without REUSEADDR): two
        // ids restricted to their address families (afonly) do not meet
        // when the families differ; otherwise a port bound on the
        // wildcard address conflicts with every address
        // (EADDRNOTAVAIL), and the same address twice is EADDRINUSE.
        let clash = |q: u16| {
            let mut bound = p.iter().filter(|((_, s, pt), _)| *s == ps && *pt == q);
            bound.find_map(|(&(other, ..), &(_, other_afonly))| {
                if afonly && other_afonly && other.is_ipv4() != ip.is_ipv4() {
                    None
                } else if binds_any(other) || binds_any(ip) {
                    Some(Error::PortConflict(q))
                } else if other == ip {
                    Some(Error::AddrInUse)
                } else {
                    None
                }
            })
        };
        let (port, claim) = if port == 0 {
            // An ephemeral port, as the kernel picks one (its local range):
            // free here and in every other process.
            loop {
                let q = 32768 + (rand::random::<u16>() % 28232);
                if clash(q).is_none() {
                    if let Some(c) = host_port(ps, ip, q, afonly) {
                        break (q, c);
                    }
                }
            }
        } else {
            if let Some(e) = clash(port) {
                return Err(e);
            }
            // Another process's: as the kernel's port space.
            let c = host_port(ps, ip, port, afonly).ok_or(Error::AddrInUse)?;
            (port, c)
        };
        p.insert((ip, ps, port), (Arc::downgrade(&self.inner), afonly));
        Ok((port, claim))
    }

    /// `rdma_set_afonly` (`RDMA_OPTION_ID_AFONLY`): whether the id, once
    /// bound, takes only its own address family: an IPv6 listener with it
    /// takes no IPv4 connections, and may share its port with an IPv4
    /// one (tgtd binds `0.0.0.0` and `[::]` so). Before or right after
    /// `bind_addr`, as the kernel allows; a bound id's port is not
    /// checked again.
    pub fn set_afonly(&self, afonly: bool) -> Result<()> {
        let mut st = self.inner.st.lock();
        match st.state {
            IdState::Idle => {}
            IdState::AddrBound => {
                if let Some(src) = st.src {
                    let key = (src.ip(), self.inner.ps as u16, src.port());
                    if let Some(e) = ports().lock().get_mut(&key) {
                        e.1 = afonly;
                    }
                    // The host's claim follows (an IPv6 wildcard without
                    // AFONLY holds the IPv4 one's port too).
                    st.port_claim = None;
                    st.port_claim =
                        host_port(self.inner.ps as u16, src.ip(), src.port(), afonly).flatten();
                }
            }
            _ => return Err(Error::Invalid("set_afonly after listen or connect".into())),
        }
        st.afonly = Some(afonly);
        Ok(())
    }

    /// `rdma_bind_addr`: to a device's address, or to the wildcard address
    /// or a loopback address no device has (every device: [`binds_any`]).
    /// Port 0 picks a free port.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::Idle {
            return Err(Error::Invalid("the id is bound already".into()));
        }
        let ctxs = if binds_any(addr.ip()) {
            let all: Vec<Context> = devices()?
                .iter()
                .filter(|d| d.ip().is_ipv4() == addr.is_ipv4() || addr.is_ipv6())
                .map(|d| d.open_shared())
                .collect::<Result<_>>()?;
            if all.is_empty() {
                return Err(Error::AddrNotAvailable(addr.ip().to_string()));
            }
            all
        } else {
            vec![context_for(addr.ip())?]
        };
        let afonly = st.afonly.unwrap_or_else(|| afonly_default(addr.ip()));
        let (port, claim) = self.reserve_port(addr.ip(), addr.port(), afonly)?;
        st.port_claim = claim;
        st.src = Some(SocketAddr::new(addr.ip(), port));
        st.ctxs = ctxs;
        st.state = IdState::AddrBound;
        Ok(())
    }

    /// `rdma_resolve_addr`: finds the device for `dst` (from `src` if
    /// given) and reports [`CmEventType::AddrResolved`].
    pub fn resolve_addr(&self, src: Option<SocketAddr>, dst: SocketAddr) -> Result<()> {
        let state = self.inner.st.lock().state;
        if state == IdState::Idle {
            let src = match src {
                Some(s) => s,
                None => SocketAddr::new(device_towards(dst.ip())?.ip(), 0),
            };
            self.bind_addr(src)?;
        } else if state != IdState::AddrBound {
            return Err(Error::Invalid("resolve_addr: wrong id state".into()));
        }
        let mut st = self.inner.st.lock();
        let src_ip = st.src.map(|s| s.ip());
        // A source of the other family: EINVAL at once, the id left bound
        // (the kernel's resolve_prepare_src, "cma_family(id_priv) !=
        // dst_addr->sa_family").
        if src_ip.is_some_and(|s| s.is_ipv4() != dst.is_ipv4()) {
            return Err(Error::Invalid(
                "resolve_addr: the source and destination are of different families".into(),
            ));
        }
        if src_ip.is_some_and(binds_any) {
            // Bound to no device: narrow to the device towards dst.
            let d = device_towards(dst.ip())?;
            st.ctxs = vec![d.open_shared()?];
            let port = st.src.map_or(0, |s| s.port());
            st.src = Some(SocketAddr::new(d.ip(), port));
        }
        // The id keeps the destination it was given (rdma_get_peer_addr);
        // the CM's packets and the QP's go to the device itself.
        st.route_dst = names_own_netdev(dst.ip())
            .then(|| st.ctxs.first().map(|c| c.device().ip()))
            .flatten();
        st.dst = Some(dst);
        st.state = IdState::AddrResolved;
        drop(st);
        self.ready(CmEventType::AddrResolved, 0, None);
        Ok(())
    }

    /// `rdma_resolve_route`: on RoCE the route is the address; reports
    /// [`CmEventType::RouteResolved`].
    pub fn resolve_route(&self) -> Result<()> {
        let mut st = self.inner.st.lock();
        if st.state != IdState::AddrResolved {
            return Err(Error::Invalid("resolve_route before resolve_addr".into()));
        }
        st.state = IdState::RouteResolved;
        st.route_tos = st.tos;
        drop(st);
        self.ready(CmEventType::RouteResolved, 0, None);
        Ok(())
    }
}
