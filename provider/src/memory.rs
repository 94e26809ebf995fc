//! Protection domains, memory regions and their keys.
//!
//! ## The memory model
//!
//! Registered memory is shared by three parties at once: the application,
//! the engine thread (which gathers outgoing payload and scatters incoming
//! data), and — through the engine — remote peers that RDMA WRITE, READ and
//! perform atomics on it at any time. No Rust reference (`&[u8]` or
//! `&mut [u8]`) to the bytes is ever handed out, because a remote write could
//! race with it. Instead:
//!
//! * bytes move in and out by **copy** ([`MrInner::read`],
//!   [`MrInner::write`]) through raw pointers, as DMA into a buffer would;
//!   concurrent remote writes to the same bytes leave unspecified values,
//!   never undefined behaviour in the safe API;
//! * 64-bit words are accessed as **real atomics** ([`MrInner::atomic_u64`]):
//!   the engine executes remote compare-swap and fetch-add with
//!   `AtomicU64` operations on the same memory, so local atomics on the same
//!   word stay coherent with remote ones;
//! * an `unsafe` raw escape hatch ([`MrInner::as_ptr`]) for code that
//!   manages the races itself (and for the C ABI).
//!
//! Registration never copies: the region takes ownership of the caller's
//! buffer ([`Backing::Vec`]), allocates page-aligned memory
//! ([`Backing::alloc_zeroed`]), or (unsafe) refers to memory the caller
//! keeps alive ([`Backing::External`]).
//!
//! Keys are 32 random bits per registration, `lkey != rkey`, never reused
//! while registered (the ReDMArk paper shows why predictable keys matter).
//! Deregistration removes the keys from the table at once; the engine is
//! then synchronised with (see the engine) so that no copy into the region
//! is in progress when deregistration returns.

use crate::types::Access;
use dashmap::DashMap;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Identifies a protection domain within a context.
pub type PdId = u32;

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The range is not inside the region.
    #[error("range {addr:#x}+{len} is outside the memory region")]
    OutOfBounds {
        /// Start address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// Atomic access to an address that is not 8-byte aligned.
    #[error("address {0:#x} is not 8-byte aligned")]
    Misaligned(u64),
    /// The region was deregistered.
    #[error("memory region deregistered")]
    Invalid,
}

/// Where a region's bytes live.
pub enum Backing {
    /// A vector the region owns (no copy; returned by `into_vec`).
    Vec(Vec<u8>),
    /// Zeroed memory the region allocated with the given layout.
    Aligned(Layout),
    /// Memory owned by someone else, who keeps it valid while registered.
    External,
}

impl Backing {
    /// Page-aligned zeroed memory of `len` bytes (at least 1).
    pub fn alloc_zeroed(len: usize) -> Option<(NonNull<u8>, Backing)> {
        let layout = Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(p).map(|p| (p, Backing::Aligned(layout)))
    }
}

/// A registered memory region as the engine sees it.
pub struct MrInner {
    pd: PdId,
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    access: Access,
    lkey: u32,
    rkey: u32,
    valid: AtomicBool,
    backing: parking_lot::Mutex<Option<Backing>>,
}

// SAFETY: the region is shared memory by design: every access goes through
// raw-pointer copies or atomics (see the module docs); the pointer stays
// valid for the region's life (owned backing is freed only in Drop, external
// backing is the registrant's promise).
unsafe impl Send for MrInner {}
// SAFETY: as above.
unsafe impl Sync for MrInner {}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrInner")
            .field("pd", &self.pd)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("access", &self.access)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .finish()
    }
}

impl MrInner {
    /// Protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// First virtual address (the value peers use in RETHs).
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Access flags.
    pub fn access(&self) -> Access {
        self.access
    }
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Still registered.
    pub fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    /// The region's start as a raw pointer.
    ///
    /// # Safety
    /// The caller must not create references to the memory that could
    /// overlap an engine or remote access, and must not use the pointer
    /// after the region is deregistered and dropped.
    pub unsafe fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Offset of `[addr, addr+len)` in the region, if inside it.
    pub fn offset_of(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        let off = addr.wrapping_sub(self.iova);
        if addr < self.iova || off > self.len as u64 || len > self.len as u64 - off {
            return Err(MemError::OutOfBounds { addr, len });
        }
        Ok(off as usize)
    }

    /// Copies `dst.len()` bytes starting at byte `offset` of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.check(offset, dst.len())?;
        // SAFETY: in bounds (checked); the region is valid memory; `dst` is
        // a distinct Rust allocation (it cannot alias registered memory,
        // which no Rust reference points into).
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        Ok(())
    }

    /// Copies `src` into the region at byte `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.check(offset, src.len())?;
        // SAFETY: as in `read`, with the direction reversed.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
        Ok(())
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        self.check(offset, len)?;
        // SAFETY: in bounds; raw write into registered memory.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// The 64-bit word at byte `offset` as an atomic. The word's address
    /// (iova + offset) must be 8-byte aligned.
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, MemError> {
        self.check(offset, 8)?;
        // SAFETY: in bounds; alignment checked just below before the cast.
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        if (p as usize) % 8 != 0 {
            return Err(MemError::Misaligned(self.iova + offset as u64));
        }
        // SAFETY: aligned, in bounds, valid for the region's life (which
        // bounds the returned reference); AtomicU64 has the size and
        // alignment of u64 and interior mutability, so shared access from
        // the engine (also atomic) is sound.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), MemError> {
        if offset > self.len || len > self.len - offset {
            return Err(MemError::OutOfBounds {
                addr: self.iova.wrapping_add(offset as u64),
                len: len as u64,
            });
        }
        Ok(())
    }

    /// Marks the region invalid (deregistered).
    pub(crate) fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }

    /// After deregistration, when nothing else holds the region: gives
    /// back the `Vec` it took over (other backings give an empty `Vec`).
    /// Otherwise the region comes back unchanged.
    pub fn take_vec(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
        if self.is_valid() {
            return Err(self);
        }
        match Arc::try_unwrap(self) {
            Ok(inner) => {
                let b = inner.backing.lock().take();
                match b {
                    Some(Backing::Vec(v)) => Ok(v),
                    other => {
                        *inner.backing.lock() = other;
                        Ok(Vec::new())
                    }
                }
            }
            Err(arc) => Err(arc),
        }
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if let Some(Backing::Aligned(layout)) = self.backing.get_mut().take() {
            // SAFETY: allocated in `Backing::alloc_zeroed` with this layout,
            // freed exactly once here.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
        // Backing::Vec drops with the field; External is not ours.
    }
}

/// Why a key lookup failed, in the terms of the spec's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// No region has this key.
    #[error("no memory region with key {0:#x}")]
    BadKey(u32),
    /// The region belongs to another protection domain.
    #[error("memory region is in another protection domain")]
    PdMismatch,
    /// The region lacks the access right.
    #[error("memory region lacks access {0:?}")]
    Access(Access),
    /// The range is outside the region.
    #[error(transparent)]
    Mem(#[from] MemError),
}

/// The keys of one context's regions: lookups by lkey and rkey.
#[derive(Default)]
pub struct KeyTable {
    by_lkey: DashMap<u32, Arc<MrInner>>,
    by_rkey: DashMap<u32, Arc<MrInner>>,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyTable({} regions)", self.by_lkey.len())
    }
}

impl KeyTable {
    /// An empty table.
    pub fn new() -> KeyTable {
        KeyTable::default()
    }

    /// Registers memory at `ptr` of `len` bytes, visible to peers at
    /// `iova`, with fresh random keys.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long
    /// as the region exists, and `backing` must describe who owns it.
    pub unsafe fn register(
        &self,
        pd: PdId,
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
        backing: Backing,
    ) -> Arc<MrInner> {
        loop {
            let lkey: u32 = rand::random();
            let rkey: u32 = rand::random();
            if lkey == rkey || lkey == 0 || rkey == 0 {
                continue;
            }
            if self.by_lkey.contains_key(&lkey) || self.by_rkey.contains_key(&rkey) {
                continue;
            }
            let mr = Arc::new(MrInner {
                pd,
                ptr,
                len,
                iova,
                access,
                lkey,
                rkey,
                valid: AtomicBool::new(true),
                backing: parking_lot::Mutex::new(Some(backing)),
            });
            self.by_lkey.insert(lkey, mr.clone());
            self.by_rkey.insert(rkey, mr.clone());
            return mr;
        }
    }

    /// Registers a vector the region takes over (no copy). Its iova is the
    /// buffer's address, as in verbs.
    pub fn register_vec(&self, pd: PdId, mut v: Vec<u8>, access: Access) -> Arc<MrInner> {
        let len = v.len();
        let ptr = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
        // SAFETY: the Vec's heap buffer does not move when the Vec (a
        // pointer/len/cap triple) is moved into the region, and lives until
        // the region drops.
        unsafe { self.register(pd, ptr, len, ptr.as_ptr() as u64, access, Backing::Vec(v)) }
    }

    /// Allocates and registers `len` zeroed, page-aligned bytes.
    pub fn register_zeroed(&self, pd: PdId, len: usize, access: Access) -> Option<Arc<MrInner>> {
        let (ptr, backing) = Backing::alloc_zeroed(len)?;
        // SAFETY: freshly allocated, owned by the region via `backing`.
        Some(unsafe { self.register(pd, ptr, len, ptr.as_ptr() as u64, access, backing) })
    }

    /// The region with this rkey, if registered.
    pub fn find_rkey(&self, rkey: u32) -> Option<Arc<MrInner>> {
        Self::lookup(&self.by_rkey, rkey).ok()
    }

    /// Removes a region's keys at once and marks it invalid.
    pub fn deregister(&self, mr: &MrInner) {
        mr.invalidate();
        self.by_lkey.remove(&mr.lkey);
        self.by_rkey.remove(&mr.rkey);
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.by_lkey.len()
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.by_lkey.is_empty()
    }

    /// Number of regions in a PD (for "PD busy" checks).
    pub fn count_in_pd(&self, pd: PdId) -> usize {
        self.by_lkey.iter().filter(|e| e.value().pd == pd).count()
    }

    /// Local check of an SGE: key, PD, access and bounds. Returns the
    /// region and the offset of `addr` in it.
    pub fn check_lkey(
        &self,
        lkey: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Arc<MrInner>, usize), KeyError> {
        Self::check(Self::lookup(&self.by_lkey, lkey)?, pd, addr, len, need)
    }

    /// Remote check of an R_Key (IBA 10.6.3.2 / C9-...): key, PD, access
    /// and bounds.
    pub fn check_rkey(
        &self,
        rkey: u32,
        pd: PdId,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Arc<MrInner>, usize), KeyError> {
        Self::check(Self::lookup(&self.by_rkey, rkey)?, pd, addr, len, need)
    }

    fn lookup(map: &DashMap<u32, Arc<MrInner>>, key: u32) -> Result<Arc<MrInner>, KeyError> {
        map.get(&key)
            .map(|e| e.value().clone())
            .ok_or(KeyError::BadKey(key))
    }

    fn check(
        mr: Arc<MrInner>,
        pd: PdId,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Arc<MrInner>, usize), KeyError> {
        if !mr.is_valid() {
            return Err(KeyError::Mem(MemError::Invalid));
        }
        if mr.pd != pd {
            return Err(KeyError::PdMismatch);
        }
        if !mr.access.contains(need) {
            return Err(KeyError::Access(need));
        }
        let off = mr.offset_of(addr, len)?;
        Ok((mr, off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_random_distinct_and_checked() {
        let t = KeyTable::new();
        let a = t.register_vec(1, vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let b = t.register_zeroed(1, 4096, Access::LOCAL_WRITE).unwrap();
        assert_ne!(a.lkey(), a.rkey());
        assert_ne!(a.rkey(), b.rkey());
        assert_eq!(b.iova() % 4096, 0);
        let (m, off) = t
            .check_rkey(a.rkey(), 1, a.iova() + 8, 8, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(off, 8);
        assert_eq!(m.lkey(), a.lkey());
        assert_eq!(
            t.check_rkey(a.rkey(), 2, a.iova(), 8, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::PdMismatch
        );
        assert_eq!(
            t.check_rkey(a.rkey(), 1, a.iova(), 8, Access::REMOTE_READ)
                .unwrap_err(),
            KeyError::Access(Access::REMOTE_READ)
        );
        assert!(matches!(
            t.check_rkey(a.rkey(), 1, a.iova() + 60, 8, Access::REMOTE_WRITE),
            Err(KeyError::Mem(MemError::OutOfBounds { .. }))
        ));
        assert!(matches!(
            t.check_rkey(
                a.rkey(),
                1,
                a.iova().wrapping_sub(1),
                1,
                Access::REMOTE_WRITE
            ),
            Err(KeyError::Mem(MemError::OutOfBounds { .. }))
        ));
        assert!(matches!(
            t.check_lkey(a.rkey(), 1, a.iova(), 1, Access::empty()),
            Err(KeyError::BadKey(_))
        ));
        // zero-length at the very end is in bounds
        assert!(t
            .check_lkey(a.lkey(), 1, a.iova() + 64, 0, Access::empty())
            .is_ok());
        t.deregister(&a);
        assert!(matches!(
            t.check_rkey(a.rkey(), 1, a.iova(), 8, Access::REMOTE_WRITE),
            Err(KeyError::BadKey(_))
        ));
        assert!(!a.is_valid());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn copy_and_atomics() {
        let t = KeyTable::new();
        let m = t.register_zeroed(1, 64, Access::LOCAL_WRITE).unwrap();
        m.write(3, b"hello").unwrap();
        let mut out = [0u8; 5];
        m.read(3, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(m.write(60, b"hello").is_err());
        let w = m.atomic_u64(8).unwrap();
        w.fetch_add(5, Ordering::SeqCst);
        assert_eq!(m.atomic_u64(8).unwrap().load(Ordering::SeqCst), 5);
        assert!(matches!(m.atomic_u64(4), Err(MemError::Misaligned(_))));
        assert!(m.atomic_u64(60).is_err());
    }

    #[test]
    fn vec_comes_back() {
        let t = KeyTable::new();
        let m = t.register_vec(1, b"abc".to_vec(), Access::empty());
        t.deregister(&m);
        assert_eq!(m.take_vec().unwrap(), b"abc");
    }
}
