//! Opening a device: a taken address, and the capture a program leaves
//! when it exits without closing its devices.

use uroce_verbs::*;
use uroce_wire::pcap::CaptureReader;

use crate::common::{qp, recv, T};

/// A device whose address another socket (another process) holds fails to
/// open with EADDRINUSE, not EIO.
#[test]
fn a_taken_address_is_addr_in_use() {
    let ip = "127.102.2.1";
    let _holder = std::net::UdpSocket::bind((ip, 4791)).unwrap();
    let err = Device::new("t", ip.parse().unwrap()).open().unwrap_err();
    assert!(matches!(err, Error::AddrInUse), "{err:?}");
    assert_eq!(err.errno(), libc::EADDRINUSE);
}

const CHILD_ENV: &str = "UROCE_TEST_PCAP_CHILD";
const SENDS: u64 = 200;

/// The child half of [`capture_is_whole_after_exit_without_close`]: two
/// devices capturing (`UROCE_PCAP`), RC SENDs from one to the other, then
/// `exit` with everything still open. A no-op unless run as that child.
#[test]
fn pcap_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let (ai, bi) = ("127.102.3.1", "127.102.3.2");
    let dev = |name, ip: &str| Device::new(name, ip.parse().unwrap()).open().unwrap();
    let (a, b) = (dev("pa", ai), dev("pb", bi));
    let (apd, bpd) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (acq, bcq) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
    let (aqp, bqp) = (
        qp(&apd, &acq, QpType::Rc, None),
        qp(&bpd, &bcq, QpType::Rc, None),
    );
    let p = loopback::RcParams::default();
    loopback::connect_rc(&aqp, bi.parse().unwrap(), bqp.qp_num(), 10, 20, p).unwrap();
    loopback::connect_rc(&bqp, ai.parse().unwrap(), aqp.qp_num(), 20, 10, p).unwrap();
    let smr = apd.alloc_mr(1024, Access::LOCAL_WRITE).unwrap();
    let rmr = bpd.alloc_mr(1024, Access::LOCAL_WRITE).unwrap();
    for i in 0..SENDS {
        bqp.post_recv(&[recv(i, &rmr, 0, 1024)]).unwrap();
        let mut w = SendWr::new(i, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(smr.sge(0, 700));
        aqp.post_send(&[w]).unwrap();
        assert_eq!(acq.wait(1, T)[0].status, WcStatus::Success);
        assert_eq!(bcq.wait(1, T)[0].status, WcStatus::Success);
    }
    // Out, with the devices open and nothing closed (no destructor runs).
    std::process::exit(0);
}

/// A program that exits without closing its device leaves a capture file
/// of whole records, every packet in it: the file only grows by whole
/// records, and what is held is written at exit.
#[test]
fn capture_is_whole_after_exit_without_close() {
    let dir = std::env::temp_dir().join(format!("uroce-pcap-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pattern = dir.join("{dev}.pcap");
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "device_open::pcap_child", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("UROCE_PCAP", &pattern)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "child: {st}");
    // Every record whole, and every SEND there: each device recorded
    // all it sent (pa) or received (pb).
    for name in ["pa", "pb"] {
        let path = dir.join(format!("{name}.pcap"));
        let mut r =
            CaptureReader::open(&path).unwrap_or_else(|e| panic!("{name}: no pcap header: {e}"));
        let (mut records, mut sends) = (0u64, 0u64);
        while let Some(rec) = r.next_record() {
            let rec = rec.unwrap_or_else(|e| panic!("{name}, after {records} records: {e}"));
            records += 1;
            // 700-byte SEND ONLY packets: Ethernet 14 + IPv4 20 + UDP 8 +
            // BTH 12 + payload 700 + ICRC 4.
            if rec.data.len() == 14 + 20 + 8 + 12 + 700 + 4 {
                sends += 1;
            }
        }
        assert!(sends >= SENDS, "{name}: {sends} SENDs in {records} records");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
