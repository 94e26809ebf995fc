//! Memory windows (IBA 10.6.7, 11.2.10.9): remote access rights to a range
//! of a memory region, granted by binding a window and withdrawn by
//! invalidating, rebinding or deallocating it, without deregistering the
//! region.
//!
//! An R_Key is 24 bits of index and 8 bits of key (the "tag" the consumer
//! owns, stepped by `ibv_inc_rkey`). A window keeps its index for life; a
//! bind replaces the tag. Regions' R_Keys never share an index with a
//! window, so an R_Key names either one region (looked up whole) or one
//! window (looked up by index, then its whole R_Key compared).
//!
//! The two types differ in who binds and who may use them:
//! * **type 1**: bound by the Bind Memory Window verb (`ibv_bind_mw`) on
//!   any QP of its PD, rebound at will (a zero-length bind unbinds);
//!   usable by any QP of its PD; never invalidated by a key, only by
//!   deallocation or rebinding.
//! * **type 2**: bound by a BIND_MW work request, only while free; then
//!   usable only through the QP that bound it, until invalidated (a
//!   LOCAL_INV work request, or a peer's SEND with Invalidate on that QP)
//!   or deallocated.
//!
//! The checks and their statuses follow the spec's compliance statements
//! (C10-72..C10-75, o10-36.2.x, o10-37.2.x) as kernel rxe applies them.

use super::{Access, KeyError, KeyTable, MrInner, PdId};
use std::sync::Arc;

/// A memory window's type (`ibv_mw_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// Bound by the bind verb, for any QP of the PD.
    Type1 = 1,
    /// Bound by a work request, for the binding QP only.
    Type2 = 2,
}

/// What a window currently grants.
#[derive(Debug, Clone)]
struct Binding {
    mr: Arc<MrInner>,
    addr: u64,
    len: u64,
    access: Access,
    /// Zero-based (type 2 only): an R_Key's address is the offset from
    /// `addr`.
    zero_based: bool,
    /// Type 2: the QP that bound it.
    qpn: Option<u32>,
}

#[derive(Debug)]
struct MwState {
    rkey: u32,
    binding: Option<Binding>,
    /// Deallocated: nothing binds or uses it again.
    dead: bool,
}

/// A memory window as the engine sees it.
#[derive(Debug)]
pub struct MwInner {
    pd: PdId,
    kind: MwType,
    index: u32,
    state: parking_lot::Mutex<MwState>,
}

impl MwInner {
    /// Protection domain.
    pub fn pd(&self) -> PdId {
        self.pd
    }
    /// Type.
    pub fn kind(&self) -> MwType {
        self.kind
    }
    /// The current R_Key.
    pub fn rkey(&self) -> u32 {
        self.state.lock().rkey
    }
    /// True while bound to a region (a type 1 window bound with length 0
    /// is not).
    pub fn is_bound(&self) -> bool {
        self.state.lock().binding.is_some()
    }
}

/// A bind request (the BIND_MW work request, or the bind verb).
#[derive(Debug, Clone)]
pub struct MwBind {
    /// The window.
    pub mw: Arc<MwInner>,
    /// The window's R_Key as the binder last saw it (`ibv_mw::rkey`): a
    /// type 1 bind of a window whose key has moved on is refused.
    pub mw_rkey: u32,
    /// The new R_Key: only its low 8 bits (the key) are taken; the index
    /// is the window's.
    pub new_rkey: u32,
    /// The region's L_Key (ignored when `len` is 0).
    pub mr_lkey: u32,
    /// Start address, in the region's address space.
    pub addr: u64,
    /// Length; 0 unbinds a type 1 window.
    pub len: u64,
    /// Remote access the window grants (REMOTE_READ/WRITE/ATOMIC), and
    /// ZERO_BASED for a type 2 window addressed from its start (offset 0)
    /// rather than by the region's addresses.
    pub access: Access,
}

impl PartialEq for MwBind {
    fn eq(&self, o: &MwBind) -> bool {
        Arc::ptr_eq(&self.mw, &o.mw)
            && (
                self.mw_rkey,
                self.new_rkey,
                self.mr_lkey,
                self.addr,
                self.len,
                self.access,
            ) == (o.mw_rkey, o.new_rkey, o.mr_lkey, o.addr, o.len, o.access)
    }
}
impl Eq for MwBind {}

/// Why a bind or an invalidation was refused (the WR then completes with
/// MW_BIND_ERR or LOC_QP_OP_ERR, and the QP goes to ERR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MwError {
    /// The window's R_Key is not the one named.
    #[error("the memory window's R_Key has changed")]
    StaleKey,
    /// The window was deallocated.
    #[error("memory window deallocated")]
    Dead,
    /// A type 2 window bound already (o10-37.2.30), or the QP's PD is not
    /// the window's (C10-72).
    #[error("memory window is bound or in another PD")]
    State,
    /// No region with the L_Key, or in another PD, or without MW_BIND
    /// access (C10-73), or remote write/atomic without local write
    /// (C10-74), or the range outside the region (C10-75), or a type 2
    /// bind of length 0 (o10-37.2.40), or a zero-based type 1 bind (type 1
    /// windows are addressed by virtual address only).
    #[error("memory region refuses the binding")]
    Region,
    /// Invalidating a type 1 window (o10-37.2.26), or a window bound to
    /// another QP, or an R_Key that names no window.
    #[error("the R_Key names no window this QP may invalidate")]
    Invalidate,
}

impl KeyTable {
    /// `ibv_alloc_mw`: a window in `pd`, unbound, with a fresh index and
    /// a random key.
    pub fn alloc_mw(&self, pd: PdId, kind: MwType) -> Arc<MwInner> {
        loop {
            let rkey: u32 = rand::random();
            let index = rkey >> 8;
            if index == 0 || self.mws.contains_key(&index) {
                continue;
            }
            // No region's R_Key may share the index.
            if (0..=255u32).any(|tag| self.by_rkey.contains_key(&(index << 8 | tag))) {
                continue;
            }
            let mw = Arc::new(MwInner {
                pd,
                kind,
                index,
                state: parking_lot::Mutex::new(MwState {
                    rkey,
                    binding: None,
                    dead: false,
                }),
            });
            self.mws.insert(index, mw.clone());
            return mw;
        }
    }

    /// `ibv_dealloc_mw`: the window stops granting access at once and its
    /// R_Key names nothing afterwards.
    pub fn dealloc_mw(&self, mw: &MwInner) {
        self.mws.remove(&mw.index);
        let mut st = mw.state.lock();
        st.dead = true;
        Self::unbind(&mut st);
    }

    fn unbind(st: &mut MwState) {
        if let Some(b) = st.binding.take() {
            b.mr.bound_windows_add(-1);
        }
    }

    /// The window an R_Key names, if its index is a window's.
    pub(crate) fn window(&self, rkey: u32) -> Option<Arc<MwInner>> {
        self.mws.get(&(rkey >> 8)).map(|e| e.value().clone())
    }

    /// Executes a bind for QP `qpn` of PD `qp_pd` (the checks of rxe's
    /// `rxe_check_bind_mw`). Returns the window's new R_Key.
    pub fn bind_mw(&self, b: &MwBind, qp_pd: PdId, qpn: u32) -> Result<u32, MwError> {
        let mr = if b.len == 0 {
            None
        } else {
            Some(self.find_lkey(b.mr_lkey).ok_or(MwError::Region)?)
        };
        let mut st = b.mw.state.lock();
        if st.dead {
            return Err(MwError::Dead);
        }
        // Type 1: the bind verb steps the key it hands the application
        // (`ibv_mw::rkey`) at each call, so a bind made from a stale view
        // is refused, as rxe refuses it. A type 2 bind names its new key
        // itself.
        if b.mw.kind == MwType::Type1 && st.rkey != b.mw_rkey {
            return Err(MwError::StaleKey);
        }
        if b.mw.pd != qp_pd {
            return Err(MwError::State);
        }
        if b.mw.kind == MwType::Type2 {
            if st.binding.is_some() {
                return Err(MwError::State);
            }
            if mr.is_none() {
                return Err(MwError::Region);
            }
        } else if b.access.contains(Access::ZERO_BASED) {
            return Err(MwError::Region);
        }
        if let Some(mr) = &mr {
            let remote_writes = b
                .access
                .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC);
            if mr.pd() != qp_pd
                || !mr.access().contains(Access::MW_BIND)
                || (remote_writes && !mr.access().contains(Access::LOCAL_WRITE))
                || mr.offset_of(b.addr, b.len).is_err()
                || !mr.is_valid()
            {
                return Err(MwError::Region);
            }
        }
        Self::unbind(&mut st);
        st.rkey = (st.rkey & !0xff) | (b.new_rkey & 0xff);
        st.binding = mr.map(|mr| {
            mr.bound_windows_add(1);
            Binding {
                mr,
                addr: b.addr,
                len: b.len,
                access: b.access
                    & (Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC),
                zero_based: b.access.contains(Access::ZERO_BASED),
                qpn: (b.mw.kind == MwType::Type2).then_some(qpn),
            }
        });
        Ok(st.rkey)
    }

    /// Invalidates the type 2 window `rkey` names, for QP `qpn` of PD
    /// `qp_pd`: by a LOCAL_INV work request (`remote` false) or a peer's
    /// SEND with Invalidate (`remote` true: the window must be bound to
    /// this QP, IBA 10.6.7.2.5).
    pub fn invalidate_rkey(
        &self,
        rkey: u32,
        qp_pd: PdId,
        qpn: u32,
        remote: bool,
    ) -> Result<(), MwError> {
        let mw = self.window(rkey).ok_or(MwError::Invalidate)?;
        let mut st = mw.state.lock();
        if st.dead || st.rkey != rkey || mw.kind != MwType::Type2 || mw.pd != qp_pd {
            return Err(MwError::Invalidate);
        }
        if remote && st.binding.as_ref().and_then(|b| b.qpn) != Some(qpn) {
            return Err(MwError::Invalidate);
        }
        Self::unbind(&mut st);
        Ok(())
    }

    /// The remote check of a window's R_Key: bound, the key current, the
    /// QP allowed (type 1: its PD; type 2: the binding QP), the access
    /// granted, the range inside the window (a zero-based window's `addr`
    /// is the offset from its start); then the region's own checks.
    pub(super) fn check_window(
        mw: &MwInner,
        rkey: u32,
        pd: PdId,
        qpn: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(Arc<MrInner>, usize), KeyError> {
        let st = mw.state.lock();
        let b = match &st.binding {
            Some(b) if st.rkey == rkey && !st.dead => b,
            _ => return Err(KeyError::BadKey(rkey)),
        };
        let other_pd = planted!(mw.pd != pd, OtherPdKeyAccepted => false);
        match b.qpn {
            Some(q) if q != qpn => return Err(KeyError::PdMismatch),
            None if other_pd => return Err(KeyError::PdMismatch),
            _ => {}
        }
        if !b.access.contains(need) {
            return Err(KeyError::Access(need));
        }
        let checked = planted!(len, RkeyBoundsOffByOne => len.saturating_sub(1));
        let addr = if b.zero_based {
            // In the window, which lies inside the region: no overflow.
            super::offset_in(0, b.len, addr, checked)? + b.addr
        } else {
            super::offset_in(b.addr, b.len, addr, checked)?;
            addr
        };
        let mr = b.mr.clone();
        drop(st);
        if !mr.is_valid() {
            return Err(KeyError::Mem(super::MemError::Invalid));
        }
        let off = mr.offset_of(addr, len)?;
        Ok((mr, off))
    }
}
