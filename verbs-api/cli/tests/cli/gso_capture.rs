//! What a capture on `lo` shows of uroce's UDP GSO sends, read by
//! `uroce decode`: `tcpdump -i lo` (or tshark) captures an `rc-pingpong` pair (16 KiB
//! messages at MTU 1024, sent as GSO runs) on addresses of this test's own;
//! each GSO message is one frame holding several RoCE packets, which
//! `uroce decode` splits at the segment size where every piece's ICRC
//! verifies, and says so. With `UROCE_GSO=0` every frame is one packet.
//! Skipped, with the reason printed, where neither tcpdump nor tshark is
//! installed or they cannot capture (not root).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{finish, spawn_pair, uroce};

/// A capture tool: tcpdump, or else tshark (which CI installs).
struct Tool {
    name: &'static str,
    /// What it says on stderr once it captures.
    ready: &'static str,
}

const TCPDUMP: Tool = Tool {
    name: "tcpdump",
    ready: "listening on",
};
const TSHARK: Tool = Tool {
    name: "tshark",
    ready: "Capturing on",
};

/// The capture tool installed, or why there is none.
fn capture_tool() -> Result<&'static Tool, String> {
    [&TCPDUMP, &TSHARK]
        .into_iter()
        .find(|t| Command::new(t.name).arg("--version").output().is_ok())
        .ok_or_else(|| "neither tcpdump nor tshark is installed (apt-get install tcpdump)".into())
}

/// `tool` capturing on `lo` into `file` (tcpdump: each packet as it
/// comes; without immediate mode a ^C loses what waits in the capture
/// ring), RoCEv2 of 127.118.3.0/24 only, once it is seen to capture; why
/// not when it cannot (not root).
///
/// Both tools say they capture ("listening on", "Capturing on") before
/// the kernel hands them packets: a pair started at once can finish
/// unseen. So the capture also prints what it writes (`--print`, `-P`,
/// line-buffered), and probes (UDP to 127.118.3.251 port 4790, which
/// `uroce decode` counts as other frames) go out until one is printed.
fn start_capture(tool: &Tool, file: &Path) -> Result<Child, String> {
    let filter = "udp and net 127.118.3.0/24 and (port 4791 or port 4790)";
    let mut cmd = Command::new(tool.name);
    if tool.name == "tcpdump" {
        cmd.args([
            "-i",
            "lo",
            "--immediate-mode",
            "-B",
            "16384",
            "-U",
            "-l",
            "--print",
            "-w",
        ])
        .arg(file)
        .arg(filter);
    } else {
        cmd.args(["-i", "lo", "-B", "16", "-l", "-P", "-f", filter, "-w"])
            .arg(file);
    }
    let mut td = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", tool.name))?;
    // `ready` on stderr comes once the capture runs, a printed probe on
    // stdout once packets reach it; an error ends it.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut err = td.stderr.take().expect("piped");
    let ready = tool.ready;
    let etx = tx.clone();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut b = [0u8; 256];
        let mut said = false;
        while let Ok(n) = err.read(&mut b) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&b[..n]);
            if !said && String::from_utf8_lossy(&seen).contains(ready) {
                said = true;
                let _ = etx.send(Ok(false));
            }
        }
        let _ = etx.send(Err(String::from_utf8_lossy(&seen).into_owned()));
    });
    let out = td.stdout.take().expect("piped");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            // The probe's destination (tshark names port 4790 VxLAN).
            if line.contains("127.118.3.251") {
                let _ = tx.send(Ok(true));
            }
        }
    });
    let probe = std::net::UdpSocket::bind("127.118.3.250:0").map_err(|e| e.to_string())?;
    let end = Instant::now() + Duration::from_secs(10);
    let mut capturing = false;
    while Instant::now() < end {
        if capturing {
            let _ = probe.send_to(b"probe", "127.118.3.251:4790");
        }
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(Ok(true)) => return Ok(td),
            Ok(Ok(false)) => capturing = true,
            Ok(Err(e)) => return Err(format!("{} cannot capture: {}", tool.name, e.trim())),
            Err(_) => {}
        }
    }
    let _ = td.kill();
    Err(format!("{} did not start capturing in 10 s", tool.name))
}

/// Stops the capture as ^C does, so that it writes out what it holds.
fn stop_capture(td: Child) {
    let _ = Command::new("kill")
        .args(["-INT", &td.id().to_string()])
        .status();
    finish(td, "the capture");
}

/// An rc-pingpong pair of 16 KiB messages at MTU 1024 on 127.118.3.`n`
/// and .`n+1` (TCP port `port`), with `env`, captured on `lo`; returns
/// `uroce decode`'s JSON lines and stderr, or why it was skipped.
fn capture_pair(
    tool: &Tool,
    n: u8,
    port: u16,
    env: &[(&str, &str)],
) -> Result<(Vec<Value>, String), String> {
    let dir = std::env::temp_dir().join(format!("uroce-gso-capture-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join("lo.pcap");
    let td = start_capture(tool, &file)?;
    let args = ["-g", "0", "-c", "-s", "16384", "-m", "1024", "-n", "4"];
    let (srv, cli) = (format!("127.118.3.{n}"), format!("127.118.3.{}", n + 1));
    let (server, client) = spawn_pair("rc-pingpong", &srv, &cli, port, &args, &args, env);
    let c = finish(client, "rc-pingpong client");
    let s = finish(server, "rc-pingpong server");
    std::thread::sleep(Duration::from_millis(300));
    stop_capture(td);
    assert!(c.status.success() && s.status.success(), "{c:?} {s:?}");
    let out = uroce().arg("decode").arg(&file).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Ok((lines, String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[test]
fn a_capture_on_lo_of_gso_sends_is_split_into_its_packets() {
    let tool = match capture_tool() {
        Ok(t) => t,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let (lines, err) = match capture_pair(tool, 1, 21110, &[]) {
        Ok(x) => x,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    // 4 round trips of 16 KiB: each message's 16 SEND packets are one GSO
    // message, one frame. (tcpdump may drop frames on a busy machine: the
    // checks are about the frames it kept.)
    assert!(
        lines
            .iter()
            .all(|l| l["icrc_ok"] == true && l.get("error").is_none()),
        "{err}"
    );
    let split: Vec<&Value> = lines.iter().filter(|l| l.get("gso").is_some()).collect();
    assert!(split.len() >= 16, "GSO runs were captured whole: {err}");
    for l in &split {
        assert_eq!(l["gso"]["segment_size"], 1040, "{l}");
        assert_eq!(l["gso"]["count"], 16, "{l}");
        assert_eq!(l["payload_len"], 1024, "{l}");
    }
    // A frame's pieces are one message's packets, in PSN order.
    for w in split.windows(2) {
        if w[0]["frame"] == w[1]["frame"] {
            let (a, b) = (w[0]["psn"].as_u64().unwrap(), w[1]["psn"].as_u64().unwrap());
            assert_eq!((a + 1) & 0xff_ffff, b, "{} {}", w[0], w[1]);
            assert_eq!(
                w[0]["gso"]["index"].as_u64().unwrap() + 1,
                w[1]["gso"]["index"]
            );
        }
    }
    assert!(
        err.contains("GSO super-packet: 16 RoCE packets of 1040 bytes"),
        "{err}"
    );
    assert!(err.contains("frames were UDP GSO super-packets"), "{err}");

    // Without GSO every frame is one packet.
    let (lines, err) =
        capture_pair(tool, 3, 21111, &[("UROCE_GSO", "0")]).expect("captured before");
    assert!(lines.iter().all(|l| l.get("gso").is_none()), "{err}");
    assert!(!err.contains("GSO super-packet"), "{err}");
    let frames: std::collections::BTreeSet<u64> =
        lines.iter().map(|l| l["frame"].as_u64().unwrap()).collect();
    assert_eq!(frames.len(), lines.len(), "one packet per frame");
    let sends = lines
        .iter()
        .filter(|l| l["payload_len"] == 1024 && l["icrc_ok"] == true)
        .count();
    assert!(sends >= 64, "{sends} SEND packets: {err}");
}
