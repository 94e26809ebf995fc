//! `benches/history.sh append`: every row of perftest.sh's table that
//! carries a target reaches the CSV, with its ratio and target as plain
//! numbers, and reference rows do not.

use std::path::Path;
use std::process::Command;

const TABLE: &str = "\
| perftest | MTU | uroce | Yardstick | Ratio | Target |
|---|---|---|---|---|---|
| ib_write_bw -s 65536 | 4096 | 2700.47 MiB/s | UDP GSO/GRO, 4 KiB segments: 4926.9 MiB/s | 55% | ≥ 60%: **missed** |
| ib_write_bw -s 65536 | 4096 | 2700.47 MiB/s | UDP 4 KiB, 1 datagram per syscall: 1158.0 MiB/s | 233% | (reference) |
| ib_send_lat -s 2, t_typical | 1024 | 7.00 µs (p99 13.17) | UDP busy-poll ping-pong, 2 B: 3.43 µs | 2.04× | ≤ 2.0×: **missed** |
| ib_write_lat -c UC -s 2, t_typical | 1024 | 30.76 µs (p99 2255.79) | ib_write_lat (RC): 11.37 µs | 2.71× | ≤ 1.1× RC: **missed** |
| idle: 2 processes, 1 connected RC QP each, 10 s | — | 0.10% of a core | one core | 0.10% | < 1%: met |
";

#[test]
fn every_row_with_a_target_is_appended() {
    let dir = std::env::temp_dir().join(format!("uroce-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let table = dir.join("table.md");
    let csv = dir.join("history.csv");
    std::fs::write(&table, TABLE).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/history.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["append", table.to_str().unwrap(), csv.to_str().unwrap()])
        .args(["abc1234", "2026-11-27T18:04Z"])
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = std::fs::read_to_string(&csv).unwrap();
    let want = "\
date,commit,test,mtu,ratio,target
2026-11-27T18:04Z,abc1234,ib_write_bw -s 65536,4096,0.55,>=0.6
2026-11-27T18:04Z,abc1234,ib_send_lat -s 2 t_typical,1024,2.04,<=2
2026-11-27T18:04Z,abc1234,ib_write_lat -c UC -s 2 t_typical,1024,2.71,<=1.1
2026-11-27T18:04Z,abc1234,idle: 2 processes 1 connected RC QP each 10 s,-,0.001,<0.01
";
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}
