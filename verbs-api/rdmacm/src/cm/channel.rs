//! Event channels (`struct rdma_event_channel`): where an id's events
//! wait for the user.

use super::agent_event::{on_the_wire, process};
use super::id::IdInner;
use super::CmEvent;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use uroce_provider::device::cm as pcm;
use uroce_provider::device::Semaphore;
use uroce_verbs::{Error, Result};

pub(super) enum Pending {
    /// Ready for the user.
    Ready(CmEvent),
    /// From the agent: processed in `get_event` on the user's thread
    /// (it may move QPs, which the engine thread cannot wait for).
    Agent(Arc<IdInner>, pcm::CmEvent),
}

pub(super) struct Channel {
    pub(super) queue: Mutex<VecDeque<Pending>>,
    pub(super) sem: Semaphore,
}

impl Channel {
    pub(super) fn push(&self, p: Pending) {
        self.queue.lock().push_back(p);
        self.sem.post();
    }
}

/// An event channel (`struct rdma_event_channel`).
#[derive(Clone)]
pub struct EventChannel {
    pub(super) inner: Arc<Channel>,
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EventChannel(fd {})", self.inner.sem.fd())
    }
}

impl AsRawFd for EventChannel {
    /// Readable while an event waits.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.sem.fd()
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`.
    pub fn new() -> Result<EventChannel> {
        let sem = Semaphore::new().map_err(|e| Error::Engine(format!("event channel: {e}")))?;
        Ok(EventChannel {
            inner: Arc::new(Channel {
                queue: Mutex::new(VecDeque::new()),
                sem,
            }),
        })
    }

    /// `rdma_get_cm_event`: waits for the next event. A signal handler
    /// that interrupts the wait ends it with [`Error::Interrupted`], as it
    /// ends the kernel's wait in the `write(2)` librdmacm makes on its
    /// channel (see [`Semaphore::wait`] for `SA_RESTART`).
    pub fn get_event(&self) -> Result<CmEvent> {
        loop {
            self.inner.sem.wait().map_err(Error::from_wait)?;
            if let Some(e) = self.pop() {
                return Ok(e);
            }
        }
    }

    /// The next event, or `Err(WouldBlock)` if none waits.
    pub fn try_get_event(&self) -> Result<CmEvent> {
        self.get_event_timeout(Some(Duration::ZERO))?
            .ok_or(Error::WouldBlock)
    }

    /// The next event within `timeout` (`None`: wait forever).
    pub fn get_event_timeout(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let end = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            if !self.inner.sem.take(left) {
                return Ok(None);
            }
            if let Some(e) = self.pop() {
                return Ok(Some(e));
            }
        }
    }

    /// The event the count just taken stands for, if it makes one for
    /// the program (an agent's event may not).
    fn pop(&self) -> Option<CmEvent> {
        let p = self.inner.queue.lock().pop_front()?;
        match p {
            Pending::Ready(e) => Some(e),
            Pending::Agent(id, e) => process(&id, e).inspect(|_| on_the_wire(&id)),
        }
    }
}
