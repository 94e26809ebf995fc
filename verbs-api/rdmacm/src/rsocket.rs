//! # rsockets: stream sockets over RDMA, wire-compatible with librdmacm's
//!
//! A stream [`RSocket`] is an RC connection made through the CM
//! ([`crate::cm`]) whose data moves by RDMA WRITE WITH IMMEDIATE into the
//! peer's receive buffer, as rdma-core's `librdmacm/rsocket.c` does, so a
//! uroce process talks to an rsocket program on kernel rxe:
//!
//! - The connect (and accept) private data is `struct rs_conn_data`
//!   ([`ConnData`]): version 1, flags (`RS_CONN_FLAG_IOMAP`, and
//!   `RS_CONN_FLAG_NET` on a big-endian host), the receive credits (the
//!   receive queue's size), the iomap size, where the peer writes its
//!   buffer updates (`target_sgl`: two `struct rs_sge` of 16 bytes) and
//!   the first half of the receive buffer (`data_buf`).
//! - Data is written into the half the peer last advertised; the
//!   immediate data is `op << 29 | value`: `RS_OP_DATA` with the length,
//!   `RS_OP_SGL` with the new credit limit (written together with a
//!   16-byte `rs_sge` into the peer's `target_sgl` when a buffer half is
//!   free again, or as a zero-length write when only credits change),
//!   `RS_OP_CTRL` with `RS_CTRL_SHUTDOWN` / `RS_CTRL_DISCONNECT`.
//! - Receive WRs have no buffer: the write carries the data, the
//!   completion only the immediate.
//! - Direct writes (`riomap`/`riowrite`): a side that offers an iomap
//!   (`RDMA_IOMAPSIZE` entries of `struct rs_iomap`, after its target
//!   SGL) learns the peer's mappings as `RS_OP_IOMAP_SGL` writes into it;
//!   [`RSocket::iowrite`] then writes into the peer's memory with plain
//!   RDMA WRITEs (`RS_OP_WRITE` only names them in our own wr_id).
//!
//! Defaults as rsocket.c's: a 128 KiB receive and send buffer, 384-entry
//! queues, four control messages in flight. The socket is driven by its
//! callers (there is no thread of its own): [`RSocket::recv`] and
//! [`RSocket::send`] poll the CQ and wait on its completion channel,
//! whose descriptor [`RSocket::wait_fd`] gives to a `poll` over many
//! sockets.
//!
//! A non-blocking socket's connect goes on in the calls that follow it
//! (`EINPROGRESS`, then `POLLOUT` from [`RSocket::poll_events`]), as
//! rsocket.c's `rs_do_connect`.
//!
//! Keepalive (`SO_KEEPALIVE`) as rsocket.c's: a service thread sends
//! `RS_CTRL_KEEPALIVE` every `TCP_KEEPIDLE` seconds.
//!
//! Datagram rsockets (`SOCK_DGRAM`, UD with a UDP side channel) are
//! [`crate::rsocket_dgram`]'s. Not here: `RDMA_ROUTE`.

use crate::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use parking_lot::Mutex;
use std::io::{Error as IoError, Result};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use uroce_verbs::{
    Access, CompChannel, CompletionQueue, Context, MemoryRegion, ProtectionDomain, QpCap,
    QpInitAttr, QpType, QueuePair, RecvWr, SendWr, Sge, WcFlags, WcStatus, WrOpcode,
};

/// A socket's state, locked.
type Guard<'a> = parking_lot::MutexGuard<'a, State>;

/// `RS_OLAP_START_SIZE`: the first write of a large send.
const OLAP_START_SIZE: u32 = 2048;
/// `RS_MAX_TRANSFER`: the largest single write.
const MAX_TRANSFER: u32 = 65536;
/// `RS_SNDLOWAT`: a send waits until this much send buffer is free.
const SNDLOWAT: u32 = 2048;
const QP_MIN_SIZE: u16 = 16;
const QP_MAX_SIZE: u16 = 0xFFFE;
/// `RS_QP_CTRL_SIZE`: control messages in flight.
const QP_CTRL_SIZE: u32 = 4;
/// `RS_SGL_SIZE`: entries of the target SGL.
const SGL_SIZE: usize = 2;
/// `sizeof(struct rs_sge)`.
const SGE_LEN: usize = 16;
/// `sizeof(struct rs_iomap)`.
const IOMAP_LEN: usize = 24;
/// `RS_MAX_CTRL_MSG`.
const MAX_CTRL_MSG: usize = SGE_LEN;

/// rsocket.c's defaults (`def_inline`, `def_sqsize`, `def_rqsize`,
/// `def_mem`, `def_wmem`).
const DEF_INLINE: u16 = 64;
const DEF_SQSIZE: u16 = 384;
const DEF_RQSIZE: u16 = 384;
const DEF_MEM: u32 = 1 << 17;
const DEF_WMEM: u32 = 1 << 17;

/// The operations carried in the immediate data's top three bits.
const OP_DATA: u32 = 0;
const OP_WRITE: u32 = 2;
const OP_SGL: u32 = 4;
const OP_IOMAP_SGL: u32 = 6;
const OP_CTRL: u32 = 7;
/// `RS_CTRL_*`: what an `RS_OP_CTRL` message says.
const CTRL_DISCONNECT: u32 = 0;
const CTRL_KEEPALIVE: u32 = 1;
const CTRL_SHUTDOWN: u32 = 2;

/// The next write of a send with `left` bytes to go, as rsocket.c sizes
/// them: `olen` (from `OLAP_START_SIZE`), doubled after each write up to
/// `MAX_TRANSFER`; the rest once it is no more than that.
fn next_transfer(olen: &mut u32, left: u32) -> u32 {
    if *olen < left {
        let x = *olen;
        if *olen < MAX_TRANSFER {
            *olen <<= 1;
        }
        x
    } else {
        left
    }
}

fn msg_set(op: u32, data: u32) -> u32 {
    (op << 29) | (data & 0x1FFF_FFFF)
}
fn msg_op(m: u32) -> u32 {
    m >> 29
}
fn msg_data(m: u32) -> u32 {
    m & 0x1FFF_FFFF
}

/// `RS_WR_ID_FLAG_RECV`: a receive's wr_id.
const WR_ID_RECV: u64 = 1 << 63;

/// `RS_CONN_FLAG_NET`: the sender's host order is network order.
const CONN_FLAG_NET: u8 = 1;
/// `RS_CONN_FLAG_IOMAP`: the target SGL is followed by the iomap.
const CONN_FLAG_IOMAP: u8 = 2;

// `enum rs_state`, as bits.
const ST_BOUND: u32 = 0x0001;
const ST_LISTENING: u32 = 0x0002;
const ST_OPENING: u32 = 0x0004;
const ST_RESOLVING_ADDR: u32 = ST_OPENING | 0x0010;
const ST_RESOLVING_ROUTE: u32 = ST_OPENING | 0x0020;
const ST_CONNECTING: u32 = ST_OPENING | 0x0040;
const ST_CONNECTED: u32 = 0x0100;
const ST_WRITABLE: u32 = 0x0200;
const ST_READABLE: u32 = 0x0400;
const ST_CONNECT_RDWR: u32 = ST_CONNECTED | ST_READABLE | ST_WRITABLE;
const ST_CONNECT_ERROR: u32 = 0x0800;
const ST_DISCONNECTED: u32 = 0x1000;
const ST_ERROR: u32 = 0x2000;

/// How long a blocking call sleeps on the completion channel between
/// looks (rsocket.c's `wake_up_interval`).
const WAKE_UP: Duration = Duration::from_millis(500);
/// How long a connection's CM steps may take.
const CM_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) fn err(errno: i32) -> IoError {
    IoError::from_raw_os_error(errno)
}

pub(crate) fn verbs_err(e: uroce_verbs::Error) -> IoError {
    err(e.errno())
}

/// The verbs objects of an rsocket's queue pair (`rs_create_ep`'s and
/// `ds_create_qp`'s): a PD, a completion channel, one CQ of `cqe` entries
/// on it for both queues, and a `qp_type` QP of `cap` on `id` whose every
/// send completes.
pub(crate) fn create_endpoint(
    ctx: &Context,
    id: &CmId,
    cqe: u32,
    qp_type: QpType,
    cap: QpCap,
) -> Result<(
    ProtectionDomain,
    CompChannel,
    CompletionQueue,
    Arc<QueuePair>,
)> {
    let pd = ctx.alloc_pd().map_err(verbs_err)?;
    let comp = ctx.create_comp_channel().map_err(verbs_err)?;
    let cq = ctx
        .cq_builder()
        .cqe(cqe)
        .channel(&comp)
        .build()
        .map_err(verbs_err)?;
    let init = QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap,
        qp_type,
        sq_sig_all: true,
        srq: None,
    };
    let qp = id.create_qp(&pd, &init).map_err(verbs_err)?;
    Ok((pd, comp, cq, qp))
}

/// `struct rs_sge`: where (and with which key) a buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RsSge {
    /// Its virtual address.
    pub addr: u64,
    /// Its rkey.
    pub key: u32,
    /// Its length.
    pub length: u32,
}

impl RsSge {
    /// The 16 bytes, big-endian (`big`) or little-endian.
    fn encode(self, big: bool) -> [u8; SGE_LEN] {
        let mut b = [0; SGE_LEN];
        if big {
            b[0..8].copy_from_slice(&self.addr.to_be_bytes());
            b[8..12].copy_from_slice(&self.key.to_be_bytes());
            b[12..16].copy_from_slice(&self.length.to_be_bytes());
        } else {
            b[0..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..16].copy_from_slice(&self.length.to_le_bytes());
        }
        b
    }
    /// The SGE in 16 bytes of the order [`RsSge::encode`] wrote.
    fn decode(b: &[u8], big: bool) -> RsSge {
        let (addr, key, length) = (
            b[0..8].try_into().expect("8 bytes"),
            b[8..12].try_into().expect("4 bytes"),
            b[12..16].try_into().expect("4 bytes"),
        );
        if big {
            RsSge {
                addr: u64::from_be_bytes(addr),
                key: u32::from_be_bytes(key),
                length: u32::from_be_bytes(length),
            }
        } else {
            RsSge {
                addr: u64::from_le_bytes(addr),
                key: u32::from_le_bytes(key),
                length: u32::from_le_bytes(length),
            }
        }
    }
    /// Big-endian, as in the connection's private data.
    fn to_be(self) -> [u8; SGE_LEN] {
        self.encode(true)
    }
    fn from_be(b: &[u8]) -> RsSge {
        RsSge::decode(b, true)
    }
    /// In host order (`swap`: the peer's is the other one), as an SGL
    /// update the peer reads from its memory.
    fn to_host(self, swap: bool) -> [u8; SGE_LEN] {
        self.encode(cfg!(target_endian = "big") != swap)
    }
    fn from_host(b: &[u8]) -> RsSge {
        RsSge::decode(b, cfg!(target_endian = "big"))
    }
}

/// `struct rs_conn_data`: the private data of a connect and its accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnData {
    /// 1.
    pub version: u8,
    /// `RS_CONN_FLAG_*`.
    pub flags: u8,
    /// Receive credits: the sender's receive queue size.
    pub credits: u16,
    /// The iomap's size, as `rs_value_to_scale(size, 8)`.
    pub target_iomap_size: u8,
    /// Where the peer writes SGL updates (length: entries).
    pub target_sgl: RsSge,
    /// The first receive buffer half.
    pub data_buf: RsSge,
}

impl ConnData {
    /// `sizeof(struct rs_conn_data)`.
    pub const LEN: usize = 40;

    /// The bytes on the wire.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        b[0] = self.version;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.credits.to_be_bytes());
        b[7] = self.target_iomap_size;
        b[8..24].copy_from_slice(&self.target_sgl.to_be());
        b[24..40].copy_from_slice(&self.data_buf.to_be());
        b
    }

    /// Parses the peer's private data: `None` if it is too short or not
    /// version 1.
    pub fn parse(b: &[u8]) -> Option<ConnData> {
        if b.len() < Self::LEN || b[0] != 1 {
            return None;
        }
        Some(ConnData {
            version: b[0],
            flags: b[1],
            credits: u16::from_be_bytes([b[2], b[3]]),
            target_iomap_size: b[7],
            target_sgl: RsSge::from_be(&b[8..24]),
            data_buf: RsSge::from_be(&b[24..40]),
        })
    }
}

/// `rs_value_to_scale`: a size in `bits` bits, exact up to `1 << (bits -
/// 1)`, else in units of `1 << bits` with the top bit set.
fn value_to_scale(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (1 << (bits - 1)) | (value >> bits)
    }
}
/// `rs_scale_to_value`.
fn scale_to_value(value: u32, bits: u32) -> u32 {
    if value <= 1 << (bits - 1) {
        value
    } else {
        (value & !(1 << (bits - 1))) << bits
    }
}

/// The verbs objects of a connected socket. Field order is drop order:
/// the QP before the regions, the CQ and its channel.
struct Conn {
    qp: Arc<QueuePair>,
    /// The regions `riomap` registered: one slot per entry of the peer's
    /// iomap (`PROT_WRITE`), then the local-only ones.
    maps: IoMaps,
    /// The send buffer, then `QP_CTRL_SIZE` control message slots.
    smr: MemoryRegion,
    /// The target SGL (two `rs_sge` the peer writes), then the iomap.
    tmr: MemoryRegion,
    /// The receive buffer the peer writes into.
    rmr: MemoryRegion,
    cq: CompletionQueue,
    comp: CompChannel,
    pd: ProtectionDomain,
    _ctx: Context,
}

/// One `riomap`ping: a registered region and the offset it answers to.
struct IoMap {
    offset: u64,
    mr: MemoryRegion,
}

/// `rs_iomap_mr`s: `slots[i]` is the region mapped at index `i` of the
/// peer's iomap, `queue` the indices not yet sent to the peer, `local`
/// the mappings without remote write (kept, never announced).
#[derive(Default)]
struct IoMaps {
    slots: Vec<Option<IoMap>>,
    queue: std::collections::VecDeque<usize>,
    local: Vec<IoMap>,
}

/// `struct rs_iomap` (offset, then an `rs_sge`), as the peer reads it
/// from its memory: in its host order (`swap`: the other one).
fn iomap_bytes(offset: u64, sge: RsSge, swap: bool) -> [u8; IOMAP_LEN] {
    let mut b = [0; IOMAP_LEN];
    let o = if swap { offset.swap_bytes() } else { offset };
    b[..8].copy_from_slice(&o.to_ne_bytes());
    b[8..].copy_from_slice(&sge.to_host(swap));
    b
}

/// Socket options that only read back (`SO_REUSEADDR` and friends).
#[derive(Default)]
struct Opts {
    so: u64,
    tcp: u64,
    ipv6: u64,
    /// `IP_TOS`, as set.
    tos: i32,
    /// `TCP_KEEPIDLE` in seconds (0: not set).
    keepalive_time: u32,
    /// `SO_KEEPALIVE`: the keepalive service sends for this socket.
    keepalive: bool,
}

struct State {
    state: u32,
    err: i32,
    nonblock: bool,
    fd_flags: i32,
    opts: Opts,
    swap_sgl: bool,

    sbuf_size: u32,
    rbuf_size: u32,
    sq_size: u16,
    rq_size: u16,
    sq_inline: u16,
    target_iomap_size: u16,

    conn: Option<Conn>,
    cq_armed: bool,
    unack_cqe: u32,

    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,

    remote_sge: u32,
    remote_sgl: RsSge,
    remote_iomap: RsSge,
    target_sge: usize,

    /// Lengths of the writes received and not yet read, in order.
    rmsg: std::collections::VecDeque<u32>,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,

    sqe_avail: u32,
    sbuf_bytes_avail: u32,
    /// The send ring's next free byte (`ssgl[0].addr - sbuf`).
    soff: u32,
}

/// A stream rsocket (`rsocket(AF_INET, SOCK_STREAM, 0)`).
pub struct RSocket {
    /// The CM channel of the id: its descriptor is the socket's number in
    /// the C API, as in librdmacm.
    ch: EventChannel,
    id: Mutex<CmId>,
    st: Arc<Mutex<State>>,
}

impl std::fmt::Debug for RSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RSocket")
            .field("fd", &self.ch.as_raw_fd())
            .field("state", &self.st.lock().state)
            .finish()
    }
}

/// What a wait is for.
#[derive(Clone, Copy)]
enum Want {
    /// Data, or nothing more to read.
    Data,
    /// Room to send, or no more writing.
    Send,
    /// A control message slot, or no connection.
    Ctrl,
    /// Every send completed, or no connection.
    SendsDone,
}

impl State {
    fn new() -> State {
        State {
            state: 0,
            err: 0,
            nonblock: false,
            fd_flags: 0,
            opts: Opts::default(),
            swap_sgl: false,
            sbuf_size: DEF_WMEM,
            rbuf_size: DEF_MEM,
            sq_size: DEF_SQSIZE,
            rq_size: DEF_RQSIZE,
            sq_inline: DEF_INLINE,
            target_iomap_size: 0,
            conn: None,
            cq_armed: false,
            unack_cqe: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: 0,
            remote_sge: 0,
            remote_sgl: RsSge::default(),
            remote_iomap: RsSge::default(),
            target_sge: 0,
            rmsg: Default::default(),
            rbuf_bytes_avail: 0,
            rbuf_free_offset: 0,
            rbuf_offset: 0,
            sqe_avail: 0,
            sbuf_bytes_avail: 0,
            soff: 0,
        }
    }

    /// A listening socket's settings for the sockets it accepts.
    fn inherit(&self) -> State {
        let mut s = State::new();
        s.sbuf_size = self.sbuf_size;
        s.rbuf_size = self.rbuf_size;
        s.sq_size = self.sq_size;
        s.rq_size = self.rq_size;
        s.sq_inline = self.sq_inline;
        s.target_iomap_size = self.target_iomap_size;
        s.nonblock = self.nonblock;
        s.fd_flags = self.fd_flags;
        s
    }

    fn conn(&self) -> Result<&Conn> {
        self.conn.as_ref().ok_or_else(|| err(libc::ENOTCONN))
    }

    /// `rs_create_ep`: CQ, QP, buffers, and every receive posted.
    fn create_ep(&mut self, id: &CmId) -> Result<()> {
        let ctx = id.context().ok_or_else(|| err(libc::EINVAL))?;
        let max = ctx.query_device().max_qp_wr.min(u32::from(QP_MAX_SIZE)) as u16;
        self.sq_size = self.sq_size.clamp(QP_MIN_SIZE, max);
        self.rq_size = self.rq_size.clamp(QP_MIN_SIZE, max);
        let cap = QpCap {
            max_send_wr: self.sq_size.into(),
            max_recv_wr: self.rq_size.into(),
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: self.sq_inline.into(),
        };
        let cqe = u32::from(self.sq_size) + u32::from(self.rq_size);
        let (pd, comp, cq, qp) = create_endpoint(&ctx, id, cqe, QpType::Rc, cap)?;
        self.sq_inline = qp.cap().max_inline_data.min(u32::from(QP_MAX_SIZE)) as u16;
        let sbytes = self.sbuf_size as usize + MAX_CTRL_MSG * QP_CTRL_SIZE as usize;
        let smr = pd
            .alloc_mr(sbytes, Access::LOCAL_WRITE)
            .map_err(verbs_err)?;
        let tbytes = SGE_LEN * SGL_SIZE + IOMAP_LEN * usize::from(self.target_iomap_size);
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let tmr = pd.alloc_mr(tbytes, rw).map_err(verbs_err)?;
        let rmr = pd
            .alloc_mr(self.rbuf_size as usize, rw)
            .map_err(verbs_err)?;
        self.rbuf_free_offset = self.rbuf_size >> 1;
        self.rbuf_bytes_avail = self.rbuf_size >> 1;
        self.sqe_avail = u32::from(self.sq_size) - self.ctrl_max_seqno;
        self.rseq_comp = self.rq_size >> 1;
        self.sbuf_bytes_avail = self.sbuf_size;
        self.soff = 0;
        let recvs: Vec<RecvWr> = (0..self.rq_size)
            .map(|_| RecvWr {
                wr_id: WR_ID_RECV,
                sg_list: Default::default(),
            })
            .collect();
        qp.post_recv(&recvs).map_err(|(_, e)| verbs_err(e))?;
        self.conn = Some(Conn {
            qp,
            maps: IoMaps::default(),
            smr,
            tmr,
            rmr,
            cq,
            comp,
            pd,
            _ctx: ctx,
        });
        Ok(())
    }

    /// `rs_format_conn_data`.
    fn conn_data(&self) -> Result<ConnData> {
        let c = self.conn()?;
        Ok(ConnData {
            version: 1,
            flags: CONN_FLAG_IOMAP
                | if cfg!(target_endian = "big") {
                    CONN_FLAG_NET
                } else {
                    0
                },
            credits: self.rq_size,
            target_iomap_size: value_to_scale(self.target_iomap_size.into(), 8) as u8,
            target_sgl: RsSge {
                addr: c.tmr.addr(),
                key: c.tmr.rkey(),
                length: SGL_SIZE as u32,
            },
            data_buf: RsSge {
                addr: c.rmr.addr(),
                key: c.rmr.rkey(),
                length: self.rbuf_size >> 1,
            },
        })
    }

    /// `rs_save_conn_data`.
    fn save_conn_data(&mut self, d: &ConnData) -> Result<()> {
        self.remote_sgl = d.target_sgl;
        self.remote_sge = 1;
        let net = d.flags & CONN_FLAG_NET != 0;
        self.swap_sgl = net != cfg!(target_endian = "big");
        if d.flags & CONN_FLAG_IOMAP != 0 {
            self.remote_iomap = RsSge {
                addr: d
                    .target_sgl
                    .addr
                    .wrapping_add(SGE_LEN as u64 * u64::from(d.target_sgl.length)),
                length: scale_to_value(d.target_iomap_size.into(), 8),
                key: d.target_sgl.key,
            };
        }
        let slots = self.remote_iomap.length as usize;
        if let Some(c) = self.conn.as_mut() {
            c.maps.slots.resize_with(slots, || None);
        }
        self.set_target(0, d.data_buf)?;
        self.sseq_comp = d.credits;
        Ok(())
    }

    fn target(&self, i: usize) -> Result<RsSge> {
        let mut b = [0; SGE_LEN];
        self.conn()?
            .tmr
            .read(i * SGE_LEN, &mut b)
            .map_err(|_| err(libc::EIO))?;
        Ok(RsSge::from_host(&b))
    }

    fn set_target(&self, i: usize, s: RsSge) -> Result<()> {
        self.conn()?
            .tmr
            .write(i * SGE_LEN, &s.to_host(false))
            .map_err(|_| err(libc::EIO))
    }

    fn post(&self, w: SendWr) -> Result<()> {
        self.conn()?
            .qp
            .post_send(&[w])
            .map_err(|(_, e)| verbs_err(e))
    }

    /// `rs_post_msg`: a zero-length write with immediate.
    fn post_msg(&self, msg: u32) -> Result<()> {
        let mut w = SendWr::new(u64::from(msg), WrOpcode::RdmaWriteWithImm);
        w.imm_data = msg;
        self.post(w)
    }

    /// `rs_write_data`: `len` bytes of the send ring into the peer's
    /// current buffer half.
    fn write_data(&mut self, sges: &[Sge], len: u32) -> Result<()> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let i = self.target_sge;
        let mut t = self.target(i)?;
        let (addr, rkey) = (t.addr, t.key);
        t.addr = t.addr.wrapping_add(u64::from(len));
        t.length -= len;
        self.set_target(i, t)?;
        if t.length == 0 {
            self.target_sge = (i + 1) % SGL_SIZE;
        }
        let msg = msg_set(OP_DATA, len);
        let mut w = SendWr::new(u64::from(msg), WrOpcode::RdmaWriteWithImm);
        w.imm_data = msg;
        w.sg_list.extend_from_slice(sges);
        w.remote_addr = addr;
        w.rkey = rkey;
        self.post(w)
    }

    /// `rs_send_credits`.
    fn send_credits(&mut self) -> Result<()> {
        let half = self.rbuf_size >> 1;
        let slot = (self.ctrl_seqno & (QP_CTRL_SIZE - 1)) as usize;
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let c = self.conn()?;
        let msg = msg_set(OP_SGL, u32::from(self.rseq_no.wrapping_add(self.rq_size)));
        if self.rbuf_bytes_avail >= half {
            let sge = RsSge {
                addr: c.rmr.addr() + u64::from(self.rbuf_free_offset),
                key: c.rmr.rkey(),
                length: half,
            };
            let at = self.sbuf_size as usize + MAX_CTRL_MSG * slot;
            c.smr
                .write(at, &sge.to_host(self.swap_sgl))
                .map_err(|_| err(libc::EIO))?;
            let mut w = SendWr::new(u64::from(msg), WrOpcode::RdmaWriteWithImm);
            w.imm_data = msg;
            w.sg_list.push(c.smr.sge(at, SGE_LEN as u32));
            w.remote_addr = self
                .remote_sgl
                .addr
                .wrapping_add(u64::from(self.remote_sge) * SGE_LEN as u64);
            w.rkey = self.remote_sgl.key;
            self.post(w)?;
            self.rbuf_bytes_avail -= half;
            self.rbuf_free_offset += half;
            if self.rbuf_free_offset >= self.rbuf_size {
                self.rbuf_free_offset = 0;
            }
            self.remote_sge += 1;
            if self.remote_sge >= self.remote_sgl.length {
                self.remote_sge = 0;
            }
            Ok(())
        } else {
            self.post_msg(msg)
        }
    }

    /// `tcp_svc_send_keepalive`: one keepalive, if a control slot is free.
    fn send_keepalive(&mut self) {
        if self.ctrl_avail() && self.state & ST_CONNECTED != 0 {
            self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
            if let Err(e) = self.post_msg(msg_set(OP_CTRL, CTRL_KEEPALIVE)) {
                self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }

    fn ctrl_avail(&self) -> bool {
        self.ctrl_seqno != self.ctrl_max_seqno
    }

    /// `rs_give_credits`.
    fn give_credits(&self) -> bool {
        (self.rbuf_bytes_avail >= (self.rbuf_size >> 1)
            || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0)
            && self.ctrl_avail()
            && self.state & ST_CONNECTED != 0
    }

    fn update_credits(&mut self) {
        if self.give_credits() {
            if let Err(e) = self.send_credits() {
                self.fail(e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
    }

    fn fail(&mut self, errno: i32) {
        if self.state & ST_CONNECTED != 0 {
            self.state = ST_ERROR;
            self.err = errno;
        }
    }

    /// `rs_poll_cq`: takes every completion.
    fn poll_cq(&mut self) {
        let Some(c) = self.conn.as_ref() else {
            return;
        };
        let mut wcs =
            [uroce_verbs::Wc::new(0, WcStatus::Success, uroce_verbs::WcOpcode::Send, 0); 16];
        let mut all = Vec::new();
        loop {
            let n = c.cq.poll(&mut wcs).unwrap_or(0);
            if n == 0 {
                break;
            }
            all.extend_from_slice(&wcs[..n]);
        }
        let qp = c.qp.clone();
        let mut recvs = 0u32;
        {
            for wc in &all {
                if wc.wr_id & WR_ID_RECV != 0 {
                    if wc.status != WcStatus::Success {
                        continue;
                    }
                    recvs += 1;
                    if !wc.wc_flags.contains(WcFlags::WITH_IMM) {
                        continue;
                    }
                    let msg = wc.imm_data;
                    match msg_op(msg) {
                        OP_SGL => self.sseq_comp = msg_data(msg) as u16,
                        OP_IOMAP_SGL | OP_WRITE => {}
                        OP_CTRL => match msg_data(msg) {
                            CTRL_DISCONNECT => self.state = ST_DISCONNECTED,
                            CTRL_SHUTDOWN => {
                                if self.state & ST_WRITABLE != 0 {
                                    self.state &= !ST_READABLE;
                                } else {
                                    self.state = ST_DISCONNECTED;
                                }
                            }
                            _ => {}
                        },
                        _ => self.rmsg.push_back(msg_data(msg)),
                    }
                } else {
                    let msg = wc.wr_id as u32;
                    match msg_op(msg) {
                        OP_SGL => self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1),
                        OP_CTRL => {
                            self.ctrl_max_seqno = self.ctrl_max_seqno.wrapping_add(1);
                            if msg_data(msg) == CTRL_DISCONNECT {
                                self.state = ST_DISCONNECTED;
                            }
                        }
                        OP_IOMAP_SGL => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += IOMAP_LEN as u32;
                        }
                        _ => {
                            self.sqe_avail += 1;
                            self.sbuf_bytes_avail += msg_data(msg);
                        }
                    }
                    if wc.status != WcStatus::Success {
                        self.fail(libc::EIO);
                    }
                }
            }
        }
        if self.state & ST_CONNECTED != 0 && recvs > 0 {
            let recv = RecvWr {
                wr_id: WR_ID_RECV,
                sg_list: Default::default(),
            };
            let wrs = vec![recv; recvs as usize];
            if let Err((_, e)) = qp.post_recv(&wrs) {
                self.fail(e.errno());
            }
        }
    }

    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).is_ok_and(|t| t.length != 0)
    }

    fn test(&self, want: Want) -> bool {
        match want {
            Want::Data => !self.rmsg.is_empty() || self.state & ST_READABLE == 0,
            Want::Send => self.can_send() || self.state & ST_WRITABLE == 0,
            Want::Ctrl => self.ctrl_avail() || self.state & ST_CONNECTED == 0,
            Want::SendsDone => {
                (self.ctrl_max_seqno.wrapping_sub(self.ctrl_seqno)) + self.sqe_avail
                    == u32::from(self.sq_size)
                    || self.state & ST_CONNECTED == 0
            }
        }
    }

    /// Polls and sends credits; true when `want` holds.
    fn process(&mut self, want: Want) -> bool {
        self.update_credits();
        self.poll_cq();
        self.update_credits();
        self.test(want)
    }

    /// Takes the completion channel's events (the CQ fired): the CQ is
    /// then to be armed again.
    fn drain_events(&mut self) {
        let Some(c) = self.conn.as_ref() else {
            return;
        };
        while c.comp.try_get_cq_event().is_ok() {
            self.unack_cqe += 1;
            self.cq_armed = false;
        }
        if self.unack_cqe > 0 {
            c.cq.ack_events(self.unack_cqe);
            self.unack_cqe = 0;
        }
    }

    fn arm(&mut self) {
        if let Some(c) = self.conn.as_ref() {
            if !self.cq_armed && c.cq.req_notify(false).is_ok() {
                self.cq_armed = true;
            }
        }
    }
}

/// rsocket.c's `tcp_svc`: one thread (started with the first socket
/// that turns keepalive on, every signal blocked) that sends each such
/// socket's keepalives when they are due.
mod keepalive {
    use super::State;
    use parking_lot::{Condvar, Mutex};
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::{Duration, Instant};

    struct Svc {
        /// The sockets and when each one's next keepalive is due.
        due: Mutex<Vec<(Weak<Mutex<State>>, Instant)>>,
        wake: Condvar,
    }

    fn svc() -> Option<&'static Svc> {
        static SVC: OnceLock<Option<&'static Svc>> = OnceLock::new();
        *SVC.get_or_init(|| {
            let svc: &'static Svc = Box::leak(Box::new(Svc {
                due: Mutex::new(Vec::new()),
                wake: Condvar::new(),
            }));
            uroce_provider::device::spawn_thread("uroce-rs-keepalive".into(), move || run(svc))
                .ok()
                .map(|_| svc)
        })
    }

    /// Puts `st` on the list (again), its next keepalive `secs` from now.
    pub(super) fn add(st: &Arc<Mutex<State>>, secs: u32) {
        let Some(svc) = svc() else {
            return;
        };
        let next = Instant::now() + Duration::from_secs(secs.into());
        let w = Arc::downgrade(st);
        let mut due = svc.due.lock();
        due.retain(|(d, _)| !d.ptr_eq(&w));
        due.push((w, next));
        svc.wake.notify_one();
    }

    fn run(svc: &'static Svc) {
        let mut due = svc.due.lock();
        loop {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            due.retain_mut(|(w, at)| {
                let Some(st) = w.upgrade() else {
                    return false;
                };
                let mut st = st.lock();
                if !st.opts.keepalive {
                    return false;
                }
                if *at <= now {
                    st.send_keepalive();
                    *at = now + Duration::from_secs(st.opts.keepalive_time.max(1).into());
                }
                next = Some(next.map_or(*at, |n| n.min(*at)));
                true
            });
            match next {
                Some(n) => {
                    svc.wake.wait_until(&mut due, n);
                }
                None => svc.wake.wait(&mut due),
            }
        }
    }
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd, for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) };
}

impl RSocket {
    /// `rsocket(AF_INET or AF_INET6, SOCK_STREAM, 0)`.
    pub fn new() -> Result<RSocket> {
        let ch = EventChannel::new().map_err(verbs_err)?;
        let id = CmId::new(&ch, PortSpace::Tcp).map_err(verbs_err)?;
        Ok(RSocket {
            ch,
            id: Mutex::new(id),
            st: Arc::new(Mutex::new(State::new())),
        })
    }

    /// The descriptor this socket is known by (its CM channel's).
    pub fn fd(&self) -> RawFd {
        self.ch.as_raw_fd()
    }

    /// `rbind`.
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        self.id.lock().bind_addr(addr).map_err(verbs_err)?;
        self.st.lock().state = ST_BOUND;
        Ok(())
    }

    /// `rlisten`.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        let mut st = self.st.lock();
        if st.state == ST_LISTENING {
            return Ok(());
        }
        self.id.lock().listen(backlog).map_err(verbs_err)?;
        st.state = ST_LISTENING;
        Ok(())
    }

    /// The id's next CM event, which must be `want`: waited for (up to
    /// [`CM_TIMEOUT`]) if `block`, else `EINPROGRESS` when none is there.
    fn next_event(ch: &EventChannel, want: CmEventType, block: bool) -> Result<ConnParam> {
        let e = if block {
            ch.get_event_timeout(Some(CM_TIMEOUT))
                .map_err(verbs_err)?
                .ok_or_else(|| err(libc::ETIMEDOUT))?
        } else {
            match ch.try_get_event() {
                Ok(e) => e,
                Err(uroce_verbs::Error::WouldBlock) => return Err(err(libc::EINPROGRESS)),
                Err(e) => return Err(verbs_err(e)),
            }
        };
        if e.event == want {
            return Ok(e.conn);
        }
        Err(err(match e.event {
            CmEventType::Rejected => libc::ECONNREFUSED,
            CmEventType::Unreachable | CmEventType::AddrError | CmEventType::RouteError => {
                libc::EHOSTUNREACH
            }
            _ => libc::ECONNRESET,
        }))
    }

    /// `rconnect`: resolves, connects and waits for the peer's answer; on
    /// a non-blocking socket starts that and fails with `EINPROGRESS`,
    /// the connection then going on in [`RSocket::poll_events`] (`POLLOUT`
    /// once connected; `POLLERR` and [`RSocket::take_error`] if it
    /// failed), sends and receives (`EAGAIN` meanwhile) and further
    /// connects (`EINPROGRESS` meanwhile, 0 once connected), as rsocket.c.
    pub fn connect(&self, dst: SocketAddr) -> Result<()> {
        let mut st = self.st.lock();
        if st.state & ST_CONNECTED != 0 {
            return Err(err(libc::EISCONN));
        }
        if st.state & ST_OPENING == 0 {
            if st.state & (ST_LISTENING | ST_CONNECT_ERROR | ST_DISCONNECTED | ST_ERROR) != 0 {
                return Err(err(libc::EINVAL));
            }
            let id = self.id.lock().clone();
            if let Err(e) = id.resolve_addr(None, dst) {
                st.state = ST_CONNECT_ERROR;
                st.err = e.errno();
                return Err(verbs_err(e));
            }
            st.state = ST_RESOLVING_ADDR;
        }
        let block = !st.nonblock;
        self.step_connect(&mut st, block)
    }

    /// `rs_do_connect`: takes a connect as far as the CM's events allow
    /// (all the way if `block`); `EINPROGRESS` if it is not done, and a
    /// failure leaves the socket in connect error with `SO_ERROR` set.
    fn step_connect(&self, st: &mut State, block: bool) -> Result<()> {
        let r = self.advance_connect(st, block);
        if let Err(e) = &r {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            if errno != libc::EINPROGRESS {
                st.state = ST_CONNECT_ERROR;
                st.err = errno;
            }
        }
        r
    }

    fn advance_connect(&self, st: &mut State, block: bool) -> Result<()> {
        let id = self.id.lock().clone();
        loop {
            match st.state {
                ST_RESOLVING_ADDR => {
                    Self::next_event(&self.ch, CmEventType::AddrResolved, block)?;
                    id.resolve_route().map_err(verbs_err)?;
                    st.state = ST_RESOLVING_ROUTE;
                }
                ST_RESOLVING_ROUTE => {
                    Self::next_event(&self.ch, CmEventType::RouteResolved, block)?;
                    st.create_ep(&id)?;
                    let param = ConnParam {
                        private_data: st.conn_data()?.to_bytes().to_vec(),
                        flow_control: true,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        ..ConnParam::default()
                    };
                    id.connect(&param).map_err(verbs_err)?;
                    st.state = ST_CONNECTING;
                }
                ST_CONNECTING => {
                    let resp = Self::next_event(&self.ch, CmEventType::Established, block)?;
                    let d =
                        ConnData::parse(&resp.private_data).ok_or_else(|| err(libc::ENOTSUP))?;
                    st.save_conn_data(&d)?;
                    st.state = ST_CONNECT_RDWR;
                }
                s if s & ST_CONNECTED != 0 => return Ok(()),
                _ => return Err(err(libc::ENOTCONN)),
            }
        }
    }

    /// A send or receive on a socket whose connect is under way: takes it
    /// on (waiting unless `nonblock`); `EAGAIN` while it is not done.
    fn finish_connect(&self, st: &mut State, nonblock: bool) -> Result<()> {
        if st.state & ST_OPENING == 0 {
            return Ok(());
        }
        match self.step_connect(st, !nonblock) {
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Err(err(libc::EAGAIN)),
            r => r,
        }
    }

    /// `raccept`: the next connection (`EAGAIN` if none waits on a
    /// non-blocking socket).
    pub fn accept(&self) -> Result<RSocket> {
        let nonblock = {
            let st = self.st.lock();
            if st.state != ST_LISTENING {
                return Err(err(libc::EINVAL));
            }
            st.nonblock
        };
        loop {
            let e = if nonblock {
                match self.ch.try_get_event() {
                    Ok(e) => e,
                    Err(uroce_verbs::Error::WouldBlock) => return Err(err(libc::EAGAIN)),
                    Err(e) => return Err(verbs_err(e)),
                }
            } else {
                self.ch.get_event().map_err(verbs_err)?
            };
            if e.event != CmEventType::ConnectRequest {
                continue;
            }
            let child = self.st.lock().inherit();
            match Self::accept_one(e.id.clone(), &e.conn, child) {
                Ok(s) => return Ok(s),
                Err(_) => {
                    let _ = e.id.reject(&[]);
                    e.id.destroy();
                    if nonblock {
                        return Err(err(libc::EAGAIN));
                    }
                }
            }
        }
    }

    fn accept_one(id: CmId, req: &ConnParam, mut st: State) -> Result<RSocket> {
        let d = ConnData::parse(&req.private_data).ok_or_else(|| err(libc::EPROTO))?;
        let ch = EventChannel::new().map_err(verbs_err)?;
        id.migrate(&ch);
        st.create_ep(&id)?;
        st.save_conn_data(&d)?;
        let param = ConnParam {
            private_data: st.conn_data()?.to_bytes().to_vec(),
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            flow_control: req.flow_control,
            retry_count: 7,
            rnr_retry_count: 7,
            ..ConnParam::default()
        };
        id.accept(&param).map_err(verbs_err)?;
        Self::next_event(&ch, CmEventType::Established, true)?;
        st.state = ST_CONNECT_RDWR;
        Ok(RSocket {
            ch,
            id: Mutex::new(id),
            st: Arc::new(Mutex::new(st)),
        })
    }

    /// Waits (the lock released) until `want` holds; `EAGAIN` if it does
    /// not and `nonblock`.
    fn wait_for<'a>(&'a self, mut st: Guard<'a>, want: Want, nonblock: bool) -> Result<Guard<'a>> {
        loop {
            if st.process(want) {
                return Ok(st);
            }
            if nonblock {
                return Err(err(libc::EAGAIN));
            }
            st.arm();
            if st.process(want) {
                return Ok(st);
            }
            let fd = st.conn()?.comp.fd();
            drop(st);
            wait_readable(fd, WAKE_UP);
            st = self.st.lock();
            st.drain_events();
        }
    }

    fn nonblocking(&self, st: &State, flags: i32) -> bool {
        st.nonblock || flags & libc::MSG_DONTWAIT != 0
    }

    /// `rrecv`: at least one byte, or 0 at the end of the stream.
    /// `MSG_PEEK`, `MSG_WAITALL` and `MSG_DONTWAIT` as for a socket.
    pub fn recv(&self, buf: &mut [u8], flags: i32) -> Result<usize> {
        let mut st = self.st.lock();
        let nonblock = self.nonblocking(&st, flags);
        self.finish_connect(&mut st, nonblock)?;
        if st.state & (ST_CONNECTED | ST_DISCONNECTED | ST_ERROR) == 0 {
            return Err(err(libc::ENOTCONN));
        }
        let mut done = 0;
        loop {
            if st.rmsg.is_empty() {
                match self.wait_for(st, Want::Data, nonblock) {
                    Ok(g) => st = g,
                    Err(e) => {
                        return if done > 0 { Ok(done) } else { Err(e) };
                    }
                }
            }
            if st.rmsg.is_empty() && st.state & ST_ERROR != 0 && done == 0 {
                return Err(err(st.err));
            }
            if flags & libc::MSG_PEEK != 0 {
                return st.peek(buf);
            }
            done += st.take(&mut buf[done..])?;
            if done == buf.len() || flags & libc::MSG_WAITALL == 0 || st.state & ST_READABLE == 0 {
                st.update_credits();
                return Ok(done);
            }
        }
    }

    /// `rsend`: all of `buf` (blocking), or as much as fits now
    /// (non-blocking: `EAGAIN` if nothing does).
    pub fn send(&self, buf: &[u8], flags: i32) -> Result<usize> {
        let mut st = self.st.lock();
        let nonblock = self.nonblocking(&st, flags);
        self.finish_connect(&mut st, nonblock)?;
        if st.state & ST_CONNECTED == 0 {
            return Err(err(if st.state & (ST_DISCONNECTED | ST_ERROR) != 0 {
                libc::EPIPE
            } else {
                libc::ENOTCONN
            }));
        }
        st = self.send_iomaps(st, nonblock)?;
        let mut done = 0usize;
        let mut olen = OLAP_START_SIZE;
        while done < buf.len() {
            if !st.can_send() {
                match self.wait_for(st, Want::Send, nonblock) {
                    Ok(g) => st = g,
                    Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
                }
                if st.state & ST_WRITABLE == 0 {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(err(libc::ECONNRESET))
                    };
                }
            }
            let left = (buf.len() - done).min(u32::MAX as usize) as u32;
            let mut xfer = next_transfer(&mut olen, left);
            xfer = xfer.min(st.sbuf_bytes_avail);
            xfer = xfer.min(st.target(st.target_sge)?.length);
            let chunk = &buf[done..done + xfer as usize];
            if let Err(e) = st.copy_and_write(chunk) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
            done += xfer as usize;
        }
        Ok(done)
    }

    /// Waits for room to send: `ECONNRESET` once the socket cannot
    /// write any more.
    fn wait_send<'a>(&'a self, mut st: Guard<'a>, nonblock: bool) -> Result<Guard<'a>> {
        if !st.can_send() {
            st = self.wait_for(st, Want::Send, nonblock)?;
            if st.state & ST_WRITABLE == 0 {
                return Err(err(libc::ECONNRESET));
            }
        }
        Ok(st)
    }

    /// `rs_send_iomaps`: announces the mappings `riomap` queued.
    fn send_iomaps<'a>(&'a self, mut st: Guard<'a>, nonblock: bool) -> Result<Guard<'a>> {
        while let Some(&i) = st.conn()?.maps.queue.front() {
            st = self.wait_send(st, nonblock)?;
            st.conn
                .as_mut()
                .ok_or_else(|| err(libc::ENOTCONN))?
                .maps
                .queue
                .pop_front();
            // A mapping undone before it was sent is not announced.
            if st.conn()?.maps.slots[i].is_some() {
                st.write_iomap(i)?;
            }
        }
        Ok(st)
    }

    /// `riomap`: registers `len` bytes at `buf` for the peer to write
    /// with [`RSocket::iowrite`] (`PROT_WRITE`; `PROT_NONE` maps it
    /// locally only), at `offset` (`-1`: the buffer's address). Returns
    /// the offset. The mapping is announced to the peer with the next
    /// send. `ENOMEM` when every entry of the peer's iomap is in use
    /// (its `RDMA_IOMAPSIZE`), `EINVAL` before the connection is made.
    ///
    /// # Safety
    /// `buf` must be valid for reads and writes of `len` bytes until
    /// [`RSocket::iounmap`] or the socket's close, and the caller must
    /// hold no Rust reference into it meanwhile (the peer writes it).
    pub unsafe fn iomap(&self, buf: *mut u8, len: usize, prot: i32, offset: i64) -> Result<i64> {
        let mut st = self.st.lock();
        let c = st.conn.as_mut().ok_or_else(|| err(libc::EINVAL))?;
        if prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
            return Err(err(libc::EINVAL));
        }
        let write = prot & libc::PROT_WRITE != 0;
        let slot = if write {
            Some(
                c.maps
                    .slots
                    .iter()
                    .position(Option::is_none)
                    .ok_or_else(|| err(libc::ENOMEM))?,
            )
        } else {
            None
        };
        let access = if write {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        } else {
            Access::LOCAL_WRITE
        };
        // SAFETY: the caller's promise above.
        let mr = unsafe { c.pd.reg_mr_raw(buf, len, access) }.map_err(verbs_err)?;
        let offset = if offset == -1 { buf as i64 } else { offset };
        let m = IoMap {
            offset: offset as u64,
            mr,
        };
        match slot {
            Some(i) => {
                c.maps.slots[i] = Some(m);
                c.maps.queue.push_back(i);
            }
            None => c.maps.local.push(m),
        }
        Ok(offset)
    }

    /// `riounmap`: undoes the mapping of exactly `buf`/`len` (`EINVAL`
    /// if there is none). The peer is not told, as in rsocket.c.
    pub fn iounmap(&self, buf: *mut u8, len: usize) -> Result<()> {
        let mut st = self.st.lock();
        let c = st.conn.as_mut().ok_or_else(|| err(libc::EINVAL))?;
        let is = |m: &IoMap| m.mr.addr() == buf as u64 && m.mr.len() == len;
        if let Some(s) = c.maps.slots.iter_mut().find(|s| s.as_ref().is_some_and(is)) {
            *s = None;
            return Ok(());
        }
        if let Some(i) = c.maps.local.iter().position(is) {
            c.maps.local.remove(i);
            return Ok(());
        }
        Err(err(libc::EINVAL))
    }

    /// `riowrite`: writes `buf` into the peer's memory that it mapped at
    /// `offset` (by RDMA WRITE: the peer's program sees the bytes land,
    /// no receive is involved). Returns how much was written: less than
    /// `buf` where no mapping of the peer covers the rest (0 if none
    /// covers `offset`), or when a non-blocking socket runs out of room.
    pub fn iowrite(&self, buf: &[u8], mut offset: u64, flags: i32) -> Result<usize> {
        let mut st = self.st.lock();
        if st.state & ST_CONNECTED == 0 {
            return Err(err(if st.state & (ST_DISCONNECTED | ST_ERROR) != 0 {
                libc::EPIPE
            } else {
                libc::ENOTCONN
            }));
        }
        let nonblock = self.nonblocking(&st, flags);
        st = self.send_iomaps(st, nonblock)?;
        let mut done = 0usize;
        let mut olen = OLAP_START_SIZE;
        let mut iom: Option<(u64, RsSge)> = None;
        while done < buf.len() {
            let (start, sge) = match iom {
                Some((o, g)) if offset < o + u64::from(g.length) => (o, g),
                _ => match st.find_iomap(offset)? {
                    Some(m) => {
                        iom = Some(m);
                        m
                    }
                    None => break,
                },
            };
            match self.wait_send(st, nonblock) {
                Ok(g) => st = g,
                Err(e) => return if done > 0 { Ok(done) } else { Err(e) },
            }
            let left = (buf.len() - done).min(u32::MAX as usize) as u32;
            let mut xfer = next_transfer(&mut olen, left);
            xfer = xfer.min(st.sbuf_bytes_avail);
            xfer = xfer.min((start + u64::from(sge.length) - offset) as u32);
            let addr = sge.addr.wrapping_add(offset - start);
            let chunk = &buf[done..done + xfer as usize];
            if let Err(e) = st.write_direct(chunk, addr, sge.key) {
                return if done > 0 { Ok(done) } else { Err(e) };
            }
            done += xfer as usize;
            offset += u64::from(xfer);
        }
        Ok(done)
    }

    /// `rshutdown`.
    pub fn shutdown(&self, how: i32) -> Result<()> {
        let mut st = self.st.lock();
        if st.state & ST_CONNECTED != 0 {
            let ctrl = match how {
                libc::SHUT_RDWR => {
                    st.state &= !(ST_READABLE | ST_WRITABLE);
                    Some(CTRL_DISCONNECT)
                }
                libc::SHUT_WR => {
                    st.state &= !ST_WRITABLE;
                    Some(if st.state & ST_READABLE != 0 {
                        CTRL_SHUTDOWN
                    } else {
                        CTRL_DISCONNECT
                    })
                }
                libc::SHUT_RD => {
                    st.state &= !ST_READABLE;
                    (st.state & ST_WRITABLE == 0).then_some(CTRL_DISCONNECT)
                }
                _ => return Err(err(libc::EINVAL)),
            };
            if let Some(ctrl) = ctrl {
                if !st.ctrl_avail() {
                    st = self.wait_for(st, Want::Ctrl, false)?;
                }
                if st.state & ST_CONNECTED != 0 && st.ctrl_avail() {
                    st.ctrl_seqno = st.ctrl_seqno.wrapping_add(1);
                    st.post_msg(msg_set(OP_CTRL, ctrl))?;
                }
            }
        }
        if st.state & ST_CONNECTED != 0 {
            st = self.wait_for(st, Want::SendsDone, false)?;
        }
        if st.state & ST_DISCONNECTED != 0 {
            // Both ends are done: the connection ends at the CM too.
            let _ = self.id.lock().disconnect();
        }
        Ok(())
    }

    /// `rclose`: a connected socket is shut down first, its queued sends
    /// completed.
    pub fn close(&self) {
        let connected = self.st.lock().state & ST_CONNECTED != 0;
        if connected {
            let _ = self.shutdown(libc::SHUT_RDWR);
        }
        let id = self.id.lock().clone();
        let _ = id.disconnect();
        let _ = id.detach_qp();
        id.destroy();
        self.st.lock().conn = None;
    }

    /// `rgetsockname`.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.lock().src_addr()
    }

    /// `rgetpeername`.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.lock().dst_addr()
    }

    /// `rfcntl(F_SETFL, O_NONBLOCK)`.
    pub fn set_nonblocking(&self, on: bool) {
        self.st.lock().nonblock = on;
    }

    /// Whether the socket is non-blocking.
    pub fn nonblocking_flag(&self) -> bool {
        self.st.lock().nonblock
    }

    /// `F_GETFD`/`F_SETFD`'s flags.
    pub fn fd_flags(&self) -> i32 {
        self.st.lock().fd_flags
    }
    /// `F_SETFD`.
    pub fn set_fd_flags(&self, f: i32) {
        self.st.lock().fd_flags = f;
    }

    /// `rpoll`'s look at one socket, without waiting: the events of
    /// `events` (`POLLIN`, `POLLOUT`) that hold, with `POLLHUP` once the
    /// peer is gone and `POLLERR` after an error.
    pub fn poll_events(&self, events: i16) -> i16 {
        let mut st = self.st.lock();
        if st.state == ST_LISTENING {
            let mut p = libc::pollfd {
                fd: self.ch.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, no wait.
            unsafe { libc::poll(&mut p, 1, 0) };
            return p.revents & events;
        }
        if st.state & ST_OPENING != 0 {
            match self.step_connect(&mut st, false) {
                Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => return 0,
                _ => {}
            }
        }
        if st.state & (ST_CONNECTED | ST_DISCONNECTED | ST_ERROR) != 0 {
            st.drain_events();
            st.process(Want::Data);
            let mut r = 0;
            if events & libc::POLLIN != 0 && st.test(Want::Data) {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && st.can_send() {
                r |= libc::POLLOUT;
            }
            if st.state & ST_CONNECTED == 0 {
                r |= if st.state & ST_DISCONNECTED != 0 {
                    libc::POLLHUP
                } else {
                    libc::POLLERR
                };
            }
            return r;
        }
        if st.state == ST_CONNECT_ERROR {
            return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
        }
        0
    }

    /// Arms the socket for a wait in `poll` and names the descriptor that
    /// becomes readable when [`RSocket::poll_events`] may have something
    /// new: the completion channel's (connected) or the CM channel's.
    pub fn wait_fd(&self) -> RawFd {
        let mut st = self.st.lock();
        if st.conn.is_some() && st.state & ST_OPENING == 0 {
            st.arm();
            if let Ok(c) = st.conn() {
                return c.comp.fd();
            }
        }
        self.ch.as_raw_fd()
    }

    /// `SO_ERROR`: the pending error, cleared.
    pub fn take_error(&self) -> i32 {
        std::mem::take(&mut self.st.lock().err)
    }

    /// `rsetsockopt(SOL_RDMA, ...)` and the buffer sizes: `EINVAL` once
    /// connected or connecting.
    pub fn set_rdma_option(&self, opt: RdmaOpt, v: u32) -> Result<()> {
        let mut st = self.st.lock();
        if st.conn.is_some() {
            return Err(err(libc::EINVAL));
        }
        let q = v.min(u32::from(QP_MAX_SIZE)) as u16;
        match opt {
            RdmaOpt::SqSize => st.sq_size = q,
            RdmaOpt::RqSize => st.rq_size = q,
            RdmaOpt::Inline => st.sq_inline = q,
            RdmaOpt::IomapSize => {
                st.target_iomap_size = scale_to_value(value_to_scale(v.min(255), 8), 8) as u16
            }
            RdmaOpt::RcvBuf => st.rbuf_size = v.saturating_mul(2).max(SNDLOWAT * 2),
            RdmaOpt::SndBuf => st.sbuf_size = v.saturating_mul(2).max(SNDLOWAT * 2),
        }
        Ok(())
    }

    /// The value of a size option ([`RSocket::set_rdma_option`]'s).
    pub fn rdma_option(&self, opt: RdmaOpt) -> u32 {
        let st = self.st.lock();
        match opt {
            RdmaOpt::SqSize => st.sq_size.into(),
            RdmaOpt::RqSize => st.rq_size.into(),
            RdmaOpt::Inline => st.sq_inline.into(),
            RdmaOpt::IomapSize => st.target_iomap_size.into(),
            RdmaOpt::RcvBuf => st.rbuf_size >> 1,
            RdmaOpt::SndBuf => st.sbuf_size >> 1,
        }
    }

    /// Records a boolean socket option (`level`: 0 socket, 1 TCP, 2
    /// IPv6) for [`RSocket::flag`].
    pub fn set_flag(&self, level: u8, opt: u32, on: bool) {
        let mut st = self.st.lock();
        self.set_flag_locked(&mut st, level, opt, on);
    }

    fn set_flag_locked(&self, st: &mut State, level: u8, opt: u32, on: bool) {
        let o = match level {
            0 => &mut st.opts.so,
            1 => &mut st.opts.tcp,
            _ => &mut st.opts.ipv6,
        };
        if opt < 64 {
            if on {
                *o |= 1 << opt;
            } else {
                *o &= !(1 << opt);
            }
        }
    }

    /// A boolean option recorded by [`RSocket::set_flag`].
    pub fn flag(&self, level: u8, opt: u32) -> bool {
        let st = self.st.lock();
        let o = match level {
            0 => st.opts.so,
            1 => st.opts.tcp,
            _ => st.opts.ipv6,
        };
        opt < 64 && o & (1 << opt) != 0
    }

    /// Whether the socket is connected (`TCP_INFO`'s state).
    pub fn is_connected(&self) -> bool {
        self.st.lock().state & ST_CONNECTED != 0
    }

    /// `IP_TOS`: kept, read back, and given to the CM id as rsocket.c
    /// does (`rdma_set_option(RDMA_OPTION_ID_TOS)`, its low byte): set
    /// before `connect`, the route is resolved with it, so the CM's MADs
    /// and both sides' QPs carry it.
    pub fn set_tos(&self, tos: i32) {
        self.st.lock().opts.tos = tos;
        self.id.lock().set_tos(tos as u8);
    }
    /// `IP_TOS` as set.
    pub fn tos(&self) -> i32 {
        self.st.lock().opts.tos
    }

    /// `TCP_KEEPIDLE`, in seconds: the next keepalive goes that long from
    /// now.
    pub fn set_keepalive_time(&self, secs: u32) {
        let on = {
            let mut st = self.st.lock();
            st.opts.keepalive_time = secs;
            st.opts.keepalive
        };
        if on {
            keepalive::add(&self.st, secs);
        }
    }

    /// `SO_KEEPALIVE`: while on, a connected socket sends the peer an
    /// `RS_CTRL_KEEPALIVE` message (a zero-length RDMA WRITE WITH
    /// IMMEDIATE) every `TCP_KEEPIDLE` seconds (by default the kernel's
    /// `tcp_keepalive_time`, else 7200), from a service thread, as
    /// rsocket.c's: a peer that is gone then fails the RC send, and the
    /// socket reports the error (`POLLERR`, EIO) the next time it is
    /// polled or used.
    pub fn set_keepalive(&self, on: bool) {
        let time = {
            let mut st = self.st.lock();
            if st.opts.keepalive == on {
                return;
            }
            st.opts.keepalive = on;
            self.set_flag_locked(&mut st, 0, libc::SO_KEEPALIVE as u32, on);
            if st.opts.keepalive_time == 0 {
                st.opts.keepalive_time =
                    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .unwrap_or(7200);
            }
            st.opts.keepalive_time
        };
        if on {
            keepalive::add(&self.st, time);
        }
    }
    /// `TCP_KEEPIDLE` (0 until set or keepalive is turned on).
    pub fn keepalive_time(&self) -> u32 {
        self.st.lock().opts.keepalive_time
    }

    /// The CM id (for `rdma_set_option` passthroughs).
    pub fn cm_id(&self) -> CmId {
        self.id.lock().clone()
    }
}

/// The size options of [`RSocket::set_rdma_option`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaOpt {
    /// `RDMA_SQSIZE`.
    SqSize,
    /// `RDMA_RQSIZE`.
    RqSize,
    /// `RDMA_INLINE`.
    Inline,
    /// `RDMA_IOMAPSIZE`.
    IomapSize,
    /// `SO_RCVBUF` (stored doubled, as Linux does).
    RcvBuf,
    /// `SO_SNDBUF`.
    SndBuf,
}

impl State {
    /// Copies `chunk` into the send ring (wrapping): the one or two
    /// pieces of the ring it now fills.
    fn ring_copy(&mut self, chunk: &[u8]) -> Result<Vec<Sge>> {
        let len = chunk.len() as u32;
        let left = self.sbuf_size - self.soff;
        let c = self.conn()?;
        let e = |_| err(libc::EIO);
        if len <= left {
            c.smr.write(self.soff as usize, chunk).map_err(e)?;
            let sge = c.smr.sge(self.soff as usize, len);
            self.soff = if len < left { self.soff + len } else { 0 };
            Ok(vec![sge])
        } else {
            let (a, b) = chunk.split_at(left as usize);
            c.smr.write(self.soff as usize, a).map_err(e)?;
            c.smr.write(0, b).map_err(e)?;
            let sges = vec![
                c.smr.sge(self.soff as usize, left),
                c.smr.sge(0, b.len() as u32),
            ];
            self.soff = b.len() as u32;
            Ok(sges)
        }
    }

    /// Copies `chunk` into the send ring and writes it to the peer's
    /// receive buffer.
    fn copy_and_write(&mut self, chunk: &[u8]) -> Result<()> {
        let sges = self.ring_copy(chunk)?;
        self.write_data(&sges, chunk.len() as u32)
    }

    /// `rs_write_direct`: `chunk` (through the send ring) straight into
    /// the peer's mapped memory, an RDMA WRITE without immediate (the
    /// peer is not told).
    fn write_direct(&mut self, chunk: &[u8], addr: u64, rkey: u32) -> Result<()> {
        let len = chunk.len() as u32;
        let sges = self.ring_copy(chunk)?;
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let mut w = SendWr::new(u64::from(msg_set(OP_WRITE, len)), WrOpcode::RdmaWrite);
        w.sg_list.extend_from_slice(&sges);
        w.remote_addr = addr;
        w.rkey = rkey;
        self.post(w)
    }

    /// `rs_write_iomap`: tells the peer where mapping `index` is, by
    /// writing its `rs_iomap` into the peer's iomap with `RS_OP_IOMAP_SGL`.
    fn write_iomap(&mut self, index: usize) -> Result<()> {
        let c = self.conn()?;
        let m = c.maps.slots[index]
            .as_ref()
            .ok_or_else(|| err(libc::EINVAL))?;
        let sge = RsSge {
            addr: m.mr.addr(),
            key: m.mr.rkey(),
            length: m.mr.len() as u32,
        };
        let bytes = iomap_bytes(m.offset, sge, self.swap_sgl);
        let sges = self.ring_copy(&bytes)?;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= IOMAP_LEN as u32;
        let msg = msg_set(OP_IOMAP_SGL, index as u32);
        let mut w = SendWr::new(u64::from(msg), WrOpcode::RdmaWriteWithImm);
        w.imm_data = msg;
        w.sg_list.extend_from_slice(&sges);
        w.remote_addr = self
            .remote_iomap
            .addr
            .wrapping_add((index * IOMAP_LEN) as u64);
        w.rkey = self.remote_iomap.key;
        self.post(w)
    }

    /// `rs_find_iomap`: the entry of our iomap (the peer's mappings, as
    /// the peer wrote them) that holds `offset`.
    fn find_iomap(&self, offset: u64) -> Result<Option<(u64, RsSge)>> {
        let c = self.conn()?;
        for i in 0..usize::from(self.target_iomap_size) {
            let mut b = [0; IOMAP_LEN];
            c.tmr
                .read(SGE_LEN * SGL_SIZE + i * IOMAP_LEN, &mut b)
                .map_err(|_| err(libc::EIO))?;
            let o = u64::from_ne_bytes(b[..8].try_into().expect("8 bytes"));
            let sge = RsSge::from_host(&b[8..]);
            if offset >= o && offset < o.wrapping_add(u64::from(sge.length)) {
                return Ok(Some((o, sge)));
            }
        }
        Ok(None)
    }

    /// Copies received bytes out (consuming them).
    fn take(&mut self, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let Some(&front) = self.rmsg.front() else {
                break;
            };
            let want = (buf.len() - done) as u32;
            let n = if want < front {
                *self.rmsg.front_mut().expect("not empty") -= want;
                want
            } else {
                self.rseq_no = self.rseq_no.wrapping_add(1);
                self.rmsg.pop_front();
                front
            };
            self.copy_out(self.rbuf_offset, &mut buf[done..done + n as usize])?;
            self.rbuf_offset = (self.rbuf_offset + n) % self.rbuf_size;
            self.rbuf_bytes_avail += n;
            done += n as usize;
        }
        Ok(done)
    }

    /// Copies received bytes out without consuming them.
    fn peek(&self, buf: &mut [u8]) -> Result<usize> {
        let avail: u64 = self.rmsg.iter().map(|&l| u64::from(l)).sum();
        let n = (buf.len() as u64).min(avail) as usize;
        self.copy_out(self.rbuf_offset, &mut buf[..n])?;
        Ok(n)
    }

    /// Reads the receive ring at `off`, wrapping at its end.
    fn copy_out(&self, off: u32, dst: &mut [u8]) -> Result<()> {
        let c = self.conn()?;
        let e = |_| err(libc::EIO);
        let end = (self.rbuf_size - off) as usize;
        if dst.len() <= end {
            c.rmr.read(off as usize, dst).map_err(e)
        } else {
            let (a, b) = dst.split_at_mut(end);
            c.rmr.read(off as usize, a).map_err(e)?;
            c.rmr.read(0, b).map_err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_data_is_rsocket_c_layout() {
        let d = ConnData {
            version: 1,
            flags: CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge {
                addr: 0x1122_3344_5566_7788,
                key: 0xaabb_ccdd,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x10,
                key: 0x20,
                length: 65536,
            },
        };
        let b = d.to_bytes();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(
            &b[8..24],
            &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0, 2]
        );
        assert_eq!(&b[36..40], &[0, 1, 0, 0]);
        assert_eq!(ConnData::parse(&b), Some(d));
        assert_eq!(ConnData::parse(&b[..39]), None);
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), None);
    }

    #[test]
    fn immediate_encoding() {
        assert_eq!(msg_set(OP_SGL, 400), 0x8000_0190);
        assert_eq!(msg_op(msg_set(OP_CTRL, CTRL_SHUTDOWN)), OP_CTRL);
        assert_eq!(msg_data(msg_set(OP_DATA, 65536)), 65536);
    }

    #[test]
    fn iomap_scale_round_trips_as_rsocket_c() {
        assert_eq!(value_to_scale(100, 8), 100);
        assert_eq!(value_to_scale(256, 8), 0x81);
        assert_eq!(scale_to_value(0x81, 8), 256);
        assert_eq!(scale_to_value(value_to_scale(200, 8), 8), 128);
    }
}
