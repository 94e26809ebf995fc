//! The work queues the application posts to and the engine takes from
//! (shared between the posting threads and the engine: the send queue
//! lock-free, the receive queue behind a short lock), the
//! SRQ limit event, and the QP state as the posting side reads it.

use crate::diag::check::QpLedger;
use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventType};
use crate::observe::cause::{ExplainLog, Explanation};
use crate::observe::{self, queue_id, Fact, Topic};
use crate::types::{QpState, RecvWr, SendWr};
use crossbeam::queue::ArrayQueue;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A QP's state as the machine last set it, readable from any thread: the
/// verbs layer checks posts against it instead of mirroring modify calls
/// (the engine moves a QP to ERR or SQE on its own). With it, the QP's
/// explained errors ([`ExplainLog`]), written on error paths only.
#[derive(Debug, Default)]
pub struct StateCell {
    state: AtomicU32,
    explained: parking_lot::Mutex<ExplainLog>,
}

impl StateCell {
    /// The state.
    pub fn get(&self) -> QpState {
        QpState::from_u32(self.state.load(Ordering::Acquire)).unwrap_or(QpState::Err)
    }
    /// Publishes a new state (the machine does, whenever it changes).
    pub fn set(&self, s: QpState) {
        self.state.store(s as u32, Ordering::Release);
    }
    /// The QP's last explained error, if any.
    pub fn last_error(&self) -> Option<Explanation> {
        self.explained.lock().last.clone()
    }
    /// Why the QP is in ERR, if it is and that was explained.
    pub fn error_cause(&self) -> Option<Explanation> {
        self.explained.lock().cause.clone()
    }
    /// Keeps `e` as the last explanation (and, `cause`, as why the QP is
    /// in ERR; the QP's config tells the tools: `QpConfig::explained`).
    pub fn explain(&self, e: Explanation, cause: bool) {
        let mut log = self.explained.lock();
        if cause {
            log.cause = Some(e.clone());
        }
        log.last = Some(e);
    }
    /// Keeps `e`, explained already, as why the QP is in ERR.
    pub fn set_cause(&self, e: Explanation) {
        self.explained.lock().cause = Some(e);
    }
    /// Back to RESET: the QP is no longer in ERR for any reason (its last
    /// explanation stays).
    pub fn forget_cause(&self) {
        self.explained.lock().cause = None;
    }
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

/// A queue could not be allocated at the size asked for (ENOMEM, as the
/// kernel answers when a queue's memory cannot be had).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot allocate a queue of {0} work requests")]
pub struct QueueAllocError(pub usize);

/// A lock-free queue of `cap` slots whose allocation may fail without
/// aborting the process. `ArrayQueue::new` allocates its slots (a stamp
/// and a `T` each) infallibly: the same amount is asked for fallibly first
/// (`try_reserve_exact`), so that a size the allocator cannot give (beyond
/// `isize::MAX`, or refused under `RLIMIT_AS` or by the kernel's overcommit
/// check) is an error instead. The probe is freed just before the queue is
/// allocated: another thread taking the memory in between can still make
/// the second allocation fail.
fn bounded<T>(cap: usize) -> Result<ArrayQueue<T>, QueueAllocError> {
    let mut probe: Vec<(std::sync::atomic::AtomicUsize, std::mem::MaybeUninit<T>)> = Vec::new();
    probe
        .try_reserve_exact(cap)
        .map_err(|_| QueueAllocError(cap))?;
    drop(probe);
    Ok(ArrayQueue::new(cap))
}

/// The send queue shared by the posting threads and the engine.
#[derive(Debug)]
pub struct SendQueue {
    queue: ArrayQueue<SendWr>,
    outstanding: AtomicU32,
    /// WRs the engine has taken, ever (see [`SendQueue::taken`]).
    taken: AtomicU64,
    max: u32,
    /// The checker's record of the queue (`UROCE_CHECK`), if it was on
    /// when the QP was made.
    ledger: Option<Arc<QpLedger>>,
}

impl SendQueue {
    /// A queue of `max` WRs (at least 1), or an error if its memory
    /// cannot be allocated.
    pub fn new(max: u32) -> Result<SendQueue, QueueAllocError> {
        let max = max.max(1);
        Ok(SendQueue {
            queue: bounded(max as usize)?,
            outstanding: AtomicU32::new(0),
            taken: AtomicU64::new(0),
            max,
            ledger: None,
        })
    }
    /// The checker keeps `ledger` of what is posted and retired.
    pub fn attach_ledger(&mut self, ledger: Option<Arc<QpLedger>>) {
        self.ledger = ledger;
    }
    /// The checker's ledger, if the QP has one (never in the build
    /// without the diagnostic tools: [`crate::diag`]).
    #[inline(always)]
    pub fn ledger(&self) -> Option<&Arc<QpLedger>> {
        self.ledger.as_ref().filter(|_| crate::observe::COMPILED)
    }
    /// Depth.
    pub fn capacity(&self) -> u32 {
        self.max
    }
    /// Posts a WR. A WR occupies its slot until it completes (or, when
    /// unsignaled, until a later completion retires it).
    pub fn post(&self, wr: SendWr) -> Result<(), PostError> {
        match self.ledger() {
            None => self.push(wr),
            Some(l) => l.post(wr, |wr| self.push(wr)),
        }
    }
    fn push(&self, wr: SendWr) -> Result<(), PostError> {
        if self.outstanding.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(PostError::QueueFull);
        }
        observe::tell(Topic::TIMELINE, || Fact::SendPosted {
            queue: queue_id(self),
            wr_id: wr.wr_id,
            opcode: wr.opcode,
            len: wr.message_len(),
        });
        // Cannot fail: the queue holds `max` and at most `max` are posted.
        self.queue.push(wr).map_err(|_| PostError::QueueFull)
    }
    /// The engine takes the next posted WR.
    pub fn take(&self) -> Option<SendWr> {
        let wr = self.queue.pop()?;
        self.taken.fetch_add(1, Ordering::Relaxed);
        Some(wr)
    }
    /// True when WRs wait to be taken.
    pub fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }
    /// How many WRs the engine has taken since the queue was made.
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }
    /// How many WRs wait to be taken now.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }
    /// The engine retires `n` WRs (completed or flushed).
    pub fn retire(&self, n: u32) {
        self.outstanding.fetch_sub(n, Ordering::AcqRel);
        if let Some(l) = self.ledger() {
            l.retire(n);
        }
    }
    /// The engine copies the first packet of SEND/WRITE WR `wr_id` for
    /// the wire (the checker compares its sources: nothing to do without
    /// a ledger).
    pub fn sending(&self, wr_id: u64) {
        if let Some(l) = self.ledger() {
            l.sending(wr_id);
        }
    }
    /// The engine places the first response of RDMA READ WR `wr_id` next.
    pub fn read_placing(&self, wr_id: u64) {
        if let Some(l) = self.ledger() {
            l.read_placing(wr_id);
        }
    }
    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Acquire)
    }
}

/// The receive queue (or an SRQ's queue) shared by posting threads and the
/// engine. A short lock around a ring, not a lock-free queue: the engine
/// looks at the head WR before taking it (a UD datagram too long for it
/// leaves it there, IBA class D), and an SRQ grows or shrinks in place
/// (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`).
#[derive(Debug)]
pub struct RecvQueue {
    queue: Mutex<VecDeque<RecvWr>>,
    /// WRs it holds at most.
    max: AtomicUsize,
    srq: Option<SrqHook>,
}

/// What makes a receive queue a shared receive queue: its handle, its
/// limit, and where the limit event goes.
#[derive(Debug)]
struct SrqHook {
    handle: u32,
    /// `srq_limit`: 0 when disarmed.
    limit: AtomicU32,
    events: Arc<AsyncEvents>,
}

/// A ring of `max` WRs (at least 1), its memory asked for fallibly.
fn ring(max: u32) -> Result<VecDeque<RecvWr>, QueueAllocError> {
    let cap = max.max(1) as usize;
    let mut q = VecDeque::new();
    q.try_reserve_exact(cap).map_err(|_| QueueAllocError(cap))?;
    Ok(q)
}

/// Why a receive queue could not be resized (EINVAL, as rxe answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResizeError {
    /// More WRs are posted than the new depth holds.
    #[error("{posted} receive WRs are posted, more than the new max_wr {max}")]
    Outstanding {
        /// WRs posted.
        posted: usize,
        /// The depth asked for.
        max: u32,
    },
    /// The memory for the new depth cannot be had.
    #[error(transparent)]
    Alloc(#[from] QueueAllocError),
}

impl RecvQueue {
    /// A queue of `max` WRs (at least 1), or an error if its memory
    /// cannot be allocated.
    pub fn new(max: u32) -> Result<RecvQueue, QueueAllocError> {
        Ok(RecvQueue {
            queue: Mutex::new(ring(max)?),
            max: AtomicUsize::new(max.max(1) as usize),
            srq: None,
        })
    }
    /// A shared receive queue of `max` WRs with handle `handle`; when armed
    /// (see [`RecvQueue::arm_limit`]) it reports `SRQ_LIMIT_REACHED` to
    /// `events`. An error if its memory cannot be allocated.
    pub fn new_srq(
        max: u32,
        handle: u32,
        events: Arc<AsyncEvents>,
    ) -> Result<RecvQueue, QueueAllocError> {
        Ok(RecvQueue {
            srq: Some(SrqHook {
                handle,
                limit: AtomicU32::new(0),
                events,
            }),
            ..RecvQueue::new(max)?
        })
    }
    /// True for a shared receive queue.
    pub fn is_srq(&self) -> bool {
        self.srq.is_some()
    }
    /// The SRQ's handle (0 for a QP's own receive queue).
    pub fn srq_handle(&self) -> u32 {
        self.srq.as_ref().map_or(0, |h| h.handle)
    }
    /// Arms the SRQ limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`; 0
    /// disarms): once the engine takes a WR that leaves fewer than `limit`
    /// waiting, one `SRQ_LIMIT_REACHED` event is reported and the limit
    /// disarms. Returns false for a QP's own receive queue.
    pub fn arm_limit(&self, limit: u32) -> bool {
        match &self.srq {
            Some(h) => {
                h.limit.store(limit, Ordering::Release);
                true
            }
            None => false,
        }
    }
    /// The armed limit (0: disarmed).
    pub fn limit(&self) -> u32 {
        self.srq
            .as_ref()
            .map_or(0, |h| h.limit.load(Ordering::Acquire))
    }
    /// Depth.
    pub fn capacity(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }
    /// Sets the depth to `max` WRs (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`): the posted WRs stay, in order. Fewer than are
    /// posted is refused, as rxe's queue resize refuses it.
    pub fn resize(&self, max: u32) -> Result<(), ResizeError> {
        let mut q = self.queue.lock();
        if q.len() > max as usize {
            let posted = q.len();
            return Err(ResizeError::Outstanding { posted, max });
        }
        let mut n = ring(max)?;
        n.extend(q.drain(..));
        *q = n;
        self.max.store(max.max(1) as usize, Ordering::Release);
        Ok(())
    }
    /// Posts a receive WR.
    pub fn post(&self, wr: RecvWr) -> Result<(), PostError> {
        let mut q = self.queue.lock();
        if q.len() >= self.capacity() {
            return Err(PostError::QueueFull);
        }
        observe::tell(Topic::TIMELINE, || Fact::RecvPosted {
            queue: queue_id(self),
            wr_id: wr.wr_id,
            len: wr.sg_list.iter().map(|s| u64::from(s.length)).sum(),
        });
        q.push_back(wr);
        Ok(())
    }
    /// The engine takes the next receive WR.
    pub fn take(&self) -> Option<RecvWr> {
        let (wr, left) = {
            let mut q = self.queue.lock();
            (q.pop_front()?, q.len())
        };
        if let Some(h) = &self.srq {
            let limit = h.limit.load(Ordering::Acquire);
            if limit != 0
                && (left as u32) < limit
                && h.limit
                    .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                h.events.push(AsyncEvent {
                    event_type: EventType::SrqLimitReached,
                    element: EventElement::Srq(h.handle),
                });
            }
        }
        Some(wr)
    }
    /// How many bytes the head WR's buffers hold in all (the sum of its
    /// SGEs' lengths), if one waits: what a UD datagram must fit before
    /// it takes the WR.
    pub fn head_len(&self) -> Option<u64> {
        let q = self.queue.lock();
        let wr = q.front()?;
        Some(wr.sg_list.iter().map(|s| u64::from(s.length)).sum())
    }
    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.queue.lock().len()
    }
    /// True when none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn srq_limit_fires_once_when_count_drops_below() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let q = RecvQueue::new_srq(8, 42, ev.clone()).unwrap();
        for i in 0..4 {
            q.post(RecvWr {
                wr_id: i,
                ..RecvWr::default()
            })
            .unwrap();
        }
        assert!(q.arm_limit(3));
        q.take().unwrap(); // 3 left: not below 3
        assert!(ev.get(Some(Duration::ZERO)).is_none());
        q.take().unwrap(); // 2 left: fires, disarms
        let e = ev.get(Some(Duration::ZERO)).unwrap();
        assert_eq!(e.event_type, EventType::SrqLimitReached);
        assert_eq!(e.element, EventElement::Srq(42));
        assert_eq!(q.limit(), 0);
        q.take().unwrap();
        assert!(ev.get(Some(Duration::ZERO)).is_none());
        assert!(!RecvQueue::new(4).unwrap().arm_limit(1));
    }

    #[test]
    fn an_srq_grows_in_place_and_refuses_to_shrink_below_what_is_posted() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let q = RecvQueue::new_srq(2, 7, ev).unwrap();
        let wr = |i| RecvWr {
            wr_id: i,
            ..RecvWr::default()
        };
        q.post(wr(0)).unwrap();
        q.post(wr(1)).unwrap();
        assert_eq!(q.post(wr(2)), Err(PostError::QueueFull));
        q.resize(4).unwrap();
        assert_eq!(q.capacity(), 4);
        q.post(wr(2)).unwrap();
        q.post(wr(3)).unwrap();
        assert_eq!(q.post(wr(4)), Err(PostError::QueueFull));
        assert_eq!(
            q.resize(3),
            Err(ResizeError::Outstanding { posted: 4, max: 3 })
        );
        assert_eq!(q.capacity(), 4);
        // The WRs stay, in order.
        let ids: Vec<u64> = std::iter::from_fn(|| q.take()).map(|w| w.wr_id).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        q.resize(1).unwrap();
        assert_eq!(q.capacity(), 1);
    }

    #[test]
    fn a_queue_too_big_to_allocate_is_an_error_not_an_abort() {
        // Beyond isize::MAX bytes: no allocator can give it.
        let huge = usize::MAX / 2;
        assert_eq!(bounded::<SendWr>(huge).unwrap_err(), QueueAllocError(huge));
        assert_eq!(bounded::<u8>(16).unwrap().capacity(), 16);
    }
}
