//! Completion queues: a fixed-depth lock-free queue the engine pushes to
//! and applications poll without taking any engine lock.

use crate::types::Wc;
use crossbeam::queue::ArrayQueue;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A completion queue's shared state.
#[derive(Debug)]
pub struct CqInner {
    handle: u32,
    queue: ArrayQueue<Wc>,
    overflowed: AtomicBool,
}

impl CqInner {
    /// A CQ that holds `depth` completions (at least 1).
    pub fn new(depth: usize) -> CqInner {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        CqInner {
            handle: NEXT.fetch_add(1, Ordering::Relaxed),
            queue: ArrayQueue::new(depth.max(1)),
            overflowed: AtomicBool::new(false),
        }
    }
    /// Process-unique identifier.
    pub fn handle(&self) -> u32 {
        self.handle
    }
    /// Capacity.
    pub fn depth(&self) -> usize {
        self.queue.capacity()
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }
    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
    /// Adds a completion. A full CQ is an overflow (IBA 11.4.2.1: the CQ
    /// goes to error and an asynchronous CQ error is reported): the
    /// completion is lost, the CQ is marked overflowed and `false` returned.
    pub fn push(&self, wc: Wc) -> bool {
        if self.queue.push(wc).is_err() {
            self.overflowed.store(true, Ordering::Release);
            return false;
        }
        true
    }
    /// Takes up to `out.len()` completions, oldest first.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.queue.pop() {
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
        self.queue.pop()
    }
    /// True once a completion was lost to overflow.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{WcOpcode, WcStatus};

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
}
