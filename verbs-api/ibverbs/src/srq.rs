//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq` (posting is [`crate::post`]).

use crate::ffi::*;
use crate::objects::{accessor, errno, live, register, Handles};
use crate::pd_mr::pd;
use crate::{errno_result, ptr_result};
use libc::c_int;
use std::mem::ManuallyDrop;
use std::ptr::addr_of;
use std::sync::Arc;
use uroce_verbs::{SharedReceiveQueue, SrqAttr, SrqAttrMask};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_create_srq, ibv_modify_srq, ibv_query_srq, ibv_destroy_srq]
}

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

crate::exported! {
    fn ibv_create_srq / ibv_create_srq_impl(
        p: *mut ibv_pd,
        attr: *mut ibv_srq_init_attr,
    ) -> *mut ibv_srq {
        ptr_result(|| {
            let context = live(p)?;
            // SAFETY: a live PD (registered).
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
            register(ptr.cast::<ibv_srq>(), context, handle);
            Ok(ptr.cast())
        })
    }
}

#[no_mangle]
unsafe extern "C" fn ibv_modify_srq(
    p: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    errno_result(|| {
        live(p)?;
        // SAFETY: a live SRQ (registered).
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
        live(p)?;
        // SAFETY: a live SRQ (registered).
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

crate::objects::destroy_listed! {
    fn ibv_destroy_srq / ibv_destroy_srq_impl(ibv_srq) as Srq, srq, SharedReceiveQueue, srqs
}
