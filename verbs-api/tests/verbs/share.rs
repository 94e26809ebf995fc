//! Several processes on one device (`provider::engine::share`): each
//! member is this binary run again as a child (`--exact
//! share::member_child`), driven by lines on its stdin and answering on
//! its stdout (lines that start with `@@`). Members open the same
//! address; their RC QPs exchange SENDs and RDMA WRITEs, data checked.
//! The QPs connect by the parent passing QP numbers along, or through
//! the device's CM (REQ, REP, RTU, DREQ, DREP and SIDR, straight through
//! the agent's `CmHandle`), which the processes share as the kernel's
//! one CM: a REQ reaches the listener's process, a reply the process
//! whose communication ID it names, a listen is the device's.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce_verbs::*;

use crate::common::{recv, ALL, T};
use uroce_provider::device::cm::CmEvent;
use uroce_provider::wire::cm::{RepRepr, ReqRepr};

const CHILD_ENV: &str = "UROCE_TEST_SHARE_CHILD";
const OTHER_USER_ENV: &str = "UROCE_TEST_SHARE_OTHER_USER";
/// Bytes of each RDMA WRITE (into a region of its own per iteration).
const CHUNK: usize = 512;
/// Bytes of each SEND.
const SEND_LEN: usize = 200;
/// Receives kept posted.
const RECVS: u64 = 16;
/// How long the parent waits for a member's line.
const LINE_WAIT: Duration = Duration::from_secs(120);

/// The byte `k` of message `i` on link `tag`.
fn pattern(tag: &str, i: u64, k: usize) -> u8 {
    let t = tag
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    (t.wrapping_add(i.wrapping_mul(131))
        .wrapping_add(k as u64 * 7)
        % 251) as u8
}

fn bytes(tag: &str, i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|k| pattern(tag, i, k)).collect()
}

/// One RC QP of a member, with its CQ and memory.
struct Link {
    qp: QueuePair,
    cq: CompletionQueue,
    /// SEND source and WRITE source.
    src: MemoryRegion,
    /// Where the peer's SENDs land.
    rbuf: MemoryRegion,
    /// Where the peer's WRITEs land (a chunk per iteration).
    target: MemoryRegion,
    /// The peer's target (addr, rkey).
    peer: parking_lot::Mutex<(u64, u32)>,
}

fn out(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "@@ {line}");
    let _ = o.flush();
}

/// `n` iterations, in step with the peer: a WRITE of chunk `i` into its
/// target and a SEND `i`; each SEND received is checked, and so is the
/// chunk its WRITE (ordered before it) left here.
fn traffic(tag: &str, l: &Link, n: u64, progress_at: u64) -> std::result::Result<(), String> {
    let (paddr, prkey) = *l.peer.lock();
    let (mut sent, mut got) = (0u64, 0u64);
    for i in 0..n {
        let data = bytes(tag, i, CHUNK);
        l.src.write(0, &data).map_err(|e| e.to_string())?;
        let mut w = SendWr::new(2 * i, WrOpcode::RdmaWrite);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(l.src.sge(0, CHUNK as u32));
        w.remote_addr = paddr + i * CHUNK as u64;
        w.rkey = prkey;
        let mut s = SendWr::new(2 * i + 1, WrOpcode::Send);
        s.flags = SendFlags::SIGNALED;
        s.sg_list.push(l.src.sge(0, SEND_LEN as u32));
        l.qp.post_send(&[w, s]).map_err(|e| e.1.to_string())?;
        let end = Instant::now() + T;
        while sent < 2 * (i + 1) || got < i + 1 {
            let Some(wc) = l.cq.poll_one() else {
                if Instant::now() > end {
                    return Err(format!("iteration {i}: sent {sent}, got {got}"));
                }
                std::thread::yield_now();
                continue;
            };
            if wc.status != WcStatus::Success {
                return Err(format!("iteration {i}: {:?} {:?}", wc.opcode, wc.status));
            }
            if wc.opcode != WcOpcode::Recv {
                sent += 1;
                continue;
            }
            let j = got;
            let slot = (wc.wr_id % RECVS) as usize;
            let at = slot * SEND_LEN;
            let m = l.rbuf.to_vec(at, SEND_LEN).map_err(|e| e.to_string())?;
            if wc.byte_len as usize != SEND_LEN || m != bytes(tag, j, SEND_LEN) {
                return Err(format!("SEND {j}: wrong data"));
            }
            let c = l
                .target
                .to_vec(j as usize * CHUNK, CHUNK)
                .map_err(|e| e.to_string())?;
            if c != bytes(tag, j, CHUNK) {
                return Err(format!("WRITE {j}: wrong data"));
            }
            got += 1;
            let r = recv(wc.wr_id + RECVS, &l.rbuf, at, SEND_LEN as u32);
            l.qp.post_recv(&[r]).map_err(|e| e.1.to_string())?;
        }
        if i == progress_at {
            out(format!("progress {tag} {i}"));
        }
    }
    Ok(())
}

/// The member's layer on its device's CM port: every agent event to
/// the member's command loop.
struct Events(parking_lot::Mutex<std::sync::mpsc::Sender<CmEvent>>);

impl CmLayer for Events {
    fn route(&self, _port: &CmPort, events: Vec<CmEvent>) {
        for e in events {
            let _ = self.0.lock().send(e);
        }
    }
}

/// The member's CM events, taken in the order the commands want them.
struct CmEvents {
    rx: std::sync::mpsc::Receiver<CmEvent>,
    pending: Vec<CmEvent>,
}

impl CmEvents {
    /// The first event `want` takes (within `T`).
    fn take<R>(&mut self, want: impl Fn(&CmEvent) -> Option<R>) -> Option<R> {
        let end = Instant::now() + T;
        loop {
            if let Some(i) = self.pending.iter().position(|e| want(e).is_some()) {
                return want(&self.pending.remove(i));
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(e) => self.pending.push(e),
                Err(_) => return None,
            }
        }
    }
}

/// PSNs the CM-connected QPs send from: the active side's, the passive
/// side's.
const CM_PSNS: (u32, u32) = (0x10, 0x20);

/// Receives posted on a connected link, before either side's traffic.
fn post_recvs(l: &Link) {
    for r in 0..RECVS {
        let at = r as usize * SEND_LEN;
        l.qp.post_recv(&[recv(r, &l.rbuf, at, SEND_LEN as u32)])
            .unwrap();
    }
}

/// A member: opens the device at `ip`, then runs the parent's commands.
#[allow(clippy::field_reassign_with_default)] // a REQ has 27 fields
fn member(ip: &str) {
    let ctx = Device::new("share", ip.parse().unwrap()).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut links: HashMap<String, Arc<Link>> = HashMap::new();
    let (tx, rx) = std::sync::mpsc::channel();
    ctx.cm_port()
        .layer(|| Events(parking_lot::Mutex::new(tx)))
        .expect("the member's CM layer");
    let cm = ctx.cm_port().agent();
    let mut events = CmEvents {
        rx,
        pending: Vec::new(),
    };
    let mut conns: HashMap<String, u32> = HashMap::new();
    let peer_ip: std::net::IpAddr = ip.parse().unwrap();
    out("ready".into());
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["qp", tag, n] => {
                let n: usize = n.parse().unwrap();
                let cq = ctx.create_cq(256).unwrap();
                let qp = pd
                    .qp_builder(&cq)
                    .qp_type(QpType::Rc)
                    .max_send_wr(64)
                    .max_recv_wr(64)
                    .max_send_sge(1)
                    .max_recv_sge(1)
                    .build()
                    .unwrap();
                let l = Link {
                    qp,
                    cq,
                    src: pd.alloc_mr(CHUNK, ALL).unwrap(),
                    rbuf: pd.alloc_mr(RECVS as usize * SEND_LEN, ALL).unwrap(),
                    target: pd.alloc_mr(n.max(1) * CHUNK, ALL).unwrap(),
                    peer: parking_lot::Mutex::new((0, 0)),
                };
                let (q, k, a) = (l.qp.qp_num(), l.target.rkey(), l.target.addr());
                links.insert(tag.to_string(), Arc::new(l));
                out(format!("qp {tag} {q} {k} {a}"));
            }
            ["connect", tag, qpn, rkey, addr, first] => {
                let l = &links[*tag];
                *l.peer.lock() = (addr.parse().unwrap(), rkey.parse().unwrap());
                let (mine, theirs) = if *first == "1" { (10, 20) } else { (20, 10) };
                let p = loopback::RcParams::default();
                let peer_ip = ip.parse().unwrap();
                loopback::connect_rc(&l.qp, peer_ip, qpn.parse().unwrap(), mine, theirs, p)
                    .unwrap();
                // Before the parent starts either side's traffic.
                for r in 0..RECVS {
                    let at = r as usize * SEND_LEN;
                    l.qp.post_recv(&[recv(r, &l.rbuf, at, SEND_LEN as u32)])
                        .unwrap();
                }
                out(format!("connected {tag}"));
            }
            ["traffic", tag, n, progress] => {
                let l = links[*tag].clone();
                let (tag, n, at) = (
                    tag.to_string(),
                    n.parse().unwrap(),
                    progress.parse().unwrap(),
                );
                std::thread::spawn(move || match traffic(&tag, &l, n, at) {
                    Ok(()) => out(format!("done {tag} ok")),
                    Err(e) => out(format!("done {tag} fail {e}")),
                });
            }
            ["peer", tag, rkey, addr] => {
                *links[*tag].peer.lock() = (addr.parse().unwrap(), rkey.parse().unwrap());
                out(format!("peer {tag}"));
            }
            ["listen", sid] => match cm.listen(sid.parse().unwrap()) {
                Ok(()) => out(format!("listen {sid} ok")),
                Err(e) => out(format!("listen {sid} fail {e}")),
            },
            // Passive: the next REQ, accepted for link `tag`.
            ["accept", tag] => {
                let l = &links[*tag];
                let Some((conn, src, qpn, psn)) = events.take(|e| match e {
                    CmEvent::ReqReceived { conn, src, req, .. } => {
                        Some((*conn, *src, req.local_qpn, req.starting_psn))
                    }
                    _ => None,
                }) else {
                    out(format!("accepted {tag} fail no REQ"));
                    continue;
                };
                let p = loopback::RcParams::default();
                loopback::connect_rc(&l.qp, src, qpn, CM_PSNS.1, psn, p).unwrap();
                post_recvs(l);
                let mut rep = RepRepr::default();
                rep.local_qpn = l.qp.qp_num();
                rep.starting_psn = CM_PSNS.1;
                rep.responder_resources = 1;
                rep.initiator_depth = 1;
                rep.rnr_retry_count = 7;
                cm.accept(conn, &rep).unwrap();
                let est = events.take(|e| match e {
                    CmEvent::Established { conn: c } if *c == conn => Some(()),
                    _ => None,
                });
                conns.insert(tag.to_string(), conn);
                match est {
                    Some(()) => out(format!("accepted {tag} ok")),
                    None => out(format!("accepted {tag} fail no RTU")),
                }
            }
            // Active: a REQ for service `sid` at the device's address.
            ["cmconnect", tag, sid] => {
                let l = &links[*tag];
                let mut req = ReqRepr::default();
                req.service_id = sid.parse().unwrap();
                req.local_qpn = l.qp.qp_num();
                req.starting_psn = CM_PSNS.0;
                req.responder_resources = 1;
                req.initiator_depth = 1;
                req.path_mtu = 3;
                req.retry_count = 7;
                req.rnr_retry_count = 7;
                req.pkey = 0xffff;
                let conn = match cm.connect(peer_ip, &req) {
                    Ok(c) => c,
                    Err(e) => {
                        out(format!("cmconnected {tag} fail {e}"));
                        continue;
                    }
                };
                let rep = events.take(|e| match e {
                    CmEvent::RepReceived { conn: c, rep } if *c == conn => {
                        Some(Ok((rep.local_qpn, rep.starting_psn)))
                    }
                    CmEvent::Rejected { conn: c, rej } if *c == conn => {
                        Some(Err(format!("REJ {}", rej.reason)))
                    }
                    CmEvent::Unreachable { conn: c } if *c == conn => {
                        Some(Err("unreachable".into()))
                    }
                    _ => None,
                });
                let (qpn, psn) = match rep {
                    Some(Ok(r)) => r,
                    Some(Err(e)) => {
                        out(format!("cmconnected {tag} fail {e}"));
                        continue;
                    }
                    None => {
                        out(format!("cmconnected {tag} fail no REP"));
                        continue;
                    }
                };
                let p = loopback::RcParams::default();
                loopback::connect_rc(&l.qp, peer_ip, qpn, CM_PSNS.0, psn, p).unwrap();
                post_recvs(l);
                cm.establish(conn, &[]).unwrap();
                conns.insert(tag.to_string(), conn);
                out(format!("cmconnected {tag} ok"));
            }
            // Sends the DREQ of link `tag`'s connection and waits for
            // it to end (the DREP, or the peer's DREQ).
            ["disconnect", tag] => {
                let conn = conns[*tag];
                cm.disconnect(conn).unwrap();
                let t0 = Instant::now();
                let done = events.take(|e| match e {
                    CmEvent::Disconnected { conn: c, .. } if *c == conn => Some(()),
                    _ => None,
                });
                let ms = t0.elapsed().as_millis();
                match done {
                    Some(()) => out(format!("disconnected {tag} ok {ms}")),
                    None => out(format!("disconnected {tag} fail")),
                }
            }
            // Waits for the peer's DREQ on link `tag`'s connection.
            ["awaitdreq", tag] => {
                let conn = conns[*tag];
                let done = events.take(|e| match e {
                    CmEvent::Disconnected { conn: c, .. } if *c == conn => Some(()),
                    _ => None,
                });
                match done {
                    Some(()) => out(format!("dreq {tag} ok")),
                    None => out(format!("dreq {tag} fail")),
                }
            }
            // Passive SIDR: answers the next SIDR_REQ with `qpn`.
            ["sidrreply", qpn] => {
                let conn = events.take(|e| match e {
                    CmEvent::SidrReqReceived { conn, .. } => Some(*conn),
                    _ => None,
                });
                let Some(conn) = conn else {
                    out("sidrreplied fail".into());
                    continue;
                };
                cm.sidr_reply(
                    conn,
                    uroce_provider::device::cm::SIDR_OK,
                    qpn.parse().unwrap(),
                    0x1111,
                    &[],
                )
                .unwrap();
                out("sidrreplied ok".into());
            }
            ["sidr", sid] => {
                let conn = cm
                    .sidr_request(peer_ip, sid.parse().unwrap(), 0, &[])
                    .unwrap();
                let rep = events.take(|e| match e {
                    CmEvent::SidrRepReceived { conn: c, rep } if *c == conn => {
                        Some(format!("{} {} {}", rep.status, rep.qpn, rep.qkey))
                    }
                    CmEvent::Unreachable { conn: c } if *c == conn => Some("unreachable".into()),
                    _ => None,
                });
                out(format!("sidr {}", rep.unwrap_or_else(|| "none".into())));
            }
            ["stat"] => out(format!("stat {}", ctx.counters().rx_foreign)),
            ["cmstat"] => {
                let c = ctx.counters();
                out(format!("cmstat {} {}", c.cm_forwarded, c.cm_orphans));
            }
            ["close"] => {
                // Every object, then the device: its engine leaves the
                // group as a program that closes its device does.
                links.clear();
                drop(pd);
                drop(ctx);
                out("closed".into());
                for line in std::io::stdin().lock().lines() {
                    if line.is_ok_and(|l| l == "exit") {
                        break;
                    }
                }
                std::process::exit(0);
            }
            ["exit"] => std::process::exit(0),
            _ => panic!("member: unknown command {line:?}"),
        }
    }
    std::process::exit(0);
}

/// The child half of the tests below; a no-op unless run as one.
#[test]
fn member_child() {
    if let Ok(ip) = std::env::var(CHILD_ENV) {
        member(&ip);
    }
}

/// A member process, as the parent sees it.
struct Member {
    child: Child,
    stdin: ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    pending: Vec<String>,
    name: &'static str,
}

impl Member {
    fn spawn(name: &'static str, ip: &str) -> Member {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "share::member_child", "--nocapture"])
            .env(CHILD_ENV, ip)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if let Some(l) = l.strip_prefix("@@ ") {
                    let _ = tx.send(l.to_owned());
                }
            }
        });
        let mut m = Member {
            child,
            stdin,
            lines,
            pending: Vec::new(),
            name,
        };
        m.expect("ready");
        m
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next line starting with `prefix` (others wait their turn).
    fn expect(&mut self, prefix: &str) -> Vec<String> {
        let end = Instant::now() + LINE_WAIT;
        loop {
            if let Some(i) = self.pending.iter().position(|l| l.starts_with(prefix)) {
                let l = self.pending.remove(i);
                return l.split_whitespace().map(str::to_owned).collect();
            }
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => self.pending.push(l),
                Err(_) => panic!("{}: no {prefix:?} line; had {:?}", self.name, self.pending),
            }
        }
    }

    fn foreign(&mut self) -> u64 {
        self.send("stat");
        self.expect("stat")[1].parse().unwrap()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A QP on each of `a` and `b` for link `tag` (`n` iterations of
/// traffic), connected to each other; returns their QPNs.
fn link(a: &mut Member, b: &mut Member, tag: &str, n: u64) -> (u32, u32) {
    let mut ends = Vec::new();
    for m in [&mut *a, &mut *b] {
        m.send(&format!("qp {tag} {n}"));
        ends.push(m.expect(&format!("qp {tag} ")));
    }
    let (ea, eb) = (&ends[0], &ends[1]);
    a.send(&format!("connect {tag} {} {} {} 1", eb[2], eb[3], eb[4]));
    b.send(&format!("connect {tag} {} {} {} 0", ea[2], ea[3], ea[4]));
    a.expect(&format!("connected {tag}"));
    b.expect(&format!("connected {tag}"));
    (ea[2].parse().unwrap(), eb[2].parse().unwrap())
}

fn start(m: &mut Member, tag: &str, n: u64, progress_at: u64) {
    m.send(&format!("traffic {tag} {n} {progress_at}"));
}

fn done(m: &mut Member, tag: &str) {
    let l = m.expect(&format!("done {tag} "));
    assert_eq!(l[2], "ok", "{}: link {tag}: {l:?}", m.name);
}

/// A QP on each of `a` and `b` for link `tag`, connected through the
/// device's CM: `a` listens on `sid` (unless `listen` is false: it
/// listens already) and accepts, `b` connects.
fn cm_link(a: &mut Member, b: &mut Member, tag: &str, sid: u64, n: u64, listen: bool) {
    let mut ends = Vec::new();
    for m in [&mut *a, &mut *b] {
        m.send(&format!("qp {tag} {n}"));
        ends.push(m.expect(&format!("qp {tag} ")));
    }
    a.send(&format!("peer {tag} {} {}", ends[1][3], ends[1][4]));
    b.send(&format!("peer {tag} {} {}", ends[0][3], ends[0][4]));
    a.expect(&format!("peer {tag}"));
    b.expect(&format!("peer {tag}"));
    if listen {
        a.send(&format!("listen {sid}"));
        let l = a.expect(&format!("listen {sid} "));
        assert_eq!(l[2], "ok", "{}: {l:?}", a.name);
    }
    a.send(&format!("accept {tag}"));
    b.send(&format!("cmconnect {tag} {sid}"));
    let l = b.expect(&format!("cmconnected {tag} "));
    assert_eq!(l[2], "ok", "{}: {l:?}", b.name);
    let l = a.expect(&format!("accepted {tag} "));
    assert_eq!(l[2], "ok", "{}: {l:?}", a.name);
}

/// Traffic both ways on link `tag` between `a` and `b`, data checked.
fn both_ways(a: &mut Member, b: &mut Member, tag: &str, n: u64) {
    start(a, tag, n, u64::MAX);
    start(b, tag, n, u64::MAX);
    done(a, tag);
    done(b, tag);
}

/// `a` disconnects link `tag` and `b` sees the peer's DREQ.
fn cm_unlink(a: &mut Member, b: &mut Member, tag: &str) {
    a.send(&format!("disconnect {tag}"));
    let l = a.expect(&format!("disconnected {tag} "));
    assert_eq!(l[2], "ok", "{}: {l:?}", a.name);
    b.send(&format!("awaitdreq {tag}"));
    let l = b.expect(&format!("dreq {tag} "));
    assert_eq!(l[2], "ok", "{}: {l:?}", b.name);
}

impl Member {
    /// (forwarded, orphans): the member's CM counters.
    fn cm_stat(&mut self) -> (u64, u64) {
        self.send("cmstat");
        let l = self.expect("cmstat");
        (l[1].parse().unwrap(), l[2].parse().unwrap())
    }

    fn listen(&mut self, sid: u64) -> String {
        self.send(&format!("listen {sid}"));
        self.expect(&format!("listen {sid} "))[2].clone()
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// Two processes on one device connect through its CM, each way: one
/// listens, the other's REQ reaches it (whichever holds QP1), the REP
/// and RTU find their connection's process; data both ways; the active
/// side disconnects, and the DREQ and DREP find theirs.
#[test]
fn the_cm_connects_two_processes_on_one_device() {
    let ip = "127.134.5.1";
    let (mut a, mut b) = (Member::spawn("a", ip), Member::spawn("b", ip));
    cm_link(&mut a, &mut b, "ab", 0x1_0001, 200, true);
    both_ways(&mut a, &mut b, "ab", 200);
    cm_unlink(&mut b, &mut a, "ab");
    cm_link(&mut b, &mut a, "ba", 0x1_0002, 200, true);
    both_ways(&mut b, &mut a, "ba", 200);
    cm_unlink(&mut a, &mut b, "ba");
    // Whichever holds QP1 passed the other's MADs on.
    let (fa, fb) = (a.cm_stat().0, b.cm_stat().0);
    assert!(fa + fb > 0, "no MAD was forwarded");
}

/// SIDR between two processes on one device: the SIDR_REQ reaches the
/// listener's process, the SIDR_REP the requester's.
#[test]
fn sidr_crosses_processes_on_one_device() {
    let ip = "127.134.6.1";
    let (mut a, mut b) = (Member::spawn("a", ip), Member::spawn("b", ip));
    sidr_once(&mut a, &mut b, 0x2_0001);
    sidr_once(&mut b, &mut a, 0x2_0002);
}

/// `srv` listens on `sid` and answers `cli`'s SIDR_REQ with QP 4660.
fn sidr_once(srv: &mut Member, cli: &mut Member, sid: u64) {
    assert_eq!(srv.listen(sid), "ok");
    srv.send("sidrreply 4660");
    cli.send(&format!("sidr {sid}"));
    let l = cli.expect("sidr ");
    assert_eq!(l[1..], ["0", "4660", "4369"], "{}: {l:?}", cli.name);
    srv.expect("sidrreplied ok");
}

/// One listener a service ID on the device, as the kernel's CM: a second
/// process's listen fails until the first process is gone (here killed,
/// so only the kernel's release of its lock frees the service).
#[test]
fn a_second_listener_is_refused_until_the_first_exits() {
    let ip = "127.134.7.1";
    let (mut a, mut b) = (Member::spawn("a", ip), Member::spawn("b", ip));
    let sid = 0x3_0001;
    assert_eq!(a.listen(sid), "ok");
    assert_eq!(b.listen(sid), "fail");
    a.kill();
    assert_eq!(b.listen(sid), "ok");
    let mut c = Member::spawn("c", ip);
    cm_link(&mut b, &mut c, "bc", sid, 50, false);
    both_ways(&mut b, &mut c, "bc", 50);
}

/// A DREQ for a connection whose process was killed is answered (the
/// kernel's CM answers it from time-wait): here the killed process held
/// QP1 too (the lowest slot), so the survivors take that role over.
#[test]
fn a_dreq_for_a_killed_process_is_answered() {
    let ip = "127.134.8.1";
    let mut x = Member::spawn("x", ip);
    let mut y = Member::spawn("y", ip);
    let mut z = Member::spawn("z", ip);
    cm_link(&mut x, &mut z, "xz", 0x4_0001, 50, true);
    both_ways(&mut x, &mut z, "xz", 50);
    x.kill();
    // The program is rebuilt within the helper's look (100 ms).
    std::thread::sleep(Duration::from_millis(300));
    z.send("disconnect xz");
    let l = z.expect("disconnected xz ");
    assert_eq!(l[2], "ok", "{l:?}");
    // Answered, not given up on after the retries (4.3 s each).
    let ms: u64 = l[3].parse().unwrap();
    assert!(ms < 4000, "the DREQ waited {ms} ms");
    let (_, oy) = y.cm_stat();
    let (_, oz) = z.cm_stat();
    assert!(oy + oz > 0, "no orphan counted");
}

/// Datagrams to QP `qpn` at `ip`, each from a UDP source port of its own
/// (the kernel's fallback, a flow hash, would spread them over the
/// group): RC SEND ONLY headers with a wrong ICRC, which the owner's
/// endpoint drops, and another member would count as foreign.
fn spray(ip: &str, qpn: u32, n: usize) {
    let mut p = [0u8; 20];
    p[0] = 0x04;
    p[4..8].copy_from_slice(&qpn.to_be_bytes());
    for _ in 0..n {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(&p, (ip, 4791)).unwrap();
    }
}

/// The slot a QPN carries (its top 6 bits).
fn slot(qpn: u32) -> u32 {
    qpn >> 18
}

#[test]
fn two_processes_share_one_device() {
    let ip = "127.134.1.1";
    let (mut a, mut b) = (Member::spawn("a", ip), Member::spawn("b", ip));
    let (qa, qb) = link(&mut a, &mut b, "ab", 300);
    assert_ne!(slot(qa), slot(qb), "QPNs {qa:#x} {qb:#x} share a slot");
    start(&mut a, "ab", 300, u64::MAX);
    start(&mut b, "ab", 300, u64::MAX);
    done(&mut a, "ab");
    done(&mut b, "ab");
    // Every datagram reached its owner: none was steered to the other.
    assert_eq!((a.foreign(), b.foreign()), (0, 0));
}

#[test]
fn three_processes_share_one_device() {
    let ip = "127.134.2.1";
    let mut m: Vec<Member> = ["a", "b", "c"].map(|n| Member::spawn(n, ip)).into();
    let pairs = [(0, 1, "ab"), (1, 2, "bc"), (2, 0, "ca")];
    let mut qpns = [0u32; 3];
    for (x, y, tag) in pairs {
        let [p, q] = m.get_disjoint_mut([x, y]).unwrap();
        (qpns[x], qpns[y]) = link(p, q, tag, 200);
    }
    for q in qpns {
        spray(ip, q, 64);
    }
    for (x, y, tag) in pairs {
        start(&mut m[x], tag, 200, u64::MAX);
        start(&mut m[y], tag, 200, u64::MAX);
    }
    for (x, y, tag) in pairs {
        done(&mut m[x], tag);
        done(&mut m[y], tag);
    }
    for p in &mut m {
        assert_eq!(p.foreign(), 0, "{}", p.name);
    }
    // The first member closes its device (its socket at index 0: the
    // kernel moves c's into its place); b and c go on at once, and not
    // one datagram reaches the wrong one of them.
    m[0].send("close");
    m[0].expect("closed");
    let [b, c] = m.get_disjoint_mut([1, 2]).unwrap();
    link(b, c, "bc2", 200);
    start(b, "bc2", 200, u64::MAX);
    start(c, "bc2", 200, u64::MAX);
    done(b, "bc2");
    done(c, "bc2");
    assert_eq!((b.foreign(), c.foreign()), (0, 0));
}

/// The first member to join (its socket at index 0, so the kernel moves
/// the last member's socket into its place) is killed mid-transfer: the
/// other two finish their transfer, data checked, and connect anew; a
/// new process joins (in the dead one's slot) and connects too.
#[test]
fn a_killed_member_leaves_the_others_working() {
    let ip = "127.134.3.1";
    let mut x = Member::spawn("x", ip);
    let mut y = Member::spawn("y", ip);
    let mut z = Member::spawn("z", ip);
    let n = 6000;
    link(&mut y, &mut z, "yz", n);
    link(&mut x, &mut y, "xy", 100_000);
    link(&mut x, &mut z, "xz", 100_000);
    start(&mut x, "xy", 100_000, u64::MAX);
    start(&mut y, "xy", 100_000, u64::MAX);
    start(&mut x, "xz", 100_000, u64::MAX);
    start(&mut z, "xz", 100_000, u64::MAX);
    start(&mut y, "yz", n, n / 10);
    start(&mut z, "yz", n, u64::MAX);
    y.expect("progress yz");
    // SIGKILL: no destructor, no goodbye.
    x.child.kill().unwrap();
    x.child.wait().unwrap();
    done(&mut y, "yz");
    done(&mut z, "yz");
    let (qy, qz) = link(&mut y, &mut z, "yz2", 200);
    start(&mut y, "yz2", 200, u64::MAX);
    start(&mut z, "yz2", 200, u64::MAX);
    done(&mut y, "yz2");
    done(&mut z, "yz2");
    let mut w = Member::spawn("w", ip);
    let (qw, _) = link(&mut w, &mut y, "wy", 200);
    assert!(
        ![slot(qy), slot(qz)].contains(&slot(qw)),
        "w took a live slot"
    );
    start(&mut w, "wy", 200, u64::MAX);
    start(&mut y, "wy", 200, u64::MAX);
    done(&mut w, "wy");
    done(&mut y, "wy");
    // New connections through the CM, whose QP1 the dead member held.
    cm_link(&mut y, &mut z, "yz3", 0x5_0001, 200, true);
    both_ways(&mut y, &mut z, "yz3", 200);
    cm_link(&mut w, &mut z, "wz", 0x5_0002, 200, true);
    both_ways(&mut w, &mut z, "wz", 200);
    cm_unlink(&mut z, &mut w, "wz");
    // What reached the wrong member while the group changed was dropped
    // there (and counted), never handed to a QP: the data checks passed.
    eprintln!(
        "foreign datagrams dropped: y {}, z {}, w {}",
        y.foreign(),
        z.foreign(),
        w.foreign()
    );
    drop(x);
}

/// The child half of [`another_user_gets_a_clear_error`].
#[test]
fn other_user_child() {
    if let Ok(ip) = std::env::var(OTHER_USER_ENV) {
        let e = Device::new("other", ip.parse().unwrap())
            .open()
            .map(|_| ())
            .unwrap_err();
        out(format!("err {e}"));
        std::process::exit(0);
    }
}

/// A device another user holds fails to open with an error that says so
/// (the kernel's reuseport group is per user), not EADDRINUSE. Needs
/// root, to run the child as `nobody`.
#[test]
fn another_user_gets_a_clear_error() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("not root: cannot run a child as another user; skipped");
        return;
    }
    let ip = "127.134.4.1";
    let _held = Device::new("held", ip.parse().unwrap()).open().unwrap();
    use std::os::unix::process::CommandExt;
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "share::other_user_child", "--nocapture"])
        .env(OTHER_USER_ENV, ip)
        .env_remove("XDG_RUNTIME_DIR")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("@@ err "))
        .unwrap_or_else(|| panic!("child said: {text} {}", String::from_utf8_lossy(&o.stderr)));
    assert!(line.contains("held by user 0"), "{line}");
    assert!(
        line.contains("shared only by the processes of one user"),
        "{line}"
    );
}
