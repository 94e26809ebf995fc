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
//!   [`MrInner::write`]) made of relaxed atomic accesses ([`shared`]; on
//!   x86-64, inline assembly that does the same at memcpy's speed), as
//!   DMA into a buffer would: a copy racing with another copy (or a remote
//!   write) of the same bytes leaves each byte with one of the values
//!   written, and is never undefined behaviour;
//! * 64-bit words are accessed as **real atomics**
//!   ([`MrInner::with_atomic_u64`]): the engine executes remote
//!   compare-swap and fetch-add with `AtomicU64` operations on the same
//!   memory, so local atomics on the same word stay coherent with remote
//!   ones;
//! * an `unsafe` raw escape hatch ([`MrInner::as_ptr`]) for code that
//!   manages the races itself (and for the C ABI).
//!
//! Registration never copies: the region takes ownership of the caller's
//! buffer ([`Backing::Vec`]), allocates page-aligned memory
//! ([`Backing::alloc_zeroed`]), or (unsafe) refers to memory the caller
//! keeps alive ([`Backing::External`]) until it deregisters.
//!
//! Keys are 32 random bits per registration, `lkey != rkey`, never reused
//! while registered (the ReDMArk paper shows why predictable keys matter).
//!
//! ## Deregistration
//! The engine keeps `Arc<MrInner>` clones in messages in progress (a WRITE
//! whose MIDDLE packets are still coming, a receive WR being scattered, a
//! READ being answered, a WR that may be retransmitted). Holding the `Arc`
//! keeps the *descriptor* alive, not the right to touch the memory: every
//! access to the bytes goes through one gate (`MrInner::touch`) that
//! holds the region's registration lock shared and checks that the region
//! is still registered. [`KeyTable::deregister`] takes that lock
//! exclusively to mark the region invalid, so when it returns no copy into
//! or out of the region is in progress and none can start: the caller may
//! free external memory at once. The message that needed the region then
//! fails where it next touches it, with the status the spec names for its
//! side (see the transports).

pub use access::Access;
use dashmap::DashMap;
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;

mod access;
pub mod range;
pub mod shared;
pub mod window;
use shared::Shared;
pub use window::{MwBind, MwError, MwInner, MwType};

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
    /// True while registered. Held shared by every access to the bytes,
    /// exclusively by deregistration.
    gate: parking_lot::RwLock<bool>,
    backing: parking_lot::Mutex<Option<Backing>>,
    /// Memory windows bound to the region.
    bound_windows: AtomicI32,
}

// SAFETY: the region is shared memory by design: every access goes through
// atomic copies or atomics under the gate (see the module docs); the pointer
// is dereferenced only while the gate says the region is registered (owned
// backing is freed only in Drop or handed back after deregistration;
// external backing is the registrant's promise until deregistration).
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
    /// A registered region with keys `(lkey, rkey)`.
    fn registered(
        pd: PdId,
        ptr: NonNull<u8>,
        len: usize,
        iova: u64,
        access: Access,
        (lkey, rkey): (u32, u32),
        backing: Backing,
    ) -> MrInner {
        MrInner {
            pd,
            ptr,
            len,
            iova,
            access,
            lkey,
            rkey,
            gate: parking_lot::RwLock::new(true),
            backing: parking_lot::Mutex::new(Some(backing)),
            bound_windows: AtomicI32::new(0),
        }
    }
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
    /// Memory windows bound to the region now (deregistration and
    /// re-registration are refused while any is).
    pub fn bound_windows(&self) -> u32 {
        self.bound_windows.load(Ordering::Acquire).max(0) as u32
    }
    pub(crate) fn bound_windows_add(&self, d: i32) {
        self.bound_windows.fetch_add(d, Ordering::AcqRel);
    }
    /// Still registered (false while a deregistration holds the gate).
    pub fn is_valid(&self) -> bool {
        self.gate.try_read().is_some_and(|registered| *registered)
    }
    /// The region's start as a raw pointer.
    ///
    /// # Safety
    /// The caller must not create references to the memory that could
    /// overlap an engine or remote access, must access it only atomically
    /// while uroce may (any access racing with the engine's copies must be
    /// atomic), and must not use the pointer after the region is
    /// deregistered (a `Vec` backing is handed back then, and external
    /// memory may be freed).
    pub unsafe fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The host address of byte `offset` of the region: an address to
    /// compare, nothing is read (the verbs checker tells the engine's
    /// writes into the host's memory from the application's by it).
    pub fn host_addr(&self, offset: usize) -> usize {
        (self.ptr.as_ptr() as usize).wrapping_add(offset)
    }

    /// Offset of `[addr, addr+len)` in the region, if inside it.
    pub fn offset_of(&self, addr: u64, len: u64) -> Result<usize, MemError> {
        offset_in(self.iova, self.len as u64, addr, len).map(|o| o as usize)
    }

    /// The one place that touches the region's bytes: checks that
    /// `[offset, offset+len)` is inside the region, holds the registration
    /// gate shared, checks that the region is still registered, and calls
    /// `f` with the region's bytes. Deregistration waits for `f` to return,
    /// and no `f` runs after it.
    fn touch<R>(
        &self,
        offset: usize,
        len: usize,
        f: impl FnOnce(Shared) -> R,
    ) -> Result<R, MemError> {
        self.check(offset, len)?;
        let registered = self.gate.read();
        if !*registered {
            return Err(MemError::Invalid);
        }
        // SAFETY: the memory is valid while the gate is held shared and
        // says registered (the registrant's promise for external backing;
        // owned backing is only given back or freed after deregistration);
        // `touch` is private and every caller uses the value only inside
        // `f`, while the gate is held. Every access by uroce goes through
        // `Shared` or `with_atomic_u64`.
        Ok(f(unsafe { Shared::new(self.ptr.as_ptr(), self.len) }))
    }

    /// Copies `dst.len()` bytes starting at byte `offset` of the region.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        self.touch(offset, dst.len(), |m| m.load(offset, dst))
    }

    /// Copies `src` into the region at byte `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.touch(offset, src.len(), |m| m.store(offset, src))
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), MemError> {
        self.touch(offset, len, |m| m.fill(offset, len, byte))
    }

    /// Runs `f` on the 64-bit word at byte `offset` as an atomic, while the
    /// region stays registered. The word's address must be 8-byte aligned.
    pub fn with_atomic_u64<R>(
        &self,
        offset: usize,
        f: impl FnOnce(&AtomicU64) -> R,
    ) -> Result<R, MemError> {
        let word = self.atomic_u64_ptr(offset)?;
        self.touch(offset, 8, |_| {
            // SAFETY: an aligned word inside the region (checked), valid
            // while `touch` runs this closure, which bounds the reference;
            // AtomicU64 has the size of u64 and interior mutability, and
            // every other access to the word is a word-sized atomic
            // (`shared`'s portable loop accesses whole aligned words inside
            // a region as words) or, on x86-64, inline assembly, which the
            // memory model treats as an unknown operation made of atomic
            // accesses, and which the CPU keeps coherent with the locked
            // read-modify-writes of the atomic.
            f(unsafe { word.as_ref() })
        })
    }

    /// The 64-bit word at byte `offset` as a pointer to an atomic, with
    /// bounds and alignment checked (not registration: see
    /// [`MrInner::with_atomic_u64`]).
    pub fn atomic_u64_ptr(&self, offset: usize) -> Result<NonNull<AtomicU64>, MemError> {
        self.check(offset, 8)?;
        let p = self.ptr.as_ptr().wrapping_add(offset);
        if (p as usize) % 8 != 0 {
            return Err(MemError::Misaligned(self.iova.wrapping_add(offset as u64)));
        }
        Ok(NonNull::new(p as *mut AtomicU64).unwrap_or(NonNull::dangling()))
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

    /// Marks the region invalid (deregistered). Waits for accesses in
    /// progress to finish; none starts afterwards.
    pub(crate) fn invalidate(&self) {
        *self.gate.write() = false;
    }

    /// After deregistration: gives back the `Vec` the region took over
    /// (other backings give an empty `Vec`), even while the engine still
    /// holds the descriptor, since nothing touches the bytes of a
    /// deregistered region. A registered region comes back unchanged.
    pub fn take_vec(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
        if *self.gate.read() {
            return Err(self);
        }
        let mut backing = self.backing.lock();
        match backing.take() {
            Some(Backing::Vec(v)) => Ok(v),
            other => {
                *backing = other;
                Ok(Vec::new())
            }
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

/// Offset of `[addr, addr+len)` in `[base, base+size)`, if inside it
/// (without overflow).
pub(crate) fn offset_in(base: u64, size: u64, addr: u64, len: u64) -> Result<u64, MemError> {
    let off = addr.wrapping_sub(base);
    if addr < base || off > size || len > size - off {
        return Err(MemError::OutOfBounds { addr, len });
    }
    Ok(off)
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
    /// Memory windows by R_Key index (the R_Key's upper 24 bits).
    mws: DashMap<u32, Arc<MwInner>>,
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
    /// `iova` (at 0 when `access` has [`Access::ZERO_BASED`]), with fresh
    /// random keys.
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
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            iova
        };
        loop {
            let lkey: u32 = rand::random();
            let rkey: u32 = rand::random();
            if lkey == rkey || lkey == 0 || rkey == 0 {
                continue;
            }
            if self.by_lkey.contains_key(&lkey)
                || self.by_rkey.contains_key(&rkey)
                || self.mws.contains_key(&(rkey >> 8))
            {
                continue;
            }
            return self.insert(MrInner::registered(
                pd,
                ptr,
                len,
                iova,
                access,
                (lkey, rkey),
                backing,
            ));
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

    /// The region with this lkey, if registered.
    pub fn find_lkey(&self, lkey: u32) -> Option<Arc<MrInner>> {
        Self::lookup(&self.by_lkey, lkey).ok()
    }

    /// `ibv_rereg_mr`: the region `old` is replaced by one with the same
    /// keys and the given PD and access, over new memory when
    /// `translation` gives it (pointer, length, iova, backing) or over the
    /// same memory otherwise. When this returns no access to the old
    /// region is in progress and none starts; messages in progress that
    /// hold it fail where they next touch it, as after deregistration.
    ///
    /// # Safety
    /// With `translation`: as [`KeyTable::register`] for the new memory.
    pub unsafe fn reregister(
        &self,
        old: &MrInner,
        pd: PdId,
        access: Access,
        translation: Option<(NonNull<u8>, usize, u64, Backing)>,
    ) -> Arc<MrInner> {
        old.invalidate();
        let (ptr, len, iova, backing) = match translation {
            Some(t) => t,
            // The old region's memory moves to the new one: the old
            // region no longer owns (or frees) it. It keeps its iova,
            // unless it was zero-based: then its address.
            None => (
                old.ptr,
                old.len,
                if old.access.contains(Access::ZERO_BASED) {
                    old.ptr.as_ptr() as u64
                } else {
                    old.iova
                },
                old.backing.lock().take().unwrap_or(Backing::External),
            ),
        };
        let iova = if access.contains(Access::ZERO_BASED) {
            0
        } else {
            iova
        };
        let keys = (old.lkey, old.rkey);
        self.insert(MrInner::registered(
            pd, ptr, len, iova, access, keys, backing,
        ))
    }

    /// Makes `mr` findable by its keys (replacing a region with the same
    /// keys).
    fn insert(&self, mr: MrInner) -> Arc<MrInner> {
        let mr = Arc::new(mr);
        self.by_lkey.insert(mr.lkey, mr.clone());
        self.by_rkey.insert(mr.rkey, mr.clone());
        mr
    }

    /// Removes a region's keys and marks it invalid. When this returns, no
    /// access to its bytes is in progress and none will start (see the
    /// module docs): external memory may be freed.
    pub fn deregister(&self, mr: &MrInner) {
        // Only this region's entries: after a re-registration the keys
        // name its successor.
        let this = |_: &u32, v: &Arc<MrInner>| std::ptr::eq(Arc::as_ptr(v), mr);
        self.by_lkey.remove_if(&mr.lkey, this);
        self.by_rkey.remove_if(&mr.rkey, this);
        mr.invalidate();
    }

    /// Every registered region.
    pub fn regions(&self) -> Vec<Arc<MrInner>> {
        self.by_lkey.iter().map(|e| e.value().clone()).collect()
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

    /// Remote check of an R_Key (IBA ch. 10.6) arriving on QP `qpn` of
    /// PD `pd`: a region's (key, PD, access, bounds) or a memory window's
    /// (see [`window`]). Returns the region and the offset of `addr`.
    pub fn check_rkey(
        &self,
        rkey: u32,
        pd: PdId,
        qpn: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Arc<MrInner>, usize), KeyError> {
        match Self::lookup(&self.by_rkey, rkey) {
            Ok(mr) => Self::check(mr, pd, addr, len, need),
            Err(e) => match self.window(rkey) {
                Some(mw) => Self::check_window(&mw, rkey, pd, qpn, addr, len, need),
                None => Err(e),
            },
        }
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
        if planted!(mr.pd != pd, OtherPdKeyAccepted => false) {
            return Err(KeyError::PdMismatch);
        }
        let granted = mr.access.contains(need);
        if !planted!(granted, WriteWithoutRemoteWrite => granted || need == Access::REMOTE_WRITE) {
            return Err(KeyError::Access(need));
        }
        let checked = planted!(len, RkeyBoundsOffByOne => len.saturating_sub(1));
        let off = mr.offset_of(addr, checked)?;
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
            .check_rkey(a.rkey(), 1, 0, a.iova() + 8, 8, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(off, 8);
        assert_eq!(m.lkey(), a.lkey());
        assert_eq!(
            t.check_rkey(a.rkey(), 2, 0, a.iova(), 8, Access::REMOTE_WRITE)
                .unwrap_err(),
            KeyError::PdMismatch
        );
        assert_eq!(
            t.check_rkey(a.rkey(), 1, 0, a.iova(), 8, Access::REMOTE_READ)
                .unwrap_err(),
            KeyError::Access(Access::REMOTE_READ)
        );
        assert!(matches!(
            t.check_rkey(a.rkey(), 1, 0, a.iova() + 60, 8, Access::REMOTE_WRITE),
            Err(KeyError::Mem(MemError::OutOfBounds { .. }))
        ));
        assert!(matches!(
            t.check_rkey(
                a.rkey(),
                1,
                0,
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
            t.check_rkey(a.rkey(), 1, 0, a.iova(), 8, Access::REMOTE_WRITE),
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
        m.with_atomic_u64(8, |w| w.fetch_add(5, Ordering::SeqCst))
            .unwrap();
        assert_eq!(m.with_atomic_u64(8, |w| w.load(Ordering::SeqCst)), Ok(5));
        assert!(matches!(
            m.with_atomic_u64(4, |_| ()),
            Err(MemError::Misaligned(_))
        ));
        assert!(m.with_atomic_u64(60, |_| ()).is_err());
    }

    #[test]
    fn vec_comes_back() {
        let t = KeyTable::new();
        let m = t.register_vec(1, b"abc".to_vec(), Access::empty());
        t.deregister(&m);
        assert_eq!(m.take_vec().unwrap(), b"abc");
    }

    /// Copies and atomics from several threads on the same bytes: no data
    /// race (Miri checks this: `cargo +nightly miri test -p
    /// uroce-provider memory`), every byte ends with a value one writer
    /// stored, and aligned words are never torn.
    #[test]
    fn concurrent_copies_are_race_free() {
        let t = KeyTable::new();
        let m = t.register_zeroed(1, 64, Access::LOCAL_WRITE).unwrap();
        let n = if cfg!(miri) { 4 } else { 1000 };
        std::thread::scope(|s| {
            for b in [0x11u8, 0x22] {
                let m = &m;
                s.spawn(move || {
                    for _ in 0..n {
                        m.write(3, &[b; 40]).unwrap();
                        m.fill(8, 16, b).unwrap();
                    }
                });
            }
            let m = &m;
            s.spawn(move || {
                for _ in 0..n {
                    let mut out = [0u8; 64];
                    m.read(0, &mut out).unwrap();
                    for w in out[8..40].chunks(8) {
                        assert!(w.iter().all(|&x| x == w[0]), "torn word {w:?}");
                        assert!([0, 0x11, 0x22].contains(&w[0]));
                    }
                    m.with_atomic_u64(48, |w| w.fetch_add(1, Ordering::Relaxed))
                        .unwrap();
                }
            });
        });
        let mut out = [0u8; 43];
        m.read(0, &mut out).unwrap();
        assert!(out[3..].iter().all(|&b| b == 0x11 || b == 0x22));
    }

    /// A zero-based region sits at iova 0 whatever iova was asked for,
    /// for both keys; re-registered without the flag it is back at its
    /// address, and with it at 0 again.
    #[test]
    fn zero_based_regions_sit_at_iova_0() {
        let t = KeyTable::new();
        let mut owned = vec![0u8; 256];
        let ptr = NonNull::new(owned.as_mut_ptr()).unwrap();
        let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::ZERO_BASED;
        // SAFETY: `owned` outlives the regions (deregistered below).
        let m = unsafe { t.register(1, ptr, 256, 0x7000, acc, Backing::External) };
        assert_eq!(m.iova(), 0);
        let (_, off) = t
            .check_rkey(m.rkey(), 1, 0, 16, 8, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(off, 16);
        assert_eq!(
            t.check_lkey(m.lkey(), 1, 250, 6, Access::empty())
                .unwrap()
                .1,
            250
        );
        assert!(t.check_lkey(m.lkey(), 1, 251, 6, Access::empty()).is_err());
        // SAFETY: the same memory.
        let plain = unsafe { t.reregister(&m, 1, Access::LOCAL_WRITE, None) };
        assert_eq!(plain.iova(), ptr.as_ptr() as u64);
        // SAFETY: as above.
        let zb = unsafe { t.reregister(&plain, 1, acc, None) };
        assert_eq!(zb.iova(), 0);
        t.deregister(&zb);
        drop(owned);
    }

    /// A region registered over memory someone else owns: once
    /// `deregister` returns, nothing reads or writes those bytes, even
    /// through descriptors still held (as the engine holds them in
    /// messages in progress), and deregistration waited for accesses
    /// already under way.
    #[test]
    fn nothing_touches_memory_after_deregistration() {
        let t = Arc::new(KeyTable::new());
        let mut owned = vec![0u64; 32]; // 256 bytes, 8-aligned
        let ptr = NonNull::new(owned.as_mut_ptr() as *mut u8).unwrap();
        // SAFETY: `owned` outlives every access: it is only read again
        // after deregistration, and dropped at the end of the test.
        let m = unsafe { t.register(1, ptr, 256, 0x1000, Access::LOCAL_WRITE, Backing::External) };
        let held = m.clone();
        let n = if cfg!(miri) { 3 } else { 200 };
        std::thread::scope(|s| {
            let w = s.spawn(move || {
                let mut ok = 0u32;
                loop {
                    match held.write(0, &[0xab; 256]) {
                        Ok(()) => ok += 1,
                        Err(e) => {
                            assert_eq!(e, MemError::Invalid);
                            break ok;
                        }
                    }
                    std::thread::yield_now();
                }
            });
            for _ in 0..n {
                std::thread::yield_now();
            }
            t.deregister(&m);
            // From here on the bytes are ours alone: poison them, and
            // every access through the descriptor must fail.
            // SAFETY: deregistered: uroce no longer touches `owned`.
            unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0x5a, 256) };
            assert_eq!(m.read(0, &mut [0u8; 4]), Err(MemError::Invalid));
            assert_eq!(m.fill(0, 4, 1), Err(MemError::Invalid));
            assert_eq!(
                m.with_atomic_u64(0, |w| w.load(Ordering::Relaxed)),
                Err(MemError::Invalid)
            );
            w.join().unwrap();
        });
        assert!(owned.iter().all(|&w| w == u64::from_ne_bytes([0x5a; 8])));
        assert!(matches!(
            t.check_lkey(m.lkey(), 1, 0x1000, 1, Access::empty()),
            Err(KeyError::BadKey(_))
        ));
    }

    #[test]
    fn vec_comes_back_while_a_descriptor_is_held() {
        let t = KeyTable::new();
        let m = t.register_vec(1, b"xyz".to_vec(), Access::empty());
        let held = m.clone();
        assert!(m.clone().take_vec().is_err(), "registered: not given back");
        t.deregister(&m);
        assert_eq!(m.take_vec().unwrap(), b"xyz");
        assert_eq!(held.read(0, &mut [0u8; 1]), Err(MemError::Invalid));
    }
}
