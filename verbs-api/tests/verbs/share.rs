//! Several processes on one device (`provider::engine::share`): each
//! member is this binary run again as a child (`--exact
//! share::member_child`), driven by lines on its stdin and answering on
//! its stdout (lines that start with `@@`). Members open the same
//! address; their RC QPs exchange SENDs and RDMA WRITEs, data checked.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce_verbs::*;

use crate::common::{recv, ALL, T};

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

/// A member: opens the device at `ip`, then runs the parent's commands.
fn member(ip: &str) {
    let ctx = Device::new("share", ip.parse().unwrap()).open().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let mut links: HashMap<String, Arc<Link>> = HashMap::new();
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
            ["stat"] => out(format!("stat {}", ctx.counters().rx_foreign)),
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
