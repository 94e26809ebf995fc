//! `uroce rc-pingpong` against itself in two processes, over loopback
//! addresses of their own, with data checking.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn uroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uroce"))
}

fn wait_listening(port: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let out = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default()
            + &std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let hex = format!(":{port:04X} ");
        if out
            .lines()
            .any(|l| l.contains(&hex) && l.split_whitespace().nth(3) == Some("0A"))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server did not listen on {port}");
}

fn pingpong(server_ip: &str, client_ip: &str, port: u16, args: &[&str]) -> (String, String) {
    let server = uroce()
        .env("UROCE_DEVICES", format!("srv={server_ip}"))
        .args(["rc-pingpong", "-g", "0", "-p", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(port);
    let client = uroce()
        .env("UROCE_DEVICES", format!("cli={client_ip}"))
        .args(["rc-pingpong", "-g", "0", "-p", &port.to_string()])
        .args(args)
        .arg(server_ip)
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let (c, s) = (
        String::from_utf8_lossy(&client.stdout).into_owned(),
        String::from_utf8_lossy(&server.stdout).into_owned(),
    );
    assert!(
        client.status.success(),
        "client: {c}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "server: {s}{}",
        String::from_utf8_lossy(&server.stderr)
    );
    (c, s)
}

#[test]
fn two_processes_with_data_check() {
    for (i, (size, mtu)) in [
        (1usize, 1024u32),
        (4096, 1024),
        (65536, 4096),
        (1 << 20, 1024),
    ]
    .into_iter()
    .enumerate()
    {
        let iters = if size > 65536 { "20" } else { "200" };
        let (c, s) = pingpong(
            "127.10.4.2",
            "127.10.4.1",
            19101 + i as u16,
            &[
                "-c",
                "-s",
                &size.to_string(),
                "-m",
                &mtu.to_string(),
                "-n",
                iters,
            ],
        );
        for out in [&c, &s] {
            let lines: Vec<&str> = out.lines().collect();
            assert!(
                lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"),
                "{out}"
            );
            assert!(
                lines[1].starts_with("  remote address: LID 0x0000, QPN 0x"),
                "{out}"
            );
            let bytes = size as u64 * iters.parse::<u64>().unwrap() * 2;
            assert!(
                lines[2].starts_with(&format!("{bytes} bytes in "))
                    && lines[2].ends_with(" Mbit/sec"),
                "{out}"
            );
            assert!(
                lines[3].starts_with(&format!("{iters} iters in "))
                    && lines[3].ends_with(" usec/iter"),
                "{out}"
            );
            assert!(!out.contains("invalid data"), "{out}");
        }
        assert!(c.contains("GID ::ffff:127.10.4.1") && s.contains("GID ::ffff:127.10.4.2"));
    }
}

#[test]
fn unsupported_options_are_refused() {
    for opt in ["-o", "-O", "-P", "-t", "-j", "-N"] {
        let out = uroce().args(["rc-pingpong", opt]).output().unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("not supported"),
            "{opt}"
        );
    }
}

#[test]
fn rc_stress_two_processes_every_operation_verified() {
    let port = 19150u16;
    let server = uroce()
        .env("UROCE_DEVICES", "srv=127.10.6.2")
        .args(["rc-stress", "-p", &port.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(port);
    let client = uroce()
        .env("UROCE_DEVICES", "cli=127.10.6.1")
        .args([
            "rc-stress",
            "-p",
            &port.to_string(),
            "-n",
            "3000",
            "-m",
            "1024",
            "127.10.6.2",
        ])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let c = String::from_utf8_lossy(&client.stdout);
    let s = String::from_utf8_lossy(&server.stdout);
    assert!(
        client.status.success(),
        "{c}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&server.stderr)
    );
    assert!(
        c.contains(", 0 errors") && s.contains(", 0 errors"),
        "{c}{s}"
    );
}
