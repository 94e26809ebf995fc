//! Devices and contexts: the device list (`UROCE_DEVICES`), opening,
//! queries, asynchronous events.

use crate::ffi::*;
use crate::objects::{ctx, errno, Ctx, CtxInner, Handles};
use crate::{errno_result, guard, minus_one_result, ptr_result};
use libc::{c_char, c_int, size_t, ssize_t};
use parking_lot::Mutex;
use std::ptr::null_mut;
use std::sync::{Arc, OnceLock};
use uroce_verbs::{Context, Device, EventElement};

crate::symbol_versions! {
    "IBVERBS_1.1": [ibv_get_device_list, ibv_free_device_list, ibv_get_device_name,
                    ibv_get_device_guid, ibv_open_device, ibv_close_device,
                    ibv_get_async_event, ibv_ack_async_event, ibv_query_device,
                    ibv_query_port, ibv_query_gid, ibv_query_pkey]
    "IBVERBS_1.5": [ibv_get_pkey_index]
    "IBVERBS_1.9": [ibv_get_device_index]
    "IBVERBS_1.10": [ibv_import_device]
    "IBVERBS_1.11": [_ibv_query_gid_ex, _ibv_query_gid_table]
    "IBVERBS_PRIVATE_34": [ibv_query_gid_type]
}

/// A device in the list: laid out as rdma-core's `struct verbs_device`
/// (`ibv_device`, then a NULL driver ops pointer and zeroed private
/// fields), since provider libraries such as libmlx5 recognise their own
/// devices by reading that ops pointer.
#[repr(C)]
pub(crate) struct Dev {
    pub c: ibv_device,
    /// `verbs_device::ops`, refcount, list node, sysfs, core_support.
    verbs_device_tail: [usize; 6],
    pub rust: Device,
    /// The device's first open uroce context and the handle maps, with
    /// the number of contexts open: every `ibv_open_device` of this
    /// device in the process shares its engine (a device binds its UDP
    /// address once), each with asynchronous events of its own
    /// ([`Context::new_context`]). And the process that opened it: a
    /// child of `fork()` inherits the parent's engine without its thread,
    /// and opens a context of its own (see [`forked`]).
    open: Mutex<Option<OpenEntry>>,
}

/// A device's open entry: its first context, the handle maps, the number
/// of contexts open and the pid of the process that opened it.
type OpenEntry = (Context, Arc<Handles>, usize, u32);

/// Whether a cache entry made by process `pid` was inherited through
/// `fork()`: the child has the parent's memory but not its engine
/// threads, so a context the parent opened neither works in the child nor
/// may be dropped there (dropping one stops and joins an engine thread
/// that is not there). The child leaves such an entry alone, never
/// dropped ([`std::mem::forget`]), and opens the device anew, as a
/// process of its own on the shared device.
pub(crate) fn forked(pid: u32) -> bool {
    pid != std::process::id()
}

/// `*mut Dev` of every configured device, made once and kept for the
/// process's life (as libibverbs keeps its devices).
struct DevList(Vec<usize>);

fn device_list() -> Result<&'static [usize], i32> {
    static LIST: OnceLock<Result<DevList, i32>> = OnceLock::new();
    let list = LIST.get_or_init(|| {
        let devs = uroce_verbs::devices().map_err(|e| errno(&e))?;
        Ok(DevList(
            devs.into_iter()
                .map(|d| Box::into_raw(Box::new(new_dev(d))) as usize)
                .collect(),
        ))
    });
    match list {
        Ok(l) => Ok(&l.0),
        Err(e) => Err(*e),
    }
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

fn new_dev(rust: Device) -> Dev {
    let mut c = ibv_device {
        _ops: _ibv_device_ops {
            _dummy1: null_mut(),
            _dummy2: null_mut(),
        },
        node_type: 1,      // IBV_NODE_CA
        transport_type: 0, // IBV_TRANSPORT_IB (RoCE is IB transport)
        name: [0; 64],
        dev_name: [0; 64],
        dev_path: [0; 256],
        ibdev_path: [0; 256],
    };
    copy_str(&mut c.name, rust.name());
    copy_str(&mut c.dev_name, &format!("uverbs-{}", rust.name()));
    // Where the kernel's sysfs has a device's entries: they exist under
    // `uroce exec` (its sysfs view), and nowhere otherwise.
    copy_str(
        &mut c.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs-{}", rust.name()),
    );
    copy_str(
        &mut c.ibdev_path,
        &format!("/sys/class/infiniband/{}", rust.name()),
    );
    Dev {
        c,
        verbs_device_tail: [0; 6],
        rust,
        open: Mutex::new(None),
    }
}

/// # Safety
/// `num` is NULL or writable.
#[no_mangle]
unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    ptr_result(|| {
        let list = device_list()?;
        let mut v: Vec<*mut ibv_device> = list.iter().map(|&p| p as *mut ibv_device).collect();
        let n = v.len();
        v.push(null_mut());
        if !num.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *num = n as c_int };
        }
        // The array is freed by ibv_free_device_list, which needs its
        // length: it is found from the NULL terminator.
        Ok(Box::into_raw(v.into_boxed_slice()).cast())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    guard((), || {
        if list.is_null() {
            return;
        }
        let mut n = 0;
        // SAFETY: an array from ibv_get_device_list, NULL-terminated.
        while !unsafe { *list.add(n) }.is_null() {
            n += 1;
        }
        // SAFETY: that array was a boxed slice of n + 1 pointers.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n + 1)) });
    })
}

/// The uroce device behind a listed `ibv_device`.
///
/// # Safety
/// `d` is NULL or a device from `ibv_get_device_list`.
unsafe fn dev<'a>(d: *mut ibv_device) -> Result<&'a Dev, i32> {
    if d.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: devices live for the process; their fields are never
    // written after creation.
    Ok(unsafe { &*d.cast::<Dev>() })
}

#[no_mangle]
unsafe extern "C" fn ibv_get_device_name(d: *mut ibv_device) -> *const c_char {
    // SAFETY: the caller's device.
    match unsafe { dev(d) } {
        Ok(d) => d.c.name.as_ptr(),
        Err(e) => {
            crate::set_errno(e);
            std::ptr::null()
        }
    }
}

/// The node GUID in network byte order (`__be64`).
#[no_mangle]
unsafe extern "C" fn ibv_get_device_guid(d: *mut ibv_device) -> u64 {
    // SAFETY: the caller's device.
    unsafe { dev(d) }.map_or(0, |d| d.rust.guid().to_be())
}

#[no_mangle]
unsafe extern "C" fn ibv_get_device_index(d: *mut ibv_device) -> c_int {
    let Ok(list) = device_list() else { return -1 };
    list.iter()
        .position(|&p| p == d as usize)
        .map_or(-1, |i| i as c_int)
}

#[no_mangle]
unsafe extern "C" fn ibv_open_device(d: *mut ibv_device) -> *mut ibv_context {
    ptr_result(|| open_device(d))
}

/// Command fds of open contexts, by identity (device and inode of the
/// memfd: a dup of it has the same), with their device.
static CMD_FDS: Mutex<Vec<((u64, u64), usize)>> = Mutex::new(Vec::new());

/// The identity of an open file descriptor.
fn fd_key(fd: c_int) -> Result<(u64, u64), i32> {
    // SAFETY: all-zero is a valid `struct stat`; fstat writes it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat on any integer is safe; EBADF when not open.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF));
    }
    Ok((st.st_dev, st.st_ino))
}

/// `ibv_import_device`: a context of the device whose context `fd` (a
/// context's `cmd_fd`, or a dup of it) belongs to. uroce's contexts live
/// in the process, so importing works between contexts of one process;
/// the new context shares the device's objects, and its `cmd_fd` is
/// `fd` (closed by `ibv_close_device`).
#[no_mangle]
unsafe extern "C" fn ibv_import_device(fd: c_int) -> *mut ibv_context {
    ptr_result(|| {
        let key = fd_key(fd)?;
        let d = CMD_FDS
            .lock()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, d)| *d)
            .ok_or(libc::EOPNOTSUPP)?;
        open_device_with(d as *mut ibv_device, Some(fd))
    })
}

/// `ibv_open_device`, for callers in this library (see
/// [`crate::symbol_versions`]).
fn open_device(d: *mut ibv_device) -> Result<*mut ibv_context, i32> {
    open_device_with(d, None)
}

/// Opens a context of `d`: with a command fd of its own (a memfd, which
/// `ibv_import_device` recognizes), or `imported`'s.
fn open_device_with(d: *mut ibv_device, imported: Option<c_int>) -> Result<*mut ibv_context, i32> {
    // SAFETY: the caller's device.
    let dv = unsafe { dev(d)? };
    let (rust, handles) = {
        let mut open = dv.open.lock();
        if open.as_ref().is_some_and(|o| forked(o.3)) {
            std::mem::forget(open.take());
        }
        match &mut *open {
            Some((c, h, n, _)) => {
                // A context of its own on the device's engine: its own
                // async_fd, as each open of a kernel device is its own
                // file (UCX keys its handlers by that descriptor).
                let c = c.new_context().map_err(|e| errno(&e))?;
                crate::make_blocking(c.async_fd());
                *n += 1;
                (c, h.clone())
            }
            None => {
                let c = dv.rust.open_shared().map_err(|e| errno(&e))?;
                crate::make_blocking(c.async_fd());
                let h = Arc::new(Handles::default());
                *open = Some((c.clone(), h.clone(), 1, std::process::id()));
                (c, h)
            }
        }
    };
    let async_fd = rust.async_fd();
    // SAFETY: every field of verbs_context is a nullable function
    // pointer, a pointer, an integer or a pthread mutex, for all of
    // which all-zero is valid (NULL, 0, PTHREAD_MUTEX_INITIALIZER).
    let mut v: verbs_context = unsafe { std::mem::zeroed() };
    v.query_port = Some(query_port_ex);
    v.query_device_ex = Some(query_device_ex);
    v.create_cq_ex = Some(crate::cq::create_cq_ex);
    v.query_rt_values = Some(query_rt_values);
    v.create_qp_ex = Some(crate::qp::create_qp_ex);
    v.get_srq_num = Some(get_srq_num);
    v.sz = std::mem::size_of::<verbs_context>();
    v.context.device = d;
    let (cmd_fd, cmd_fd_key) = match imported {
        Some(fd) => (fd, None),
        None => {
            // SAFETY: a NUL-terminated name; flags valid.
            let fd = unsafe { libc::memfd_create(c"uroce-context".as_ptr(), libc::MFD_CLOEXEC) };
            let key = if fd >= 0 { fd_key(fd).ok() } else { None };
            if let Some(k) = key {
                CMD_FDS.lock().push((k, d as usize));
            }
            (fd, key)
        }
    };
    v.context.cmd_fd = cmd_fd;
    v.context.async_fd = async_fd;
    v.context.num_comp_vectors = 1;
    v.context.abi_compat = usize::MAX as *mut libc::c_void; // __VERBS_ABI_IS_EXTENDED
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(crate::cq::poll_cq);
    ops.req_notify_cq = Some(crate::cq::req_notify_cq);
    ops.post_send = Some(crate::post::post_send);
    ops.post_recv = Some(crate::post::post_recv);
    ops.post_srq_recv = Some(crate::post::post_srq_recv);
    ops.alloc_mw = Some(crate::pd_mr::alloc_mw);
    ops.bind_mw = Some(crate::post::bind_mw);
    ops.dealloc_mw = Some(crate::pd_mr::dealloc_mw);
    let obj = Box::new(Ctx {
        v,
        inner: CtxInner {
            rust,
            handles,
            cmd_fd_key,
            pid: std::process::id(),
        },
    });
    let p = Box::into_raw(obj);
    // SAFETY: just made; the ibv_context is its last field.
    Ok(unsafe { std::ptr::addr_of_mut!((*p).v.context) })
}

/// The context (and PD) librdmacm's ids on device `name` carry
/// (`rdma_cm_id::verbs`, `::pd`): opened through `ibv_open_device` the
/// first time an id needs it and kept for the process's life, as librdmacm
/// keeps one per device. It shares the device's engine with every other
/// context of the device in the process.
pub(crate) fn cm_context(name: &str) -> Result<(*mut ibv_context, *mut ibv_pd), i32> {
    // (name, context, PD, the process that opened them: a child of
    // fork() opens its own, see `forked`; the parent's are plain
    // addresses, left as they are.)
    static CTXS: Mutex<Vec<(String, usize, usize, u32)>> = Mutex::new(Vec::new());
    let mut ctxs = CTXS.lock();
    ctxs.retain(|e| !forked(e.3));
    if let Some((_, c, p, _)) = ctxs.iter().find(|e| e.0 == name) {
        return Ok((*c as *mut ibv_context, *p as *mut ibv_pd));
    }
    let list = device_list()?;
    let d = list
        .iter()
        // SAFETY: devices live for the process.
        .find(|&&p| unsafe { &*(p as *const Dev) }.rust.name() == name)
        .ok_or(libc::ENODEV)?;
    let c = open_device(*d as *mut ibv_device)?;
    // SAFETY: the context just opened.
    let pd = unsafe { crate::pd_mr::ibv_alloc_pd_impl(c) };
    if pd.is_null() {
        let e = crate::rdmacm::last_errno();
        let _ = close_device(c);
        return Err(e);
    }
    ctxs.push((
        name.to_string(),
        c as usize,
        pd as usize,
        std::process::id(),
    ));
    Ok((c, pd))
}

/// [`cm_context`] of every configured device (`rdma_get_devices`).
pub(crate) fn cm_contexts() -> Result<Vec<*mut ibv_context>, i32> {
    device_list()?
        .iter()
        // SAFETY: devices live for the process.
        .map(|&p| cm_context(unsafe { &*(p as *const Dev) }.rust.name()).map(|(c, _)| c))
        .collect()
}

#[no_mangle]
unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    minus_one_result(|| close_device(c))
}

/// `ibv_close_device`, for callers in this library.
fn close_device(c: *mut ibv_context) -> Result<(), i32> {
    if c.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: made by Box::into_raw in ibv_open_device. Objects the
    // program did not destroy keep the device's engine alive.
    let ctx = unsafe { Box::from_raw(crate::objects::ctx_ptr(c)) };
    if forked(ctx.inner.pid) {
        // The parent's context, closed in a child of fork(): its engine
        // is the parent's (see `forked`); only the memory is the child's.
        std::mem::forget(ctx);
        return Ok(());
    }
    if let Some(k) = ctx.inner.cmd_fd_key {
        CMD_FDS.lock().retain(|(key, _)| *key != k);
    }
    if ctx.v.context.cmd_fd >= 0 {
        // SAFETY: the context's command fd (its own memfd, or the one
        // ibv_import_device was given), closed once, here.
        unsafe { libc::close(ctx.v.context.cmd_fd) };
    }
    // SAFETY: the context's device, from the list.
    if let Ok(dv) = unsafe { dev(ctx.v.context.device) } {
        let mut open = dv.open.lock();
        if let Some((_, _, n, _)) = &mut *open {
            *n -= 1;
            if *n == 0 {
                *open = None;
            }
        }
    }
    Ok(())
}

fn device_attr(ctx: &CtxInner) -> ibv_device_attr {
    let a = ctx.rust.query_device();
    // SAFETY: all-zero is a valid ibv_device_attr (integers and chars).
    let mut o: ibv_device_attr = unsafe { std::mem::zeroed() };
    copy_str(&mut o.fw_ver, &a.fw_ver);
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    o.node_guid = a.node_guid.to_be();
    o.sys_image_guid = a.sys_image_guid.to_be();
    o.max_mr_size = a.max_mr_size;
    o.page_size_cap = a.page_size_cap;
    o.vendor_id = a.vendor_id;
    o.vendor_part_id = a.vendor_part_id;
    o.hw_ver = a.hw_ver;
    o.max_qp = int(a.max_qp);
    o.max_qp_wr = int(a.max_qp_wr);
    // IBV_DEVICE_PORT_ACTIVE_EVENT | SYS_IMAGE_GUID | RC_RNR_NAK_GEN |
    // SRQ_RESIZE (ibv_modify_srq with IBV_SRQ_MAX_WR, as rxe) |
    // MEM_WINDOW | MEM_WINDOW_TYPE_2B.
    o.device_cap_flags = (1 << 10) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 17) | (1 << 24);
    o.max_mw = int(a.max_mw);
    o.max_sge = int(a.max_sge);
    o.max_sge_rd = int(a.max_sge);
    o.max_cq = int(a.max_cq);
    o.max_cqe = int(a.max_cqe);
    o.max_mr = int(a.max_mr);
    o.max_pd = int(a.max_pd);
    o.max_qp_rd_atom = int(a.max_qp_rd_atom);
    o.max_res_rd_atom = int(a.max_res_rd_atom);
    o.max_qp_init_rd_atom = int(a.max_qp_init_rd_atom);
    o.atomic_cap = int(a.atomic_cap);
    o.max_ah = int(a.max_ah);
    o.max_mcast_grp = int(a.max_mcast_grp);
    o.max_mcast_qp_attach = int(a.max_mcast_qp_attach);
    o.max_total_mcast_qp_attach = int(a.max_total_mcast_qp_attach);
    o.max_srq = int(a.max_srq);
    o.max_srq_wr = int(a.max_qp_wr);
    o.max_srq_sge = int(a.max_sge);
    o.max_pkeys = a.max_pkeys;
    o.local_ca_ack_delay = 15;
    o.phys_port_cnt = a.phys_port_cnt;
    o
}

#[no_mangle]
unsafe extern "C" fn ibv_query_device(c: *mut ibv_context, out: *mut ibv_device_attr) -> c_int {
    errno_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's output struct.
        unsafe { *out = device_attr(ctx) };
        Ok(())
    })
}

/// `verbs_context::query_device_ex`: writes the first `size` bytes of
/// `ibv_device_attr_ex` (older programs pass a shorter struct).
unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    out: *mut ibv_device_attr_ex,
    size: size_t,
) -> c_int {
    errno_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        // SAFETY: the caller's input, if any.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return Err(libc::EINVAL);
        }
        if out.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: all-zero is valid for this plain-data struct.
        let mut x: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        x.orig_attr = device_attr(ctx);
        // The kernel's 64-bit capability word: the 32 of ibv_device_attr,
        // and IB_UVERBS_DEVICE_FLUSH_GLOBAL (38) and _ATOMIC_WRITE (40),
        // which rdma-core has no names for yet (FLUSH_PERSISTENT, 39, is
        // not offered: no persistent memory).
        x.device_cap_flags_ex =
            u64::from(x.orig_attr.device_cap_flags as u32) | (1 << 38) | (1 << 40);
        x.phys_port_cnt_ex = 1;
        // Completion timestamps count nanoseconds on CLOCK_MONOTONIC, all
        // 64 bits of them (`ibv_query_rt_values_ex` reads the same clock).
        x.completion_timestamp_mask = u64::MAX;
        x.hca_core_clock = uroce_verbs::COMPLETION_CLOCK_KHZ;
        let n = size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds `size` bytes; n <= size.
        unsafe { std::ptr::copy_nonoverlapping((&raw const x).cast::<u8>(), out.cast(), n) };
        Ok(())
    })
}

/// `verbs_context::query_rt_values` (`ibv_query_rt_values_ex`): with
/// `IBV_VALUES_MASK_RAW_CLOCK`, the completion clock now, in its ticks
/// (nanoseconds, `hca_core_clock` kHz) in `raw_clock.tv_nsec` with
/// `tv_sec` 0, as mlx5 reports its cycle counter. `comp_mask` comes back
/// naming what was filled; other bits are ignored, as mlx5 does. Returns
/// an errno value.
unsafe extern "C" fn query_rt_values(c: *mut ibv_context, v: *mut ibv_values_ex) -> c_int {
    const RAW_CLOCK: u32 = 1;
    guard(libc::EIO, || {
        // SAFETY: a context from ibv_open_device.
        if unsafe { ctx(c) }.is_err() || v.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller's values struct.
        let v = unsafe { &mut *v };
        let mut filled = 0;
        if v.comp_mask & RAW_CLOCK != 0 {
            v.raw_clock.tv_sec = 0;
            v.raw_clock.tv_nsec = uroce_verbs::completion_clock_ns() as libc::c_long;
            filled |= RAW_CLOCK;
        }
        v.comp_mask = filled;
        0
    })
}

fn port_attr(ctx: &CtxInner, port: u8) -> Result<ibv_port_attr, i32> {
    let p = ctx.rust.query_port(port).map_err(|e| errno(&e))?;
    // SAFETY: all-zero is valid for this plain-data struct.
    let mut o: ibv_port_attr = unsafe { std::mem::zeroed() };
    o.state = p.state as c_int;
    o.max_mtu = p.max_mtu as c_int;
    o.active_mtu = p.active_mtu as c_int;
    o.gid_tbl_len = p.gid_tbl_len as c_int;
    // IBV_PORT_CM_SUP.
    o.port_cap_flags = 1 << 16;
    o.max_msg_sz = p.max_msg_sz;
    o.pkey_tbl_len = p.pkey_tbl_len;
    o.lid = p.lid;
    o.max_vl_num = 1;
    o.active_width = 1; // 1X
    o.active_speed = 1; // 2.5 Gb/s (a software device has no line rate)
    o.phys_state = 5; // LinkUp
    o.link_layer = p.link_layer;
    Ok(o)
}

/// `ibv_query_port`, the exported (compat) entry: programs compiled
/// against verbs.h reach `query_port_ex` through the verbs_context
/// instead; this one writes the whole struct as libibverbs 44's does.
#[no_mangle]
unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { query_port_ex(c, port, out, std::mem::size_of::<ibv_port_attr>()) }
}

unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    out: *mut ibv_port_attr,
    size: size_t,
) -> c_int {
    errno_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let a = port_attr(ctx, port)?;
        let n = size.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer holds `size` bytes; n <= size.
        unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), out.cast(), n) };
        Ok(())
    })
}

fn gid(ctx: &CtxInner, port: u32, index: u32) -> Result<uroce_verbs::GidEntry, i32> {
    let port = u8::try_from(port).map_err(|_| libc::EINVAL)?;
    ctx.rust.query_gid(port, index).map_err(|e| errno(&e))
}

#[no_mangle]
unsafe extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut ibv_gid,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        let index = u32::try_from(index).map_err(|_| libc::EINVAL)?;
        // An empty entry reads as the zero GID (rdma-core keeps that
        // behaviour of the sysfs days over ibv_query_gid_ex's ENODATA).
        let g = match gid(ctx, port as u32, index) {
            Ok(e) => e.gid,
            Err(libc::ENODATA) => [0; 16],
            Err(e) => return Err(e),
        };
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's 16-byte output (written unaligned: programs
        // also pass plain byte arrays).
        unsafe { out.cast::<[u8; 16]>().write_unaligned(g) };
        Ok(())
    })
}

/// `IBV_GID_TYPE_SYSFS_ROCE_V2` (1) for every GID (rdma-core private);
/// an empty entry answers 0 (IB/RoCE v1) and success, as rdma-core does.
#[no_mangle]
unsafe extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    out: *mut c_int,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        let kind = match gid(ctx, port as u32, index) {
            Ok(_) => 1,
            Err(libc::ENODATA) => 0,
            Err(e) => return Err(e),
        };
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's output.
        unsafe { *out = kind };
        Ok(())
    })
}

fn gid_entry(ctx: &CtxInner, port: u32, index: u32) -> Result<ibv_gid_entry, i32> {
    let e = gid(ctx, port, index)?;
    Ok(ibv_gid_entry {
        gid: ibv_gid { raw: e.gid },
        gid_index: index,
        port_num: port,
        gid_type: 2, // IBV_GID_TYPE_ROCE_V2
        ndev_ifindex: e.ndev_ifindex,
    })
}

#[no_mangle]
unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    out: *mut ibv_gid_entry,
    flags: u32,
    size: size_t,
) -> c_int {
    errno_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        if flags != 0 || out.is_null() {
            return Err(libc::EINVAL);
        }
        let e = gid_entry(ctx, port, index)?;
        let n = size.min(std::mem::size_of::<ibv_gid_entry>());
        // SAFETY: the caller's buffer holds `size` bytes; n <= size.
        unsafe { std::ptr::copy_nonoverlapping((&raw const e).cast::<u8>(), out.cast(), n) };
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn _ibv_query_gid_table(
    c: *mut ibv_context,
    out: *mut ibv_gid_entry,
    max: size_t,
    flags: u32,
    size: size_t,
) -> ssize_t {
    guard(-(libc::EIO as ssize_t), || {
        // SAFETY: a context from ibv_open_device.
        let Ok(ctx) = (unsafe { ctx(c) }) else {
            return -(libc::EINVAL as ssize_t);
        };
        if flags != 0 || size < std::mem::size_of::<ibv_gid_entry>() {
            return -(libc::EINVAL as ssize_t);
        }
        // The kernel refuses a table too small for every valid entry, and
        // returns the populated entries only.
        let len = uroce_verbs::GID_ENTRIES as usize;
        if max < len || out.is_null() {
            return -(libc::EINVAL as ssize_t);
        }
        for i in 0..len {
            let Ok(e) = gid_entry(ctx, 1, i as u32) else {
                return -(libc::EINVAL as ssize_t);
            };
            // SAFETY: the caller's array of `max` entries of `size` bytes
            // each (size >= the entry, checked above); i < len <= max.
            unsafe { std::ptr::write_unaligned(out.cast::<u8>().add(i * size).cast(), e) };
        }
        len as ssize_t
    })
}

/// The one P_Key, 0xffff (network order).
#[no_mangle]
unsafe extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    out: *mut u16,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        port_attr(ctx, port)?;
        if index != 0 || out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's output.
        unsafe { *out = 0xffff };
        Ok(())
    })
}

#[no_mangle]
unsafe extern "C" fn ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        port_attr(ctx, port)?;
        if pkey | 0x8000 != 0xffff {
            return Err(libc::ENOENT);
        }
        Ok(())
    })
}

unsafe extern "C" fn get_srq_num(s: *mut ibv_srq, num: *mut u32) -> c_int {
    errno_result(|| {
        // SAFETY: an SRQ from ibv_create_srq.
        let q = unsafe { crate::srq::srq(s)? };
        if num.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's output.
        unsafe { *num = q.rust.handle() };
        Ok(())
    })
}

/// Blocks for the next asynchronous event in a `read(2)` of `async_fd`
/// (-1 with EINTR when a signal handler without `SA_RESTART` interrupts
/// it; on a non-blocking `async_fd`, -1 with EAGAIN), as libibverbs does.
/// Events about objects already destroyed are skipped.
#[no_mangle]
unsafe extern "C" fn ibv_get_async_event(c: *mut ibv_context, out: *mut ibv_async_event) -> c_int {
    minus_one_result(|| {
        // SAFETY: a context from ibv_open_device.
        let ctx = unsafe { ctx(c)? };
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let nonblock = crate::is_nonblocking(ctx.rust.async_fd());
        loop {
            let ev = if nonblock {
                ctx.rust.try_get_async_event().map_err(|e| errno(&e))?
            } else {
                ctx.rust.get_async_event().map_err(|e| errno(&e))?
            };
            // uroce's own events (PsnSweep) have no ibv_event_type.
            if !ev.event_type.is_ibverbs() {
                continue;
            }
            let element = match ev.element {
                EventElement::Qp(n) => ctx.handles.qps.lock().get(&n).copied(),
                EventElement::Cq(h) => ctx.handles.cqs.lock().get(&h).copied(),
                EventElement::Srq(h) => ctx.handles.srqs.lock().get(&h).copied(),
                EventElement::Port(p) => Some(p as usize),
                EventElement::Device => Some(0),
            };
            if let Some(e) = element {
                // SAFETY: the caller's output.
                unsafe {
                    *out = ibv_async_event {
                        element: e as *mut libc::c_void,
                        event_type: ev.event_type as c_int,
                    }
                };
                return Ok(());
            }
        }
    })
}

/// Nothing to count: uroce's destroy calls do not wait for acks of
/// asynchronous events.
#[no_mangle]
unsafe extern "C" fn ibv_ack_async_event(_event: *mut ibv_async_event) {}
