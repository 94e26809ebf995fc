//! `uroce stat` against running `uroce rc-pingpong` processes: their QPs,
//! MRs and CQs as they set them up, the connection while it runs, the
//! socket gone when they exit (or removed by `uroce stat` when they were
//! killed), and no socket at all with `UROCE_STAT=0`.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use uroce_provider::stat::{self, ProcessState};

use crate::common::{finish, uroce, wait_listening};

/// `uroce rc-pingpong` on its own device `ip`, as server (no `server`)
/// or client.
fn pingpong(ip: &str, port: u16, server: Option<&str>, env: &[(&str, &str)]) -> Child {
    uroce()
        .envs(env.iter().copied())
        .env("UROCE_DEVICES", format!("pp={ip}"))
        .args(["rc-pingpong", "-p", &port.to_string(), "-n", "20000"])
        .args(server)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `uroce stat <args>`: its stdout, after checking it succeeded.
fn stat_cmd(args: &[&str]) -> String {
    let out = uroce().arg("stat").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "uroce stat {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `uroce stat PID --json`, parsed: the one process.
fn stat_json(pid: u32) -> ProcessState {
    let json = stat_cmd(&[&pid.to_string(), "--json"]);
    let mut v: Vec<ProcessState> = serde_json::from_str(&json).unwrap();
    assert_eq!(v.len(), 1, "{json}");
    v.remove(0)
}

/// Waits for `child` (killing it after a minute); true if it succeeded.
fn succeeded(child: Child, what: &str) -> bool {
    let out = finish(child, what);
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    out.status.success()
}

#[test]
fn stat_shows_a_pingpong_set_up_connected_and_gone() {
    let port = 21310;
    let server = pingpong("127.119.2.1", port, None, &[]);
    let spid = server.id();
    wait_listening(port);

    // Set up: the QP in INIT with rc_pingpong's 500 receives posted, its
    // buffer registered for local writes, the CQ of rx_depth + 1.
    let s = stat_json(spid);
    assert_eq!((s.pid, s.comm.as_str()), (spid, "uroce"));
    let d = &s.devices[0];
    assert_eq!((d.name.as_str(), d.addr.as_str()), ("pp", "127.119.2.1"));
    let qp = &d.qps[0];
    assert_eq!((qp.qp_type.as_str(), qp.state.as_str()), ("RC", "INIT"));
    assert_eq!((qp.rq_wrs, qp.max_recv_wr, qp.dest_qpn), (500, 500, 0));
    assert_eq!(d.mrs.len(), 1);
    assert_eq!(
        (d.mrs[0].length, &d.mrs[0].access[..]),
        (4096, &["LOCAL_WRITE".to_owned()][..])
    );
    assert_eq!((d.cqs.len(), d.cqs[0].cqe), (1, 501));
    assert_eq!((d.pds.len(), d.pds[0].mrs, d.pds[0].qps), (1, 1, 1));
    let text = stat_cmd(&[&spid.to_string()]);
    assert!(text.contains(&format!("pid {spid} comm uroce")), "{text}");
    assert!(text.contains("state INIT"), "{text}");
    assert!(text.contains("rq-wrs 500/500"), "{text}");
    assert!(
        text.contains(&format!("lkey {:#010x}", d.mrs[0].lkey)),
        "{text}"
    );

    // Connected: each QP names the other and both are RTS.
    let client = pingpong("127.119.2.2", port, Some("127.119.2.1"), &[]);
    let cpid = client.id();
    let end = Instant::now() + Duration::from_secs(20);
    let (sq, cq) = loop {
        assert!(Instant::now() < end, "never saw both QPs in RTS");
        let (Ok(s), Ok(c)) = (stat::query_pid(spid), stat::query_pid(cpid)) else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        // The client's socket can answer before its device or QP exists.
        let first = |p: &ProcessState| p.devices.first().and_then(|d| d.qps.first()).cloned();
        if let (Some(sq), Some(cq)) = (first(&s), first(&c)) {
            if sq.state == "RTS" && cq.state == "RTS" {
                break (sq, cq);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!((sq.dest_qpn, cq.dest_qpn), (cq.qpn, sq.qpn));
    assert_eq!(sq.dest_addr.as_deref(), Some("127.119.2.2"));
    // Both listed by `uroce stat` without a PID.
    let all: Vec<ProcessState> = serde_json::from_str(&stat_cmd(&["--json"])).unwrap();
    for pid in [spid, cpid] {
        assert!(all.iter().any(|p| p.pid == pid), "{pid} not listed");
    }

    assert!(succeeded(client, "client"), "client failed");
    assert!(succeeded(server, "server"), "server failed");
    // A process that exits removes its socket.
    assert_eq!(stat::socket_of(spid), None);
    assert_eq!(stat::socket_of(cpid), None);
}

#[test]
fn a_killed_process_socket_is_removed_and_stat_0_makes_none() {
    let port = 21311;
    let mut server = pingpong("127.119.3.1", port, None, &[]);
    let pid = server.id();
    wait_listening(port);
    let path = stat::socket_of(pid).expect("a socket");
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(path.exists(), "SIGKILL leaves the socket behind");
    let all: Vec<ProcessState> = serde_json::from_str(&stat_cmd(&["--json"])).unwrap();
    assert!(all.iter().all(|p| p.pid != pid));
    assert!(!path.exists(), "uroce stat removes a dead process's socket");
    // Asking for it by PID fails.
    let out = uroce().args(["stat", &pid.to_string()]).output().unwrap();
    assert!(!out.status.success());

    let port = 21312;
    let mut quiet = pingpong("127.119.3.2", port, None, &[("UROCE_STAT", "0")]);
    let pid = quiet.id();
    wait_listening(port);
    assert_eq!(stat::socket_of(pid), None);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    for t in threads.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap();
        assert_ne!(comm.trim(), "uroce-stat", "no server thread");
    }
    quiet.kill().unwrap();
    quiet.wait().unwrap();
}

#[test]
fn watch_prints_again_every_second() {
    use std::io::Read;
    let mut w = uroce()
        .args(["stat", "--watch"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = w.stdout.take().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    w.kill().unwrap();
    w.wait().unwrap();
    let mut text = String::new();
    out.read_to_string(&mut text).unwrap();
    // A clear-screen and a header per round: the first at once, then one
    // a second.
    let rounds = text.matches("\x1b[H\x1b[2J").count();
    assert!((2..=4).contains(&rounds), "{rounds} rounds: {text:?}");
    assert_eq!(text.matches("every 1s: uroce stat").count(), rounds);
}
