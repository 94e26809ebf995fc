//! Completion queues.

use crate::device::Context;
use uroce_provider::device::CqHandle;
use uroce_provider::types::Wc;

/// A completion queue (`struct ibv_cq`). Polling takes no engine lock.
///
/// ```
/// use std::time::Duration;
/// use uroce_verbs::{Device, QpType, SendFlags, SendWr, WcOpcode, WcStatus, WrOpcode};
/// let ctx = Device::new("doc3", "127.70.3.1".parse().unwrap()).open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let cq = ctx.cq_builder().cqe(16).build().unwrap();
/// let qp = pd.qp_builder(&cq).qp_type(QpType::Ud).build().unwrap();
/// qp.activate().unwrap();
/// // A zero-length UD send to this very QP: one send completion.
/// let ah = pd
///     .create_ah(&uroce_verbs::AddressVector { dgid: qp.endpoint().gid, ..Default::default() })
///     .unwrap();
/// let mut wr = SendWr::new(42, WrOpcode::Send);
/// wr.flags = SendFlags::SIGNALED;
/// wr.ud = Some(ah.ud_dest(qp.qp_num(), 0x1111_1111));
/// qp.post_send(&[wr]).unwrap();
/// let wc = cq.wait(1, Duration::from_secs(5));
/// assert_eq!((wc[0].wr_id, wc[0].status, wc[0].opcode), (42, WcStatus::Success, WcOpcode::Send));
/// assert!(cq.poll_one().is_none());
/// ```
#[derive(Debug)]
pub struct CompletionQueue {
    /// Declared (so dropped) before the context: the device's engine
    /// stops with the context, not after it.
    pub(crate) inner: CqHandle,
    _ctx: Context,
}

impl CompletionQueue {
    pub(crate) fn new(
        ctx: Context,
        cqe: u32,
        cq_context: u64,
        channel: Option<&crate::CompChannel>,
    ) -> crate::Result<CompletionQueue> {
        let inner = ctx
            .inner
            .face
            .create_cq(cqe, channel.map(|c| c.inner.clone()), cq_context)?;
        Ok(CompletionQueue { inner, _ctx: ctx })
    }
    /// Process-unique handle (what [`crate::CqEvent`] and CQ_ERR events
    /// name).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }
    /// The `cq_context` given at creation.
    pub fn cq_context(&self) -> u64 {
        self.inner.context()
    }
    /// `ibv_req_notify_cq`: the next completion (with `solicited_only`:
    /// the next solicited or unsuccessful one) queues one event on the
    /// CQ's completion channel. Completions already in the CQ do not count:
    /// poll after arming to close the race, as with verbs.
    pub fn req_notify(&self, solicited_only: bool) -> crate::Result<()> {
        if self.inner.req_notify(solicited_only) {
            Ok(())
        } else {
            Err(crate::Error::Invalid(
                "the CQ has no completion channel".into(),
            ))
        }
    }
    /// `ibv_ack_cq_events`.
    pub fn ack_events(&self, n: u32) {
        self.inner.ack_events(n);
    }
    /// Capacity.
    pub fn cqe(&self) -> usize {
        self.inner.depth()
    }
    /// Completions waiting to be polled.
    pub fn pending(&self) -> usize {
        self.inner.len()
    }
    /// `ibv_resize_cq`: the CQ holds at least `cqe` completions from now
    /// on (1..=[`crate::DeviceAttr::max_cqe`]); completions waiting stay.
    /// Fails with [`crate::Error::Invalid`] when more than `cqe` wait, as
    /// the kernel does. Work the engine has been handed is processed
    /// first, so the completions it makes at once (a UD send's) count, as
    /// with a provider that completes them inside `ibv_post_send`.
    pub fn resize(&self, cqe: u32) -> crate::Result<()> {
        Ok(self.inner.resize(cqe)?)
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
            self.progress();
        }
        Ok(n)
    }
    /// What an empty poll does: the polling thread drives the device
    /// itself if nobody else is (receives, processes, transmits: no
    /// hand-over to the engine thread, which sleeps while applications
    /// poll); if the device was busy or had nothing to do, it gives the
    /// CPU away, so that busy-polling applications do not starve the
    /// threads that produce their completions when threads outnumber
    /// cores.
    pub fn progress(&self) {
        if !self.inner.progress() {
            std::thread::yield_now();
        }
    }
    /// One completion, if any.
    pub fn poll_one(&self) -> Option<Wc> {
        self.inner.poll_one()
    }
    /// True once a completion was lost because the CQ was full.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed()
    }
    /// Completions get a [`Wc::timestamp`] from now on
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`): the completion clock
    /// ([`crate::completion_clock_ns`], nanoseconds on `CLOCK_MONOTONIC`)
    /// when the engine generated the completion.
    pub fn stamp_completions(&self) {
        self.inner.stamp_completions();
    }
    /// Busy-polls until `n` completions arrived or `timeout` passed.
    pub fn wait(&self, n: usize, timeout: std::time::Duration) -> Vec<Wc> {
        let end = std::time::Instant::now() + timeout;
        let mut v = Vec::with_capacity(n);
        while v.len() < n && std::time::Instant::now() < end {
            match self.inner.poll_one() {
                Some(wc) => v.push(wc),
                None => self.progress(),
            }
        }
        v
    }
    /// `ibv_destroy_cq`: fails with [`crate::Error::Busy`] (giving the CQ
    /// back) while a QP uses it.
    /// Also fails while completion events it delivered are not
    /// acknowledged (where `ibv_destroy_cq` would block).
    pub fn destroy(self) -> std::result::Result<(), (CompletionQueue, crate::Error)> {
        if self.inner.in_use() {
            return Err((self, crate::Error::Busy("completion queue is used by a QP")));
        }
        self.inner.note_destroy();
        let unacked = self.inner.unacked_events();
        if unacked != 0 {
            return Err((
                self,
                crate::Error::Busy("completion events not acknowledged (ack_events)"),
            ));
        }
        Ok(())
    }
}
