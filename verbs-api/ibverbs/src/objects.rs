//! The C objects' shared machinery: each object is a `#[repr(C)]` struct
//! whose first field is the rdma-core structure the program sees,
//! followed by the uroce object; the context ([`Ctx`]) and the handle
//! table events use; the accessor every kind declares; the destroy that
//! gives a refused object back. The kinds live in their own modules:
//! [`crate::pd_mr`] (PD, MR, MW), [`crate::cq`] (completion channel,
//! CQ), [`crate::srq`], [`crate::ah`], [`crate::qp`].
//!
//! Every object this library makes is registered by address in [`LIVE`]
//! with its kind, context and handle, as the kernel keeps each context's
//! objects in a table by handle: a call that takes an object looks it up
//! there ([`live`]) before it reads anything else of it, so a destroyed
//! object, one whose `handle` or `context` was overwritten, or one of
//! another kind is refused (EINVAL; ENOENT to a destroy, as the kernel's
//! `rdma_lookup_get_uobject` answers) instead of being used. A destroyed
//! object's memory is not given back at once but kept in a bounded
//! quarantine ([`retire`]), so that a destroy repeated soon after does
//! not find a new object at the same address.
//!
//! Only the uroce half is ever borrowed (through `addr_of!`), never the
//! whole struct, since the program may read or write its C half at any
//! time. Destroy calls that uroce may refuse (busy) keep the uroce object
//! in a `ManuallyDrop` so it can be taken out, offered to `destroy`, and
//! put back on refusal.

use crate::ffi::*;
use parking_lot::Mutex;
use std::alloc::Layout;
use std::collections::{HashMap, VecDeque};
use std::mem::{offset_of, ManuallyDrop};
use std::ptr::addr_of;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock};
use uroce_provider::device::Resource;
use uroce_verbs::{Context, Error};

/// errno of a uroce error.
pub(crate) fn errno(e: &Error) -> i32 {
    e.errno()
}

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
    /// The process that opened it (see [`crate::device::forked`]).
    pub pid: u32,
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
pub(crate) use accessor;

// ---------------------------------------------------------------- the registry

/// What a live object was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Live {
    kind: Resource,
    context: usize,
    handle: u32,
}

/// Every live object of this library by address: the per-context handle
/// tables of the kernel in one map (the entry names the context).
static LIVE: LazyLock<Mutex<HashMap<usize, Live>>> = LazyLock::new(Default::default);

/// A C object the registry can check: its kind, and where its C half
/// keeps the context and handle the program may overwrite.
pub(crate) trait CObject {
    const KIND: Resource;
    /// The context and handle fields.
    ///
    /// # Safety
    /// `p` is a live object of this kind (registered).
    unsafe fn ident(p: *const Self) -> (*mut ibv_context, u32);
}

macro_rules! c_object {
    ($($t:ty => $kind:ident),* $(,)?) => {$(
        impl CObject for $t {
            const KIND: Resource = Resource::$kind;
            unsafe fn ident(p: *const Self) -> (*mut ibv_context, u32) {
                // SAFETY: the caller's promise; two plain fields are read.
                unsafe { ((*p).context, (*p).handle) }
            }
        }
    )*};
}
c_object!(ibv_pd => Pd, ibv_mr => Mr, ibv_mw => Mw, ibv_cq => Cq, ibv_srq => Srq, ibv_ah => Ah,
          ibv_qp => Qp);

/// Registers a new object (its C half filled in).
pub(crate) fn register<T: CObject>(p: *mut T, context: *mut ibv_context, handle: u32) {
    let e = Live {
        kind: T::KIND,
        context: context as usize,
        handle,
    };
    LIVE.lock().insert(p as usize, e);
}

/// Checks `p` against the registry under its lock: a live object of its
/// kind whose `context` and `handle` still read what it was made with.
/// Returns its context. The object's memory is read only once the
/// registry holds it (a destroy unregisters it before freeing it).
fn lookup<T: CObject>(
    live: &HashMap<usize, Live>,
    p: *mut T,
) -> Result<(Live, *mut ibv_context), i32> {
    let e = *live.get(&(p as usize)).ok_or(libc::ENOENT)?;
    if e.kind != T::KIND {
        return Err(libc::EINVAL);
    }
    // SAFETY: registered, hence live: destroys unregister (under this
    // lock, held by the caller) before they free.
    let (c, h) = unsafe { T::ident(p) };
    if c as usize != e.context || h != e.handle {
        return Err(libc::ENOENT);
    }
    Ok((e, c))
}

/// The context of a live object `p` (see [`lookup`]); EINVAL for NULL, a
/// destroyed or garbled object, or one of another kind.
pub(crate) fn live<T: CObject>(p: *mut T) -> Result<*mut ibv_context, i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    lookup(&LIVE.lock(), p)
        .map(|(_, c)| c)
        .map_err(|_| libc::EINVAL)
}

/// [`live`], and the object must belong to `context` (EINVAL otherwise):
/// the objects a call combines come from one context.
pub(crate) fn live_in<T: CObject>(p: *mut T, context: *mut ibv_context) -> Result<(), i32> {
    if live(p)? != context {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Takes a live object out of the registry for its destroy: ENOENT when
/// it is not live (already destroyed, never made here, its handle or
/// context overwritten), EINVAL for NULL or another kind. Until the
/// returned claim is [`Claim::commit`]ted the object is registered again
/// when the claim drops (a refused destroy leaves it live).
pub(crate) fn claim<T: CObject>(p: *mut T) -> Result<Claim, i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    let mut live = LIVE.lock();
    let (e, _) = lookup(&live, p)?;
    live.remove(&(p as usize));
    Ok(Claim {
        addr: p as usize,
        entry: Some(e),
    })
}

/// An object taken out of the registry for its destroy (see [`claim`]).
pub(crate) struct Claim {
    addr: usize,
    entry: Option<Live>,
}

impl Claim {
    /// The destroy went through: the object stays unregistered.
    pub(crate) fn commit(mut self) {
        self.entry = None;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(e) = self.entry.take() {
            LIVE.lock().insert(self.addr, e);
        }
    }
}

/// A handle for objects uroce itself does not number (AHs, MWs): unique
/// in the process, never 0.
pub(crate) fn next_handle() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    loop {
        let h = NEXT.fetch_add(1, Ordering::Relaxed);
        if h != 0 {
            return h;
        }
    }
}

/// How many destroyed objects' memory is held back before it is freed.
const QUARANTINE: usize = 1024;

/// Destroyed objects' memory, oldest first.
static RETIRED: LazyLock<Mutex<VecDeque<(usize, Layout)>>> = LazyLock::new(Default::default);

/// Drops an unregistered object made by `Box::into_raw` and keeps its
/// memory for a while before freeing it: a program that destroys the
/// object again (or uses it) soon after meets memory no new object
/// occupies, which the registry refuses.
///
/// # Safety
/// `obj` was made by `Box::into_raw`, is no longer registered, and is
/// not used again by this library.
pub(crate) unsafe fn retire<O>(obj: *mut O) {
    // SAFETY: the caller's promise; the value is dropped once, here, and
    // its memory (allocated with Layout::new::<O>() by Box) freed later.
    unsafe {
        std::ptr::drop_in_place(obj);
        quarantine(obj);
    }
}

/// Keeps the memory of an object whose value was dropped or moved out
/// (see [`retire`]) for a while, then frees it.
///
/// # Safety
/// As [`retire`], and the value at `obj` is no longer owned there.
pub(crate) unsafe fn quarantine<O>(obj: *mut O) {
    let old = {
        let mut q = RETIRED.lock();
        q.push_back((obj as usize, Layout::new::<O>()));
        if q.len() > QUARANTINE {
            q.pop_front()
        } else {
            None
        }
    };
    if let Some((p, layout)) = old {
        // SAFETY: Box's allocation of this layout, its value dropped in
        // retire, freed once (it left the queue).
        unsafe { std::alloc::dealloc(p as *mut u8, layout) };
    }
}

/// Destroys a C object whose uroce half sits in a `ManuallyDrop` slot:
/// takes the uroce object out and hands it to `destroy`; on success frees
/// the C object (after `forget`, which unregisters it), on refusal (busy)
/// puts the uroce object back and returns the errno.
///
/// # Safety
/// `obj` is a live object made by `Box::into_raw` in this library, claimed
/// from the registry ([`claim`]; committed by the caller on success), not used
/// concurrently while it is destroyed (the caller's contract in
/// libibverbs), and `slot` returns the address of its `ManuallyDrop`
/// field (without reading anything).
pub(crate) unsafe fn destroy_boxed<O, R>(
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
            // SAFETY: made by Box::into_raw and unregistered (the caller's
            // claim); the ManuallyDrop field was taken above and is not
            // dropped again.
            unsafe { retire(obj) };
            Ok(())
        }
        Err((rust, e)) => {
            // SAFETY: as above; the slot is empty.
            unsafe { *slot(obj) = ManuallyDrop::new(rust) };
            Err(errno(&e))
        }
    }
}

/// The destroy of an object listed by number in its context's
/// [`Handles`] (a CQ, an SRQ): `fn $c_name / $name($cty) as $obj, $get,
/// $rust, $table` makes the C entry point `$c_name` and `$name`, which it
/// forwards to (for callers in this library, see
/// [`crate::symbol_versions`]). `$name` takes the object (type `$obj`,
/// its uroce half `$rust` in `inner.rust`, read with the accessor `$get`)
/// out of the registry ([`claim`]), destroys it with [`destroy_boxed`]
/// and takes it out of `handles.$table`; a refusal (busy) leaves it live
/// and registered.
macro_rules! destroy_listed {
    (fn $c_name:ident / $name:ident($cty:ty) as $obj:ty, $get:ident, $rust:ty, $table:ident) => {
        #[no_mangle]
        unsafe extern "C" fn $c_name(p: *mut $cty) -> libc::c_int {
            // SAFETY: forwarded.
            unsafe { $name(p) }
        }

        #[doc = concat!(
                                    "`", stringify!($c_name), "`, for callers in this library ",
                                    "(see [`crate::symbol_versions`])."
                                )]
        pub(crate) unsafe extern "C" fn $name(p: *mut $cty) -> libc::c_int {
            $crate::errno_result(|| {
                let claimed = $crate::objects::claim(p)?;
                // SAFETY: a live object of this kind (claimed from the
                // registry).
                let inner = unsafe { $get(p)? };
                let (handle, handles) = (inner.rust.handle(), inner.handles.clone());
                // SAFETY: made by Box::into_raw in this library and claimed
                // above (committed below on success); the closure only
                // computes a field address.
                let r = unsafe {
                    $crate::objects::destroy_boxed(
                        p.cast::<$obj>(),
                        |o| std::ptr::addr_of_mut!((*o).inner.rust),
                        <$rust>::destroy,
                        || {
                            handles.$table.lock().remove(&handle);
                        },
                    )
                };
                if r.is_ok() {
                    claimed.commit();
                }
                r
            })
        }
    };
}
pub(crate) use destroy_listed;
