//! Two processes, one RC connection, through the `sideway` crate's public
//! API (RDMA-Rust's sideway 0.4), three ways:
//!
//! - `basic`: QP and CQ from `build()` (ibv_create_qp / ibv_create_cq),
//!   connected by hand: endpoints (QPN, PSN, GID) over TCP, the GID taken
//!   from the GID table entry as the crate's own tests pick it;
//! - `ex`: the extended QP and CQ (`build_ex()`: ibv_create_qp_ex with
//!   send_ops_flags, ibv_create_cq_ex), posting through the `ibv_wr_*`
//!   API and polling with `ibv_start_poll`;
//! - `cm`: connected through sideway's rdma_cm (librdmacm): listen,
//!   resolve address and route, the QP moved by `rdma_init_qp_attr`,
//!   connect/accept/establish, disconnect.
//!
//! On each connection: the server SENDs the address and rkey of a region
//! holding its pattern; the client READs the region (checked), WRITEs its
//! own pattern over it and SENDs "written"; the server checks the region
//! and SENDs back its verdict. Sizes span several packets.
//!
//! Usage: `on-sideway basic|ex|cm server|client IP PORT`. For basic and
//! ex, IP:PORT is a TCP address for the endpoint exchange; for cm it is
//! the server's RDMA address and port. `UROCE_DEVICES` names one device
//! per process.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{GenericCompletionQueue, WorkCompletionStatus};
use sideway::ibverbs::device::DeviceList;
use sideway::ibverbs::device_context::{DeviceContext, Mtu};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::queue_pair::{
    GenericQueuePair, PostSendGuard, QueuePair, QueuePairAttribute, QueuePairState,
    SendOperationFlags, SetScatterGatherEntry, WorkRequestFlags,
};
use sideway::ibverbs::AccessFlags;
use sideway::rdmacm::communication_manager::{
    ConnectionParameter, Event, EventChannel, EventType, Identifier, PortSpace,
};

const REGION: usize = 3 * 4096 + 123;
const MSG: usize = 64;
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

fn fail(msg: String) -> ! {
    eprintln!("on-sideway: {msg}");
    std::process::exit(1)
}

fn pattern(salt: u8) -> Vec<u8> {
    (0..REGION)
        .map(|i| (i.wrapping_mul(13) as u8) ^ salt ^ (i >> 8) as u8)
        .collect()
}

/// One side's verbs objects.
struct Side {
    _ctx: Arc<DeviceContext>,
    cq: GenericCompletionQueue,
    qp: GenericQueuePair,
    region: Vec<u8>,
    region_mr: Arc<MemoryRegion>,
    /// Where messages are received.
    msg: Vec<u8>,
    msg_mr: Arc<MemoryRegion>,
    /// What a SEND sends from: not `msg`, which a posted receive WR owns
    /// until its completion (the message would overwrite what is written
    /// there; UROCE_CHECK=buffer reports it).
    out: Vec<u8>,
    out_mr: Arc<MemoryRegion>,
    /// Completions polled before their turn: (wr_id, byte_len).
    early: Vec<(u64, u32)>,
}

fn setup(ctx: Arc<DeviceContext>, ex: bool) -> Side {
    let pd = ctx
        .alloc_pd()
        .unwrap_or_else(|e| fail(format!("alloc_pd: {e}")));
    let region = vec![0u8; REGION];
    let msg = vec![0u8; MSG];
    let out = vec![0u8; MSG];
    let flags = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
    // SAFETY: the buffers live in `Side` with their MRs, and are not moved
    // (a Vec's heap buffer stays put) or touched while the device may use them.
    let region_mr = unsafe { pd.reg_mr(region.as_ptr() as usize, REGION, flags) }
        .unwrap_or_else(|e| fail(format!("reg_mr: {e}")));
    let msg_mr = unsafe { pd.reg_mr(msg.as_ptr() as usize, MSG, flags) }
        .unwrap_or_else(|e| fail(format!("reg_mr: {e}")));
    // SAFETY: as above.
    let out_mr = unsafe { pd.reg_mr(out.as_ptr() as usize, MSG, flags) }
        .unwrap_or_else(|e| fail(format!("reg_mr: {e}")));
    let mut cqb = ctx.create_cq_builder();
    cqb.setup_cqe(16);
    let cq = if ex {
        GenericCompletionQueue::from(
            cqb.build_ex()
                .unwrap_or_else(|e| fail(format!("create_cq_ex: {e}"))),
        )
    } else {
        GenericCompletionQueue::from(
            cqb.build()
                .unwrap_or_else(|e| fail(format!("create_cq: {e}"))),
        )
    };
    let mut qpb = pd.create_qp_builder();
    qpb.setup_send_cq(cq.clone())
        .setup_recv_cq(cq.clone())
        .setup_max_send_wr(8)
        .setup_max_recv_wr(8)
        .setup_send_ops_flags(
            SendOperationFlags::Send | SendOperationFlags::Write | SendOperationFlags::Read,
        );
    let qp: GenericQueuePair = if ex {
        qpb.build_ex()
            .unwrap_or_else(|e| fail(format!("create_qp_ex: {e}")))
            .into()
    } else {
        qpb.build()
            .unwrap_or_else(|e| fail(format!("create_qp: {e}")))
            .into()
    };
    Side {
        _ctx: ctx,
        cq,
        qp,
        region,
        region_mr,
        msg,
        msg_mr,
        out,
        out_mr,
        early: Vec::new(),
    }
}

impl Side {
    fn post_recv(&mut self) {
        let mut g = self.qp.start_post_recv();
        let h = g.construct_wr(WR_RECV);
        // SAFETY: the message buffer and its MR live as long as `self`.
        unsafe { h.setup_sge(self.msg_mr.lkey(), self.msg.as_mut_ptr() as u64, MSG as u32) };
        g.post().unwrap_or_else(|e| fail(format!("post_recv: {e}")));
    }

    fn send(&mut self, bytes: &[u8]) {
        self.out[..bytes.len()].copy_from_slice(bytes);
        let mut g = self.qp.start_post_send();
        let h = g
            .construct_wr(WR_SEND, WorkRequestFlags::Signaled)
            .setup_send();
        // SAFETY: as in post_recv; the send is waited for before the buffer is reused.
        unsafe {
            h.setup_sge(
                self.out_mr.lkey(),
                self.out.as_ptr() as u64,
                bytes.len() as u32,
            )
        };
        g.post().unwrap_or_else(|e| fail(format!("post_send: {e}")));
        self.wait(WR_SEND);
    }

    fn rdma(&mut self, read: bool, rkey: u32, raddr: u64) {
        let mut g = self.qp.start_post_send();
        let h = if read {
            g.construct_wr(WR_READ, WorkRequestFlags::Signaled)
                .setup_read(rkey, raddr)
        } else {
            g.construct_wr(WR_WRITE, WorkRequestFlags::Signaled)
                .setup_write(rkey, raddr)
        };
        // SAFETY: the region and its MR live as long as `self`.
        unsafe {
            h.setup_sge(
                self.region_mr.lkey(),
                self.region.as_mut_ptr() as u64,
                REGION as u32,
            )
        };
        g.post().unwrap_or_else(|e| fail(format!("post_send: {e}")));
        self.wait(if read { WR_READ } else { WR_WRITE });
    }

    /// Polls until the completion of `wr_id`; returns its byte count.
    /// Others that come first (a RECV may complete before the SEND whose
    /// ACK the peer sends later) are kept for their turn.
    fn wait(&mut self, wr_id: u64) -> u32 {
        let t0 = Instant::now();
        loop {
            if let Some(i) = self.early.iter().position(|&(id, _)| id == wr_id) {
                return self.early.remove(i).1;
            }
            if let Ok(poller) = self.cq.start_poll() {
                for wc in poller {
                    if wc.status() != WorkCompletionStatus::Success as u32 {
                        fail(format!(
                            "wr {} completed with status {}",
                            wc.wr_id(),
                            wc.status()
                        ));
                    }
                    self.early.push((wc.wr_id(), wc.byte_len()));
                }
                continue;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                fail(format!("no completion for wr {wr_id} in 20 s"));
            }
            std::thread::yield_now();
        }
    }

    fn recv(&mut self) -> Vec<u8> {
        let n = self.wait(WR_RECV) as usize;
        let v = self.msg[..n].to_vec();
        self.post_recv();
        v
    }
}

/// The exchange on a connected pair; both sides have a receive posted.
fn exchange(s: &mut Side, server: bool) -> String {
    if server {
        s.region.copy_from_slice(&pattern(0x11));
        let mut d = Vec::new();
        d.extend_from_slice(&(s.region.as_ptr() as u64).to_be_bytes());
        d.extend_from_slice(&s.region_mr.rkey().to_be_bytes());
        s.send(&d);
        let m = s.recv();
        if m != b"written" {
            fail(format!("expected \"written\", got {m:?}"));
        }
        let ok = s.region == pattern(0x22);
        s.send(if ok { b"ok" } else { b"bad" });
        if !ok {
            fail("the region does not hold the client's WRITE".into());
        }
        format!("region read and overwritten by the peer ({REGION} bytes each way)")
    } else {
        let d = s.recv();
        if d.len() != 12 {
            fail(format!("region descriptor of {} bytes", d.len()));
        }
        let raddr = u64::from_be_bytes(d[..8].try_into().unwrap());
        let rkey = u32::from_be_bytes(d[8..12].try_into().unwrap());
        s.rdma(true, rkey, raddr);
        if s.region != pattern(0x11) {
            fail("RDMA READ did not return the server's pattern".into());
        }
        s.region.copy_from_slice(&pattern(0x22));
        s.rdma(false, rkey, raddr);
        s.send(b"written");
        let v = s.recv();
        if v != b"ok" {
            fail(format!("server's verdict: {v:?}"));
        }
        format!("READ {REGION} bytes checked, WRITE {REGION} bytes checked by the server")
    }
}

// ---------------------------------------------------------------------
// Connected by hand
// ---------------------------------------------------------------------

fn tcp(server: bool, addr: &str) -> TcpStream {
    if server {
        let l = TcpListener::bind(addr).unwrap_or_else(|e| fail(format!("listen {addr}: {e}")));
        return l
            .accept()
            .unwrap_or_else(|e| fail(format!("accept: {e}")))
            .0;
    }
    let t0 = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return s,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => fail(format!("connect {addr}: {e}")),
        }
    }
}

fn swap(t: &mut TcpStream, mine: &[u8]) -> Vec<u8> {
    t.write_all(mine)
        .unwrap_or_else(|e| fail(format!("tcp: {e}")));
    let mut v = vec![0u8; mine.len()];
    t.read_exact(&mut v)
        .unwrap_or_else(|e| fail(format!("tcp: {e}")));
    v
}

fn by_hand(server: bool, addr: &str, ex: bool) -> String {
    let mut t = tcp(server, addr);
    let list = DeviceList::new().unwrap_or_else(|e| fail(format!("device list: {e}")));
    let dev = list
        .iter()
        .next()
        .unwrap_or_else(|| fail("no RDMA device".into()));
    let ctx = dev.open().unwrap_or_else(|e| fail(format!("open: {e}")));
    // The GID as the crate's own tests choose it: the first port-1 entry
    // that is not link-local. Its interface must be nameable.
    let gids = ctx
        .query_gid_table()
        .unwrap_or_else(|e| fail(format!("query_gid_table: {e}")));
    let entry = gids
        .iter()
        .find(|g| g.port_num() == 1 && !g.gid().is_unicast_link_local())
        .unwrap_or_else(|| fail(format!("no usable GID among {} entries", gids.len())));
    let ifname = entry
        .netdev_name()
        .unwrap_or_else(|e| fail(format!("netdev_name: {e}")));
    let gid_index = entry.gid_index();
    let gid = entry.gid();
    let mut s = setup(ctx, ex);
    let psn: u32 = if server { 0x1234 } else { 0xabcdef };

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::Init)
        .setup_pkey_index(0)
        .setup_port(1)
        .setup_access_flags(
            AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
        );
    s.qp.modify(&attr)
        .unwrap_or_else(|e| fail(format!("modify INIT: {e}")));
    s.post_recv();

    let mut mine = Vec::new();
    mine.extend_from_slice(&s.qp.qp_number().to_be_bytes());
    mine.extend_from_slice(&psn.to_be_bytes());
    mine.extend_from_slice(&Ipv6Addr::from(gid).octets());
    let theirs = swap(&mut t, &mine);
    let dqpn = u32::from_be_bytes(theirs[0..4].try_into().unwrap());
    let dpsn = u32::from_be_bytes(theirs[4..8].try_into().unwrap());
    let dgid = Gid::from(Ipv6Addr::from(
        <[u8; 16]>::try_from(&theirs[8..24]).unwrap(),
    ));

    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToReceive)
        .setup_path_mtu(Mtu::Mtu1024)
        .setup_dest_qp_num(dqpn)
        .setup_rq_psn(dpsn)
        .setup_max_dest_read_atomic(4)
        .setup_min_rnr_timer(12);
    let mut ah = AddressHandleAttribute::new();
    ah.setup_port(1)
        .setup_grh_src_gid_index(gid_index as u8)
        .setup_grh_dest_gid(&dgid)
        .setup_grh_hop_limit(64);
    attr.setup_address_vector(&ah);
    s.qp.modify(&attr)
        .unwrap_or_else(|e| fail(format!("modify RTR: {e}")));
    let mut attr = QueuePairAttribute::new();
    attr.setup_state(QueuePairState::ReadyToSend)
        .setup_sq_psn(psn)
        .setup_timeout(14)
        .setup_retry_cnt(7)
        .setup_rnr_retry(7)
        .setup_max_read_atomic(4);
    s.qp.modify(&attr)
        .unwrap_or_else(|e| fail(format!("modify RTS: {e}")));
    if s.qp.state() != QueuePairState::ReadyToSend {
        fail("QP not in RTS".into());
    }
    // Both sides are in RTS with a receive posted before anyone sends.
    swap(&mut t, b"go");
    let r = exchange(&mut s, server);
    swap(&mut t, b"ok");
    format!("{r}; GID index {gid_index} on {ifname}")
}

// ---------------------------------------------------------------------
// Connected through rdma_cm
// ---------------------------------------------------------------------

fn event(ch: &Arc<EventChannel>, want: EventType) -> Event {
    let e = ch
        .get_cm_event()
        .unwrap_or_else(|e| fail(format!("get_cm_event: {e}")));
    if e.event_type() != want {
        fail(format!(
            "CM event {:?} (status {}), expected {want:?}",
            e.event_type(),
            e.status()
        ));
    }
    e
}

fn move_qp(id: &Identifier, qp: &mut GenericQueuePair, state: QueuePairState) {
    let attr = id
        .get_qp_attr(state)
        .unwrap_or_else(|e| fail(format!("rdma_init_qp_attr {state:?}: {e}")));
    qp.modify(&attr)
        .unwrap_or_else(|e| fail(format!("modify {state:?}: {e}")));
}

fn conn_param(qpn: u32) -> ConnectionParameter {
    let mut p = ConnectionParameter::default();
    p.setup_qp_number(qpn);
    p
}

fn through_cm(server: bool, ip: IpAddr, port: u16) -> String {
    let ch =
        EventChannel::new().unwrap_or_else(|e| fail(format!("rdma_create_event_channel: {e}")));
    let addr = SocketAddr::new(ip, port);
    let (id, mut s, _listener) = if server {
        let listener = ch
            .create_id(PortSpace::Tcp)
            .unwrap_or_else(|e| fail(format!("rdma_create_id: {e}")));
        listener
            .bind_addr(addr)
            .unwrap_or_else(|e| fail(format!("rdma_bind_addr: {e}")));
        listener
            .listen(4)
            .unwrap_or_else(|e| fail(format!("rdma_listen: {e}")));
        let req = event(&ch, EventType::ConnectRequest);
        let id = req
            .cm_id()
            .unwrap_or_else(|| fail("connect request without an id".into()));
        req.ack().unwrap_or_else(|e| fail(format!("ack: {e}")));
        let ctx = id
            .get_device_context()
            .unwrap_or_else(|| fail("request id without a device".into()));
        let mut s = setup(ctx, false);
        move_qp(&id, &mut s.qp, QueuePairState::Init);
        move_qp(&id, &mut s.qp, QueuePairState::ReadyToReceive);
        move_qp(&id, &mut s.qp, QueuePairState::ReadyToSend);
        s.post_recv();
        id.accept(conn_param(s.qp.qp_number()))
            .unwrap_or_else(|e| fail(format!("rdma_accept: {e}")));
        event(&ch, EventType::Established)
            .ack()
            .unwrap_or_else(|e| fail(format!("ack: {e}")));
        (id, s, Some(listener))
    } else {
        // The server may not listen yet: a rejected attempt starts over
        // with a new id.
        let t0 = Instant::now();
        let (id, mut s) = loop {
            let id = ch
                .create_id(PortSpace::Tcp)
                .unwrap_or_else(|e| fail(format!("rdma_create_id: {e}")));
            id.resolve_addr(None, addr, Duration::from_secs(2))
                .unwrap_or_else(|e| fail(format!("rdma_resolve_addr: {e}")));
            event(&ch, EventType::AddressResolved).ack().unwrap();
            id.resolve_route(Duration::from_secs(2))
                .unwrap_or_else(|e| fail(format!("rdma_resolve_route: {e}")));
            event(&ch, EventType::RouteResolved).ack().unwrap();
            let ctx = id
                .get_device_context()
                .unwrap_or_else(|| fail("resolved id without a device".into()));
            let mut s = setup(ctx, false);
            move_qp(&id, &mut s.qp, QueuePairState::Init);
            s.post_recv();
            id.connect(conn_param(s.qp.qp_number()))
                .unwrap_or_else(|e| fail(format!("rdma_connect: {e}")));
            let e = ch
                .get_cm_event()
                .unwrap_or_else(|e| fail(format!("get_cm_event: {e}")));
            match e.event_type() {
                EventType::ConnectResponse => {
                    e.ack().unwrap();
                    break (id, s);
                }
                EventType::Rejected if t0.elapsed() < Duration::from_secs(20) => {
                    e.ack().unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                }
                other => fail(format!(
                    "CM event {other:?} (status {}) after connect",
                    e.status()
                )),
            }
        };
        move_qp(&id, &mut s.qp, QueuePairState::ReadyToReceive);
        move_qp(&id, &mut s.qp, QueuePairState::ReadyToSend);
        id.establish()
            .unwrap_or_else(|e| fail(format!("rdma_establish: {e}")));
        (id, s, None)
    };
    let r = exchange(&mut s, server);
    if server {
        // The client disconnects; the server sees it.
        event(&ch, EventType::Disconnected).ack().unwrap();
    } else {
        id.disconnect()
            .unwrap_or_else(|e| fail(format!("rdma_disconnect: {e}")));
        event(&ch, EventType::Disconnected).ack().unwrap();
    }
    drop(s);
    format!("{r}; connected and disconnected through rdma_cm")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5
        || !["basic", "ex", "cm"].contains(&args[1].as_str())
        || !["server", "client"].contains(&args[2].as_str())
    {
        fail("usage: on-sideway basic|ex|cm server|client IP PORT".into());
    }
    let server = args[2] == "server";
    let ip: IpAddr = args[3]
        .parse()
        .unwrap_or_else(|e| fail(format!("{}: {e}", args[3])));
    let port: u16 = args[4]
        .parse()
        .unwrap_or_else(|e| fail(format!("{}: {e}", args[4])));
    let r = match args[1].as_str() {
        "cm" => through_cm(server, ip, port),
        m => by_hand(server, &SocketAddr::new(ip, port).to_string(), m == "ex"),
    };
    println!("on-sideway {} {}: {r}", args[1], args[2]);
}
