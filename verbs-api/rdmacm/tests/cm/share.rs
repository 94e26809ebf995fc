//! rdma_cm's two sides in two processes on one device (one
//! `UROCE_DEVICES` entry for both, as with a kernel device): the REQ
//! reaches the listener's process, the replies the connection's, data
//! goes both ways and either side disconnects; a port is the host's, as
//! the kernel's port space is: a second process's bind of it gets
//! EADDRINUSE until the first is gone, however it goes. Each side is this
//! binary run again as a child (`--exact share::side_child`), reporting
//! on lines that start with `@@`.

use crate::loopback::end;
use crate::{addr, expect};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;
use uroce_rdmacm::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};
use uroce_verbs::{QpType, WcStatus};

const CHILD_ENV: &str = "UROCE_TEST_CM_SHARE_CHILD";

fn say(line: &str) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "@@ {line}");
    let _ = o.flush();
}

/// The listening side: binds `ip:port`, takes one connection, answers
/// "ping" with "pong", then waits for the client's DREQ or (`close`)
/// sends its own. `hold`: binds and listens, then waits to be killed.
fn server(ip: &str, port: u16, mode: &str) {
    let ch = EventChannel::new().unwrap();
    let l = CmId::new(&ch, PortSpace::Tcp).unwrap();
    if let Err(e) = l.bind_addr(addr(ip, port)).and_then(|()| l.listen(4)) {
        say(&format!("listen err {}", e.errno()));
        return;
    }
    say("listening");
    if mode == "hold" {
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let req = expect(&ch, CmEventType::ConnectRequest);
    let s = end(&req.id, QpType::Rc);
    s.post_recv(0);
    req.id.accept(&ConnParam::default()).unwrap();
    expect(&ch, CmEventType::Established);
    let wc = s.wait();
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 4));
    let mut got = [0u8; 4];
    s.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"ping");
    s.mr.write(0, b"pong").unwrap();
    s.send(4, None);
    assert_eq!(s.wait().status, WcStatus::Success);
    if mode == "close" {
        req.id.disconnect().unwrap();
    }
    expect(&ch, CmEventType::Disconnected);
    say("ok");
}

/// The connecting side: to `ip:port` from the same device, "ping" and
/// the answer; disconnects first unless the server does (`close`).
fn client(ip: &str, port: u16, mode: &str) {
    let ch = EventChannel::new().unwrap();
    let id = CmId::new(&ch, PortSpace::Tcp).unwrap();
    id.resolve_addr(None, addr(ip, port)).unwrap();
    expect(&ch, CmEventType::AddrResolved);
    id.resolve_route().unwrap();
    expect(&ch, CmEventType::RouteResolved);
    let c = end(&id, QpType::Rc);
    c.post_recv(2048);
    id.connect(&ConnParam::default()).unwrap();
    expect(&ch, CmEventType::Established);
    c.mr.write(0, b"ping").unwrap();
    c.send(4, None);
    let mut statuses = [c.wait(), c.wait()].map(|w| (w.status, w.byte_len));
    statuses.sort_by_key(|s| s.1);
    assert!(
        statuses.iter().all(|s| s.0 == WcStatus::Success),
        "{statuses:?}"
    );
    let mut got = [0u8; 4];
    c.mr.read(2048, &mut got).unwrap();
    assert_eq!(&got, b"pong");
    if mode != "close" {
        id.disconnect().unwrap();
    }
    expect(&ch, CmEventType::Disconnected);
    say("ok");
}

/// The child half of the tests below; a no-op unless run as one.
#[test]
fn side_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let w: Vec<&str> = spec.split(' ').collect();
    let port = w[2].parse().unwrap();
    match w[0] {
        "server" => server(w[1], port, w[3]),
        "client" => client(w[1], port, w[3]),
        other => panic!("no side {other}"),
    }
    std::process::exit(0);
}

/// A side in a process of its own on the one device at `ip`.
struct Side {
    child: Child,
    lines: Receiver<String>,
}

impl Side {
    fn spawn(role: &str, ip: &str, port: u16, mode: &str) -> Side {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "share::side_child", "--nocapture"])
            .env(CHILD_ENV, format!("{role} {ip} {port} {mode}"))
            .env("UROCE_DEVICES", format!("shared={ip}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if let Some(l) = l.strip_prefix("@@ ") {
                    let _ = tx.send(l.to_owned());
                }
            }
        });
        Side { child, lines }
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| "(no line)".into())
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn rdma_cm_connects_two_processes_on_one_device() {
    crate::init();
    let ip = "127.134.10.1";
    for (port, mode) in [(7600, "client closes"), (7601, "close")] {
        let server = Side::spawn("server", ip, port, mode);
        assert_eq!(server.line(), "listening");
        let client = Side::spawn("client", ip, port, mode);
        assert_eq!(client.line(), "ok", "client ({mode})");
        assert_eq!(server.line(), "ok", "server ({mode})");
    }
}

#[test]
fn a_port_another_process_holds_is_addrinuse_until_it_dies() {
    crate::init();
    let ip = "127.134.10.2";
    let holder = Side::spawn("server", ip, 7610, "hold");
    assert_eq!(holder.line(), "listening");
    let second = Side::spawn("server", ip, 7610, "hold");
    assert_eq!(second.line(), "listen err 98");
    drop(holder); // SIGKILL
    let third = Side::spawn("server", ip, 7610, "hold");
    assert_eq!(third.line(), "listening");
}
