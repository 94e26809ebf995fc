//! `uroce rc-pingpong`: rdma-core's `ibv_rc_pingpong`, on uroce.
//!
//! Same options, same out-of-band exchange (TCP, default port 18515: the
//! client sends `"%04x:%06x:%06x:%s\0"` = LID:QPN:PSN:GID with the GID as
//! 32 hex digits of its bytes in order, the server answers in kind, the
//! client sends `"done\0"`), same QP attributes (timeout 14, retry_cnt 7,
//! rnr_retry 7, min_rnr_timer 12, max_(dest_)rd_atomic 1), same buffer
//! content (0x7b, with `-c` a 0 at each page start from the client) and
//! the same result lines, so either side can be the real tool on kernel
//! rxe or a NIC.

use crate::*;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const PAGE: usize = 4096;
/// The exchange message: "0000:000000:000000:" + 32 hex digits + NUL.
const MSG_LEN: usize = 52;

/// Options, as `ibv_rc_pingpong` takes them.
#[derive(Debug, Clone)]
pub struct PingPongOptions {
    /// Server to connect to; `None` = be the server.
    pub server: Option<String>,
    /// TCP port of the exchange.
    pub port: u16,
    /// Device name (default: the first configured device).
    pub ib_dev: Option<String>,
    /// Port of the device (1).
    pub ib_port: u8,
    /// Message size.
    pub size: usize,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Receives posted at a time.
    pub rx_depth: u32,
    /// Exchanges.
    pub iters: u32,
    /// Service level.
    pub sl: u8,
    /// Sleep on CQ events instead of busy polling.
    pub events: bool,
    /// Local GID index (None: no GID sent, as without `-g`).
    pub gid_idx: Option<u32>,
    /// Validate the received buffer.
    pub chk: bool,
}

impl Default for PingPongOptions {
    fn default() -> Self {
        PingPongOptions {
            server: None,
            port: 18515,
            ib_dev: None,
            ib_port: 1,
            size: 4096,
            mtu: 1024,
            rx_depth: 500,
            iters: 1000,
            sl: 0,
            events: false,
            gid_idx: None,
            chk: false,
        }
    }
}

/// One side's address, as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// Initial PSN.
    pub psn: u32,
    /// GID.
    pub gid: [u8; 16],
}

impl Dest {
    /// The exchange message, NUL-terminated.
    pub fn to_wire(&self) -> [u8; MSG_LEN] {
        let gid: String = self.gid.iter().map(|b| format!("{b:02x}")).collect();
        let s = format!("{:04x}:{:06x}:{:06x}:{}", self.lid, self.qpn, self.psn, gid);
        let mut m = [0u8; MSG_LEN];
        m[..s.len()].copy_from_slice(s.as_bytes());
        m
    }
    /// Parses an exchange message.
    pub fn from_wire(m: &[u8]) -> Option<Dest> {
        let s = std::str::from_utf8(m).ok()?.trim_end_matches('\0');
        let mut it = s.split(':');
        let lid = u16::from_str_radix(it.next()?, 16).ok()?;
        let qpn = u32::from_str_radix(it.next()?, 16).ok()?;
        let psn = u32::from_str_radix(it.next()?, 16).ok()?;
        let g = it.next()?;
        if g.len() != 32 {
            return None;
        }
        let mut gid = [0u8; 16];
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(g.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Dest { lid, qpn, psn, gid })
    }
    fn gid_string(&self) -> String {
        std::net::Ipv6Addr::from(self.gid).to_string()
    }
}

/// The result of a run.
#[derive(Debug, Clone, Copy)]
pub struct PingPongResult {
    /// Bytes moved (size × iters × 2).
    pub bytes: u64,
    /// Elapsed time.
    pub elapsed: Duration,
    /// Pages of the received buffer that failed `-c` validation.
    pub invalid_pages: usize,
}

fn fail(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// Runs one side; prints the tool's lines to stdout.
pub fn run(o: &PingPongOptions) -> Result<PingPongResult> {
    let dev = match &o.ib_dev {
        Some(name) => {
            Device::by_name(name).map_err(|_| fail(format!("IB device {name} not found")))?
        }
        None => devices()?
            .into_iter()
            .next()
            .ok_or_else(|| fail("No IB devices found"))?,
    };
    let mtu = Mtu::from_bytes(o.mtu).ok_or_else(|| fail(format!("invalid MTU {}", o.mtu)))?;
    if o.ib_port != 1 {
        return Err(fail(format!(
            "port {}: the device has one port, 1",
            o.ib_port
        )));
    }
    let ctx = dev
        .open()
        .map_err(|e| fail(format!("Couldn't get context for {}: {e}", dev.name())))?;
    let pd = ctx.alloc_pd()?;
    let mr = pd.alloc_mr(o.size.max(1), Access::LOCAL_WRITE)?;
    mr.write(0, &vec![0x7b; o.size])
        .map_err(|e| fail(e.to_string()))?;
    let cq = ctx.create_cq(o.rx_depth + 1)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: o.rx_depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
        srq: None,
    })?;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: o.ib_port,
        ..QpAttr::default()
    };
    qp.modify(
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )
    .map_err(|e| fail(format!("Failed to modify QP to INIT: {e}")))?;
    let recv_wr = RecvWr {
        wr_id: RECV_WRID,
        sg_list: [mr.sge(0, o.size as u32)].into_iter().collect(),
    };
    let post_recvs = |n: u32| -> u32 {
        let mut i = 0;
        while i < n && qp.post_recv(std::slice::from_ref(&recv_wr)).is_ok() {
            i += 1;
        }
        i
    };
    let mut routs = post_recvs(o.rx_depth);
    if routs < o.rx_depth {
        return Err(fail(format!("Couldn't post receive ({routs})")));
    }
    let port = ctx.query_port(o.ib_port)?;
    let gid = match o.gid_idx {
        Some(i) => {
            ctx.query_gid(o.ib_port, i)
                .map_err(|_| fail(format!("can't read sgid of index {i}")))?
                .gid
        }
        None => [0u8; 16],
    };
    let me = Dest {
        lid: port.lid,
        qpn: qp.qp_num(),
        psn: rand::random::<u32>() & 0xff_ffff,
        gid,
    };
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        me.lid,
        me.qpn,
        me.psn,
        me.gid_string()
    );
    let connect = |rem: &Dest, peer: IpAddr| -> Result<()> {
        // Without a GID (no -g on the other side) fall back to the address
        // the exchange came from: RoCE has no LIDs.
        let ip = if rem.gid == [0; 16] {
            peer
        } else {
            provider::qp_attr::ip_of_gid(&rem.gid)
        };
        let av = AddressVector {
            hop_limit: 1,
            sl: o.sl,
            port_num: o.ib_port,
            ..AddressVector::to_ip(ip)
        };
        let params = crate::demo::RcParams {
            mtu,
            rd_atomic: 1,
            timeout: 14,
        };
        crate::demo::rtr_rts(&qp, av, rem.qpn, me.psn, rem.psn, params)
    };
    let rem = match &o.server {
        Some(host) => client_exchange(host, o.port, &me)?,
        None => server_exchange(o.port, &me, |rem, peer| connect(rem, peer))?,
    };
    println!(
        "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        rem.0.lid,
        rem.0.qpn,
        rem.0.psn,
        rem.0.gid_string()
    );
    if o.server.is_some() {
        connect(&rem.0, rem.1)?;
    }

    let mut send = SendWr::new(SEND_WRID, WrOpcode::Send);
    send.flags = SendFlags::SIGNALED;
    send.sg_list.push(mr.sge(0, o.size as u32));
    let mut pending = RECV_WRID;
    if o.server.is_some() {
        if o.chk {
            for i in (0..o.size).step_by(PAGE) {
                mr.write(i, &[0]).map_err(|e| fail(e.to_string()))?;
            }
        }
        qp.post_send(std::slice::from_ref(&send))
            .map_err(|_| fail("Couldn't post send"))?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u32, 0u32);
    let mut wc = [Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); 2];
    while rcnt < o.iters || scnt < o.iters {
        let ne = loop {
            let ne = cq.poll(&mut wc)?;
            if ne > 0 {
                break ne;
            }
            if o.events {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        };
        for w in &wc[..ne] {
            if w.status != WcStatus::Success {
                return Err(fail(format!(
                    "Failed status {} ({}) for wr_id {}",
                    w.status, w.status as u32, w.wr_id
                )));
            }
            match w.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recvs(o.rx_depth - routs);
                        if routs < o.rx_depth {
                            return Err(fail(format!("Couldn't post receive ({routs})")));
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(fail(format!("Completion for unknown wr_id {other}"))),
            }
            pending &= !w.wr_id;
            if scnt < o.iters && pending == 0 {
                qp.post_send(std::slice::from_ref(&send))
                    .map_err(|_| fail("Couldn't post send"))?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let elapsed = start.elapsed();
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = o.size as u64 * o.iters as u64 * 2;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        o.iters,
        usec / 1e6,
        usec / o.iters as f64
    );
    let mut invalid_pages = 0;
    if o.server.is_none() && o.chk {
        // The tool's check (a 0 at each page start), plus: the rest of each
        // page is the 0x7b fill both tools send.
        let buf = mr.to_vec(0, o.size).map_err(|e| fail(e.to_string()))?;
        for (p, page) in buf.chunks(PAGE).enumerate() {
            if page[0] != 0 || page[1..].iter().any(|&b| b != 0x7b) {
                println!("invalid data in page {p}");
                invalid_pages += 1;
            }
        }
    }
    Ok(PingPongResult {
        bytes,
        elapsed,
        invalid_pages,
    })
}

fn client_exchange(host: &str, port: u16, me: &Dest) -> Result<(Dest, IpAddr)> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| fail(format!("{e} for {host}:{port}")))?
        .collect();
    let mut s = addrs
        .iter()
        .find_map(|a| TcpStream::connect(a).ok())
        .ok_or_else(|| fail(format!("Couldn't connect to {host}:{port}")))?;
    let peer = s.peer_addr().map_err(|e| fail(e.to_string()))?.ip();
    s.write_all(&me.to_wire())
        .map_err(|_| fail("Couldn't send local address"))?;
    let mut m = [0u8; MSG_LEN];
    s.read_exact(&mut m)
        .map_err(|_| fail("Couldn't read/write remote address"))?;
    s.write_all(b"done\0")
        .map_err(|_| fail("Couldn't read/write remote address"))?;
    let rem = Dest::from_wire(&m).ok_or_else(|| fail("malformed remote address"))?;
    Ok((rem, peer))
}

fn server_exchange(
    port: u16,
    me: &Dest,
    connect: impl FnOnce(&Dest, IpAddr) -> Result<()>,
) -> Result<(Dest, IpAddr)> {
    let l = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|_| fail(format!("Couldn't listen to port {port}")))?;
    let (mut s, peer) = l.accept().map_err(|_| fail("accept() failed"))?;
    drop(l);
    let peer = match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let mut m = [0u8; MSG_LEN];
    s.read_exact(&mut m)
        .map_err(|_| fail("Couldn't read remote address"))?;
    let rem = Dest::from_wire(&m).ok_or_else(|| fail("malformed remote address"))?;
    connect(&rem, peer).map_err(|e| fail(format!("Couldn't connect to remote QP: {e}")))?;
    s.write_all(&me.to_wire())
        .map_err(|_| fail("Couldn't send/recv local address"))?;
    let mut done = [0u8; 5];
    s.read_exact(&mut done)
        .map_err(|_| fail("Couldn't send/recv local address"))?;
    Ok((rem, peer))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn wire_format() {
        let d = Dest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: provider::qp_attr::gid_of("10.99.0.1".parse().unwrap()),
        };
        let w = d.to_wire();
        assert_eq!(
            &w[..51],
            b"0000:000011:abcdef:00000000000000000000ffff0a630001"
        );
        assert_eq!(w[51], 0);
        assert_eq!(Dest::from_wire(&w), Some(d));
        assert_eq!(d.gid_string(), "::ffff:10.99.0.1");
    }
}
