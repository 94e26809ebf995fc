//! `uroce cm-echo`: the exchange of rdma-core's `rdma_server` and
//! `rdma_client` examples, through the connection manager: the client
//! connects to port 7471 (RDMA_PS_TCP), posts a receive, sends 16 bytes;
//! the server receives them and sends 16 bytes back; then both
//! disconnect. Either end works against Debian's `rdma_server` /
//! `rdma_client` (on uroce's librdmacm or on the kernel's), and against
//! each other, where the server echoes the client's bytes and the client
//! checks them.

use std::net::SocketAddr;
use std::time::Duration;
use uroce_rdmacm::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use uroce_verbs::{
    Access, QpCap, QpInitAttr, QpType, RecvWr, SendFlags, SendWr, WcStatus, WrOpcode,
};
use uroce_verbs::{Error, Result};

/// The examples' port.
pub const PORT: u16 = 7471;
/// Bytes each way.
pub const MSG: usize = 16;
/// What the client sends.
pub const CLIENT_MSG: &[u8; MSG] = b"uroce cm-echo 01";

const T: Duration = Duration::from_secs(30);

fn expect(ch: &EventChannel, want: CmEventType) -> Result<uroce_rdmacm::cm::CmEvent> {
    let e = ch.get_event_timeout(Some(T))?.ok_or_else(|| {
        Error::Engine(format!(
            "no CM event in {} s (waiting for {})",
            T.as_secs(),
            want.as_str()
        ))
    })?;
    if e.event != want {
        return Err(Error::Engine(format!(
            "{} (status {}) while waiting for {}",
            e.event.as_str(),
            e.status,
            want.as_str()
        )));
    }
    Ok(e)
}

/// The verbs objects of one end: a PD, a CQ, 2 x 16 bytes, an RC QP.
struct End {
    cq: uroce_verbs::CompletionQueue,
    mr: uroce_verbs::MemoryRegion,
    qp: std::sync::Arc<uroce_verbs::QueuePair>,
    _pd: uroce_verbs::ProtectionDomain,
}

fn end(id: &CmId) -> Result<End> {
    let ctx = id
        .context()
        .ok_or_else(|| Error::Invalid("the id has no device".into()))?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4)?;
    let mr = pd.alloc_mr(2 * MSG, Access::LOCAL_WRITE)?;
    let qp = id.create_qp(
        &pd,
        &QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCap {
                max_send_wr: 1,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 16,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
            srq: None,
        },
    )?;
    Ok(End {
        cq,
        mr,
        qp,
        _pd: pd,
    })
}

impl End {
    fn post_recv(&self) -> Result<()> {
        let mut w = RecvWr {
            wr_id: 1,
            sg_list: Default::default(),
        };
        w.sg_list.push(self.mr.sge(0, MSG as u32));
        self.qp.post_recv(&[w]).map_err(|(_, e)| e)
    }
    fn send(&self, bytes: &[u8; MSG]) -> Result<()> {
        self.mr
            .write(MSG, bytes)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let mut w = SendWr::new(2, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(self.mr.sge(MSG, MSG as u32));
        self.qp.post_send(&[w]).map_err(|(_, e)| e)
    }
    /// Waits for `n` completions, all successful.
    fn complete(&self, n: usize) -> Result<()> {
        let wcs = self.cq.wait(n, T);
        if wcs.len() < n {
            return Err(Error::Engine("a work request did not complete".into()));
        }
        if let Some(bad) = wcs.iter().find(|w| w.status != WcStatus::Success) {
            return Err(Error::Engine(format!("completion {:?}", bad.status)));
        }
        Ok(())
    }
    fn received(&self) -> Result<[u8; MSG]> {
        let mut b = [0u8; MSG];
        self.mr
            .read(0, &mut b)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        Ok(b)
    }
}

/// The server: takes one connection on `bind`, echoes the 16 bytes it
/// receives, disconnects. Returns what it received.
pub fn server(bind: SocketAddr) -> Result<[u8; MSG]> {
    let ch = EventChannel::new()?;
    let listen = CmId::new(&ch, PortSpace::Tcp)?;
    listen.bind_addr(bind)?;
    listen.listen(1)?;
    let req = expect(&ch, CmEventType::ConnectRequest)?;
    let id = req.id;
    let e = end(&id)?;
    e.post_recv()?;
    id.accept(&ConnParam::default())?;
    expect(&ch, CmEventType::Established)?;
    e.complete(1)?;
    let got = e.received()?;
    e.send(&got)?;
    e.complete(1)?;
    // The client disconnects first (rdma_client does after its receive).
    let d = ch.get_event_timeout(Some(T))?;
    if d.as_ref().map(|d| d.event) != Some(CmEventType::Disconnected) {
        id.disconnect()?;
    }
    let _ = id.disconnect();
    Ok(got)
}

/// The client: connects from `src` (or the device towards `dst`) to
/// `dst`, sends [`CLIENT_MSG`], waits for 16 bytes back, disconnects.
/// Returns what came back.
pub fn client(src: Option<SocketAddr>, dst: SocketAddr) -> Result<[u8; MSG]> {
    let ch = EventChannel::new()?;
    let id = CmId::new(&ch, PortSpace::Tcp)?;
    id.resolve_addr(src, dst)?;
    expect(&ch, CmEventType::AddrResolved)?;
    id.resolve_route()?;
    expect(&ch, CmEventType::RouteResolved)?;
    let e = end(&id)?;
    e.post_recv()?;
    id.connect(&ConnParam::default())?;
    expect(&ch, CmEventType::Established)?;
    e.send(CLIENT_MSG)?;
    e.complete(2)?;
    let got = e.received()?;
    id.disconnect()?;
    let _ = ch.get_event_timeout(Some(Duration::from_secs(5)));
    Ok(got)
}
