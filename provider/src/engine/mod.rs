//! The engine: one polling thread per device that owns the device's UDP
//! socket and every QP on it, and drives the sans-IO state machines.
//!
//! Application threads never take a lock the engine holds on the hot
//! path: they push work requests into each QP's lock-free queues and ring a
//! doorbell ([`Engine::kick`]); they poll completion queues directly.
//! Control operations (create/modify/query/destroy QP, deregistration
//! barriers) travel over a command channel and are answered synchronously.
//!
//! The loop spins briefly when idle, then blocks in `poll(2)` on the socket
//! and an eventfd doorbell, with the next QP deadline as the timeout, so
//! two processes on a 2-core machine do not starve each other.

pub mod capture;
pub mod config;
pub mod share;
pub(crate) mod socket;

use crate::counters::Counters;
use crate::endpoint::{Endpoint, GroupChange, McastError, RxIp};
use crate::memory::KeyTable;
use crate::net::faults::{FaultInjector, Faults};
use crate::observe::{self, Dir, Event, Observer, Topic};
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
use crate::transport::{Nanos, QpMachine, QpTally};
use crate::types::QpState;
use crossbeam::channel::{self, Receiver, Sender};
use crossbeam::queue::SegQueue;
use share::Screen;
use socket::{
    Doorbell, RxBatch, TxMsg, UdpPort, GRO_MAX, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, RX_BATCH,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use uroce_wire::icrc::{Ipv4IdShift, HEADROOM};

#[cfg(any(test, feature = "testing"))]
pub use config::DeviceConfig;
// The engine's socket set-up, for other programs that send RoCEv2 as
// the engine does (uroce-fuzz's live target): a DF socket whose IPv4
// header is the one uroce computes its ICRCs for, and its buffers grown.
pub use socket::kernel_udp_socket;
#[cfg(any(test, feature = "testing"))]
pub use socket::{df_socket, grow_buffers};

/// How long the engine spins without work before it blocks. Short: on a
/// 2-core machine the application and a peer engine need the CPU.
const SPIN_NS: u64 = 200_000;
/// A yield that kept the spinning engine thread off its core this long
/// while no application thread polled the device means the core is shared
/// with a thread that neither yields nor calls uroce: an application
/// spinning on memory, as `ib_write_lat -c UC` does, waiting for bytes
/// only the engine thread can place. Each yield then hands that thread a
/// whole time slice (milliseconds), and a packet arriving meanwhile waits
/// for it; a blocked engine thread is woken by the packet instead, and the
/// wake-up preempts the spinner. An application that polls (its yields
/// interleave with the engine thread's) keeps the engine spinning.
const LONG_YIELD_NS: u64 = 50_000;
/// How long the engine thread stops spinning after such a yield, unless
/// the application polls [`RESUME_POLLS`] times first: then it tries
/// again (a thread that still spins beside it costs one time slice per
/// period).
const NO_SPIN_NS: u64 = 100_000_000;
/// Application polls that end a pause of spinning early. Not one: a
/// program that spins on memory may still poll its CQ once per message
/// (`ib_write_lat -c UC` does when its send's completion is not yet
/// there), and resuming at each such poll cost it a time slice (2 ms)
/// per message in about one run in three. A program that waits by
/// polling its CQs polls tens of times per message.
const RESUME_POLLS: u64 = 32;
/// How long the ACKs of a small receive wait for the application's next
/// post to carry them (see `Driver::after_receive`).
const ACK_HOLD_NS: u64 = 50_000;
/// The largest receive whose ACKs are held back.
const ACK_HOLD_DATAGRAMS: usize = 4;
/// ACKs are held back while an application drove the device this
/// recently (it polls its CQs, and so will see and may answer what came).
const APP_POLLING_NS: u64 = 1_000_000;
/// Largest datagram the engine handles.
const MAX_DATAGRAM: usize = 4096 + 256;

/// A request to the engine thread.
enum Command {
    AddQp(Box<dyn QpMachine>, Sender<()>),
    Modify(u32, QpAttr, AttrMask, Sender<Result<QpAttr, EngineError>>),
    Query(u32, Sender<Result<QpAttr, EngineError>>),
    Destroy(u32, Sender<Result<(), EngineError>>),
    Sync(Sender<()>),
    SetFaults(Option<Faults>, Sender<()>),
    Dump(u32, Sender<String>),
    Snapshot(Sender<Vec<QpSnapshot>>),
    Capture(Option<std::path::PathBuf>, Sender<Result<(), String>>),
    Mcast(McastOp, u32, IpAddr, Sender<Result<(), EngineError>>),
}

/// One QP as the engine sees it at one moment (for `uroce stat`).
#[derive(Debug, Clone, Copy)]
pub struct QpSnapshot {
    /// QP number.
    pub qpn: u32,
    /// Its attributes, as `ibv_query_qp` reports them (state, PSNs,
    /// destination).
    pub attr: QpAttr,
    /// Request PSNs sent and not yet acknowledged.
    pub inflight_psns: u32,
    /// What it counted of its own life.
    pub tally: QpTally,
}

/// A multicast membership change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum McastOp {
    Attach,
    Detach,
}

/// Errors of engine control operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// No such QP on this device.
    #[error("no QP {0:#x} on this device")]
    NoQp(u32),
    /// A modify-QP call broke the spec's rules.
    #[error(transparent)]
    Modify(#[from] ModifyError),
    /// The engine thread is gone.
    #[error("the device's engine has stopped")]
    Stopped,
    /// A blocking control call made from the device's own engine thread
    /// (from a callback it runs): it would wait for itself forever.
    #[error("called from the device's own engine thread")]
    Reentrant,
    /// The capture file could not be written.
    #[error("capture: {0}")]
    Capture(String),
    /// UDP port 4791 on the address is taken (by another process, or
    /// another socket): EADDRINUSE, as binding it says.
    #[error("UDP port 4791 on {0} is in use (another process has the device open?)")]
    AddrInUse(IpAddr),
    /// Another user's processes hold the device: a device is shared only
    /// among the processes of one user (see [`share`]).
    #[error(
        "UDP port 4791 on {addr} is held by user {uid}: a uroce device is shared only by the \
         processes of one user (the kernel's SO_REUSEPORT group is per user)"
    )]
    OtherUser {
        /// The address.
        addr: IpAddr,
        /// The user holding it.
        uid: u32,
    },
    /// A multicast attach or detach was refused.
    #[error(transparent)]
    Mcast(#[from] McastError),
    /// The socket receiving a multicast group could not be set up.
    #[error("cannot join multicast group {group}: {msg}")]
    Join {
        /// The group.
        group: IpAddr,
        /// The OS error.
        msg: String,
        /// Its errno.
        errno: i32,
    },
    /// The socket could not be set up.
    #[error("cannot bind UDP port 4791 on {addr}: {msg}")]
    Bind {
        /// The address.
        addr: IpAddr,
        /// The OS error.
        msg: String,
    },
}

/// The addresses whose engine in this process is stopping: dropped, its
/// socket still open until its thread ends. A new engine on such an
/// address waits for it rather than fail with EADDRINUSE: a device dropped
/// and opened again (the last handle often goes on another thread) must
/// work.
static STOPPING: std::sync::LazyLock<(
    parking_lot::Mutex<std::collections::HashSet<IpAddr>>,
    parking_lot::Condvar,
)> = std::sync::LazyLock::new(Default::default);

/// How long [`Engine::start`] waits for a stopping engine on its address.
const STOPPING_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn released(ip: IpAddr) {
    STOPPING.0.lock().remove(&ip);
    STOPPING.1.notify_all();
}

/// Every engine started in the process, for [`flush_at_exit`], with the
/// process that started it (a child made by `fork` inherits the list and
/// the handler, not the engines: it must not send their packets again).
static LIVE: parking_lot::Mutex<Vec<(u32, std::sync::Weak<Shared>)>> =
    parking_lot::Mutex::new(Vec::new());

/// How long the flush at exit waits for one device's pass in progress.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Registers a new engine for [`flush_at_exit`] (installed once).
fn flush_at_exit_too(shared: &Arc<Shared>) {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a function that takes no arguments and
        // returns nothing, as atexit wants; it never unwinds.
        unsafe { libc::atexit(flush_at_exit) };
    });
    let mut live = LIVE.lock();
    live.retain(|(_, w)| w.strong_count() > 0);
    live.push((std::process::id(), Arc::downgrade(shared)));
}

/// At process exit (`exit`, or a return from `main`): every device's
/// queued packets go to its socket and its capture's held records to the
/// file. The kernel's CM answers for a program that has gone; uroce's
/// lives in the program, so what it queued last (a DREQ just posted, a
/// REJ) must leave before the process does. The engine threads are still
/// running here; each device waits at most [`EXIT_WAIT`] for one.
extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(live) = LIVE.try_lock_for(EXIT_WAIT) else {
            return;
        };
        let me = std::process::id();
        let engines: Vec<Arc<Shared>> = live
            .iter()
            .filter(|(pid, _)| *pid == me)
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        drop(live);
        for s in engines {
            flush_now(&s, EXIT_WAIT);
        }
    });
}

/// Sends what the device's QPs have queued and writes the capture's held
/// records, on the calling thread, once the pass in progress elsewhere (if
/// any) has ended. False if that took longer than `wait`, or if called on
/// the engine's own thread (whose pass is the one in progress).
fn flush_now(shared: &Shared, wait: std::time::Duration) -> bool {
    let me = shared as *const Shared as usize;
    if ENGINE_THREAD.with(|t| t.get()) == me {
        return false;
    }
    let Some(mut g) = shared.driver.try_lock_for(wait) else {
        return false;
    };
    let Some(d) = g.as_mut() else {
        return false;
    };
    as_engine(shared, d, Driver::flush);
    true
}

/// Runs `f` on the driver from this thread as if it were the engine's own
/// (what the QPs' processing checks for re-entrancy), then writes the
/// capture's held records.
fn as_engine<R>(shared: &Shared, d: &mut Driver, f: impl FnOnce(&mut Driver) -> R) -> R {
    let me = shared as *const Shared as usize;
    let was = ENGINE_THREAD.with(|t| t.replace(me));
    let r = f(d);
    d.flush_capture();
    ENGINE_THREAD.with(|t| t.set(was));
    r
}

thread_local! {
    /// The [`Shared`] (as an address) of the engine whose worker runs on
    /// this thread; 0 on every other thread.
    static ENGINE_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

struct Shared {
    doorbell: Doorbell,
    stop: AtomicBool,
    ready: SegQueue<u32>,
    /// The driver; `None` once the engine thread has ended.
    driver: parking_lot::Mutex<Option<Driver>>,
    /// The socket's descriptor, to sleep on without the driver's lock.
    sock_fd: std::os::fd::RawFd,
    /// An epoll set of the multicast groups' sockets, slept on too.
    mcast_poll: Arc<socket::PollSet>,
    epoch: Instant,
    /// Application threads may drive the device (`UROCE_APP_PROGRESS=0`:
    /// only the engine thread does).
    app_progress: bool,
    /// The deadline the engine thread last planned to wake at (engine
    /// nanoseconds; `u64::MAX`: none), written under the driver's lock.
    planned: AtomicU64,
    /// An application thread's pass set a deadline before `planned` (it
    /// armed a timer: a post sends on the posting thread): the engine
    /// thread must not sleep past it (see `Engine::drive`).
    deadline_moved: AtomicBool,
    /// Passes application threads ran ([`Engine::progress`]): whether the
    /// application polls the device (see [`LONG_YIELD_NS`]).
    app_polls: AtomicU64,
}

impl Shared {
    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }
}

/// A running engine. Dropping it stops the thread and closes the socket.
pub struct Engine {
    shared: Arc<Shared>,
    cmds: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    keys: Arc<KeyTable>,
    local_ip: IpAddr,
    io: IoPath,
    /// Its membership of the device's group (`None`: not shared).
    share: Option<share::Member>,
}

/// Which batched I/O the engine's socket uses (see `engine::socket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoPath {
    /// Sends go out with `sendmmsg`, runs of packets as UDP GSO messages
    /// (false: the kernel lacks UDP_SEGMENT or `UROCE_GSO=0`).
    pub gso: bool,
    /// Receives aggregate with UDP GRO (false: the kernel lacks UDP_GRO
    /// or `UROCE_GRO=0`).
    pub gro: bool,
}

impl std::fmt::Display for IoPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let on = |b: bool| if b { "on" } else { "off" };
        write!(
            f,
            "sendmmsg+GSO {}, recvmmsg+GRO {}",
            on(self.gso),
            on(self.gro)
        )
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine({})", self.local_ip)
    }
}

impl Engine {
    /// Binds UDP 4791 on `ip` and starts the engine thread. Faults named by
    /// `UROCE_FAULTS` apply to everything it sends.
    pub fn start(ip: IpAddr, keys: Arc<KeyTable>) -> Result<Engine, EngineError> {
        Observer::process().send(Event::DeviceOpened);
        let faults = Faults::from_env().map_err(|e| EngineError::Bind {
            addr: ip,
            msg: e.to_string(),
        })?;
        {
            let mut stopping = STOPPING.0.lock();
            let until = Instant::now() + STOPPING_WAIT;
            while stopping.contains(&ip) {
                if STOPPING.1.wait_until(&mut stopping, until).timed_out() {
                    break;
                }
            }
        }
        let bind_err = |msg: String| EngineError::Bind { addr: ip, msg };
        // Sharing: the group lock and a QPN slot first (see `share`).
        let joining = share::enabled()
            .then(|| share::Joining::begin(ip))
            .transpose()
            .map_err(|e| bind_err(e.to_string()))?;
        let port = UdpPort::bind(ip, joining.is_some()).map_err(|e| match e.raw_os_error() {
            Some(libc::EADDRINUSE) => match joining.as_ref().and_then(|_| share::other_user(ip)) {
                Some(uid) => EngineError::OtherUser { addr: ip, uid },
                None => EngineError::AddrInUse(ip),
            },
            _ => bind_err(e.to_string()),
        })?;
        let group_fd = match joining {
            Some(_) => Some(port.dup_fd().map_err(|e| bind_err(e.to_string()))?),
            None => None,
        };
        let doorbell = Doorbell::new().map_err(|e| EngineError::Bind {
            addr: ip,
            msg: format!("eventfd: {e}"),
        })?;
        let (tx, rx) = channel::unbounded();
        let counters = Arc::new(Counters::default());
        let epoch = Instant::now();
        let gro = port.gro();
        let io = IoPath {
            gso: port.gso(),
            gro,
        };
        let sock_fd = port.raw_fd();
        let mcast_poll = Arc::new(socket::PollSet::new().map_err(|e| EngineError::Bind {
            addr: ip,
            msg: format!("epoll: {e}"),
        })?);
        let driver = Driver {
            port,
            steer: joining.as_ref().map(|j| j.steer().clone()),
            mcast: Vec::new(),
            mcast_poll: mcast_poll.clone(),
            ep: Endpoint::new(ip, counters.clone()),
            epoch,
            txbuf: vec![0u8; TX_PER_PASS * MAX_DATAGRAM],
            tx: Vec::with_capacity(TX_PER_PASS),
            rx: RxBatch::new(HEADROOM, if gro { GRO_MAX } else { MAX_DATAGRAM }),
            faults: faults.filter(|f| !f.is_none()).map(FaultInjector::new),
            capture: None,
            delayed: BinaryHeap::new(),
            delayed_seq: 0,
            hold_until: None,
            app_polled: Nanos(0),
        };
        let shared = Arc::new(Shared {
            doorbell,
            stop: AtomicBool::new(false),
            ready: SegQueue::new(),
            driver: parking_lot::Mutex::new(Some(driver)),
            sock_fd,
            mcast_poll,
            epoch,
            app_progress: !crate::env::turned_off("UROCE_APP_PROGRESS"),
            planned: AtomicU64::new(u64::MAX),
            deadline_moved: AtomicBool::new(false),
            app_polls: AtomicU64::new(0),
        });
        flush_at_exit_too(&shared);
        let thread_shared = shared.clone();
        // The engine thread takes none of the program's signals.
        let thread = crate::threads::spawn(format!("uroce-engine-{ip}"), move || {
            run(&thread_shared, &rx);
            released(ip);
        })
        .map_err(|e| EngineError::Bind {
            addr: ip,
            msg: format!("spawn: {e}"),
        })?;
        let mut engine = Engine {
            shared,
            cmds: tx,
            thread: Some(thread),
            share: None,
            counters,
            keys,
            local_ip: ip,
            io,
        };
        if let (Some(j), Some(fd)) = (joining, group_fd) {
            let member = j
                .finish(ip, fd)
                .map_err(|e| bind_err(format!("share: {e}")))?;
            engine.share = Some(member);
        }
        Ok(engine)
    }

    /// The QP numbers this engine hands out: `base | (n & mask)` (its
    /// slot's numbers when the device is shared, see [`share`]).
    pub fn qpn_space(&self) -> (u32, u32) {
        match &self.share {
            Some(m) => (m.steer().slot() << share::SLOT_SHIFT, share::SLOT_QPN_MASK),
            None => (0, 0xff_ffff),
        }
    }

    /// What the device's CM agent asks of the processes sharing the
    /// device (`None`: not shared).
    pub fn cm_group(&self) -> Option<Arc<dyn crate::cm::CmGroup>> {
        let cm: Arc<dyn crate::cm::CmGroup> = self.share.as_ref()?.cm();
        Some(cm)
    }

    /// The batched I/O the device's socket uses (as set up; GSO turns
    /// itself off if the kernel refuses a GSO message).
    pub fn io_path(&self) -> IoPath {
        self.io
    }

    /// The device address.
    #[cfg(any(test, feature = "testing"))]
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }
    /// Device counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
    /// The key table.
    #[cfg(any(test, feature = "testing"))]
    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.keys
    }

    /// Tells the engine that QP `qpn` has new work (a posted WR).
    #[inline]
    pub fn kick(&self, qpn: u32) {
        self.shared.ready.push(qpn);
        self.shared.doorbell.ring_if_sleeping();
    }

    /// [`Engine::kick`] from an application's post. When the device is
    /// free and quiet (at most [`QUIET_INFLIGHT`] request PSNs in flight:
    /// a ping-pong, the first posts of a burst), the calling thread
    /// sends the QP's packets itself, with no hand-over to the engine
    /// thread. Otherwise the engine thread takes them, batching a
    /// stream's packets into few system calls.
    ///
    /// Must not be called with a lock held that the QPs' own processing
    /// (completions, events, CM callbacks) may take.
    #[inline]
    pub fn post_kick(&self, qpn: u32) {
        // The QP goes straight to the driver when this thread takes it;
        // only otherwise through the ready queue to the engine thread.
        let mut marked = false;
        let sent = self.drive(|d, ready| {
            if d.ep.inflight() > QUIET_INFLIGHT {
                return false;
            }
            d.ep.mark(qpn);
            marked = true;
            while let Some(q) = ready.pop() {
                d.ep.mark(q);
            }
            // What an application pass held back goes now, with the post.
            d.hold_until = None;
            d.transmit()
        });
        if !marked {
            self.shared.ready.push(qpn);
        }
        if !sent {
            self.shared.doorbell.ring_if_sleeping();
        }
    }

    /// Returns once everything the device's QPs had queued to send when
    /// it was called is in the socket (and the capture file), with any
    /// pass in progress on another thread finished first; sent from the
    /// calling thread. An event whose MADs must be on the wire before the
    /// program sees it (a DREP: DISCONNECTED may be the program's last
    /// wait before it exits) goes out after this. Waits at most `wait`
    /// for a pass in progress; false if it did not get to send (or on the
    /// engine's own thread).
    pub fn flush(&self, wait: std::time::Duration) -> bool {
        flush_now(&self.shared, wait)
    }

    /// Lets the calling thread make progress on the device: if nobody
    /// else is driving it, one pass (receive, process, transmit, timers)
    /// runs here and now. An application that polls an empty CQ calls
    /// this instead of waiting for the engine thread to pick the packet
    /// up and hand the completion over. The ACKs of a small receive wait
    /// (at most `ACK_HOLD_NS`) for the application's next post, which
    /// sends them together with its own packets (see
    /// `Driver::after_receive`).
    /// Returns false if the device was busy (the caller should yield) or
    /// nothing happened.
    ///
    /// Must not be called with a lock held that the QPs' own processing
    /// (completions, events, CM callbacks) may take.
    pub fn progress(&self) -> bool {
        self.shared.app_polls.fetch_add(1, Ordering::Relaxed);
        self.drive(|d, ready| d.app_pass(ready))
    }

    /// Runs `f` on the driver from this thread if it is free (as the
    /// engine thread, for re-entrancy checks); false if it was not.
    fn drive(&self, f: impl FnOnce(&mut Driver, &SegQueue<u32>) -> bool) -> bool {
        if !self.shared.app_progress || self.on_own_thread() {
            return false;
        }
        let Some(mut g) = self.shared.driver.try_lock() else {
            return false;
        };
        let Some(d) = g.as_mut() else {
            return false;
        };
        let r = as_engine(&self.shared, d, |d| f(d, &self.shared.ready));
        // Output left behind (a deferred ACK, more than one pass's worth)
        // must not wait for this thread to come back: a sleeping engine
        // thread is woken to send it. So must a deadline earlier than the
        // one the engine thread sleeps until (a timer this pass armed):
        // this thread may not come back in time (it waits on a completion
        // channel, or polls without driving).
        let pending = d.ep.has_output();
        let moved = d.deadline().is_some_and(|t| {
            let earlier = t.0 < self.shared.planned.load(Ordering::Relaxed);
            if earlier {
                self.shared.planned.store(t.0, Ordering::Relaxed);
                // Paired with the engine thread's `set_sleeping(true)`
                // then `deadline_moved.swap`: either it sees this flag
                // and does not sleep, or this thread sees it sleeping
                // and rings.
                self.shared.deadline_moved.store(true, Ordering::SeqCst);
            }
            earlier
        });
        drop(g);
        if pending || moved {
            self.shared.doorbell.ring_if_sleeping();
        }
        r
    }

    /// The engine's clock: the time its QPs' deadlines are in.
    #[cfg(any(test, feature = "testing"))]
    pub fn now(&self) -> Nanos {
        self.shared.now()
    }

    /// A handle that kicks QPs and reads the clock without the engine
    /// (for code that must not keep the engine alive).
    pub fn kicker(&self) -> Kicker {
        Kicker {
            shared: Arc::downgrade(&self.shared),
            epoch: self.shared.epoch,
        }
    }

    /// Whether the caller runs on this engine's own thread (inside a
    /// callback the engine makes, such as a QP's packet sink).
    pub fn on_own_thread(&self) -> bool {
        ENGINE_THREAD.with(|t| t.get()) == Arc::as_ptr(&self.shared) as usize
    }

    fn call<T>(&self, make: impl FnOnce(Sender<T>) -> Command) -> Result<T, EngineError> {
        if self.on_own_thread() {
            return Err(EngineError::Reentrant);
        }
        let (tx, rx) = channel::bounded(1);
        self.cmds.send(make(tx)).map_err(|_| EngineError::Stopped)?;
        self.shared.doorbell.ring();
        rx.recv().map_err(|_| EngineError::Stopped)
    }

    /// Hands a QP to the engine.
    pub fn add_qp(&self, qp: impl QpMachine + 'static) -> Result<(), EngineError> {
        self.add_boxed_qp(Box::new(qp))
    }
    /// Adds a QP made by [`crate::transport::new_qp`].
    pub fn add_boxed_qp(&self, qp: Box<dyn QpMachine>) -> Result<(), EngineError> {
        self.call(|tx| Command::AddQp(qp, tx))
    }
    /// Modifies a QP; returns its attributes afterwards.
    pub fn modify_qp(
        &self,
        qpn: u32,
        attr: &QpAttr,
        mask: AttrMask,
    ) -> Result<QpAttr, EngineError> {
        self.call(|tx| Command::Modify(qpn, *attr, mask, tx))?
    }
    /// A QP's attributes.
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, EngineError> {
        self.call(|tx| Command::Query(qpn, tx))?
    }
    /// Removes a QP.
    ///
    /// From the engine's own thread (a QP handle dropped inside one of its
    /// callbacks) the removal is queued and happens before the engine
    /// next looks at its commands; it cannot be waited for there.
    pub fn destroy_qp(&self, qpn: u32) -> Result<(), EngineError> {
        if self.on_own_thread() {
            let (tx, _) = channel::bounded(1);
            self.cmds
                .send(Command::Destroy(qpn, tx))
                .map_err(|_| EngineError::Stopped)?;
            return Ok(());
        }
        self.call(|tx| Command::Destroy(qpn, tx))?
    }
    /// Attaches a UD QP to a multicast group (an IP multicast address of
    /// the device's version; see [`Endpoint::attach_mcast`]): the first
    /// QP of the device to join it opens a socket receiving the group.
    pub fn attach_mcast(&self, qpn: u32, group: IpAddr) -> Result<(), EngineError> {
        self.call(|tx| Command::Mcast(McastOp::Attach, qpn, group, tx))?
    }
    /// Detaches a QP from a group; the last to leave closes its socket.
    pub fn detach_mcast(&self, qpn: u32, group: IpAddr) -> Result<(), EngineError> {
        self.call(|tx| Command::Mcast(McastOp::Detach, qpn, group, tx))?
    }
    /// Injects faults into everything this device sends from now on
    /// (`None`: a clean network again).
    pub fn set_faults(&self, faults: Option<Faults>) -> Result<(), EngineError> {
        self.call(|tx| Command::SetFaults(faults, tx))
    }

    /// Starts writing every packet this device sends and receives to a
    /// pcap file (replacing any capture in progress), or stops (`None`).
    pub fn capture(&self, path: Option<&std::path::Path>) -> Result<(), EngineError> {
        self.call(|tx| Command::Capture(path.map(|p| p.to_path_buf()), tx))?
            .map_err(EngineError::Capture)
    }

    /// A QP's whole internal state, for debugging.
    pub fn dump_qp(&self, qpn: u32) -> Result<String, EngineError> {
        self.call(|tx| Command::Dump(qpn, tx))
    }

    /// Every QP of the device as the engine sees it now, or `Stopped` if
    /// the engine does not answer within `wait` (busy, or gone).
    pub fn snapshot_qps(&self, wait: std::time::Duration) -> Result<Vec<QpSnapshot>, EngineError> {
        if self.on_own_thread() {
            return Err(EngineError::Reentrant);
        }
        let rx = self.snapshot_handle().request()?;
        rx.recv_timeout(wait).map_err(|_| EngineError::Stopped)
    }
    /// A handle that asks for [`Engine::snapshot_qps`] without keeping
    /// the engine alive.
    pub fn snapshot_handle(&self) -> SnapshotHandle {
        SnapshotHandle {
            cmds: self.cmds.clone(),
            shared: Arc::downgrade(&self.shared),
        }
    }

    /// Returns once the engine has finished whatever packet it was
    /// processing: after a region's keys are removed, no copy into it is
    /// in progress when this returns.
    #[cfg(any(test, feature = "testing"))]
    pub fn sync(&self) -> Result<(), EngineError> {
        self.call(Command::Sync)
    }

    /// Returns once the engine has made a whole pass (commands, received
    /// packets, doorbells, transmission, timers) after the call: work
    /// posted before it (a QP kicked) has been looked at, and what that
    /// completes at once (a UD send) is in its CQ.
    pub fn settle(&self) -> Result<(), EngineError> {
        // The first reply comes from the commands step of some pass; the
        // second from the next pass's, after the first pass transmitted.
        self.call(Command::Sync)?;
        self.call(Command::Sync)
    }
}

/// See `Engine::snapshot_handle`.
#[derive(Clone)]
pub struct SnapshotHandle {
    cmds: Sender<Command>,
    shared: std::sync::Weak<Shared>,
}

impl std::fmt::Debug for SnapshotHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotHandle")
    }
}

impl SnapshotHandle {
    /// Asks the engine for its QPs; the answer comes on the channel
    /// returned, which closes unanswered when the engine stops first
    /// (`Stopped` at once if it has). Never call it from the engine's
    /// own thread and wait there.
    pub fn request(&self) -> Result<Receiver<Vec<QpSnapshot>>, EngineError> {
        let shared = self.shared.upgrade().ok_or(EngineError::Stopped)?;
        if shared.stop.load(Ordering::Acquire) {
            return Err(EngineError::Stopped);
        }
        let (tx, rx) = channel::bounded(1);
        self.cmds
            .send(Command::Snapshot(tx))
            .map_err(|_| EngineError::Stopped)?;
        shared.doorbell.ring();
        Ok(rx)
    }
}

/// See [`Engine::kicker`].
#[derive(Clone)]
pub struct Kicker {
    shared: std::sync::Weak<Shared>,
    epoch: Instant,
}

impl std::fmt::Debug for Kicker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kicker")
    }
}

impl Kicker {
    /// [`Engine::kick`], if the engine still runs.
    pub fn kick(&self, qpn: u32) {
        if let Some(s) = self.shared.upgrade() {
            s.ready.push(qpn);
            s.doorbell.ring_if_sleeping();
        }
    }
    /// [`Engine::now`].
    pub fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // UROCE_COUNTERS=1: the device's non-zero counters on stderr when
        // it closes (for programs that cannot be asked, e.g. perftest).
        if std::env::var_os("UROCE_COUNTERS").is_some_and(|v| v != "0") {
            let c: Vec<String> = self
                .counters
                .snapshot()
                .entries()
                .into_iter()
                .filter(|(_, v)| *v != 0)
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            eprintln!("uroce {}: {} [{}]", self.local_ip, c.join(" "), self.io);
        }
        STOPPING.0.lock().insert(self.local_ip);
        // Steers as the group will be without this socket (see
        // `share::Member::leave`).
        if let Some(m) = self.share.as_mut() {
            m.leave();
        }
        self.shared.stop.store(true, Ordering::Release);
        // What the device's QPs traced is in the file when it has closed.
        self.shared.doorbell.ring();
        // Dropped on its own thread (the last handle released inside a
        // callback), the engine cannot wait for itself: the stop flag ends
        // the loop as soon as the callback returns.
        if let Some(t) = self.thread.take() {
            if !self.on_own_thread() {
                let _ = t.join();
            }
        }
        // The slot goes once the socket has left the group.
        self.share.take();
        Observer::process().send(Event::DeviceClosed);
    }
}

/// A packet the fault injector holds back: (due, order, destination, (TOS,
/// multicast TTL), bytes).
type Delayed = (Nanos, u64, SocketAddr, (u8, Option<u8>), Vec<u8>);

/// Packets sent per pass before the engine looks at its socket again.
const TX_PER_PASS: usize = 64;
/// `recvmmsg` calls per pass (while each fills its batch).
const RX_CALLS_PER_PASS: usize = 4;

/// Whether a shared device's host steers two RoCEv2 packets alike (see
/// `share`'s program): one BTH destination QP (bytes 5-7), and for a QP of
/// the reserved slot (a probe, or a forward to another member) one word
/// after it too (bytes 8-11: the socket index or the owner's slot the
/// program steers by). The QP1 holder forwards three clients' DREQs at
/// once: merged into one GSO message, all three reached the first one's
/// process, and two connections waited for a resent DREQ (4.3 s).
fn same_dest_qp(a: &[u8], b: &[u8]) -> bool {
    let reserved = a.get(5).is_some_and(|q| u32::from(*q >> 2) == share::SLOTS);
    let key = if reserved { 5..12 } else { 5..8 };
    a.get(key.clone()).is_some_and(|q| b.get(key) == Some(q))
}

/// Request PSNs a device may have in flight for an application's post to
/// send its packets itself (see [`Engine::post_kick`]).
pub const QUIET_INFLIGHT: u32 = 2;

/// The UDP driver of one device's [`Endpoint`]: the socket, the batches,
/// the fault injector and the capture tap. It sits behind a mutex: the
/// engine thread drives it, and so does an application thread that polls
/// an empty CQ or posts a send while it is free.
struct Driver {
    port: UdpPort,
    /// The device's group, when shared: what `port` receives for another
    /// member's QPs is dropped (see [`share`]).
    steer: Option<Arc<share::Steer>>,
    /// A socket per multicast group some QP is attached to.
    mcast: Vec<(IpAddr, UdpPort)>,
    /// The epoll set the engine thread sleeps on for `mcast`.
    mcast_poll: Arc<socket::PollSet>,
    ep: Endpoint,
    epoch: Instant,
    /// Packets of one transmit pass, back to back.
    txbuf: Vec<u8>,
    /// The messages (GSO runs or single packets) of `txbuf`.
    tx: Vec<TxMsg>,
    rx: RxBatch,
    faults: Option<FaultInjector>,
    /// Packets held back by the fault injector.
    delayed: BinaryHeap<Reverse<Delayed>>,
    delayed_seq: u64,
    capture: Option<capture::Capture>,
    /// Output an application pass received the cause of (the ACKs of
    /// what it received) waits until then for the application's next
    /// post to carry it (see [`Driver::app_pass`]).
    hold_until: Option<Nanos>,
    /// When an application thread last drove the device.
    app_polled: Nanos,
}

impl Driver {
    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn counters(&self) -> &Counters {
        self.ep.counters()
    }

    fn local(&self) -> SocketAddr {
        SocketAddr::new(self.ep.local_ip(), uroce_wire::ROCEV2_UDP_PORT)
    }

    /// One pass: received packets, doorbells, transmission, timers.
    /// Returns whether anything happened.
    fn pass(&mut self, ready: &SegQueue<u32>) -> bool {
        let got = self.receive();
        self.after_receive(got, ready, false)
    }

    /// Whether output an application pass left is still held back for
    /// the application's next post: only ACKs and NAKs are, and only
    /// until the hold ends.
    fn holding(&self) -> bool {
        self.hold_until.is_some_and(|t| self.now() < t) && self.ep.only_acks_to_send()
    }

    /// The rest of a pass after receiving: doorbells, transmission,
    /// timers.
    fn send_and_time(&mut self, ready: &SegQueue<u32>) -> bool {
        let mut work = false;
        while let Some(qpn) = ready.pop() {
            self.ep.mark(qpn);
            work = true;
        }
        work |= self.transmit();
        work |= self.ep.handle_timeout(self.now());
        work
    }

    /// [`Driver::pass`] for an application thread (see
    /// [`Engine::progress`] and [`Driver::after_receive`]).
    fn app_pass(&mut self, ready: &SegQueue<u32>) -> bool {
        let got = self.receive();
        self.after_receive(got, ready, true)
    }

    /// The rest of a pass after a receive of `got` datagrams, on an
    /// application thread (`app`) or the engine thread.
    ///
    /// When an application polls the device (this pass, or one in the
    /// last [`APP_POLLING_NS`]) and the receive was small (at most
    /// [`ACK_HOLD_DATAGRAMS`]: a message and an ACK, as in a ping-pong),
    /// the ACKs it makes the QPs send are held back for up to
    /// [`ACK_HOLD_NS`]: an application that answers (a ping-pong, an MPI
    /// rendezvous) posts within that time, and its post sends them with
    /// its own packets in one system call, where they used to go in a
    /// system call of their own just before it (UCX polls its receive CQ
    /// and then its send CQ: that empty poll sent them). Only ACKs and
    /// NAKs are held (a READ response or a request goes at once); the
    /// engine thread sends them when the hold ends (one of its
    /// deadlines), as does any pass with posts to handle or a larger
    /// receive (a stream, acknowledged at once).
    fn after_receive(&mut self, got: usize, ready: &SegQueue<u32>, app: bool) -> bool {
        let now = self.now();
        if app {
            self.app_polled = now;
        }
        let polled = now.0.saturating_sub(self.app_polled.0) < APP_POLLING_NS;
        if got > ACK_HOLD_DATAGRAMS || !polled {
            self.hold_until = None;
        } else if got > 0 && self.hold_until.is_none() {
            self.hold_until = Some(Nanos(now.0 + ACK_HOLD_NS));
        }
        if ready.is_empty() && self.holding() {
            return got > 0;
        }
        self.hold_until = None;
        self.send_and_time(ready) | (got > 0)
    }

    /// Sends everything the QPs have to send now (bounded: a QP that
    /// keeps producing cannot hold the caller forever).
    fn flush(&mut self) {
        for _ in 0..64 {
            if !self.ep.has_output() {
                break;
            }
            self.transmit();
        }
    }

    /// Writes the capture's held records to its file (whole records).
    fn flush_capture(&mut self) {
        if let Some(c) = self.capture.as_mut() {
            let _ = c.flush();
        }
    }

    /// The next QP deadline or held-back packet.
    fn deadline(&mut self) -> Option<Nanos> {
        self.ep
            .poll_timeout()
            .into_iter()
            .chain(self.delayed.peek().map(|Reverse((due, ..))| *due))
            .chain(self.hold_until)
            .min()
    }

    fn commands(&mut self, cmds: &Receiver<Command>) -> bool {
        let mut any = false;
        while let Ok(cmd) = cmds.try_recv() {
            any = true;
            match cmd {
                Command::AddQp(qp, tx) => {
                    self.ep.add_qp(qp);
                    let _ = tx.send(());
                }
                Command::Modify(qpn, attr, mask, tx) => {
                    // A state change can start sending (SQD -> RTS) or
                    // flushing, and moves timers: qp_mut queues the QP.
                    let r = match self.ep.qp_mut(qpn) {
                        Some(qp) => qp
                            .modify(&attr, mask)
                            .map(|()| qp.attr())
                            .map_err(EngineError::from),
                        None => Err(EngineError::NoQp(qpn)),
                    };
                    // To ERR: what was posted before goes out before the
                    // call returns (before rdma_disconnect's DREQ, say),
                    // then the flush (`LastSends`).
                    if mask.contains(AttrMask::STATE) && attr.qp_state == QpState::Err {
                        self.flush();
                    }
                    let _ = tx.send(r);
                }
                Command::Query(qpn, tx) => {
                    let r = self
                        .ep
                        .qp(qpn)
                        .map(|qp| qp.attr())
                        .ok_or(EngineError::NoQp(qpn));
                    let _ = tx.send(r);
                }
                Command::Destroy(qpn, tx) => {
                    // What the QP still has to say goes first: an ACK an
                    // application pass deferred (see `app_pass`) may be
                    // the last its peer waits for.
                    self.ep.mark(qpn);
                    self.flush();
                    let r = self
                        .ep
                        .remove_qp(qpn)
                        .map(|_| ())
                        .ok_or(EngineError::NoQp(qpn));
                    self.leave_unused_groups();
                    let _ = tx.send(r);
                }
                Command::Mcast(op, qpn, group, tx) => {
                    let _ = tx.send(self.mcast(op, qpn, group));
                }
                Command::Sync(tx) => {
                    let _ = tx.send(());
                }
                Command::Capture(path, tx) => {
                    if let Some(c) = self.capture.take() {
                        let _ = c.finish();
                    }
                    let r = match path {
                        Some(p) => capture::Capture::create(&p).map(|c| self.capture = Some(c)),
                        None => Ok(()),
                    };
                    let _ = tx.send(r);
                }
                Command::Dump(qpn, tx) => {
                    let _ = tx.send(
                        self.ep
                            .qp(qpn)
                            .map_or_else(|| "no such QP".into(), |qp| format!("{qp:#?}")),
                    );
                }
                Command::Snapshot(tx) => {
                    let qps = self.ep.qps().map(|qp| QpSnapshot {
                        qpn: qp.qpn(),
                        attr: qp.attr(),
                        inflight_psns: qp.inflight(),
                        tally: qp.tally(),
                    });
                    let _ = tx.send(qps.collect());
                }
                Command::SetFaults(f, tx) => {
                    self.faults = f.filter(|f| !f.is_none()).map(FaultInjector::new);
                    let _ = tx.send(());
                }
            }
        }
        any
    }

    /// Attaches or detaches a QP, joining or leaving the group on the
    /// network as the device's first QP joins it or its last leaves.
    fn mcast(&mut self, op: McastOp, qpn: u32, group: IpAddr) -> Result<(), EngineError> {
        let group = group.to_canonical();
        let change = match op {
            McastOp::Attach => self.ep.attach_mcast(group, qpn)?,
            McastOp::Detach => self.ep.detach_mcast(group, qpn)?,
        };
        match change {
            GroupChange::Joined => {
                let joined = UdpPort::join(group, self.ep.local_ip())
                    .and_then(|p| self.mcast_poll.add(p.raw_fd()).map(|()| p));
                match joined {
                    Ok(p) => self.mcast.push((group, p)),
                    Err(e) => {
                        let _ = self.ep.detach_mcast(group, qpn);
                        return Err(EngineError::Join {
                            group,
                            msg: e.to_string(),
                            errno: e.raw_os_error().unwrap_or(libc::EIO),
                        });
                    }
                }
            }
            GroupChange::Left => self.leave_unused_groups(),
            GroupChange::Unchanged => {}
        }
        Ok(())
    }

    /// Closes the sockets of groups no QP of the device is attached to
    /// any more (the kernel leaves the group with the last of them).
    fn leave_unused_groups(&mut self) {
        let ep = &self.ep;
        let poll = &self.mcast_poll;
        self.mcast.retain(|(g, p)| {
            let keep = !ep.group_members(*g).is_empty();
            if !keep {
                poll.remove(p.raw_fd());
            }
            keep
        });
    }

    /// Receives batches of datagrams (GRO aggregates split at their
    /// segment size) from the device's socket and its groups' sockets,
    /// and hands each packet to the endpoint; returns how many datagrams
    /// it read.
    fn receive(&mut self) -> usize {
        let mut count = self.receive_port(None);
        for i in 0..self.mcast.len() {
            count += self.receive_port(Some(i));
        }
        count
    }

    /// [`Driver::receive`] from one socket: the device's (`None`) or a
    /// group's.
    fn receive_port(&mut self, group: Option<usize>) -> usize {
        let mut count = 0;
        for _ in 0..RX_CALLS_PER_PASS {
            let (port, to_ip) = match group {
                None => (&mut self.port, self.ep.local_ip()),
                Some(i) => {
                    let (g, p) = &mut self.mcast[i];
                    (p, *g)
                }
            };
            let (n, dropped) = port.recv_batch(&mut self.rx);
            if dropped > 0 {
                self.counters()
                    .rx_socket_drops
                    .fetch_add(dropped, Ordering::Relaxed);
            }
            if n == 0 {
                break;
            }
            count += n;
            Counters::inc(&self.counters().rx_syscalls);
            let now = self.now();
            let to = SocketAddr::new(to_ip, uroce_wire::ROCEV2_UDP_PORT);
            for i in 0..n {
                let m = self.rx.msgs[i];
                if m.seg != 0 && m.len > m.seg {
                    Counters::inc(&self.counters().rx_gro_msgs);
                }
                let seg = if m.seg == 0 { m.len } else { m.seg };
                let slot = self.rx.slot_mut(i);
                // Packet k sits at HEADROOM + k * seg; the bytes in front
                // of it (the previous packet's, already handled) are the
                // scratch space its in-place ICRC check needs.
                let mut off = 0;
                while off < m.len {
                    let len = seg.min(m.len - off);
                    let buf = &mut slot[off..HEADROOM + off + len];
                    if let (None, Some(st)) = (group, &self.steer) {
                        let pkt = &buf[HEADROOM..];
                        match st.screen(pkt, m.from) {
                            Screen::Deliver => {}
                            Screen::Foreign => {
                                Counters::inc(&self.ep.counters().rx_foreign);
                                off += len;
                                continue;
                            }
                            Screen::Probe => {
                                let _ = self.port.send_one(&st.answer(pkt), m.from);
                                off += len;
                                continue;
                            }
                            Screen::Forward(f) => {
                                // Another member's, steered here while
                                // the group changed: sent again once the
                                // program is rebuilt (or dropped, as
                                // above). One for a member that has gone
                                // is this one's to answer (its CM
                                // answers for the dead).
                                if f.slot != st.slot() && st.is_live(f.slot) {
                                    Counters::inc(&self.ep.counters().rx_foreign);
                                    st.misrouted_forward(&buf[HEADROOM..]);
                                } else {
                                    let ip = RxIp {
                                        tclass: f.tclass,
                                        hop_limit: m.ttl,
                                    };
                                    let inner = &mut buf[share::FORWARD_LEN..];
                                    self.ep.handle_datagram_to(now, f.from, to_ip, ip, inner);
                                }
                                off += len;
                                continue;
                            }
                        }
                    }
                    let ip = RxIp {
                        tclass: m.tos,
                        hop_limit: m.ttl,
                    };
                    let r = self.ep.handle_datagram_to(now, m.from, to_ip, ip, buf);
                    if let Some(c) = self.capture.as_mut() {
                        let fields = (m.tos, Some(m.ttl));
                        c.record(m.from, to, r.ipv4_id, fields, &buf[HEADROOM..]);
                    }
                    off += len;
                }
            }
            if n < RX_BATCH {
                break;
            }
        }
        count
    }

    /// Sends what the endpoint has to send, up to a pass's worth, in one
    /// batch: each QP's run of equal-size packets to one destination goes
    /// out as one UDP GSO message, the messages together in `sendmmsg`.
    fn transmit(&mut self) -> bool {
        let now = self.now();
        if self.faults.is_some() {
            return self.transmit_faulty(now);
        }
        self.tx.clear();
        let mut end = 0;
        let mut shift: Option<(usize, Ipv4IdShift)> = None;
        for _ in 0..TX_PER_PASS {
            let Some(t) = self
                .ep
                .poll_transmit(now, &mut self.txbuf[end..end + MAX_DATAGRAM])
            else {
                break;
            };
            let dst = SocketAddr::new(t.dst, uroce_wire::ROCEV2_UDP_PORT);
            let joins = self.port.gso()
                && self.tx.last().is_some_and(|m: &TxMsg| {
                    let seg = m.packet_size();
                    // One TOS and TTL per message: the kernel writes one
                    // IP header for all of a GSO message's packets. One
                    // destination QP too: a shared device's host steers a
                    // message by its first packet's (see `share`).
                    m.dst == dst
                        && same_dest_qp(&self.txbuf[m.off..], &self.txbuf[end..])
                        && m.tos == t.tclass
                        && m.ttl == t.hop_limit
                        && m.off + m.len == end
                        && m.len % seg == 0
                        && t.len <= seg
                        && m.len + t.len <= GSO_MAX_BYTES
                        && m.len / seg < GSO_MAX_SEGMENTS
                });
            if joins {
                let m = self.tx.last_mut().expect("joins a message");
                let seg = m.packet_size();
                let k = m.len / seg;
                m.seg = seg;
                m.len += t.len;
                // The kernel gives the k-th packet of a GSO message IPv4
                // identification k (it counts up from the message's, 0
                // with DF on our unconnected socket): its ICRC must cover
                // that header.
                if dst.is_ipv4() {
                    let sh = match shift {
                        Some((len, sh)) if len == t.len => sh,
                        _ => Ipv4IdShift::new(t.len),
                    };
                    shift = Some((t.len, sh));
                    sh.apply(&mut self.txbuf[end..end + t.len], k as u16);
                }
            } else {
                self.tx.push(TxMsg {
                    off: end,
                    len: t.len,
                    dst,
                    seg: 0,
                    tos: t.tclass,
                    ttl: t.hop_limit,
                });
            }
            end += t.len;
        }
        if self.tx.is_empty() {
            return self.send_delayed();
        }
        if let Some(c) = self.capture.as_mut() {
            let src = SocketAddr::new(self.ep.local_ip(), uroce_wire::ROCEV2_UDP_PORT);
            for m in &self.tx {
                let seg = m.packet_size();
                for (k, p) in self.txbuf[m.off..m.off + m.len].chunks(seg).enumerate() {
                    let id = if m.seg == 0 { 0 } else { k as u16 };
                    c.record(src, m.dst, (id, true), (m.tos, m.ttl), p);
                }
            }
        }
        let gso: usize = self
            .tx
            .iter()
            .filter(|m| m.seg != 0)
            .map(TxMsg::packets)
            .sum();
        self.counters()
            .tx_gso_msgs
            .fetch_add(gso as u64, Ordering::Relaxed);
        let st = self.port.send_batch(&self.txbuf[..end], &self.tx);
        self.count_sent(st);
        self.send_delayed();
        true
    }

    /// Counts what a [`UdpPort::send_batch`] call did.
    fn count_sent(&self, st: socket::TxStats) {
        let c = self.counters();
        c.tx_syscalls.fetch_add(st.syscalls, Ordering::Relaxed);
        c.tx_socket_drops.fetch_add(st.dropped, Ordering::Relaxed);
    }

    /// [`Driver::transmit`] with the fault injector on: packet by packet,
    /// each planned (lost, delayed, duplicated, corrupted) on its own.
    fn transmit_faulty(&mut self, now: Nanos) -> bool {
        let mut any = false;
        for _ in 0..TX_PER_PASS {
            let Some(t) = self.ep.poll_transmit(now, &mut self.txbuf[..MAX_DATAGRAM]) else {
                break;
            };
            any = true;
            let dst = SocketAddr::new(t.dst, uroce_wire::ROCEV2_UDP_PORT);
            let Some(inj) = self.faults.as_mut() else {
                break;
            };
            let copies: Vec<_> = inj.inject(&self.txbuf[..t.len], 1).collect();
            if copies.is_empty() && observe::wants(Topic::TIMELINE) {
                if let Some(qpn) = self.ep.last_sender() {
                    observe::tell_packet_bytes(qpn, Dir::Lost, &self.txbuf[..t.len]);
                }
            }
            for (delay, b) in copies {
                self.delayed_seq += 1;
                let due = now.plus(delay);
                let ip = (t.tclass, t.hop_limit);
                self.delayed
                    .push(Reverse((due, self.delayed_seq, dst, ip, b)));
            }
        }
        any |= self.send_delayed();
        any
    }

    /// Sends the fault injector's held-back packets that are due.
    fn send_delayed(&mut self) -> bool {
        let now = self.now();
        let mut any = false;
        while let Some(Reverse((due, ..))) = self.delayed.peek() {
            if *due > now {
                break;
            }
            if let Some(Reverse((_, _, dst, (tos, ttl), b))) = self.delayed.pop() {
                let src = self.local();
                if let Some(c) = self.capture.as_mut() {
                    c.record(src, dst, (0, true), (tos, ttl), &b);
                }
                let st = self.port.send_batch(
                    &b,
                    &[TxMsg {
                        off: 0,
                        len: b.len(),
                        dst,
                        seg: 0,
                        tos,
                        ttl,
                    }],
                );
                self.count_sent(st);
                any = true;
            }
        }
        any
    }
}

/// The engine thread: commands and passes over the driver; when idle, a
/// short spin, then a sleep until a packet, a doorbell or the next
/// deadline. Application threads drive the same driver between its
/// passes ([`Engine::progress`], [`Engine::post_kick`]).
fn run(shared: &Shared, cmds: &Receiver<Command>) {
    ENGINE_THREAD.with(|t| t.set(shared as *const Shared as usize));
    let mut idle_since: Option<Nanos> = None;
    // A long yield with no application poll was seen (see LONG_YIELD_NS):
    // the count of polls then, and when. Spinning resumes once the count
    // has moved by RESUME_POLLS or NO_SPIN_NS have passed.
    let mut no_spin: Option<(u64, u64)> = None;
    while !shared.stop.load(Ordering::Acquire) {
        let (work, deadline) = {
            // Taken without parking: an application thread holds it for
            // one pass at a time, and a parked engine thread would cost
            // that thread a wake-up system call at every unlock.
            let mut g = loop {
                if let Some(g) = shared.driver.try_lock() {
                    break g;
                }
                std::thread::yield_now();
            };
            let Some(d) = g.as_mut() else { break };
            let mut work = d.commands(cmds);
            work |= d.pass(&shared.ready);
            d.flush_capture();
            // Output an application pass holds back is not work: this
            // thread sleeps until the hold ends (a deadline) or a doorbell.
            work |= d.ep.has_output() && !d.holding();
            let deadline = d.deadline();
            shared
                .planned
                .store(deadline.map_or(u64::MAX, |t| t.0), Ordering::Relaxed);
            (work, deadline)
        };
        if work {
            idle_since = None;
            continue;
        }
        let now = shared.now();
        let since = *idle_since.get_or_insert(now);
        let polls = shared.app_polls.load(Ordering::Relaxed);
        if no_spin
            .is_some_and(|(p, at)| polls.wrapping_sub(p) >= RESUME_POLLS || now.0 - at > NO_SPIN_NS)
        {
            no_spin = None;
        }
        if now.0 - since.0 < SPIN_NS && no_spin.is_none() {
            // Yielding while spinning lets the application (and a peer
            // engine) run when threads outnumber cores.
            std::thread::yield_now();
            let after = shared.now().0;
            if after - now.0 > LONG_YIELD_NS && shared.app_polls.load(Ordering::Relaxed) == polls {
                no_spin = Some((polls, after));
            }
            continue;
        }
        // Block until a packet, a doorbell or the next deadline.
        let timeout_ns = deadline.map_or(1_000_000_000, |t| t.0.saturating_sub(now.0));
        shared.doorbell.set_sleeping(true);
        // After `set_sleeping`: an application pass that moved the
        // deadline either shows here or rings (see `Engine::drive`).
        let moved = shared.deadline_moved.swap(false, Ordering::SeqCst);
        if shared.ready.is_empty() && cmds.is_empty() && !moved {
            socket::wait(
                shared.sock_fd,
                &shared.mcast_poll,
                &shared.doorbell,
                timeout_ns.min(1_000_000_000),
            );
        }
        shared.doorbell.set_sleeping(false);
        shared.doorbell.drain();
        idle_since = None;
    }
    // The socket closes with the driver: then the address is free for a
    // new engine. What is queued (a deferred ACK) goes out first.
    if let Some(mut d) = shared.driver.lock().take() {
        d.flush();
        if let Some(c) = d.capture.take() {
            let _ = c.finish();
        }
    }
}

/// Whether a QP state lets the application post send WRs.
pub fn can_post_send(state: QpState) -> bool {
    matches!(
        state,
        QpState::Rts | QpState::Sqd | QpState::Err | QpState::Sqe
    )
}

#[cfg(test)]
mod tests {
    use super::same_dest_qp;
    use std::net::SocketAddr;

    /// A BTH to `qpn`, as far as the steering reads.
    fn bth(qpn: u32) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p
    }

    #[test]
    fn a_gso_message_holds_packets_the_host_steers_alike() {
        assert!(same_dest_qp(&bth(0x04_0001), &bth(0x04_0001)));
        assert!(!same_dest_qp(&bth(0x04_0001), &bth(0x08_0001)));
        // Every MAD goes to QP1's holder.
        assert!(same_dest_qp(&bth(1), &bth(1)));
        // Forwards to two members: one QPN, steered by the slot after it.
        let from: SocketAddr = "127.0.0.9:4791".parse().unwrap();
        let to = |slot| super::share::forward_header(slot, from, 0);
        assert!(same_dest_qp(&to(3), &to(3)));
        assert!(!same_dest_qp(&to(3), &to(4)));
    }
}
