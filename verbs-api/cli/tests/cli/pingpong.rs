//! `uroce rc-pingpong`, `uc-pingpong`, `ud-pingpong` and `srq-pingpong`
//! against themselves in two processes, over loopback addresses of their
//! own, with data checking; and `rc-stress`.

use crate::common::{both_ok, spawn_pair, uroce};

/// Runs `uroce <tool>` as server on `server_ip` and as client on
/// `client_ip` (each its own process and device), both with `args`;
/// returns (client stdout, server stdout) after checking both succeeded.
fn pingpong(
    tool: &str,
    server_ip: &str,
    client_ip: &str,
    port: u16,
    args: &[&str],
) -> (String, String) {
    both_ok(
        tool,
        spawn_pair(tool, server_ip, client_ip, port, args, args, &[]),
    )
}

/// Checks the tool's output: `qps` local and remote address lines (UD's
/// local line says "PSN 0x...: GID"), then the two result lines for
/// `size` x `iters`, and no "invalid data" line.
fn check_output(out: &str, qps: usize, ud: bool, size: usize, iters: u64) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * qps + 2, "{out}");
    let sep = if ud { ":" } else { "," };
    for l in &lines[..qps] {
        assert!(
            l.starts_with("  local address:  LID 0x0000, QPN 0x"),
            "{out}"
        );
        assert!(l.contains(&format!("{sep} GID ")), "{out}");
    }
    for l in &lines[qps..2 * qps] {
        assert!(
            l.starts_with("  remote address: LID 0x0000, QPN 0x"),
            "{out}"
        );
    }
    let bytes = size as u64 * iters * 2;
    let res = &lines[2 * qps..];
    assert!(
        res[0].starts_with(&format!("{bytes} bytes in ")) && res[0].ends_with(" Mbit/sec"),
        "{out}"
    );
    assert!(
        res[1].starts_with(&format!("{iters} iters in ")) && res[1].ends_with(" usec/iter"),
        "{out}"
    );
    assert!(!out.contains("invalid data"), "{out}");
}

#[test]
fn rc_two_processes_with_data_check() {
    for (i, (size, mtu)) in [
        (1usize, 1024u32),
        (4096, 1024),
        (65536, 4096),
        (1 << 20, 1024),
    ]
    .into_iter()
    .enumerate()
    {
        let iters = if size > 65536 { 20 } else { 200 };
        let (c, s) = pingpong(
            "rc-pingpong",
            "127.10.4.2",
            "127.10.4.1",
            19101 + i as u16,
            &[
                "-g",
                "0",
                "-c",
                "-s",
                &size.to_string(),
                "-m",
                &mtu.to_string(),
                "-n",
                &iters.to_string(),
            ],
        );
        check_output(&c, 1, false, size, iters);
        check_output(&s, 1, false, size, iters);
        assert!(c.contains("GID ::ffff:127.10.4.1") && s.contains("GID ::ffff:127.10.4.2"));
    }
}

#[test]
fn uc_two_processes_with_data_check() {
    for (i, (size, mtu)) in [(1usize, 1024u32), (4096, 1024), (65536, 4096)]
        .into_iter()
        .enumerate()
    {
        let (c, s) = pingpong(
            "uc-pingpong",
            "127.10.30.2",
            "127.10.30.1",
            19200 + i as u16,
            &[
                "-g",
                "0",
                "-c",
                "-s",
                &size.to_string(),
                "-m",
                &mtu.to_string(),
                "-n",
                "200",
            ],
        );
        check_output(&c, 1, false, size, 200);
        check_output(&s, 1, false, size, 200);
    }
}

#[test]
fn ud_two_processes_with_data_check() {
    // ibv_ud_pingpong's default size is 1024; anything up to the active
    // MTU (loopback: 4096) fits in one datagram.
    for (i, size) in [1usize, 1024, 4096].into_iter().enumerate() {
        let (c, s) = pingpong(
            "ud-pingpong",
            "127.10.31.2",
            "127.10.31.1",
            19210 + i as u16,
            &["-g", "0", "-c", "-s", &size.to_string(), "-n", "300"],
        );
        check_output(&c, 1, true, size, 300);
        check_output(&s, 1, true, size, 300);
    }
    let (c, _) = pingpong(
        "ud-pingpong",
        "127.10.31.2",
        "127.10.31.1",
        19214,
        &["-g", "0", "-c"],
    );
    check_output(&c, 1, true, 1024, 1000);
}

#[test]
fn ud_larger_than_the_mtu_is_refused() {
    let out = uroce()
        .env("UROCE_DEVICES", "srv=127.10.31.9")
        .args(["ud-pingpong", "-s", "4097", "-p", "19219"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Requested size larger than port MTU (4096)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn srq_two_processes_with_data_check() {
    for (i, (qps, size, mtu)) in [
        (16usize, 4096usize, 1024u32),
        (3, 65536, 4096),
        (1, 1, 1024),
    ]
    .into_iter()
    .enumerate()
    {
        let (c, s) = pingpong(
            "srq-pingpong",
            "127.10.32.2",
            "127.10.32.1",
            19220 + i as u16,
            &[
                "-g",
                "0",
                "-c",
                "-q",
                &qps.to_string(),
                "-s",
                &size.to_string(),
                "-m",
                &mtu.to_string(),
                "-n",
                "400",
            ],
        );
        check_output(&c, qps, false, size, 400);
        check_output(&s, qps, false, size, 400);
    }
}

/// `-e`: every tool sleeps on its completion channel.
#[test]
fn events_mode_every_tool() {
    for (i, tool) in ["rc-pingpong", "uc-pingpong", "ud-pingpong", "srq-pingpong"]
        .into_iter()
        .enumerate()
    {
        let (c, s) = pingpong(
            tool,
            "127.10.33.2",
            "127.10.33.1",
            19230 + i as u16,
            &["-g", "0", "-e", "-c", "-s", "2000", "-n", "300", "-q", "4"]
                .into_iter()
                .filter(|a| tool == "srq-pingpong" || (*a != "-q" && *a != "4"))
                .collect::<Vec<_>>(),
        );
        let qps = if tool == "srq-pingpong" { 4 } else { 1 };
        check_output(&c, qps, tool == "ud-pingpong", 2000, 300);
        check_output(&s, qps, tool == "ud-pingpong", 2000, 300);
    }
}

/// Without `-g` neither side sends a GID (as the real tools without -g):
/// each side addresses its QP to the IP the exchange came from, and the
/// client makes the exchange from its device's address.
#[test]
fn without_gids_the_exchange_address_is_used() {
    for (i, tool) in ["rc-pingpong", "uc-pingpong", "ud-pingpong", "srq-pingpong"]
        .into_iter()
        .enumerate()
    {
        let (c, s) = pingpong(
            tool,
            "127.10.34.2",
            "127.10.34.1",
            19240 + i as u16,
            &["-c", "-n", "100", "-s", "512"],
        );
        let qps = if tool == "srq-pingpong" { 16 } else { 1 };
        check_output(&c, qps, tool == "ud-pingpong", 512, 100);
        check_output(&s, qps, tool == "ud-pingpong", 512, 100);
        assert!(
            c.contains("GID ::\n") || c.lines().all(|l| !l.contains("ffff")),
            "{c}"
        );
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
    let out = uroce().args(["srq-pingpong", "-o"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
}

#[test]
fn rc_stress_two_processes_every_operation_verified() {
    let client_args = ["-n", "3000", "-m", "1024"];
    let pair = spawn_pair(
        "rc-stress",
        "127.10.6.2",
        "127.10.6.1",
        19150,
        &[],
        &client_args,
        &[],
    );
    let (c, s) = both_ok("rc-stress", pair);
    assert!(
        c.contains(", 0 errors") && s.contains(", 0 errors"),
        "{c}{s}"
    );
}

/// The unbatched I/O path: with UDP GSO and GRO turned off
/// (`UROCE_GSO=0 UROCE_GRO=0`, as on a kernel without them) the devices
/// say so, and multi-packet messages still go through, data checked.
#[test]
fn rc_without_gso_and_gro() {
    let off = [("UROCE_GSO", "0"), ("UROCE_GRO", "0")];
    let out = uroce()
        .envs(off)
        .env("UROCE_DEVICES", "d=127.10.4.9")
        .arg("devices")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("sendmmsg+GSO off, recvmmsg+GRO off"),
        "{text}"
    );
    let args = ["-g", "0", "-c", "-s", "65536", "-m", "4096", "-n", "100"];
    let pair = spawn_pair(
        "rc-pingpong",
        "127.10.4.10",
        "127.10.4.11",
        19121,
        &args,
        &args,
        &off,
    );
    let (c, s) = both_ok("rc-pingpong", pair);
    check_output(&c, 1, false, 65536, 100);
    check_output(&s, 1, false, 65536, 100);
}
