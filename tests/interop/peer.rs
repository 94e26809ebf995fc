//! interop-peer: uroce's side of the interop matrix's error scenarios
//! (tests/interop/run.sh), facing `rxe-peer badrkey|rnr` (rxe_peer.c) on
//! kernel rxe with the same protocol. The TCP server is the responder, the
//! client the requester:
//!
//! ```text
//! interop-peer badrkey|rnr|mw [-p PORT]                      responder
//! interop-peer badrkey|rnr|mw [-p PORT] [-o write|read] HOST requester
//! ```
//!
//! - badrkey: the requester's RDMA WRITE or READ carries a bad rkey; it
//!   must complete with REM_ACCESS_ERR (the requester's QP in ERR), and the
//!   responder's QP go to ERR with its posted receive flushed (the
//!   asynchronous events it raised are reported).
//! - rnr: the requester SENDs before the responder posts a receive
//!   (rnr_retry 7); the SEND completes with success after the responder
//!   posts the receive 1.5 s later, with the right data.
//! - mw: the responder binds a type 2 memory window over 512 bytes at
//!   offset 1024 of a region with no remote access of its own and gives
//!   the window's rkey and address; the requester WRITEs 64 bytes through
//!   it (success), SENDs with Invalidate naming it (success; the receive
//!   shows WITH_INV and the key) and WRITEs through it again
//!   (REM_ACCESS_ERR; the responder's QP goes to ERR).
//!
//! Exchange, one text line each way: requester `QPN PSN IP` (hex, hex,
//! dotted), responder `QPN PSN RKEY ADDR` (hex); then the requester's
//! `sent`/`done`, the responder's verdict `ok|FAIL TEXT`, the requester's
//! `bye`. The device is the first of `UROCE_DEVICES`.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uroce_provider::qp_attr::gid_of;
use uroce_verbs::*;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);

fn fail(m: impl std::fmt::Display) -> Error {
    Error::Engine(m.to_string())
}

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    psn: u32,
}

fn open() -> Result<Side> {
    let dev = devices()?
        .into_iter()
        .next()
        .ok_or_else(|| Error::NoDevice("none configured".into()))?;
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    })?;
    let a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: ALL,
        ..QpAttr::default()
    };
    qp.modify(
        &a,
        AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
    )?;
    Ok(Side {
        ctx,
        pd,
        cq,
        qp,
        psn: uroce_provider::wire::Psn::random().value(),
    })
}

/// RTR and RTS towards the peer (rc_pingpong's attributes; the RNR timer
/// as given).
fn connect(s: &Side, peer: IpAddr, qpn: u32, psn: u32, rnr_timer: u8) -> Result<()> {
    let mut a = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AddressVector {
            dgid: gid_of(peer),
            ..AddressVector::default()
        },
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: qpn,
        rq_psn: psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: rnr_timer,
        ..QpAttr::default()
    };
    s.qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER,
    )?;
    a.qp_state = QpState::Rts;
    a.sq_psn = s.psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    s.qp.modify(
        &a,
        AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC,
    )
}

struct Tcp {
    rd: BufReader<TcpStream>,
    wr: TcpStream,
}

impl Tcp {
    fn new(s: TcpStream) -> Result<Tcp> {
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(fail)?;
        Ok(Tcp {
            wr: s.try_clone().map_err(fail)?,
            rd: BufReader::new(s),
        })
    }
    fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        self.rd
            .read_line(&mut l)
            .map_err(|e| fail(format!("exchange: {e}")))?;
        Ok(l.trim_end().to_string())
    }
    fn put(&mut self, l: &str) -> Result<()> {
        writeln!(self.wr, "{l}").map_err(|e| fail(format!("exchange: {e}")))
    }
}

fn hex(v: &[&str], i: usize) -> Result<u64> {
    let s = v.get(i).ok_or_else(|| fail("exchange: short line"))?;
    u64::from_str_radix(s, 16).map_err(|_| fail(format!("exchange: bad number {s}")))
}

fn wait_one(cq: &CompletionQueue, t: Duration) -> Option<Wc> {
    cq.wait(1, t).into_iter().next()
}

/// The responder's half of the exchange: accepts the requester on
/// `port`, reads its `QPN PSN IP` and connects the QP to it.
fn accept_requester(s: &Side, port: u16, rnr_timer: u8) -> Result<Tcp> {
    let l =
        TcpListener::bind(("0.0.0.0", port)).map_err(|e| fail(format!("listen {port}: {e}")))?;
    let (tcp, _) = l.accept().map_err(fail)?;
    let mut t = Tcp::new(tcp)?;
    let line = t.line()?;
    let v: Vec<&str> = line.split_whitespace().collect();
    let ip: IpAddr = v
        .get(2)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| fail(format!("exchange: bad line '{line}'")))?;
    connect(s, ip, hex(&v, 0)? as u32, hex(&v, 1)? as u32, rnr_timer)?;
    Ok(t)
}

/// The requester's half: connects to the responder, sends `QPN PSN IP`,
/// reads its `QPN PSN RKEY ADDR` and connects the QP; returns the
/// exchange, the rkey and the address.
fn join_responder(s: &Side, host: &str, port: u16) -> Result<(Tcp, u32, u64)> {
    let tcp = TcpStream::connect((host, port))
        .map_err(|e| fail(format!("connect {host}:{port}: {e}")))?;
    let peer = tcp.peer_addr().map_err(fail)?.ip();
    let mut t = Tcp::new(tcp)?;
    t.put(&format!(
        "{:x} {:x} {}",
        s.qp.qp_num(),
        s.psn,
        s.ctx.device().ip()
    ))?;
    let line = t.line()?;
    let v: Vec<&str> = line.split_whitespace().collect();
    let (qpn, psn, rkey, raddr) = (hex(&v, 0)?, hex(&v, 1)?, hex(&v, 2)?, hex(&v, 3)?);
    connect(s, peer, qpn as u32, psn as u32, 12)?;
    Ok((t, rkey as u32, raddr))
}

fn responder(mode: &str, port: u16) -> Result<bool> {
    let s = open()?;
    let mr = s.pd.alloc_mr(4096, ALL)?;
    let recv = RecvWr {
        wr_id: 1,
        sg_list: [mr.sge(0, 4096)].into_iter().collect(),
    };
    let rnr = mode == "rnr";
    if !rnr {
        s.qp.post_recv(std::slice::from_ref(&recv))
            .map_err(|e| e.1)?;
    }
    // RNR timer 24 (40.96 ms): a few dozen RNR NAKs while we wait.
    let mut t = accept_requester(&s, port, 24)?;
    t.put(&format!(
        "{:x} {:x} {:x} {:x}",
        s.qp.qp_num(),
        s.psn,
        mr.rkey(),
        mr.addr()
    ))?;
    let (ok, res) = if rnr {
        t.line()?; // "sent"
        std::thread::sleep(Duration::from_millis(1500));
        s.qp.post_recv(&[recv]).map_err(|e| e.1)?;
        match wait_one(&s.cq, Duration::from_secs(10)) {
            None => (false, "no receive completion within 10 s".to_string()),
            Some(wc) => {
                let data = mr.to_vec(0, 64).map_err(fail)?;
                let data_ok = wc.byte_len == 64
                    && data
                        .iter()
                        .enumerate()
                        .all(|(i, &b)| b == (i as u8).wrapping_mul(7).wrapping_add(1));
                (
                    wc.status == WcStatus::Success && wc.opcode == WcOpcode::Recv && data_ok,
                    format!(
                        "receive {}, {} bytes, data {}",
                        wc.status,
                        wc.byte_len,
                        if data_ok { "ok" } else { "wrong" }
                    ),
                )
            }
        }
    } else {
        t.line()?; // "done"
        let mut events = Vec::new();
        let end = Instant::now() + Duration::from_secs(2);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match s.ctx.get_async_event_timeout(left) {
                Some(e) if matches!(e.event_type, EventType::CommEst | EventType::PortActive) => {}
                Some(e) => events.push(format!("{:?}", e.event_type)),
                None => break,
            }
        }
        let wc = wait_one(&s.cq, Duration::from_millis(500));
        let state = s.qp.query()?.qp_state;
        // IBA: the responder's QP goes to ERR (its receive flushed); the
        // affiliated event is reported, not required (rxe raises none).
        let ok =
            state == QpState::Err && wc.as_ref().map(|w| w.status) == Some(WcStatus::WrFlushErr);
        (
            ok,
            format!(
                "responder QP {state:?}, async events {}, posted receive: {}",
                if events.is_empty() {
                    "none".to_string()
                } else {
                    events.join(",")
                },
                wc.map_or("no completion".to_string(), |w| w.status.to_string())
            ),
        )
    };
    t.put(&format!("{} {res}", if ok { "ok" } else { "FAIL" }))?;
    println!(
        "interop-peer {mode} responder: {}: {res}",
        if ok { "ok" } else { "FAIL" }
    );
    let _ = t.line(); // "bye": the requester has its verdict
    Ok(ok)
}

fn requester(mode: &str, port: u16, host: &str, op: &str) -> Result<bool> {
    let s = open()?;
    let mr = s.pd.alloc_mr(4096, ALL)?;
    let (mut t, rkey, raddr) = join_responder(&s, host, port)?;
    let mut wr = SendWr::new(7, WrOpcode::Send);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(mr.sge(0, 64));
    let (ok, res) = if mode == "rnr" {
        let data: Vec<u8> = (0..64u8)
            .map(|i| i.wrapping_mul(7).wrapping_add(1))
            .collect();
        mr.write(0, &data).map_err(fail)?;
        let t0 = Instant::now();
        s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        t.put("sent")?;
        let wc = wait_one(&s.cq, Duration::from_secs(15))
            .ok_or_else(|| fail("SEND: no completion within 15 s"))?;
        let dt = t0.elapsed();
        (
            wc.status == WcStatus::Success && dt >= Duration::from_secs(1),
            format!(
                "SEND completed with {} after {} ms",
                wc.status,
                dt.as_millis()
            ),
        )
    } else {
        let read = op == "read";
        wr.opcode = if read {
            WrOpcode::RdmaRead
        } else {
            WrOpcode::RdmaWrite
        };
        wr.remote_addr = raddr;
        wr.rkey = rkey ^ 1;
        s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        let wc = wait_one(&s.cq, Duration::from_secs(15))
            .ok_or_else(|| fail("no completion within 15 s"))?;
        let state = s.qp.query()?.qp_state;
        t.put("done")?;
        (
            wc.status == WcStatus::RemAccessErr && state == QpState::Err,
            format!(
                "{} with a bad rkey completed with {}, requester QP {state:?}",
                if read { "RDMA READ" } else { "RDMA WRITE" },
                wc.status
            ),
        )
    };
    let verdict = t.line()?;
    let peer_ok = verdict.starts_with("ok");
    println!(
        "interop-peer {mode} requester: {}: {res}; the responder (rxe) says: {verdict}",
        if ok { "ok" } else { "FAIL" }
    );
    let _ = t.put("bye");
    Ok(ok && peer_ok)
}

fn mw_pat(i: usize) -> u8 {
    (i as u8).wrapping_mul(5).wrapping_add(3)
}

fn mw_responder(port: u16) -> Result<bool> {
    let s = open()?;
    let mr = s.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::MW_BIND)?;
    let mw = s.pd.alloc_mw(MwType::Type2)?;
    s.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: [mr.sge(2048, 1024)].into_iter().collect(),
    }])
    .map_err(|e| e.1)?;
    let mut t = accept_requester(&s, port, 12)?;
    let (bind, rkey) = mw.bind_wr(5, &mr, 1024..1536, Access::REMOTE_WRITE);
    s.qp.post_send(&[bind]).map_err(|e| e.1)?;
    let wc =
        wait_one(&s.cq, Duration::from_secs(5)).ok_or_else(|| fail("BIND_MW: no completion"))?;
    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::BindMw {
        return Err(fail(format!("BIND_MW completed with {}", wc.status)));
    }
    t.put(&format!(
        "{:x} {:x} {rkey:x} {:x}",
        s.qp.qp_num(),
        s.psn,
        mr.addr() + 1024
    ))?;
    t.line()?; // "done"
    let b = mr.to_vec(0, 4096).map_err(fail)?;
    let data_ok = b[1023] == 0 && b[1024 + 64] == 0 && (0..64).all(|i| b[1024 + i] == mw_pat(i));
    let wc = wait_one(&s.cq, Duration::from_secs(2));
    let inv_ok = wc.is_some_and(|w| {
        w.status == WcStatus::Success
            && w.opcode == WcOpcode::Recv
            && w.wc_flags.contains(WcFlags::WITH_INV)
            && w.invalidated_rkey == rkey
    });
    std::thread::sleep(Duration::from_millis(200));
    let state = s.qp.query()?.qp_state;
    let ok = data_ok && inv_ok && state == QpState::Err && !mw.is_bound();
    let res = format!(
        "WRITE through the window: data {}; receive: {}{}, invalidated rkey {}; \
         responder QP {state:?} after the WRITE through the invalidated window",
        if data_ok { "ok" } else { "wrong" },
        wc.map_or("no completion".to_string(), |w| w.status.to_string()),
        if wc.is_some_and(|w| w.wc_flags.contains(WcFlags::WITH_INV)) {
            " WITH_INV"
        } else {
            ""
        },
        if inv_ok { "the window's" } else { "wrong" },
    );
    t.put(&format!("{} {res}", if ok { "ok" } else { "FAIL" }))?;
    println!(
        "interop-peer mw responder: {}: {res}",
        if ok { "ok" } else { "FAIL" }
    );
    let _ = t.line(); // "bye"
    Ok(ok)
}

fn mw_requester(port: u16, host: &str) -> Result<bool> {
    let s = open()?;
    let mr = s.pd.alloc_mr(4096, ALL)?;
    let (mut t, rkey, raddr) = join_responder(&s, host, port)?;
    let data: Vec<u8> = (0..64).map(mw_pat).collect();
    mr.write(0, &data).map_err(fail)?;
    let mut status = Vec::new();
    for (id, op, len) in [
        (1, WrOpcode::RdmaWrite, 64),
        (2, WrOpcode::SendWithInv, 16),
        (3, WrOpcode::RdmaWrite, 64),
    ] {
        let mut wr = SendWr::new(id, op);
        wr.flags = SendFlags::SIGNALED;
        wr.sg_list.push(mr.sge(0, len));
        wr.remote_addr = raddr;
        wr.rkey = rkey;
        wr.invalidate_rkey = rkey;
        s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        let wc = wait_one(&s.cq, Duration::from_secs(15))
            .ok_or_else(|| fail(format!("{op:?}: no completion within 15 s")))?;
        status.push(wc.status);
    }
    let ok = status == [WcStatus::Success, WcStatus::Success, WcStatus::RemAccessErr];
    let res = format!(
        "WRITE through the window: {}; SEND_WITH_INV: {}; WRITE after it: {}",
        status[0], status[1], status[2]
    );
    t.put("done")?;
    let verdict = t.line()?;
    let peer_ok = verdict.starts_with("ok");
    println!(
        "interop-peer mw requester: {}: {res}; the responder (rxe) says: {verdict}",
        if ok { "ok" } else { "FAIL" }
    );
    let _ = t.put("bye");
    Ok(ok && peer_ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut port = 18516u16;
    let mut op = "write".to_string();
    let mut host = None;
    let mode = args.first().cloned().unwrap_or_default();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "-p" => {
                port = args.get(i + 1).and_then(|p| p.parse().ok()).unwrap_or(port);
                i += 1;
            }
            "-o" => {
                op = args.get(i + 1).cloned().unwrap_or(op);
                i += 1;
            }
            h => host = Some(h.to_string()),
        }
        i += 1;
    }
    if mode != "badrkey" && mode != "rnr" && mode != "mw" {
        eprintln!("usage: interop-peer badrkey|rnr|mw [-p PORT] [-o write|read] [HOST]");
        return ExitCode::from(2);
    }
    let r = match (host, mode.as_str()) {
        (Some(h), "mw") => mw_requester(port, &h),
        (None, "mw") => mw_responder(port),
        (Some(h), _) => requester(&mode, port, &h, &op),
        (None, _) => responder(&mode, port),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("interop-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
