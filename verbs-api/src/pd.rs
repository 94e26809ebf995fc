//! Protection domains and memory regions.

use crate::device::Context;
use crate::error::{Error, Result};
use crate::qp::{QpInitAttr, QueuePair};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use uroce_provider::device::{MemError, MwBind, MwType, PdId};
use uroce_provider::device::{MrHandle, MwHandle, PdHandle};
use uroce_provider::types::{Access, SendFlags, SendWr, Sge, WrOpcode};

/// A protection domain (`struct ibv_pd`).
#[derive(Debug)]
pub struct ProtectionDomain {
    pub(crate) ctx: Context,
    pub(crate) id: PdId,
    /// Held by every MR and QP of the PD: destroy refuses while shared.
    pub(crate) users: Arc<()>,
    /// The provider's PD: its place in the device's `max_pd` and in
    /// `uroce stat` (none for a shared handle).
    _pd: Option<PdHandle>,
}

impl ProtectionDomain {
    pub(crate) fn new(ctx: Context, pd: PdHandle) -> ProtectionDomain {
        ProtectionDomain {
            ctx,
            id: pd.id(),
            users: Arc::new(()),
            _pd: Some(pd),
        }
    }
    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The PD's number in its device (`ibv_pd::handle`): what
    /// `ibv_import_pd` names it by.
    pub fn handle(&self) -> u32 {
        self.id
    }

    /// A second handle on the same protection domain (`ibv_import_pd`):
    /// objects made through either are in the same domain. It counts as a
    /// user of the domain until dropped.
    pub fn share(&self) -> ProtectionDomain {
        ProtectionDomain {
            ctx: self.ctx.clone(),
            id: self.id,
            users: self.users.clone(),
            _pd: None,
        }
    }

    fn wrap(&self, inner: MrHandle) -> MemoryRegion {
        MemoryRegion {
            ctx: self.ctx.clone(),
            inner: Some(inner),
            _pd: self.users.clone(),
            owns: true,
        }
    }

    /// `ibv_reg_mr` over a buffer the region takes over, without copying
    /// it; [`MemoryRegion::dereg`] gives it back.
    pub fn reg_mr(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        let mr = self.ctx.inner.face.reg_vec(self.id, buf, access)?;
        Ok(self.wrap(mr))
    }

    /// Allocates `len` zeroed page-aligned bytes and registers them.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        let mr = self.ctx.inner.face.reg_zeroed(self.id, len, access)?;
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
        // SAFETY: the caller's promise above.
        unsafe { self.reg_mr_iova_raw(addr, len, addr as u64, access) }
    }

    /// `ibv_reg_mr_iova`: as [`ProtectionDomain::reg_mr_raw`], the region
    /// addressed through its keys (in SGEs and by peers) from `iova`
    /// instead of from `addr`. With [`Access::ZERO_BASED`] the region is
    /// addressed from 0 whatever `iova` says (as `iova` 0).
    ///
    /// # Safety
    /// As [`ProtectionDomain::reg_mr_raw`].
    pub unsafe fn reg_mr_iova_raw(
        &self,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's promise above.
        let mr = unsafe {
            self.ctx
                .inner
                .face
                .reg_raw(self.id, addr, len, iova, access)?
        };
        Ok(self.wrap(mr))
    }

    /// `ibv_alloc_mw`: an unbound memory window of `kind` in this PD.
    /// Type 1 windows are bound with [`QueuePair::bind_mw`]; type 2 with
    /// a BIND_MW work request ([`MemoryWindow::bind_wr`]) and invalidated
    /// with LOCAL_INV or a peer's SEND with Invalidate.
    pub fn alloc_mw(&self, kind: MwType) -> Result<MemoryWindow> {
        let inner = self.ctx.inner.face.alloc_mw(self.id, kind)?;
        Ok(MemoryWindow {
            _ctx: self.ctx.clone(),
            rkey: AtomicU32::new(inner.rkey()),
            inner,
            _pd: self.users.clone(),
        })
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
    /// The registration (it holds the region's place in the device's
    /// `max_mr`, unless this is a shared handle).
    inner: Option<MrHandle>,
    _pd: Arc<()>,
    /// Dropping it deregisters (false for a [`MemoryRegion::share`]d
    /// handle).
    owns: bool,
}

impl MemoryRegion {
    fn mr(&self) -> &MrHandle {
        self.inner.as_ref().expect("present until dropped")
    }
    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS` and/or
    /// `IBV_REREG_MR_CHANGE_PD`: the region keeps its memory and keys and
    /// takes the new access rights and/or PD. Messages in progress that
    /// use the region fail as after deregistration. Refused
    /// ([`Error::Busy`]) while memory windows are bound to it.
    pub fn rereg(&mut self, pd: Option<&ProtectionDomain>, access: Option<Access>) -> Result<()> {
        // SAFETY: no new memory: the region's own moves over.
        unsafe { self.rereg_with(pd, access, None) }
    }
    /// `ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_TRANSLATION` too: as
    /// [`MemoryRegion::rereg`], over `len` bytes at `addr` from now on.
    ///
    /// # Safety
    /// As [`ProtectionDomain::reg_mr_raw`] for the new memory. The old
    /// memory is no longer touched when this returns; a region made over
    /// an owned buffer gives that buffer up (it is freed with the region).
    pub unsafe fn rereg_raw(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        addr: *mut u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise above.
        unsafe { self.rereg_with(pd, access, Some((addr, len))) }
    }
    /// The re-registration both forms share (the provider checks it).
    ///
    /// # Safety
    /// As [`uroce_provider::device::Device::rereg`] (the region's own
    /// memory moves over when `memory` is `None`).
    unsafe fn rereg_with(
        &mut self,
        pd: Option<&ProtectionDomain>,
        access: Option<Access>,
        memory: Option<(*mut u8, usize)>,
    ) -> Result<()> {
        let mr = self.inner.as_mut().expect("present until dropped");
        let access = access.unwrap_or(mr.access());
        let pd_id = pd.map_or(mr.pd(), |p| p.id);
        // SAFETY: forwarded contract. The old descriptor's owned memory
        // (if any) is freed when its last holder drops it; nothing
        // touches it any more.
        unsafe { self.ctx.inner.face.rereg(mr, pd_id, access, memory)? };
        if let Some(pd) = pd {
            self._pd = pd.users.clone();
        }
        Ok(())
    }
    /// Memory windows bound to the region now.
    pub fn bound_windows(&self) -> u32 {
        self.mr().bound_windows()
    }
    /// A second handle on the same registration (`ibv_import_mr`): the
    /// same keys and memory. Dropping it leaves the region registered
    /// (`ibv_unimport_mr`); [`MemoryRegion::dereg`] through either
    /// deregisters it for both.
    pub fn share(&self) -> MemoryRegion {
        MemoryRegion {
            ctx: self.ctx.clone(),
            inner: self.inner.as_ref().map(MrHandle::share),
            _pd: self._pd.clone(),
            owns: false,
        }
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }
    /// The virtual address peers and SGEs use for byte 0 (its iova; 0 for
    /// a zero-based region).
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
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        self.mr().sge(offset as u64, len)
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
    /// See [`MrHandle::as_ptr`].
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
        self.ctx.inner.face.dereg(inner)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        if self.owns {
            self.release();
        }
    }
}

/// A memory window (`struct ibv_mw`): remote access to a range of a
/// memory region that can be granted and withdrawn without touching the
/// region. Deallocated when dropped (its R_Key stops working at once).
///
/// ```
/// # use uroce_verbs::*;
/// # let ctx = Device::new("mwdoc", "127.61.0.1".parse().unwrap()).open().unwrap();
/// let pd = ctx.alloc_pd().unwrap();
/// let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
/// let mw = pd.alloc_mw(MwType::Type2).unwrap();
/// // A BIND_MW work request grants remote write to 256 bytes of `mr`;
/// // post it on an RC QP of the same PD, and the peer uses `rkey`.
/// let (wr, rkey) = mw.bind_wr(7, &mr, 0..256, Access::REMOTE_WRITE);
/// assert_eq!(rkey >> 8, mw.rkey() >> 8, "same window index, new key");
/// assert_eq!(wr.opcode, WrOpcode::BindMw);
/// ```
#[derive(Debug)]
pub struct MemoryWindow {
    /// Keeps the device open while the window lives.
    _ctx: Context,
    inner: MwHandle,
    /// The R_Key as the application sees it (`ibv_mw::rkey`): stepped by
    /// each type 1 bind when posted.
    rkey: AtomicU32,
    _pd: Arc<()>,
}

impl MemoryWindow {
    /// The R_Key: for type 1, as [`QueuePair::bind_mw`] last set it (the
    /// key the window has once that bind executes); for type 2, the key
    /// of its last bind that executed.
    pub fn rkey(&self) -> u32 {
        match self.inner.kind() {
            MwType::Type1 => self.rkey.load(Ordering::Acquire),
            MwType::Type2 => self.inner.rkey(),
        }
    }
    /// Type 1 or type 2.
    pub fn kind(&self) -> MwType {
        self.inner.kind()
    }
    /// True while bound to a region.
    pub fn is_bound(&self) -> bool {
        self.inner.is_bound()
    }
    /// A BIND_MW work request (type 2: post it with
    /// [`QueuePair::post_send`]) granting `access` to `range` of `mr`,
    /// with the next key (`ibv_inc_rkey` of [`MemoryWindow::rkey`]).
    /// Returns the WR (signaled) and the R_Key the window will have once
    /// it executes.
    pub fn bind_wr(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        range: std::ops::Range<usize>,
        access: Access,
    ) -> (SendWr, u32) {
        let new_rkey = inc_rkey(self.rkey());
        let mut wr = SendWr::new(wr_id, WrOpcode::BindMw);
        wr.flags = SendFlags::SIGNALED;
        wr.bind = Some(self.bind_request(
            self.rkey(),
            new_rkey,
            mr.lkey(),
            mr.addr() + range.start as u64,
            range.len() as u64,
            access,
        ));
        (wr, new_rkey)
    }
    /// The bind request of a BIND_MW work request in the C ABI's terms
    /// (`ibv_send_wr::bind_mw`): the window's key as the binder saw it
    /// (`ibv_mw::rkey`), the new key, and the region's L_Key, start
    /// address and length (0 unbinds a type 1 window).
    pub fn bind_request(
        &self,
        mw_rkey: u32,
        new_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> MwBind {
        MwBind {
            mw_rkey,
            new_rkey,
            mr_lkey,
            addr,
            len,
            access,
            ..self.inner.bind_request()
        }
    }
    pub(crate) fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }
}

/// `ibv_inc_rkey`: the same index, the next key (low 8 bits).
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}
