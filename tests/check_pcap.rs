//! The every-opcode sample capture (`uroce sample-pcap`), for IPv4 and for
//! IPv6, judged by the independent checker in `shared/roce-check`
//! (ICRC recomputed with zlib and with scapy, Wireshark's dissector,
//! length and pad rules, `--strict` spec rules).
//!
//! The checker installs tshark and a scapy venv on first use (slow once).
//! Without the checker the test fails under CI and is skipped, loudly,
//! elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;
use uroce_cli::sample::{write_sample_pcap, Family};
use uroce_wire::Opcode;

fn checker() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/roce-check/check_pcap");
    if p.is_file() {
        Some(p)
    } else if std::env::var_os("CI").is_some() {
        panic!("the capture checker {} is missing (CI is set)", p.display());
    } else {
        eprintln!(
            "\n*** SKIP: the capture checker {} is missing; \
             the every-opcode captures were NOT checked ***\n",
            p.display()
        );
        None
    }
}

/// One checker at a time: on first use it creates its Python
/// environment, and two doing that at once fail ("File exists").
static CHECKER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check(family: Family, name: &str) {
    let Some(checker) = checker() else {
        return;
    };
    // one directory per test: the two tests run in parallel
    let dir = std::env::temp_dir().join(format!("uroce-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join(name);
    let n = write_sample_pcap(&file, &[family]).expect("write the sample capture");
    let opcodes = Opcode::all().count();
    assert_eq!(n, opcodes);
    let _guard = CHECKER.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(&checker)
        .arg("--strict")
        .arg("--min-packets")
        .arg(opcodes.to_string())
        .arg(&file)
        .output()
        .expect("run the checker");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "check_pcap {} failed ({}):\n{stdout}{stderr}",
        file.display(),
        out.status
    );
    assert!(
        stdout.contains(&format!("{opcodes} packets, 0 bad")),
        "{stdout}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_opcode_ipv4_passes_the_checker() {
    check(Family::V4, "every-opcode-v4.pcap");
}

#[test]
fn every_opcode_ipv6_passes_the_checker() {
    check(Family::V6, "every-opcode-v6.pcap");
}

/// Runs the checker on a capture file; returns its stdout.
fn run_checker(checker: &Path, file: &Path) -> String {
    let _guard = CHECKER.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(checker)
        .arg("--strict")
        .arg(file)
        .output()
        .expect("run the checker");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "check_pcap {} failed ({}):\n{stdout}{stderr}",
        file.display(),
        out.status
    );
    stdout
}

/// Real RC traffic of every operation (`uroce demo` between two loopback
/// devices), captured by the engine's tap in both directions.
#[test]
fn demo_traffic_capture_passes_the_checker() {
    let Some(checker) = checker() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("uroce-demo-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("demo.pcap");
    let opts = uroce_cli::demo::DemoOptions {
        addrs: ("127.10.8.1".parse().unwrap(), "127.10.8.2".parse().unwrap()),
        iters: 20,
        bulk_bytes: 2 << 20,
        msg_size: 1 << 20,
        pcap: Some(file.clone()),
    };
    let report = uroce_cli::demo::run(&opts).expect("demo");
    assert!(report.rows.iter().all(|r| r.verified));
    let stdout = run_checker(&checker, &file);
    assert!(stdout.contains(" packets, 0 bad"), "{stdout}");
    // Every RC opcode the demo uses is in it.
    let mut reader = uroce_wire::pcap::CaptureReader::open(&file).expect("open");
    let mut seen = std::collections::HashSet::new();
    while let Some(rec) = reader.next_record() {
        let rec = rec.expect("record");
        let frame = uroce_wire::frame::parse_frame(rec.link, rec.data)
            .expect("frame")
            .expect("RoCE");
        frame
            .verify_icrc()
            .expect("ICRC verifies with the captured IP header");
        seen.insert(
            uroce_wire::packet::parse(frame.payload)
                .expect("packet")
                .headers()
                .bth
                .opcode,
        );
    }
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_LAST,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_FETCH_ADD,
        Opcode::RC_COMPARE_SWAP,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
    ] {
        assert!(seen.contains(&op), "{op} missing from the capture");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
