//! Devices, contexts and their attributes.

use crate::cm_port::CmPort;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use std::net::IpAddr;
use std::sync::Arc;
use uroce_provider::counters::CounterSnapshot;
use uroce_provider::device::Faults;
use uroce_provider::device::Resource;
use uroce_provider::device::{
    self as face, devices_from_env, interface_index, interface_mtu, DeviceConfig, IoPath,
    MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH,
};
use uroce_provider::qp_attr::gid_of;
pub use uroce_provider::qp_attr::{GID_ENTRIES, GID_TABLE_LEN};
use uroce_provider::types::Mtu;

/// The environment variable that makes every device write a capture:
/// `UROCE_PCAP=/tmp/{dev}.pcap` (`{dev}` becomes the device name).
pub const PCAP_ENV: &str = "UROCE_PCAP";

fn capture_path_from_env(dev: &str) -> Option<std::path::PathBuf> {
    let v = std::env::var(PCAP_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())?;
    Some(v.replace("{dev}", dev).into())
}

/// Device limits (reported by `query_device`, enforced by the provider's
/// face).
pub use uroce_provider::device::{MAX_CQE, MAX_INLINE, MAX_QP_WR, MAX_RD_ATOM, MAX_SGE};

/// The firmware version devices report (`fw_ver`): uroce's version.
pub const FW_VER: &str = env!("CARGO_PKG_VERSION");

/// A configured device (not yet opened).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    cfg: DeviceConfig,
}

/// The devices `UROCE_DEVICES` names (default: `uroce0` on 127.0.0.1).
pub fn devices() -> Result<Vec<Device>> {
    let list = devices_from_env().map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(list.into_iter().map(|cfg| Device { cfg }).collect())
}

impl Device {
    /// A device on an address, outside the configuration.
    pub fn new(name: &str, ip: IpAddr) -> Device {
        Device {
            cfg: DeviceConfig {
                name: name.into(),
                ip,
            },
        }
    }
    /// Finds a configured device by name.
    pub fn by_name(name: &str) -> Result<Device> {
        devices()?
            .into_iter()
            .find(|d| d.name() == name)
            .ok_or_else(|| Error::NoDevice(name.into()))
    }
    /// Name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }
    /// Local IP address.
    pub fn ip(&self) -> IpAddr {
        self.cfg.ip
    }
    /// Node GUID: EUI-64 style from the address (stable per device).
    pub fn guid(&self) -> u64 {
        let g = gid_of(self.cfg.ip);
        u64::from_be_bytes([0x02, 0x75, 0x72, 0xff, 0xfe, g[13], g[14], g[15]])
    }
    /// `ibv_query_port` (port 1 only), from the device's address: the
    /// active MTU as a context opened now would have it.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::Invalid(format!("port {port}: the only port is 1")));
        }
        Ok(PortAttr {
            state: 4,
            max_mtu: Mtu::Mtu4096,
            active_mtu: face::active_mtu(self.cfg.ip),
            gid_tbl_len: GID_TABLE_LEN as u32,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: 1,
            lid: 0,
            link_layer: 2,
            netdev_mtu: interface_mtu(self.cfg.ip),
        })
    }
    /// `ibv_query_gid_ex`: entries 0 and 1 ([`GID_ENTRIES`]) hold the
    /// device's RoCEv2 GID (index 1 is where kernel rxe keeps it); the
    /// rest of the table ([`GID_TABLE_LEN`]) is empty: [`Error::NoData`]
    /// (ENODATA), as the kernel answers for an empty entry.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        if port != 1 || index >= GID_TABLE_LEN as u32 {
            return Err(Error::Invalid(format!(
                "port {port} GID index {index}: the table is port 1, indices 0..{GID_TABLE_LEN}"
            )));
        }
        if index >= GID_ENTRIES as u32 {
            return Err(Error::NoData(format!("GID index {index} is empty")));
        }
        let ip = self.cfg.ip;
        Ok(GidEntry {
            gid: gid_of(ip),
            gid_type: "RoCE v2",
            ndev_ifindex: interface_index(ip),
        })
    }
    /// The network interface that holds the device's address (`lo` for a
    /// loopback address), as sysfs names a GID's netdev; `None` if no
    /// interface has it.
    pub fn netdev(&self) -> Option<String> {
        face::interface_of(self.cfg.ip)
    }
    /// Opens the device: binds UDP 4791 on its address and starts its
    /// engine thread.
    pub fn open(&self) -> Result<Context> {
        let face = face::Device::open(self.cfg.ip)?;
        face.set_name(&self.cfg.name);
        if let Some(path) = capture_path_from_env(&self.cfg.name) {
            face.capture(Some(&path))?;
        }
        // QP1 and the connection manager's agent.
        let cm = CmPort::start(&face, self.cfg.ip, self.guid())?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                device: self.clone(),
                face,
                cm,
            }),
        })
    }

    /// Opens the device, or returns the context this process has open on
    /// it already (a device binds its address once per process; the
    /// connection manager and the C library share contexts this way).
    ///
    /// A child of `fork()` does not get its parent's context: the child
    /// has the parent's memory but not its engine thread, and opens the
    /// device anew, as another process on the shared device. (The
    /// parent's entry is left alone: dropping a context stops and joins
    /// its engine thread.)
    pub fn open_shared(&self) -> Result<Context> {
        type Open = Vec<(Device, std::sync::Weak<ContextInner>, u32)>;
        static OPEN: parking_lot::Mutex<Open> = parking_lot::Mutex::new(Vec::new());
        let mut open = OPEN.lock();
        let me = std::process::id();
        if open.iter().any(|e| e.2 != me) {
            let (mine, inherited): (Open, Open) = open.drain(..).partition(|e| e.2 == me);
            std::mem::forget(inherited);
            *open = mine;
        }
        open.retain(|(_, w, _)| w.strong_count() > 0);
        if let Some(inner) = open
            .iter()
            .find(|(d, _, _)| d == self)
            .and_then(|(_, w, _)| w.upgrade())
        {
            return Ok(Context { inner });
        }
        let ctx = self.open()?;
        open.push((self.clone(), Arc::downgrade(&ctx.inner), me));
        Ok(ctx)
    }
}

impl Context {
    /// Another context on the same open device (a second `ibv_open_device`
    /// in the process): it shares the engine, the address and the
    /// connection manager, and has asynchronous events of its own — its
    /// own descriptor ([`Context::async_fd`]), on which the events of the
    /// QPs, CQs and SRQs made through it arrive, as with the kernel's
    /// contexts.
    pub fn new_context(&self) -> Result<Context> {
        Ok(Context {
            inner: Arc::new(ContextInner {
                device: self.inner.device.clone(),
                face: self.inner.face.new_context()?,
                cm: self.inner.cm.clone(),
            }),
        })
    }
}

pub(crate) struct ContextInner {
    pub device: Device,
    /// The provider's face: engine, keys, limits, counters, events.
    pub face: face::Device,
    pub cm: Arc<CmPort>,
}

/// An open device (`struct ibv_context`). Clones share it; the engine stops
/// when the last clone and every object made from it are dropped.
///
/// ```
/// use uroce_verbs::Device;
/// let ctx = Device::new("doc1", "127.70.1.1".parse().unwrap()).open().unwrap();
/// let port = ctx.query_port(1).unwrap();
/// assert_eq!(port.gid_tbl_len, 16); // entries 0 and 1 hold the GID
/// let gid = ctx.query_gid(1, 1).unwrap(); // index 1: where rxe keeps it
/// assert!(matches!(ctx.query_gid(1, 2), Err(uroce_verbs::Error::NoData(_))));
/// assert_eq!(gid.gid_type, "RoCE v2");
/// assert_eq!(&gid.gid[10..], &[0xff, 0xff, 127, 70, 1, 1]); // IPv4-mapped
/// ```
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Context({} on {})",
            self.inner.device.name(),
            self.inner.device.ip()
        )
    }
}

/// Device attributes (`ibv_device_attr`, the fields RoCE uses).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_res_rd_atom: u32,
    /// `IBV_ATOMIC_HCA`: atomics are atomic with respect to this device's
    /// own accesses (local and remote), as a NIC's are.
    pub atomic_cap: u32,
    pub max_srq: u32,
    pub max_mw: u32,
    pub max_ah: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub max_total_mcast_qp_attach: u32,
    pub max_pkeys: u16,
    pub phys_port_cnt: u8,
    pub max_inline_data: u32,
}

/// Port attributes (`ibv_port_attr`, the fields RoCE uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct PortAttr {
    /// 4 = IBV_PORT_ACTIVE.
    pub state: u32,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub max_msg_sz: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    /// 2 = IBV_LINK_LAYER_ETHERNET.
    pub link_layer: u8,
    /// The interface MTU behind the address.
    pub netdev_mtu: u32,
}

/// A GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID: the device's IP as IPv6 (IPv4-mapped for IPv4).
    pub gid: [u8; 16],
    /// "RoCE v2".
    pub gid_type: &'static str,
    /// The network interface that holds the device's address (0: none).
    pub ndev_ifindex: u32,
}

impl Context {
    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }
    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        let guid = self.inner.device.guid();
        DeviceAttr {
            fw_ver: FW_VER.into(),
            node_guid: guid,
            sys_image_guid: guid,
            max_mr_size: u64::MAX,
            page_size_cap: 4096,
            vendor_id: 0xffffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: Resource::Qp.max(),
            max_qp_wr: MAX_QP_WR,
            max_sge: MAX_SGE,
            max_cq: Resource::Cq.max(),
            max_cqe: MAX_CQE,
            max_mr: Resource::Mr.max(),
            max_pd: Resource::Pd.max(),
            max_qp_rd_atom: MAX_RD_ATOM as u32,
            max_qp_init_rd_atom: MAX_RD_ATOM as u32,
            max_res_rd_atom: MAX_RD_ATOM as u32 * (1 << 16),
            atomic_cap: 1,
            max_srq: Resource::Srq.max(),
            max_mw: Resource::Mw.max(),
            max_ah: Resource::Ah.max(),
            max_mcast_grp: MAX_MCAST_GRP as u32,
            max_mcast_qp_attach: MAX_MCAST_QP_ATTACH as u32,
            max_total_mcast_qp_attach: MAX_TOTAL_MCAST_QP_ATTACH as u32,
            max_pkeys: 1,
            phys_port_cnt: 1,
            max_inline_data: MAX_INLINE,
        }
    }
    /// `ibv_query_port` (port 1 only).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        Ok(PortAttr {
            active_mtu: self.inner.face.active_mtu(),
            ..self.inner.device.query_port(port)?
        })
    }
    /// `ibv_query_gid_ex`: entries 0 and 1 ([`GID_ENTRIES`]) hold the
    /// device's RoCEv2 GID (index 1 is where kernel rxe keeps it); the
    /// rest of the table ([`GID_TABLE_LEN`]) is empty: [`Error::NoData`]
    /// (ENODATA), as the kernel answers for an empty entry.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry> {
        self.inner.device.query_gid(port, index)
    }
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let pd = self.inner.face.new_pd()?;
        Ok(ProtectionDomain::new(self.clone(), pd))
    }
    /// `ibv_create_cq` with at least `cqe` entries.
    pub fn create_cq(&self, cqe: u32) -> Result<CompletionQueue> {
        self.create_cq_with(cqe, 0, None)
    }
    /// `ibv_create_cq` with a `cq_context` value (returned with completion
    /// events) and a completion channel.
    pub fn create_cq_with(
        &self,
        cqe: u32,
        cq_context: u64,
        channel: Option<&crate::CompChannel>,
    ) -> Result<CompletionQueue> {
        CompletionQueue::new(self.clone(), cqe, cq_context, channel)
    }
    /// The device's connection manager port: QP1's agent, shared by
    /// every context on the device (for the rdma_cm layer above).
    pub fn cm_port(&self) -> &Arc<CmPort> {
        &self.inner.cm
    }
    /// The port's active MTU (what [`Context::query_port`] reports as
    /// `active_mtu`, without the rest).
    pub fn active_mtu(&self) -> Mtu {
        self.inner.face.active_mtu()
    }
    /// Whether the caller runs on the device's engine thread (inside a
    /// callback it makes, such as a [`CmLayer`](crate::CmLayer)'s): a
    /// wait for the engine there would never end.
    pub fn on_engine_thread(&self) -> bool {
        self.inner.face.on_own_thread()
    }
    /// Waits for one whole pass of the device's engine: what was queued
    /// before the call has been sent.
    pub fn settle(&self) -> Result<()> {
        Ok(self.inner.face.settle()?)
    }
    /// Sends what the device has queued now, from the calling thread,
    /// after any engine pass in progress; waits at most `wait`. False if
    /// it did not get to send.
    pub fn flush(&self, wait: std::time::Duration) -> bool {
        self.inner.face.flush(wait)
    }
    /// The batched I/O the device's engine uses (UDP GSO and GRO on or
    /// off).
    pub fn io_path(&self) -> IoPath {
        self.inner.face.io_path()
    }
    /// The device's counters (like rxe's hw_counters).
    pub fn counters(&self) -> CounterSnapshot {
        self.inner.face.counters()
    }
    /// Writes every packet this device sends and receives, as whole
    /// Ethernet/IP/UDP frames, to a pcap file (replacing a capture in
    /// progress). `UROCE_PCAP` does the same from the start.
    pub fn start_capture(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        Ok(self.inner.face.capture(Some(path.as_ref()))?)
    }
    /// Stops capturing and closes the file.
    pub fn stop_capture(&self) -> Result<()> {
        Ok(self.inner.face.capture(None)?)
    }
    /// Injects loss, duplication, corruption, delay and reordering into
    /// everything this device sends (`None`: a clean network). The
    /// environment variable `UROCE_FAULTS` does the same from the start.
    pub fn set_faults(&self, faults: Option<Faults>) -> Result<()> {
        Ok(self.inner.face.set_faults(faults)?)
    }
}
