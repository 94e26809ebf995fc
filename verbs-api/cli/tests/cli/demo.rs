//! `uroce demo` as a library call: two devices on loopback addresses in
//! one process, an RC QP pair, every operation verified byte for byte.

#[test]
fn demo_runs_and_verifies() {
    let opts = uroce_cli::demo::DemoOptions {
        addrs: ("127.10.3.1".parse().unwrap(), "127.10.3.2".parse().unwrap()),
        iters: 50,
        bulk_bytes: 8 << 20,
        msg_size: 1 << 20,
        pcap: None,
    };
    let rows = uroce_cli::demo::run(&opts).expect("demo").rows;
    assert_eq!(rows.len(), 6);
    assert!(
        rows.iter().all(|r| r.verified),
        "{}",
        uroce_cli::demo::format_table(&rows)
    );
}
