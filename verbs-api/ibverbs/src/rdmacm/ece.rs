//! Enhanced connection establishment (ECE): answered as on a device
//! without it.

use super::ffi::*;
use super::id;
use crate::minus_one_result;
use libc::c_int;

crate::symbol_versions! {
    "RDMACM_1.3": [rdma_set_local_ece, rdma_get_remote_ece]
}

/// Kept, as librdmacm keeps it, and never sent: uroce's QPs have no ECE
/// (`ibv_query_ece` is EOPNOTSUPP), so connections go without, as on any
/// device without ECE.
#[no_mangle]
unsafe extern "C" fn rdma_set_local_ece(p: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        let inner = unsafe { id(p)? };
        // SAFETY: the id's C half; the caller's ECE.
        if !unsafe { (*p).qp }.is_null() || ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        let e = unsafe { &*ece };
        if e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        inner.st.lock().local_ece = (e.vendor_id, e.options);
        Ok(())
    })
}

/// The peer's ECE: none (vendor 0, options 0).
#[no_mangle]
unsafe extern "C" fn rdma_get_remote_ece(p: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library.
        unsafe { id(p)? };
        // SAFETY: the id's C half; the caller's ECE.
        if !unsafe { (*p).qp }.is_null() || ece.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: as above.
        unsafe {
            *ece = ibv_ece {
                vendor_id: 0,
                options: 0,
                comp_mask: 0,
            }
        };
        Ok(())
    })
}
