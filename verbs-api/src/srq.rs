//! Shared receive queues (`struct ibv_srq`).

use crate::device::{Context, MAX_QP_WR, MAX_SGE};
use crate::error::{Error, Result};
use crate::pd::ProtectionDomain;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use uroce_provider::memory::PdId;
use uroce_provider::transport::RecvQueue;
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
    ctx: Context,
    pub(crate) pd: PdId,
    pub(crate) rq: Arc<RecvQueue>,
    handle: u32,
    max_wr: u32,
    max_sge: u32,
    _pd: Arc<()>,
}

impl SharedReceiveQueue {
    pub(crate) fn create(pd: &ProtectionDomain, init: &SrqAttr) -> Result<SharedReceiveQueue> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        if init.max_wr == 0 || init.max_wr > MAX_QP_WR {
            return Err(Error::Invalid(format!(
                "max_wr {}: must be 1..={MAX_QP_WR}",
                init.max_wr
            )));
        }
        if init.max_sge > MAX_SGE {
            return Err(Error::Invalid(format!(
                "max_sge {} exceeds the device's {MAX_SGE}",
                init.max_sge
            )));
        }
        let handle = NEXT.fetch_add(1, Ordering::Relaxed);
        let rq = RecvQueue::new_srq(init.max_wr, handle, pd.ctx.inner.engine.events().clone());
        let srq = SharedReceiveQueue {
            ctx: pd.ctx.clone(),
            pd: pd.id,
            rq: Arc::new(rq),
            handle,
            max_wr: init.max_wr,
            max_sge: init.max_sge.max(1),
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
        self.handle
    }
    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// `ibv_post_srq_recv`. On error, the WRs before the failing one were
    /// posted; returns the failing index with the error.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sg_list.len() > self.max_sge as usize {
                return Err((
                    i,
                    Error::Invalid(format!("{} SGEs exceed max_sge", wr.sg_list.len())),
                ));
            }
            self.rq.post(wr.clone()).map_err(|e| (i, e.into()))?;
        }
        Ok(())
    }

    /// `ibv_modify_srq`: arms the limit (`LIMIT`; it may not exceed
    /// `max_wr`). Resizing (`MAX_WR`) is not supported.
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        if mask.contains(SrqAttrMask::MAX_WR) {
            return Err(Error::NotSupported("resizing an SRQ (IBV_SRQ_MAX_WR)"));
        }
        if mask.contains(SrqAttrMask::LIMIT) {
            if attr.srq_limit > self.max_wr {
                return Err(Error::Invalid(format!(
                    "srq_limit {} exceeds max_wr {}",
                    attr.srq_limit, self.max_wr
                )));
            }
            self.rq.arm_limit(attr.srq_limit);
        }
        Ok(())
    }

    /// `ibv_query_srq`: capacities and the armed limit (0 once it fired).
    pub fn query(&self) -> SrqAttr {
        SrqAttr {
            max_wr: self.max_wr,
            max_sge: self.max_sge,
            srq_limit: self.rq.limit(),
        }
    }

    /// Receive WRs waiting.
    pub fn len(&self) -> usize {
        self.rq.len()
    }
    /// True when no receive WR waits.
    pub fn is_empty(&self) -> bool {
        self.rq.is_empty()
    }

    /// `ibv_destroy_srq`: fails with [`Error::Busy`] (giving the SRQ back)
    /// while a QP uses it.
    pub fn destroy(self) -> std::result::Result<(), (SharedReceiveQueue, Error)> {
        if Arc::strong_count(&self.rq) > 1 {
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
