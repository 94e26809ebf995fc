//! # Datagram rsockets (`SOCK_DGRAM`), wire-compatible with rsocket.c's
//!
//! As rdma-core's `librdmacm/rsocket.c` (its `ds_*` functions) does it:
//! each socket has a kernel UDP socket (bound where the program binds,
//! its descriptor the socket's number) and one UD QP per local address
//! it sends from (a CM id of the UDP port space, Q_Key `RDMA_UDP_QKEY`).
//!
//! - The first datagrams to a peer go over UDP, behind a 16-byte (IPv4;
//!   28 for IPv6) `struct ds_udp_header`: tag 0x55555555, version,
//!   `RS_OP_DATA`, its length, the sender's QPN and address. The peer
//!   answers with the same header and `RS_OP_CTRL`, carrying its QPN: from
//!   then on datagrams to it go over UD, to its address's RoCE GID.
//! - A UD datagram starts with an 8-byte (IPv4; 24 for IPv6)
//!   `struct ds_header`: version, its length, the sender's port and
//!   address, which `recvfrom` reports.
//! - Receives are `RS_SNDLOWAT` (2048) bytes after a shared 40-byte GRH
//!   area, as rsocket.c posts them.
//!
//! rsocket.c runs a service thread that reads the UDP sockets; here the
//! socket's own calls (`recv`, `send`, `poll_events`) read it, so a
//! datagram that came over UDP waits in the kernel until the program
//! looks.

use crate::cm::{CmId, EventChannel, PortSpace, RDMA_UDP_QKEY};
use crate::rsocket::{create_endpoint, err, verbs_err};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::io::{Error as IoError, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use uroce_verbs::{
    Access, CompChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCap, QpType,
    QueuePair, RecvWr, SendWr, UdDest, WrOpcode,
};

/// `RS_SNDLOWAT`: a datagram's largest size with its header.
const MSG_SIZE: usize = 2048;
/// `sizeof(struct ibv_grh)`.
const GRH_LEN: usize = 40;
const DS_UDP_TAG: u32 = 0x5555_5555;
const DS_IPV4_HDR_LEN: u8 = 8;
const DS_IPV6_HDR_LEN: u8 = 24;
const DS_UDP_IPV4_HDR_LEN: u8 = 16;
const DS_UDP_IPV6_HDR_LEN: u8 = 28;
const OP_DATA: u8 = 0;
const OP_CTRL: u8 = 7;
/// rsocket.c's defaults for datagram queues.
const DEF_QSIZE: u32 = 384;

/// `struct ds_header` for a sender at `a`.
fn ds_header(a: SocketAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(24);
    match a {
        SocketAddr::V4(v4) => {
            h.extend_from_slice(&[4, DS_IPV4_HDR_LEN]);
            h.extend_from_slice(&v4.port().to_be_bytes());
            h.extend_from_slice(&v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            h.extend_from_slice(&[6, DS_IPV6_HDR_LEN]);
            h.extend_from_slice(&v6.port().to_be_bytes());
            h.extend_from_slice(&v6.flowinfo().to_be_bytes());
            h.extend_from_slice(&v6.ip().octets());
        }
    }
    h
}

/// The sender a `ds_header` names, and its length; `None` if it is not
/// one (`ds_valid_recv`).
fn parse_ds_header(b: &[u8]) -> Option<(SocketAddr, usize)> {
    match (b.first(), b.get(1)) {
        (Some(4), Some(&DS_IPV4_HDR_LEN)) if b.len() >= 8 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some((SocketAddr::new(ip.into(), port), 8))
        }
        (Some(6), Some(&DS_IPV6_HDR_LEN)) if b.len() >= 24 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            Some((SocketAddr::new(Ipv6Addr::from(ip).into(), port), 24))
        }
        _ => None,
    }
}

/// `struct ds_udp_header` from a QP with number `qpn` at `src`.
fn udp_header(op: u8, qpn: u32, src: IpAddr) -> Vec<u8> {
    let mut h = Vec::with_capacity(28);
    h.extend_from_slice(&DS_UDP_TAG.to_be_bytes());
    match src {
        IpAddr::V4(v4) => {
            h.extend_from_slice(&[4, op, DS_UDP_IPV4_HDR_LEN, 0]);
            h.extend_from_slice(&(qpn & 0xFF_FFFF).to_be_bytes());
            h.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            h.extend_from_slice(&[6, op, DS_UDP_IPV6_HDR_LEN, 0]);
            h.extend_from_slice(&(qpn & 0xFF_FFFF).to_be_bytes());
            h.extend_from_slice(&v6.octets());
        }
    }
    h
}

/// A UDP header's op, QPN and length, if it is valid for a datagram
/// from `from` (`udp_svc_valid_udp_hdr`).
fn parse_udp_header(b: &[u8], from: SocketAddr) -> Option<(u8, u32, usize)> {
    if b.len() < usize::from(DS_UDP_IPV4_HDR_LEN)
        || u32::from_be_bytes(b[0..4].try_into().ok()?) != DS_UDP_TAG
    {
        return None;
    }
    let len = match (b[4], from) {
        (4, SocketAddr::V4(_)) if b[6] == DS_UDP_IPV4_HDR_LEN => DS_UDP_IPV4_HDR_LEN,
        (6, SocketAddr::V6(_)) if b[6] == DS_UDP_IPV6_HDR_LEN => DS_UDP_IPV6_HDR_LEN,
        _ => return None,
    };
    let len = usize::from(len);
    if b.len() < len {
        return None;
    }
    let qpn = u32::from_be_bytes(b[8..12].try_into().ok()?) & 0xFF_FFFF;
    Some((b[5], qpn, len))
}

/// One UD QP, for datagrams from one local address. Field order is drop
/// order.
struct DsQp {
    qp: Arc<QueuePair>,
    /// Send slots of [`MSG_SIZE`] bytes, one per send queue entry.
    smr: MemoryRegion,
    /// Receive slots of [`MSG_SIZE`] bytes, then the GRH area.
    rmr: MemoryRegion,
    cq: CompletionQueue,
    comp: CompChannel,
    _pd: ProtectionDomain,
    ctx: Context,
    id: CmId,
    _ch: EventChannel,
    /// Where its datagrams say they come from (the socket's port).
    src: SocketAddr,
    hdr: Vec<u8>,
    free: Vec<u32>,
    armed: bool,
}

/// A received datagram not yet read.
enum Rmsg {
    /// In receive slot `offset` of QP `qp`, `len` bytes with the header.
    Ud { qp: usize, offset: u32, len: u32 },
    /// Came over UDP.
    Udp { from: SocketAddr, data: Vec<u8> },
}

#[derive(Default)]
struct DState {
    nonblock: bool,
    qps: Vec<DsQp>,
    /// Destinations: the QP that sends to each, and the peer's QPN once
    /// known (then datagrams go over UD).
    dests: HashMap<SocketAddr, (usize, Option<u32>)>,
    conn: Option<SocketAddr>,
    rmsgs: VecDeque<Rmsg>,
}

/// `rs_any_addr`: the wildcard, or THE loopback address (127.0.0.1 or
/// ::1; not the rest of 127/8, where uroce's devices live: a socket
/// bound to one of them sends from it).
fn any_addr(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified() || v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6.is_unspecified() || v6 == Ipv6Addr::LOCALHOST,
    }
}

/// A datagram rsocket (`rsocket(AF_INET, SOCK_DGRAM, 0)`).
pub struct DSocket {
    udp: UdpSocket,
    st: Mutex<DState>,
}

impl std::fmt::Debug for DSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DSocket")
            .field("fd", &self.udp.as_raw_fd())
            .finish()
    }
}

impl DSocket {
    /// `rsocket(domain, SOCK_DGRAM, 0)`: its UDP socket, not yet bound.
    pub fn new(ipv6: bool) -> Result<DSocket> {
        let domain = if ipv6 { libc::AF_INET6 } else { libc::AF_INET };
        let owned = uroce_provider::device::kernel_udp_socket(domain)?;
        Ok(DSocket {
            udp: UdpSocket::from(owned),
            st: Mutex::new(DState::default()),
        })
    }

    /// The descriptor this socket is known by (its UDP socket's).
    pub fn fd(&self) -> RawFd {
        self.udp.as_raw_fd()
    }

    /// `call` (bind(2) or connect(2)) of the UDP socket with `a`.
    fn with_sockaddr(
        &self,
        a: SocketAddr,
        call: unsafe extern "C" fn(
            libc::c_int,
            *const libc::sockaddr,
            libc::socklen_t,
        ) -> libc::c_int,
    ) -> Result<()> {
        let (sa, len) = sockaddr(a);
        // SAFETY: `call` is bind(2) or connect(2) (this file's callers),
        // given a sockaddr of `len` bytes that lives across the call.
        let r = unsafe {
            call(
                self.fd(),
                (&sa as *const libc::sockaddr_storage).cast(),
                len,
            )
        };
        if r < 0 {
            return Err(IoError::last_os_error());
        }
        Ok(())
    }

    /// `rbind`: binds the UDP socket.
    pub fn bind(&self, a: SocketAddr) -> Result<()> {
        self.with_sockaddr(a, libc::bind)
    }

    /// An unbound socket is bound (as sendto(2) and connect(2) would) to
    /// the address of the device towards `to`, so that the UDP datagrams
    /// and the UD ones say the same sender and answers over UDP find it.
    fn bind_towards(&self, to: SocketAddr) -> Result<()> {
        if self.udp.local_addr()?.port() != 0 {
            return Ok(());
        }
        let d = crate::cm::device_towards(to.ip()).map_err(verbs_err)?;
        self.bind(SocketAddr::new(d.ip(), 0))
    }

    /// `rconnect`: the default destination (and the UDP socket's peer).
    pub fn connect(&self, a: SocketAddr) -> Result<()> {
        self.bind_towards(a)?;
        self.with_sockaddr(a, libc::connect)?;
        let mut st = self.st.lock();
        self.dest(&mut st, a)?;
        st.conn = Some(a);
        Ok(())
    }

    /// `rgetsockname`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.udp.local_addr().ok()
    }
    /// `rgetpeername`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.udp.peer_addr().ok()
    }
    /// `O_NONBLOCK`.
    pub fn set_nonblocking(&self, on: bool) {
        self.st.lock().nonblock = on;
    }
    /// Whether the socket is non-blocking.
    pub fn nonblocking_flag(&self) -> bool {
        self.st.lock().nonblock
    }

    /// `ds_get_src_addr`: the local address datagrams to `to` leave from
    /// (the bound one, or for a wildcard or loopback address the device
    /// the CM resolves `to` from), with the socket's port.
    fn src_for(&self, to: SocketAddr) -> Result<SocketAddr> {
        self.bind_towards(to)?;
        let mut src = self.udp.local_addr()?;
        if any_addr(src.ip()) {
            // rsocket.c asks the kernel's route; the device uroce's CM
            // would resolve `to` from is the one that can send.
            let d = crate::cm::device_towards(to.ip()).map_err(verbs_err)?;
            src.set_ip(d.ip());
        }
        Ok(src)
    }

    /// `ds_get_dest`: the destination entry for `to`, with a QP for it.
    fn dest(&self, st: &mut DState, to: SocketAddr) -> Result<usize> {
        if let Some(&(q, _)) = st.dests.get(&to) {
            return Ok(q);
        }
        let src = self.src_for(to)?;
        let q = match st.qps.iter().position(|q| q.src.ip() == src.ip()) {
            Some(q) => q,
            None => {
                st.qps.push(create_qp(src)?);
                st.qps.len() - 1
            }
        };
        st.dests.insert(to, (q, None));
        Ok(q)
    }

    /// Reads what waits on the UDP socket (`udp_svc_process_rs`): a
    /// datagram is kept for the program and answered with our QPN; an
    /// answer tells us the peer's.
    fn process_udp(&self, st: &mut DState) {
        let mut buf = [0u8; MSG_SIZE];
        loop {
            // SAFETY: buf is ours for the call; the address is written
            // into a sockaddr_storage of the size given.
            let (n, from) = unsafe {
                let mut ss: libc::sockaddr_storage = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                let n = libc::recvfrom(
                    self.fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                );
                (n, from_sockaddr(&ss))
            };
            if n < 0 {
                return;
            }
            let Some(from) = from else { continue };
            let b = &buf[..n as usize];
            let Some((op, qpn, hlen)) = parse_udp_header(b, from) else {
                continue;
            };
            let Ok(q) = self.dest(st, from) else { continue };
            if op == OP_DATA {
                let qp = &st.qps[q];
                let h = udp_header(OP_CTRL, qp.qp.qp_num(), qp.src.ip());
                let _ = self.udp.send_to(&h, from);
                st.rmsgs.push_back(Rmsg::Udp {
                    from,
                    data: b[hlen..].to_vec(),
                });
            }
            if let Some(d) = st.dests.get_mut(&from) {
                d.1 = Some(qpn);
            }
        }
    }

    /// `ds_poll_cqs`: datagrams received over UD, send slots freed.
    fn poll_cqs(st: &mut DState) {
        let mut wcs = [uroce_verbs::Wc::new(
            0,
            uroce_verbs::WcStatus::Success,
            uroce_verbs::WcOpcode::Send,
            0,
        ); 16];
        for (i, q) in st.qps.iter_mut().enumerate() {
            loop {
                let n = q.cq.poll(&mut wcs).unwrap_or(0);
                if n == 0 {
                    break;
                }
                for wc in &wcs[..n] {
                    let offset = wc.wr_id as u32;
                    if wc.wr_id & WR_RECV == 0 {
                        q.free.push(offset);
                        continue;
                    }
                    let len = wc.byte_len.saturating_sub(GRH_LEN as u32);
                    let mut h = [0u8; 24];
                    let ok = wc.status == uroce_verbs::WcStatus::Success
                        && q.rmr.read(offset as usize, &mut h).is_ok()
                        && parse_ds_header(&h).is_some_and(|(_, hl)| len as usize >= hl);
                    if ok {
                        st.rmsgs.push_back(Rmsg::Ud { qp: i, offset, len });
                    } else {
                        let _ = post_recv(q, offset);
                    }
                }
            }
        }
    }

    fn nonblocking(&self, st: &DState, flags: i32) -> bool {
        st.nonblock || flags & libc::MSG_DONTWAIT != 0
    }

    /// `rrecvfrom`: one datagram (cut to `buf`), and who sent it.
    pub fn recv_from(&self, buf: &mut [u8], flags: i32) -> Result<(usize, SocketAddr)> {
        let mut st = self.st.lock();
        let nonblock = self.nonblocking(&st, flags);
        loop {
            self.process_udp(&mut st);
            Self::poll_cqs(&mut st);
            if !st.rmsgs.is_empty() {
                break;
            }
            if nonblock {
                return Err(err(libc::EAGAIN));
            }
            let mut fds = self.arm(&mut st);
            self.process_udp(&mut st);
            Self::poll_cqs(&mut st);
            if !st.rmsgs.is_empty() {
                break;
            }
            drop(st);
            // SAFETY: our own array of pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 500) };
            st = self.st.lock();
            drain_events(&mut st);
        }
        let peek = flags & libc::MSG_PEEK != 0;
        let m = st.rmsgs.front().expect("a datagram");
        let (n, from) = match m {
            Rmsg::Udp { from, data } => {
                let n = data.len().min(buf.len());
                buf[..n].copy_from_slice(&data[..n]);
                (n, *from)
            }
            &Rmsg::Ud { qp, offset, len } => {
                let q = &st.qps[qp];
                let mut h = [0u8; 24];
                q.rmr
                    .read(offset as usize, &mut h)
                    .map_err(|_| err(libc::EIO))?;
                let (from, hl) = parse_ds_header(&h).ok_or_else(|| err(libc::EIO))?;
                let n = (len as usize - hl).min(buf.len());
                q.rmr
                    .read(offset as usize + hl, &mut buf[..n])
                    .map_err(|_| err(libc::EIO))?;
                (n, from)
            }
        };
        if !peek {
            if let Some(Rmsg::Ud { qp, offset, .. }) = st.rmsgs.pop_front() {
                let _ = post_recv(&st.qps[qp], offset);
            }
        }
        Ok((n, from))
    }

    /// `rsend` on a connected socket.
    pub fn send(&self, buf: &[u8], flags: i32) -> Result<usize> {
        let to = self.st.lock().conn.ok_or_else(|| err(libc::EDESTADDRREQ))?;
        self.send_to(buf, flags, to)
    }

    /// `rsendto`: over UDP until the peer's QPN is known, then over UD.
    pub fn send_to(&self, buf: &[u8], flags: i32, to: SocketAddr) -> Result<usize> {
        let mut st = self.st.lock();
        let nonblock = self.nonblocking(&st, flags);
        let q = self.dest(&mut st, to)?;
        self.process_udp(&mut st);
        let qpn = st.dests.get(&to).and_then(|d| d.1);
        let Some(qpn) = qpn else {
            let qp = &st.qps[q];
            let mut m = udp_header(OP_DATA, qp.qp.qp_num(), qp.src.ip());
            if buf.len() + m.len() > MSG_SIZE {
                return Err(err(libc::EMSGSIZE));
            }
            m.extend_from_slice(buf);
            self.udp.send_to(&m, to)?;
            return Ok(buf.len());
        };
        if buf.len() + st.qps[q].hdr.len() > MSG_SIZE {
            return Err(err(libc::EMSGSIZE));
        }
        loop {
            Self::poll_cqs(&mut st);
            if !st.qps[q].free.is_empty() {
                break;
            }
            if nonblock {
                return Err(err(libc::EAGAIN));
            }
            drop(st);
            std::thread::sleep(Duration::from_micros(50));
            st = self.st.lock();
        }
        let qp = &mut st.qps[q];
        let slot = qp.free.pop().expect("a free slot");
        let hl = qp.hdr.len();
        qp.smr
            .write(slot as usize, &qp.hdr)
            .and_then(|()| qp.smr.write(slot as usize + hl, buf))
            .map_err(|_| err(libc::EIO))?;
        let mut w = SendWr::new(u64::from(slot), WrOpcode::Send);
        w.sg_list
            .push(qp.smr.sge(slot as usize, (hl + buf.len()) as u32));
        w.ud = Some(UdDest {
            ip: to.ip(),
            remote_qpn: qpn,
            remote_qkey: RDMA_UDP_QKEY,
            tclass: 0,
            // Unicast: the route's TTL is sent whatever this says.
            hop_limit: 64,
        });
        if let Err((_, e)) = qp.qp.post_send(&[w]) {
            qp.free.push(slot);
            return Err(verbs_err(e));
        }
        Ok(buf.len())
    }

    /// `rpoll`'s look at the socket, without waiting.
    pub fn poll_events(&self, events: i16) -> i16 {
        let mut st = self.st.lock();
        drain_events(&mut st);
        self.process_udp(&mut st);
        Self::poll_cqs(&mut st);
        let mut r = 0;
        if events & libc::POLLIN != 0 && !st.rmsgs.is_empty() {
            r |= libc::POLLIN;
        }
        // A send can go over UDP at any time; over UD when a slot is free.
        if events & libc::POLLOUT != 0 {
            r |= libc::POLLOUT;
        }
        r
    }

    /// Arms the socket for a wait: the descriptors to wait on (its UDP
    /// socket and each QP's completion channel).
    pub fn wait_fds(&self) -> Vec<RawFd> {
        let mut st = self.st.lock();
        self.arm(&mut st).iter().map(|p| p.fd).collect()
    }

    fn arm(&self, st: &mut DState) -> Vec<libc::pollfd> {
        let mut fds = vec![libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        for q in &mut st.qps {
            if !q.armed && q.cq.req_notify(false).is_ok() {
                q.armed = true;
            }
            fds.push(libc::pollfd {
                fd: q.comp.fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        fds
    }

    /// Packets received by the devices the socket's QPs are on (their
    /// `rcvd_pkts` counters): what came over RoCE.
    pub fn rcvd_pkts(&self) -> u64 {
        let st = self.st.lock();
        st.qps.iter().map(|q| q.ctx.counters().rcvd_pkts).sum()
    }

    /// `rclose`.
    pub fn close(&self) {
        let mut st = self.st.lock();
        for q in st.qps.drain(..) {
            let _ = q.id.detach_qp();
            q.id.destroy();
        }
        st.dests.clear();
        st.rmsgs.clear();
    }
}

/// A receive's wr_id flag (`RS_WR_ID_FLAG_RECV`).
const WR_RECV: u64 = 1 << 63;

fn drain_events(st: &mut DState) {
    for q in &mut st.qps {
        let mut n = 0;
        while q.comp.try_get_cq_event().is_ok() {
            n += 1;
            q.armed = false;
        }
        if n > 0 {
            q.cq.ack_events(n);
        }
    }
}

/// `ds_post_recv`: the GRH into the shared area, the datagram into slot
/// `offset`.
fn post_recv(q: &DsQp, offset: u32) -> Result<()> {
    let grh_at = q.rmr.len() - GRH_LEN;
    let mut w = RecvWr {
        wr_id: WR_RECV | u64::from(offset),
        sg_list: Default::default(),
    };
    w.sg_list.push(q.rmr.sge(grh_at, GRH_LEN as u32));
    w.sg_list.push(q.rmr.sge(offset as usize, MSG_SIZE as u32));
    q.qp.post_recv(&[w]).map_err(|(_, e)| verbs_err(e))
}

/// `ds_create_qp`: a UD QP on the device of `src`, every receive posted.
fn create_qp(src: SocketAddr) -> Result<DsQp> {
    let ch = EventChannel::new().map_err(verbs_err)?;
    let id = CmId::new(&ch, PortSpace::Udp).map_err(verbs_err)?;
    id.bind_addr(src).map_err(verbs_err)?;
    let ctx = id.context().ok_or_else(|| err(libc::EADDRNOTAVAIL))?;
    let cap = QpCap {
        max_send_wr: DEF_QSIZE,
        max_recv_wr: DEF_QSIZE,
        max_send_sge: 1,
        max_recv_sge: 2,
        max_inline_data: 0,
    };
    let (pd, comp, cq, qp) = create_endpoint(&ctx, &id, 2 * DEF_QSIZE, QpType::Ud, cap)?;
    let slots = DEF_QSIZE as usize * MSG_SIZE;
    let smr = pd.alloc_mr(slots, Access::LOCAL_WRITE).map_err(verbs_err)?;
    let rmr = pd
        .alloc_mr(slots + GRH_LEN, Access::LOCAL_WRITE)
        .map_err(verbs_err)?;
    let q = DsQp {
        qp,
        smr,
        rmr,
        cq,
        comp,
        _pd: pd,
        ctx,
        id,
        _ch: ch,
        src,
        hdr: ds_header(src),
        free: (0..DEF_QSIZE).map(|i| i * MSG_SIZE as u32).collect(),
        armed: false,
    };
    for i in 0..DEF_QSIZE {
        post_recv(&q, i * MSG_SIZE as u32)?;
    }
    Ok(q)
}

fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says a sockaddr_in is there.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says a sockaddr_in6 is there.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_rsocket_c_layout() {
        let a: SocketAddr = "10.1.2.3:4660".parse().unwrap();
        assert_eq!(ds_header(a), [4, 8, 0x12, 0x34, 10, 1, 2, 3]);
        assert_eq!(parse_ds_header(&ds_header(a)), Some((a, 8)));
        let u = udp_header(OP_DATA, 0xABCDEF, a.ip());
        assert_eq!(
            u,
            [0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0, 0xAB, 0xCD, 0xEF, 10, 1, 2, 3]
        );
        assert_eq!(parse_udp_header(&u, a), Some((OP_DATA, 0xABCDEF, 16)));
        let v6: SocketAddr = "[::1]:5".parse().unwrap();
        assert_eq!(
            parse_udp_header(&u, v6),
            None,
            "version and family must agree"
        );
        assert_eq!(parse_ds_header(&[4, 9, 0, 0, 0, 0, 0, 0]), None);
    }
}
