//! `uroce rc-pingpong`, `uc-pingpong`, `ud-pingpong` and `srq-pingpong`:
//! rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong` and
//! `ibv_srq_pingpong`, on uroce, so that either side can be the real tool
//! on kernel rxe or a NIC.
//!
//! What the tools share, and uroce with them:
//! - the out-of-band exchange over TCP (default port 18515): the client
//!   sends `"%04x:%06x:%06x:%s\0"` = LID:QPN:PSN:GID (the GID as 32 hex
//!   digits of its bytes in order), the server connects its QP and answers
//!   in kind, the client sends `"done\0"`. `ibv_srq_pingpong` sends 256
//!   such messages each way (its MAX_QP), the unused ones all zeros;
//! - the QP attributes: RC timeout 14, retry_cnt 7, rnr_retry 7,
//!   min_rnr_timer 12, max_(dest_)rd_atomic 1; UC only the path, PSNs and
//!   QPN; UD Q_Key 0x11111111 and an address handle (hop limit 64);
//! - the buffer: 0x7b (SRQ: zeros); with `-c` the client puts a 0 at each
//!   page start and the server checks it. UD buffers are the message plus
//!   the 40-byte GRH area in front: sends start at offset 40, and so does
//!   the received data;
//! - the loop: a send is posted once the previous send and a receive have
//!   completed (per QP for SRQ), receives are reposted when one (SRQ:
//!   `num_qp`) is left; `-e` sleeps on a completion channel (req_notify,
//!   get_cq_event, ack_events at the end);
//! - the result lines.
//!
//! When a side sends no GID (no `-g`), the QP is addressed to the IP the
//! exchange came from: RoCE has no LIDs.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use uroce_verbs::*;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const PAGE: usize = 4096;
/// The exchange message: "0000:000000:000000:" + 32 hex digits + NUL.
const MSG_LEN: usize = 52;
/// `ibv_ud_pingpong`'s Q_Key.
pub const UD_QKEY: u32 = 0x1111_1111;
/// The GRH area in front of every UD receive buffer.
const GRH_LEN: usize = 40;
/// `ibv_srq_pingpong` always exchanges this many addresses (its MAX_QP).
pub const SRQ_MAX_QP: u32 = 256;

/// Which tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ibv_rc_pingpong`.
    Rc,
    /// `ibv_uc_pingpong`.
    Uc,
    /// `ibv_ud_pingpong`.
    Ud,
    /// `ibv_srq_pingpong`: `num_qp` RC QPs sharing one SRQ.
    Srq,
}

impl Kind {
    /// The tool's default message size.
    pub const fn default_size(self) -> usize {
        match self {
            Kind::Ud => 1024,
            _ => 4096,
        }
    }
    fn qp_type(self) -> QpType {
        match self {
            Kind::Rc | Kind::Srq => QpType::Rc,
            Kind::Uc => QpType::Uc,
            Kind::Ud => QpType::Ud,
        }
    }
    /// Bytes in front of the message in the buffer.
    fn offset(self) -> usize {
        if self == Kind::Ud {
            GRH_LEN
        } else {
            0
        }
    }
    /// The byte the buffer is filled with.
    fn fill(self) -> u8 {
        if self == Kind::Srq {
            0
        } else {
            0x7b
        }
    }
}

/// Options, as the tools take them.
#[derive(Debug, Clone)]
pub struct PingPongOptions {
    /// Which tool.
    pub kind: Kind,
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
    /// Path MTU in bytes (RC, UC, SRQ; UD uses the port's active MTU).
    pub mtu: u32,
    /// Receives posted at a time.
    pub rx_depth: u32,
    /// Exchanges (SRQ: in all, over every QP).
    pub iters: u32,
    /// Service level.
    pub sl: u8,
    /// Sleep on CQ events instead of busy polling.
    pub events: bool,
    /// Local GID index (None: no GID sent, as without `-g`).
    pub gid_idx: Option<u32>,
    /// Validate the received buffer.
    pub chk: bool,
    /// SRQ: number of QPs.
    pub num_qp: u32,
}

impl PingPongOptions {
    /// The tool's defaults.
    pub fn new(kind: Kind) -> Self {
        PingPongOptions {
            kind,
            server: None,
            port: 18515,
            ib_dev: None,
            ib_port: 1,
            size: kind.default_size(),
            mtu: 1024,
            rx_depth: 500,
            iters: 1000,
            sl: 0,
            events: false,
            gid_idx: None,
            chk: false,
            num_qp: 16,
        }
    }
}

impl Default for PingPongOptions {
    fn default() -> Self {
        PingPongOptions::new(Kind::Rc)
    }
}

/// One side's address, as exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
    /// Completion events taken (`-e`).
    pub cq_events: u32,
}

fn fail(msg: impl Into<String>) -> Error {
    Error::Invalid(msg.into())
}

/// Runs one side; prints the tool's lines to stdout.
pub fn run(o: &PingPongOptions) -> Result<PingPongResult> {
    let side = Side::open(o)?;
    let routs = side.post_recvs(o.rx_depth);
    if routs < o.rx_depth {
        return Err(fail(format!("Couldn't post receive ({routs})")));
    }
    if o.events {
        side.cq
            .req_notify(false)
            .map_err(|_| fail("Couldn't request CQ notification"))?;
    }
    let (rem, ah) = side.exchange(o)?;
    let sends = side.sends(o, &rem, ah.as_ref());
    if o.server.is_some() {
        if o.chk {
            for i in (0..o.size).step_by(PAGE) {
                side.mr
                    .write(side.off + i, &[0])
                    .map_err(|e| fail(e.to_string()))?;
            }
        }
        for (i, send) in sends.iter().enumerate() {
            side.post_send(i, send)?;
        }
    }
    let start = Instant::now();
    let cq_events = side.ping_pong(o, &sends, routs)?;
    let elapsed = start.elapsed();
    let bytes = o.size as u64 * o.iters as u64 * 2;
    print_rates(bytes, o.iters, elapsed);
    let invalid_pages = if o.server.is_none() && o.chk {
        side.invalid_pages(o.size)?
    } else {
        0
    };
    side.cq.ack_events(cq_events);
    Ok(PingPongResult {
        bytes,
        elapsed,
        invalid_pages,
        cq_events,
    })
}

/// The tools' two result lines.
fn print_rates(bytes: u64, iters: u32, elapsed: Duration) {
    let usec = elapsed.as_secs_f64() * 1e6;
    println!(
        "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
        bytes,
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        iters,
        usec / 1e6,
        usec / iters as f64
    );
}

/// One side's verbs objects, as the options make them. The fields are in
/// the order they are dropped: the QPs before the SRQ, CQ and region
/// their WRs name, the context last.
struct Side {
    qps: Vec<QueuePair>,
    srq: Option<SharedReceiveQueue>,
    cq: CompletionQueue,
    mr: MemoryRegion,
    pd: ProtectionDomain,
    channel: Option<CompChannel>,
    port: PortAttr,
    ctx: Context,
    dev: Device,
    kind: Kind,
    mtu: Mtu,
    /// Bytes in front of the message in the buffer ([`Kind::offset`]).
    off: usize,
    /// The receive every slot is posted with: the whole buffer.
    recv_wr: RecvWr,
}

impl Side {
    /// The device, its context, and the buffer, CQ (with its completion
    /// channel under `-e`), SRQ and QPs (in INIT), as the tools make them,
    /// each failure with the tool's words.
    fn open(o: &PingPongOptions) -> Result<Side> {
        let kind = o.kind;
        let nqp = if kind == Kind::Srq { o.num_qp } else { 1 };
        if nqp == 0 || nqp > SRQ_MAX_QP {
            return Err(fail(format!("num_qp {nqp}: must be 1..={SRQ_MAX_QP}")));
        }
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
        let port = ctx.query_port(o.ib_port)?;
        if kind == Kind::Ud && o.size > port.active_mtu.bytes() as usize {
            return Err(fail(format!(
                "Requested size larger than port MTU ({})",
                port.active_mtu.bytes()
            )));
        }
        let channel = if o.events {
            Some(
                ctx.create_comp_channel()
                    .map_err(|e| fail(format!("Couldn't create completion channel: {e}")))?,
            )
        } else {
            None
        };
        let pd = ctx.alloc_pd()?;
        let off = kind.offset();
        let buf_len = o.size + off;
        let mr = pd.alloc_mr(buf_len.max(1), Access::LOCAL_WRITE)?;
        mr.write(0, &vec![kind.fill(); buf_len])
            .map_err(|e| fail(e.to_string()))?;
        let cq = ctx
            .create_cq_with(o.rx_depth + nqp, 0, channel.as_ref())
            .map_err(|e| fail(format!("Couldn't create CQ: {e}")))?;
        let srq = if kind == Kind::Srq {
            Some(
                pd.create_srq(&SrqAttr {
                    max_wr: o.rx_depth,
                    max_sge: 1,
                    srq_limit: 0,
                })
                .map_err(|e| fail(format!("Couldn't create SRQ: {e}")))?,
            )
        } else {
            None
        };
        let qps = (0..nqp)
            .map(|_| init_qp(o, &pd, &cq, srq.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let recv_wr = RecvWr {
            wr_id: RECV_WRID,
            sg_list: [mr.sge(0, buf_len as u32)].into_iter().collect(),
        };
        Ok(Side {
            qps,
            srq,
            cq,
            mr,
            pd,
            channel,
            port,
            ctx,
            dev,
            kind,
            mtu,
            off,
            recv_wr,
        })
    }

    /// Posts up to `n` receives (to the SRQ, else the QP); how many went.
    fn post_recvs(&self, n: u32) -> u32 {
        let mut i = 0;
        while i < n {
            let posted = match &self.srq {
                Some(srq) => srq.post_recv(std::slice::from_ref(&self.recv_wr)),
                None => self.qps[0].post_recv(std::slice::from_ref(&self.recv_wr)),
            };
            if posted.is_err() {
                break;
            }
            i += 1;
        }
        i
    }

    /// The exchange: prints the local addresses, trades them for the
    /// peer's over TCP (the server connects its QPs in between), prints
    /// the remote ones and connects the client's QPs. Returns the remote
    /// addresses and, for UD, the address handle of the peer.
    fn exchange(&self, o: &PingPongOptions) -> Result<(Vec<Dest>, Option<AddressHandle>)> {
        let kind = self.kind;
        let gid = match o.gid_idx {
            Some(i) => {
                self.ctx
                    .query_gid(o.ib_port, i)
                    .map_err(|_| fail(format!("Could not get local gid for gid index {i}")))?
                    .gid
            }
            None => [0u8; 16],
        };
        let me: Vec<Dest> = self
            .qps
            .iter()
            .map(|qp| Dest {
                lid: self.port.lid,
                qpn: qp.qp_num(),
                psn: uroce_provider::wire::Psn::random().value(),
                gid,
            })
            .collect();
        // ibv_ud_pingpong prints "PSN 0x...: GID" (sic).
        let sep = if kind == Kind::Ud { ":" } else { "," };
        for d in &me {
            println!(
                "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
                d.lid,
                d.qpn,
                d.psn,
                d.gid_string()
            );
        }
        // SRQ exchanges all 256 slots, the unused ones zero.
        let mut slots = me.clone();
        if kind == Kind::Srq {
            slots.resize(SRQ_MAX_QP as usize, Dest::default());
        }
        let mut ah: Option<AddressHandle> = None;
        let mut connect = |rem: &[Dest], peer: IpAddr| -> Result<()> {
            ah = self.connect(o, &me, rem, peer)?;
            Ok(())
        };
        let (rem, peer) = match &o.server {
            Some(host) => client_exchange(host, o.port, self.dev.ip(), &slots)?,
            None => server_exchange(o.port, &slots, &mut connect)?,
        };
        for r in &rem[..self.qps.len()] {
            println!(
                "  remote address: LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
                r.lid,
                r.qpn,
                r.psn,
                r.gid_string()
            );
        }
        if o.server.is_some() {
            connect(&rem, peer)?;
        }
        Ok((rem, ah))
    }

    /// Brings each QP to RTS towards its remote address; for UD returns
    /// the address handle of the (last) peer.
    fn connect(
        &self,
        o: &PingPongOptions,
        me: &[Dest],
        rem: &[Dest],
        peer: IpAddr,
    ) -> Result<Option<AddressHandle>> {
        if rem.len() < self.qps.len() {
            return Err(fail("too few remote addresses"));
        }
        // rc_pingpong's values: one READ/atomic outstanding, timeout 14,
        // retries 7 (RC); UC and UD take what they have of them.
        let opts = ConnectOptions {
            path_mtu: Some(self.mtu),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..ConnectOptions::default()
        };
        let mut ah = None;
        for (i, qp) in self.qps.iter().enumerate() {
            let r = &rem[i];
            // Without a GID (no -g on the other side) fall back to the
            // address the exchange came from.
            let ip = if r.gid == [0; 16] {
                peer
            } else {
                uroce_provider::qp_attr::ip_of_gid(&r.gid)
            };
            let av = AddressVector {
                hop_limit: if self.kind == Kind::Ud { 64 } else { 1 },
                sl: o.sl,
                port_num: o.ib_port,
                ..AddressVector::to_ip(ip)
            };
            qp.rtr_rts(&av, r.qpn, r.psn, me[i].psn, &opts)?;
            if self.kind == Kind::Ud {
                ah = Some(
                    self.pd
                        .create_ah(&av)
                        .map_err(|e| fail(format!("Failed to create AH: {e}")))?,
                );
            }
        }
        Ok(ah)
    }

    /// The send of each QP: the message, signaled; UD's to the peer's QP.
    fn sends(&self, o: &PingPongOptions, rem: &[Dest], ah: Option<&AddressHandle>) -> Vec<SendWr> {
        (0..self.qps.len())
            .map(|i| {
                let mut send = SendWr::new(SEND_WRID, WrOpcode::Send);
                send.flags = SendFlags::SIGNALED;
                send.sg_list.push(self.mr.sge(self.off, o.size as u32));
                send.ud = ah.map(|ah| ah.ud_dest(rem[i].qpn, UD_QKEY));
                send
            })
            .collect()
    }

    fn post_send(&self, i: usize, send: &SendWr) -> Result<()> {
        self.qps[i]
            .post_send(std::slice::from_ref(send))
            .map_err(|_| fail("Couldn't post send"))
    }

    /// The loop: `o.iters` sends and receives; a QP's next send goes once
    /// its previous send and a receive have completed, and receives are
    /// reposted when few are left (`routs` are posted at the start; the
    /// server's first sends went before). Returns the completion events
    /// taken (`-e`).
    fn ping_pong(&self, o: &PingPongOptions, sends: &[SendWr], mut routs: u32) -> Result<u32> {
        let nqp = self.qps.len() as u32;
        let srq = self.kind == Kind::Srq;
        // What each QP waits for before its next send: the server's first
        // sends are out, so it waits for them too.
        let first = if o.server.is_some() {
            RECV_WRID | SEND_WRID
        } else {
            RECV_WRID
        };
        let mut pending = vec![first; self.qps.len()];
        // Receives are reposted when this many are left.
        let low = if srq { nqp } else { 1 };
        let (mut rcnt, mut scnt, mut cq_events) = (0u32, 0u32, 0u32);
        let nwc = if srq { (nqp + o.rx_depth) as usize } else { 2 };
        let mut wc = vec![Wc::new(0, WcStatus::Success, WcOpcode::Send, 0); nwc];
        while rcnt < o.iters || scnt < o.iters {
            if let Some(ch) = &self.channel {
                let ev = ch
                    .get_cq_event()
                    .map_err(|e| fail(format!("Failed to get cq_event: {e}")))?;
                cq_events += 1;
                if !ev.is_for(&self.cq) {
                    return Err(fail(format!("CQ event for unknown CQ {}", ev.cq_handle())));
                }
                self.cq
                    .req_notify(false)
                    .map_err(|_| fail("Couldn't request CQ notification"))?;
            }
            let ne = loop {
                let ne = self.cq.poll(&mut wc)?;
                if ne > 0 || o.events {
                    break ne;
                }
                std::hint::spin_loop();
            };
            for w in &wc[..ne] {
                if w.status != WcStatus::Success {
                    return Err(fail(format!(
                        "Failed status {} ({}) for wr_id {}",
                        w.status, w.status as u32, w.wr_id
                    )));
                }
                let qi = self
                    .qps
                    .iter()
                    .position(|q| q.qp_num() == w.qp_num)
                    .ok_or_else(|| fail(format!("Couldn't find QPN {:06x}", w.qp_num)))?;
                match w.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        routs -= 1;
                        if routs <= low {
                            routs += self.post_recvs(o.rx_depth - routs);
                            if routs < o.rx_depth {
                                return Err(fail(format!("Couldn't post receive ({routs})")));
                            }
                        }
                        rcnt += 1;
                    }
                    other => return Err(fail(format!("Completion for unknown wr_id {other}"))),
                }
                pending[qi] &= !w.wr_id;
                if scnt < o.iters && pending[qi] == 0 {
                    self.post_send(qi, &sends[qi])?;
                    pending[qi] = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(cq_events)
    }

    /// The server's `-c` check of the received message: the tools' check
    /// (a 0 at each page start), plus: the rest of each page is the fill
    /// both tools send. Prints each bad page; returns how many.
    fn invalid_pages(&self, size: usize) -> Result<usize> {
        let buf = self
            .mr
            .to_vec(self.off, size)
            .map_err(|e| fail(e.to_string()))?;
        let mut invalid = 0;
        for (p, page) in buf.chunks(PAGE).enumerate() {
            if page[0] != 0 || page[1..].iter().any(|&b| b != self.kind.fill()) {
                println!("invalid data in page {p}");
                invalid += 1;
            }
        }
        Ok(invalid)
    }
}

/// A QP of the tool's type on `cq` (and `srq`), brought to INIT.
fn init_qp(
    o: &PingPongOptions,
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    srq: Option<&SharedReceiveQueue>,
) -> Result<QueuePair> {
    let qp = pd
        .create_qp(&QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: if srq.is_some() { 0 } else { o.rx_depth },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: o.kind.qp_type(),
            sq_sig_all: false,
            srq,
        })
        .map_err(|e| fail(format!("Couldn't create QP: {e}")))?;
    let (init, last) = match o.kind {
        Kind::Ud => (
            QpAttr {
                qp_state: QpState::Init,
                port_num: o.ib_port,
                qkey: UD_QKEY,
                ..QpAttr::default()
            },
            AttrMask::QKEY,
        ),
        _ => (
            QpAttr {
                qp_state: QpState::Init,
                port_num: o.ib_port,
                ..QpAttr::default()
            },
            AttrMask::ACCESS_FLAGS,
        ),
    };
    qp.modify(
        &init,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | last,
    )
    .map_err(|e| fail(format!("Failed to modify QP to INIT: {e}")))?;
    Ok(qp)
}

fn read_dests(s: &mut TcpStream, n: usize, what: &str) -> Result<Vec<Dest>> {
    let mut m = [0u8; MSG_LEN];
    (0..n)
        .map(|_| {
            s.read_exact(&mut m)
                .map_err(|_| fail(format!("Couldn't read {what}")))?;
            Dest::from_wire(&m).ok_or_else(|| fail("malformed remote address"))
        })
        .collect()
}

fn write_dests(s: &mut TcpStream, me: &[Dest], what: &str) -> Result<()> {
    let all: Vec<u8> = me.iter().flat_map(|d| d.to_wire()).collect();
    s.write_all(&all)
        .map_err(|_| fail(format!("Couldn't send {what}")))
}

/// Connects to the server from the device's own address where the family
/// matches (so that a server that got no GID can address our QP by the
/// IP the exchange came from), else from wherever the kernel chooses.
fn connect_from(local: IpAddr, to: &SocketAddr) -> Option<TcpStream> {
    use socket2::{Domain, Socket, Type};
    if local.is_ipv4() == to.is_ipv4() {
        let bound = Socket::new(Domain::for_address(*to), Type::STREAM, None)
            .and_then(|s| s.bind(&SocketAddr::new(local, 0).into()).map(|()| s))
            .and_then(|s| s.connect(&(*to).into()).map(|()| s));
        if let Ok(s) = bound {
            return Some(s.into());
        }
    }
    TcpStream::connect(to).ok()
}

fn client_exchange(
    host: &str,
    port: u16,
    local: IpAddr,
    me: &[Dest],
) -> Result<(Vec<Dest>, IpAddr)> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| fail(format!("{e} for {host}:{port}")))?
        .collect();
    let mut s = addrs
        .iter()
        .find_map(|a| connect_from(local, a))
        .ok_or_else(|| fail(format!("Couldn't connect to {host}:{port}")))?;
    let peer = s.peer_addr().map_err(|e| fail(e.to_string()))?.ip();
    write_dests(&mut s, me, "local address")?;
    let rem = read_dests(&mut s, me.len(), "remote address")?;
    s.write_all(b"done\0")
        .map_err(|_| fail("Couldn't read/write remote address"))?;
    Ok((rem, peer))
}

fn server_exchange(
    port: u16,
    me: &[Dest],
    connect: &mut dyn FnMut(&[Dest], IpAddr) -> Result<()>,
) -> Result<(Vec<Dest>, IpAddr)> {
    let l = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|_| fail(format!("Couldn't listen to port {port}")))?;
    let (mut s, peer) = l.accept().map_err(|_| fail("accept() failed"))?;
    drop(l);
    let peer = match peer.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    let rem = read_dests(&mut s, me.len(), "remote address")?;
    connect(&rem, peer).map_err(|e| fail(format!("Couldn't connect to remote QP: {e}")))?;
    write_dests(&mut s, me, "local address")?;
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
            gid: uroce_provider::qp_attr::gid_of("10.99.0.1".parse().unwrap()),
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
