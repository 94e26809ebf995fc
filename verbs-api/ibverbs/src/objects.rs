//! The C objects: each a `#[repr(C)]` struct whose first field is the
//! rdma-core structure the program sees, followed by the uroce object.
//!
//! Only the uroce half is ever borrowed (through `addr_of!`), never the
//! whole struct, since the program may read or write its C half at any
//! time. Destroy calls that uroce may refuse (busy) keep the uroce object
//! in a `ManuallyDrop` so it can be taken out, offered to `destroy`, and
//! put back on refusal.

use crate::ffi::*;
use crate::{errno_result, guard, ptr_result};
use libc::{c_int, c_void, size_t};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::mem::{offset_of, ManuallyDrop};
use std::ptr::{addr_of, addr_of_mut};
use std::sync::Arc;
use uroce_verbs::provider::qp_attr::{AddressVector, AttrMask, QpAttr, QpCap};
use uroce_verbs::{
    Access, AddressHandle, CompChannel, CompletionQueue, Context, Error, MemoryRegion,
    MemoryWindow, Mtu, MwType, ProtectionDomain, QpInitAttr, QpState, QpType, QueuePair, SendWr,
    SharedReceiveQueue, SrqAttr, SrqAttrMask, Wc, WcOpcode, WcStatus, WrOpcode,
};

crate::symbol_versions! {
    "IBVERBS_1.0": [ibv_create_comp_channel, ibv_destroy_comp_channel]
    "IBVERBS_1.1": [ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr, ibv_dereg_mr, ibv_rereg_mr,
                    ibv_create_cq, ibv_resize_cq, ibv_destroy_cq,
                    ibv_create_srq, ibv_modify_srq, ibv_query_srq, ibv_destroy_srq,
                    ibv_create_qp, ibv_query_qp, ibv_modify_qp, ibv_destroy_qp,
                    ibv_create_ah, ibv_destroy_ah, ibv_create_ah_from_wc,
                    ibv_init_ah_from_wc, ibv_attach_mcast, ibv_detach_mcast]
    "IBVERBS_1.6": [ibv_qp_to_qp_ex]
    "IBVERBS_1.7": [ibv_reg_mr_iova]
    "IBVERBS_1.8": [ibv_reg_mr_iova2]
    "IBVERBS_1.10": [ibv_import_pd, ibv_import_mr, ibv_unimport_pd, ibv_unimport_mr]
    "IBVERBS_1.14": [ibv_query_qp_data_in_order]
}

/// errno of a uroce error.
pub(crate) fn errno(e: &Error) -> i32 {
    e.errno()
}

// ---------------------------------------------------------------- context

/// An open device: `verbs_context` (ending in `ibv_context`) first.
#[repr(C)]
pub(crate) struct Ctx {
    pub v: verbs_context,
    pub inner: CtxInner,
}

pub(crate) struct CtxInner {
    pub rust: Context,
    pub handles: Arc<Handles>,
    /// The identity of the context's command fd (a memfd) when this
    /// context made it; an imported context's belongs to the original.
    pub cmd_fd_key: Option<(u64, u64)>,
}

/// QP number -> `*mut Qp`, CQ handle -> `*mut Cq`, SRQ handle -> `*mut
/// Srq`: what asynchronous events name. Shared by the contexts of one
/// device (they share its engine and event queue) and held by every
/// object, so destroying one after `ibv_close_device` is still sound.
#[derive(Default)]
pub(crate) struct Handles {
    pub qps: Mutex<HashMap<u32, usize>>,
    pub cqs: Mutex<HashMap<u32, usize>>,
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// PDs and MRs by `handle`, for `ibv_import_pd` / `ibv_import_mr`.
    pub pds: Mutex<HashMap<u32, usize>>,
    pub mrs: Mutex<HashMap<u32, usize>>,
    pub next_mr_handle: std::sync::atomic::AtomicU32,
}

/// The `Ctx` an `ibv_context` belongs to.
pub(crate) fn ctx_ptr(c: *mut ibv_context) -> *mut Ctx {
    c.cast::<u8>()
        .wrapping_sub(offset_of!(verbs_context, context))
        .cast()
}

/// The uroce half of a context.
///
/// # Safety
/// `c` is a live context from `ibv_open_device`.
pub(crate) unsafe fn ctx<'a>(c: *mut ibv_context) -> Result<&'a CtxInner, i32> {
    if c.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise; only the Rust half is borrowed.
    Ok(unsafe { &*addr_of!((*ctx_ptr(c)).inner) })
}

/// Declares the uroce-half accessor of an object type.
macro_rules! accessor {
    ($name:ident, $cty:ty, $obj:ty, $inner:ty) => {
        /// The uroce half of the object.
        ///
        /// # Safety
        /// The pointer is a live object of this type made by this library.
        pub(crate) unsafe fn $name<'a>(p: *mut $cty) -> Result<&'a $inner, i32> {
            if p.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: the caller's promise; the C struct is the first field
            // of the #[repr(C)] object, and only the Rust half is borrowed.
            Ok(unsafe { &*addr_of!((*p.cast::<$obj>()).inner) })
        }
    };
}

/// Destroys a C object whose uroce half sits in a `ManuallyDrop` slot:
/// takes the uroce object out and hands it to `destroy`; on success frees
/// the C object (after `forget`, which unregisters it), on refusal (busy)
/// puts the uroce object back and returns the errno.
///
/// # Safety
/// `obj` is a live object made by `Box::into_raw` in this library, not used
/// concurrently while it is destroyed (the caller's contract in
/// libibverbs), and `slot` returns the address of its `ManuallyDrop`
/// field (without reading anything).
unsafe fn destroy_boxed<O, R>(
    obj: *mut O,
    slot: impl Fn(*mut O) -> *mut ManuallyDrop<R>,
    destroy: fn(R) -> Result<(), (R, Error)>,
    forget: impl FnOnce(),
) -> Result<(), i32> {
    // SAFETY: the caller's promise; the slot holds a value (it is emptied
    // only here, and refilled on refusal below).
    let rust = unsafe { ManuallyDrop::take(&mut *slot(obj)) };
    match destroy(rust) {
        Ok(()) => {
            forget();
            // SAFETY: made by Box::into_raw; the ManuallyDrop field was
            // taken above and is not dropped again.
            drop(unsafe { Box::from_raw(obj) });
            Ok(())
        }
        Err((rust, e)) => {
            // SAFETY: as above; the slot is empty.
            unsafe { *slot(obj) = ManuallyDrop::new(rust) };
            Err(errno(&e))
        }
    }
}

// ---------------------------------------------------------------- PD, MR

#[repr(C)]
pub(crate) struct Pd {
    pub c: ibv_pd,
    pub inner: PdInner,
}
pub(crate) struct PdInner {
    pub rust: ManuallyDrop<ProtectionDomain>,
    /// Made by `ibv_import_pd` (not in the handle table).
    pub imported: bool,
}
accessor!(pd, ibv_pd, Pd, PdInner);

#[repr(C)]
pub(crate) struct Mr {
    pub c: ibv_mr,
    pub inner: MrInner,
}
pub(crate) struct MrInner {
    pub _rust: MemoryRegion,
    /// Made by `ibv_import_mr` (not in the handle table).
    pub imported: bool,
}

#[no_mangle]
unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: forwarded.
    unsafe { ibv_alloc_pd_impl(context) }
}

/// `ibv_alloc_pd`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_alloc_pd_impl(context: *mut ibv_context) -> *mut ibv_pd {
    ptr_result(|| {
        // SAFETY: a context from ibv_open_device (the caller's contract).
        let ctx = unsafe { crate::objects::ctx(context)? };
        let rust = ctx.rust.alloc_pd().map_err(|e| errno(&e))?;
        let handle = rust.handle();
        let obj = Box::new(Pd {
            c: ibv_pd { context, handle },
            inner: PdInner {
                rust: ManuallyDrop::new(rust),
                imported: false,
            },
        });
        let p = Box::into_raw(obj);
        ctx.handles.pds.lock().insert(handle, p as usize);
        Ok(p.cast())
    })
}

/// `ibv_import_pd`: the PD of the same device with this handle, for a
/// context of that device (uroce's contexts and objects live in the
/// process: importing works between the contexts of one process, as
/// `ibv_import_device` does).
#[no_mangle]
unsafe extern "C" fn ibv_import_pd(context: *mut ibv_context, handle: u32) -> *mut ibv_pd {
    ptr_result(|| {
        // SAFETY: a context from ibv_open_device/ibv_import_device.
        let ctx = unsafe { crate::objects::ctx(context)? };
        let orig = *ctx.handles.pds.lock().get(&handle).ok_or(libc::EINVAL)?;
        // SAFETY: registered while the PD lives (removed when deallocated).
        let rust = unsafe { pd(orig as *mut ibv_pd)? }.rust.share();
        let obj = Box::new(Pd {
            c: ibv_pd { context, handle },
            inner: PdInner {
                rust: ManuallyDrop::new(rust),
                imported: true,
            },
        });
        Ok(Box::into_raw(obj).cast())
    })
}

/// `ibv_unimport_pd`: frees what `ibv_import_pd` made; the PD stays.
#[no_mangle]
unsafe extern "C" fn ibv_unimport_pd(p: *mut ibv_pd) {
    guard((), || {
        if p.is_null() {
            return;
        }
        // SAFETY: made by Box::into_raw in ibv_import_pd (the caller's
        // contract); its shared handle is dropped, nothing destroyed.
        let mut b = unsafe { Box::from_raw(p.cast::<Pd>()) };
        // SAFETY: taken once, here.
        unsafe { ManuallyDrop::drop(&mut b.inner.rust) };
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    errno_result(|| {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: a live PD from ibv_alloc_pd/ibv_import_pd (the caller's
        // contract).
        let (c, handle, imported) = (unsafe { (*p).context }, unsafe { (*p).handle }, unsafe {
            pd(p)?.imported
        });
        // SAFETY: as above; the closure only computes a field address.
        unsafe {
            destroy_boxed(
                p.cast::<Pd>(),
                |o| addr_of_mut!((*o).inner.rust),
                ProtectionDomain::destroy,
                || {
                    if !imported {
                        // SAFETY: the PD's context is live.
                        if let Ok(ctx) = crate::objects::ctx(c) {
                            ctx.handles.pds.lock().remove(&handle);
                        }
                    }
                },
            )
        }
    })
}

/// `ibv_access_flags` as uroce's, ignoring the optional ones
/// (`IBV_ACCESS_OPTIONAL_RANGE`, e.g. relaxed ordering) as libibverbs
/// does; anything else uroce does not do (zero-based, on-demand paging,
/// ...) is EINVAL.
pub(crate) fn access(bits: u32) -> Result<Access, i32> {
    const OPTIONAL: u32 = 0x3ff0_0000;
    Access::from_bits(bits & !OPTIONAL).ok_or(libc::EINVAL)
}

fn reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    bits: u32,
) -> Result<*mut ibv_mr, i32> {
    // SAFETY: a PD from ibv_alloc_pd (the caller's contract).
    let pdi = unsafe { pd(p)? };
    let page = page_size();
    // The kernel's ib_uverbs_reg_mr: an iova must sit at the same offset in
    // its page as the address (EINVAL), checked before the access flags.
    if (iova ^ addr as u64) & (page as u64 - 1) != 0 {
        return Err(libc::EINVAL);
    }
    let acc = access(bits)?;
    // The kernel's ib_access_writable: the pages are pinned for writing.
    let writable = acc.intersects(
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::MW_BIND,
    );
    check_user_range(addr as usize, length, writable, page)?;
    if iova != addr as u64 {
        // uroce's regions are addressed by their virtual address.
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: ibv_reg_mr's contract: the memory stays valid until
    // ibv_dereg_mr, and the program reaches it only as C does (raw, not
    // through Rust references).
    let mr = unsafe { pdi.rust.reg_mr_raw(addr.cast(), length, acc) }.map_err(|e| errno(&e))?;
    // SAFETY: p is a live PD.
    let context = unsafe { (*p).context };
    // SAFETY: the PD's context is live.
    let handles = unsafe { ctx(context)? }.handles.clone();
    let handle = handles
        .next_mr_handle
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let m = new_mr(context, p, addr, length, handle, mr, false);
    handles.mrs.lock().insert(handle, m as usize);
    Ok(m.cast())
}

/// Boxes the C half of a region.
fn new_mr(
    context: *mut ibv_context,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    handle: u32,
    mr: MemoryRegion,
    imported: bool,
) -> *mut Mr {
    Box::into_raw(Box::new(Mr {
        c: ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        },
        inner: MrInner {
            _rust: mr,
            imported,
        },
    }))
}

/// `ibv_import_mr`: the region of the PD's device with this handle, for
/// a PD of a context of that device (in this process). Its `addr` is
/// NULL, as the kernel reports an imported region's.
#[no_mangle]
unsafe extern "C" fn ibv_import_mr(p: *mut ibv_pd, handle: u32) -> *mut ibv_mr {
    ptr_result(|| {
        // SAFETY: a PD from ibv_alloc_pd/ibv_import_pd.
        unsafe { pd(p)? };
        // SAFETY: p is a live PD; its context is live.
        let context = unsafe { (*p).context };
        // SAFETY: as above.
        let handles = unsafe { ctx(context)? }.handles.clone();
        let orig = *handles.mrs.lock().get(&handle).ok_or(libc::EINVAL)?;
        // SAFETY: registered while the MR lives (removed at ibv_dereg_mr).
        let o = unsafe { &*(orig as *const Mr) };
        let shared = o.inner._rust.share();
        Ok(new_mr(
            context,
            p,
            std::ptr::null_mut(),
            o.c.length,
            handle,
            shared,
            true,
        )
        .cast())
    })
}

/// `ibv_unimport_mr`: frees what `ibv_import_mr` made; the region stays
/// registered.
#[no_mangle]
unsafe extern "C" fn ibv_unimport_mr(mr: *mut ibv_mr) {
    guard((), || {
        if !mr.is_null() {
            // SAFETY: made by Box::into_raw in ibv_import_mr (the caller's
            // contract); a shared handle's drop deregisters nothing.
            drop(unsafe { Box::from_raw(mr.cast::<Mr>()) });
        }
    })
}

/// The system's page size (4096 where sysconf does not say).
fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n)
        .ok()
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

/// The checks the kernel makes before and while it pins a user range for a
/// memory region (`ib_umem_get`): a range that wraps around the address
/// space, or whose end wraps when rounded up to a page, is EINVAL; so is a
/// zero length (it spans no page: `npages == 0` is EINVAL there); a range
/// with a page the process has not mapped, or cannot read, or (when the
/// region is writable) cannot write, is EFAULT (`pin_user_pages_fast`
/// fails with it). uroce pins nothing, so without these a bad range would
/// only fault in the engine thread at the first remote WRITE.
///
/// The memory is never touched to find this out (a touch could fault, or
/// allocate a page). The mappings come from /proc/self/maps, one pass over
/// lines sorted by address, rather than from `mincore`: mincore tells
/// mapped from unmapped (ENOMEM) but not the permissions, so a PROT_NONE
/// or read-only page the kernel would refuse to pin would pass it. Where
/// /proc is not mounted the range is taken on trust. A program that
/// unmaps the memory while it is registered breaks `ibv_reg_mr`'s
/// contract, as with any provider.
fn check_user_range(addr: usize, len: usize, writable: bool, page: usize) -> Result<(), i32> {
    let end = addr.checked_add(len).ok_or(libc::EINVAL)?;
    if end.checked_next_multiple_of(page).is_none() {
        return Err(libc::EINVAL);
    }
    if len == 0 {
        return Err(libc::EINVAL);
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Ok(());
    };
    let mut cur = addr;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= cur {
            continue;
        }
        if lo > cur {
            return Err(libc::EFAULT); // a hole before `cur`
        }
        let p = perms.as_bytes();
        if p.first() != Some(&b'r') || (writable && p.get(1) != Some(&b'w')) {
            return Err(libc::EFAULT);
        }
        cur = hi;
        if cur >= end {
            return Ok(());
        }
    }
    Err(libc::EFAULT)
}

#[no_mangle]
unsafe extern "C" fn ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    access: c_int,
) -> *mut ibv_mr {
    ptr_result(|| reg_mr(p, addr, length, addr as u64, access as u32))
}

#[no_mangle]
unsafe extern "C" fn ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ptr_result(|| reg_mr(p, addr, length, iova, access as u32))
}

#[no_mangle]
unsafe extern "C" fn ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    iova: u64,
    access: libc::c_uint,
) -> *mut ibv_mr {
    ptr_result(|| reg_mr(p, addr, length, iova, access))
}

/// `ibv_rereg_mr`: `IBV_REREG_MR_CHANGE_TRANSLATION`, `_PD` and `_ACCESS`
/// in any combination; the region keeps its keys. Returns 0, or
/// `IBV_REREG_MR_ERR_INPUT` (-1) for arguments libibverbs refuses itself,
/// or `IBV_REREG_MR_ERR_CMD` (-4) for what the kernel would refuse (bad
/// access flags or range, a PD of another context, windows bound), with
/// errno set. On failure the region is unchanged.
#[no_mangle]
unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    new_pd: *mut ibv_pd,
    addr: *mut c_void,
    length: size_t,
    bits: c_int,
) -> c_int {
    const TRANSLATION: c_int = 1;
    const CHANGE_PD: c_int = 2;
    const CHANGE_ACCESS: c_int = 4;
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    guard(ERR_CMD, || {
        let input = |e| {
            crate::set_errno(e);
            ERR_INPUT
        };
        if mr.is_null() || flags & !(TRANSLATION | CHANGE_PD | CHANGE_ACCESS) != 0 {
            return input(libc::EINVAL);
        }
        if flags & TRANSLATION != 0 && (addr.is_null() || length == 0) {
            return input(libc::EINVAL);
        }
        if bits != 0 && flags & CHANGE_ACCESS == 0 {
            return input(libc::EINVAL);
        }
        let r = (|| -> Result<(), i32> {
            if flags == 0 {
                return Err(libc::EINVAL); // the kernel's ib_uverbs_rereg_mr
            }
            // SAFETY: made by reg_mr; the caller does not use the region
            // concurrently (libibverbs' contract for rereg).
            let m = unsafe { &mut *mr.cast::<Mr>() };
            let pd_obj = if flags & CHANGE_PD != 0 {
                // SAFETY: a PD from ibv_alloc_pd (the caller's contract).
                let p = unsafe { pd(new_pd)? };
                // SAFETY: both are live objects of this library.
                if unsafe { (*new_pd).context } != m.c.context {
                    return Err(libc::EINVAL);
                }
                Some(&*p.rust)
            } else {
                None
            };
            let acc = if flags & CHANGE_ACCESS != 0 {
                Some(access(bits as u32)?)
            } else {
                None
            };
            if flags & TRANSLATION != 0 {
                let page = page_size();
                let a = acc.unwrap_or(m.inner._rust.access());
                let writable = a.intersects(
                    Access::LOCAL_WRITE
                        | Access::REMOTE_WRITE
                        | Access::REMOTE_ATOMIC
                        | Access::MW_BIND,
                );
                check_user_range(addr as usize, length, writable, page)?;
                // SAFETY: ibv_rereg_mr's contract, as ibv_reg_mr's for the
                // new range.
                unsafe { m.inner._rust.rereg_raw(pd_obj, acc, addr.cast(), length) }
                    .map_err(|e| errno(&e))?;
                m.c.addr = addr;
                m.c.length = length;
            } else {
                m.inner._rust.rereg(pd_obj, acc).map_err(|e| errno(&e))?;
            }
            if flags & CHANGE_PD != 0 {
                m.c.pd = new_pd;
            }
            Ok(())
        })();
        match r {
            Ok(()) => 0,
            Err(e) => {
                crate::set_errno(e);
                ERR_CMD
            }
        }
    })
}

/// `ibv_dereg_mr`: EBUSY while memory windows are bound to the region (the
/// kernel refuses it too: rxe answers EINVAL).
#[no_mangle]
unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    errno_result(|| {
        if mr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: made by Box::into_raw in reg_mr or ibv_import_mr.
        if unsafe { (*mr.cast::<Mr>()).inner._rust.bound_windows() } > 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: as above; the region is deregistered (through an
        // imported one too: it is the same registration).
        let m = unsafe { Box::from_raw(mr.cast::<Mr>()) };
        let Mr { c, inner } = *m;
        if !inner.imported {
            // SAFETY: the region's context is live.
            if let Ok(ctx) = unsafe { ctx(c.context) } {
                ctx.handles.mrs.lock().remove(&c.handle);
            }
        }
        inner._rust.dereg();
        Ok(())
    })
}

// ---------------------------------------------------------------- MW

#[repr(C)]
pub(crate) struct Mw {
    pub c: ibv_mw,
    pub inner: MwObj,
}
pub(crate) struct MwObj {
    pub rust: MemoryWindow,
}
accessor!(mw, ibv_mw, Mw, MwObj);

/// `ops.alloc_mw`: types 1 and 2 (EINVAL for others).
pub(crate) unsafe extern "C" fn alloc_mw(p: *mut ibv_pd, kind: c_int) -> *mut ibv_mw {
    ptr_result(|| {
        // SAFETY: a PD from ibv_alloc_pd (the caller's contract).
        let pdi = unsafe { pd(p)? };
        let kind = match kind {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return Err(libc::EINVAL),
        };
        let rust = pdi.rust.alloc_mw(kind).map_err(|e| errno(&e))?;
        let obj = Box::new(Mw {
            c: ibv_mw {
                // SAFETY: p is a live PD.
                context: unsafe { (*p).context },
                pd: p,
                rkey: rust.rkey(),
                handle: 0,
                type_: kind as c_int,
            },
            inner: MwObj { rust },
        });
        Ok(Box::into_raw(obj).cast())
    })
}

/// `ops.dealloc_mw`: the window's R_Key stops working at once.
pub(crate) unsafe extern "C" fn dealloc_mw(p: *mut ibv_mw) -> c_int {
    errno_result(|| {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: made by Box::into_raw in alloc_mw; dropping deallocates.
        drop(unsafe { Box::from_raw(p.cast::<Mw>()) });
        Ok(())
    })
}

// ---------------------------------------------------------------- channel

#[repr(C)]
pub(crate) struct Chan {
    pub c: ibv_comp_channel,
    pub inner: ChanInner,
}
pub(crate) struct ChanInner {
    pub rust: ManuallyDrop<CompChannel>,
}
accessor!(chan, ibv_comp_channel, Chan, ChanInner);

#[no_mangle]
unsafe extern "C" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: forwarded.
    unsafe { ibv_create_comp_channel_impl(context) }
}

/// `ibv_create_comp_channel`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_create_comp_channel_impl(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    ptr_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { crate::objects::ctx(context)? };
        let rust = ctx.rust.create_comp_channel().map_err(|e| errno(&e))?;
        crate::post::make_blocking(rust.fd());
        let obj = Box::new(Chan {
            c: ibv_comp_channel {
                context,
                fd: rust.fd(),
                refcnt: 0,
            },
            inner: ChanInner {
                rust: ManuallyDrop::new(rust),
            },
        });
        Ok(Box::into_raw(obj).cast())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_destroy_comp_channel(p: *mut ibv_comp_channel) -> c_int {
    // SAFETY: forwarded.
    unsafe { ibv_destroy_comp_channel_impl(p) }
}

/// `ibv_destroy_comp_channel`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_destroy_comp_channel_impl(p: *mut ibv_comp_channel) -> c_int {
    errno_result(|| {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as in ibv_dealloc_pd, for a channel.
        unsafe {
            destroy_boxed(
                p.cast::<Chan>(),
                |o| addr_of_mut!((*o).inner.rust),
                CompChannel::destroy,
                || {},
            )
        }
    })
}

// ---------------------------------------------------------------- CQ

/// Every CQ is an `ibv_cq_ex` (which begins with `ibv_cq`), so
/// `ibv_poll_cq` and `ibv_start_poll` both work on it.
#[repr(C)]
pub(crate) struct Cq {
    pub c: ibv_cq_ex,
    pub inner: CqInner,
}
pub(crate) struct CqInner {
    pub rust: ManuallyDrop<CompletionQueue>,
    pub handles: Arc<Handles>,
    /// The completion `ibv_start_poll`/`ibv_next_poll` made current.
    pub cur: Mutex<Wc>,
}
accessor!(cq, ibv_cq, Cq, CqInner);

fn create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: i64,
) -> Result<*mut Cq, i32> {
    // SAFETY: a context from ibv_open_device.
    let ctx = unsafe { crate::objects::ctx(context)? };
    let cqe = u32::try_from(cqe).map_err(|_| libc::EINVAL)?;
    // The kernel refuses a completion vector the device does not have.
    // SAFETY: a live context (checked just above).
    let vectors = i64::from(unsafe { (*context).num_comp_vectors });
    if !(0..vectors).contains(&comp_vector) {
        return Err(libc::EINVAL);
    }
    let ch = if channel.is_null() {
        None
    } else {
        // SAFETY: a channel from ibv_create_comp_channel.
        Some(unsafe { chan(channel)? })
    };
    let mut b = Box::<Cq>::new_uninit();
    // The CQ's cq_context in uroce is this object's address: completion
    // events name it (ibv_get_cq_event returns it).
    let me = b.as_mut_ptr();
    let rust = ctx
        .rust
        .create_cq_with(cqe, me as u64, ch.map(|c| &*c.rust))
        .map_err(|e| errno(&e))?;
    let handle = rust.handle();
    let depth = rust.cqe();
    b.write(Cq {
        c: ibv_cq_ex {
            context,
            channel,
            cq_context,
            handle,
            cqe: c_int::try_from(depth).unwrap_or(c_int::MAX),
            // SAFETY: all-zero is PTHREAD_MUTEX_INITIALIZER /
            // PTHREAD_COND_INITIALIZER on glibc.
            mutex: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cond: unsafe { std::mem::zeroed() },
            comp_events_completed: 0,
            async_events_completed: 0,
            comp_mask: 0,
            status: 0,
            wr_id: 0,
            start_poll: Some(crate::post::start_poll),
            next_poll: Some(crate::post::next_poll),
            end_poll: Some(crate::post::end_poll),
            read_opcode: Some(crate::post::read_opcode),
            read_vendor_err: Some(crate::post::read_vendor_err),
            read_byte_len: Some(crate::post::read_byte_len),
            read_imm_data: Some(crate::post::read_imm_data),
            read_qp_num: Some(crate::post::read_qp_num),
            read_src_qp: Some(crate::post::read_src_qp),
            read_wc_flags: Some(crate::post::read_wc_flags),
            read_slid: Some(crate::post::read_slid),
            read_sl: Some(crate::post::read_sl),
            read_dlid_path_bits: Some(crate::post::read_dlid_path_bits),
            read_completion_ts: Some(crate::post::read_completion_ts),
            read_cvlan: Some(crate::post::read_cvlan),
            read_flow_tag: Some(crate::post::read_flow_tag),
            read_tm_info: Some(crate::post::read_tm_info),
            read_completion_wallclock_ns: Some(crate::post::read_completion_ts),
        },
        inner: CqInner {
            rust: ManuallyDrop::new(rust),
            handles: ctx.handles.clone(),
            cur: Mutex::new(Wc::new(0, WcStatus::Success, WcOpcode::Send, 0)),
        },
    });
    // SAFETY: fully initialised by the write above.
    let p = Box::into_raw(unsafe { b.assume_init() });
    ctx.handles.cqs.lock().insert(handle, p as usize);
    Ok(p)
}

#[no_mangle]
unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded.
    unsafe { ibv_create_cq_impl(context, cqe, cq_context, channel, comp_vector) }
}

/// `ibv_create_cq`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_create_cq_impl(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    ptr_result(|| {
        create_cq(context, cqe, cq_context, channel, i64::from(comp_vector)).map(|p| p.cast())
    })
}

/// `verbs_context::create_cq_ex`: the standard completion fields are
/// always available; timestamps read as 0.
pub(crate) unsafe extern "C" fn create_cq_ex(
    context: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    ptr_result(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attribute struct.
        let a = unsafe { &*attr };
        // IBV_CQ_INIT_ATTR_MASK_FLAGS only; flags: single-threaded,
        // ignore-overrun (both harmless to accept).
        if a.comp_mask & !1 != 0 || a.flags & !3 != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let cqe = c_int::try_from(a.cqe).map_err(|_| libc::EINVAL)?;
        create_cq(
            context,
            cqe,
            a.cq_context,
            a.channel,
            i64::from(a.comp_vector),
        )
        .map(|p| p.cast())
    })
}

/// `ibv_resize_cq`: EINVAL for a count outside 1..=max_cqe or below the
/// completions waiting (the kernel's rxe_cq_chk_attr); `cq->cqe` then
/// holds the new depth.
#[no_mangle]
unsafe extern "C" fn ibv_resize_cq(p: *mut ibv_cq, cqe: c_int) -> c_int {
    errno_result(|| {
        // SAFETY: a live CQ (the caller's contract).
        let inner = unsafe { cq(p)? };
        let n = u32::try_from(cqe).map_err(|_| libc::EINVAL)?;
        inner.rust.resize(n).map_err(|e| errno(&e))?;
        // SAFETY: p is a live CQ; cqe is the application-visible depth.
        unsafe { (*p).cqe = c_int::try_from(inner.rust.cqe()).unwrap_or(c_int::MAX) };
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_destroy_cq(p: *mut ibv_cq) -> c_int {
    // SAFETY: forwarded.
    unsafe { ibv_destroy_cq_impl(p) }
}

/// `ibv_destroy_cq`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_destroy_cq_impl(p: *mut ibv_cq) -> c_int {
    errno_result(|| {
        // SAFETY: a live CQ (the caller's contract).
        let inner = unsafe { cq(p)? };
        let (handle, handles) = (inner.rust.handle(), inner.handles.clone());
        // SAFETY: as in ibv_dealloc_pd, for a CQ.
        unsafe {
            destroy_boxed(
                p.cast::<Cq>(),
                |o| addr_of_mut!((*o).inner.rust),
                CompletionQueue::destroy,
                || {
                    handles.cqs.lock().remove(&handle);
                },
            )
        }
    })
}

// ---------------------------------------------------------------- SRQ

#[repr(C)]
pub(crate) struct Srq {
    pub c: ibv_srq,
    pub inner: SrqInner,
}
pub(crate) struct SrqInner {
    pub rust: ManuallyDrop<SharedReceiveQueue>,
    pub handles: Arc<Handles>,
}
accessor!(srq, ibv_srq, Srq, SrqInner);

#[no_mangle]
unsafe extern "C" fn ibv_create_srq(p: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    // SAFETY: forwarded.
    unsafe { ibv_create_srq_impl(p, attr) }
}

/// `ibv_create_srq`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_create_srq_impl(
    p: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    ptr_result(|| {
        // SAFETY: a PD from ibv_alloc_pd.
        let pdi = unsafe { pd(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        let rust = pdi
            .rust
            .create_srq(&SrqAttr {
                max_wr: a.attr.max_wr,
                max_sge: a.attr.max_sge,
                srq_limit: a.attr.srq_limit,
            })
            .map_err(|e| errno(&e))?;
        let q = rust.query();
        a.attr.max_wr = q.max_wr;
        a.attr.max_sge = q.max_sge;
        // SAFETY: p is a live PD.
        let context = unsafe { (*p).context };
        // SAFETY: the PD's context.
        let ctx = unsafe { crate::objects::ctx(context)? };
        let handle = rust.handle();
        let obj = Box::new(Srq {
            c: ibv_srq {
                context,
                srq_context: a.srq_context,
                pd: p,
                handle,
                // SAFETY: all-zero is the glibc initializer.
                mutex: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                cond: unsafe { std::mem::zeroed() },
                events_completed: 0,
            },
            inner: SrqInner {
                rust: ManuallyDrop::new(rust),
                handles: ctx.handles.clone(),
            },
        });
        let ptr = Box::into_raw(obj);
        ctx.handles.srqs.lock().insert(handle, ptr as usize);
        Ok(ptr.cast())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_modify_srq(
    p: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    errno_result(|| {
        // SAFETY: an SRQ from ibv_create_srq.
        let s = unsafe { srq(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let m = SrqAttrMask::from_bits(mask as u32).ok_or(libc::EINVAL)?;
        s.rust
            .modify(
                &SrqAttr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                },
                m,
            )
            .map_err(|e| errno(&e))
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_query_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    errno_result(|| {
        // SAFETY: an SRQ from ibv_create_srq.
        let s = unsafe { srq(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let q = s.rust.query();
        // SAFETY: the caller's output struct.
        unsafe {
            *attr = ibv_srq_attr {
                max_wr: q.max_wr,
                max_sge: q.max_sge,
                srq_limit: q.srq_limit,
            }
        };
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_destroy_srq(p: *mut ibv_srq) -> c_int {
    // SAFETY: forwarded.
    unsafe { ibv_destroy_srq_impl(p) }
}

/// `ibv_destroy_srq`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_destroy_srq_impl(p: *mut ibv_srq) -> c_int {
    errno_result(|| {
        // SAFETY: a live SRQ (the caller's contract).
        let inner = unsafe { srq(p)? };
        let (handle, handles) = (inner.rust.handle(), inner.handles.clone());
        // SAFETY: as in ibv_dealloc_pd, for an SRQ.
        unsafe {
            destroy_boxed(
                p.cast::<Srq>(),
                |o| addr_of_mut!((*o).inner.rust),
                SharedReceiveQueue::destroy,
                || {
                    handles.srqs.lock().remove(&handle);
                },
            )
        }
    })
}

// ---------------------------------------------------------------- AH

#[repr(C)]
pub(crate) struct Ah {
    pub c: ibv_ah,
    pub inner: AhInner,
}
pub(crate) struct AhInner {
    pub rust: AddressHandle,
}
accessor!(ah, ibv_ah, Ah, AhInner);

/// An `ibv_ah_attr` as uroce's address vector. RoCE needs the GRH
/// (`is_global`): the destination is its GID.
pub(crate) fn av_of(a: &ibv_ah_attr) -> Result<AddressVector, i32> {
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(AddressVector {
        dgid: a.grh.dgid.raw,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
    })
}

pub(crate) fn ah_attr_of(av: &AddressVector) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: av.dgid },
            flow_label: av.flow_label,
            sgid_index: av.sgid_index,
            hop_limit: av.hop_limit,
            traffic_class: av.traffic_class,
        },
        dlid: 0,
        sl: av.sl,
        src_path_bits: 0,
        static_rate: 0,
        is_global: 1,
        port_num: av.port_num,
    }
}

fn new_ah(p: *mut ibv_pd, rust: AddressHandle) -> *mut ibv_ah {
    // SAFETY: p is a live PD (checked by the caller's accessor call).
    let context = unsafe { (*p).context };
    let obj = Box::new(Ah {
        c: ibv_ah {
            context,
            pd: p,
            handle: 0,
        },
        inner: AhInner { rust },
    });
    Box::into_raw(obj).cast()
}

#[no_mangle]
unsafe extern "C" fn ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ptr_result(|| {
        // SAFETY: a PD from ibv_alloc_pd.
        let pdi = unsafe { pd(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let av = av_of(unsafe { &*attr })?;
        let rust = pdi.rust.create_ah(&av).map_err(|e| errno(&e))?;
        Ok(new_ah(p, rust))
    })
}

/// The 40-byte GRH area at `grh`, and the uroce completion of `wc`.
fn wc_and_grh(wc: *const ibv_wc, grh: *const ibv_grh) -> Result<(Wc, [u8; 40]), i32> {
    if wc.is_null() || grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's completion and the 40 bytes it received.
    let (w, g) = unsafe { (*wc, std::ptr::read_unaligned(grh.cast::<[u8; 40]>())) };
    Ok((crate::post::wc_from_c(&w), g))
}

#[no_mangle]
unsafe extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    _port_num: u8,
) -> *mut ibv_ah {
    ptr_result(|| {
        // SAFETY: a PD from ibv_alloc_pd.
        let pdi = unsafe { pd(p)? };
        let (w, g) = wc_and_grh(wc, grh)?;
        let rust = pdi.rust.create_ah_from_wc(&w, &g).map_err(|e| errno(&e))?;
        Ok(new_ah(p, rust))
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    crate::minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { crate::objects::ctx(context)? };
        let (w, g) = wc_and_grh(wc, grh)?;
        if ah_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let av = ctx
            .rust
            .init_ah_from_wc(port_num, &w, &g)
            .map_err(|e| errno(&e))?;
        // SAFETY: the caller's output struct.
        unsafe { *ah_attr = ah_attr_of(&av) };
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_destroy_ah(p: *mut ibv_ah) -> c_int {
    errno_result(|| {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: made by Box::into_raw in new_ah.
        drop(unsafe { Box::from_raw(p.cast::<Ah>()) });
        Ok(())
    })
}

// ---------------------------------------------------------------- QP

#[repr(C)]
pub(crate) struct Qp {
    pub c: ibv_qp_ex,
    /// `ibv_qp_ex::wr_flush` of rdma-core 45, which appended it to the
    /// struct: here it sits where a program built against that verbs.h
    /// reads it (the installed v44 header ends before it).
    pub wr_flush: Option<unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, usize, u8, u8)>,
    pub inner: QpInner,
}
pub(crate) struct QpInner {
    /// Shared with the rdma_cm id the QP is attached to, if any.
    pub rust: Arc<QueuePair>,
    pub handles: Arc<Handles>,
    pub sq_sig_all: bool,
    /// The WRs built by `ibv_wr_*` since `ibv_wr_start`, and the first
    /// error met while building them (reported by `ibv_wr_complete`).
    pub batch: Mutex<(Vec<SendWr>, i32)>,
}
accessor!(qp, ibv_qp, Qp, QpInner);

fn qp_type_of(t: c_int) -> Result<QpType, i32> {
    Ok(match t {
        2 => QpType::Rc,
        3 => QpType::Uc,
        4 => QpType::Ud,
        _ => return Err(libc::EOPNOTSUPP),
    })
}

fn create_qp(p: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, i32> {
    // SAFETY: a PD from ibv_alloc_pd.
    let pdi = unsafe { pd(p)? };
    // SAFETY: the attribute's CQs and SRQ come from this library.
    let (scq, rcq) = unsafe { (cq(a.send_cq)?, cq(a.recv_cq)?) };
    let s = if a.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { srq(a.srq)? })
    };
    let qp_type = qp_type_of(a.qp_type)?;
    let init = QpInitAttr {
        send_cq: &scq.rust,
        recv_cq: &rcq.rust,
        cap: QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        qp_type,
        sq_sig_all: a.sq_sig_all != 0,
        srq: s.map(|s| &*s.rust),
    };
    let rust = Arc::new(pdi.rust.create_qp(&init).map_err(|e| errno(&e))?);
    let c = rust.cap();
    a.cap = ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    };
    // SAFETY: p is a live PD.
    let context = unsafe { (*p).context };
    // SAFETY: the PD's context.
    let ctx = unsafe { crate::objects::ctx(context)? };
    let qpn = rust.qp_num();
    use crate::post as w;
    let obj = Box::new(Qp {
        c: ibv_qp_ex {
            qp_base: ibv_qp {
                context,
                qp_context: a.qp_context,
                pd: p,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                handle: qpn,
                qp_num: qpn,
                state: QpState::Reset as c_int,
                qp_type: a.qp_type,
                // SAFETY: all-zero is the glibc initializer.
                mutex: unsafe { std::mem::zeroed() },
                // SAFETY: as above.
                cond: unsafe { std::mem::zeroed() },
                events_completed: 0,
            },
            comp_mask: 0,
            wr_id: 0,
            wr_flags: 0,
            wr_atomic_cmp_swp: Some(w::wr_atomic_cmp_swp),
            wr_atomic_fetch_add: Some(w::wr_atomic_fetch_add),
            wr_bind_mw: Some(w::wr_bind_mw),
            wr_local_inv: Some(w::wr_local_inv),
            wr_rdma_read: Some(w::wr_rdma_read),
            wr_rdma_write: Some(w::wr_rdma_write),
            wr_rdma_write_imm: Some(w::wr_rdma_write_imm),
            wr_send: Some(w::wr_send),
            wr_send_imm: Some(w::wr_send_imm),
            wr_send_inv: Some(w::wr_send_inv),
            wr_send_tso: Some(w::wr_send_tso),
            wr_set_ud_addr: Some(w::wr_set_ud_addr),
            wr_set_xrc_srqn: Some(w::wr_set_xrc_srqn),
            wr_set_inline_data: Some(w::wr_set_inline_data),
            wr_set_inline_data_list: Some(w::wr_set_inline_data_list),
            wr_set_sge: Some(w::wr_set_sge),
            wr_set_sge_list: Some(w::wr_set_sge_list),
            wr_start: Some(w::wr_start),
            wr_complete: Some(w::wr_complete),
            wr_abort: Some(w::wr_abort),
            wr_atomic_write: Some(w::wr_atomic_write),
        },
        wr_flush: Some(w::wr_flush),
        inner: QpInner {
            rust,
            handles: ctx.handles.clone(),
            sq_sig_all: a.sq_sig_all != 0,
            batch: Mutex::new((Vec::new(), 0)),
        },
    });
    let ptr = Box::into_raw(obj);
    ctx.handles.qps.lock().insert(qpn, ptr as usize);
    Ok(ptr.cast())
}

#[no_mangle]
unsafe extern "C" fn ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ptr_result(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes (capabilities are written back).
        create_qp(p, unsafe { &mut *attr })
    })
}

/// `verbs_context::create_qp_ex`: a PD is required; `send_ops_flags`
/// (for the `ibv_wr_*` API) may name the operations uroce has for the QP
/// type ([`send_ops_supported`]), anything else is EOPNOTSUPP; creation
/// flags are not supported.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _context: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ptr_result(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        const PD: u32 = 1;
        const CREATE_FLAGS: u32 = 1 << 2;
        const SEND_OPS_FLAGS: u32 = 1 << 6;
        if a.comp_mask & PD == 0 {
            return Err(libc::EINVAL);
        }
        if a.comp_mask & !(PD | CREATE_FLAGS | SEND_OPS_FLAGS) != 0
            || (a.comp_mask & CREATE_FLAGS != 0 && a.create_flags != 0)
        {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !send_ops_supported(qp_type_of(a.qp_type)?) != 0
        {
            // A provider must not accept what it cannot do: TSO, or an
            // operation the transport lacks.
            return Err(libc::EOPNOTSUPP);
        }
        let mut base = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        let qp = create_qp(a.pd, &mut base)?;
        a.cap = base.cap;
        if a.comp_mask & SEND_OPS_FLAGS != 0 {
            // IBV_QP_EX_WITH_* as comp_mask VERBS_QP_EX: the ibv_wr_* API.
            // SAFETY: just made.
            unsafe { (*qp.cast::<Qp>()).c.comp_mask = 1 };
        }
        Ok(qp)
    })
}

/// The `IBV_QP_EX_WITH_*` operations uroce has for a QP type: those the
/// provider's table lets the type post ([`QpType::may_post`]).
fn send_ops_supported(qp_type: QpType) -> u64 {
    WrOpcode::ALL
        .into_iter()
        .filter(|&op| qp_type.may_post(op))
        .fold(0, |m, op| m | send_op_flag(op))
}

/// The `IBV_QP_EX_WITH_*` bit of a send opcode.
fn send_op_flag(op: WrOpcode) -> u64 {
    match op {
        WrOpcode::RdmaWrite => 1,
        WrOpcode::RdmaWriteWithImm => 1 << 1,
        WrOpcode::Send => 1 << 2,
        WrOpcode::SendWithImm => 1 << 3,
        WrOpcode::RdmaRead => 1 << 4,
        WrOpcode::AtomicCmpAndSwp => 1 << 5,
        WrOpcode::AtomicFetchAndAdd => 1 << 6,
        WrOpcode::LocalInv => 1 << 7,
        WrOpcode::BindMw => 1 << 8,
        WrOpcode::SendWithInv => 1 << 9,
        WrOpcode::Flush => 1 << 11,
        WrOpcode::AtomicWrite => 1 << 12,
    }
}

/// The `ibv_qp_ex` of a QP: every uroce QP has one.
#[no_mangle]
unsafe extern "C" fn ibv_qp_to_qp_ex(p: *mut ibv_qp) -> *mut ibv_qp_ex {
    p.cast()
}

fn state_of(v: c_int) -> Result<QpState, i32> {
    u32::try_from(v)
        .ok()
        .and_then(QpState::from_u32)
        .ok_or(libc::EINVAL)
}

fn qp_attr_of(a: &ibv_qp_attr, mask: AttrMask) -> Result<QpAttr, i32> {
    let mut q = QpAttr::default();
    if mask.contains(AttrMask::STATE) {
        q.qp_state = state_of(a.qp_state)?;
    }
    if mask.contains(AttrMask::CUR_STATE) {
        q.cur_qp_state = state_of(a.cur_qp_state)?;
    }
    if mask.contains(AttrMask::PATH_MTU) {
        q.path_mtu = Mtu::from_u32(a.path_mtu as u32).ok_or(libc::EINVAL)?;
    }
    if mask.contains(AttrMask::AV) {
        q.ah_attr = av_of(&a.ah_attr)?;
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) {
        q.qp_access_flags = access(a.qp_access_flags)?;
    }
    q.qkey = a.qkey;
    q.rq_psn = a.rq_psn;
    q.sq_psn = a.sq_psn;
    q.dest_qp_num = a.dest_qp_num;
    q.cap = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    q.pkey_index = a.pkey_index;
    q.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    q.max_rd_atomic = a.max_rd_atomic;
    q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    q.min_rnr_timer = a.min_rnr_timer;
    q.port_num = a.port_num;
    q.timeout = a.timeout;
    q.retry_cnt = a.retry_cnt;
    q.rnr_retry = a.rnr_retry;
    Ok(q)
}

#[no_mangle]
unsafe extern "C" fn ibv_modify_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    errno_result(|| {
        // SAFETY: a QP from ibv_create_qp.
        let q = unsafe { qp(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // Bits past IBV_QP_DEST_QPN (or a negative mask) are EOPNOTSUPP,
        // as libibverbs' ibv_cmd_modify_qp answers; AttrMask names them all
        // up to DEST_QPN.
        let m = AttrMask::from_bits(mask as u32).ok_or(libc::EOPNOTSUPP)?;
        // SAFETY: the caller's attributes.
        let a = qp_attr_of(unsafe { &*attr }, m)?;
        q.rust.modify(&a, m).map_err(|e| errno(&e))?;
        if m.contains(AttrMask::STATE) {
            // SAFETY: the C half of a live QP; libibverbs updates qp->state
            // the same way after a successful modify.
            unsafe { (*p).state = a.qp_state as c_int };
        }
        Ok(())
    })
}

/// uroce's QP attributes as `ibv_qp_attr` (no alternate path; rate
/// limit 0).
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    let cap = ibv_qp_cap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    ibv_qp_attr {
        qp_state: a.qp_state as c_int,
        cur_qp_state: a.cur_qp_state as c_int,
        path_mtu: a.path_mtu as c_int,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap,
        ah_attr: ah_attr_of(&a.ah_attr),
        // SAFETY: all-zero is a valid ibv_ah_attr.
        alt_ah_attr: unsafe { std::mem::zeroed() },
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: a.en_sqd_async_notify as u8,
        sq_draining: a.sq_draining as u8,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    }
}

#[no_mangle]
unsafe extern "C" fn ibv_query_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    errno_result(|| {
        // SAFETY: a QP from ibv_create_qp.
        let q = unsafe { qp(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let a = q.rust.query().map_err(|e| errno(&e))?;
        let out = qp_attr_to_c(&a);
        let cap = out.cap;
        // SAFETY: the caller's output structs; the C half of a live QP.
        unsafe {
            *attr = out;
            if !init.is_null() {
                *init = ibv_qp_init_attr {
                    qp_context: (*p).qp_context,
                    send_cq: (*p).send_cq,
                    recv_cq: (*p).recv_cq,
                    srq: (*p).srq,
                    cap,
                    qp_type: (*p).qp_type,
                    sq_sig_all: q.sq_sig_all as c_int,
                };
            }
        }
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_destroy_qp(p: *mut ibv_qp) -> c_int {
    // SAFETY: forwarded.
    unsafe { ibv_destroy_qp_impl(p) }
}

/// `ibv_destroy_qp`, for callers in this library (see [`crate::symbol_versions`]).
pub(crate) unsafe extern "C" fn ibv_destroy_qp_impl(p: *mut ibv_qp) -> c_int {
    errno_result(|| {
        if p.is_null() {
            return Err(libc::EINVAL);
        }
        let obj = p.cast::<Qp>();
        // SAFETY: a live QP made by this library.
        let inner = unsafe { &*addr_of!((*obj).inner) };
        inner.handles.qps.lock().remove(&inner.rust.qp_num());
        if Arc::strong_count(&inner.rust) > 1 {
            // An rdma_cm id's QP destroyed with ibv_destroy_qp (not
            // rdma_destroy_qp): the id lets go of it too.
            crate::rdmacm::forget_qp(p);
        }
        // SAFETY: made by Box::into_raw in create_qp; dropping the uroce QP
        // removes it from the engine.
        drop(unsafe { Box::from_raw(obj) });
        Ok(())
    })
}

/// UD multicast is not supported (each device binds one unicast address).
#[no_mangle]
unsafe extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

#[no_mangle]
unsafe extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    crate::set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// Data lands in order for every opcode: `IBV_QUERY_QP_DATA_IN_ORDER_WHOLE_MSG`.
#[no_mangle]
unsafe extern "C" fn ibv_query_qp_data_in_order(
    _qp: *mut ibv_qp,
    _op: c_int,
    _flags: u32,
) -> c_int {
    1
}
