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
use uroce_verbs::cli::sample::{write_sample_pcap, Family};
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
