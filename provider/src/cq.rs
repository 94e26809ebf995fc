//! Completion queues: a lock-free queue the engine pushes to and
//! applications poll without taking any engine lock. Its capacity is a
//! number, not an allocation, so `ibv_resize_cq` is a store.

use crate::events::{AsyncEvent, AsyncEvents, EventElement, EventQueue, EventType};
use crate::observe::{self, Event, Topic};
use crate::types::{Wc, WcStatus};
use crossbeam::queue::SegQueue;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// A completion channel: CQs armed with `req_notify` queue themselves here
/// when a completion arrives.
pub type CompChannel = EventQueue<Weak<CqInner>>;

const DISARMED: u8 = 0;
const ARMED_NEXT: u8 = 1;
const ARMED_SOLICITED: u8 = 2;

/// A completion queue's shared state.
#[derive(Debug)]
pub struct CqInner {
    handle: u32,
    /// The completions, oldest first. Unbounded itself: `len` and
    /// `capacity` bound it (a push reserves a place in `len` first).
    queue: SegQueue<Wc>,
    len: AtomicUsize,
    capacity: AtomicUsize,
    overflowed: AtomicBool,
    /// The completion channel armed notifications go to.
    channel: Option<Arc<CompChannel>>,
    /// `req_notify_cq` state.
    armed: AtomicU8,
    /// The application's `cq_context`.
    context: u64,
    /// Where a CQ error (overflow) is reported.
    events: Option<Arc<AsyncEvents>>,
    /// Completion events delivered by `get_cq_event`, and acknowledged.
    events_got: AtomicU32,
    events_acked: AtomicU32,
    /// The checker (`event`): the application polled the CQ since the
    /// last completion event it took of it (true before the first).
    polled_since_event: AtomicBool,
    /// Completions get a [`Wc::timestamp`] as they are pushed.
    stamp: AtomicBool,
    me: Weak<CqInner>,
}

/// The completion clock's frequency in kHz (`hca_core_clock`): it counts
/// nanoseconds.
pub const CLOCK_KHZ: u64 = 1_000_000;

/// The completion clock (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`, the raw
/// clock of `ibv_query_rt_values_ex`): the system's `CLOCK_MONOTONIC` in
/// nanoseconds, so that every process on the host reads the same clock.
pub fn clock_ns() -> u64 {
    read_clock(libc::CLOCK_MONOTONIC)
}

/// The wall-clock time (`CLOCK_REALTIME`, ns since the epoch) of
/// completion-clock time `ts` (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`):
/// now on the wall clock less how long ago `ts` was.
pub fn wallclock_ns(ts: u64) -> u64 {
    let (mono, real) = (clock_ns(), read_clock(libc::CLOCK_REALTIME));
    real.saturating_sub(mono.saturating_sub(ts))
}

fn read_clock(id: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write; the ids used are clocks
    // every Linux has (the call cannot fail for them).
    unsafe { libc::clock_gettime(id, &mut t) };
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

impl CqInner {
    /// A CQ that holds `depth` completions (at least 1), with no channel.
    pub fn new(depth: usize) -> CqInner {
        CqInner::build(depth, None, 0, None, Weak::new())
    }

    /// A CQ with a completion channel, the application's context value,
    /// and the device's asynchronous event queue (for overflow).
    pub fn with_channel(
        depth: usize,
        channel: Option<Arc<CompChannel>>,
        context: u64,
        events: Option<Arc<AsyncEvents>>,
    ) -> Arc<CqInner> {
        Arc::new_cyclic(|me| CqInner::build(depth, channel, context, events, me.clone()))
    }

    fn build(
        depth: usize,
        channel: Option<Arc<CompChannel>>,
        context: u64,
        events: Option<Arc<AsyncEvents>>,
        me: Weak<CqInner>,
    ) -> CqInner {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        CqInner {
            handle: NEXT.fetch_add(1, Ordering::Relaxed),
            queue: SegQueue::new(),
            len: AtomicUsize::new(0),
            capacity: AtomicUsize::new(depth.max(1)),
            overflowed: AtomicBool::new(false),
            channel,
            armed: AtomicU8::new(DISARMED),
            context,
            events,
            events_got: AtomicU32::new(0),
            events_acked: AtomicU32::new(0),
            polled_since_event: AtomicBool::new(true),
            stamp: AtomicBool::new(false),
            me,
        }
    }
    /// The application's `cq_context`.
    pub fn context(&self) -> u64 {
        self.context
    }
    /// True when the CQ has a completion channel.
    pub fn has_channel(&self) -> bool {
        self.channel.is_some()
    }
    /// True when `ch` is the CQ's completion channel.
    pub fn reports_to(&self, ch: &Arc<CompChannel>) -> bool {
        self.channel.as_ref().is_some_and(|c| Arc::ptr_eq(c, ch))
    }
    /// `ibv_req_notify_cq`: the next completion (or, with
    /// `solicited_only`, the next solicited or unsuccessful one) queues a
    /// completion event on the channel. Returns false without a channel.
    pub fn req_notify(&self, solicited_only: bool) -> bool {
        if self.channel.is_none() {
            return false;
        }
        let want = if solicited_only {
            ARMED_SOLICITED
        } else {
            ARMED_NEXT
        };
        // Arming for "next" while armed for "solicited" widens it; the
        // reverse keeps "next" (IBA 11.4.2.2).
        let _ = self
            .armed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| match a {
                ARMED_NEXT => None,
                _ => Some(want),
            });
        true
    }
    /// The channel handed one of this CQ's events to the application.
    /// With the checker on (`event`), taking a second event of the CQ
    /// while completions that came before it still wait unpolled since the
    /// first is reported ([`Event::CqNotPolled`]).
    pub fn note_event_delivered(&self) {
        let before = self.events_got.fetch_add(1, Ordering::AcqRel);
        if observe::wants(Topic::CHECK_EVENT) {
            let polled = self.polled_since_event.swap(false, Ordering::AcqRel);
            if before > 0 && !polled && !self.is_empty() {
                self.tell_not_polled(false);
            }
        }
    }
    /// The CQ is being destroyed (`ibv_destroy_cq`): with the checker on
    /// (`event`), completions that wait unpolled since the last event the
    /// application took of the CQ are reported.
    pub fn note_destroy(&self) {
        if observe::wants(Topic::CHECK_EVENT)
            && self.events_got.load(Ordering::Acquire) > 0
            && !self.polled_since_event.load(Ordering::Acquire)
            && !self.is_empty()
        {
            self.tell_not_polled(true);
        }
    }
    /// The CQ is being destroyed with `unacked` completion events not
    /// acknowledged (the destroy then fails with EBUSY): told to the
    /// checker (`event`).
    pub fn note_destroy_unacked(&self, unacked: u32) {
        observe::tell(Topic::CHECK_EVENT, || Event::CqDestroyUnacked {
            cq: self.handle,
            unacked,
        });
    }
    fn tell_not_polled(&self, at_destroy: bool) {
        observe::tell(Topic::CHECK_EVENT, || Event::CqNotPolled {
            cq: self.handle,
            waiting: self.len(),
            at_destroy,
        });
    }
    /// The application polls (the checker's record, `event`).
    #[inline]
    fn note_poll(&self) {
        if observe::wants(Topic::CHECK_EVENT) {
            self.polled_since_event.store(true, Ordering::Release);
        }
    }
    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.events_acked.fetch_add(n, Ordering::AcqRel);
    }
    /// Completion events delivered and not yet acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.events_got
            .load(Ordering::Acquire)
            .wrapping_sub(self.events_acked.load(Ordering::Acquire))
    }
    /// Process-unique identifier.
    pub fn handle(&self) -> u32 {
        self.handle
    }
    /// Capacity.
    pub fn depth(&self) -> usize {
        self.capacity.load(Ordering::Acquire)
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }
    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `ibv_resize_cq`: the CQ holds `depth` completions from now on.
    /// Refused (returning the completions waiting) when more than `depth`
    /// wait, as the kernel refuses it (EINVAL); nothing is lost either way.
    pub fn resize(&self, depth: usize) -> Result<(), usize> {
        let depth = depth.max(1);
        // A push reserves its place in `len` against `capacity`; checking
        // `len` and storing `capacity` under one CAS on `capacity` keeps a
        // racing push from slipping past the new bound unnoticed: the
        // push re-checks against the capacity it loads after reserving.
        self.capacity
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |_| {
                (self.len.load(Ordering::Acquire) <= depth).then_some(depth)
            })
            .map(|_| ())
            .map_err(|_| self.len())
    }
    /// From now on, completions pushed get a [`Wc::timestamp`] (a CQ made
    /// with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`): the clock is read when
    /// the engine generates the completion, not when it is polled.
    pub fn stamp_completions(&self) {
        self.stamp.store(true, Ordering::Relaxed);
    }
    /// Adds a completion. A full CQ is an overflow (IBA 11.4.2.1: the CQ
    /// goes to error and an asynchronous CQ error is reported): the
    /// completion is lost, the CQ is marked overflowed and `false` returned.
    pub fn push(&self, wc: Wc) -> bool {
        self.push_notify(wc, false)
    }
    /// Adds a completion; `solicited` marks a receive completion of a
    /// message whose last packet had the solicited-event bit. An armed
    /// CQ queues a completion event on its channel (solicited-only arming:
    /// for solicited or unsuccessful completions).
    pub fn push_notify(&self, mut wc: Wc, solicited: bool) -> bool {
        if !self.reserve() {
            if !self.overflowed.swap(true, Ordering::AcqRel) {
                if let Some(ev) = &self.events {
                    ev.push(AsyncEvent {
                        event_type: EventType::CqErr,
                        element: EventElement::Cq(self.handle),
                    });
                }
            }
            return false;
        }
        if self.stamp.load(Ordering::Relaxed) {
            wc.timestamp = clock_ns();
        }
        self.queue.push(wc);
        if let Some(ch) = &self.channel {
            let armed = self.armed.load(Ordering::Acquire);
            let fire = armed == ARMED_NEXT
                || (armed == ARMED_SOLICITED && (solicited || wc.status != WcStatus::Success));
            if fire
                && self
                    .armed
                    .compare_exchange(armed, DISARMED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                ch.push(self.me.clone());
            }
        }
        true
    }
    /// Removes the completions of QP `qpn` that wait in the CQ, keeping
    /// the others in order: a QP moved to RESET leaves nothing behind for
    /// its next life (rdma-core's mlx4/mlx5 providers clean their CQs the
    /// same way), so flush completions of an earlier error are not taken
    /// for new ones. Runs on the engine thread, the CQ's only producer; a
    /// concurrent poller sees the CQ shorter meanwhile, never reordered.
    pub fn remove_qp(&self, qpn: u32) -> usize {
        let mut kept = Vec::new();
        let mut removed = 0;
        for _ in 0..self.queue.len() {
            let Some(wc) = self.queue.pop() else { break };
            if wc.qp_num == qpn {
                removed += 1;
            } else {
                kept.push(wc);
            }
        }
        for wc in kept {
            self.queue.push(wc);
        }
        self.len.fetch_sub(removed, Ordering::AcqRel);
        removed
    }
    /// Takes a place for one completion; false when the CQ is full.
    fn reserve(&self) -> bool {
        let prev = self.len.fetch_add(1, Ordering::AcqRel);
        if prev < self.capacity.load(Ordering::Acquire) {
            return true;
        }
        self.len.fetch_sub(1, Ordering::AcqRel);
        false
    }
    fn pop(&self) -> Option<Wc> {
        let wc = self.queue.pop()?;
        self.len.fetch_sub(1, Ordering::AcqRel);
        Some(wc)
    }
    /// Takes up to `out.len()` completions, oldest first.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.note_poll();
        let mut n = 0;
        while n < out.len() {
            match self.pop() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
    /// Takes one completion.
    pub fn poll_one(&self) -> Option<Wc> {
        self.note_poll();
        self.pop()
    }
    /// True once a completion was lost to overflow.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WcOpcode;
    use std::time::Duration;

    #[test]
    fn completions_are_stamped_when_pushed_if_asked() {
        let cq = CqInner::new(4);
        let wc = Wc::new(1, WcStatus::Success, WcOpcode::Send, 5);
        assert!(cq.push(wc));
        assert_eq!(cq.poll_one().unwrap().timestamp, 0, "not asked");
        cq.stamp_completions();
        let before = clock_ns();
        assert!(cq.push(wc));
        let pushed = clock_ns();
        std::thread::sleep(Duration::from_millis(20));
        let ts = cq.poll_one().unwrap().timestamp;
        assert!((before..=pushed).contains(&ts), "{before} {ts} {pushed}");
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let ago = real - wallclock_ns(ts);
        assert!((20_000_000..5_000_000_000).contains(&ago), "{ago}");
    }

    #[test]
    fn arming_next_and_solicited() {
        let ch = Arc::new(CompChannel::new().unwrap());
        let cq = CqInner::with_channel(8, Some(ch.clone()), 77, None);
        let ok = Wc::new(1, WcStatus::Success, WcOpcode::Recv, 5);
        // Not armed: no event.
        cq.push_notify(ok, true);
        assert!(ch.get(Some(Duration::ZERO)).is_none());
        // Armed for next: one event, then disarmed.
        assert!(cq.req_notify(false));
        cq.push_notify(ok, false);
        cq.push_notify(ok, false);
        let ev = ch.get(Some(Duration::ZERO)).unwrap().upgrade().unwrap();
        assert_eq!(ev.context(), 77);
        assert!(ch.get(Some(Duration::ZERO)).is_none());
        // Solicited only: an unsolicited success does not fire; a solicited
        // one does; so does an error.
        cq.req_notify(true);
        cq.push_notify(ok, false);
        assert!(ch.get(Some(Duration::ZERO)).is_none());
        cq.push_notify(ok, true);
        assert!(ch.get(Some(Duration::ZERO)).is_some());
        cq.req_notify(true);
        cq.push_notify(Wc::new(2, WcStatus::WrFlushErr, WcOpcode::Recv, 5), false);
        assert!(ch.get(Some(Duration::ZERO)).is_some());
        cq.note_event_delivered();
        cq.note_event_delivered();
        assert_eq!(cq.unacked_events(), 2);
        cq.ack_events(2);
        assert_eq!(cq.unacked_events(), 0);
    }

    #[test]
    fn overflow_reports_cq_error_once() {
        let ev = Arc::new(AsyncEvents::new().unwrap());
        let cq = CqInner::with_channel(1, None, 0, Some(ev.clone()));
        let wc = Wc::new(1, WcStatus::Success, WcOpcode::Send, 5);
        assert!(cq.push(wc));
        assert!(!cq.push(wc));
        assert!(!cq.push(wc));
        let e = ev.get(Some(Duration::ZERO)).unwrap();
        assert_eq!(e.event_type, EventType::CqErr);
        assert_eq!(e.element, EventElement::Cq(cq.handle()));
        assert!(ev.get(Some(Duration::ZERO)).is_none());
    }

    #[test]
    fn fifo_and_overflow() {
        let cq = CqInner::new(2);
        assert!(cq.push(Wc::new(1, WcStatus::Success, WcOpcode::Send, 5)));
        assert!(cq.push(Wc::new(2, WcStatus::Success, WcOpcode::Send, 5)));
        assert!(!cq.overflowed());
        assert!(!cq.push(Wc::new(3, WcStatus::Success, WcOpcode::Send, 5)));
        assert!(cq.overflowed());
        let mut out = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
    }

    #[test]
    fn resize_grows_shrinks_and_refuses_below_waiting() {
        let cq = CqInner::new(3);
        let wc = |id| Wc::new(id, WcStatus::Success, WcOpcode::Send, 5);
        assert_eq!(cq.resize(1), Ok(()));
        assert_eq!(cq.depth(), 1);
        assert!(cq.push(wc(1)));
        assert!(!cq.push(wc(2)), "full at the new depth");
        assert_eq!(cq.resize(7), Ok(()));
        for id in 3..9 {
            assert!(cq.push(wc(id)));
        }
        assert_eq!(cq.len(), 7);
        assert_eq!(cq.resize(2), Err(7), "7 completions wait");
        assert_eq!(cq.depth(), 7);
        let mut out = [wc(0); 8];
        assert_eq!(cq.poll(&mut out), 7);
        assert_eq!(out[0].wr_id, 1);
        assert_eq!(out[6].wr_id, 8);
        assert_eq!(cq.resize(2), Ok(()));
    }

    #[test]
    fn remove_qp_keeps_the_others_in_order() {
        let cq = CqInner::new(8);
        for (id, qpn) in [(1, 7), (2, 9), (3, 7), (4, 9)] {
            assert!(cq.push(Wc::new(id, WcStatus::Success, WcOpcode::Send, qpn)));
        }
        assert_eq!(cq.remove_qp(7), 2);
        assert_eq!(cq.len(), 2);
        let ids: Vec<u64> = std::iter::from_fn(|| cq.poll_one())
            .map(|w| w.wr_id)
            .collect();
        assert_eq!(ids, [2, 4]);
        assert_eq!(cq.len(), 0);
    }
}
