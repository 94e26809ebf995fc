//! Event delivery to applications: completion channels and the device's
//! asynchronous event queue.
//!
//! Both are a lock-free queue paired with an `eventfd` in semaphore mode:
//! every queued event adds one to the counter, every event taken reads one.
//! The descriptor is therefore readable exactly while an event waits, so
//! applications can put it in `poll`/`epoll` or an async runtime's reactor
//! as they would the descriptor of `ibv_comp_channel` or
//! `ibv_context::async_fd`.

use crossbeam::queue::SegQueue;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

value_enum! {
    /// Asynchronous event types (`ibv_event_type`, same numbering).
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum EventType: u32 {
        CqErr = 0 => "CQ error",
        QpFatal = 1 => "local work queue catastrophic error",
        QpReqErr = 2 => "invalid request local work queue error",
        QpAccessErr = 3 => "local access violation work queue error",
        CommEst = 4 => "communication established",
        SqDrained = 5 => "send queue drained",
        PathMig = 6 => "path migrated",
        PathMigErr = 7 => "path migration request error",
        DeviceFatal = 8 => "local catastrophic error",
        PortActive = 9 => "port active",
        PortErr = 10 => "port error",
        LidChange = 11 => "LID change",
        PkeyChange = 12 => "P_Key change",
        SmChange = 13 => "SM change",
        SrqErr = 14 => "SRQ catastrophic error",
        SrqLimitReached = 15 => "SRQ limit reached",
        QpLastWqeReached = 16 => "last WQE reached",
        ClientReregister = 17 => "client reregistration",
        GidChange = 18 => "GID table change",
        /// uroce's own (no `ibv_event_type` has it; the C library does not
        /// deliver it): a QP saw request packets with PSNs far outside any
        /// real requester's window at a rate only a PSN sweep produces (see
        /// the `psn_out_of_window` counter). Reported at most once a second.
        PsnSweep = 0x100 => "PSN sweep (uroce)",
    }
    /// The words `ibv_event_type_str` gives.
    pub as_str: names;
}

impl EventType {
    /// True for the events libibverbs defines (the C library delivers only
    /// these).
    pub fn is_ibverbs(self) -> bool {
        (self as u32) <= EventType::GidChange as u32
    }
}

/// What an asynchronous event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ, by handle ([`crate::device::CqHandle::handle`]).
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

/// Adds one to the counter of eventfd `fd` (an 8-byte `write(2)`, its
/// result unchecked as the callers always had it).
#[inline]
pub(crate) fn eventfd_add_one(fd: BorrowedFd<'_>) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to a descriptor the borrow
    // keeps open.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

/// One 8-byte `read(2)` of eventfd `fd` (the whole counter, or one in
/// semaphore mode); true when it read, false when it failed (`errno`
/// says why, e.g. EAGAIN on a non-blocking descriptor at zero).
#[inline]
pub(crate) fn eventfd_read(fd: BorrowedFd<'_>) -> bool {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a descriptor the borrow
    // keeps open.
    let n = unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    n == 8
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
        eventfd_add_one(self.fd.as_fd());
    }
    /// Takes one if the count is positive.
    pub fn try_take(&self) -> bool {
        // Semaphore mode: takes one, or fails with EAGAIN (non-blocking).
        eventfd_read(self.fd.as_fd())
    }
    /// Takes one, waiting as long as it takes, as a `read(2)` of the
    /// descriptor does: on a blocking descriptor (the C library makes its
    /// descriptors blocking, as the kernel's are) the wait *is* that read,
    /// so a signal handler installed without `SA_RESTART` ends it with
    /// [`io::ErrorKind::Interrupted`] (EINTR) and one with `SA_RESTART`
    /// has the kernel restart it. On a non-blocking descriptor it waits in
    /// `poll(2)`, which a handler always interrupts (EINTR).
    pub fn wait(&self) -> io::Result<()> {
        loop {
            if eventfd_read(self.fd.as_fd()) {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(e);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, length 1.
            if unsafe { libc::poll(&mut pfd, 1, -1) } < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // Readable, or another thread took the count first: read again.
        }
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
    /// The next event, waiting as [`Semaphore::wait`] does (the error:
    /// EINTR).
    pub fn wait(&self) -> io::Result<T> {
        loop {
            self.sem.wait()?;
            // The count is taken after the push it stands for.
            if let Some(ev) = self.queue.pop() {
                return Ok(ev);
            }
        }
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

    extern "C" fn on_signal(_: libc::c_int) {}

    /// Waits in `q.wait()` on a thread of its own while SIGUSR2 (handled
    /// with `flags`) is sent to that thread every 20 ms for 300 ms; then
    /// pushes 7. Returns what the wait returned.
    fn wait_under_signals(blocking: bool, flags: libc::c_int) -> io::Result<u32> {
        // SAFETY: a handler that does nothing, installed for SIGUSR2,
        // which nothing else in this test binary uses.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = flags;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        let q = std::sync::Arc::new(EventQueue::<u32>::new().unwrap());
        if blocking {
            // SAFETY: F_GETFL/F_SETFL on the queue's own descriptor.
            unsafe {
                let fl = libc::fcntl(q.fd(), libc::F_GETFL);
                libc::fcntl(q.fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let q2 = q.clone();
        let t = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            q2.wait()
        });
        let waiter = rx.recv().unwrap();
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(20));
            if t.is_finished() {
                break;
            }
            // SAFETY: the thread is alive (not finished, not joined).
            unsafe { libc::pthread_kill(waiter, libc::SIGUSR2) };
        }
        q.push(7);
        t.join().unwrap()
    }

    #[test]
    fn a_signal_handler_interrupts_a_wait_as_it_does_read() {
        // Blocking descriptor: the kernel's read(2) answers EINTR without
        // SA_RESTART and restarts itself with it.
        let r = wait_under_signals(true, 0);
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Interrupted);
        assert_eq!(wait_under_signals(true, libc::SA_RESTART).unwrap(), 7);
        // Non-blocking descriptor: the wait is a poll(2), which a handler
        // always interrupts.
        let r = wait_under_signals(false, libc::SA_RESTART);
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Interrupted);
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
