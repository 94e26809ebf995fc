//! Protection domains, memory regions and memory windows: `ibv_alloc_pd`,
//! `ibv_reg_mr` and its variants, `ibv_rereg_mr`, `ibv_import_pd/mr`, and
//! `ops.alloc_mw`/`dealloc_mw`.

use crate::ffi::*;
use crate::objects::{accessor, claim, ctx, destroy_boxed, errno, live, register, retire};
use crate::{errno_result, guard, ptr_result};
use libc::{c_int, c_void, size_t};
use std::mem::ManuallyDrop;
use std::ptr::{addr_of, addr_of_mut};
use uroce_verbs::{Access, MemoryRegion, MemoryWindow, MwType, ProtectionDomain};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr, ibv_dereg_mr, ibv_rereg_mr]
    "IBVERBS_1.7": [ibv_reg_mr_iova]
    "IBVERBS_1.8": [ibv_reg_mr_iova2]
    "IBVERBS_1.10": [ibv_import_pd, ibv_import_mr, ibv_unimport_pd, ibv_unimport_mr]
}

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

crate::exported! {
    fn ibv_alloc_pd / ibv_alloc_pd_impl(context: *mut ibv_context) -> *mut ibv_pd {
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
            register(p.cast::<ibv_pd>(), context, handle);
            Ok(p.cast())
        })
    }
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
        let p = Box::into_raw(obj).cast::<ibv_pd>();
        register(p, context, handle);
        Ok(p)
    })
}

/// `ibv_unimport_pd`: frees what `ibv_import_pd` made; the PD stays.
#[no_mangle]
unsafe extern "C" fn ibv_unimport_pd(p: *mut ibv_pd) {
    guard((), || {
        let Ok(c) = claim(p) else { return };
        // SAFETY: live (claimed just now), made by this library.
        if !unsafe { pd(p) }.is_ok_and(|i| i.imported) {
            return; // not imported: ibv_dealloc_pd's (the claim drops)
        }
        c.commit();
        let obj = p.cast::<Pd>();
        // SAFETY: made by Box::into_raw in ibv_import_pd, unregistered;
        // its shared handle is dropped, nothing destroyed.
        unsafe {
            ManuallyDrop::drop(&mut *addr_of_mut!((*obj).inner.rust));
            retire(obj);
        }
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    errno_result(|| {
        let claimed = claim(p)?;
        // SAFETY: a live PD (claimed from the registry).
        let (c, handle, imported) = (unsafe { (*p).context }, unsafe { (*p).handle }, unsafe {
            pd(p)?.imported
        });
        // SAFETY: as above; the closure only computes a field address.
        let r = unsafe {
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
        };
        if r.is_ok() {
            claimed.commit();
        }
        r
    })
}

/// `ibv_access_flags` as uroce's, ignoring the optional ones
/// (`IBV_ACCESS_OPTIONAL_RANGE`, e.g. relaxed ordering) as libibverbs
/// does; anything else uroce does not do (on-demand paging, huge pages,
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
    let context = live(p)?;
    // SAFETY: a live PD (registered).
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
    // SAFETY: ibv_reg_mr's contract: the memory stays valid until
    // ibv_dereg_mr, and the program reaches it only as C does (raw, not
    // through Rust references). Its keys address it from `iova` (from 0
    // when zero-based: `ibv_mr::addr` stays the address).
    let mr = unsafe { pdi.rust.reg_mr_iova_raw(addr.cast(), length, iova, acc) }
        .map_err(|e| errno(&e))?;
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
    let m = Box::into_raw(Box::new(Mr {
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
    }));
    register(m.cast::<ibv_mr>(), context, handle);
    m
}

/// `ibv_import_mr`: the region of the PD's device with this handle, for
/// a PD of a context of that device (in this process). Its `addr` is
/// NULL, as the kernel reports an imported region's.
#[no_mangle]
unsafe extern "C" fn ibv_import_mr(p: *mut ibv_pd, handle: u32) -> *mut ibv_mr {
    ptr_result(|| {
        let context = live(p)?;
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
        let Ok(c) = claim(mr) else { return };
        // SAFETY: live (claimed just now), made by this library.
        if !unsafe { (*mr.cast::<Mr>()).inner.imported } {
            return; // not imported: ibv_dereg_mr's (the claim drops)
        }
        c.commit();
        // SAFETY: made by Box::into_raw in ibv_import_mr, unregistered; a
        // shared handle's drop deregisters nothing.
        unsafe { retire(mr.cast::<Mr>()) };
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
/// memory region (`ib_umem_get`): EINVAL for an empty or wrapping range,
/// EFAULT for a page unmapped, unreadable or (for a writable region)
/// unwritable. See [`uroce_provider::device::check_user_range`].
fn check_user_range(addr: usize, len: usize, writable: bool, page: usize) -> Result<(), i32> {
    uroce_provider::device::check_user_range(addr, len, writable, page).map_err(|e| e.errno())
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
            let context = live(mr)?;
            // SAFETY: a live region (registered); the caller does not use
            // it concurrently (libibverbs' contract for rereg).
            let m = unsafe { &mut *mr.cast::<Mr>() };
            let pd_obj = if flags & CHANGE_PD != 0 {
                crate::objects::live_in(new_pd, context)?;
                // SAFETY: a live PD (registered).
                let p = unsafe { pd(new_pd)? };
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
        let claimed = claim(mr)?;
        let m = mr.cast::<Mr>();
        // SAFETY: a live region (claimed), made by reg_mr or ibv_import_mr.
        if unsafe { (*m).inner._rust.bound_windows() } > 0 {
            return Err(libc::EBUSY);
        }
        claimed.commit();
        // SAFETY: as above; the value is moved out once, here, and its
        // memory kept (not dropped again) by quarantine below.
        let Mr { c, inner } = unsafe { std::ptr::read(m) };
        if !inner.imported {
            // SAFETY: the region's context is live.
            if let Ok(ctx) = unsafe { ctx(c.context) } {
                ctx.handles.mrs.lock().remove(&c.handle);
            }
        }
        // The region is deregistered (through an imported one too: it is
        // the same registration).
        inner._rust.dereg();
        // SAFETY: made by Box::into_raw, unregistered, its value moved out.
        unsafe { crate::objects::quarantine(m) };
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
        let context = live(p)?;
        // SAFETY: a live PD (registered).
        let pdi = unsafe { pd(p)? };
        let kind = match kind {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return Err(libc::EINVAL),
        };
        let rust = pdi.rust.alloc_mw(kind).map_err(|e| errno(&e))?;
        let handle = crate::objects::next_handle();
        let obj = Box::new(Mw {
            c: ibv_mw {
                context,
                pd: p,
                rkey: rust.rkey(),
                handle,
                type_: kind as c_int,
            },
            inner: MwObj { rust },
        });
        let m = Box::into_raw(obj).cast::<ibv_mw>();
        register(m, context, handle);
        Ok(m)
    })
}

/// `ops.dealloc_mw`: the window's R_Key stops working at once.
pub(crate) unsafe extern "C" fn dealloc_mw(p: *mut ibv_mw) -> c_int {
    errno_result(|| {
        claim(p)?.commit();
        // SAFETY: made by Box::into_raw in alloc_mw, unregistered just now;
        // dropping deallocates the window.
        unsafe { retire(p.cast::<Mw>()) };
        Ok(())
    })
}
