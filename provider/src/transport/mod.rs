//! The transport as sans-IO state machines.
//!
//! A QP's state machine never reads a clock or touches a socket. Its
//! contract (after quinn-proto):
//!
//! * `handle_packet(now, src, packet)` takes one parsed, ICRC-checked
//!   packet addressed to the QP;
//! * `poll_transmit(now, buf)` writes the next packet to send (a whole UDP
//!   payload, BTH to ICRC) into `buf` and says where it goes, or `None`;
//! * `poll_timeout()` names the next deadline; `handle_timeout(now)` may be
//!   called at or after it, and spuriously;
//! * work requests come in through the lock-free queues the application
//!   posts to ([`SendQueue`], [`RecvQueue`]); completions go out to the
//!   CQs.
//!
//! The same code runs under the UDP engine and the simulated network.

pub mod rc;
pub mod sgl;
pub mod status;

use crate::types::{RecvWr, SendWr};
use crossbeam::queue::ArrayQueue;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

/// Monotonic time in nanoseconds (real or virtual).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Nanos(pub u64);

impl Nanos {
    /// `self + ns`, saturating.
    pub const fn plus(self, ns: u64) -> Nanos {
        Nanos(self.0.saturating_add(ns))
    }
}

/// A packet the state machine produced: `len` bytes at the start of the
/// caller's buffer, for UDP port 4791 at `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Destination IP.
    pub dst: IpAddr,
    /// Bytes written.
    pub len: usize,
}

/// Why posting a work request failed (errno-like, as verbs reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue is full (ENOMEM).
    #[error("work queue full")]
    QueueFull,
    /// The QP's state does not allow posting (EINVAL).
    #[error("QP state does not allow posting")]
    BadState,
    /// The WR is malformed: too many SGEs, inline too long, bad opcode for
    /// the QP type, ... (EINVAL).
    #[error("invalid work request: {0}")]
    Invalid(&'static str),
}

/// The send queue shared by the posting threads and the engine.
#[derive(Debug)]
pub struct SendQueue {
    queue: ArrayQueue<SendWr>,
    outstanding: AtomicU32,
    max: u32,
}

impl SendQueue {
    /// A queue of `max` WRs (at least 1).
    pub fn new(max: u32) -> SendQueue {
        let max = max.max(1);
        SendQueue {
            queue: ArrayQueue::new(max as usize),
            outstanding: AtomicU32::new(0),
            max,
        }
    }
    /// Depth.
    pub fn capacity(&self) -> u32 {
        self.max
    }
    /// Posts a WR. A WR occupies its slot until it completes (or, when
    /// unsignaled, until a later completion retires it).
    pub fn post(&self, wr: SendWr) -> Result<(), PostError> {
        if self.outstanding.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(PostError::QueueFull);
        }
        // Cannot fail: the queue holds `max` and at most `max` are posted.
        self.queue.push(wr).map_err(|_| PostError::QueueFull)
    }
    /// The engine takes the next posted WR.
    pub fn take(&self) -> Option<SendWr> {
        self.queue.pop()
    }
    /// True when WRs wait to be taken.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }
    /// The engine retires `n` WRs (completed or flushed).
    pub fn retire(&self, n: u32) {
        self.outstanding.fetch_sub(n, Ordering::AcqRel);
    }
    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// The receive queue (or an SRQ's queue) shared by posting threads and the
/// engine.
#[derive(Debug)]
pub struct RecvQueue {
    queue: ArrayQueue<RecvWr>,
}

impl RecvQueue {
    /// A queue of `max` WRs (at least 1).
    pub fn new(max: u32) -> RecvQueue {
        RecvQueue {
            queue: ArrayQueue::new(max.max(1) as usize),
        }
    }
    /// Depth.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }
    /// Posts a receive WR.
    pub fn post(&self, wr: RecvWr) -> Result<(), PostError> {
        self.queue.push(wr).map_err(|_| PostError::QueueFull)
    }
    /// The engine takes the next receive WR.
    pub fn take(&self) -> Option<RecvWr> {
        self.queue.pop()
    }
    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}
