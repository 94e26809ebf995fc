//! The C objects' shared machinery: each object is a `#[repr(C)]` struct
//! whose first field is the rdma-core structure the program sees,
//! followed by the uroce object; the context ([`Ctx`]) and the handle
//! table events use; the accessor every kind declares; the destroy that
//! gives a refused object back. The kinds live in their own modules:
//! [`crate::pd_mr`] (PD, MR, MW), [`crate::cq`] (completion channel,
//! CQ), [`crate::srq`], [`crate::ah`], [`crate::qp`].
//!
//! Only the uroce half is ever borrowed (through `addr_of!`), never the
//! whole struct, since the program may read or write its C half at any
//! time. Destroy calls that uroce may refuse (busy) keep the uroce object
//! in a `ManuallyDrop` so it can be taken out, offered to `destroy`, and
//! put back on refusal.

use crate::ffi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::mem::{offset_of, ManuallyDrop};
use std::ptr::addr_of;
use std::sync::Arc;
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
