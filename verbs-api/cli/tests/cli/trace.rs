//! `UROCE_TRACE` in two processes: `uroce rc-pingpong` as server and
//! client each write their own trace (`%p` in the name), closed at exit,
//! and `uroce trace-merge` makes one trace of both whose timestamps
//! compare across the processes.

use serde_json::Value;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{finish, uroce, wait_listening};

/// Waits for `child` (killing it after a minute), which must succeed.
fn finish_ok(child: Child, what: &str) -> Output {
    let out = finish(child, what);
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn f(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap()
}

#[test]
fn both_ends_of_a_pingpong_trace_and_merge() {
    let dir = std::env::temp_dir().join(format!("uroce-trace-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("pp-%p.json");
    let (server_ip, client_ip, port) = ("127.120.1.2", "127.120.1.1", 21500u16);
    let iters = "50";
    let run = |dev: String, extra: &[&str]| {
        uroce()
            .env("UROCE_TRACE", &pattern)
            .env("UROCE_DEVICES", dev)
            .args(["rc-pingpong", "-g", "0", "-s", "4096", "-n", iters])
            .args(["-p", &port.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let server = run(format!("srv={server_ip}"), &[]);
    wait_listening(port);
    let client = run(format!("cli={client_ip}"), &[server_ip]);
    let (client_pid, server_pid) = (client.id(), server.id());
    finish_ok(client, "rc-pingpong client");
    finish_ok(server, "rc-pingpong server");
    let (client, server) = (client_pid, server_pid);
    let files: Vec<_> = [server, client]
        .iter()
        .map(|p| dir.join(format!("pp-{p}.json")))
        .collect();
    for p in &files {
        let text = std::fs::read_to_string(p).unwrap();
        assert!(
            text.trim_end().ends_with(']'),
            "closed at exit: {}",
            p.display()
        );
    }
    let merged = dir.join("both.json");
    let out = uroce()
        .arg("trace-merge")
        .args(&files)
        .arg("-o")
        .arg(&merged)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev: Value = serde_json::from_str(&std::fs::read_to_string(&merged).unwrap()).unwrap();
    let ev = ev["traceEvents"].as_array().unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    // Two processes, each named, each with its RC QP's track.
    let qp_of = |pid: u32| -> u64 {
        let names: Vec<_> = ev
            .iter()
            .filter(|e| e["pid"] == pid && e["name"] == "thread_name")
            .filter(|e| e["args"]["name"].as_str().unwrap().starts_with("RC QP"))
            .collect();
        assert_eq!(names.len(), 1, "pid {pid}");
        assert!(ev
            .iter()
            .any(|e| e["pid"] == pid && e["name"] == "process_name"));
        names[0]["tid"].as_u64().unwrap()
    };
    let (sq, cq) = (qp_of(server), qp_of(client));
    // The pingpong's WRs: client and server each post `iters` SENDs.
    for (pid, qp) in [(server, sq), (client, cq)] {
        let sends = ev
            .iter()
            .filter(|e| e["pid"] == pid && e["tid"] == qp && e["ph"] == "b" && e["name"] == "SEND")
            .count();
        assert_eq!(sends, 50, "pid {pid}");
    }
    // The client's packets go to the server's QP, and each is received
    // after it was sent: the two clocks are one.
    let sent: Vec<_> = ev
        .iter()
        .filter(|e| e["pid"] == client && e["name"] == "tx RC_SEND_FIRST")
        .collect();
    assert!(!sent.is_empty());
    let mut checked = 0;
    for s in &sent {
        assert_eq!(s["args"]["dest_qp"], sq);
        let psn = &s["args"]["psn"];
        if let Some(r) = ev.iter().find(|e| {
            e["pid"] == server && e["name"] == "rx RC_SEND_FIRST" && &e["args"]["psn"] == psn
        }) {
            assert!(f(r, "ts") >= f(s, "ts"), "received before sent: {s} {r}");
            assert!(f(r, "ts") - f(s, "ts") < 1e6, "a second apart: {s} {r}");
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked}");
}

/// The CM's exchange on QP1's track, on both sides: `uroce cm-echo`.
#[test]
fn cm_echo_traces_the_cm_exchange() {
    let dir = std::env::temp_dir().join(format!("uroce-trace-cm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("cm-%p.json");
    let (server_ip, client_ip, port) = ("127.120.5.2", "127.120.5.1", 21521u16);
    let run = |dev: &str, ip: &str, extra: &[&str]| {
        uroce()
            .env("UROCE_TRACE", &pattern)
            .env("UROCE_DEVICES", format!("{dev}={ip}"))
            .args(["cm-echo", "-p", &port.to_string(), "-b", ip])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let server = run("srv", server_ip, &[]);
    // The server listens through the CM (no TCP port to watch): a client
    // that came too early is rejected and tries again.
    let mut client_pid = 0;
    for _ in 0..50 {
        let client = run("cli", client_ip, &["--verify", server_ip]);
        client_pid = client.id();
        if client.wait_with_output().unwrap().status.success() {
            break;
        }
        client_pid = 0;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(client_pid, 0, "no client got through");
    let server_pid = server.id();
    finish_ok(server, "cm-echo server");
    let names = |pid: u32| -> Vec<String> {
        let text = std::fs::read_to_string(dir.join(format!("cm-{pid}.json"))).unwrap();
        let ev: Vec<Value> = serde_json::from_str(&text).unwrap();
        ev.iter()
            .filter(|e| e["tid"] == 1 && e["ph"] == "i")
            .map(|e| e["name"].as_str().unwrap().to_string())
            .filter(|n| !n.starts_with("tx ") && !n.starts_with("rx "))
            .collect()
    };
    let (c, s) = (names(client_pid), names(server_pid));
    let _ = std::fs::remove_dir_all(&dir);
    let has = |v: &[String], want: &[&str]| {
        // In this order, other entries between them.
        let mut it = v.iter();
        want.iter().all(|w| it.any(|n| n == w))
    };
    assert!(
        has(
            &c,
            &[
                "send REQ",
                "recv REP",
                "event REP received",
                "send RTU",
                "send DREQ",
                "recv DREP",
                "event disconnected"
            ]
        ),
        "{c:?}"
    );
    assert!(
        has(
            &s,
            &[
                "recv REQ",
                "event REQ received",
                "send REP",
                "recv RTU",
                "event established",
                "recv DREQ",
                "send DREP",
                "event disconnected"
            ]
        ),
        "{s:?}"
    );
}

/// A process ended by SIGTERM runs no exit handler: its trace is what the
/// writer last flushed, which is a whole JSON document.
#[test]
fn a_process_ended_by_sigterm_leaves_a_whole_document() {
    let dir = std::env::temp_dir().join(format!("uroce-trace-term-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("term.json");
    let port = 21531u16;
    let mut server = uroce()
        .env("UROCE_TRACE", &path)
        .env("UROCE_DEVICES", "srv=127.120.6.2")
        .args(["rc-pingpong", "-g", "0", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Listening: its device is open and the trace has begun.
    wait_listening(port);
    let end = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&path).map_or(0, |m| m.len()) < 10 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill with our own child's pid and a valid signal.
    assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGTERM) }, 0);
    let status = server.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGTERM)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let ev: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(ev.iter().any(|e| e["name"] == "process_name"), "{text}");
}
