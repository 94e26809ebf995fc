//! Shared receive queues.

use super::qp::{post_each, recv_posting, Posted};
use super::stat::SrqEntry;
use super::{Device, DeviceError, LimitError, Result, MAX_QP_WR, MAX_SGE};
use crate::memory::PdId;
use crate::qp_attr::CapError;
use crate::quota::{Resource, Slot};
use crate::transport::{RecvQueue, ResizeError};
use crate::types::RecvWr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

impl Device {
    /// A shared receive queue of `max_wr` WRs of at most `max_sge` SGEs
    /// in protection domain `pd`.
    pub fn create_srq(&self, pd: PdId, max_wr: u32, max_sge: u32) -> Result<SrqHandle> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        // The capacities' rule a QP's pass too (`QpCap::check`); an SRQ
        // holds one WR at least.
        if max_wr == 0 {
            return Err(DeviceError::Invalid(format!(
                "max_wr 0: must be 1..={MAX_QP_WR}"
            )));
        }
        CapError::check("max_wr", max_wr, MAX_QP_WR)?;
        CapError::check("max_sge", max_sge, MAX_SGE)?;
        let slot = self.take_slot(Resource::Srq)?;
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        let srq = SrqHandle {
            _slot: slot,
            dev: self.clone(),
            pd,
            rq: Arc::new(RecvQueue::new_srq(max_wr, handle, self.events().clone())?),
            handle,
            max_sge: max_sge.max(1),
        };
        self.shared.reg.add_srq(SrqEntry {
            rq: Arc::downgrade(&srq.rq),
            pd,
            max_sge: srq.max_sge,
        });
        Ok(srq)
    }
}

/// A shared receive queue on a device.
#[derive(Debug)]
pub struct SrqHandle {
    pub(super) _slot: Slot,
    pub(super) dev: Device,
    pub(super) pd: PdId,
    pub(super) rq: Arc<RecvQueue>,
    pub(super) handle: u32,
    pub(super) max_sge: u32,
}

impl SrqHandle {
    /// The handle asynchronous events name.
    pub fn handle(&self) -> u32 {
        self.handle
    }
    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }
    /// Capacity in WRs.
    pub fn max_wr(&self) -> u32 {
        self.rq.capacity() as u32
    }
    /// `ibv_modify_srq` with `IBV_SRQ_MAX_WR` (the device advertises
    /// `IBV_DEVICE_SRQ_RESIZE`): the SRQ holds `max_wr` WRs from now on,
    /// keeping those posted. EINVAL, as rxe answers, for 0 or more than
    /// the device's `max_srq_wr`, fewer than the armed limit, or fewer
    /// than are posted now.
    pub fn resize(&self, max_wr: u32) -> Result<()> {
        if max_wr == 0 || max_wr > MAX_QP_WR {
            return Err(DeviceError::Invalid(format!(
                "max_wr {max_wr}: must be 1..={MAX_QP_WR}"
            )));
        }
        let limit = self.rq.limit();
        if limit > max_wr {
            return Err(DeviceError::Invalid(format!(
                "max_wr {max_wr} is below the armed srq_limit {limit}"
            )));
        }
        self.rq.resize(max_wr).map_err(|e| match e {
            ResizeError::Alloc(a) => a.into(),
            e => DeviceError::Invalid(e.to_string()),
        })
    }
    /// SGEs per WR.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }
    /// The SGE count rule of this SRQ's WRs (EINVAL beyond `max_sge`):
    /// checked before a caller reads a foreign list, and on posting.
    pub fn check_sges(&self, n: usize) -> std::result::Result<(), LimitError> {
        LimitError::check("SGEs", "max_sge", n, self.max_sge)
    }
    /// Posts receive WRs. On error, the WRs before the failing one were
    /// posted; returns the failing index with the error.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> Posted {
        self.post_recv_with(wrs, |wr| Ok(wr.clone()))
    }
    /// Posts the receive WRs `read` makes of `items`, one at a time (see
    /// `post_each`: at most `max_wr` in one call).
    pub fn post_recv_with<T, E: From<DeviceError>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> Posted<E> {
        post_each(items, self.max_wr() as usize, read, |wr| {
            self.check_sges(wr.sg_list.len())?;
            recv_posting(&self.dev.shared.keys, self.pd, self.handle, &wr);
            Ok(self.rq.post(wr)?)
        })
        .1
    }
    /// Arms the limit (0 disarms); it may not exceed `max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.max_wr() {
            return Err(DeviceError::Invalid(format!(
                "srq_limit {limit} exceeds max_wr {}",
                self.max_wr()
            )));
        }
        self.rq.arm_limit(limit);
        Ok(())
    }
    /// The armed limit (0 once it fired).
    pub fn limit(&self) -> u32 {
        self.rq.limit()
    }
    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.rq.len()
    }
    /// True when no receive WR waits.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }
    /// True while a QP uses the SRQ.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.rq) > 1
    }
}
