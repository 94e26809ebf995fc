//! Completion channels (`ibv_comp_channel`) and asynchronous events
//! (`ibv_get_async_event`).
//!
//! Both hand out a file descriptor that is readable exactly while an event
//! waits, for `poll`/`epoll` or an async runtime; the blocking calls wait on
//! it themselves.

use crate::device::Context;
use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use uroce_provider::device as pe;
use uroce_provider::device::CompChannel as ChannelInner;

pub use uroce_provider::device::{AsyncEvent, EventElement, EventType};

/// A completion channel (`struct ibv_comp_channel`): CQs created with it
/// and armed with [`crate::CompletionQueue::req_notify`] report their next
/// completion here.
#[derive(Debug)]
pub struct CompChannel {
    _ctx: Context,
    pub(crate) inner: Arc<ChannelInner>,
}

/// A completion event (`ibv_get_cq_event`'s CQ and `cq_context`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqEvent {
    handle: u32,
    context: u64,
}

impl CqEvent {
    /// The `cq_context` the CQ was created with.
    pub fn cq_context(&self) -> u64 {
        self.context
    }
    /// The CQ's handle ([`crate::CompletionQueue::handle`]).
    pub fn cq_handle(&self) -> u32 {
        self.handle
    }
    /// True if the event is about `cq`.
    pub fn is_for(&self, cq: &crate::CompletionQueue) -> bool {
        cq.handle() == self.handle
    }
}

impl CompChannel {
    pub(crate) fn new(ctx: Context) -> Result<CompChannel> {
        let inner =
            ChannelInner::new().map_err(|e| Error::Engine(format!("completion channel: {e}")))?;
        Ok(CompChannel {
            _ctx: ctx,
            inner: Arc::new(inner),
        })
    }

    /// `ibv_get_cq_event`: waits for the next completion event. Every
    /// event must be acknowledged ([`crate::CompletionQueue::ack_events`])
    /// before the CQ can be destroyed. A signal handler that interrupts
    /// the wait ends it with [`Error::Interrupted`], as it ends the
    /// kernel's `read(2)` of a channel (see [`pe::Semaphore::wait`] for
    /// `SA_RESTART`).
    pub fn get_cq_event(&self) -> Result<CqEvent> {
        loop {
            let weak = self.inner.wait().map_err(Error::from_wait)?;
            if let Some(ev) = Self::deliver(pe::cq_event_of(&weak)) {
                return Ok(ev);
            }
        }
    }
    /// Like [`CompChannel::get_cq_event`], giving up after `timeout`.
    pub fn get_cq_event_timeout(&self, timeout: Duration) -> Result<Option<CqEvent>> {
        Ok(self.next(Some(timeout)))
    }
    /// A waiting event, or [`Error::WouldBlock`] (as `ibv_get_cq_event` on
    /// a non-blocking channel descriptor).
    pub fn try_get_cq_event(&self) -> Result<CqEvent> {
        self.next(Some(Duration::ZERO)).ok_or(Error::WouldBlock)
    }

    fn next(&self, timeout: Option<Duration>) -> Option<CqEvent> {
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            let weak = self.inner.get(left)?;
            if let Some(ev) = Self::deliver(pe::cq_event_of(&weak)) {
                return Some(ev);
            }
            if end.is_some_and(|e| std::time::Instant::now() >= e) {
                return None;
            }
        }
    }

    /// The event a queued CQ stands for. A CQ destroyed after queueing
    /// its event leaves nothing to report: `None`, skip it.
    fn deliver(cq: Option<(u32, u64)>) -> Option<CqEvent> {
        let (handle, context) = cq?;
        Some(CqEvent { handle, context })
    }

    /// The descriptor: readable while an event waits.
    pub fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    /// `ibv_destroy_comp_channel`: fails with [`Error::Busy`] (giving the
    /// channel back) while a CQ uses it.
    pub fn destroy(self) -> std::result::Result<(), (CompChannel, Error)> {
        if Arc::strong_count(&self.inner) > 1 {
            return Err((self, Error::Busy("completion channel is used by a CQ")));
        }
        Ok(())
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

impl Context {
    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        CompChannel::new(self.clone())
    }

    /// `ibv_get_async_event`: waits for the device's next asynchronous
    /// event (QP, CQ, SRQ and port events). A signal handler that
    /// interrupts the wait ends it with [`Error::Interrupted`], as it ends
    /// the kernel's `read(2)` of `async_fd`.
    pub fn get_async_event(&self) -> Result<AsyncEvent> {
        self.events().wait().map_err(Error::from_wait)
    }
    /// Like [`Context::get_async_event`], giving up after `timeout`.
    pub fn get_async_event_timeout(&self, timeout: Duration) -> Option<AsyncEvent> {
        self.events().get(Some(timeout))
    }
    /// A waiting asynchronous event, or [`Error::WouldBlock`].
    pub fn try_get_async_event(&self) -> Result<AsyncEvent> {
        self.events()
            .get(Some(Duration::ZERO))
            .ok_or(Error::WouldBlock)
    }
    /// The asynchronous event descriptor (`ibv_context::async_fd`):
    /// readable while an event waits.
    pub fn async_fd(&self) -> RawFd {
        self.events().fd()
    }

    fn events(&self) -> &pe::AsyncEvents {
        self.inner.face.events()
    }
}
