//! Protection domains, memory regions and memory windows.

use super::{Device, DeviceError, Registry, Result};
use crate::diag::check::{self};
use crate::memory::{Backing, MrInner, MwInner, MwType, PdId};
use crate::quota::{Resource, Slot};
use crate::types::Access;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
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
    pub fn reg_vec(&self, pd: PdId, buf: Vec<u8>, access: Access) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        Ok(self.shared.keys.register_vec(pd, buf, access))
    }
    /// Registers `len` zeroed page-aligned bytes.
    pub fn reg_zeroed(&self, pd: PdId, len: usize, access: Access) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        self.shared
            .keys
            .register_zeroed(pd, len, access)
            .ok_or(DeviceError::NoMemory("memory allocation"))
    }
    /// Registers memory the caller owns, addressed through its keys from
    /// `iova` (`ibv_reg_mr_iova`; from 0 when `access` is zero-based).
    ///
    /// # Safety
    /// As [`KeyTable::register`] with external backing: `addr` is valid
    /// for reads and writes of `len` bytes until the region is
    /// deregistered.
    pub unsafe fn reg_raw(
        &self,
        pd: PdId,
        addr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<Arc<MrInner>> {
        Self::check_mr_access(access)?;
        let ptr = NonNull::new(addr).ok_or_else(|| DeviceError::Invalid("null address".into()))?;
        // SAFETY: the caller's promise above.
        Ok(unsafe {
            self.shared
                .keys
                .register(pd, ptr, len, iova, access, Backing::External)
        })
    }
    /// Re-registers a region with a new PD, access and/or memory (refused
    /// while memory windows are bound to it).
    ///
    /// # Safety
    /// As [`KeyTable::reregister`]; `memory` (address, length) as
    /// [`Device::reg_raw`] for the new memory.
    pub unsafe fn rereg(
        &self,
        old: &MrInner,
        pd: PdId,
        access: Access,
        memory: Option<(*mut u8, usize)>,
    ) -> Result<Arc<MrInner>> {
        let translation = match memory {
            Some((addr, len)) => {
                let ptr = NonNull::new(addr)
                    .ok_or_else(|| DeviceError::Invalid("null address".into()))?;
                Some((ptr, len, addr as u64, Backing::External))
            }
            None => None,
        };
        Self::check_mr_access(access)?;
        if old.bound_windows() > 0 {
            return Err(DeviceError::Busy("memory windows are bound to the region"));
        }
        // SAFETY: the caller's promise.
        Ok(unsafe { self.shared.keys.reregister(old, pd, access, translation) })
    }
    /// Deregisters a region: its keys stop working, and no copy into or
    /// out of it is in progress when this returns.
    pub fn dereg(&self, mr: &MrInner) {
        if check::any() {
            check::deregistering(&self.shared.keys, mr.lkey());
        }
        self.shared.keys.deregister(mr);
    }
    /// An unbound memory window.
    pub fn alloc_mw(&self, pd: PdId, kind: MwType) -> Arc<MwInner> {
        self.shared.keys.alloc_mw(pd, kind)
    }
    /// Deallocates a window (its R_Key stops working at once).
    pub fn dealloc_mw(&self, mw: &MwInner) {
        self.shared.keys.dealloc_mw(mw);
    }
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
