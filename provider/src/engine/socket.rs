//! The engine's UDP socket and its eventfd doorbell.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io;
use std::mem::MaybeUninit;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Socket buffer size asked for (the kernel may cap it without
/// CAP_NET_ADMIN; SO_RCVBUFFORCE is tried first).
const SOCK_BUF: usize = 8 << 20;

/// UDP 4791 bound on one address.
pub struct UdpPort {
    sock: Socket,
}

impl UdpPort {
    /// Binds `ip`:4791, non-blocking, with DF and IP ID 0 (IP_PMTUDISC_DO:
    /// the header our ICRC is computed for; see `wire::icrc`).
    pub fn bind(ip: IpAddr) -> io::Result<UdpPort> {
        let domain = if ip.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
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
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(fd, libc::SOL_SOCKET, force, SOCK_BUF as i32).is_err() {
                let _ = setsockopt_int(fd, libc::SOL_SOCKET, plain, SOCK_BUF as i32);
            }
        }
        sock.bind(&SockAddr::from(SocketAddr::new(
            ip,
            uroce_wire::ROCEV2_UDP_PORT,
        )))?;
        sock.set_nonblocking(true)?;
        Ok(UdpPort { sock })
    }

    /// Receives one datagram, if one is waiting.
    pub fn recv(&self, buf: &mut [u8]) -> Option<(usize, SocketAddr)> {
        // SAFETY: u8 and MaybeUninit<u8> have the same layout; recv_from
        // only writes initialised bytes into the buffer.
        let ubuf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        let (n, addr) = self.sock.recv_from(ubuf).ok()?;
        Some((n, addr.as_socket()?))
    }

    /// Sends one datagram; a full socket buffer drops it (the transport
    /// retransmits), as a NIC queue would.
    pub fn send(&self, data: &[u8], to: SocketAddr) {
        let _ = self.sock.send_to(data, &SockAddr::from(to));
    }

    /// Blocks until the socket is readable, the doorbell rings, or
    /// `timeout_ms` passes.
    pub fn wait(&self, bell: &Doorbell, timeout_ms: i32) {
        let mut fds = [
            libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: bell.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfd entries, length passed correctly.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
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
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
    /// Clears the counter.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
    }
}
