//! Shared receive queues (`struct ibv_srq`).

use crate::device::Context;
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use std::sync::Arc;
use uroce_provider::device::SrqHandle;
use uroce_provider::types::RecvWr;

/// `ibv_srq_init_attr` / `ibv_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrqAttr {
    /// Receive WRs the SRQ holds.
    pub max_wr: u32,
    /// SGEs per receive WR.
    pub max_sge: u32,
    /// The limit: when armed (non-zero), an `SRQ_LIMIT_REACHED` event is
    /// reported once fewer WRs than this remain, and the limit disarms.
    pub srq_limit: u32,
}

bitflags::bitflags! {
    /// Which attributes `modify` sets (`ibv_srq_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize (`IBV_SRQ_MAX_WR`).
        const MAX_WR = 1;
        /// Arm the limit (`IBV_SRQ_LIMIT`).
        const LIMIT = 2;
    }
}

/// A shared receive queue: receive WRs that every QP created with it
/// consumes, in posting order.
#[derive(Debug)]
pub struct SharedReceiveQueue {
    /// Declared (so dropped) before the context: the device's engine
    /// stops with the context, not after it.
    pub(crate) inner: SrqHandle,
    ctx: Context,
    _pd: Arc<()>,
}

impl SharedReceiveQueue {
    pub(crate) fn create(pd: &ProtectionDomain, init: &SrqAttr) -> Result<SharedReceiveQueue> {
        let inner = pd
            .ctx
            .inner
            .face
            .create_srq(pd.id, init.max_wr, init.max_sge)?;
        let srq = SharedReceiveQueue {
            inner,
            ctx: pd.ctx.clone(),
            _pd: pd.users.clone(),
        };
        if init.srq_limit != 0 {
            srq.modify(
                &SrqAttr {
                    srq_limit: init.srq_limit,
                    ..SrqAttr::default()
                },
                SrqAttrMask::LIMIT,
            )?;
        }
        Ok(srq)
    }

    /// The handle asynchronous events name (`EventElement::Srq`).
    pub fn handle(&self) -> u32 {
        self.inner.handle()
    }
    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// `ibv_post_srq_recv`. On error, the WRs before the failing one were
    /// posted; returns the failing index with the error.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        self.inner.post_recv(wrs).map_err(|(i, e)| (i, e.into()))
    }

    /// [`SharedReceiveQueue::post_recv`] of the WRs `read` makes of
    /// `items`, as [`crate::QueuePair::post_send_with`] (at most `max_wr`
    /// in one call).
    pub fn post_recv_with<T, E: From<Error>>(
        &self,
        items: impl IntoIterator<Item = T>,
        read: impl FnMut(T) -> std::result::Result<RecvWr, E>,
    ) -> std::result::Result<(), (usize, E)> {
        self.inner
            .post_recv_with(items, crate::qp::Caller::reader(read))
            .map_err(crate::qp::Caller::out)
    }

    /// The rule a receive WR's SGE count must pass (`max_sge`): for a
    /// caller that must check a foreign list's length before reading it.
    pub fn check_sges(&self, n: usize) -> Result<()> {
        self.inner
            .check_sges(n)
            .map_err(|e| Error::Invalid(e.to_string()))
    }

    /// `ibv_modify_srq`: resizes the SRQ to `max_wr` WRs (`MAX_WR`,
    /// keeping those posted; EINVAL below what is posted or the armed
    /// limit, as rxe), then arms the limit (`LIMIT`; it may not exceed
    /// `max_wr`).
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::MAX_WR) {
            self.inner.resize(attr.max_wr)?;
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            self.inner.arm_limit(attr.srq_limit)?;
        }
        Ok(())
    }

    /// `ibv_query_srq`: capacities and the armed limit (0 once it fired).
    pub fn query(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.inner.max_wr(),
            max_sge: self.inner.max_sge(),
            srq_limit: self.inner.limit(),
        }
    }

    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.inner.len()
    }
    /// True when no receive WR waits.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// `ibv_destroy_srq`: fails with [`Error::Busy`] (giving the SRQ back)
    /// while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (SharedReceiveQueue, Error)> {
        if self.inner.in_use() {
            return Err((self, Error::Busy("shared receive queue is used by a QP")));
        }
        Ok(())
    }
}

impl ProtectionDomain {
    /// `ibv_create_srq`.
    pub fn create_srq(&self, init: &SrqAttr) -> Result<SharedReceiveQueue> {
        SharedReceiveQueue::create(self, init)
    }
}
