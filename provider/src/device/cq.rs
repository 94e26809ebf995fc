//! Completion queues.

use super::{Device, DeviceError, Result, MAX_CQE};
use crate::cq::CompChannel;
use crate::cq::CqInner;
use crate::diag::check::CqLedger;
use crate::observe::{Event, Topic};
use crate::quota::{Resource, Slot};
use crate::types::Wc;
use std::sync::Arc;

impl Device {
    /// The depths a CQ may have: 1..=[`MAX_CQE`].
    pub fn check_cqe(cqe: u32) -> Result<()> {
        if cqe == 0 || cqe > MAX_CQE {
            return Err(DeviceError::Invalid(format!(
                "cqe {cqe}: must be 1..={MAX_CQE}"
            )));
        }
        Ok(())
    }

    /// A completion queue of at least `cqe` entries; its events go to
    /// `channel` with `context`.
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<Arc<CompChannel>>,
        context: u64,
    ) -> Result<CqHandle> {
        Self::check_cqe(cqe)?;
        let slot = self.take_slot(Resource::Cq)?;
        let inner =
            CqInner::with_channel(cqe as usize, channel, context, Some(self.events().clone()));
        self.shared.reg.add_cq(&inner);
        Ok(CqHandle {
            dev: self.clone(),
            inner,
            ledger: Arc::default(),
            _slot: slot,
        })
    }
}

/// A completion queue on a device. Polling takes no engine lock.
#[derive(Debug)]
pub struct CqHandle {
    pub(super) dev: Device,
    pub(super) inner: Arc<CqInner>,
    /// What the checker counts of the CQ: the completions it owes.
    pub(super) ledger: Arc<CqLedger>,
    pub(super) _slot: Slot,
}

impl CqHandle {
    /// Process-unique handle (what completion and CQ_ERR events name).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }
    /// The context value given at creation.
    pub fn context(&self) -> u64 {
        self.inner.context()
    }
    /// True when `channel` is the CQ's completion channel.
    pub fn reports_to(&self, channel: &Arc<CompChannel>) -> bool {
        self.inner.reports_to(channel)
    }
    /// Completions get a timestamp from now on
    /// (the CQ's `stamp_completions`).
    pub fn stamp_completions(&self) {
        self.inner.stamp_completions();
    }
    /// Arms the CQ; false if it has no completion channel.
    pub fn req_notify(&self, solicited_only: bool) -> bool {
        self.inner.req_notify(solicited_only)
    }
    /// Acknowledges `n` completion events.
    pub fn ack_events(&self, n: u32) {
        self.inner.ack_events(n);
    }
    /// Completion events delivered and not acknowledged.
    pub fn unacked_events(&self) -> u32 {
        self.inner.unacked_events()
    }
    /// The CQ is being destroyed: the checker's last look at it
    /// (the CQ's `note_destroy`), and at the completion events taken and
    /// not acknowledged (`note_destroy_unacked`).
    pub fn note_destroy(&self) {
        self.inner.note_destroy();
        let unacked = self.inner.unacked_events();
        if unacked != 0 {
            self.inner.note_destroy_unacked(unacked);
        }
    }
    /// Capacity.
    pub fn depth(&self) -> usize {
        self.inner.depth()
    }
    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    /// True when no completion waits.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }
    /// Up to `out.len()` completions, oldest first.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let n = self.inner.poll(out);
        if n > 0 {
            let (keys, wcs) = (&self.dev.shared.keys, &out[..n]);
            crate::observe::tell(Topic::CHECK, || Event::Polled { keys, wcs });
        }
        n
    }
    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        let wc = self.inner.poll_one();
        if let Some(wc) = &wc {
            let (keys, wcs) = (&self.dev.shared.keys, std::slice::from_ref(wc));
            crate::observe::tell(Topic::CHECK, || Event::Polled { keys, wcs });
        }
        wc
    }
    /// True once a completion was lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed()
    }
    /// True while a QP uses the CQ.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }
    /// See [`Device::progress`].
    pub fn progress(&self) -> bool {
        self.dev.progress()
    }
    /// Resizes to at least `cqe` entries (1..=[`MAX_CQE`]), after the
    /// engine has processed the work it was handed (so the completions
    /// it makes at once count); refused (EINVAL) while more than `cqe`
    /// completions wait.
    pub fn resize(&self, cqe: u32) -> Result<()> {
        Device::check_cqe(cqe)?;
        // On the engine's own thread (a callback) there is nothing to wait
        // for: it is not processing anything else.
        let _ = self.dev.settle();
        self.inner.resize(cqe as usize).map_err(|waiting| {
            DeviceError::Invalid(format!("cqe {cqe}: {waiting} completions wait in the CQ"))
        })
    }
}

/// The CQ a completion channel's event stands for (what
/// [`CompChannel`]'s wait gives), marked delivered: its handle and
/// context. `None` when the CQ was destroyed after queueing the event.
pub fn cq_event_of(cq: &std::sync::Weak<CqInner>) -> Option<(u32, u64)> {
    let cq = cq.upgrade()?;
    cq.note_event_delivered();
    Some((cq.handle(), cq.context()))
}
