//! Helpers the `uroce` command's integration tests share.
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `uroce` binary this package built.
pub fn uroce() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uroce"))
}

/// Waits (up to 10 s) until a TCP socket listens on `port`.
pub fn wait_listening(port: u16) {
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

/// Waits for a tool's process, killing it after a minute (a run that
/// hangs fails the test instead of hanging the suite).
pub fn finish(mut child: Child, tool: &str) -> Output {
    let end = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > end {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{tool} hung: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// `uroce <tool> -p port <server_args>` as server on its own device at
/// `server_ip`, then, once it listens, `uroce <tool> -p port
/// <client_args> <server_ip>` as client on `client_ip`, both with `env`
/// and their output piped: (server, client), running.
pub fn spawn_pair(
    tool: &str,
    server_ip: &str,
    client_ip: &str,
    port: u16,
    server_args: &[&str],
    client_args: &[&str],
    env: &[(&str, &str)],
) -> (Child, Child) {
    let server = uroce()
        .envs(env.iter().copied())
        .env("UROCE_DEVICES", format!("srv={server_ip}"))
        .args([tool, "-p", &port.to_string()])
        .args(server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(port);
    let client = uroce()
        .envs(env.iter().copied())
        .env("UROCE_DEVICES", format!("cli={client_ip}"))
        .args([tool, "-p", &port.to_string()])
        .args(client_args)
        .arg(server_ip)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (server, client)
}

/// Waits for a [`spawn_pair`] of `tool` (server, client): both must
/// succeed. Returns (client stdout, server stdout).
pub fn both_ok(tool: &str, (server, client): (Child, Child)) -> (String, String) {
    let client = finish(client, tool);
    let server = finish(server, tool);
    let (c, s) = (
        String::from_utf8_lossy(&client.stdout).into_owned(),
        String::from_utf8_lossy(&server.stdout).into_owned(),
    );
    assert!(
        client.status.success(),
        "{tool} client: {c}{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "{tool} server: {s}{}",
        String::from_utf8_lossy(&server.stderr)
    );
    (c, s)
}
