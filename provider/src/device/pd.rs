//! Protection domains, memory regions and memory windows.

use super::{Device, DeviceError, Registry, Result};
use crate::memory::{Backing, KeyTable, MemError, MrInner, MwBind, MwInner, MwType, PdId};
use crate::observe::{Event, Topic};
use crate::quota::{Resource, Slot};
use crate::types::{Access, Sge};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

impl Device {
    /// A new protection domain number (not listed by `uroce stat`
    /// unless objects are made in it: see [`Device::new_pd`]).
    pub fn alloc_pd(&self) -> PdId {
        self.shared.next_pd.fetch_add(1, Ordering::Relaxed)
    }
    /// A new protection domain in the device's `max_pd`, listed by
    /// `uroce stat` while the handle lives.
    pub fn new_pd(&self) -> Result<PdHandle> {
        let slot = self.take_slot(Resource::Pd)?;
        let id = self.alloc_pd();
        self.shared.reg.add_pd(id);
        Ok(PdHandle {
            id,
            reg: Arc::downgrade(&self.shared.reg),
            _slot: slot,
        })
    }

    /// The access rights a region may be registered with: remote write
    /// and remote atomic need local write (IBA 10.6.3.1); there is no
    /// persistent memory (EOPNOTSUPP, as the kernel answers).
    pub fn check_mr_access(access: Access) -> Result<()> {
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(DeviceError::Invalid(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        if access.contains(Access::FLUSH_PERSISTENT) {
            return Err(DeviceError::NotSupported(
                "FLUSH_PERSISTENT: uroce has no persistent memory",
            ));
        }
        Ok(())
    }
    /// Registers a buffer the region takes over.
    pub fn reg_vec(&self, pd: PdId, buf: Vec<u8>, access: Access) -> Result<MrHandle> {
        let slot = self.take_slot(Resource::Mr)?;
        Self::check_mr_access(access)?;
        Ok(MrHandle::new(
            self.shared.keys.register_vec(pd, buf, access),
            slot,
        ))
    }
    /// Registers `len` zeroed page-aligned bytes.
    pub fn reg_zeroed(&self, pd: PdId, len: usize, access: Access) -> Result<MrHandle> {
        let slot = self.take_slot(Resource::Mr)?;
        Self::check_mr_access(access)?;
        let mr = self
            .shared
            .keys
            .register_zeroed(pd, len, access)
            .ok_or(DeviceError::NoMemory("memory allocation"))?;
        Ok(MrHandle::new(mr, slot))
    }
    /// Registers memory the caller owns, addressed through its keys from
    /// `iova` (`ibv_reg_mr_iova`; from 0 when `access` is zero-based).
    ///
    /// # Safety
    /// As the key table's `register` with external backing: `addr` is valid
    /// for reads and writes of `len` bytes until the region is
    /// deregistered.
    pub unsafe fn reg_raw(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<MrHandle> {
        let slot = self.take_slot(Resource::Mr)?;
        Self::check_mr_access(access)?;
        let ptr = NonNull::new(addr).ok_or_else(|| DeviceError::Invalid("null address".into()))?;
        // SAFETY: the caller's promise above.
        let mr = unsafe {
            self.shared
                .keys
                .register(pd, ptr, len, iova, access, Backing::External)
        };
        Ok(MrHandle::new(mr, slot))
    }
    /// Re-registers a region with a new PD, access and/or memory (refused
    /// while memory windows are bound to it): `mr` takes the new
    /// registration (its shares keep the old one).
    ///
    /// # Safety
    /// As the key table's `reregister`; `memory` (address, length) as
    /// [`Device::reg_raw`] for the new memory.
    pub unsafe fn rereg(
        &self,
        mr: &mut MrHandle,
        pd: PdId,
        access: Access,
        memory: Option<(*mut u8, usize)>,
    ) -> Result<()> {
        let translation = match memory {
            Some((addr, len)) => {
                let ptr = NonNull::new(addr)
                    .ok_or_else(|| DeviceError::Invalid("null address".into()))?;
                Some((ptr, len, addr as u64, Backing::External))
            }
            None => None,
        };
        Self::check_mr_access(access)?;
        let old = &mr.mr;
        if old.bound_windows() > 0 {
            return Err(DeviceError::Busy("memory windows are bound to the region"));
        }
        // SAFETY: the caller's promise.
        mr.mr = unsafe { self.shared.keys.reregister(old, pd, access, translation) };
        Ok(())
    }
    /// Deregisters a region: its keys stop working, and no copy into or
    /// out of it is in progress when this returns. Gives back the buffer
    /// of a region made by [`Device::reg_vec`] or [`Device::reg_zeroed`]
    /// when no share of it is left.
    pub fn dereg(&self, mr: MrHandle) -> Option<Vec<u8>> {
        let (keys, lkey) = (&self.shared.keys, mr.lkey());
        crate::observe::tell(Topic::CHECK_LIFETIME, || Event::Deregistering {
            keys,
            lkey,
        });
        self.shared.keys.deregister(&mr.mr);
        mr.mr.take_vec().ok()
    }
    /// An unbound memory window, in the device's `max_mw`; deallocated
    /// (its R_Key stops working at once) when the handle is dropped.
    pub fn alloc_mw(&self, pd: PdId, kind: MwType) -> Result<MwHandle> {
        let slot = self.take_slot(Resource::Mw)?;
        Ok(MwHandle {
            mw: self.shared.keys.alloc_mw(pd, kind),
            keys: self.shared.keys.clone(),
            _slot: slot,
        })
    }
    /// A place for one more address handle in the device's `max_ah`,
    /// held while the handle lives.
    pub fn new_ah(&self) -> Result<AhHandle> {
        Ok(AhHandle {
            _slot: self.take_slot(Resource::Ah)?,
        })
    }
}

/// A registered memory region (see [`Device::reg_vec`]): its keys, its
/// addresses and the copies the memory model allows. The handle a
/// registration returns holds the region's place in the device's
/// `max_mr`; its [`MrHandle::share`]s do not.
#[derive(Debug)]
pub struct MrHandle {
    mr: Arc<MrInner>,
    _slot: Option<Slot>,
}

impl MrHandle {
    fn new(mr: Arc<MrInner>, slot: Slot) -> MrHandle {
        MrHandle {
            mr,
            _slot: Some(slot),
        }
    }
    /// A second handle on the same registration (`ibv_import_mr`).
    pub fn share(&self) -> MrHandle {
        MrHandle {
            mr: self.mr.clone(),
            _slot: None,
        }
    }
    /// Its protection domain.
    pub fn pd(&self) -> PdId {
        self.mr.pd()
    }
    /// L_Key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }
    /// R_Key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }
    /// The address its keys name its first byte by.
    pub fn iova(&self) -> u64 {
        self.mr.iova()
    }
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.mr.len()
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.mr.is_empty()
    }
    /// Its access rights.
    pub fn access(&self) -> Access {
        self.mr.access()
    }
    /// Memory windows bound to it now.
    pub fn bound_windows(&self) -> u32 {
        self.mr.bound_windows()
    }
    /// An SGE of `len` bytes at `offset` into the region.
    pub fn sge(&self, offset: u64, len: u32) -> Sge {
        Sge {
            addr: self.iova() + offset,
            length: len,
            lkey: self.lkey(),
        }
    }
    /// Copies bytes out of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> std::result::Result<(), MemError> {
        self.mr.read(offset, dst)
    }
    /// Copies bytes into the region.
    pub fn write(&self, offset: usize, src: &[u8]) -> std::result::Result<(), MemError> {
        self.mr.write(offset, src)
    }
    /// The 8-byte-aligned word at `offset`, in bounds and aligned
    /// (checked), as the pointer remote atomics on it use.
    pub fn atomic_u64_ptr(
        &self,
        offset: usize,
    ) -> std::result::Result<NonNull<AtomicU64>, MemError> {
        self.mr.atomic_u64_ptr(offset)
    }
    /// The raw start of the region.
    ///
    /// # Safety
    /// The pointer is valid while the region's memory is (owned backing:
    /// while a handle or descriptor holds it; caller memory: while the
    /// caller keeps it); reads and writes through it race with the
    /// engine's copies and remote peers unless the application orders
    /// them.
    pub unsafe fn as_ptr(&self) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.mr.as_ptr() }
    }
}

/// A memory window (see [`Device::alloc_mw`]).
#[derive(Debug)]
pub struct MwHandle {
    mw: Arc<MwInner>,
    keys: Arc<KeyTable>,
    _slot: Slot,
}

impl MwHandle {
    /// Its type.
    pub fn kind(&self) -> MwType {
        self.mw.kind()
    }
    /// Its R_Key now.
    pub fn rkey(&self) -> u32 {
        self.mw.rkey()
    }
    /// Whether it is bound.
    pub fn is_bound(&self) -> bool {
        self.mw.is_bound()
    }
    /// A bind request for this window (of a BIND_MW work request, or of
    /// a type 1 bind) with its keys, range and access still 0 and empty:
    /// the caller sets them (struct update syntax).
    pub fn bind_request(&self) -> MwBind {
        MwBind {
            mw: self.mw.clone(),
            mw_rkey: 0,
            new_rkey: 0,
            mr_lkey: 0,
            addr: 0,
            len: 0,
            access: Access::empty(),
        }
    }
}

impl Drop for MwHandle {
    fn drop(&mut self) {
        self.keys.dealloc_mw(&self.mw);
    }
}

/// An address handle's place in the device's `max_ah` (see
/// [`Device::new_ah`]).
#[derive(Debug)]
pub struct AhHandle {
    _slot: Slot,
}

/// A protection domain made by [`Device::new_pd`]: it holds its place in
/// the device's `max_pd` and is listed by `uroce stat` until dropped.
#[derive(Debug)]
pub struct PdHandle {
    id: PdId,
    reg: Weak<Registry>,
    _slot: Slot,
}

impl PdHandle {
    /// Its number.
    pub fn id(&self) -> PdId {
        self.id
    }
}

impl Drop for PdHandle {
    fn drop(&mut self) {
        if let Some(r) = self.reg.upgrade() {
            r.remove_pd(self.id);
        }
    }
}
