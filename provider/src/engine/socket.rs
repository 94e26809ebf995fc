//! The engine's UDP socket and its eventfd doorbell.
//!
//! Datagrams move in batches: `recvmmsg` with UDP GRO (one read returns
//! many same-size datagrams of a flow, which the caller splits at the
//! segment size the kernel reports) and `sendmmsg` with UDP GSO (a message
//! may be a run of equal-size packets the kernel splits). Either falls
//! back by itself where the kernel refuses it; `UROCE_GSO=0` and
//! `UROCE_GRO=0` turn them off.
//!
//! Each message carries its packets' IP TOS (IPv4) or traffic class
//! (IPv6): a non-zero one in an `IP_TOS` / `IPV6_TCLASS` control message
//! of its own, so traffic class 0, the common case, costs nothing. Each
//! received datagram reports its TOS and TTL (`IP_RECVTOS`, `IP_RECVTTL`
//! / `IPV6_RECVTCLASS`, `IPV6_RECVHOPLIMIT`; GRO aggregates only
//! datagrams whose IP headers agree on both).
//!
//! A datagram to a multicast group carries its TTL / hop limit (the
//! address handle's) in an `IP_TTL` / `IPV6_HOPLIMIT` control message;
//! the socket's own multicast TTL is 0, which the kernel keeps on the
//! host (looped back to its members, never sent on a link): what hop
//! limit 0 asks for, and what `IP_TTL` cannot say. Unicast datagrams
//! carry the route's TTL, as the kernel's RoCE packets do.

use socket2::{Domain, SockAddr, Socket};
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Socket buffer size asked for (the kernel may cap it without
/// CAP_NET_ADMIN; SO_RCVBUFFORCE is tried first).
const SOCK_BUF: usize = 8 << 20;

/// Datagrams one receive call can return.
pub const RX_BATCH: usize = 32;
/// Messages one send call can carry.
pub const TX_BATCH: usize = 64;
/// Largest GRO aggregate the kernel hands over (64 KiB).
pub const GRO_MAX: usize = 65536;
/// Most packets in one GSO message (the kernel's UDP_MAX_SEGMENTS).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most bytes in one GSO message (an IPv4 datagram's payload, with room).
pub const GSO_MAX_BYTES: usize = 65000;
/// Control buffer of one received message: UDP_GRO's int, SO_RXQ_OVFL's
/// u32, IP_TOS's byte (IPV6_TCLASS's int) and IP_TTL's int
/// (IPV6_HOPLIMIT's), each in a cmsg of 24 bytes (as u64s, for
/// alignment).
const RX_CMSG_WORDS: usize = 15;
/// Control buffer of one sent message: UDP_SEGMENT's u16, IP_TOS's
/// (IPV6_TCLASS's) int and IP_TTL's (IPV6_HOPLIMIT's) int, each in a cmsg
/// of 24 bytes.
const TX_CMSG_WORDS: usize = 9;

/// UDP 4791 bound on one address.
pub struct UdpPort {
    sock: Socket,
    /// UDP GRO is on: a datagram may be an aggregate.
    gro: bool,
    /// UDP GSO may be used.
    gso: bool,
    /// SO_RXQ_OVFL's last reported total.
    ovfl: u32,
}

/// One received datagram (or GRO aggregate) of a [`RxBatch`].
#[derive(Debug, Clone, Copy)]
pub struct RxMsg {
    /// Bytes received.
    pub len: usize,
    /// Sender.
    pub from: SocketAddr,
    /// GRO segment size (0: a single datagram).
    pub seg: usize,
    /// The IP header's TOS / traffic class.
    pub tos: u8,
    /// The IP header's TTL / hop limit (64 if the socket did not say).
    pub ttl: u8,
}

/// Buffers for [`UdpPort::recv_batch`]: each slot holds `HEADROOM` bytes
/// of scratch space (for computing the ICRC in place) and then a datagram.
pub struct RxBatch {
    buf: Vec<u8>,
    slot: usize,
    headroom: usize,
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<[u64; RX_CMSG_WORDS]>,
    /// The datagrams of the last call.
    pub msgs: Vec<RxMsg>,
}

impl RxBatch {
    /// Buffers for `RX_BATCH` datagrams of up to `max` bytes (64 KiB with
    /// GRO), each after `headroom` bytes of scratch space.
    pub fn new(headroom: usize, max: usize) -> RxBatch {
        let slot = headroom + max;
        RxBatch {
            buf: vec![0u8; RX_BATCH * slot],
            slot,
            headroom,
            // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
            names: vec![unsafe { std::mem::zeroed() }; RX_BATCH],
            cmsgs: vec![[0u64; RX_CMSG_WORDS]; RX_BATCH],
            msgs: Vec::with_capacity(RX_BATCH),
        }
    }
    /// Slot `i`: its headroom followed by datagram `i`'s bytes (and the
    /// rest of the slot).
    pub fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * self.slot..(i + 1) * self.slot]
    }
}

/// One message of a [`UdpPort::send_batch`] call.
#[derive(Debug, Clone, Copy)]
pub struct TxMsg {
    /// Where its bytes start in the batch's buffer.
    pub off: usize,
    /// How many bytes.
    pub len: usize,
    /// Destination.
    pub dst: SocketAddr,
    /// GSO segment size (0: one datagram).
    pub seg: usize,
    /// The IP TOS / traffic class of its packets.
    pub tos: u8,
    /// The IP TTL / hop limit of its packets, for a multicast
    /// destination (`None`: the route's; `Some(0)`: the socket's
    /// multicast TTL 0, which keeps them on the host).
    pub ttl: Option<u8>,
}

impl TxMsg {
    /// The size of its packets: `seg`, or the whole message for one
    /// datagram.
    pub fn packet_size(&self) -> usize {
        if self.seg == 0 {
            self.len
        } else {
            self.seg
        }
    }
    /// How many packets it carries.
    pub fn packets(&self) -> usize {
        self.len.div_ceil(self.packet_size().max(1))
    }
}

/// What [`UdpPort::send_batch`] did.
#[derive(Debug, Default, Clone, Copy)]
pub struct TxStats {
    /// System calls made.
    pub syscalls: u64,
    /// Messages the kernel refused (a full send buffer, an unreachable
    /// address): dropped, as a full NIC queue would.
    pub dropped: u64,
}

/// Asks the socket to report each datagram's TOS / traffic class and TTL
/// / hop limit, for a UD receive's GRH (refused, the GRH shows 0 and 64).
fn report_ip_fields(fd: RawFd, ip: IpAddr) {
    let opts = if ip.is_ipv4() {
        [
            (libc::IPPROTO_IP, libc::IP_RECVTOS),
            (libc::IPPROTO_IP, libc::IP_RECVTTL),
        ]
    } else {
        [
            (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS),
            (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT),
        ]
    };
    for (level, opt) in opts {
        let _ = setsockopt_int(fd, level, opt, 1);
    }
}

impl UdpPort {
    /// Binds `ip`:4791, non-blocking, with DF and IP ID 0 (IP_PMTUDISC_DO:
    /// the header our ICRC is computed for; see `wire::icrc`). `shared`:
    /// into the address's SO_REUSEPORT group (see `engine::share`).
    pub fn bind(ip: IpAddr, shared: bool) -> io::Result<UdpPort> {
        let sock = df_socket(ip)?;
        let fd = sock.as_raw_fd();
        grow_buffers(&sock, SOCK_BUF);
        if shared {
            sock.set_reuse_port(true)?;
        }
        sock.bind(&SockAddr::from(SocketAddr::new(
            ip,
            uroce_wire::ROCEV2_UDP_PORT,
        )))?;
        sock.set_nonblocking(true)?;
        // Multicast (a UD send to a group) leaves by the device's own
        // interface, and comes back to this host's members, the device's
        // own QPs among them, as a NIC loops it back. (Refused, the
        // device still works for unicast; multicast goes by route.)
        let _ = set_multicast_if(&sock, ip);
        // The kernel's count of datagrams dropped for a full receive
        // buffer, with every datagram read.
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1);
        report_ip_fields(fd, ip);
        let off = |var: &str| std::env::var(var).is_ok_and(|v| v.trim() == "0");
        let gro = !off("UROCE_GRO") && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        // Segment size 0 on the socket: GSO only where a message asks.
        let gso =
            !off("UROCE_GSO") && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok();
        Ok(UdpPort {
            sock,
            gro,
            gso,
            ovfl: 0,
        })
    }

    /// A socket receiving what is sent to the multicast `group` on UDP
    /// 4791, joined on the interface of the device address `local`: bound
    /// to the group address (so it gets that group's datagrams and no
    /// unicast), with SO_REUSEADDR so that every device of this host, in
    /// this process or another, can join the same group and each gets its
    /// own copy. Needs no privilege, and works on `lo` as it is (without
    /// its MULTICAST flag). Never used to send.
    pub fn join(group: IpAddr, local: IpAddr) -> io::Result<UdpPort> {
        let sock = df_socket(group)?;
        let fd = sock.as_raw_fd();
        sock.set_reuse_address(true)?;
        grow_buffers(&sock, SOCK_BUF);
        match (group, local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => {
                sock.bind(&SockAddr::from(SocketAddr::new(
                    group,
                    uroce_wire::ROCEV2_UDP_PORT,
                )))?;
                sock.join_multicast_v4(&g, &l)?;
                // Only the group bound, not every group the host joined.
                sock.set_multicast_all_v4(false)?;
            }
            (IpAddr::V6(g), IpAddr::V6(l)) => {
                let ifindex = ifindex_of(IpAddr::V6(l))?;
                let scope = if g.segments()[0] & 0x000f <= 2 {
                    ifindex
                } else {
                    0
                };
                sock.bind(&SockAddr::from(std::net::SocketAddrV6::new(
                    g,
                    uroce_wire::ROCEV2_UDP_PORT,
                    0,
                    scope,
                )))?;
                sock.join_multicast_v6(&g, ifindex)?;
                sock.set_multicast_all_v6(false)?;
            }
            _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
        sock.set_nonblocking(true)?;
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1);
        report_ip_fields(fd, group);
        let gro = setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok();
        Ok(UdpPort {
            sock,
            gro,
            gso: false,
            ovfl: 0,
        })
    }

    /// Whether UDP GRO is on.
    pub fn gro(&self) -> bool {
        self.gro
    }

    /// Whether UDP GSO is in use.
    pub fn gso(&self) -> bool {
        self.gso
    }

    /// Receives up to [`RX_BATCH`] datagrams with one `recvmmsg`, into
    /// `b.msgs`; returns how many, and how many datagrams the kernel
    /// dropped for a full receive buffer since the last call.
    pub fn recv_batch(&mut self, b: &mut RxBatch) -> (usize, u64) {
        b.msgs.clear();
        let mut iov: [libc::iovec; RX_BATCH] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; RX_BATCH];
        // SAFETY: mmsghdr is plain data; all zeroes is valid.
        let mut hdrs: [libc::mmsghdr; RX_BATCH] = unsafe { std::mem::zeroed() };
        let base = b.buf.as_mut_ptr();
        for i in 0..RX_BATCH {
            // SAFETY: slot i lies inside `b.buf` (RX_BATCH slots).
            iov[i].iov_base = unsafe { base.add(i * b.slot + b.headroom) }.cast();
            iov[i].iov_len = b.slot - b.headroom;
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut iov[i];
            h.msg_iovlen = 1;
            h.msg_control = b.cmsgs[i].as_mut_ptr().cast();
            h.msg_controllen = RX_CMSG_WORDS * 8;
        }
        // SAFETY: every header points to live buffers of the lengths it
        // gives (the batch's slots, names and control buffers, and `iov`,
        // all of which outlive the call); the call writes only there.
        let n = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                RX_BATCH as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n <= 0 {
            return (0, 0);
        }
        let mut dropped = 0;
        for h in &hdrs[..n as usize] {
            let (mut seg, mut tos, mut ttl) = (0, 0, 64);
            // SAFETY: the kernel filled msg_control with msg_controllen
            // bytes of well-formed cmsgs; the CMSG macros stay inside it.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    let data = libc::CMSG_DATA(c);
                    match ((*c).cmsg_level, (*c).cmsg_type) {
                        (libc::SOL_UDP, libc::UDP_GRO) => {
                            seg = std::ptr::read_unaligned(data as *const libc::c_int) as usize;
                        }
                        // IPv4 reports the TOS as one byte, IPv6 the
                        // traffic class as an int.
                        (libc::IPPROTO_IP, libc::IP_TOS) => tos = *data,
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                            tos = std::ptr::read_unaligned(data as *const libc::c_int) as u8;
                        }
                        // Both report the TTL / hop limit as an int.
                        (libc::IPPROTO_IP, libc::IP_TTL)
                        | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                            ttl = std::ptr::read_unaligned(data as *const libc::c_int) as u8;
                        }
                        (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                            let total = std::ptr::read_unaligned(data as *const u32);
                            dropped += u64::from(total.wrapping_sub(self.ovfl));
                            self.ovfl = total;
                        }
                        _ => {}
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            let name = h.msg_hdr.msg_name as *const libc::sockaddr_storage;
            // SAFETY: msg_name points to one of `b.names`, which the kernel
            // filled with msg_namelen bytes of a socket address.
            let from = unsafe { sockaddr_of(&*name, h.msg_hdr.msg_namelen) };
            let Some(from) = from else { continue };
            b.msgs.push(RxMsg {
                len: h.msg_len as usize,
                from,
                seg,
                tos,
                ttl,
            });
        }
        (b.msgs.len(), dropped)
    }

    /// Sends `msgs` (each a slice of `data`, a GSO run where `seg` is
    /// set) with as few `sendmmsg` calls as the kernel allows. A message
    /// the kernel refuses is dropped (the transport retransmits), as a full
    /// NIC queue would; a GSO message refused because the path cannot
    /// offload it turns GSO off and goes out packet by packet.
    pub fn send_batch(&mut self, data: &[u8], msgs: &[TxMsg]) -> TxStats {
        let mut st = TxStats::default();
        let mut i = 0;
        while i < msgs.len() {
            let chunk = &msgs[i..msgs.len().min(i + TX_BATCH)];
            let err = match self.sendmmsg(data, chunk, &mut st) {
                Ok(0) => None,
                Ok(sent) => {
                    // A short count: the next call reports the error of
                    // the first message not sent.
                    i += sent;
                    continue;
                }
                Err(e) => Some(e),
            };
            let m = msgs[i];
            let gso_refused = m.seg != 0
                && matches!(
                    err,
                    Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE | libc::ENOPROTOOPT)
                );
            if gso_refused {
                self.gso = false;
                let mut off = m.off;
                let end = m.off + m.len;
                while off < end {
                    let len = m.seg.min(end - off);
                    let one = TxMsg {
                        off,
                        len,
                        dst: m.dst,
                        seg: 0,
                        tos: m.tos,
                        ttl: m.ttl,
                    };
                    if !matches!(self.sendmmsg(data, &[one], &mut st), Ok(1)) {
                        st.dropped += 1;
                    }
                    off += len;
                }
            } else {
                st.dropped += 1;
            }
            i += 1;
        }
        st
    }

    /// One `sendmmsg` call over `msgs` (at most [`TX_BATCH`]): how many
    /// were sent, or the error of the first.
    fn sendmmsg(&self, data: &[u8], msgs: &[TxMsg], st: &mut TxStats) -> Result<usize, i32> {
        debug_assert!(msgs.len() <= TX_BATCH);
        let n = msgs.len();
        // Only the first n entries are set (zeroed, then filled): zeroing
        // whole arrays cost 18 KiB of memset per call, a message or 64.
        let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; TX_BATCH];
        let mut names = [const { MaybeUninit::<libc::sockaddr_storage>::uninit() }; TX_BATCH];
        let mut cmsgs = [const { MaybeUninit::<[u64; TX_CMSG_WORDS]>::uninit() }; TX_BATCH];
        let mut iov = [const { MaybeUninit::<libc::iovec>::uninit() }; TX_BATCH];
        for (j, m) in msgs.iter().enumerate() {
            let bytes = &data[m.off..m.off + m.len];
            let iov_j: *mut libc::iovec = iov[j].write(libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            });
            // SAFETY: sockaddr_storage and mmsghdr are plain C data; all
            // zeroes is a valid value of each.
            let name = names[j].write(unsafe { std::mem::zeroed() });
            let namelen = put_sockaddr(m.dst, name);
            let name: *mut libc::sockaddr_storage = name;
            let cmsg_j = cmsgs[j].write([0u64; TX_CMSG_WORDS]);
            // SAFETY: as above.
            let h = &mut hdrs[j].write(unsafe { std::mem::zeroed() }).msg_hdr;
            h.msg_name = name.cast();
            h.msg_namelen = namelen;
            h.msg_iov = iov_j;
            h.msg_iovlen = 1;
            // SAFETY: CMSG_SPACE of a u16 plus twice CMSG_SPACE of an int
            // (3 x 24 bytes) fit the control buffer (TX_CMSG_WORDS u64s,
            // 8-aligned as a cmsghdr needs); each header starts where the
            // one before it ends (at its CMSG_SPACE, an aligned offset) and
            // its data is written at CMSG_DATA, inside its CMSG_LEN.
            unsafe {
                let base = cmsg_j.as_mut_ptr().cast::<u8>();
                let mut used = 0;
                if m.seg != 0 {
                    let c = base.add(used).cast::<libc::cmsghdr>();
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, m.seg as u16);
                    used += libc::CMSG_SPACE(2) as usize;
                }
                let v4 = m.dst.is_ipv4();
                if m.tos != 0 {
                    let (level, ty) = if v4 {
                        (libc::IPPROTO_IP, libc::IP_TOS)
                    } else {
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS)
                    };
                    used += put_int_cmsg(base.add(used), level, ty, m.tos.into());
                }
                if let Some(ttl) = m.ttl.filter(|&t| t != 0) {
                    let (level, ty) = if v4 {
                        (libc::IPPROTO_IP, libc::IP_TTL)
                    } else {
                        (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT)
                    };
                    used += put_int_cmsg(base.add(used), level, ty, ttl.into());
                }
                if used != 0 {
                    h.msg_control = base.cast();
                    h.msg_controllen = used;
                }
            }
        }
        st.syscalls += 1;
        // SAFETY: the first `n` headers are initialised (the loop wrote
        // one per message), each pointing to live data (`data`, which the
        // iovecs only read), addresses and control buffers that outlive
        // the call; the kernel reads no header past the n-th.
        let r = unsafe {
            libc::sendmmsg(
                self.sock.as_raw_fd(),
                hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                n as u32,
                0,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        } else {
            Ok((r as usize).min(n))
        }
    }

    /// The socket's descriptor (valid while the port lives).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }

    /// Another descriptor of the socket.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.sock.try_clone().map(OwnedFd::from)
    }

    /// Sends one datagram at once (not on the data path).
    pub fn send_one(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(buf, &SockAddr::from(to))
    }
}

/// Writes one control message holding a C `int` at `at`; returns the
/// room it takes (its `CMSG_SPACE`).
///
/// # Safety
/// `at` is 8-aligned (as a `cmsghdr` needs) and has `CMSG_SPACE(int)`
/// writable bytes.
unsafe fn put_int_cmsg(at: *mut u8, level: i32, ty: i32, v: libc::c_int) -> usize {
    let len = std::mem::size_of::<libc::c_int>() as u32;
    let c = at.cast::<libc::cmsghdr>();
    // SAFETY: the caller gives CMSG_SPACE(int) aligned bytes at `at`: the
    // header fits there and CMSG_DATA (inside CMSG_LEN) holds the int.
    unsafe {
        (*c).cmsg_level = level;
        (*c).cmsg_type = ty;
        (*c).cmsg_len = libc::CMSG_LEN(len) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), v);
        libc::CMSG_SPACE(len) as usize
    }
}

/// Writes `addr` as a C socket address; returns its length.
fn put_sockaddr(addr: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    let sa = SockAddr::from(addr);
    // SAFETY: `sa` holds `sa.len()` bytes of socket address, no more than
    // a sockaddr_storage; the regions do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sa.as_ptr() as *const u8,
            out as *mut libc::sockaddr_storage as *mut u8,
            sa.len() as usize,
        )
    };
    sa.len()
}

/// Reads a C socket address of `len` bytes.
fn sockaddr_of(st: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: `st` holds `len` bytes of a socket address as the kernel
    // wrote it; SockAddr::new copies them.
    let sa = unsafe { SockAddr::new(*st, len) };
    sa.as_socket()
}

/// An epoll set of sockets: readable when one of them is (the multicast
/// groups' sockets, which come and go while the engine sleeps on the set).
pub struct PollSet {
    fd: OwnedFd,
}

impl PollSet {
    /// An empty set.
    pub fn new() -> io::Result<PollSet> {
        // SAFETY: epoll_create1 returns a new descriptor or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(PollSet {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }
    /// Adds a socket, watched for input.
    pub fn add(&self, sock: std::os::fd::RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: sock as u64,
        };
        // SAFETY: our epoll descriptor, a live event the call only reads.
        let r = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, sock, &mut ev) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    /// Removes a socket (before it is closed).
    pub fn remove(&self, sock: std::os::fd::RawFd) {
        // SAFETY: our epoll descriptor; DEL ignores the event argument.
        unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                sock,
                std::ptr::null_mut(),
            )
        };
    }
}

/// Blocks until the socket `sock` or one in `more` is readable, the
/// doorbell rings, or `timeout_ns` passes.
pub fn wait(sock: std::os::fd::RawFd, more: &PollSet, bell: &Doorbell, timeout_ns: u64) {
    let mut fds = [
        libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: more.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: bell.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: three valid pollfd entries and a live timespec; no signal
    // mask.
    unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
}

/// A kernel UDP socket of `domain` (`AF_INET`/`AF_INET6`), close-on-exec,
/// made by the `socket` system call itself rather than through libc's
/// `socket` symbol: under a preload that interposes `socket` (rdma-core's
/// librspreload makes every socket of the process an rsocket, datagram
/// ones included) uroce's own sockets stay kernel sockets, not rsockets
/// built on uroce's devices.
pub fn kernel_udp_socket(domain: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) with integer arguments; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_socket,
            domain,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just made, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A UDP socket for `ip`'s family that sends with DF and IPv4 ID 0
/// (IP_PMTUDISC_DO): the header uroce computes its ICRCs for. IPv6
/// sockets are IPv6-only. Not bound yet.
pub fn df_socket(ip: IpAddr) -> io::Result<Socket> {
    let domain = if ip.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let sock = Socket::from(kernel_udp_socket(domain.into())?);
    if ip.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    let fd = sock.as_raw_fd();
    let (level, opt, val) = if ip.is_ipv4() {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    };
    setsockopt_int(fd, level, opt, val)?;
    Ok(sock)
}

/// Sends multicast from `sock` out of the interface of its address `ip`,
/// looped back to this host's members, with TTL 0 unless a message says
/// otherwise (see the module's doc).
fn set_multicast_if(sock: &Socket, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(v4) => {
            sock.set_multicast_ttl_v4(0)?;
            sock.set_multicast_if_v4(&v4)?;
            sock.set_multicast_loop_v4(true)
        }
        IpAddr::V6(_) => {
            sock.set_multicast_hops_v6(0)?;
            // An address on no interface (none found): the kernel's
            // choice, by route.
            if let Ok(i) = ifindex_of(ip) {
                sock.set_multicast_if_v6(i)?;
            }
            sock.set_multicast_loop_v6(true)
        }
    }
}

/// The index of the interface that holds the address `ip`.
fn ifindex_of(ip: IpAddr) -> io::Result<u32> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list we free below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut found = None;
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs made, alive until
        // freeifaddrs; its ifa_addr is NULL or a socket address of the
        // family it names, and ifa_name a C string.
        unsafe {
            let a = (*p).ifa_addr;
            let addr = if a.is_null() {
                None
            } else {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let s = &*(a as *const libc::sockaddr_in);
                        Some(IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()))
                    }
                    libc::AF_INET6 => {
                        let s = &*(a as *const libc::sockaddr_in6);
                        Some(IpAddr::from(s.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            if addr == Some(ip) {
                found = Some(libc::if_nametoindex((*p).ifa_name));
                break;
            }
            p = (*p).ifa_next;
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    match found {
        Some(i) if i != 0 => Ok(i),
        _ => Err(io::Error::from(io::ErrorKind::AddrNotAvailable)),
    }
}

/// Sets both socket buffers to `bytes`: past net.core.{r,w}mem_max where
/// the process may (SO_*BUFFORCE needs CAP_NET_ADMIN), else as far as the
/// limit allows.
pub fn grow_buffers(sock: &Socket, bytes: usize) {
    let fd = sock.as_raw_fd();
    let bytes = i32::try_from(bytes).unwrap_or(i32::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(fd, libc::SOL_SOCKET, force, bytes).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, bytes);
        }
    }
}

fn setsockopt_int(fd: i32, level: i32, opt: i32, val: i32) -> io::Result<()> {
    // SAFETY: passes a pointer to a live i32 and its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &val as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An eventfd the application rings to wake a sleeping engine.
pub struct Doorbell {
    fd: OwnedFd,
    sleeping: AtomicBool,
}

impl Doorbell {
    /// A new doorbell.
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(Doorbell {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            sleeping: AtomicBool::new(false),
        })
    }
    /// Marks the engine as about to sleep (or awake).
    pub fn set_sleeping(&self, s: bool) {
        self.sleeping.store(s, Ordering::SeqCst);
    }
    /// Rings only if the engine sleeps: the hot path costs one atomic load.
    #[inline]
    pub fn ring_if_sleeping(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.ring();
        }
    }
    /// Rings.
    pub fn ring(&self) {
        crate::events::eventfd_add_one(self.fd.as_fd());
    }
    /// Clears the counter.
    pub fn drain(&self) {
        // Non-blocking: at zero the read fails with EAGAIN, which is fine.
        crate::events::eventfd_read(self.fd.as_fd());
    }
}
