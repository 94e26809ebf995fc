//! Helpers the `uroce` command's integration tests share.
use std::process::Command;
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
