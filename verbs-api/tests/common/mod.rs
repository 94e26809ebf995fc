//! Set-up the loopback tests share.
#![allow(dead_code)] // each test binary uses its own part

use std::time::Duration;
use uroce_verbs::*;

/// Local write and every remote access but FLUSH.
pub const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

/// How long a test waits for completions or events.
pub const T: Duration = Duration::from_secs(20);

/// Opens a device on a loopback address.
pub fn open(ip: &str) -> Context {
    Device::new("t", ip.parse().unwrap())
        .open()
        .expect("open device")
}

/// Small queues: 64 WRs, 2 SGEs, 64 bytes inline.
pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// A QP of type `t` with one CQ for both queues, optionally on an SRQ.
pub fn qp(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    t: QpType,
    srq: Option<&SharedReceiveQueue>,
) -> QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(),
        qp_type: t,
        sq_sig_all: false,
        srq,
    })
    .unwrap()
}

/// Two devices on `ai` and `bi`, each with a PD, a CQ of 64 entries and
/// a QP of type `t` on it ([`qp`]'s queues), the QPs still in RESET:
/// `(a, b, apd, bpd, acq, bcq, aqp, bqp)`.
pub fn two(ai: &str, bi: &str, t: QpType) -> Two {
    let (a, b) = (open(ai), open(bi));
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(64).unwrap(), b.create_cq(64).unwrap());
    let (aqp, bqp) = (qp(&apd, &acq, t, None), qp(&bpd, &bcq, t, None));
    (a, b, apd, bpd, acq, bcq, aqp, bqp)
}

/// What [`two`] makes.
pub type Two = (
    Context,
    Context,
    ProtectionDomain,
    ProtectionDomain,
    CompletionQueue,
    CompletionQueue,
    QueuePair,
    QueuePair,
);

/// A device on `ip` with a PD, a CQ of 64 entries and a QP of type `t`
/// in RESET: `wrs` WRs of one SGE each way, `inline` bytes inline.
pub fn end(
    ip: &str,
    t: QpType,
    wrs: u32,
    inline: u32,
) -> (Context, ProtectionDomain, CompletionQueue, QueuePair) {
    let ctx = open(ip);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.cq_builder().cqe(64).build().unwrap();
    let qp = pd
        .qp_builder(&cq)
        .qp_type(t)
        .max_send_wr(wrs)
        .max_recv_wr(wrs)
        .max_send_sge(1)
        .max_recv_sge(1)
        .max_inline_data(inline)
        .build()
        .unwrap();
    (ctx, pd, cq, qp)
}

/// Connects the RC QPs `a` (on `a_ip`) and `b` (on `b_ip`) to each other
/// with [`loopback::connect_rc`]'s defaults, PSNs 10 (a) and 20 (b).
pub fn connect(a: &QueuePair, a_ip: &str, b: &QueuePair, b_ip: &str) {
    let p = loopback::RcParams::default();
    loopback::connect_rc(a, b_ip.parse().unwrap(), b.qp_num(), 10, 20, p).unwrap();
    loopback::connect_rc(b, a_ip.parse().unwrap(), a.qp_num(), 20, 10, p).unwrap();
}

/// RESET -> INIT -> RTR -> RTS for a UD QP by hand, as ibv_ud_pingpong
/// does: its Q_Key `qkey`, its first PSN `sq_psn`.
pub fn ud_up(q: &QueuePair, qkey: u32, sq_psn: u32) {
    let a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..QpAttr::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
    q.modify(&a, m).unwrap();
    let a = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    q.modify(&a, AttrMask::STATE).unwrap();
    let a = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        ..QpAttr::default()
    };
    q.modify(&a, AttrMask::STATE | AttrMask::SQ_PSN).unwrap();
}

/// A receive WR over `len` bytes at `off` of `mr`.
pub fn recv(id: u64, mr: &MemoryRegion, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: [mr.sge(off, len)].into_iter().collect(),
    }
}

/// Asks the kernel to report an IPv4 header field with each datagram
/// `s` receives (`IP_RECVTOS`, `IP_RECVTTL`; read by [`recv_datagram`]).
pub fn report_ip_field(s: &std::net::UdpSocket, opt: libc::c_int) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a live socket and a pointer to a live int of the size given.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_IP,
            opt,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt IPPROTO_IP {opt}");
}

/// A datagram read with its IPv4 control messages.
pub struct Datagram {
    /// Its bytes (at most 4200).
    pub bytes: Vec<u8>,
    /// `IP_TOS`, where the socket asked for it (`IP_RECVTOS`).
    pub tos: Option<u8>,
    /// `IP_TTL`, where the socket asked for it (`IP_RECVTTL`).
    pub ttl: Option<u8>,
}

/// The next datagram `s` receives (`recvmsg` with `flags`), with the IP
/// TOS and TTL the kernel reports; `None` if the call fails (EAGAIN with
/// `MSG_DONTWAIT`, or the socket's read timeout).
pub fn recv_datagram(s: &std::net::UdpSocket, flags: libc::c_int) -> Option<Datagram> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; 4200];
    let mut ctl = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: all-zero bytes are a valid msghdr.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&ctl);
    // SAFETY: the header points at `iov` (over `buf`) and `ctl`, live
    // buffers of the lengths it gives; the call writes only there.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut m, flags) };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    let (mut tos, mut ttl) = (None, None);
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of
    // well-formed control messages; the CMSG macros stay inside them.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) => tos = Some(*libc::CMSG_DATA(c)),
                (libc::IPPROTO_IP, libc::IP_TTL) => {
                    let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                    ttl = Some(v as u8);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
    }
    Some(Datagram {
        bytes: buf,
        tos,
        ttl,
    })
}
