//! # uroce as `librdmacm.so.1`
//!
//! rdma-core's connection manager library, on [`uroce_rdmacm::cm`]. It
//! lives in the same shared object as libibverbs: build.rs puts a
//! `librdmacm.so.1` symlink to it beside `libibverbs.so.1`, glibc's loader
//! sees the same file for both sonames and maps it once, so the rdma_cm
//! calls and the verbs calls share one set of devices, contexts and
//! engines. `id->verbs` is a context of this library (opened once per
//! device, as librdmacm does), `id->qp` a QP made by its create-QP path,
//! so that verbs.h's inline `ibv_post_send(id->qp, ...)` reaches uroce.
//!
//! What each C object is: `Id` (`rdma_cm_id` first, then the uroce
//! [`CmId`]), `Chan` (`rdma_event_channel`, then the [`EventChannel`]
//! whose descriptor it shows), `Event` (`rdma_cm_event`, then the
//! private data it points to). An id is freed when it is destroyed and
//! every event naming it has been acknowledged, so an event never points
//! at freed memory (librdmacm makes `rdma_destroy_id` wait for the
//! acknowledgements instead).
//!
//! A synchronous id (`rdma_create_id` with a NULL channel, or made by
//! `rdma_create_ep`) has a channel of its own; the calls that report an
//! event wait for it (`rdma_resolve_addr`, `rdma_resolve_route`,
//! `rdma_connect`, `rdma_accept`, `rdma_disconnect`,
//! `rdma_get_request`) and keep it in `id->event` until the next such call,
//! as librdmacm's `ucma_complete` does.

pub(crate) mod addrinfo;
pub(crate) mod devices;
pub(crate) mod ece;
pub(crate) mod endpoint;
pub mod ffi;
pub(crate) mod multicast;
pub(crate) mod qp;
pub(crate) mod rsocket;

use self::ffi::*;
use crate::ffi::*;
use crate::{guard, minus_one_result, ptr_result, set_errno};
use libc::{c_int, c_void, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::ptr::{addr_of, null_mut};
use std::sync::OnceLock;
use std::thread::ThreadId;
use uroce_provider::qp_attr::gid_of;
use uroce_rdmacm::cm::{CmEvent, CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use uroce_verbs::{Error, QpType};

crate::symbol_versions! {
    "RDMACM_1.0": [rdma_create_event_channel, rdma_destroy_event_channel, rdma_create_id,
                   rdma_destroy_id, rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route,
                   rdma_connect, rdma_listen, rdma_accept, rdma_reject, rdma_notify,
                   rdma_disconnect, rdma_get_cm_event, rdma_ack_cm_event, rdma_get_src_port,
                   rdma_get_dst_port, rdma_set_option, rdma_migrate_id, rdma_get_request]
    "RDMACM_1.2": [rdma_establish]
    "RDMACM_1.3": [rdma_reject_ece]
}

/// `IBV_QPT_UD`.
const QPT_UD: c_int = 4;
/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH`: "the device's maximum".
const MAX_RES: u8 = 0xff;
/// `IBV_EVENT_COMM_EST`.
const EVENT_COMM_EST: c_int = 4;

/// The errno of a uroce error.
pub(crate) fn errno(e: &Error) -> i32 {
    e.errno()
}

/// The calling thread's `errno`.
pub(crate) fn last_errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

// ---------------------------------------------------------------- channels

/// Every live event channel of this library, by the address of its
/// `rdma_event_channel` (whose `fd` is the uroce channel's descriptor,
/// readable while an event waits), with its uroce half.
///
/// The C object holds nothing else, so a channel is looked up here, never
/// read through the program's pointer: a thread that calls
/// `rdma_get_cm_event` as another destroys the channel (rdmacm-utils 44's
/// `rping`, whose event thread loops on a channel its main thread
/// destroys before it returns) gets EBADF, as a read(2) of a closed kernel
/// descriptor does, and a thread already waiting keeps waiting on its own
/// reference, as a read(2) the kernel started does.
fn channels() -> &'static Mutex<HashMap<usize, EventChannel>> {
    static C: OnceLock<Mutex<HashMap<usize, EventChannel>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// The uroce half of a live channel: EINVAL for NULL, EBADF for an
/// address that is not (or no longer) a channel of this library.
pub(crate) fn chan(p: *mut rdma_event_channel) -> Result<EventChannel, i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    channels()
        .lock()
        .get(&(p as usize))
        .cloned()
        .ok_or(libc::EBADF)
}

/// A new channel, with a blocking descriptor as the kernel's:
/// `rdma_get_cm_event` (and a synchronous id's calls, which read their own
/// channel as librdmacm's do) wait in a `read(2)` of it, which a signal
/// handler interrupts (EINTR) or, with `SA_RESTART`, the kernel restarts;
/// a program that sets `O_NONBLOCK` gets EAGAIN instead of a wait.
fn new_channel() -> Result<*mut rdma_event_channel, i32> {
    let rust = EventChannel::new().map_err(|e| errno(&e))?;
    let fd = rust.as_raw_fd();
    crate::make_blocking(fd);
    let p = Box::into_raw(Box::new(rdma_event_channel { fd }));
    channels().lock().insert(p as usize, rust);
    Ok(p)
}

/// Takes a channel out of the registry and frees its C object; the uroce
/// half goes with the last reference (a waiting thread may hold one).
/// None if `p` is not a live channel of this library.
///
/// # Safety
/// `p` is NULL or a pointer the program got from this library.
unsafe fn close_channel(p: *mut rdma_event_channel) -> Option<EventChannel> {
    let rust = channels().lock().remove(&(p as usize))?;
    // SAFETY: registered, so made by Box::into_raw in new_channel and not
    // yet freed; out of the registry now, so freed once.
    drop(unsafe { Box::from_raw(p) });
    Some(rust)
}

/// Frees a synchronous id's channel made by [`new_channel`]: what is
/// still queued for the (destroyed) id goes, so that nothing keeps the
/// uroce id alive through it. Its descriptor goes non-blocking first, so
/// that the last read does not wait.
///
/// # Safety
/// `p` is such a channel, not used afterwards.
unsafe fn free_channel(p: *mut rdma_event_channel) {
    // SAFETY: the caller's promise.
    if let Some(rust) = unsafe { close_channel(p) } {
        crate::make_nonblocking(rust.as_raw_fd());
        while rust.try_get_event().is_ok() {}
    }
}

#[no_mangle]
unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    ptr_result(new_channel)
}

#[no_mangle]
unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    guard((), || {
        // Ids on it keep the uroce channel alive; their events still go
        // there. A pointer that is not a live channel is left alone.
        // SAFETY: the program's pointer, checked against the registry.
        drop(unsafe { close_channel(channel) });
    })
}

// ---------------------------------------------------------------- ids

/// An rdma_cm id: `rdma_cm_id` first, then the library's state.
#[repr(C)]
pub(crate) struct Id {
    pub c: rdma_cm_id,
    pub inner: IdInner,
}

pub(crate) struct IdInner {
    pub st: Mutex<IdSt>,
    /// Signalled when an event naming the id is acknowledged.
    acked: Condvar,
}

pub(crate) struct IdSt {
    /// The uroce id (None once destroyed).
    pub rust: Option<CmId>,
    /// Events naming the id not yet acknowledged, and pins.
    refs: usize,
    /// The thread that got each event naming the id that the program has
    /// not acknowledged yet: `rdma_destroy_id` waits for the others'.
    holders: Vec<ThreadId>,
    destroyed: bool,
    /// Synchronous: `id->channel` is its own (made by this library).
    pub sync: bool,
    /// The path record `id->route.path_rec` points to.
    path: Box<ibv_sa_path_rec>,
    /// A passive endpoint's QP attributes (`rdma_create_ep`), for the
    /// QPs `rdma_get_request` creates.
    pub qp_init_attr: Option<Box<ibv_qp_init_attr>>,
    /// Private data `rdma_connect` puts first (`rdma_addrinfo::ai_connect`).
    pub connect: Vec<u8>,
    /// From a connection request: the defaults `rdma_accept` takes.
    resp_res: u8,
    init_depth: u8,
    /// `rdma_set_local_ece` (never sent: uroce has no ECE).
    pub local_ece: (u32, u32),
}

/// The library half of an id.
///
/// # Safety
/// `p` is NULL or a live id made by this library.
pub(crate) unsafe fn id<'a>(p: *mut rdma_cm_id) -> Result<&'a IdInner, i32> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise; only the Rust half is borrowed.
    Ok(unsafe { &*addr_of!((*p.cast::<Id>()).inner) })
}

impl IdInner {
    /// The uroce id (EINVAL once destroyed).
    pub fn cm(&self) -> Result<CmId, i32> {
        self.st.lock().rust.clone().ok_or(libc::EINVAL)
    }
    fn sync(&self) -> bool {
        self.st.lock().sync
    }
}

/// uroce id -> `*mut Id`, for every id not destroyed.
fn registry() -> &'static Mutex<HashMap<CmId, usize>> {
    static R: OnceLock<Mutex<HashMap<CmId, usize>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The id object of `cm`, pinned (one more reference, which [`release`]
/// drops): registered ids are live, and the pin, taken under the
/// registry's lock, keeps it so until released.
fn pin(cm: &CmId) -> Option<*mut rdma_cm_id> {
    let reg = registry().lock();
    let p = *reg.get(cm)? as *mut rdma_cm_id;
    // SAFETY: registered, so live (freed only after leaving the registry).
    unsafe { id(p) }.ok()?.st.lock().refs += 1;
    Some(p)
}

fn ps_of(ps: c_int) -> Result<PortSpace, i32> {
    u16::try_from(ps)
        .ok()
        .and_then(PortSpace::from_u16)
        .ok_or(libc::EINVAL)
}

/// A new id object for `cm`, registered.
fn new_id(
    cm: CmId,
    channel: *mut rdma_event_channel,
    sync: bool,
    context: *mut c_void,
) -> *mut rdma_cm_id {
    // SAFETY: all-zero is valid for every field of the C struct (pointers,
    // integers, socket address storage).
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = cm.port_space() as c_int;
    c.qp_type = cm.qp_type() as c_int;
    c.port_num = 1;
    let obj = Box::new(Id {
        c,
        inner: IdInner {
            st: Mutex::new(IdSt {
                rust: Some(cm.clone()),
                refs: 0,
                holders: Vec::new(),
                destroyed: false,
                sync,
                // SAFETY: plain data; all-zero is valid.
                path: Box::new(unsafe { std::mem::zeroed() }),
                qp_init_attr: None,
                connect: Vec::new(),
                resp_res: MAX_RES,
                init_depth: MAX_RES,
                local_ece: (0, 0),
            }),
            acked: Condvar::new(),
        },
    });
    let p = Box::into_raw(obj).cast::<rdma_cm_id>();
    registry().lock().insert(cm, p as usize);
    p
}

/// Drops a reference to an id (an event's, a pin); the last one of a
/// destroyed id frees it. Whichever of this and [`destroy_id`] makes the
/// final change sees `destroyed && refs == 0`, under the lock, once.
///
/// # Safety
/// `p` is a live id of this library that the caller holds a reference to.
unsafe fn release(p: *mut rdma_cm_id) {
    // SAFETY: the caller's promise.
    let Ok(inner) = (unsafe { id(p) }) else {
        return;
    };
    let free = {
        let mut st = inner.st.lock();
        st.refs = st.refs.saturating_sub(1);
        st.destroyed && st.refs == 0
    };
    if free {
        // SAFETY: destroyed and unreferenced: ours alone.
        unsafe { free_id(p) };
    }
}

/// # Safety
/// `p` is a destroyed id nothing references.
unsafe fn free_id(p: *mut rdma_cm_id) {
    // SAFETY: made by Box::into_raw in new_id; the caller's promise.
    let obj = unsafe { Box::from_raw(p.cast::<Id>()) };
    let sync = obj.inner.st.lock().sync;
    if sync && !obj.c.channel.is_null() {
        // SAFETY: a synchronous id's own channel, made by new_channel.
        unsafe { free_channel(obj.c.channel) };
    }
}

/// A socket address from C (AF_INET or AF_INET6).
///
/// # Safety
/// `sa` is NULL or points to a socket address of its family's size.
pub(crate) unsafe fn sockaddr_from_c(sa: *const sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's address; the family says how much to read.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = std::ptr::read_unaligned(sa.cast::<sockaddr_in>());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = std::ptr::read_unaligned(sa.cast::<sockaddr_in6>());
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    u32::from_be(s.sin6_flowinfo),
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// `a` as a C socket address in `out`.
pub(crate) fn sockaddr_to_c(a: SocketAddr, out: &mut sockaddr_storage) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *out = unsafe { std::mem::zeroed() };
    let p: *mut sockaddr_storage = out;
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: all-zero is a valid sockaddr_in.
            let mut s: sockaddr_in = unsafe { std::mem::zeroed() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            // SAFETY: sockaddr_storage holds any socket address.
            unsafe { p.cast::<sockaddr_in>().write(s) };
        }
        SocketAddr::V6(v6) => {
            // SAFETY: all-zero is a valid sockaddr_in6.
            let mut s: sockaddr_in6 = unsafe { std::mem::zeroed() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_flowinfo = v6.flowinfo().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            s.sin6_scope_id = v6.scope_id();
            // SAFETY: as above.
            unsafe { p.cast::<sockaddr_in6>().write(s) };
        }
    }
}

/// The port (network order) of a C socket address.
fn port_of(s: &sockaddr_storage) -> u16 {
    let p: *const sockaddr_storage = s;
    // SAFETY: the storage holds a socket address of its family (or zeroes).
    unsafe {
        match c_int::from(s.ss_family) {
            libc::AF_INET => (*p.cast::<sockaddr_in>()).sin_port,
            libc::AF_INET6 => (*p.cast::<sockaddr_in6>()).sin6_port,
            _ => 0,
        }
    }
}

/// Brings the C id up to date with the uroce id: addresses, GIDs, the
/// device's context and PD (once the id has a device), and with `route`
/// the one path (as the kernel's route query gives it).
///
/// # Safety
/// `p` is a live id of this library.
unsafe fn refresh(p: *mut rdma_cm_id, route: bool) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    let cm = inner.cm()?;
    let (src, dst) = (cm.src_addr(), cm.dst_addr());
    // SAFETY: the id's C half; the program reads it, only this library
    // writes these fields.
    let c = unsafe { &mut (*p.cast::<Id>()).c };
    // An id bound to the wildcard address has no device (yet).
    let ctx = cm
        .context()
        .filter(|_| src.is_some_and(|s| !uroce_rdmacm::cm::binds_any(s.ip())));
    // The device's own GID: the id's address may be one of its netdev's
    // (under `uroce exec`, see CmId::resolve_addr).
    let src_ip = ctx
        .as_ref()
        .map(|c| c.device().ip())
        .or(src.map(|s| s.ip()));
    if let (Some(s), Some(ip)) = (src, src_ip) {
        sockaddr_to_c(s, &mut c.route.addr.src_storage);
        c.route.addr.addr.sgid.raw = gid_of(ip.to_canonical());
    }
    // The GID the id's packets go to (the device's own for a destination
    // that names its netdev, as the kernel's cma_resolve_loopback).
    let dst_ip = cm.route_dst_ip();
    if let (Some(d), Some(ip)) = (dst, dst_ip) {
        sockaddr_to_c(d, &mut c.route.addr.dst_storage);
        c.route.addr.addr.dgid.raw = gid_of(ip.to_canonical());
    }
    c.route.addr.addr.pkey = 0xffff;
    if let Some(ctx) = ctx {
        if c.verbs.is_null() {
            let (verbs, pd) = crate::device::cm_context(ctx.device().name())?;
            c.verbs = verbs;
            if c.pd.is_null() {
                c.pd = pd;
            }
            c.port_num = 1;
        }
        if route {
            if let (Some(s), Some(d)) = (src_ip, dst_ip) {
                let mtu = ctx.query_port(1).map_or(3, |a| a.active_mtu as u8);
                let mut st = inner.st.lock();
                let path = &mut *st.path;
                *path = ibv_sa_path_rec {
                    dgid: ibv_gid {
                        raw: gid_of(d.to_canonical()),
                    },
                    sgid: ibv_gid {
                        raw: gid_of(s.to_canonical()),
                    },
                    dlid: 0,
                    slid: 0,
                    raw_traffic: 0,
                    flow_label: 0,
                    hop_limit: 64,
                    // RDMA_OPTION_ID_TOS, as the kernel's route carries it.
                    traffic_class: cm.route_tos(),
                    reversible: 1,
                    numb_path: 1,
                    pkey: 0xffff,
                    sl: 0,
                    mtu_selector: 2,
                    mtu,
                    rate_selector: 2,
                    rate: 3, // IB_RATE_10_GBPS, as the kernel reports a software device
                    packet_life_time_selector: 2,
                    packet_life_time: 16, // the kernel's CMA_IBOE_PACKET_LIFETIME
                    preference: 0,
                };
                c.route.path_rec = path;
                c.route.num_paths = 1;
            }
        }
    }
    Ok(())
}

#[no_mangle]
unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    minus_one_result(|| {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let ps = ps_of(ps)?;
        let qp_type = match ps {
            PortSpace::Udp | PortSpace::Ipoib => QpType::Ud,
            _ => QpType::Rc,
        };
        // SAFETY: the caller's out-parameter.
        unsafe { *out = create_id(channel, context, ps, qp_type)? };
        Ok(())
    })
}

/// `rdma_create_id2`: an id on `channel`, or (NULL) a synchronous id with
/// a channel of its own.
pub(crate) fn create_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: PortSpace,
    qp_type: QpType,
) -> Result<*mut rdma_cm_id, i32> {
    let (ch, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel, false)
    };
    // SAFETY: a channel of this library (the caller's, or just made).
    let chi = chan(ch)?;
    match CmId::with_type(&chi, ps, qp_type) {
        Ok(cm) => Ok(new_id(cm, ch, sync, context)),
        Err(e) => {
            if sync {
                // SAFETY: just made, unused.
                unsafe { free_channel(ch) };
            }
            Err(errno(&e))
        }
    }
}

#[no_mangle]
unsafe extern "C" fn rdma_destroy_id(p: *mut rdma_cm_id) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        unsafe { destroy_id(p) }
    })
}

/// `rdma_destroy_id`: the uroce id goes at once (the connection is torn
/// down as its state says); the C object when no event names it.
///
/// # Safety
/// `p` is NULL or a live id of this library.
pub(crate) unsafe fn destroy_id(p: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    // SAFETY: the id's C half.
    let ev = unsafe { std::mem::replace(&mut (*p).event, null_mut()) };
    if !ev.is_null() {
        // SAFETY: an event of this library that the id kept.
        unsafe { ack_event(ev)? };
    }
    // Out of the registry first: no event can pin the id afterwards.
    let cm = inner.st.lock().rust.take().ok_or(libc::EINVAL)?;
    registry().lock().remove(&cm);
    multicast::forget_mc_contexts(p);
    // Torn down now: queued events may hold the Rust id a while longer.
    cm.destroy();
    drop(cm);
    let free = {
        let mut st = inner.st.lock();
        // librdmacm's rdma_destroy_id returns once every event naming the
        // id that the program was given is acknowledged (rping's main
        // thread relies on it: its event thread is still handling
        // DISCONNECTED). Events this thread holds are not waited for: a
        // program that destroys an id under its own unacknowledged event
        // would wait forever on librdmacm; here the id goes with the ack.
        let me = std::thread::current().id();
        while st.holders.iter().any(|t| *t != me) {
            inner.acked.wait(&mut st);
        }
        st.destroyed = true;
        st.refs == 0
    };
    if free {
        // SAFETY: destroyed and unreferenced: ours alone.
        unsafe { free_id(p) };
    }
    Ok(())
}

/// `qp` is being destroyed with `ibv_destroy_qp`: the id it belongs to (if
/// any) forgets it, in uroce and in `id->qp` (librdmacm would leave the
/// pointer dangling; this library touches `id->qp` on later events).
pub(crate) fn forget_qp(qp: *mut ibv_qp) {
    for (cm, &p) in registry().lock().iter() {
        let p = p as *mut rdma_cm_id;
        // SAFETY: registered ids are live; only this library writes qp.
        if unsafe { (*p).qp } == qp {
            cm.detach_qp();
            // SAFETY: as above.
            unsafe { (*p).qp = null_mut() };
        }
    }
}

#[no_mangle]
unsafe extern "C" fn rdma_bind_addr(p: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    // SAFETY: an id of this library, the caller's address.
    minus_one_result(|| unsafe { bind_addr(p, addr) })
}

// What other modules call is a plain function: Rust code never calls a
// versioned symbol (see `crate::symbol_versions`).

/// `rdma_bind_addr`.
///
/// # Safety
/// `p` is NULL or a live id of this library; `addr` NULL or an address.
pub(crate) unsafe fn bind_addr(p: *mut rdma_cm_id, addr: *const sockaddr) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    // SAFETY: the caller's address.
    let a = unsafe { sockaddr_from_c(addr) }.ok_or(libc::EINVAL)?;
    inner.cm()?.bind_addr(a).map_err(|e| errno(&e))?;
    // SAFETY: as above.
    unsafe { refresh(p, false) }
}

#[no_mangle]
unsafe extern "C" fn rdma_resolve_addr(
    p: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    // SAFETY: an id of this library, the caller's addresses.
    minus_one_result(|| unsafe { resolve_addr(p, src, dst) })
}

/// `rdma_resolve_addr` (uroce resolves at once: no timeout).
///
/// # Safety
/// `p` is NULL or a live id of this library; the addresses NULL or valid.
pub(crate) unsafe fn resolve_addr(
    p: *mut rdma_cm_id,
    src: *const sockaddr,
    dst: *const sockaddr,
) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    // SAFETY: the caller's addresses.
    let d = unsafe { sockaddr_from_c(dst) }.ok_or(libc::EINVAL)?;
    let s = if src.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { sockaddr_from_c(src) }.ok_or(libc::EINVAL)?)
    };
    inner.cm()?.resolve_addr(s, d).map_err(|e| errno(&e))?;
    // SAFETY: the id's C half (librdmacm copies the destination at once).
    sockaddr_to_c(d, unsafe { &mut (*p).route.addr.dst_storage });
    // SAFETY: as above.
    unsafe { complete(p) }
}

#[no_mangle]
unsafe extern "C" fn rdma_resolve_route(p: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    // SAFETY: an id of this library (the caller's contract).
    minus_one_result(|| unsafe { resolve_route(p) })
}

/// `rdma_resolve_route`.
///
/// # Safety
/// `p` is NULL or a live id of this library.
pub(crate) unsafe fn resolve_route(p: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    inner.cm()?.resolve_route().map_err(|e| errno(&e))?;
    // SAFETY: as above.
    unsafe { complete(p) }
}

#[no_mangle]
unsafe extern "C" fn rdma_listen(p: *mut rdma_cm_id, backlog: c_int) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        let cm = inner.cm()?;
        if cm.src_addr().is_none() {
            // As the kernel's rdma_listen: an unbound id listens on every
            // IPv4 address, on a port of its choosing.
            let any = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            cm.bind_addr(any).map_err(|e| errno(&e))?;
        }
        cm.listen(backlog).map_err(|e| errno(&e))?;
        // SAFETY: as above.
        unsafe { refresh(p, false) }
    })
}

/// The device's limit for responder resources / initiator depth.
fn max_rd_atomic(p: *mut rdma_cm_id) -> u8 {
    // SAFETY: a live id (checked by the caller).
    let inner = unsafe { id(p) };
    inner
        .ok()
        .and_then(|i| i.cm().ok())
        .and_then(|c| c.context())
        .map_or(MAX_RES, |c| {
            u8::try_from(c.query_device().max_qp_rd_atom).unwrap_or(MAX_RES)
        })
}

/// librdmacm's `ucma_valid_param`: on RDMA_PS_TCP, an id without a QP
/// needs parameters, and explicit resources within the device's limits.
fn valid_param(p: *mut rdma_cm_id, param: *const rdma_conn_param) -> Result<(), i32> {
    // SAFETY: a live id (checked by the caller); the caller's parameters.
    let (ps, qp) = unsafe { ((*p).ps, (*p).qp) };
    if ps != PortSpace::Tcp as c_int {
        return Ok(());
    }
    if qp.is_null() && param.is_null() {
        return Err(libc::EINVAL);
    }
    if param.is_null() {
        return Ok(());
    }
    // SAFETY: as above.
    let prm = unsafe { &*param };
    let max = max_rd_atomic(p);
    if (prm.responder_resources != MAX_RES && prm.responder_resources > max)
        || (prm.initiator_depth != MAX_RES && prm.initiator_depth > max)
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// The private data of C parameters.
///
/// # Safety
/// `data` points to `len` readable bytes (or `len` is 0).
unsafe fn pdata(data: *const c_void, len: u8) -> Result<Vec<u8>, i32> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if data.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len as usize) }.to_vec())
}

#[no_mangle]
unsafe extern "C" fn rdma_connect(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        valid_param(p, param)?;
        let max = max_rd_atomic(p);
        let mut cp = ConnParam::default();
        let prefix = std::mem::take(&mut inner.st.lock().connect);
        cp.private_data = prefix;
        if param.is_null() {
            cp.responder_resources = max;
            cp.initiator_depth = max;
        } else {
            // SAFETY: the caller's parameters.
            let prm = unsafe { &*param };
            let or_max = |v: u8| if v == MAX_RES { max } else { v };
            cp.responder_resources = or_max(prm.responder_resources);
            cp.initiator_depth = or_max(prm.initiator_depth);
            cp.flow_control = prm.flow_control != 0;
            cp.retry_count = prm.retry_count;
            cp.rnr_retry_count = prm.rnr_retry_count;
            cp.srq = prm.srq != 0;
            cp.qp_num = prm.qp_num;
            // SAFETY: the caller's private data.
            cp.private_data
                .extend(unsafe { pdata(prm.private_data, prm.private_data_len)? });
        }
        inner.cm()?.connect(&cp).map_err(|e| errno(&e))?;
        // SAFETY: as above.
        unsafe { complete(p) }
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_accept(p: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        // SAFETY: the id's C half.
        let (qp, qp_type) = unsafe { ((*p).qp, (*p).qp_type) };
        if qp.is_null() && param.is_null() {
            return Err(libc::EINVAL);
        }
        valid_param(p, param)?;
        let max = max_rd_atomic(p);
        let (resp_res, init_depth) = {
            let st = inner.st.lock();
            (st.resp_res.min(max), st.init_depth.min(max))
        };
        let mut cp = ConnParam {
            responder_resources: resp_res,
            initiator_depth: init_depth,
            ..ConnParam::default()
        };
        if !param.is_null() {
            // SAFETY: the caller's parameters.
            let prm = unsafe { &*param };
            if prm.responder_resources != MAX_RES {
                cp.responder_resources = prm.responder_resources;
            }
            if prm.initiator_depth != MAX_RES {
                cp.initiator_depth = prm.initiator_depth;
            }
            cp.flow_control = prm.flow_control != 0;
            cp.rnr_retry_count = prm.rnr_retry_count;
            cp.srq = prm.srq != 0;
            cp.qp_num = prm.qp_num;
            // SAFETY: the caller's private data.
            cp.private_data = unsafe { pdata(prm.private_data, prm.private_data_len)? };
        }
        let r = inner.cm()?.accept(&cp).map_err(|e| errno(&e));
        // SAFETY: the id's QP, if any, is a QP of this library.
        unsafe { qp::sync_qp_state(qp) };
        r?;
        if qp_type == QPT_UD {
            if inner.sync() {
                // SAFETY: the id's C half; the event it kept.
                let ev = unsafe { std::mem::replace(&mut (*p).event, null_mut()) };
                if !ev.is_null() {
                    // SAFETY: an event of this library.
                    unsafe { ack_event(ev)? };
                }
            }
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { complete(p) }
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_reject(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: an id of this library, the caller's private data.
    minus_one_result(|| unsafe { reject(p, data, len) })
}

/// As `rdma_reject` (uroce's REJ carries reason 28, consumer reject; the
/// ECE reason 35 is not distinguished).
#[no_mangle]
unsafe extern "C" fn rdma_reject_ece(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int {
    // SAFETY: as above.
    minus_one_result(|| unsafe { reject(p, data, len) })
}

/// # Safety
/// `p` is NULL or a live id of this library; `data` has `len` bytes.
unsafe fn reject(p: *mut rdma_cm_id, data: *const c_void, len: u8) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    // SAFETY: the caller's private data.
    let d = unsafe { pdata(data, len)? };
    inner.cm()?.reject(&d).map_err(|e| errno(&e))
}

/// `IBV_EVENT_COMM_EST`: the QP saw the peer's traffic before the RTU.
/// Other events: EINVAL, as the kernel's CM answers them on RoCE.
#[no_mangle]
unsafe extern "C" fn rdma_notify(p: *mut rdma_cm_id, event: c_int) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        if event != EVENT_COMM_EST {
            return Err(libc::EINVAL);
        }
        inner.cm()?.notify_established().map_err(|e| errno(&e))
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_establish(p: *mut rdma_cm_id) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        // SAFETY: the id's C half.
        if !unsafe { (*p).qp }.is_null() {
            return Err(libc::EINVAL);
        }
        inner.cm()?.establish().map_err(|e| errno(&e))
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_disconnect(p: *mut rdma_cm_id) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        // librdmacm's ucma_shutdown: an id without a device is EINVAL.
        // SAFETY: the id's C half.
        let (verbs, qp) = unsafe { ((*p).verbs, (*p).qp) };
        if verbs.is_null() {
            return Err(libc::EINVAL);
        }
        let r = inner.cm()?.disconnect().map_err(|e| errno(&e));
        // SAFETY: the id's QP, if any, is a QP of this library.
        unsafe { qp::sync_qp_state(qp) };
        r?;
        // SAFETY: as above.
        unsafe { complete(p) }
    })
}

#[no_mangle]
unsafe extern "C" fn rdma_migrate_id(
    p: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    // SAFETY: an id and a channel of this library (the caller's contract).
    minus_one_result(|| unsafe { migrate_id(p, channel) })
}

/// `rdma_migrate_id`: the id's events (also those queued) go to `channel`,
/// or (NULL) to a new channel of its own, making it synchronous.
///
/// # Safety
/// `p` is NULL or a live id, `channel` NULL or a live channel, of this
/// library.
unsafe fn migrate_id(p: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    let cm = inner.cm()?;
    let was_sync = inner.sync();
    if was_sync && channel.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the id's C half.
    let old = unsafe { (*p).channel };
    let (to, sync) = if channel.is_null() {
        (new_channel()?, true)
    } else {
        (channel, false)
    };
    // SAFETY: a channel of this library.
    let chi = chan(to)?;
    cm.migrate(&chi);
    if was_sync {
        // SAFETY: the id's C half; the event it kept.
        let ev = unsafe { std::mem::replace(&mut (*p).event, null_mut()) };
        if !ev.is_null() {
            // SAFETY: an event of this library.
            unsafe { ack_event(ev)? };
        }
    }
    inner.st.lock().sync = sync;
    // SAFETY: the id's C half.
    unsafe { (*p).channel = to };
    if was_sync {
        // SAFETY: the id's own channel, emptied by migrate.
        unsafe { free_channel(old) };
    }
    Ok(())
}

#[no_mangle]
unsafe extern "C" fn rdma_get_src_port(p: *mut rdma_cm_id) -> u16 {
    if p.is_null() {
        set_errno(libc::EINVAL);
        return 0;
    }
    // SAFETY: an id of this library (the caller's contract).
    port_of(unsafe { &(*p).route.addr.src_storage })
}

#[no_mangle]
unsafe extern "C" fn rdma_get_dst_port(p: *mut rdma_cm_id) -> u16 {
    if p.is_null() {
        set_errno(libc::EINVAL);
        return 0;
    }
    // SAFETY: an id of this library (the caller's contract).
    port_of(unsafe { &(*p).route.addr.dst_storage })
}

/// `rdma_set_option` as the kernel answers it on RoCE: `RDMA_OPTION_ID`
/// takes TOS and ACK_TIMEOUT (one byte; ACK_TIMEOUT only on RC ids),
/// REUSEADDR and AFONLY (an int); AFONLY restricts the id to its address
/// family (`CmId::set_afonly`), REUSEADDR is accepted (ports are not
/// reused); ACK_TIMEOUT is the local QP's ACK timeout at RTS
/// (`CmId::set_ack_timeout`); TOS is the traffic
/// class of the REQ's path, so of both QPs' packets, from the next
/// connect on; `RDMA_OPTION_IB` takes
/// `RDMA_OPTION_IB_PATH` (an array of `ibv_path_data`), which resolves
/// the route. A wrong length is EINVAL; any other level or option ENOSYS.
#[no_mangle]
unsafe extern "C" fn rdma_set_option(
    p: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: libc::size_t,
) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(p)? };
        if optval.is_null() {
            return Err(libc::EFAULT);
        }
        let byte = optlen == 1;
        let int = optlen == std::mem::size_of::<c_int>();
        match (level, optname) {
            (0, 0) => {
                // TOS
                if !byte {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the caller's one byte (checked non-null).
                inner.cm()?.set_tos(unsafe { *optval.cast::<u8>() });
                Ok(())
            }
            (0, 1) => int.then_some(()).ok_or(libc::EINVAL), // REUSEADDR
            (0, 2) => {
                // AFONLY
                if !int {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the caller's int (optlen checked).
                let v = unsafe { optval.cast::<c_int>().read_unaligned() };
                inner.cm()?.set_afonly(v != 0).map_err(|e| errno(&e))
            }
            (0, 3) => {
                // ACK_TIMEOUT
                if !byte {
                    return Err(libc::EINVAL);
                }
                // SAFETY: the caller's one byte (checked non-null).
                let t = unsafe { *optval.cast::<u8>() };
                inner.cm()?.set_ack_timeout(t).map_err(|e| errno(&e))
            }
            (1, 1) => {
                // IB_PATH
                if optlen == 0 || optlen % IBV_PATH_DATA_SIZE != 0 {
                    return Err(libc::EINVAL);
                }
                inner.cm()?.resolve_route().map_err(|e| errno(&e))?;
                // SAFETY: as above.
                unsafe { complete(p) }
            }
            _ => Err(libc::ENOSYS),
        }
    })
}

// ---------------------------------------------------------------- events

/// An event: `rdma_cm_event`, then the private data it points to and the
/// ids it names.
#[repr(C)]
struct Event {
    c: rdma_cm_event,
    pdata: Vec<u8>,
    /// The ids it holds references to (`c.id`, `c.listen_id`, which the
    /// program could overwrite).
    ids: [*mut rdma_cm_id; 2],
    /// The thread `rdma_get_cm_event` (or a synchronous call) gave it to.
    owner: Option<ThreadId>,
}

/// A connection request's new id, on the listener's channel (or, for a
/// synchronous listener, a channel of its own, as librdmacm does), with
/// one reference for the event.
///
/// # Safety
/// `lp` is a live (pinned) id of this library.
unsafe fn new_child(lp: *mut rdma_cm_id, ev: &CmEvent) -> Option<*mut rdma_cm_id> {
    // SAFETY: the caller's promise; fields read one by one.
    let (channel, context, ps) = unsafe { ((*lp).channel, (*lp).context, (*lp).ps) };
    // SAFETY: as above.
    let sync = unsafe { id(lp) }.ok()?.sync();
    let child = new_id(ev.id.clone(), channel, false, context);
    // SAFETY: just made.
    unsafe {
        (*child).ps = ps;
        let mut st = id(child).ok()?.st.lock();
        st.refs = 1;
        // The defaults rdma_accept takes.
        st.resp_res = ev.conn.responder_resources;
        st.init_depth = ev.conn.initiator_depth;
    }
    // SAFETY: as above.
    if sync && unsafe { migrate_id(child, null_mut()) }.is_err() {
        // SAFETY: as above; nothing else knows it.
        unsafe {
            let _ = destroy_id(child);
            release(child);
        }
        return None;
    }
    Some(child)
}

/// The C event for a uroce event, and the ids it names brought up to date
/// (a connection request's new id made), or None if the event is about an
/// id the program destroyed (as the kernel drops those).
///
/// # Safety
/// Ids in the registry are live.
unsafe fn convert(ev: CmEvent) -> Option<*mut rdma_cm_event> {
    // Each id the event names holds a reference for it: pinned, or (a
    // connection request's new id) made with one.
    let (p, listen) = if ev.event == CmEventType::ConnectRequest {
        let lp = pin(ev.listen_id.as_ref()?)?;
        // SAFETY: pinned.
        match unsafe { new_child(lp, &ev) } {
            Some(child) => (child, lp),
            None => {
                // SAFETY: pinned above.
                unsafe { release(lp) };
                return None;
            }
        }
    } else {
        (pin(&ev.id)?, null_mut())
    };
    let fail = || {
        // SAFETY: the references taken above; a new id goes entirely.
        unsafe {
            if !listen.is_null() {
                let _ = destroy_id(p);
                release(listen);
            }
            release(p);
        }
        None
    };
    let route = matches!(
        ev.event,
        CmEventType::RouteResolved | CmEventType::ConnectRequest | CmEventType::Established
    );
    // SAFETY: a live id of this library.
    if unsafe { refresh(p, route) }.is_err() {
        return fail();
    }
    // SAFETY: the id's C half.
    let qp = unsafe { (*p).qp };
    if ev.event == CmEventType::Rejected {
        // librdmacm moves the QP of a rejected connection to ERR.
        // SAFETY: a QP of this library.
        unsafe { qp::qp_to_err(qp) };
    }
    // SAFETY: as above.
    unsafe { qp::sync_qp_state(qp) };
    // SAFETY: as above.
    let is_ud = unsafe { (*p).qp_type } == QPT_UD;
    let mut obj = Box::new(Event {
        // SAFETY: all-zero is valid for the C event (pointers, integers).
        c: unsafe { std::mem::zeroed() },
        pdata: Vec::new(),
        ids: [p, listen],
        owner: None,
    });
    obj.c.id = p;
    obj.c.listen_id = listen;
    obj.c.event = ev.event as c_int;
    obj.c.status = ev.status;
    match (&ev.ud, is_ud) {
        (Some(ud), true) => {
            obj.pdata = ud.private_data.clone();
            let mut ah = crate::ah::ah_attr_of(&ud.ah_attr);
            ah.port_num = 1;
            obj.c.param.ud = rdma_ud_param {
                private_data: std::ptr::null(),
                private_data_len: obj.pdata.len().min(255) as u8,
                ah_attr: ah,
                qp_num: ud.qp_num,
                qkey: ud.qkey,
            };
            if !obj.pdata.is_empty() {
                obj.c.param.ud.private_data = obj.pdata.as_ptr().cast();
            }
            if matches!(
                ev.event,
                CmEventType::MulticastJoin | CmEventType::MulticastError
            ) {
                // librdmacm: the context the group was joined with.
                obj.c.param.ud.private_data = multicast::mc_context(p, &ud.ah_attr.dgid);
            }
        }
        _ => {
            let c = &ev.conn;
            obj.pdata = c.private_data.clone();
            obj.c.param.conn = rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: obj.pdata.len().min(255) as u8,
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                flow_control: c.flow_control as u8,
                retry_count: c.retry_count,
                rnr_retry_count: c.rnr_retry_count,
                srq: c.srq as u8,
                qp_num: c.qp_num,
            };
            if !obj.pdata.is_empty() {
                obj.c.param.conn.private_data = obj.pdata.as_ptr().cast();
            }
        }
    }
    Some(Box::into_raw(obj).cast())
}

/// The next event on a channel (waiting for it if `block`), converted.
///
/// # Safety
/// `channel` is a live channel of this library.
unsafe fn next_event(
    channel: *mut rdma_event_channel,
    block: bool,
) -> Result<*mut rdma_cm_event, i32> {
    // A clone: a wait does not touch the C object, which the program may
    // destroy meanwhile (as it may close a kernel channel's descriptor).
    // SAFETY: the caller's promise.
    let ch = chan(channel)?;
    loop {
        let ev = if block {
            ch.get_event()
        } else {
            ch.try_get_event()
        }
        .map_err(|e| errno(&e))?;
        // SAFETY: as above.
        if let Some(e) = unsafe { convert(ev) } {
            // SAFETY: just made by convert, not yet the program's.
            unsafe { hand_over(e) };
            return Ok(e);
        }
    }
}

#[no_mangle]
unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    minus_one_result(|| {
        let ch = chan(channel)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let block = !crate::is_nonblocking(ch.as_raw_fd());
        // SAFETY: as above; the caller's out-parameter.
        unsafe { *out = next_event(channel, block)? };
        Ok(())
    })
}

/// Frees an event; the ids it names may go with it.
///
/// # Safety
/// `ev` is NULL or a live event of this library, not used afterwards.
unsafe fn ack_event(ev: *mut rdma_cm_event) -> Result<(), i32> {
    if ev.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: made by Box::into_raw in convert.
    let obj = unsafe { Box::from_raw(ev.cast::<Event>()) };
    for q in obj.ids {
        if q.is_null() {
            continue;
        }
        if let Some(owner) = obj.owner {
            // SAFETY: the event's reference keeps the id live.
            if let Ok(inner) = unsafe { id(q) } {
                let mut st = inner.st.lock();
                if let Some(i) = st.holders.iter().position(|t| *t == owner) {
                    st.holders.swap_remove(i);
                }
                inner.acked.notify_all();
            }
        }
        // SAFETY: the event's reference to the id.
        unsafe { release(q) };
    }
    Ok(())
}

/// An event goes to the calling thread: the ids it names record it, so
/// that `rdma_destroy_id` on another thread waits for its acknowledgement.
///
/// # Safety
/// `ev` was just made by [`convert`] and is not yet the program's.
unsafe fn hand_over(ev: *mut rdma_cm_event) {
    let me = std::thread::current().id();
    // SAFETY: the caller's promise: ours alone.
    let obj = unsafe { &mut *ev.cast::<Event>() };
    obj.owner = Some(me);
    for q in obj.ids {
        // SAFETY: the event's reference keeps the id live.
        if let Ok(inner) = unsafe { id(q) } {
            inner.st.lock().holders.push(me);
        }
    }
}

#[no_mangle]
unsafe extern "C" fn rdma_ack_cm_event(ev: *mut rdma_cm_event) -> c_int {
    minus_one_result(|| {
        // SAFETY: an event of this library (the caller's contract).
        unsafe { ack_event(ev) }
    })
}

/// A synchronous id's wait (librdmacm's `ucma_complete`): the event the
/// call just caused, kept in `id->event`; its status as errno
/// (ECONNREFUSED for a rejection).
///
/// # Safety
/// `p` is a live id of this library.
pub(crate) unsafe fn complete(p: *mut rdma_cm_id) -> Result<(), i32> {
    // SAFETY: the caller's promise.
    let inner = unsafe { id(p)? };
    if !inner.sync() {
        return Ok(());
    }
    // SAFETY: the id's C half.
    let old = unsafe { std::mem::replace(&mut (*p).event, null_mut()) };
    if !old.is_null() {
        // SAFETY: an event of this library the id kept.
        unsafe { ack_event(old)? };
    }
    // SAFETY: the id's own channel.
    let ev = unsafe { next_event((*p).channel, true)? };
    // SAFETY: the id's C half; a live event.
    let (event, status) = unsafe {
        (*p).event = ev;
        ((*ev).event, (*ev).status)
    };
    if status != 0 {
        return Err(if event == CmEventType::Rejected as c_int {
            libc::ECONNREFUSED
        } else {
            status.abs()
        });
    }
    Ok(())
}

/// `rdma_get_request`: a synchronous listener's next connection request,
/// its new id with a QP if the listener was made by `rdma_create_ep` with
/// QP attributes.
#[no_mangle]
unsafe extern "C" fn rdma_get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> c_int {
    minus_one_result(|| {
        // SAFETY: an id of this library (the caller's contract).
        let inner = unsafe { id(listen)? };
        if !inner.sync() || out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id's C half.
        let old = unsafe { std::mem::replace(&mut (*listen).event, null_mut()) };
        if !old.is_null() {
            // SAFETY: an event of this library the id kept.
            unsafe { ack_event(old)? };
        }
        // SAFETY: the listener's own channel.
        let ev = unsafe { next_event((*listen).channel, true)? };
        // SAFETY: a live event.
        let (event, status, child) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let fail = |e: i32| {
            // SAFETY: the id's C half.
            unsafe { (*listen).event = ev };
            Err(e)
        };
        if event == CmEventType::Rejected as c_int {
            return fail(libc::ECONNREFUSED);
        }
        if status != 0 {
            return fail(status.abs());
        }
        if event != CmEventType::ConnectRequest as c_int {
            return fail(libc::EINVAL);
        }
        let attr = inner.st.lock().qp_init_attr.as_deref().copied();
        if let Some(mut a) = attr {
            // SAFETY: the listener's C half; the new id.
            let pd = unsafe { (*listen).pd };
            // SAFETY: the new id, live.
            if let Err(e) = unsafe { qp::create_qp(child, pd, &mut a) } {
                return fail(e);
            }
        }
        // SAFETY: the new id and the caller's out-parameter.
        unsafe {
            (*child).event = ev;
            *out = child;
        }
        Ok(())
    })
}
