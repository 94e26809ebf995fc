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

mod capture;
pub mod device;
mod socket;

use crate::counters::Counters;
use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventType};
use crate::memory::KeyTable;
use crate::net::faults::{FaultInjector, Faults};
use crate::qp_attr::{AttrMask, ModifyError, QpAttr};
use crate::transport::{Nanos, QpMachine, RxMeta};
use crate::types::QpState;
use crossbeam::channel::{self, Receiver, Sender};
use crossbeam::queue::SegQueue;
use socket::{Doorbell, UdpPort};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;
use uroce_wire::icrc::{verify_unknown_ipv4_id_in_place, IpContext, HEADROOM};
use uroce_wire::packet;

pub use device::DeviceConfig;

/// How long the engine spins without work before it blocks. Short: on a
/// 2-core machine the application and a peer engine need the CPU.
const SPIN_NS: u64 = 200_000;
/// Stale timer entries allowed beyond two per QP before the heap is
/// rebuilt.
const TIMER_SLACK: usize = 64;
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
    Capture(Option<std::path::PathBuf>, Sender<Result<(), String>>),
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

thread_local! {
    /// The [`Shared`] (as an address) of the engine whose worker runs on
    /// this thread; 0 on every other thread.
    static ENGINE_THREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

struct Shared {
    doorbell: Doorbell,
    stop: AtomicBool,
    ready: SegQueue<u32>,
}

/// A running engine. Dropping it stops the thread and closes the socket.
pub struct Engine {
    shared: Arc<Shared>,
    epoch: Instant,
    cmds: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    keys: Arc<KeyTable>,
    local_ip: IpAddr,
    events: Arc<AsyncEvents>,
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
        let port = UdpPort::bind(ip).map_err(|e| EngineError::Bind {
            addr: ip,
            msg: e.to_string(),
        })?;
        let doorbell = Doorbell::new().map_err(|e| EngineError::Bind {
            addr: ip,
            msg: format!("eventfd: {e}"),
        })?;
        let events = Arc::new(AsyncEvents::new().map_err(|e| EngineError::Bind {
            addr: ip,
            msg: format!("eventfd: {e}"),
        })?);
        // The socket is bound: the port is up.
        events.push(AsyncEvent {
            event_type: EventType::PortActive,
            element: EventElement::Port(1),
        });
        let shared = Arc::new(Shared {
            doorbell,
            stop: AtomicBool::new(false),
            ready: SegQueue::new(),
        });
        let (tx, rx) = channel::unbounded();
        let counters = Arc::new(Counters::default());
        let epoch = Instant::now();
        let mut worker = Worker {
            shared: shared.clone(),
            cmds: rx,
            port,
            local_ip: ip,
            qps: HashMap::new(),
            dirty: VecDeque::new(),
            timers: BinaryHeap::new(),
            counters: counters.clone(),
            epoch,
            buf: vec![0u8; MAX_DATAGRAM],
            rbuf: vec![0u8; HEADROOM + MAX_DATAGRAM],
            faults: faults.filter(|f| !f.is_none()).map(FaultInjector::new),
            capture: None,
            delayed: BinaryHeap::new(),
            delayed_seq: 0,
        };
        let thread = std::thread::Builder::new()
            .name(format!("uroce-engine-{ip}"))
            .spawn(move || {
                worker.run();
                // The socket closes with the worker: then the address is
                // free for a new engine.
                drop(worker);
                released(ip);
            })
            .map_err(|e| EngineError::Bind {
                addr: ip,
                msg: format!("spawn: {e}"),
            })?;
        Ok(Engine {
            shared,
            epoch,
            cmds: tx,
            thread: Some(thread),
            counters,
            keys,
            local_ip: ip,
            events,
        })
    }

    /// The device's asynchronous event queue.
    pub fn events(&self) -> &Arc<AsyncEvents> {
        &self.events
    }

    /// The device address.
    pub fn local_ip(&self) -> IpAddr {
        self.local_ip
    }
    /// Device counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
    /// The key table.
    pub fn keys(&self) -> &Arc<KeyTable> {
        &self.keys
    }

    /// Tells the engine that QP `qpn` has new work (a posted WR).
    #[inline]
    pub fn kick(&self, qpn: u32) {
        self.shared.ready.push(qpn);
        self.shared.doorbell.ring_if_sleeping();
    }

    /// The engine's clock: the time its QPs' deadlines are in.
    pub fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    /// A handle that kicks QPs and reads the clock without the engine
    /// (for code that must not keep the engine alive).
    pub fn kicker(&self) -> Kicker {
        Kicker {
            shared: Arc::downgrade(&self.shared),
            epoch: self.epoch,
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

    /// Returns once the engine has finished whatever packet it was
    /// processing: after a region's keys are removed, no copy into it is
    /// in progress when this returns.
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
        STOPPING.0.lock().insert(self.local_ip);
        self.shared.stop.store(true, Ordering::Release);
        self.shared.doorbell.ring();
        // Dropped on its own thread (the last handle released inside a
        // callback), the engine cannot wait for itself: the stop flag ends
        // the loop as soon as the callback returns.
        if let Some(t) = self.thread.take() {
            if !self.on_own_thread() {
                let _ = t.join();
            }
        }
    }
}

/// A QP in the engine, with its scheduling state.
struct Slot {
    qp: Box<dyn QpMachine>,
    /// Queued in `Worker::dirty`.
    dirty: bool,
    /// The deadline last entered in `Worker::timers`.
    deadline: Option<Nanos>,
}

/// A packet the fault injector holds back: (due, order, destination, bytes).
type Delayed = (Nanos, u64, SocketAddr, Vec<u8>);

struct Worker {
    shared: Arc<Shared>,
    cmds: Receiver<Command>,
    port: UdpPort,
    local_ip: IpAddr,
    qps: HashMap<u32, Slot>,
    /// QPs that may have packets to send, each once, in the order they
    /// became so: only these are polled for output.
    dirty: VecDeque<u32>,
    /// (deadline, QPN) of every QP's next timer; entries a QP's later
    /// reschedule made stale are skipped when they come up.
    timers: BinaryHeap<Reverse<(Nanos, u32)>>,
    counters: Arc<Counters>,
    epoch: Instant,
    buf: Vec<u8>,
    rbuf: Vec<u8>,
    faults: Option<FaultInjector>,
    /// Packets held back by the fault injector.
    delayed: BinaryHeap<Reverse<Delayed>>,
    delayed_seq: u64,
    capture: Option<capture::Capture>,
}

impl Worker {
    fn now(&self) -> Nanos {
        Nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn run(&mut self) {
        ENGINE_THREAD.with(|t| t.set(Arc::as_ptr(&self.shared) as usize));
        let mut idle_since: Option<Nanos> = None;
        while !self.shared.stop.load(Ordering::Acquire) {
            let mut work = self.commands();
            work |= self.receive();
            while let Some(qpn) = self.shared.ready.pop() {
                self.mark(qpn);
                work = true;
            }
            work |= self.transmit();
            work |= self.timers();
            self.compact_timers();
            if work {
                idle_since = None;
                continue;
            }
            let now = self.now();
            let since = *idle_since.get_or_insert(now);
            if now.0 - since.0 < SPIN_NS {
                // Yielding while spinning lets the application (and a peer
                // engine) run when threads outnumber cores.
                std::thread::yield_now();
                continue;
            }
            // Block until a packet, a doorbell or the next deadline.
            let deadline = self
                .timers
                .peek()
                .map(|Reverse((t, _))| *t)
                .into_iter()
                .chain(self.delayed.peek().map(|Reverse((due, ..))| *due))
                .min();
            let timeout_ms = match deadline {
                Some(t) => (t.0.saturating_sub(self.now().0))
                    .div_ceil(1_000_000)
                    .min(1000) as i32,
                None => 1000,
            };
            self.shared.doorbell.set_sleeping(true);
            if self.shared.ready.is_empty() && self.cmds.is_empty() {
                self.port.wait(&self.shared.doorbell, timeout_ms);
            }
            self.shared.doorbell.set_sleeping(false);
            self.shared.doorbell.drain();
            idle_since = None;
        }
        if let Some(c) = self.capture.take() {
            let _ = c.finish();
        }
    }

    fn commands(&mut self) -> bool {
        let mut any = false;
        while let Ok(cmd) = self.cmds.try_recv() {
            any = true;
            match cmd {
                Command::AddQp(qp, tx) => {
                    let qpn = qp.qpn();
                    let slot = Slot {
                        qp,
                        dirty: false,
                        deadline: None,
                    };
                    self.qps.insert(qpn, slot);
                    self.mark(qpn);
                    let _ = tx.send(());
                }
                Command::Modify(qpn, attr, mask, tx) => {
                    let r = match self.qps.get_mut(&qpn) {
                        Some(s) => {
                            s.qp.modify(&attr, mask)
                                .map(|()| s.qp.attr())
                                .map_err(EngineError::from)
                        }
                        None => Err(EngineError::NoQp(qpn)),
                    };
                    // A state change can start sending (SQD -> RTS) or
                    // flushing, and moves timers.
                    self.mark(qpn);
                    let _ = tx.send(r);
                }
                Command::Query(qpn, tx) => {
                    let r = self
                        .qps
                        .get(&qpn)
                        .map(|s| s.qp.attr())
                        .ok_or(EngineError::NoQp(qpn));
                    let _ = tx.send(r);
                }
                Command::Destroy(qpn, tx) => {
                    let r = self
                        .qps
                        .remove(&qpn)
                        .map(|_| ())
                        .ok_or(EngineError::NoQp(qpn));
                    let _ = tx.send(r);
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
                        self.qps
                            .get(&qpn)
                            .map_or_else(|| "no such QP".into(), |s| format!("{:#?}", s.qp)),
                    );
                }
                Command::SetFaults(f, tx) => {
                    self.faults = f.filter(|f| !f.is_none()).map(FaultInjector::new);
                    let _ = tx.send(());
                }
            }
        }
        any
    }

    /// Receives a batch of datagrams and hands each to its QP.
    fn receive(&mut self) -> bool {
        let mut any = false;
        for _ in 0..64 {
            // Datagrams land after HEADROOM bytes: the ICRC is computed in
            // place, in one pass over contiguous bytes.
            let Some((len, from)) = self.port.recv(&mut self.rbuf[HEADROOM..]) else {
                break;
            };
            any = true;
            let now = self.now();
            let ctx = icrc_context(from, self.local_ip);
            let verified = verify_unknown_ipv4_id_in_place(&ctx, &mut self.rbuf[..HEADROOM + len]);
            let bytes = &self.rbuf[HEADROOM..HEADROOM + len];
            let pkt = match packet::parse(bytes) {
                Ok(p) => p,
                Err(_) => {
                    if let Some(c) = self.capture.as_mut() {
                        c.record(
                            from,
                            SocketAddr::new(self.local_ip, uroce_wire::ROCEV2_UDP_PORT),
                            (0, true),
                            bytes,
                        );
                    }
                    Counters::inc(&self.counters.malformed_pkts);
                    continue;
                }
            };
            if let Some(c) = self.capture.as_mut() {
                let id = verified.map_or((0, true), |s| {
                    (s.ident, s.flags_frag & uroce_wire::icrc::IPV4_DF != 0)
                });
                c.record(
                    from,
                    SocketAddr::new(self.local_ip, uroce_wire::ROCEV2_UDP_PORT),
                    id,
                    bytes,
                );
            }
            if verified.is_err() {
                Counters::inc(&self.counters.icrc_errors);
                continue;
            }
            if pkt.info.operation == uroce_wire::Operation::Cnp {
                Counters::inc(&self.counters.cnp_rcvd);
                continue;
            }
            let qpn = pkt.bth.dest_qp;
            match self.qps.get_mut(&qpn) {
                Some(s) => {
                    let mut meta = RxMeta::new(from.ip(), self.local_ip);
                    meta.src_port = from.port();
                    if let Ok(id) = verified {
                        meta.ipv4_id = id.ident;
                        meta.ipv4_flags_frag = id.flags_frag;
                    }
                    s.qp.handle_packet(now, &meta, &pkt);
                    if !s.dirty {
                        s.dirty = true;
                        self.dirty.push_back(qpn);
                    }
                }
                None => Counters::inc(&self.counters.dropped_pkts),
            }
        }
        any
    }

    fn transmit(&mut self) -> bool {
        let mut any = false;
        let now = self.now();
        // Each QP queued now sends up to 32 packets, then goes to the back
        // of the queue if it has more: no QP starves the others.
        for _ in 0..self.dirty.len() {
            let Some(qpn) = self.dirty.pop_front() else {
                break;
            };
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            slot.dirty = false;
            let mut sent = 0;
            while sent < 32 {
                let Some(t) = slot.qp.poll_transmit(now, &mut self.buf) else {
                    break;
                };
                sent += 1;
                any = true;
                let dst = SocketAddr::new(t.dst, uroce_wire::ROCEV2_UDP_PORT);
                match self.faults.as_mut() {
                    None => {
                        if let Some(c) = self.capture.as_mut() {
                            let src = SocketAddr::new(self.local_ip, uroce_wire::ROCEV2_UDP_PORT);
                            c.record(src, dst, (0, true), &self.buf[..t.len]);
                        }
                        self.port.send(&self.buf[..t.len], dst)
                    }
                    Some(inj) => {
                        let plan = inj.plan(t.len, 1);
                        for i in 0..plan.copies as usize {
                            let mut b = self.buf[..t.len].to_vec();
                            if let Some(bit) = plan.flip_bit {
                                b[bit / 8] ^= 1 << (bit % 8);
                            }
                            self.delayed_seq += 1;
                            let due = now.plus(plan.delay_ns[i.min(1)]);
                            self.delayed.push(Reverse((due, self.delayed_seq, dst, b)));
                        }
                    }
                }
            }
            if sent == 32 {
                slot.dirty = true;
                self.dirty.push_back(qpn);
            }
            Self::schedule(&mut self.timers, qpn, slot);
        }
        any |= self.send_delayed();
        any
    }

    /// Sends the fault injector's held-back packets that are due.
    fn send_delayed(&mut self) -> bool {
        let now = self.now();
        let mut any = false;
        while let Some(Reverse((due, _, _, _))) = self.delayed.peek() {
            if *due > now {
                break;
            }
            if let Some(Reverse((_, _, dst, b))) = self.delayed.pop() {
                if let Some(c) = self.capture.as_mut() {
                    c.record(
                        SocketAddr::new(self.local_ip, uroce_wire::ROCEV2_UDP_PORT),
                        dst,
                        (0, true),
                        &b,
                    );
                }
                self.port.send(&b, dst);
                any = true;
            }
        }
        any
    }

    /// Runs the timers that are due; their QPs are queued for output
    /// (and rescheduled there).
    fn timers(&mut self) -> bool {
        let now = self.now();
        let mut any = false;
        while let Some(&Reverse((t, qpn))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(slot) = self.qps.get_mut(&qpn) else {
                continue;
            };
            if slot.deadline != Some(t) {
                continue; // stale: the QP was rescheduled since
            }
            slot.deadline = None;
            if slot.qp.poll_timeout().is_some_and(|d| d <= now) {
                slot.qp.handle_timeout(now);
                any = true;
            }
            if !slot.dirty {
                slot.dirty = true;
                self.dirty.push_back(qpn);
            }
        }
        any
    }

    /// Keeps the timer heap bounded: every reschedule leaves a stale entry
    /// behind until its time comes (an ACK stream moves a QP's deadline
    /// at every ACK, so stale entries would grow with ACK rate x timeout).
    /// Once the heap holds more than twice the QPs (plus slack), it is
    /// rebuilt from the QPs' current deadlines: O(QPs) work after at least
    /// as many pushes, so O(1) per push, and at most 2 x QPs + 64 entries.
    fn compact_timers(&mut self) {
        compact_timers(&mut self.timers, &self.qps);
    }

    /// Queues a QP for output (once).
    fn mark(&mut self, qpn: u32) {
        if let Some(s) = self.qps.get_mut(&qpn) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push_back(qpn);
            }
        }
    }

    /// Enters a QP's next deadline in the timer heap if it changed. Every
    /// path that touches a QP ends in `transmit`, which calls this.
    fn schedule(timers: &mut BinaryHeap<Reverse<(Nanos, u32)>>, qpn: u32, slot: &mut Slot) {
        let d = slot.qp.poll_timeout();
        if d != slot.deadline {
            slot.deadline = d;
            if let Some(t) = d {
                timers.push(Reverse((t, qpn)));
            }
        }
    }
}

/// See [`Worker::compact_timers`].
fn compact_timers(timers: &mut BinaryHeap<Reverse<(Nanos, u32)>>, qps: &HashMap<u32, Slot>) {
    if timers.len() <= 2 * qps.len() + TIMER_SLACK {
        return;
    }
    *timers = qps
        .iter()
        .filter_map(|(&qpn, s)| s.deadline.map(|t| Reverse((t, qpn))))
        .collect();
}

/// The ICRC context of a datagram from `from` to our `local` address on
/// port 4791 (the IPv4 identification is solved for; see `wire::icrc`).
fn icrc_context(from: SocketAddr, local: IpAddr) -> IpContext {
    match (from.ip(), local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            IpContext::for_socket_v4(s, d, from.port(), uroce_wire::ROCEV2_UDP_PORT)
        }
        (s, d) => IpContext::v6(v6(s), v6(d), from.port(), uroce_wire::ROCEV2_UDP_PORT),
    }
}

fn v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
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
    use super::*;
    use crate::types::QpType;

    /// A QP whose deadline moves at every ACK leaves a stale heap entry
    /// each time; the heap is rebuilt before it holds more than 2 x QPs +
    /// TIMER_SLACK entries, keeping each QP's current deadline.
    #[test]
    fn the_timer_heap_stays_bounded() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let mut qps = HashMap::new();
        for qpn in [1u32, 2] {
            let cfg = crate::testing::config(ip, qpn, 4);
            let qp = crate::transport::new_qp(QpType::Rc, cfg).unwrap();
            qps.insert(
                qpn,
                Slot {
                    qp,
                    dirty: false,
                    deadline: None,
                },
            );
        }
        let mut timers = BinaryHeap::new();
        for i in 0..10_000u64 {
            let qpn = 1 + (i % 2) as u32;
            let t = Nanos(i);
            qps.get_mut(&qpn).unwrap().deadline = Some(t);
            timers.push(Reverse((t, qpn)));
            compact_timers(&mut timers, &qps);
            assert!(timers.len() <= 2 * qps.len() + TIMER_SLACK);
        }
        let mut left: Vec<_> = timers.into_iter().map(|Reverse(e)| e).collect();
        left.sort();
        // Every QP's current deadline is still there.
        assert!(left.contains(&(Nanos(9_998), 1)) && left.contains(&(Nanos(9_999), 2)));
    }
}
