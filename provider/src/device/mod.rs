//! The provider's one face to the verbs layer.
//!
//! A [`Device`] is an open uroce device: its engine (the UDP driver and
//! its thread), its key table, its limits, counters and asynchronous
//! events. Everything the verbs layer (`uroce-verbs`, and through it the C
//! library) does to the provider goes through it and the handles it makes:
//! [`CqHandle`] (`cq.rs`), [`SrqHandle`] (`srq.rs`), [`QpHandle`]
//! (`qp.rs`), [`PdHandle`], [`MrHandle`], [`MwHandle`] and [`AhHandle`]
//! (`pd.rs`) and [`CmHandle`] (`cm.rs`); what `uroce stat` lists of the
//! device is kept in `stat.rs`. The face builds the provider's own
//! configurations and queues (a QP's `QpConfig`, send and receive queues,
//! its published state), checks every device limit once, and touches the
//! engine once per post. What crosses it besides the handles are the
//! shared value types: [`crate::types`], [`crate::qp_attr`],
//! [`crate::counters::CounterSnapshot`], and the ones re-exported here
//! ([`MwType`], [`MwBind`], [`MemError`], [`AsyncEvent`], [`CompChannel`],
//! [`Faults`], the CM's in [`cm`], ...).
//!
//! As quinn's `Endpoint` and `Connection` are to `quinn-proto`: the users
//! of the face never name `transport::` or `engine::`, which are private
//! (the fuzzer and the tests reach them through `sans_io`, feature
//! `testing`).
//!
//! ```
//! use uroce_provider::device::{Device, QpSpec};
//! use uroce_provider::qp_attr::QpCap;
//! use uroce_provider::types::QpType;
//! let dev = Device::open("127.71.0.1".parse().unwrap()).unwrap();
//! let cq = dev.create_cq(16, None, 0).unwrap();
//! let cap = QpCap { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
//! let pd = dev.alloc_pd();
//! let qp = dev
//!     .create_qp(&QpSpec { qp_type: QpType::Rc, pd, send_cq: &cq, recv_cq: &cq, srq: None, cap, sq_sig_all: false })
//!     .unwrap();
//! assert_eq!(qp.state(), uroce_provider::types::QpState::Reset);
//! ```

use crate::counters::CounterSnapshot;
use crate::diag::stat::DeviceState;
use crate::engine::Engine;
use crate::memory::KeyTable;
use crate::qp_attr::{CapError, ModifyLimits};
use crate::quota::{Quota, QuotaFull, Slot};
use crate::transport::QueueAllocError;
use crate::types::Mtu;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

pub use crate::cm::gsi::Sink as CmSink;
pub use crate::cm::Nanos;
pub use crate::endpoint::{
    McastError, MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH, MULTICAST_QPN,
};
pub use crate::engine::config::{
    active_mtu, devices_from_env, interface_index, interface_mtu, interface_of, parse_devices,
    ConfigError, DeviceConfig, DEVICES_ENV,
};
pub use crate::engine::share::{claim_port, port_holder, PortAddr, PortClaim};
pub use crate::engine::{EngineError, IoPath, SnapshotHandle};
pub use crate::qp_attr::{LimitError, MAX_INLINE, MAX_QP_WR, MAX_SGE};
pub use crate::transport::ud::grh_source;
pub use crate::transport::PostError;

/// The most completions a CQ holds.
pub const MAX_CQE: u32 = 1 << 20;
/// The most RDMA READs and atomics a QP may have outstanding, each way.
pub const MAX_RD_ATOM: u8 = 128;

/// The environment variable that turns on strict source ports for every
/// RC and UC QP created afterwards (`1`): see
/// the transport's `QpConfig::strict_source_port`.
pub const STRICT_SOURCE_PORT_ENV: &str = "UROCE_STRICT_SOURCE_PORT";

fn strict_source_port() -> bool {
    std::env::var(STRICT_SOURCE_PORT_ENV).is_ok_and(|v| v.trim() == "1")
}

/// A context's asynchronous event queue (an eventfd).
fn new_event_queue() -> Result<AsyncEvents> {
    AsyncEvents::new().map_err(|_| DeviceError::NoMemory("no eventfd for the async event queue"))
}

/// Why the device refused a request, in the classes verbs reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// A bad argument or a request beyond a limit (EINVAL).
    #[error("{0}")]
    Invalid(String),
    /// Out of resources (ENOMEM): a full work queue, memory.
    #[error("{0}")]
    NoMemory(&'static str),
    /// Something the device does not do (EOPNOTSUPP).
    #[error("{0}")]
    NotSupported(&'static str),
    /// The object is in use (EBUSY).
    #[error("{0}")]
    Busy(&'static str),
    /// The engine's answer to a control call.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<PostError> for DeviceError {
    fn from(e: PostError) -> DeviceError {
        match e {
            PostError::QueueFull => DeviceError::NoMemory("work queue full"),
            other => DeviceError::Invalid(other.to_string()),
        }
    }
}

/// `From` for the errors that become one kind of `DeviceError` whatever
/// they hold: EINVAL with the error's words, or ENOMEM with fixed words.
macro_rules! device_error_from {
    ($($from:ty => $kind:ident $(($words:literal))?;)+) => {
        $(impl From<$from> for DeviceError {
            #[allow(unused_variables)]
            fn from(e: $from) -> DeviceError {
                device_error_from!(@$kind e $($words)?)
            }
        })+
    };
    (@Invalid $e:ident) => { DeviceError::Invalid($e.to_string()) };
    (@NoMemory $e:ident $words:literal) => { DeviceError::NoMemory($words) };
}

device_error_from! {
    QueueAllocError => NoMemory("cannot allocate the queue's memory");
    CapError => Invalid;
    QuotaFull => NoMemory("the device holds as many objects of this kind as it advertises");
    LimitError => Invalid;
}

/// A result of the face.
pub type Result<T> = std::result::Result<T, DeviceError>;

pub mod cm;
mod cq;
mod pd;
mod qp;
mod srq;
mod stat;

pub use cm::CmHandle;
pub use cq::CqHandle;
pub use pd::{AhHandle, MrHandle, MwHandle, PdHandle};
pub use qp::{Posted, QpHandle, QpSpec};
pub use srq::SrqHandle;

// The value types the face's calls take and give, from the modules that
// define them (which are the provider's own).
pub use crate::cq::{clock_ns, wallclock_ns, CompChannel, CLOCK_KHZ};
pub use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventType, Semaphore};
pub use crate::memory::range::check_user_range;
pub use crate::memory::{MemError, MwBind, MwType, PdId};
pub use crate::net::faults::Faults;
pub use crate::quota::Resource;
// Helpers of the engine the layers above use for their own sockets and
// threads: a kernel UDP socket (never an interposed rsocket) and a thread
// that starts with every signal blocked.
pub use crate::engine::kernel_udp_socket;
pub use crate::threads::spawn as spawn_thread;
pub use cq::cq_event_of;
use stat::Registry;

struct Shared {
    engine: Engine,
    keys: Arc<KeyTable>,
    ip: IpAddr,
    active_mtu: Mtu,
    next_pd: AtomicU32,
    qpns: Mutex<HashSet<u32>>,
    quota: Arc<Quota>,
    /// What `uroce stat` shows of the device.
    reg: Arc<Registry>,
}

/// An open device (see the module docs). Clones share it; its engine
/// stops when the last clone, and every handle made from it, is dropped.
///
/// A handle belongs to one context (`ibv_context`): the asynchronous
/// events of the CQs, SRQs and QPs made through it go to that context's
/// queue. Clones are the same context; [`Device::new_context`] makes
/// another on the same engine.
#[derive(Clone)]
pub struct Device {
    shared: Arc<Shared>,
    events: Arc<AsyncEvents>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.shared.ip)
    }
}

impl Device {
    /// Binds UDP 4791 on `ip` and starts the device's engine. Faults named
    /// by `UROCE_FAULTS` apply to everything it sends.
    ///
    /// The first device a process opens starts its state socket for
    /// `uroce stat` ([`crate::diag::stat`]; not with `UROCE_STAT=0`).
    pub fn open(ip: IpAddr) -> Result<Device> {
        crate::diag::open();
        let keys = Arc::new(KeyTable::new());
        let engine = Engine::start(ip, keys.clone())?;
        let reg = Registry::new(&engine, keys.clone(), ip);
        let dev = Device {
            shared: Arc::new(Shared {
                engine,
                keys,
                ip,
                active_mtu: active_mtu(ip),
                next_pd: AtomicU32::new(1),
                qpns: Mutex::new(HashSet::new()),
                quota: Arc::default(),
                reg: reg.clone(),
            }),
            events: Arc::new(new_event_queue()?),
        };
        reg.publish();
        Ok(dev)
    }

    /// Names the device (`uroce stat` shows the name; the first one
    /// given stays).
    pub fn set_name(&self, name: &str) {
        let _ = self.shared.reg.name.set(name.to_owned());
    }
    /// The device's name (its address until [`Device::set_name`]).
    pub fn name(&self) -> String {
        self.shared.reg.name()
    }
    /// The device's state as `uroce stat` shows it.
    pub fn state(&self) -> DeviceState {
        let qps = self
            .engine()
            .snapshot_qps(crate::diag::stat::ENGINE_WAIT)
            .unwrap_or_default();
        self.shared.reg.state(qps)
    }

    /// Another context on this open device: the same engine, keys and
    /// objects' numbering, with an asynchronous event queue (and
    /// descriptor) of its own, as each `open` of a kernel uverbs device
    /// is a file of its own. The kernel reports an event about a QP, CQ
    /// or SRQ to the context that created it; so does uroce. (A kernel
    /// device also raises port and device events, to every context; a
    /// uroce port never changes state, so there are none.)
    pub fn new_context(&self) -> Result<Device> {
        Ok(Device {
            shared: self.shared.clone(),
            events: Arc::new(new_event_queue()?),
        })
    }

    fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// The device's address.
    pub fn ip(&self) -> IpAddr {
        self.shared.ip
    }
    /// The port's active MTU (what the interface behind the address
    /// carries).
    pub fn active_mtu(&self) -> Mtu {
        self.shared.active_mtu
    }
    /// A place for one more object of kind `r` (ENOMEM once the device
    /// holds [`Resource::max`] of them); the object keeps it while it lives.
    fn take_slot(&self, r: Resource) -> Result<Slot> {
        Ok(self.shared.quota.take(r)?)
    }
    /// The limits modify-QP checks attributes against.
    pub fn modify_limits(&self) -> ModifyLimits {
        ModifyLimits {
            max_rd_atom: MAX_RD_ATOM,
            active_mtu: self.shared.active_mtu,
            privileged_qkey: false,
        }
    }
    /// The batched I/O the engine uses (UDP GSO and GRO on or off).
    pub fn io_path(&self) -> IoPath {
        self.engine().io_path()
    }
    /// The device's counters now.
    pub fn counters(&self) -> CounterSnapshot {
        self.engine().counters().snapshot()
    }
    /// This context's asynchronous event queue.
    pub fn events(&self) -> &Arc<AsyncEvents> {
        &self.events
    }
    /// Injects faults into everything the device sends (`None`: a clean
    /// network).
    pub fn set_faults(&self, faults: Option<Faults>) -> Result<()> {
        Ok(self.engine().set_faults(faults)?)
    }
    /// Starts writing every packet sent and received to a pcap file
    /// (replacing a capture in progress), or stops (`None`).
    pub fn capture(&self, path: Option<&std::path::Path>) -> Result<()> {
        Ok(self.engine().capture(path)?)
    }
    /// Returns once the engine has made a whole pass after the call (see
    /// `Engine::settle`).
    pub fn settle(&self) -> Result<()> {
        Ok(self.engine().settle()?)
    }
    /// Sends what the device has queued now, from the calling thread,
    /// after any pass in progress (see `Engine::flush`): waits at most
    /// `wait`; false if it did not get to send.
    pub fn flush(&self, wait: std::time::Duration) -> bool {
        self.engine().flush(wait)
    }
    /// Whether the caller runs on the device's engine thread (inside a
    /// callback it makes).
    pub fn on_own_thread(&self) -> bool {
        self.engine().on_own_thread()
    }
    /// What an empty poll does: one pass of the device on the calling
    /// thread if nobody else drives it. False if the device was busy or
    /// nothing happened (the caller should yield).
    pub fn progress(&self) -> bool {
        self.engine().progress()
    }
}

#[cfg(test)]
mod tests {
    use super::qp::post_each;
    use super::*;
    use crate::qp_attr::QpCap;
    use crate::types::{QpType, RecvWr, SendWr, Sge, WrOpcode};

    #[test]
    fn an_endless_list_stops_at_the_queue_depth() {
        let dev = Device::open("127.101.0.1".parse().unwrap()).unwrap();
        let pd = dev.alloc_pd();
        let srq = dev.create_srq(pd, 8, 1).unwrap();
        let mut read = 0;
        // An endless list: ENOMEM at the 9th, which is never read.
        let (i, e) = srq
            .post_recv_with(std::iter::repeat(()), |()| {
                read += 1;
                Ok::<_, DeviceError>(RecvWr {
                    wr_id: read,
                    sg_list: Default::default(),
                })
            })
            .unwrap_err();
        assert_eq!((i, read), (8, 8));
        assert!(matches!(e, DeviceError::NoMemory(_)), "{e}");
        assert_eq!(srq.len(), 8);
        // A full queue refuses the first WR of the next list the same way.
        let one = RecvWr {
            wr_id: 9,
            sg_list: Default::default(),
        };
        let (i, e) = srq.post_recv(std::slice::from_ref(&one)).unwrap_err();
        assert_eq!(i, 0);
        assert!(matches!(e, DeviceError::NoMemory(_)), "{e}");
        // The caller's refusal of an item is its error, at its index.
        let refuse_two = |x| match x {
            2 => Err(DeviceError::Busy("two")),
            x => Ok(x),
        };
        let (i, e) = post_each([1, 2, 3], 8, refuse_two, |_| Ok(()))
            .1
            .unwrap_err();
        assert_eq!(i, 1);
        assert!(matches!(e, DeviceError::Busy("two")), "{e}");
    }

    fn cap() -> QpCap {
        QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 16,
        }
    }

    #[test]
    fn limits_are_refused_before_anything_is_allocated() {
        let dev = Device::open("127.71.0.2".parse().unwrap()).unwrap();
        let cq = dev.create_cq(8, None, 0).unwrap();
        let pd = dev.alloc_pd();
        let mut spec = QpSpec {
            qp_type: QpType::Rc,
            pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCap {
                max_recv_wr: u32::MAX,
                ..cap()
            },
            sq_sig_all: false,
        };
        // A queue of u32::MAX WRs is never allocated: EINVAL first.
        let e = dev.create_qp(&spec).unwrap_err();
        assert!(matches!(e, DeviceError::Invalid(_)), "{e}");
        assert!(dev.shared.qpns.lock().is_empty(), "no QP number taken");
        assert!(dev.create_cq(MAX_CQE + 1, None, 0).is_err());
        assert!(dev.create_srq(pd, MAX_QP_WR + 1, 1).is_err());
        spec.cap = cap();
        let qp = dev.create_qp(&spec).unwrap();
        // Posting checks the state first, then each WR's rules.
        let mut wr = SendWr::new(1, WrOpcode::Send);
        let (i, e) = qp.post_send(std::slice::from_ref(&wr)).unwrap_err();
        assert_eq!(i, 0);
        assert!(e.to_string().contains("RTS"), "{e}");
        wr.sg_list.push(Sge::default());
        wr.sg_list.push(Sge::default());
        assert!(qp.check_send_sges(2).is_err());
        assert!(qp.check_send_sges(1).is_ok());
        assert!(qp.check_inline(17).is_err());
        assert_eq!(
            qp.check_inline(17).unwrap_err().to_string(),
            "17 bytes of inline data exceed max_inline_data (16)"
        );
    }
}
