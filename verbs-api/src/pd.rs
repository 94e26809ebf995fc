//! Protection domains and memory regions.

use crate::device::Context;
use crate::error::{Error, Result};
use crate::qp::{QpInitAttr, QueuePair};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use uroce_provider::memory::{Backing, MemError, MrInner, PdId};
use uroce_provider::types::Access;

/// A protection domain (`struct ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(crate) ctx: Context,
    pub(crate) id: PdId,
    /// Held by every MR and QP of the PD: destroy refuses while shared.
    pub(crate) users: Arc<()>,
}

impl ProtectionDomain {
    pub(crate) fn new(ctx: Context, id: PdId) -> ProtectionDomain {
        ProtectionDomain {
            ctx,
            id,
            users: Arc::new(()),
        }
    }
    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    fn check_access(access: Access) -> Result<()> {
        // IBA 10.6.3.1 / ibv_reg_mr(3): remote write or remote atomic
        // needs local write.
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Error::Invalid(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        Ok(())
    }

    fn wrap(&self, inner: Arc<MrInner>) -> MemoryRegion {
        MemoryRegion {
            ctx: self.ctx.clone(),
            inner: Some(inner),
            _pd: self.users.clone(),
        }
    }

    /// `ibv_reg_mr` over a buffer the region takes over, without copying
    /// it; [`MemoryRegion::dereg`] gives it back.
    pub fn reg_mr(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        Self::check_access(access)?;
        Ok(self.wrap(self.ctx.inner.keys.register_vec(self.id, buf, access)))
    }

    /// Allocates `len` zeroed page-aligned bytes and registers them.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        Self::check_access(access)?;
        let mr = self
            .ctx
            .inner
            .keys
            .register_zeroed(self.id, len, access)
            .ok_or(Error::NoMemory("memory allocation"))?;
        Ok(self.wrap(mr))
    }

    /// `ibv_reg_mr` over memory the caller owns.
    ///
    /// # Safety
    /// `addr` must be valid for reads and writes of `len` bytes until the
    /// region is deregistered (dropped), and the caller must not hold Rust
    /// references into that memory while it is registered (the engine and
    /// remote peers write it concurrently).
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        Self::check_access(access)?;
        let ptr = NonNull::new(addr).ok_or_else(|| Error::Invalid("null address".into()))?;
        // SAFETY: the caller's promise above.
        let mr = unsafe {
            self.ctx
                .inner
                .keys
                .register(self.id, ptr, len, addr as u64, access, Backing::External)
        };
        Ok(self.wrap(mr))
    }

    /// `ibv_create_qp`.
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<QueuePair> {
        QueuePair::create(self, init)
    }

    /// `ibv_dealloc_pd`: fails with [`Error::Busy`] (giving the PD back)
    /// while MRs or QPs use it.
    pub fn destroy(self) -> std::result::Result<(), (ProtectionDomain, Error)> {
        if Arc::strong_count(&self.users) > 1 {
            return Err((
                self,
                Error::Busy("protection domain has memory regions or QPs"),
            ));
        }
        Ok(())
    }
}

/// A registered memory region (`struct ibv_mr`).
///
/// Its bytes are shared with the engine and remote peers, so there is no
/// `&[u8]` view: copy in and out with [`read`](Self::read) and
/// [`write`](Self::write), use [`atomic_u64`](Self::atomic_u64) for words
/// that remote atomics also touch, or take the raw pointer (unsafe).
/// Dropping the region deregisters it: its keys stop working at once.
///
/// ```
/// use uroce_verbs::{Access, Device};
/// let ctx = Device::new("doc2", "127.70.2.1".parse().unwrap()).open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
/// mr.write(100, b"registered").unwrap();
/// assert_eq!(mr.to_vec(100, 10).unwrap(), b"registered");
/// let sge = mr.sge(100, 10); // for a work request: address, length, lkey
/// assert_eq!((sge.addr, sge.lkey), (mr.addr() + 100, mr.lkey()));
/// assert!(mr.write(4090, b"past the end").is_err());
/// ```
#[derive(Debug)]
pub struct MemoryRegion {
    ctx: Context,
    inner: Option<Arc<MrInner>>,
    _pd: Arc<()>,
}

impl MemoryRegion {
    fn mr(&self) -> &MrInner {
        self.inner.as_ref().expect("present until dropped")
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }
    /// The virtual address peers and SGEs use for byte 0.
    pub fn addr(&self) -> u64 {
        self.mr().iova()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mr().len()
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.mr().is_empty()
    }
    /// Access flags.
    pub fn access(&self) -> Access {
        self.mr().access()
    }
    /// An SGE covering `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: u32) -> uroce_provider::types::Sge {
        uroce_provider::types::Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
    /// Copies bytes out of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> std::result::Result<(), MemError> {
        self.mr().read(offset, dst)
    }
    /// Copies bytes into the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> std::result::Result<(), MemError> {
        self.mr().write(offset, src)
    }
    /// A copy of `len` bytes at `offset`.
    pub fn to_vec(&self, offset: usize, len: usize) -> std::result::Result<Vec<u8>, MemError> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }
    /// The 8-byte-aligned word at `offset` as an atomic, coherent with
    /// remote atomics on it.
    pub fn atomic_u64(&self, offset: usize) -> std::result::Result<&AtomicU64, MemError> {
        let p = self.mr().atomic_u64_ptr(offset)?;
        // SAFETY: in bounds and aligned (checked). The bytes stay allocated
        // while `self` is borrowed: owned backing lives until the last
        // descriptor drops (this region holds one) and is handed back only
        // by `dereg(self)`; memory registered with `reg_mr_raw` is valid
        // until this region is dropped (its contract). A remote
        // invalidation does not free it. Every other access to the word
        // (engine copies, remote atomics) is atomic.
        Ok(unsafe { p.as_ref() })
    }
    /// The raw start of the region.
    ///
    /// # Safety
    /// See [`MrInner::as_ptr`].
    pub unsafe fn as_ptr(&self) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.mr().as_ptr() }
    }
    /// `ibv_dereg_mr`: the keys stop working at once, and when this returns
    /// the engine is not copying into or out of the region and never will:
    /// a message in progress that needs it fails. Gives back the buffer of
    /// a region made by [`ProtectionDomain::reg_mr`].
    pub fn dereg(mut self) -> Vec<u8> {
        self.release().unwrap_or_default()
    }

    fn release(&mut self) -> Option<Vec<u8>> {
        let inner = self.inner.take()?;
        // Waits for copies in progress; none starts afterwards, even from
        // descriptors the engine still holds (messages in progress).
        self.ctx.inner.keys.deregister(&inner);
        inner.take_vec().ok()
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.release();
    }
}
