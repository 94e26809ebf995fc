//! Device configuration: which local addresses uroce serves, and what the
//! interface behind each address can carry.

use crate::types::Mtu;
use std::net::IpAddr;

/// One uroce device: a name and the local IP address it binds UDP 4791 on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Device name, e.g. `uroce0`.
    pub name: String,
    /// Local address.
    pub ip: IpAddr,
}

/// Why the device configuration could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An entry of `UROCE_DEVICES` is not `name=address`.
    #[error("UROCE_DEVICES entry {0:?} is not name=ip-address")]
    BadEntry(String),
    /// Two devices share a name or an address.
    #[error("UROCE_DEVICES names {0} twice")]
    Duplicate(String),
}

/// The environment variable naming the devices.
pub const DEVICES_ENV: &str = "UROCE_DEVICES";

/// Parses `name=ip,name=ip,...`.
pub fn parse_devices(spec: &str) -> Result<Vec<DeviceConfig>, ConfigError> {
    let mut out: Vec<DeviceConfig> = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, ip) = entry
            .split_once('=')
            .ok_or_else(|| ConfigError::BadEntry(entry.into()))?;
        let ip: IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| ConfigError::BadEntry(entry.into()))?;
        let name = name.trim();
        if name.is_empty() {
            return Err(ConfigError::BadEntry(entry.into()));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(ConfigError::Duplicate(name.into()));
        }
        if out.iter().any(|d| d.ip == ip) {
            return Err(ConfigError::Duplicate(ip.to_string()));
        }
        out.push(DeviceConfig {
            name: name.into(),
            ip,
        });
    }
    Ok(out)
}

/// The configured devices: `UROCE_DEVICES` if set, else one device
/// `uroce0` on 127.0.0.1.
pub fn devices_from_env() -> Result<Vec<DeviceConfig>, ConfigError> {
    match std::env::var(DEVICES_ENV) {
        Ok(spec) if !spec.trim().is_empty() => parse_devices(&spec),
        _ => Ok(vec![DeviceConfig {
            name: "uroce0".into(),
            ip: IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        }]),
    }
}

/// The MTU of the interface that holds `ip` (loopback addresses: the
/// loopback interface), from /sys/class/net; 1500 if it cannot be found.
pub fn interface_mtu(ip: IpAddr) -> u32 {
    interface_attr(ip, "mtu").unwrap_or(1500)
}

/// The index of the network interface that holds `ip` (loopback
/// addresses: the loopback interface), as the kernel reports it in a GID
/// entry's `ndev_ifindex`; 0 if there is none.
pub fn interface_index(ip: IpAddr) -> u32 {
    interface_attr(ip, "ifindex").unwrap_or(0)
}

/// A number from /sys/class/net/IF/`attr` of the interface that holds `ip`.
fn interface_attr(ip: IpAddr, attr: &str) -> Option<u32> {
    let ifname = interface_of(ip)?;
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/{attr}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The active MTU of a device on `ip`, as rxe derives it.
pub fn active_mtu(ip: IpAddr) -> Mtu {
    Mtu::for_interface_mtu(interface_mtu(ip))
}

/// The name of the network interface that holds `ip` (loopback
/// addresses: the loopback interface, `lo`), as the kernel names a GID's
/// netdev in sysfs (`gid_attrs/ndevs/<n>`); `None` if no interface has it.
pub fn interface_of(ip: IpAddr) -> Option<String> {
    if ip.is_loopback() {
        return Some("lo".into());
    }
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it names.
            let fam = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            let addr = match fam {
                libc::AF_INET => {
                    // SAFETY: family AF_INET means a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::V4(u32::from_be(sin.sin_addr.s_addr).into()))
                }
                libc::AF_INET6 => {
                    // SAFETY: family AF_INET6 means a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::V6(sin6.sin6_addr.s6_addr.into()))
                }
                _ => None,
            };
            if addr == Some(ip) {
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                found = Some(name.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list from getifaddrs exactly once.
    unsafe { libc::freeifaddrs(ifap) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let d = parse_devices("uroce0=127.0.0.1, uroce1=127.0.0.2,x=::1").unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[1].name, "uroce1");
        assert_eq!(d[2].ip, "::1".parse::<IpAddr>().unwrap());
        assert!(matches!(
            parse_devices("a=1.2.3"),
            Err(ConfigError::BadEntry(_))
        ));
        assert!(matches!(parse_devices("a"), Err(ConfigError::BadEntry(_))));
        assert!(matches!(
            parse_devices("a=127.0.0.1,a=127.0.0.2"),
            Err(ConfigError::Duplicate(_))
        ));
        assert!(matches!(
            parse_devices("a=127.0.0.1,b=127.0.0.1"),
            Err(ConfigError::Duplicate(_))
        ));
    }

    #[test]
    fn loopback_mtu() {
        assert_eq!(active_mtu("127.0.0.5".parse().unwrap()), Mtu::Mtu4096);
    }
}
