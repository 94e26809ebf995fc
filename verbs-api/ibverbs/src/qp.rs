//! Queue pairs: `ibv_create_qp` and `create_qp_ex`, modify, query and
//! destroy. Every uroce QP is an `ibv_qp_ex` whose `ibv_wr_*` table is
//! [`crate::qp_ex`]; posting is [`crate::post`].

use crate::ah::{ah_attr_of, av_of};
use crate::cq::cq;
use crate::ffi::*;
use crate::objects::{accessor, claim, errno, live, live_in, register, retire, Handles};
use crate::pd_mr::{access, pd};
use crate::srq::srq;
use crate::{errno_result, ptr_result};
use libc::c_int;
use parking_lot::Mutex;
use std::ptr::addr_of;
use std::sync::Arc;
use uroce_provider::qp_attr::{AttrMask, QpAttr, QpCap};
use uroce_verbs::{Mtu, QpInitAttr, QpState, QpType, QueuePair, SendWr, WrOpcode};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_create_qp, ibv_query_qp, ibv_modify_qp, ibv_destroy_qp,
                    ibv_attach_mcast, ibv_detach_mcast]
    "IBVERBS_1.6": [ibv_qp_to_qp_ex]
    "IBVERBS_1.14": [ibv_query_qp_data_in_order]
}

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
    // The PD, CQs and SRQ are live objects of one context (the SRQ may be
    // of another PD: IBA and the kernel allow it).
    let context = live(p)?;
    live_in(a.send_cq, context)?;
    live_in(a.recv_cq, context)?;
    if !a.srq.is_null() {
        live_in(a.srq, context)?;
    }
    // SAFETY: live objects of this library (registered).
    let pdi = unsafe { pd(p)? };
    // SAFETY: as above.
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
    // SAFETY: the PD's context.
    let ctx = unsafe { crate::objects::ctx(context)? };
    let qpn = rust.qp_num();
    use crate::qp_ex as w;
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
    register(ptr.cast::<ibv_qp>(), context, qpn);
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
        live(p)?;
        // SAFETY: a live QP (registered).
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
        live(p)?;
        // SAFETY: a live QP (registered).
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

crate::exported! {
    fn ibv_destroy_qp / ibv_destroy_qp_impl(p: *mut ibv_qp) -> c_int {
        errno_result(|| {
            claim(p)?.commit();
            let obj = p.cast::<Qp>();
            // SAFETY: a live QP made by this library (claimed just now).
            let inner = unsafe { &*addr_of!((*obj).inner) };
            inner.handles.qps.lock().remove(&inner.rust.qp_num());
            if Arc::strong_count(&inner.rust) > 1 {
                // An rdma_cm id's QP destroyed with ibv_destroy_qp (not
                // rdma_destroy_qp): the id lets go of it too.
                crate::rdmacm::forget_qp(p);
            }
            // SAFETY: made by Box::into_raw in create_qp, unregistered above;
            // dropping the uroce QP removes it from the engine.
            unsafe { retire(obj) };
            Ok(())
        })
    }
}

/// Attaches a UD QP to a multicast group: errors as the kernel answers
/// them (EINVAL: not UD, not a multicast GID; ENOMEM: past the limits
/// `ibv_query_device` gives), returned and in errno.
#[no_mangle]
unsafe extern "C" fn ibv_attach_mcast(p: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: as `mcast`.
    errno_result(|| unsafe { mcast(p, gid, |q, g| q.attach_mcast(g, lid)) })
}

/// Detaches a QP from a group (EINVAL if it is not attached).
#[no_mangle]
unsafe extern "C" fn ibv_detach_mcast(p: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int {
    // SAFETY: as `mcast`.
    errno_result(|| unsafe { mcast(p, gid, |q, g| q.detach_mcast(g, lid)) })
}

/// Runs an attach or detach on the QP `p` and the GID `gid`.
///
/// # Safety
/// `p` is NULL or a QP pointer (checked against the live handles); `gid`
/// is NULL or points to 16 readable bytes.
unsafe fn mcast(
    p: *mut ibv_qp,
    gid: *const ibv_gid,
    f: impl FnOnce(&QueuePair, &[u8; 16]) -> uroce_verbs::Result<()>,
) -> Result<(), i32> {
    live(p)?;
    // SAFETY: a live QP (registered).
    let q = unsafe { qp(p)? };
    if gid.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's GID, 16 bytes (read unaligned: a C caller
    // may pass any address).
    let g: [u8; 16] = unsafe { std::ptr::read_unaligned(gid.cast()) };
    f(&q.rust, &g).map_err(|e| errno(&e))
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
