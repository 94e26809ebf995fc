//! Address handles: `ibv_create_ah`, `ibv_create_ah_from_wc`,
//! `ibv_init_ah_from_wc`, `ibv_destroy_ah`, and the address vector
//! conversions QP attributes share.

use crate::ffi::*;
use crate::objects::{accessor, claim, errno, live, register, retire};
use crate::pd_mr::pd;
use crate::{errno_result, ptr_result};
use libc::c_int;
use std::ptr::addr_of;
use uroce_provider::qp_attr::AddressVector;
use uroce_verbs::{AddressHandle, Wc};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_create_ah, ibv_destroy_ah, ibv_create_ah_from_wc, ibv_init_ah_from_wc]
}

#[repr(C)]
pub(crate) struct Ah {
    pub c: ibv_ah,
    pub inner: AhInner,
}
pub(crate) struct AhInner {
    pub rust: AddressHandle,
}
accessor!(ah, ibv_ah, Ah, AhInner);

/// The address handle a UD WR names, as [`ah`]; with the checker's
/// `lifetime` category on (`UROCE_CHECK`), one destroyed (or never made)
/// is reported and refused with EINVAL instead of read.
///
/// # Safety
/// As [`ah`] when the checker is off.
pub(crate) unsafe fn ah_of_wr<'a>(p: *mut ibv_ah) -> Result<&'a AhInner, i32> {
    use uroce_provider::check::{self, Category};
    if check::on(Category::Lifetime) && live(p).is_err() {
        check::report(
            Category::Lifetime,
            &format!("a UD WR names address handle {p:p}, which is not a live address handle (destroyed, or never made by ibv_create_ah)"),
            "ibv_create_ah(3)/ibv_destroy_ah(3): a WR may only use an address handle from its creation to its destruction; after ibv_destroy_ah its memory is freed",
            &[("posted at", &check::Caller::here())],
        );
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    unsafe { ah(p) }
}

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

/// Boxes and registers the C half of an address handle of PD `p` (of
/// `context`).
fn new_ah(context: *mut ibv_context, p: *mut ibv_pd, rust: AddressHandle) -> *mut ibv_ah {
    let handle = crate::objects::next_handle();
    let obj = Box::new(Ah {
        c: ibv_ah {
            context,
            pd: p,
            handle,
        },
        inner: AhInner { rust },
    });
    let a = Box::into_raw(obj).cast::<ibv_ah>();
    register(a, context, handle);
    a
}

#[no_mangle]
unsafe extern "C" fn ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    ptr_result(|| {
        let context = live(p)?;
        // SAFETY: a live PD (registered).
        let pdi = unsafe { pd(p)? };
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's attributes.
        let av = av_of(unsafe { &*attr })?;
        let rust = pdi.rust.create_ah(&av).map_err(|e| errno(&e))?;
        Ok(new_ah(context, p, rust))
    })
}

/// The 40-byte GRH area at `grh`, and the uroce completion of `wc`.
fn wc_and_grh(wc: *const ibv_wc, grh: *const ibv_grh) -> Result<(Wc, [u8; 40]), i32> {
    if wc.is_null() || grh.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's completion and the 40 bytes it received.
    let (w, g) = unsafe { (*wc, std::ptr::read_unaligned(grh.cast::<[u8; 40]>())) };
    Ok((crate::cq::wc_from_c(&w), g))
}

#[no_mangle]
unsafe extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    _port_num: u8,
) -> *mut ibv_ah {
    ptr_result(|| {
        let context = live(p)?;
        // SAFETY: a live PD (registered).
        let pdi = unsafe { pd(p)? };
        let (w, g) = wc_and_grh(wc, grh)?;
        let rust = pdi.rust.create_ah_from_wc(&w, &g).map_err(|e| errno(&e))?;
        Ok(new_ah(context, p, rust))
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
        claim(p)?.commit();
        // SAFETY: made by Box::into_raw in new_ah, unregistered just now.
        unsafe { retire(p.cast::<Ah>()) };
        Ok(())
    })
}
