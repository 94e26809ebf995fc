//! librdmacm's rsocket calls (`rdma/rsocket.h`) on
//! [`uroce_rdmacm::rsocket::RSocket`], so rdmacm-utils' `rstream` and
//! Debian's `librspreload.so` (which moves an unmodified TCP program onto
//! rsockets) run on uroce. A stream socket's number is its CM channel's
//! descriptor, as in librdmacm: unique while the socket lives, and
//! readable when a connection request waits on a listening socket.
//!
//! Datagram sockets too: `rsocket(.., SOCK_DGRAM, ..)` makes a datagram
//! rsocket (`DSocket`, rsocket.c's `ds_*`: a UDP socket and a UD QP per
//! local address it sends from), whose number is its UDP socket's
//! descriptor; rdmacm-utils' `udpong` runs on it. Other socket types and
//! address families fail with EOPNOTSUPP. `riomap`/`riowrite` work once
//! the peer offers an iomap (`RDMA_IOMAPSIZE`; 0 by default, as
//! rsocket.c's).

use super::sockaddr_from_c;
use crate::{guard, set_errno};
use libc::{c_int, c_long, c_void, size_t, sockaddr, socklen_t, ssize_t};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use uroce_rdmacm::rsocket::{RSocket, RdmaOpt};
use uroce_rdmacm::rsocket_dgram::DSocket;

crate::symbol_versions! {
    "RDMACM_1.0": [rsocket, rbind, rlisten, raccept, rconnect, rshutdown, rclose, rrecv,
                   rrecvfrom, rrecvmsg, rsend, rsendto, rsendmsg, rread, rreadv, rwrite, rwritev,
                   rpoll, rselect, rgetpeername, rgetsockname, rsetsockopt, rgetsockopt, rfcntl,
                   riomap, riounmap, riowrite]
}

/// `SOL_RDMA` and its options (rsocket.h).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
/// `tcpi_state` values (`netinet/tcp.h`).
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE: u8 = 7;

/// A socket of the table: stream or datagram.
#[derive(Clone)]
enum Sock {
    Stream(Arc<RSocket>),
    Dgram(Arc<DSocket>),
}

fn table() -> &'static Mutex<HashMap<c_int, Sock>> {
    static T: OnceLock<Mutex<HashMap<c_int, Sock>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn lookup_any(s: c_int) -> Result<Sock, i32> {
    table().lock().get(&s).cloned().ok_or(libc::EBADF)
}

/// A stream socket (`EOPNOTSUPP` for a datagram one).
fn lookup(s: c_int) -> Result<Arc<RSocket>, i32> {
    match lookup_any(s)? {
        Sock::Stream(r) => Ok(r),
        Sock::Dgram(_) => Err(libc::EOPNOTSUPP),
    }
}

fn errno_of(e: io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// -1 with errno, or the value.
fn ret<T: TryInto<R>, R: From<i8>>(f: impl FnOnce() -> Result<T, i32>) -> R {
    guard(R::from(-1), || match f() {
        Ok(v) => v.try_into().unwrap_or(R::from(-1)),
        Err(e) => {
            set_errno(e);
            R::from(-1)
        }
    })
}

/// Writes `a` to the caller's `addr`/`addrlen` (truncating as
/// getsockname does).
///
/// # Safety
/// NULL, or `addrlen` readable and writable and `addr` at least
/// `*addrlen` bytes.
unsafe fn put_addr(a: Option<std::net::SocketAddr>, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: zeroed sockaddr_storage is a valid value.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let n = match a {
        Some(a) => {
            super::sockaddr_to_c(a, &mut st);
            if a.is_ipv4() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        }
        None => std::mem::size_of::<libc::sockaddr_in>(),
    };
    // SAFETY: the caller's promise on both pointers.
    unsafe {
        let room = (*len as usize).min(n);
        std::ptr::copy_nonoverlapping(
            (&st as *const libc::sockaddr_storage).cast::<u8>(),
            addr.cast(),
            room,
        );
        *len = n as socklen_t;
    }
}

/// The socket address at `addr`.
///
/// # Safety
/// NULL or `len` readable bytes at `addr`.
unsafe fn get_addr(addr: *const sockaddr, len: socklen_t) -> Result<std::net::SocketAddr, i32> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sockaddr_in>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    unsafe { sockaddr_from_c(addr) }.ok_or(libc::EAFNOSUPPORT)
}

#[no_mangle]
extern "C" fn rsocket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    ret(|| {
        let kind = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
        if domain != libc::AF_INET && domain != libc::AF_INET6 {
            return Err(libc::EOPNOTSUPP);
        }
        if kind == libc::SOCK_DGRAM && (protocol == 0 || protocol == libc::IPPROTO_UDP) {
            let d = DSocket::new(domain == libc::AF_INET6).map_err(errno_of)?;
            d.set_nonblocking(ty & libc::SOCK_NONBLOCK != 0);
            let fd = d.fd();
            table().lock().insert(fd, Sock::Dgram(Arc::new(d)));
            return Ok(fd);
        }
        if kind != libc::SOCK_STREAM || (protocol != 0 && protocol != libc::IPPROTO_TCP) {
            return Err(libc::EOPNOTSUPP);
        }
        let s = RSocket::new().map_err(errno_of)?;
        s.set_nonblocking(ty & libc::SOCK_NONBLOCK != 0);
        if ty & libc::SOCK_CLOEXEC != 0 {
            s.set_fd_flags(libc::FD_CLOEXEC);
        }
        let fd = s.fd();
        table().lock().insert(fd, Sock::Stream(Arc::new(s)));
        Ok(fd)
    })
}

/// `rbind` and `rconnect`: socket `s` (`stream` for a stream socket,
/// `dgram` for a datagram one) given the caller's address.
///
/// # Safety
/// `addr` is NULL or `len` readable bytes, as bind(2) and connect(2)
/// take it.
unsafe fn to_addr(
    s: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    stream: fn(&RSocket, std::net::SocketAddr) -> io::Result<()>,
    dgram: fn(&DSocket, std::net::SocketAddr) -> io::Result<()>,
) -> c_int {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's address (this function's contract).
        let a = unsafe { get_addr(addr, len) }?;
        match rs {
            Sock::Stream(r) => stream(&r, a),
            Sock::Dgram(d) => dgram(&d, a),
        }
        .map_err(errno_of)
        .map(|()| 0)
    })
}

#[no_mangle]
unsafe extern "C" fn rbind(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address, as bind(2) takes it.
    unsafe { to_addr(s, addr, len, RSocket::bind, DSocket::bind) }
}

#[no_mangle]
extern "C" fn rlisten(s: c_int, backlog: c_int) -> c_int {
    ret(|| lookup(s)?.listen(backlog).map_err(errno_of).map(|()| 0))
}

#[no_mangle]
unsafe extern "C" fn raccept(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ret(|| {
        let new = lookup(s)?.accept().map_err(errno_of)?;
        // SAFETY: the caller's buffer, as accept(2) takes it.
        unsafe { put_addr(new.peer_addr(), addr, len) };
        let fd = new.fd();
        table().lock().insert(fd, Sock::Stream(Arc::new(new)));
        Ok(fd)
    })
}

#[no_mangle]
unsafe extern "C" fn rconnect(s: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address, as connect(2) takes it.
    unsafe { to_addr(s, addr, len, RSocket::connect, DSocket::connect) }
}

#[no_mangle]
extern "C" fn rshutdown(s: c_int, how: c_int) -> c_int {
    ret(|| match lookup_any(s)? {
        Sock::Stream(r) => r.shutdown(how).map_err(errno_of).map(|()| 0),
        // Nothing is in flight that a datagram socket waits for.
        Sock::Dgram(_) => Ok(0),
    })
}

#[no_mangle]
extern "C" fn rclose(s: c_int) -> c_int {
    ret(|| {
        match table().lock().remove(&s).ok_or(libc::EBADF)? {
            Sock::Stream(r) => r.close(),
            Sock::Dgram(d) => d.close(),
        }
        Ok(0)
    })
}

/// The caller's buffer as a slice (empty for length 0).
///
/// # Safety
/// `len` writable bytes at `buf` (or `len` 0).
unsafe fn buf_mut<'a>(buf: *mut c_void, len: size_t) -> Result<&'a mut [u8], i32> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) })
}

/// # Safety
/// `len` readable bytes at `buf` (or `len` 0).
unsafe fn buf_ref<'a>(buf: *const c_void, len: size_t) -> Result<&'a [u8], i32> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast(), len) })
}

#[no_mangle]
unsafe extern "C" fn rrecv(s: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's buffer, as recv(2) takes it.
        let b = unsafe { buf_mut(buf, len) }?;
        recv_any(&rs, b, flags).map(|(n, _)| n)
    })
}

#[no_mangle]
unsafe extern "C" fn rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's buffer, as recvfrom(2) takes it.
        let b = unsafe { buf_mut(buf, len) }?;
        let (n, from) = recv_any(&rs, b, flags)?;
        // SAFETY: the caller's address buffer, as recvfrom(2) takes it.
        unsafe { put_addr(from, addr, alen) };
        Ok(n)
    })
}

/// A receive on either kind of socket: the bytes, and who sent them.
fn recv_any(
    rs: &Sock,
    b: &mut [u8],
    flags: c_int,
) -> Result<(usize, Option<std::net::SocketAddr>), i32> {
    match rs {
        Sock::Stream(r) => r
            .recv(b, flags)
            .map(|n| (n, r.peer_addr()))
            .map_err(errno_of),
        Sock::Dgram(d) => d
            .recv_from(b, flags)
            .map(|(n, a)| (n, Some(a)))
            .map_err(errno_of),
    }
}

/// A send on either kind of socket (`to`: a datagram's destination).
fn send_any(
    rs: &Sock,
    b: &[u8],
    flags: c_int,
    to: Option<std::net::SocketAddr>,
) -> Result<usize, i32> {
    match (rs, to) {
        (Sock::Stream(r), _) => r.send(b, flags).map_err(errno_of),
        (Sock::Dgram(d), Some(a)) => d.send_to(b, flags, a).map_err(errno_of),
        (Sock::Dgram(d), None) => d.send(b, flags).map_err(errno_of),
    }
}

#[no_mangle]
unsafe extern "C" fn rread(s: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { rrecv(s, buf, len, 0) }
}

#[no_mangle]
unsafe extern "C" fn rsend(s: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's buffer, as send(2) takes it.
        let b = unsafe { buf_ref(buf, len) }?;
        send_any(&rs, b, flags, None)
    })
}

#[no_mangle]
unsafe extern "C" fn rsendto(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's buffer, as sendto(2) takes it.
        let b = unsafe { buf_ref(buf, len) }?;
        // A connected stream socket ignores the address, as TCP does.
        let to = match (&rs, addr.is_null()) {
            // SAFETY: the caller's address, as sendto(2) takes it.
            (Sock::Dgram(_), false) => Some(unsafe { get_addr(addr, alen) }?),
            _ => None,
        };
        send_any(&rs, b, flags, to)
    })
}

#[no_mangle]
unsafe extern "C" fn rwrite(s: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { rsend(s, buf, len, 0) }
}

/// The iovecs as slices.
///
/// # Safety
/// `n` iovecs at `iov`, each `iov_len` bytes at `iov_base`.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> Result<&'a [libc::iovec], i32> {
    if n < 0 || (n > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(iov, n as usize) })
}

/// `rsendv`: the iovecs gathered, then sent as one.
///
/// # Safety
/// As [`iovecs`].
unsafe fn sendv(s: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        let mut all = Vec::new();
        // SAFETY: the caller's promise.
        for v in unsafe { iovecs(iov, n) }? {
            // SAFETY: each iovec's bytes.
            all.extend_from_slice(unsafe { buf_ref(v.iov_base, v.iov_len) }?);
        }
        send_any(&rs, &all, flags, None)
    })
}

/// `rrecvv`: received into one buffer, then scattered.
///
/// # Safety
/// As [`iovecs`], writable.
unsafe fn recvv(s: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> ssize_t {
    ret(|| {
        let rs = lookup_any(s)?;
        // SAFETY: the caller's promise.
        let vs = unsafe { iovecs(iov, n) }?;
        let total: usize = vs.iter().map(|v| v.iov_len).sum();
        let mut all = vec![0u8; total];
        let (got, _) = recv_any(&rs, &mut all, flags)?;
        let mut at = 0;
        for v in vs {
            if at == got {
                break;
            }
            let k = v.iov_len.min(got - at);
            // SAFETY: each iovec's bytes, k of them.
            unsafe { buf_mut(v.iov_base, k) }?.copy_from_slice(&all[at..at + k]);
            at += k;
        }
        Ok(got)
    })
}

#[no_mangle]
unsafe extern "C" fn rreadv(s: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { recvv(s, iov, n, 0) }
}

#[no_mangle]
unsafe extern "C" fn rwritev(s: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { sendv(s, iov, n, 0) }
}

#[no_mangle]
unsafe extern "C" fn rrecvmsg(s: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's msghdr, as recvmsg(2) takes it.
    unsafe {
        (*msg).msg_controllen = 0;
        (*msg).msg_flags = 0;
        recvv(s, (*msg).msg_iov, (*msg).msg_iovlen as c_int, flags)
    }
}

#[no_mangle]
unsafe extern "C" fn rsendmsg(s: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's msghdr, as sendmsg(2) takes it.
    unsafe { sendv(s, (*msg).msg_iov, (*msg).msg_iovlen as c_int, flags) }
}

#[no_mangle]
unsafe extern "C" fn rgetpeername(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ret(|| {
        let a = match lookup_any(s)? {
            Sock::Stream(r) => r.peer_addr(),
            Sock::Dgram(d) => d.peer_addr(),
        }
        .ok_or(libc::ENOTCONN)?;
        // SAFETY: the caller's buffer, as getpeername(2) takes it.
        unsafe { put_addr(Some(a), addr, len) };
        Ok(0)
    })
}

#[no_mangle]
unsafe extern "C" fn rgetsockname(s: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    ret(|| {
        let a = match lookup_any(s)? {
            Sock::Stream(r) => r.local_addr(),
            Sock::Dgram(d) => d.local_addr(),
        };
        // SAFETY: the caller's buffer, as getsockname(2) takes it.
        unsafe { put_addr(a, addr, len) };
        Ok(0)
    })
}

/// The int at `v` (`len` at least 4).
///
/// # Safety
/// NULL or `len` readable bytes at `v`.
unsafe fn int_at(v: *const c_void, len: socklen_t) -> Result<c_int, i32> {
    if v.is_null() || (len as usize) < std::mem::size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise; read unaligned.
    Ok(unsafe { v.cast::<c_int>().read_unaligned() })
}

/// A datagram socket's option (`rsetsockopt`, `rgetsockopt`): as
/// rsocket.c, `call` (setsockopt(2) or getsockopt(2)) on its UDP socket's
/// fd, SOL_RDMA refused (ENOTSUP). `None` for a stream socket.
fn udp_opt(
    s: c_int,
    level: c_int,
    call: impl FnOnce(c_int) -> c_int,
) -> Result<Option<c_int>, i32> {
    let Sock::Dgram(d) = lookup_any(s)? else {
        return Ok(None);
    };
    if level == SOL_RDMA {
        return Err(libc::ENOTSUP);
    }
    match call(d.fd()) {
        0 => Ok(Some(0)),
        _ => Err(crate::rdmacm::last_errno()),
    }
}

#[no_mangle]
unsafe extern "C" fn rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    v: *const c_void,
    len: socklen_t,
) -> c_int {
    ret(|| {
        // SAFETY: the caller's option, as setsockopt(2) takes it.
        if let Some(r) = udp_opt(s, level, |fd| unsafe {
            libc::setsockopt(fd, level, name, v, len)
        })? {
            return Ok(r);
        }
        let rs = lookup(s)?;
        // SAFETY: the caller's option value, as setsockopt(2) takes it.
        let val = || unsafe { int_at(v, len) };
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_OOBINLINE) => {
                rs.set_flag(0, name as u32, val()? != 0)
            }
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => rs.set_keepalive(val()? != 0),
            (libc::SOL_SOCKET, libc::SO_RCVBUF | libc::SO_SNDBUF) => {
                let opt = if name == libc::SO_RCVBUF {
                    RdmaOpt::RcvBuf
                } else {
                    RdmaOpt::SndBuf
                };
                // Once connected the buffers stay as they are (as rsocket.c).
                let _ = rs.set_rdma_option(opt, val()?.max(0) as u32);
            }
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                if v.is_null() || (len as usize) < std::mem::size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: checked above: a struct linger's bytes, read unaligned.
                let l = unsafe { v.cast::<libc::linger>().read_unaligned() };
                // Kept inverted, as rsocket.c: the default (bit clear) is on.
                rs.set_flag(0, name as u32, l.l_onoff == 0);
            }
            (libc::SOL_SOCKET, libc::SO_BROADCAST) => {}
            (libc::IPPROTO_IP, libc::IP_TOS) => rs.set_tos(val()?),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => rs.set_flag(1, name as u32, val()? != 0),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
                let t = val()?;
                if t <= 0 {
                    return Err(libc::EINVAL);
                }
                rs.set_keepalive_time(t as u32);
            }
            (
                libc::IPPROTO_TCP,
                libc::TCP_MAXSEG | libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_CONGESTION,
            ) => {}
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => rs.set_flag(2, name as u32, val()? != 0),
            (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE) => {
                let opt = match name {
                    RDMA_SQSIZE => RdmaOpt::SqSize,
                    RDMA_RQSIZE => RdmaOpt::RqSize,
                    RDMA_INLINE => RdmaOpt::Inline,
                    _ => RdmaOpt::IomapSize,
                };
                rs.set_rdma_option(opt, val()?.max(0) as u32)
                    .map_err(errno_of)?;
            }
            _ => return Err(libc::ENOTSUP),
        }
        Ok(0)
    })
}

#[no_mangle]
unsafe extern "C" fn rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    v: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    ret(|| {
        // SAFETY: the caller's buffer, as getsockopt(2) takes it.
        if let Some(r) = udp_opt(s, level, |fd| unsafe {
            libc::getsockopt(fd, level, name, v, len)
        })? {
            return Ok(r);
        }
        let rs = lookup(s)?;
        if v.is_null() || len.is_null() {
            return Err(libc::EINVAL);
        }
        let int = |i: c_int| i.to_ne_bytes().to_vec();
        let out: Vec<u8> = match (level, name) {
            (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
                int(rs.flag(0, name as u32).into())
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => int(rs.rdma_option(RdmaOpt::RcvBuf) as c_int),
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => int(rs.rdma_option(RdmaOpt::SndBuf) as c_int),
            (libc::SOL_SOCKET, libc::SO_LINGER) => {
                let l = libc::linger {
                    l_onoff: (!rs.flag(0, name as u32)).into(),
                    l_linger: 0,
                };
                [l.l_onoff, l.l_linger]
                    .iter()
                    .flat_map(|x| x.to_ne_bytes())
                    .collect()
            }
            (libc::SOL_SOCKET, libc::SO_ERROR) => int(rs.take_error()),
            (libc::SOL_SOCKET, libc::SO_TYPE) => int(libc::SOCK_STREAM),
            (libc::IPPROTO_IP, libc::IP_TOS) => int(rs.tos()),
            // Not applicable to a reliable connection: 1, as rsocket.c says.
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_CONGESTION) => {
                int(1)
            }
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => int(rs.keepalive_time() as c_int),
            (libc::IPPROTO_TCP, libc::TCP_NODELAY) => int(rs.flag(1, name as u32).into()),
            (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => int(2048),
            (libc::IPPROTO_TCP, libc::TCP_INFO) => tcp_info(&rs),
            (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => int(rs.flag(2, name as u32).into()),
            (SOL_RDMA, RDMA_SQSIZE) => int(rs.rdma_option(RdmaOpt::SqSize) as c_int),
            (SOL_RDMA, RDMA_RQSIZE) => int(rs.rdma_option(RdmaOpt::RqSize) as c_int),
            (SOL_RDMA, RDMA_INLINE) => int(rs.rdma_option(RdmaOpt::Inline) as c_int),
            (SOL_RDMA, RDMA_IOMAPSIZE) => int(rs.rdma_option(RdmaOpt::IomapSize) as c_int),
            _ => return Err(libc::ENOTSUP),
        };
        // SAFETY: the caller's buffer and length, as getsockopt(2) takes them.
        unsafe {
            let room = (*len as usize).min(out.len());
            std::ptr::copy_nonoverlapping(out.as_ptr(), v.cast(), room);
            *len = room as socklen_t;
        }
        Ok(0)
    })
}

/// `TCP_INFO` as rsocket.c fills it: the state (established or closed)
/// and the send queue's size as the congestion window, the rest 0.
fn tcp_info(rs: &RSocket) -> Vec<u8> {
    // SAFETY: tcp_info is plain integers: all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    info.tcpi_state = if rs.is_connected() {
        TCP_ESTABLISHED
    } else {
        TCP_CLOSE
    };
    info.tcpi_snd_cwnd = rs.rdma_option(RdmaOpt::SqSize);
    // SAFETY: the struct's own bytes, for as long as it lives here.
    unsafe {
        std::slice::from_raw_parts(
            (&info as *const libc::tcp_info).cast::<u8>(),
            std::mem::size_of::<libc::tcp_info>(),
        )
    }
    .to_vec()
}

/// `int rfcntl(int socket, int cmd, ... /* arg */)`. The one variadic
/// argument F_SETFL/F_SETFD take is an int: on the System V x86-64 and
/// AArch64 Linux ABIs a variadic integer argument is passed where a
/// named third argument would be, so it is read as one (and ignored by
/// the commands that take none).
#[no_mangle]
extern "C" fn rfcntl(s: c_int, cmd: c_int, arg: c_long) -> c_int {
    ret(|| {
        if let Sock::Dgram(d) = lookup_any(s)? {
            return match cmd {
                libc::F_GETFL => Ok(libc::O_RDWR
                    | if d.nonblocking_flag() {
                        libc::O_NONBLOCK
                    } else {
                        0
                    }),
                libc::F_SETFL => {
                    d.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
                    Ok(0)
                }
                _ => Err(libc::ENOTSUP),
            };
        }
        let rs = lookup(s)?;
        match cmd {
            libc::F_GETFL => Ok(libc::O_RDWR
                | if rs.nonblocking_flag() {
                    libc::O_NONBLOCK
                } else {
                    0
                }),
            libc::F_SETFL => {
                rs.set_nonblocking(arg as c_int & libc::O_NONBLOCK != 0);
                Ok(0)
            }
            libc::F_GETFD => Ok(rs.fd_flags()),
            libc::F_SETFD => {
                rs.set_fd_flags(arg as c_int);
                Ok(0)
            }
            _ => Err(libc::ENOTSUP),
        }
    })
}

/// One look at every descriptor, rsockets through [`RSocket::poll_events`].
fn poll_once(fds: &mut [libc::pollfd], socks: &[Option<Sock>]) -> c_int {
    let mut n = 0;
    for (p, rs) in fds.iter_mut().zip(socks) {
        p.revents = match rs {
            Some(Sock::Stream(rs)) => rs.poll_events(p.events),
            Some(Sock::Dgram(d)) => d.poll_events(p.events),
            None => {
                let mut q = *p;
                // SAFETY: one pollfd, no wait.
                unsafe { libc::poll(&mut q, 1, 0) };
                q.revents
            }
        };
        if p.revents != 0 {
            n += 1;
        }
    }
    n
}

/// `rpoll`: poll(2) over rsockets and ordinary descriptors. An rsocket
/// waits on its completion channel (or, before it is connected, its CM
/// channel), armed before the wait; whatever fires is then looked at again.
#[no_mangle]
unsafe extern "C" fn rpoll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    ret(|| {
        if nfds > 0 && fds.is_null() {
            return Err(libc::EFAULT);
        }
        let fds: &mut [libc::pollfd] = if nfds == 0 {
            &mut []
        } else {
            // SAFETY: the caller's array, as poll(2) takes it.
            unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        let socks: Vec<Option<Sock>> = {
            let t = table().lock();
            fds.iter().map(|p| t.get(&p.fd).cloned()).collect()
        };
        let start = Instant::now();
        let end = (timeout >= 0).then(|| start + Duration::from_millis(timeout as u64));
        loop {
            let n = poll_once(fds, &socks);
            if n > 0 || timeout == 0 {
                return Ok(n);
            }
            let wait = |fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let mut waits: Vec<libc::pollfd> = fds
                .iter()
                .zip(&socks)
                .flat_map(|(p, rs)| match rs {
                    Some(Sock::Stream(rs)) => vec![wait(rs.wait_fd())],
                    Some(Sock::Dgram(d)) => d.wait_fds().into_iter().map(wait).collect(),
                    None => vec![libc::pollfd { revents: 0, ..*p }],
                })
                .collect();
            // Armed: what came before the arming shows now.
            let n = poll_once(fds, &socks);
            if n > 0 {
                return Ok(n);
            }
            let left = match end {
                Some(e) => {
                    let l = e.saturating_duration_since(Instant::now());
                    if l.is_zero() {
                        return Ok(0);
                    }
                    l.min(Duration::from_millis(500))
                }
                None => Duration::from_millis(500),
            };
            // Rounded up: a wait of less than a millisecond left is one
            // millisecond, not a busy loop of zero-timeout polls (which
            // took the CPU from the engines udpong's 1 ms waits need).
            let ms = left.as_micros().div_ceil(1000) as c_int;
            // SAFETY: our own array of waits.
            let r = unsafe { libc::poll(waits.as_mut_ptr(), waits.len() as libc::nfds_t, ms) };
            if r < 0 {
                return Err(crate::rdmacm::last_errno());
            }
        }
    })
}

/// `rselect`: select(2) through [`rpoll`].
#[no_mangle]
unsafe extern "C" fn rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut ev = 0;
        // SAFETY: the caller's sets (or NULL), FD_ISSET on fds below nfds.
        unsafe {
            if !r.is_null() && libc::FD_ISSET(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && libc::FD_ISSET(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && libc::FD_ISSET(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            fds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    let timeout = if t.is_null() {
        -1
    } else {
        // SAFETY: the caller's timeout.
        let tv = unsafe { *t };
        (tv.tv_sec * 1000 + tv.tv_usec / 1000).clamp(0, i32::MAX as i64) as c_int
    };
    // SAFETY: our own array.
    let n = unsafe { rpoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    if n < 0 {
        return n;
    }
    let mut count = 0;
    // SAFETY: the caller's sets, cleared and refilled below nfds.
    unsafe {
        for set in [r, w, e] {
            if !set.is_null() {
                libc::FD_ZERO(set);
            }
        }
        for p in &fds {
            let hup = p.revents & (libc::POLLHUP | libc::POLLERR) != 0;
            if !r.is_null()
                && p.events & libc::POLLIN != 0
                && (p.revents & libc::POLLIN != 0 || hup)
            {
                libc::FD_SET(p.fd, r);
                count += 1;
            }
            if !w.is_null()
                && p.events & libc::POLLOUT != 0
                && (p.revents & libc::POLLOUT != 0 || hup)
            {
                libc::FD_SET(p.fd, w);
                count += 1;
            }
            if !e.is_null() && p.events & libc::POLLPRI != 0 && p.revents & libc::POLLPRI != 0 {
                libc::FD_SET(p.fd, e);
                count += 1;
            }
        }
    }
    count
}

/// `riomap`: `buf` registered for the peer's `riowrite` at `offset`.
#[no_mangle]
unsafe extern "C" fn riomap(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    prot: c_int,
    _flags: c_int,
    offset: libc::off_t,
) -> libc::off_t {
    ret(|| {
        let rs = lookup(s)?;
        if buf.is_null() || len == 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's buffer, which rsocket.h says stays valid
        // until riounmap or rclose.
        unsafe { rs.iomap(buf.cast(), len, prot, offset) }.map_err(errno_of)
    })
}

/// `riounmap`: the mapping of exactly `buf`/`len` undone.
#[no_mangle]
extern "C" fn riounmap(s: c_int, buf: *mut c_void, len: size_t) -> c_int {
    ret(|| {
        lookup(s)?
            .iounmap(buf.cast(), len)
            .map_err(errno_of)
            .map(|()| 0)
    })
}

/// `riowrite`: `count` bytes into the peer's memory mapped at `offset`;
/// the bytes written, or -1 (as a size_t) with errno when none were.
#[no_mangle]
unsafe extern "C" fn riowrite(
    s: c_int,
    buf: *const c_void,
    count: size_t,
    offset: libc::off_t,
    flags: c_int,
) -> size_t {
    guard(usize::MAX, || {
        let r = lookup(s).and_then(|rs| {
            // SAFETY: the caller's buffer, as write(2) takes it.
            let b = unsafe { buf_ref(buf, count) }?;
            rs.iowrite(b, offset as u64, flags).map_err(errno_of)
        });
        match r {
            Ok(n) => n,
            Err(e) => {
                set_errno(e);
                usize::MAX
            }
        }
    })
}
