//! RC across a real (virtual) network: two network namespaces joined by a
//! veth pair with loss, reordering, duplication, corruption and delay,
//! uroce in one process in each, 20,000 messages of mixed operations with
//! every byte verified (`uroce rc-stress`).
//!
//! The impairment is `tc qdisc netem loss 5% reorder 25% duplicate 1%
//! corrupt 0.1% delay 1ms` on both ends. Where the kernel has no netem
//! (`Specified qdisc kind is unknown`, as on this project's CI machines)
//! the same rates are injected by uroce itself on both ends
//! (`UROCE_FAULTS`), and the test says so. Without root or iproute2 it
//! prints SKIP with the reason.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NETEM: &str = "loss 5% reorder 25% duplicate 1% corrupt 0.1% delay 1ms";
const FAULTS: &str = "loss=0.05,reorder=0.25,reorder_delay=1ms,dup=0.01,corrupt=0.001,delay=1ms";

struct Netns {
    a: String,
    b: String,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Creates the namespaces and the link; returns whether netem is on it.
fn setup(tag: &str) -> Result<(Netns, bool), String> {
    let ns = Netns {
        a: format!("uroce-{tag}-a"),
        b: format!("uroce-{tag}-b"),
    };
    let (va, vb) = (format!("ur{tag}a"), format!("ur{tag}b"));
    ip(&["netns", "add", &ns.a])?;
    ip(&["netns", "add", &ns.b])?;
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
    ip(&["link", "set", &va, "netns", &ns.a])?;
    ip(&["link", "set", &vb, "netns", &ns.b])?;
    ip(&["-n", &ns.a, "addr", "add", "10.201.0.1/24", "dev", &va])?;
    ip(&["-n", &ns.b, "addr", "add", "10.201.0.2/24", "dev", &vb])?;
    for (n, v) in [(&ns.a, &va), (&ns.b, &vb)] {
        ip(&["-n", n, "link", "set", v, "up"])?;
        ip(&["-n", n, "link", "set", "lo", "up"])?;
    }
    let mut netem = true;
    for (n, v) in [(&ns.a, &va), (&ns.b, &vb)] {
        let mut args = vec![
            "netns", "exec", n, "tc", "qdisc", "add", "dev", v, "root", "netem",
        ];
        args.extend(NETEM.split(' '));
        let out = Command::new("ip")
            .args(&args)
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            eprintln!(
                "netns_lossy: netem unavailable ({}); injecting the same faults in uroce instead",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            netem = false;
            break;
        }
    }
    Ok((ns, netem))
}

#[test]
fn rc_stress_across_a_lossy_link() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc_geteuid() } == 0;
    if !root || Command::new("ip").arg("-V").output().is_err() {
        println!("SKIP netns_lossy: needs root and iproute2 (root: {root})");
        return;
    }
    let tag = format!("{}", std::process::id() % 100_000);
    let (ns, netem) = match setup(&tag) {
        Ok(x) => x,
        Err(e) => {
            println!("SKIP netns_lossy: cannot build the namespaces: {e}");
            return;
        }
    };
    let faults = if netem { "" } else { FAULTS };
    let bin = env!("CARGO_BIN_EXE_uroce");
    let port = "18600";
    let server = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.a,
            "env",
            "UROCE_DEVICES=srv=10.201.0.1",
        ])
        .arg(format!("UROCE_FAULTS={faults},seed=11"))
        .args([bin, "rc-stress", "-p", port, "-t", "12"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // Wait for the server's TCP listener (inside its namespace).
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", &ns.a, "ss", "-ltn"])
            .output();
        if out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(":{port}"))) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "server did not listen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let client = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.b,
            "env",
            "UROCE_DEVICES=cli=10.201.0.2",
        ])
        .arg(format!("UROCE_FAULTS={faults},seed=12"))
        .args([
            bin,
            "rc-stress",
            "-p",
            port,
            "-t",
            "12",
            "-n",
            "20000",
            "10.201.0.1",
        ])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let c = String::from_utf8_lossy(&client.stdout);
    let s = String::from_utf8_lossy(&server.stdout);
    println!(
        "client: {c}server: {s}({})",
        if netem { "netem" } else { "UROCE_FAULTS" }
    );
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
    assert!(c.contains(", 0 errors") && s.contains(", 0 errors"));
    let sent: u64 = ["sends", "writes", "reads", "atomics"]
        .iter()
        .map(|k| {
            c.split(',')
                .find(|p| p.trim().ends_with(k))
                .and_then(|p| p.split_whitespace().rev().nth(1)?.parse().ok())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(sent, 20000, "{c}");
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
