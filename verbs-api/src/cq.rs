//! Completion queues.

use crate::device::Context;
use std::sync::Arc;
use uroce_provider::cq::CqInner;
use uroce_provider::types::Wc;

/// A completion queue (`struct ibv_cq`). Polling takes no engine lock.
#[derive(Debug)]
pub struct CompletionQueue {
    _ctx: Context,
    pub(crate) inner: Arc<CqInner>,
}

impl CompletionQueue {
    pub(crate) fn new(ctx: Context, cqe: u32) -> CompletionQueue {
        CompletionQueue {
            _ctx: ctx,
            inner: Arc::new(CqInner::new(cqe as usize)),
        }
    }
    /// Capacity.
    pub fn cqe(&self) -> usize {
        self.inner.depth()
    }
    /// `ibv_poll_cq`: fills `out` with up to `out.len()` completions,
    /// oldest first; returns how many. Errors if completions were lost to
    /// overflow (the CQ is then in error, as in verbs).
    pub fn poll(&self, out: &mut [Wc]) -> crate::Result<usize> {
        let n = self.inner.poll(out);
        if n == 0 {
            if self.inner.overflowed() {
                return Err(crate::Error::Invalid("completion queue overflowed".into()));
            }
            // An empty poll gives the CPU away: busy-polling applications
            // would otherwise starve the engine threads that produce their
            // completions when threads outnumber cores.
            std::thread::yield_now();
        }
        Ok(n)
    }
    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        self.inner.poll_one()
    }
    /// True once a completion was lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed()
    }
    /// Busy-polls until `n` completions arrived or `timeout` passed.
    pub fn wait(&self, n: usize, timeout: std::time::Duration) -> Vec<Wc> {
        let end = std::time::Instant::now() + timeout;
        let mut v = Vec::with_capacity(n);
        while v.len() < n && std::time::Instant::now() < end {
            match self.inner.poll_one() {
                Some(wc) => v.push(wc),
                None => std::thread::yield_now(),
            }
        }
        v
    }
    /// `ibv_destroy_cq`: fails with [`crate::Error::Busy`] (giving the CQ
    /// back) while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (CompletionQueue, crate::Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, crate::Error::Busy("completion queue is used by a QP")));
        }
        Ok(())
    }
}
