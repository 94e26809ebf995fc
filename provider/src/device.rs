//! The provider's one face to the verbs layer.
//!
//! A [`Device`] is an open uroce device: its engine (the UDP driver and
//! its thread), its key table, its limits, counters and asynchronous
//! events. Everything the verbs layer (`uroce-verbs`, and through it the C
//! library) does to the provider goes through it and the handles it makes:
//! [`CqHandle`], [`SrqHandle`], [`QpHandle`] and [`CmLink`]. The face
//! builds the provider's own configurations and queues (a QP's
//! `QpConfig`, send and receive queues, its published state), checks every
//! device limit once, and touches the engine once per post. What crosses
//! it besides the handles are the shared value types: [`crate::types`],
//! [`crate::qp_attr`], [`crate::memory`]'s regions and windows,
//! [`crate::events`], [`crate::counters::CounterSnapshot`] and
//! [`crate::net::faults::Faults`].
//!
//! As quinn's `Endpoint` and `Connection` are to `quinn-proto`: the users
//! of the face never name `transport::` or `engine::`.
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

use crate::cm::gsi::GsiQp;
use crate::cm::{CmAgent, CmConfig};
use crate::counters::CounterSnapshot;
use crate::cq::CompChannel;
use crate::cq::CqInner;
use crate::diag::check::{self, Category, CqLedger, CqOwing, QpLedger};
use crate::diag::stat::{CqState, DeviceState, MrState, PdState, QpStat, SrqState};
use crate::engine::QpSnapshot;
use crate::engine::{can_post_send, Engine, Kicker};
use crate::events::AsyncEvents;
use crate::memory::{Backing, KeyTable, MrInner, MwInner, MwType, PdId};
use crate::net::faults::Faults;
use crate::qp_attr::{AttrMask, CapError, ModifyLimits, QpAttr, QpCap};
use crate::quota::{Quota, QuotaFull, Resource, Slot};
use crate::transport::{new_qp, QpConfig, QueueAllocError, RecvQueue, SendQueue, StateCell};
use crate::types::{Access, Mtu, QpState, QpType, RecvWr, SendFlags, SendWr, Wc};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

pub use crate::cm::gsi::Sink as CmSink;
pub use crate::cm::Nanos;
pub use crate::endpoint::{
    McastError, MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_TOTAL_MCAST_QP_ATTACH, MULTICAST_QPN,
};
pub use crate::engine::config::{
    active_mtu, devices_from_env, interface_index, interface_mtu, interface_of, parse_devices,
    ConfigError, DeviceConfig, DEVICES_ENV,
};
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
/// [`QpConfig::strict_source_port`].
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

impl From<QueueAllocError> for DeviceError {
    fn from(_: QueueAllocError) -> DeviceError {
        DeviceError::NoMemory("cannot allocate the queue's memory")
    }
}

impl From<CapError> for DeviceError {
    fn from(e: CapError) -> DeviceError {
        DeviceError::Invalid(e.to_string())
    }
}

impl From<QuotaFull> for DeviceError {
    fn from(_: QuotaFull) -> DeviceError {
        DeviceError::NoMemory("the device holds as many objects of this kind as it advertises")
    }
}

impl From<LimitError> for DeviceError {
    fn from(e: LimitError) -> DeviceError {
        DeviceError::Invalid(e.to_string())
    }
}

/// A result of the face.
pub type Result<T> = std::result::Result<T, DeviceError>;

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

/// What `uroce stat` shows of a device, apart from the device: the state
/// server holds this, never the device (a device it held would stay
/// bound to its address after the program closed it).
struct Registry {
    keys: Arc<KeyTable>,
    ip: IpAddr,
    active_mtu: Mtu,
    counters: Arc<crate::counters::Counters>,
    io: IoPath,
    snapshots: SnapshotHandle,
    /// The name the verbs layer gave the device (`uroce0`).
    name: std::sync::OnceLock<String>,
    /// What `uroce stat` lists of the device's objects.
    objects: Mutex<Objects>,
}

/// The device's objects as `uroce stat` lists them (regions are in the
/// key table): entries the objects remove when they go (QPs, PDs) or
/// that lapse with them (CQs, SRQs).
#[derive(Default)]
struct Objects {
    pds: BTreeSet<PdId>,
    cqs: Vec<Weak<CqInner>>,
    srqs: Vec<SrqEntry>,
    qps: BTreeMap<u32, QpEntry>,
}

struct SrqEntry {
    rq: Weak<RecvQueue>,
    pd: PdId,
    max_wr: u32,
    max_sge: u32,
}

struct QpEntry {
    qp_type: QpType,
    pd: PdId,
    cap: QpCap,
    sq: Arc<SendQueue>,
    rq: Arc<RecvQueue>,
    send_cq: u32,
    recv_cq: u32,
    srq: Option<u32>,
    /// Its published state, with its explained errors.
    state: Arc<StateCell>,
}

/// Every device this process has open, for `uroce stat`.
static OPEN: Mutex<Vec<Weak<Registry>>> = Mutex::new(Vec::new());

/// The state of every device this process has open (see
/// [`crate::diag::stat`]).
///
/// The server's thread holds no device, only its [`Registry`]: a program
/// that closes a device and opens its address again at once must not
/// find the address still bound because `uroce stat` asked.
pub(crate) fn live_states() -> Vec<DeviceState> {
    let asked: Vec<_> = {
        let mut open = OPEN.lock();
        open.retain(|w| w.strong_count() > 0);
        open.clone()
    }
    .into_iter()
    .filter_map(|w| {
        let answer = w.upgrade()?.snapshots.request().ok();
        Some((w, answer))
    })
    .collect();
    let deadline = std::time::Instant::now() + crate::diag::stat::ENGINE_WAIT;
    asked
        .into_iter()
        .filter_map(|(w, answer)| {
            let qps = answer
                .and_then(|rx| rx.recv_deadline(deadline).ok())
                .unwrap_or_default();
            Some(w.upgrade()?.state(qps))
        })
        .collect()
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
        let reg = Arc::new(Registry {
            keys: keys.clone(),
            ip,
            active_mtu: active_mtu(ip),
            counters: engine.counters().clone(),
            io: engine.io_path(),
            snapshots: engine.snapshot_handle(),
            name: std::sync::OnceLock::new(),
            objects: Mutex::default(),
        });
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
        let mut open = OPEN.lock();
        open.retain(|w| w.strong_count() > 0);
        open.push(Arc::downgrade(&reg));
        drop(open);
        crate::diag::stat::serve_lazily(live_states);
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
    pub fn take_slot(&self, r: Resource) -> Result<Slot> {
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

    // ------------------------------------------------------------ PDs, MRs, MWs

    /// A new protection domain number (not listed by `uroce stat`
    /// unless objects are made in it: see [`Device::new_pd`]).
    pub fn alloc_pd(&self) -> PdId {
        self.shared.next_pd.fetch_add(1, Ordering::Relaxed)
    }
    /// A new protection domain in the device's `max_pd`, listed by
    /// `uroce stat` while the handle lives.
    pub fn new_pd(&self) -> Result<PdHandle> {
        let slot = self.take_slot(Resource::Pd)?;
        let id = self.alloc_pd();
        self.shared.reg.objects.lock().pds.insert(id);
        Ok(PdHandle {
            id,
            reg: Arc::downgrade(&self.shared.reg),
            _slot: slot,
        })
    }

    /// The access rights a region may be registered with: remote write
    /// and remote atomic need local write (IBA 10.6.3.1); there is no
    /// persistent memory (EOPNOTSUPP, as the kernel answers).
    pub fn check_mr_access(access: Access) -> Result<()> {
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(DeviceError::Invalid(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        if access.contains(Access::FLUSH_PERSISTENT) {
            return Err(DeviceError::NotSupported(
                "FLUSH_PERSISTENT: uroce has no persistent memory",
            ));
        }
        Ok(())
    }
    /// Registers a buffer the region takes over.
    pub fn reg_vec(&self, pd: PdId, buf: Vec<u8>, access: Access) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        Ok(self.shared.keys.register_vec(pd, buf, access))
    }
    /// Registers `len` zeroed page-aligned bytes.
    pub fn reg_zeroed(&self, pd: PdId, len: usize, access: Access) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        self.shared
            .keys
            .register_zeroed(pd, len, access)
            .ok_or(DeviceError::NoMemory("memory allocation"))
    }
    /// Registers memory the caller owns, addressed through its keys from
    /// `iova` (`ibv_reg_mr_iova`; from 0 when `access` is zero-based).
    ///
    /// # Safety
    /// As [`KeyTable::register`] with external backing: `addr` is valid
    /// for reads and writes of `len` bytes until the region is
    /// deregistered.
    pub unsafe fn reg_raw(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        let ptr = NonNull::new(addr).ok_or_else(|| DeviceError::Invalid("null address".into()))?;
        // SAFETY: the caller's promise above.
        Ok(unsafe {
            self.shared
                .keys
                .register(pd, ptr, len, iova, access, Backing::External)
        })
    }
    /// Re-registers a region with a new PD, access and/or memory (refused
    /// while memory windows are bound to it).
    ///
    /// # Safety
    /// As [`KeyTable::reregister`]; `memory` (address, length) as
    /// [`Device::reg_raw`] for the new memory.
    pub unsafe fn rereg(
        &self,
        old: &MrInner,
        pd: PdId,
        access: Access,
        memory: Option<(*mut u8, usize)>,
    ) -> Result<Arc<MrInner>> {
        let translation = match memory {
            Some((addr, len)) => {
                let ptr = NonNull::new(addr)
                    .ok_or_else(|| DeviceError::Invalid("null address".into()))?;
                Some((ptr, len, addr as u64, Backing::External))
            }
            None => None,
        };
        Self::check_mr_access(access)?;
        if old.bound_windows() > 0 {
            return Err(DeviceError::Busy("memory windows are bound to the region"));
        }
        // SAFETY: the caller's promise.
        Ok(unsafe { self.shared.keys.reregister(old, pd, access, translation) })
    }
    /// Deregisters a region: its keys stop working, and no copy into or
    /// out of it is in progress when this returns.
    pub fn dereg(&self, mr: &MrInner) {
        if check::any() {
            check::deregistering(&self.shared.keys, mr.lkey());
        }
        self.shared.keys.deregister(mr);
    }
    /// An unbound memory window.
    pub fn alloc_mw(&self, pd: PdId, kind: MwType) -> Arc<MwInner> {
        self.shared.keys.alloc_mw(pd, kind)
    }
    /// Deallocates a window (its R_Key stops working at once).
    pub fn dealloc_mw(&self, mw: &MwInner) {
        self.shared.keys.dealloc_mw(mw);
    }

    // ------------------------------------------------------------ CQs

    /// The depths a CQ may have: 1..=[`MAX_CQE`].
    pub fn check_cqe(cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(DeviceError::Invalid(format!(
                "cqe {cqe}: must be 1..={MAX_CQE}"
            )));
        }
        Ok(())
    }

    /// A completion queue of at least `cqe` entries; its events go to
    /// `channel` with `context`.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<CompChannel>>,
        context: u64,
    ) -> Result<CqHandle> {
        Self::check_cqe(cqe)?;
        let slot = self.take_slot(Resource::Cq)?;
        let inner =
            CqInner::with_channel(cqe as usize, channel, context, Some(self.events().clone()));
        let mut objects = self.shared.reg.objects.lock();
        objects.cqs.retain(|c| c.strong_count() > 0);
        objects.cqs.push(Arc::downgrade(&inner));
        drop(objects);
        Ok(CqHandle {
            dev: self.clone(),
            inner,
            ledger: Arc::default(),
            _slot: slot,
        })
    }

    // ------------------------------------------------------------ SRQs

    /// A shared receive queue of `max_wr` WRs of at most `max_sge` SGEs
    /// in protection domain `pd`.
    pub fn create_srq(&self, pd: PdId, max_wr: u32, max_sge: u32) -> Result<SrqHandle> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        if max_wr == 0 || max_wr > MAX_QP_WR {
            return Err(DeviceError::Invalid(format!(
                "max_wr {max_wr}: must be 1..={MAX_QP_WR}"
            )));
        }
        if max_sge > MAX_SGE {
            return Err(DeviceError::Invalid(format!(
                "max_sge {max_sge} exceeds the device's {MAX_SGE}"
            )));
        }
        let slot = self.take_slot(Resource::Srq)?;
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        let srq = SrqHandle {
            _slot: slot,
            _dev: self.clone(),
            pd,
            rq: Arc::new(RecvQueue::new_srq(max_wr, handle, self.events().clone())?),
            handle,
            max_wr,
            max_sge: max_sge.max(1),
        };
        let mut objects = self.shared.reg.objects.lock();
        objects.srqs.retain(|e| e.rq.strong_count() > 0);
        objects.srqs.push(SrqEntry {
            rq: Arc::downgrade(&srq.rq),
            pd,
            max_wr: srq.max_wr,
            max_sge: srq.max_sge,
        });
        drop(objects);
        Ok(srq)
    }

    // ------------------------------------------------------------ QPs

    /// A random unused 24-bit QP number (never 0 or 1, the special QPs),
    /// in this process's slot of a shared device.
    fn alloc_qpn(&self) -> u32 {
        let (base, mask) = self.engine().qpn_space();
        let mut used = self.shared.qpns.lock();
        loop {
            let q = base | (rand::random::<u32>() & mask);
            if q > 1 && used.insert(q) {
                return q;
            }
        }
    }
    fn free_qpn(&self, qpn: u32) {
        self.shared.qpns.lock().remove(&qpn);
    }

    /// A queue pair in RESET, on the engine. With an SRQ it has no
    /// receive queue of its own (its receive capacities read 0).
    pub fn create_qp(&self, spec: &QpSpec<'_>) -> Result<QpHandle> {
        let mut cap = spec.cap;
        // An SRQ of another PD is allowed (IBA 10.2.9.1: the SRQ's PD
        // checks its receive WRs; the kernel does not compare them).
        if spec.srq.is_some() {
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        }
        // The capacities are checked (QpCap::check, the rule the factory
        // applies too) before the queues are allocated at their sizes
        // and a QP number is taken.
        cap.check()?;
        let slot = self.take_slot(Resource::Qp)?;
        let mut sq = SendQueue::new(cap.max_send_wr.max(1))?;
        let rq = match spec.srq {
            Some(srq) => srq.rq.clone(),
            None => Arc::new(RecvQueue::new(cap.max_recv_wr.max(1))?),
        };
        let qpn = self.alloc_qpn();
        let owing = |cq: &CqHandle| CqOwing::new(cq.inner.clone(), cq.ledger.clone());
        let ledger = QpLedger::new(
            &self.shared.keys,
            qpn,
            spec.pd,
            &cap,
            spec.sq_sig_all,
            [owing(spec.send_cq), owing(spec.recv_cq)],
        );
        sq.attach_ledger(ledger.clone());
        let sq = Arc::new(sq);
        let state = Arc::new(StateCell::default());
        let engine = self.engine();
        let cfg = QpConfig {
            qpn,
            pd: spec.pd,
            recv_pd: spec.srq.map_or(spec.pd, |s| s.pd),
            keys: self.shared.keys.clone(),
            send_cq: spec.send_cq.inner.clone(),
            recv_cq: spec.recv_cq.inner.clone(),
            sq: sq.clone(),
            rq: rq.clone(),
            sq_sig_all: spec.sq_sig_all,
            cap,
            local_ip: self.shared.ip,
            src_port: uroce_wire::ROCEV2_UDP_PORT,
            counters: engine.counters().clone(),
            limits: self.modify_limits(),
            events: self.events.clone(),
            strict_source_port: strict_source_port(),
            state: state.clone(),
            observer: crate::observe::Observer::process(),
        };
        // A QP the engine refuses gives its number back.
        let added = new_qp(spec.qp_type, cfg)
            .map_err(DeviceError::from)
            .and_then(|qp| Ok(engine.add_boxed_qp(qp)?));
        if let Err(e) = added {
            self.free_qpn(qpn);
            return Err(e);
        }
        self.shared.reg.objects.lock().qps.insert(
            qpn,
            QpEntry {
                qp_type: spec.qp_type,
                pd: spec.pd,
                cap,
                sq: sq.clone(),
                rq: rq.clone(),
                send_cq: spec.send_cq.handle(),
                recv_cq: spec.recv_cq.handle(),
                srq: spec.srq.map(|s| s.handle),
                state: state.clone(),
            },
        );
        Ok(QpHandle {
            dev: self.clone(),
            qpn,
            qp_type: spec.qp_type,
            cap,
            pd: spec.pd,
            sq,
            rq,
            state,
            srq: spec.srq.is_some(),
            ledger,
            _send_cq: spec.send_cq.inner.clone(),
            _recv_cq: spec.recv_cq.inner.clone(),
            _slot: slot,
        })
    }

    // ------------------------------------------------------------ CM

    /// A connection manager agent for this device (node GUID `guid`),
    /// not yet on the wire: [`Device::attach_cm`] starts QP1 with it. The
    /// link does not keep the device alive.
    pub fn cm_agent(&self, guid: u64) -> CmLink {
        let engine = self.engine();
        CmLink {
            agent: Arc::new(Mutex::new(CmAgent::new(
                CmConfig::from_env(self.shared.ip, guid),
                engine.counters().clone(),
            ))),
            kicker: engine.kicker(),
        }
    }

    /// Starts QP1 (the GSI QP) with `link`'s agent; `sink` receives the
    /// agent's events on the engine thread.
    pub fn attach_cm(&self, link: &CmLink, sink: CmSink) -> Result<()> {
        let engine = self.engine();
        let qp = GsiQp::new(
            link.agent.clone(),
            self.shared.ip,
            engine.counters().clone(),
            Some(sink),
        );
        Ok(engine.add_qp(qp)?)
    }
}

/// The connection manager agent of a device's QP1 (see
/// [`Device::cm_agent`]).
pub struct CmLink {
    agent: Arc<Mutex<CmAgent>>,
    kicker: Kicker,
}

impl std::fmt::Debug for CmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CmLink")
    }
}

impl CmLink {
    /// Runs `f` on the agent at the engine's time, then lets the engine
    /// send what it queued.
    pub fn with_agent<T>(&self, f: impl FnOnce(&mut CmAgent, Nanos) -> T) -> T {
        let now = self.kicker.now();
        let r = f(&mut self.agent.lock(), now);
        self.kicker.kick(uroce_wire::mad::GSI_QPN);
        r
    }
    /// Reads the agent (nothing to send afterwards).
    pub fn peek<T>(&self, f: impl FnOnce(&CmAgent) -> T) -> T {
        f(&self.agent.lock())
    }
}

// ---------------------------------------------------------------- PD

/// A protection domain made by [`Device::new_pd`]: it holds its place in
/// the device's `max_pd` and is listed by `uroce stat` until dropped.
#[derive(Debug)]
pub struct PdHandle {
    id: PdId,
    reg: Weak<Registry>,
    _slot: Slot,
}

impl PdHandle {
    /// Its number.
    pub fn id(&self) -> PdId {
        self.id
    }
}

impl Drop for PdHandle {
    fn drop(&mut self) {
        if let Some(r) = self.reg.upgrade() {
            r.objects.lock().pds.remove(&self.id);
        }
    }
}

// ---------------------------------------------------------------- state

impl Registry {
    fn name(&self) -> String {
        self.name
            .get()
            .cloned()
            .unwrap_or_else(|| self.ip.to_string())
    }

    /// The device as `uroce stat` shows it: its objects from the
    /// registry and the key table, its QPs' attributes and tallies from
    /// the engine (without them if it does not answer in time).
    fn state(&self, qps: Vec<QpSnapshot>) -> DeviceState {
        let live: HashMap<u32, QpSnapshot> = qps.into_iter().map(|q| (q.qpn, q)).collect();
        let mut mrs: Vec<MrState> = self.keys.regions().iter().map(|m| mr_state(m)).collect();
        mrs.sort_by_key(|m| (m.pdn, m.lkey));
        let objects = self.objects.lock();
        let cqs = objects
            .cqs
            .iter()
            .filter_map(Weak::upgrade)
            .map(|c| CqState {
                cqn: c.handle(),
                cqe: c.depth(),
                pending: c.len(),
                unacked_events: c.unacked_events(),
            })
            .collect();
        let srqs: Vec<SrqState> = objects
            .srqs
            .iter()
            .filter_map(|e| {
                let rq = e.rq.upgrade()?;
                Some(SrqState {
                    srqn: rq.srq_handle(),
                    pdn: e.pd,
                    max_wr: e.max_wr,
                    max_sge: e.max_sge,
                    posted: rq.len(),
                    limit: rq.limit(),
                })
            })
            .collect();
        let qps: Vec<QpStat> = objects
            .qps
            .iter()
            .map(|(&qpn, e)| qp_stat(qpn, e, live.get(&qpn)))
            .collect();
        // Every PD handle, and every PD an object names (made with
        // `alloc_pd`).
        let pdns: BTreeSet<PdId> = objects
            .pds
            .iter()
            .copied()
            .chain(mrs.iter().map(|m| m.pdn))
            .chain(qps.iter().map(|q| q.pdn))
            .chain(srqs.iter().map(|s| s.pdn))
            .collect();
        let pds = pdns
            .into_iter()
            .map(|pdn| PdState {
                pdn,
                mrs: mrs.iter().filter(|m| m.pdn == pdn).count(),
                qps: qps.iter().filter(|q| q.pdn == pdn).count(),
                srqs: srqs.iter().filter(|s| s.pdn == pdn).count(),
            })
            .collect();
        DeviceState {
            name: self.name(),
            addr: self.ip.to_string(),
            port: 1,
            port_state: "ACTIVE".into(),
            active_mtu: self.active_mtu.bytes(),
            netdev_mtu: interface_mtu(self.ip),
            io_path: self.io.to_string(),
            pds,
            mrs,
            cqs,
            srqs,
            qps,
            counters: self
                .counters
                .snapshot()
                .entries()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        }
    }
}

fn mr_state(m: &MrInner) -> MrState {
    MrState {
        pdn: m.pd(),
        lkey: m.lkey(),
        rkey: m.rkey(),
        iova: m.iova(),
        length: m.len() as u64,
        access: m
            .access()
            .iter_names()
            .map(|(name, _)| name.to_owned())
            .collect(),
    }
}

/// A QP's line: what the face knows (type, PD, queues) and what the
/// engine said (`live`: state, PSNs, peer, tally).
fn qp_stat(qpn: u32, e: &QpEntry, live: Option<&QpSnapshot>) -> QpStat {
    let attr = live.map(|l| l.attr).unwrap_or_default();
    let tally = live.map(|l| l.tally).unwrap_or_default();
    // RTR gave it a peer (RC, UC; a QP that went to ERR before has none).
    let connected = e.qp_type != QpType::Ud && attr.dest_qp_num != 0;
    let last = tally.last_error;
    QpStat {
        qpn,
        qp_type: format!("{:?}", e.qp_type).to_uppercase(),
        state: match live {
            Some(_) => attr.qp_state.name().into(),
            None => "UNKNOWN".into(),
        },
        pdn: e.pd,
        dest_qpn: attr.dest_qp_num,
        dest_addr: connected.then(|| attr.ah_attr.ip().to_string()),
        path_mtu: attr.path_mtu.bytes(),
        sq_psn: attr.sq_psn,
        rq_psn: attr.rq_psn,
        send_cq: e.send_cq,
        recv_cq: e.recv_cq,
        srq: e.srq,
        sq_wrs: e.sq.outstanding(),
        max_send_wr: e.cap.max_send_wr,
        rq_wrs: if e.srq.is_some() { 0 } else { e.rq.len() },
        max_recv_wr: e.cap.max_recv_wr,
        inflight_psns: live.map_or(0, |l| l.inflight_psns),
        retransmits: tally.retransmits,
        retry_timeouts: tally.retry_timeouts,
        rnr_naks_rcvd: tally.rnr_naks_rcvd,
        seq_naks_rcvd: tally.seq_naks_rcvd,
        last_error_status: last.map(|l| l.status as u32),
        last_error_wr_id: last.map(|l| l.wr_id),
        // The QP's own explanation (which check failed, on which side;
        // `UROCE_EXPLAIN`), else the completion's status and WR. A flush
        // is explained by the error that moved the QP to ERR.
        last_error: e
            .state
            .error_cause()
            .or_else(|| e.state.last_error())
            .map(|x| x.to_string())
            .or_else(|| {
                last.map(|l| {
                    let side = if l.send { "send" } else { "receive" };
                    format!(
                        "{} ({}) on {side} wr_id {:#x}",
                        l.status, l.status as u32, l.wr_id
                    )
                })
            }),
    }
}

// ---------------------------------------------------------------- CQ

/// A completion queue on a device. Polling takes no engine lock.
#[derive(Debug)]
pub struct CqHandle {
    dev: Device,
    inner: Arc<CqInner>,
    /// What the checker counts of the CQ: the completions it owes.
    ledger: Arc<CqLedger>,
    _slot: Slot,
}

impl CqHandle {
    /// Process-unique handle (what completion and CQ_ERR events name).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }
    /// The context value given at creation.
    pub fn context(&self) -> u64 {
        self.inner.context()
    }
    /// True when `channel` is the CQ's completion channel.
    pub fn reports_to(&self, channel: &Arc<CompChannel>) -> bool {
        self.inner.reports_to(channel)
    }
    /// Completions get a timestamp from now on
    /// ([`CqInner::stamp_completions`]).
    pub fn stamp_completions(&self) {
        self.inner.stamp_completions();
    }
    /// Arms the CQ; false if it has no completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> bool {
        self.inner.req_notify(solicited_only)
    }
    /// Acknowledges `n` completion events.
    pub fn ack_events(&self, n: u32) {
        self.inner.ack_events(n);
    }
    /// Completion events delivered and not acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.inner.unacked_events()
    }
    /// The CQ is being destroyed: the checker's last look at it
    /// ([`CqInner::note_destroy`]), and at the completion events taken and
    /// not acknowledged ([`CqInner::note_destroy_unacked`]).
    pub fn note_destroy(&self) {
        self.inner.note_destroy();
        let unacked = self.inner.unacked_events();
        if unacked != 0 {
            self.inner.note_destroy_unacked(unacked);
        }
    }
    /// Capacity.
    pub fn depth(&self) -> usize {
        self.inner.depth()
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    /// Up to `out.len()` completions, oldest first.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let n = self.inner.poll(out);
        if check::any() && n > 0 {
            check::polled(&self.dev.shared.keys, &out[..n]);
        }
        n
    }
    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        let wc = self.inner.poll_one();
        if check::any() {
            if let Some(wc) = &wc {
                check::polled(&self.dev.shared.keys, std::slice::from_ref(wc));
            }
        }
        wc
    }
    /// True once a completion was lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed()
    }
    /// True while a QP uses the CQ.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }
    /// See [`Device::progress`].
    pub fn progress(&self) -> bool {
        self.dev.progress()
    }
    /// Resizes to at least `cqe` entries (1..=[`MAX_CQE`]), after the
    /// engine has processed the work it was handed (so the completions
    /// it makes at once count); refused (EINVAL) while more than `cqe`
    /// completions wait.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        Device::check_cqe(cqe)?;
        // On the engine's own thread (a callback) there is nothing to wait
        // for: it is not processing anything else.
        let _ = self.dev.settle();
        self.inner.resize(cqe as usize).map_err(|waiting| {
            DeviceError::Invalid(format!("cqe {cqe}: {waiting} completions wait in the CQ"))
        })
    }
}

// ---------------------------------------------------------------- SRQ

/// A shared receive queue on a device.
#[derive(Debug)]
pub struct SrqHandle {
    _slot: Slot,
    _dev: Device,
    pd: PdId,
    rq: Arc<RecvQueue>,
    handle: u32,
    max_wr: u32,
    max_sge: u32,
}

impl SrqHandle {
    /// The handle asynchronous events name.
    pub fn handle(&self) -> u32 {
        self.handle
    }
    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }
    /// Capacity in WRs.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }
    /// SGEs per WR.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }
    /// The SGE count rule of this SRQ's WRs (EINVAL beyond `max_sge`):
    /// checked before a caller reads a foreign list, and on posting.
    pub fn check_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        LimitError::check("SGEs", "max_sge", n, self.max_sge)
    }
    /// Posts receive WRs. On error, the WRs before the failing one were
    /// posted; returns the failing index with the error.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, DeviceError)> {
        self.post_recv_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the receive WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most `max_wr` in one call).
    pub fn post_recv_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        post_each(items, self.max_wr as usize, read, |wr| {
            self.check_sges(wr.sg_list.len())?;
            if check::on(Category::Post) {
                let keys = &self._dev.shared.keys;
                check_recv_wr(keys, self.pd, self.handle, &wr);
            }
            Ok(self.rq.post(wr)?)
        })
        .1
    }
    /// Arms the limit (0 disarms); it may not exceed `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.max_wr {
            return Err(DeviceError::Invalid(format!(
                "srq_limit {limit} exceeds max_wr {}",
                self.max_wr
            )));
        }
        self.rq.arm_limit(limit);
        Ok(())
    }
    /// The armed limit (0 once it fired).
    pub fn limit(&self) -> u32 {
        self.rq.limit()
    }
    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.rq.len()
    }
    /// True when no receive WR waits.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }
    /// True while a QP uses the SRQ.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.rq) > 1
    }
}

// ---------------------------------------------------------------- QP

/// What a QP is made of (see [`Device::create_qp`]).
#[derive(Debug, Clone, Copy)]
pub struct QpSpec<'a> {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: PdId,
    /// Send completions go here.
    pub send_cq: &'a CqHandle,
    /// Receive completions go here.
    pub recv_cq: &'a CqHandle,
    /// Receive WRs come from this SRQ.
    pub srq: Option<&'a SrqHandle>,
    /// Capacities.
    pub cap: QpCap,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

/// A queue pair on a device. Dropping it removes the QP from the engine.
#[derive(Debug)]
pub struct QpHandle {
    dev: Device,
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    sq: Arc<SendQueue>,
    rq: Arc<RecvQueue>,
    /// The state as the engine's QP publishes it (it moves to ERR or SQE
    /// on its own).
    state: Arc<StateCell>,
    srq: bool,
    pd: PdId,
    /// The checker's ledger (`UROCE_CHECK` on when the QP was made).
    ledger: Option<Arc<QpLedger>>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _slot: Slot,
}

impl QpHandle {
    /// QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }
    /// Transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Capacities (with an SRQ, the receive ones are 0).
    pub fn cap(&self) -> QpCap {
        self.cap
    }
    /// Whether receives come from an SRQ.
    pub fn has_srq(&self) -> bool {
        self.srq
    }
    /// The state as the engine's QP last set it.
    pub fn state(&self) -> QpState {
        self.state.get()
    }
    /// The QP's last error explained: which check failed on which side
    /// (see [`crate::diag::explain`]); kept whether or not `UROCE_EXPLAIN=1`
    /// prints it.
    pub fn last_error(&self) -> Option<crate::diag::explain::Explanation> {
        self.state.last_error()
    }
    /// Why the QP is in ERR, when it is and that was explained.
    pub fn error_cause(&self) -> Option<crate::diag::explain::Explanation> {
        self.state.error_cause()
    }
    /// Modifies the QP; returns its attributes afterwards.
    pub fn modify(&self, attr: &QpAttr, mask: AttrMask) -> Result<QpAttr> {
        if let Some(l) = &self.ledger {
            if mask.contains(AttrMask::STATE) {
                match attr.qp_state {
                    QpState::Err => l.set_err_by_app(),
                    QpState::Reset => l.reset(),
                    _ => {}
                }
            }
        }
        Ok(self.dev.engine().modify_qp(self.qpn, attr, mask)?)
    }
    /// The QP's attributes.
    pub fn query(&self) -> Result<QpAttr> {
        Ok(self.dev.engine().query_qp(self.qpn)?)
    }
    /// `ibv_attach_mcast`: the QP (UD) receives what is sent to the
    /// multicast GID `gid` (an IPv4-mapped or IPv6 multicast address) and
    /// QP 0xFFFFFF. The LID is not asked for: RoCE ignores it.
    pub fn attach_mcast(&self, gid: &[u8; 16]) -> Result<()> {
        let group = crate::endpoint::mcast_group(gid);
        Ok(self.dev.engine().attach_mcast(self.qpn, group)?)
    }
    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&self, gid: &[u8; 16]) -> Result<()> {
        let group = crate::endpoint::mcast_group(gid);
        Ok(self.dev.engine().detach_mcast(self.qpn, group)?)
    }
    /// The engine's whole view of the QP, for debugging.
    pub fn debug_state(&self) -> String {
        self.dev
            .engine()
            .dump_qp(self.qpn)
            .unwrap_or_else(|e| e.to_string())
    }

    /// The SGE count rule of this QP's send WRs (EINVAL beyond
    /// `max_send_sge`): checked before a caller reads a foreign list, and
    /// on posting.
    pub fn check_send_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        self.cap.check_send_sges(n)
    }
    /// The inline length rule (EINVAL beyond `max_inline_data`).
    pub fn check_inline(&self, len: usize) -> std::result::Result<(), LimitError> {
        let r = self.cap.check_inline(len);
        if let (Err(_), Some(l)) = (&r, &self.ledger) {
            if check::on(Category::Post) {
                l.inline_too_long(len);
            }
        }
        r
    }
    /// The SGE count rule of this QP's receive WRs (EINVAL beyond
    /// `max_recv_sge`).
    pub fn check_recv_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        self.cap.check_recv_sges(n)
    }

    /// Every rule a send WR must pass to be posted on this QP: the
    /// opcode for the QP type, the SGE count, the inline length, and for
    /// UD a destination and a length within the path MTU.
    fn check_send(&self, wr: &SendWr) -> Result<()> {
        if !self.qp_type.may_post(wr.opcode) {
            return Err(DeviceError::Invalid(format!(
                "{:?} is not a {:?} operation",
                wr.opcode, self.qp_type
            )));
        }
        self.check_send_sges(wr.sg_list.len())?;
        let inline = wr.flags.contains(SendFlags::INLINE);
        if inline {
            self.check_inline(wr.inline_data.len())?;
        }
        if self.qp_type == QpType::Ud {
            if wr.ud.is_none() {
                return Err(DeviceError::Invalid(
                    "a UD send needs a destination (wr.ud: address handle, QPN, Q_Key)".into(),
                ));
            }
            let len = if inline {
                wr.inline_data.len() as u64
            } else {
                wr.total_len()
            };
            let mtu = self.dev.active_mtu().bytes();
            if len > mtu as u64 {
                return Err(DeviceError::Invalid(format!(
                    "a UD message of {len} bytes exceeds the path MTU ({mtu} bytes)"
                )));
            }
        }
        Ok(())
    }

    /// Posts send WRs: each is checked, then queued; the engine is told
    /// once, after the last (what was posted before a refused WR goes
    /// out too). On error, returns the failing index with the error (the
    /// WRs before it were posted).
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, DeviceError)> {
        self.post_send_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the send WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most the send queue's depth in one call), as
    /// [`QpHandle::post_send`].
    pub fn post_send_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<SendWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        if !can_post_send(self.state()) {
            return Err((
                0,
                DeviceError::Invalid("QP is not in RTS (or SQD/SQE/ERR)".into()).into(),
            ));
        }
        let ledger = self.ledger.as_ref().filter(|_| check::any());
        if let Some(l) = ledger {
            if check::on(Category::Post) && self.state() == QpState::Err {
                l.post_in_err();
            }
        }
        let depth = self.sq.capacity() as usize;
        let (posted, r) = post_each(items, depth, read, |wr| {
            self.check_send(&wr)?;
            if let Some(l) = ledger.filter(|_| check::on(Category::Post)) {
                l.check_send_wr(&wr);
            }
            Ok(self.sq.post(wr)?)
        });
        if posted > 0 {
            self.dev.engine().post_kick(self.qpn);
        }
        r
    }

    /// Posts receive WRs on the QP's own receive queue (EINVAL with an
    /// SRQ, or in RESET). On error, returns the failing index with the
    /// error (the WRs before it were posted).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, DeviceError)> {
        self.post_recv_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the receive WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most the receive queue's depth in one call), as
    /// [`QpHandle::post_recv`].
    pub fn post_recv_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        if self.srq {
            return Err((
                0,
                DeviceError::Invalid("the QP receives from an SRQ: post to the SRQ".into()).into(),
            ));
        }
        if self.state() == QpState::Reset {
            return Err((0, DeviceError::Invalid("QP is in RESET".into()).into()));
        }
        let depth = self.rq.capacity();
        let (posted, r) = post_each(items, depth, read, |wr| {
            self.check_recv_sges(wr.sg_list.len())?;
            if check::on(Category::Post) {
                check_recv_wr(&self.dev.shared.keys, self.pd, self.qpn, &wr);
            }
            match self.ledger.as_ref().filter(|_| crate::diag::COMPILED) {
                Some(l) => l.post_recv(wr, |wr| self.rq.post(wr))?,
                None => self.rq.post(wr)?,
            }
            Ok(())
        });
        if posted > 0 {
            self.dev.engine().kick(self.qpn);
        }
        r
    }
}

/// Posts a list of WRs in order, as verbs does: each item is read into a
/// WR (`read`: the caller's conversion, which may refuse it) and posted
/// (`post`) before the next item is taken, until one is refused. Returns
/// how many went in, and the refused one's index with its error
/// (`*bad_wr`).
///
/// One call posts at most `depth` WRs (the queue's capacity): the item
/// after those is refused with ENOMEM without being read, as a NIC
/// provider finds its queue full. A list that loops back on itself (a C
/// program's `next` pointing back) thus ends there, touching nothing
/// beyond the refused WR, instead of growing without bound.
fn post_each<T, W, E: From<DeviceError>>(
    items: impl IntoIterator<Item = T>,
    depth: usize,
    mut read: impl FnMut(T) -> std::result::Result<W, E>,
    mut post: impl FnMut(W) -> Result<()>,
) -> (usize, std::result::Result<(), (usize, E)>) {
    let mut n = 0;
    for item in items {
        if n == depth {
            let full = DeviceError::NoMemory("more WRs in one post than the queue holds");
            return (n, Err((n, full.into())));
        }
        let posted = read(item).and_then(|wr| post(wr).map_err(E::from));
        if let Err(e) = posted {
            return (n, Err((n, e)));
        }
        n += 1;
    }
    (n, Ok(()))
}

/// The checker's L_Key rules of a receive WR's SG list (the buffers are
/// written: local write).
fn check_recv_wr(keys: &KeyTable, pd: PdId, qpn: u32, wr: &RecvWr) {
    for s in wr.sg_list.iter().filter(|s| s.length > 0) {
        check::check_sge(keys, pd, qpn, "receive", wr.wr_id, s, Access::LOCAL_WRITE);
    }
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        if let Some(l) = &self.ledger {
            check::qp_destroyed(l);
        }
        self.dev.shared.reg.objects.lock().qps.remove(&self.qpn);
        let _ = self.dev.engine().destroy_qp(self.qpn);
        self.dev.free_qpn(self.qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Sge, WrOpcode};

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
