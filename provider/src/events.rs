//! Event delivery to applications: completion channels and the device's
//! asynchronous event queue.
//!
//! Both are a lock-free queue paired with an `eventfd` in semaphore mode:
//! every queued event adds one to the counter, every event taken reads one.
//! The descriptor is therefore readable exactly while an event waits, so
//! applications can put it in `poll`/`epoll` or an async runtime's reactor
//! as they would the descriptor of `ibv_comp_channel` or
//! `ibv_context::async_fd`.

use crate::cq::CqInner;
use crossbeam::queue::SegQueue;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Asynchronous event types (`ibv_event_type`, same numbering).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EventType {
    CqErr = 0,
    QpFatal = 1,
    QpReqErr = 2,
    QpAccessErr = 3,
    CommEst = 4,
    SqDrained = 5,
    PathMig = 6,
    PathMigErr = 7,
    DeviceFatal = 8,
    PortActive = 9,
    PortErr = 10,
    LidChange = 11,
    PkeyChange = 12,
    SmChange = 13,
    SrqErr = 14,
    SrqLimitReached = 15,
    QpLastWqeReached = 16,
    ClientReregister = 17,
    GidChange = 18,
    /// uroce's own (no `ibv_event_type` has it; the C library does not
    /// deliver it): a QP saw request packets with PSNs far outside any
    /// real requester's window at a rate only a PSN sweep produces (see
    /// the `psn_out_of_window` counter). Reported at most once a second.
    PsnSweep = 0x100,
}

impl EventType {
    /// True for the events libibverbs defines (the C library delivers only
    /// these).
    pub fn is_ibverbs(self) -> bool {
        (self as u32) <= EventType::GidChange as u32
    }
    /// The words `ibv_event_type_str` gives.
    pub fn as_str(self) -> &'static str {
        use EventType::*;
        match self {
            CqErr => "CQ error",
            QpFatal => "local work queue catastrophic error",
            QpReqErr => "invalid request local work queue error",
            QpAccessErr => "local access violation work queue error",
            CommEst => "communication established",
            SqDrained => "send queue drained",
            PathMig => "path migrated",
            PathMigErr => "path migration request error",
            DeviceFatal => "local catastrophic error",
            PortActive => "port active",
            PortErr => "port error",
            LidChange => "LID change",
            PkeyChange => "P_Key change",
            SmChange => "SM change",
            SrqErr => "SRQ catastrophic error",
            SrqLimitReached => "SRQ limit reached",
            QpLastWqeReached => "last WQE reached",
            ClientReregister => "client reregistration",
            GidChange => "GID table change",
            PsnSweep => "PSN sweep (uroce)",
        }
    }
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by handle ([`CqInner::handle`]).
    Cq(u32),
    /// An SRQ, by handle.
    Srq(u32),
    /// A port, by number.
    Port(u8),
    /// The device.
    Device,
}

/// An asynchronous event (`struct ibv_async_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub event_type: EventType,
    /// To what.
    pub element: EventElement,
}

/// An `eventfd` used as a counting semaphore.
#[derive(Debug)]
pub struct Semaphore {
    fd: OwnedFd,
}

impl Semaphore {
    /// A semaphore at zero.
    pub fn new() -> io::Result<Semaphore> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe {
            libc::eventfd(
                0,
                libc::EFD_SEMAPHORE | libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Semaphore {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
    /// Adds one.
    pub fn post(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
    /// Takes one if the count is positive.
    pub fn try_take(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking
        // eventfd (semaphore mode: takes one, or fails with EAGAIN).
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        n == 8
    }
    /// Waits until the descriptor is readable or `timeout` passes (`None`:
    /// forever). Returns false on timeout.
    pub fn wait_readable(&self, timeout: Option<Duration>) -> bool {
        let ms = match timeout {
            None => -1,
            Some(d) => d.as_millis().min(i32::MAX as u128) as i32,
        };
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, length 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        r > 0
    }
    /// Takes one, waiting up to `timeout` (`None`: forever).
    pub fn take(&self, timeout: Option<Duration>) -> bool {
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            if self.try_take() {
                return true;
            }
            let left = match end {
                None => None,
                Some(e) => {
                    let now = Instant::now();
                    if now >= e {
                        return false;
                    }
                    Some(e - now)
                }
            };
            // Another thread may take the count between poll and read: loop.
            self.wait_readable(left);
        }
    }
    /// The descriptor (readable while the count is positive).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A queue of events with a descriptor that is readable while one waits.
#[derive(Debug)]
pub struct EventQueue<T> {
    queue: SegQueue<T>,
    sem: Semaphore,
}

impl<T> EventQueue<T> {
    /// An empty queue.
    pub fn new() -> io::Result<EventQueue<T>> {
        Ok(EventQueue {
            queue: SegQueue::new(),
            sem: Semaphore::new()?,
        })
    }
    /// Queues an event (never blocks; called by the engine).
    pub fn push(&self, ev: T) {
        self.queue.push(ev);
        self.sem.post();
    }
    /// The next event, waiting up to `timeout` (`None`: forever;
    /// `Some(ZERO)`: do not wait).
    pub fn get(&self, timeout: Option<Duration>) -> Option<T> {
        if !self.sem.take(timeout) {
            return None;
        }
        // The count is taken after the push it stands for: the event is
        // there.
        self.queue.pop()
    }
    /// Events waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
    /// The descriptor to wait on.
    pub fn fd(&self) -> RawFd {
        self.sem.fd()
    }
}

/// A device's asynchronous event queue.
pub type AsyncEvents = EventQueue<AsyncEvent>;

/// A completion channel: CQs armed with `req_notify` queue themselves here
/// when a completion arrives.
pub type CompChannel = EventQueue<Weak<CqInner>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semaphore_counts_and_fd_readiness() {
        let q: EventQueue<u32> = EventQueue::new().unwrap();
        assert!(!q.sem.wait_readable(Some(Duration::ZERO)));
        assert_eq!(q.get(Some(Duration::ZERO)), None);
        q.push(1);
        q.push(2);
        assert!(q.sem.wait_readable(Some(Duration::ZERO)));
        assert_eq!(q.get(None), Some(1));
        assert!(q.sem.wait_readable(Some(Duration::ZERO)));
        assert_eq!(q.get(Some(Duration::ZERO)), Some(2));
        assert!(!q.sem.wait_readable(Some(Duration::ZERO)));
    }

    #[test]
    fn get_blocks_until_pushed() {
        let q = std::sync::Arc::new(EventQueue::<u32>::new().unwrap());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.get(None));
        std::thread::sleep(Duration::from_millis(20));
        q.push(7);
        assert_eq!(t.join().unwrap(), Some(7));
        assert_eq!(
            q.get(Some(Duration::from_millis(10))),
            None,
            "times out when empty"
        );
    }
}
