//! `uroce decode` and `uroce sample-pcap`, run as the built binary: every
//! key of the JSON lines, malformed packets, frames that are not RoCEv2,
//! pcapng input and exit statuses.

use serde_json::{json, Value};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use uroce_wire::frame::{build_frame, build_roce_frame, FrameParams};
use uroce_wire::pcap::CaptureWriter;
use uroce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Headers, NakCode,
    Opcode, Psn, RethRepr,
};

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const A4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
const B4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xa);
const B6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0xb);

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("uroce-decode-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uroce"))
        .args(args)
        .output()
        .expect("run uroce")
}

fn decode(path: &Path) -> (Output, Vec<Value>) {
    let out = uroce(&["decode", path.to_str().expect("utf-8 path")]);
    let lines = String::from_utf8(out.stdout.clone())
        .expect("utf-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (out, lines)
}

fn v4(from_a: bool) -> FrameParams {
    if from_a {
        FrameParams::v4(MAC_A, MAC_B, A4, B4, 0x1c46, 0xc001)
    } else {
        FrameParams::v4(MAC_B, MAC_A, B4, A4, 0, 0xc002)
    }
}

fn v6(from_a: bool) -> FrameParams {
    if from_a {
        FrameParams::v6(MAC_A, MAC_B, A6, B6, 0xc001)
    } else {
        FrameParams::v6(MAC_B, MAC_A, B6, A6, 0xc002)
    }
}

fn bth(op: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode: op,
        pkey: 0xffff,
        dest_qp,
        psn: Psn::new(psn),
        ..BthRepr::default()
    }
}

fn roce(p: &FrameParams, h: &Headers, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let n = build_roce_frame(p, h, payload, &mut buf).expect("build");
    buf.truncate(n);
    buf
}

/// The ICRC field as the decoder reports it: the frame's last four bytes,
/// little-endian.
fn icrc_of(frame: &[u8]) -> u32 {
    let n = frame.len();
    u32::from_le_bytes([frame[n - 4], frame[n - 3], frame[n - 2], frame[n - 1]])
}

/// The keys every line with a BTH has, with the usual values; `extra`
/// adds keys and overrides.
fn expect(frame: u64, addrs: (&str, &str, u16, u16), bth_and_more: Value) -> Value {
    let mut v = json!({
        "frame": frame,
        "src": addrs.0,
        "dst": addrs.1,
        "sport": addrs.2,
        "dport": addrs.3,
        "se": false,
        "migreq": false,
        "pad": 0,
        "tver": 0,
        "pkey": 65535,
        "fecn": false,
        "becn": false,
        "ack_req": false,
    });
    if let (Some(m), Some(extra)) = (v.as_object_mut(), bth_and_more.as_object()) {
        for (k, x) in extra {
            m.insert(k.clone(), x.clone());
        }
    }
    v
}

const AB4: (&str, &str, u16, u16) = ("10.1.0.1", "10.1.0.2", 0xc001, 4791);
const BA4: (&str, &str, u16, u16) = ("10.1.0.2", "10.1.0.1", 0xc002, 4791);
const AB6: (&str, &str, u16, u16) = ("fd00::a", "fd00::b", 0xc001, 4791);
const BA6: (&str, &str, u16, u16) = ("fd00::b", "fd00::a", 0xc002, 4791);

/// Builds the test capture; returns its frames and the lines expected.
fn capture() -> (Vec<Vec<u8>>, Vec<Value>) {
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut want = Vec::new();

    // 1: RDMA WRITE FIRST with a RETH
    let mut h = Headers::new(BthRepr {
        migreq: true,
        ..bth(Opcode::RC_RDMA_WRITE_FIRST, 0x12, 100)
    });
    h.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: 0xdead_beef,
        dma_len: 3000,
    });
    let f = roce(&v4(true), &h, &[7; 8]);
    want.push(expect(
        1,
        AB4,
        json!({"opcode": 6, "opcode_name": "RC_RDMA_WRITE_FIRST", "migreq": true,
               "dest_qp": 0x12, "psn": 100,
               "reth": {"va": 0x7f00_0000_1000u64, "rkey": 0xdead_beefu32, "dma_len": 3000},
               "payload_len": 8, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 2-4: ACK, RNR NAK, NAK
    for (i, (syn, byte, kind, value)) in [
        (AethSyndrome::Ack { credits: 0x1f }, 0x1f, "ack", 0x1f),
        (AethSyndrome::RnrNak { timer: 14 }, 0x2e, "rnr_nak", 14),
        (AethSyndrome::Nak(NakCode::PsnSequenceError), 0x60, "nak", 0),
    ]
    .into_iter()
    .enumerate()
    {
        let mut h = Headers::new(bth(Opcode::RC_ACKNOWLEDGE, 0x11, 100 + i as u32));
        h.aeth = Some(AethRepr {
            syndrome: syn,
            msn: 0x00ab_cdef,
        });
        let f = roce(&v4(false), &h, &[]);
        want.push(expect(
            2 + i as u64,
            BA4,
            json!({"opcode": 0x11, "opcode_name": "RC_ACKNOWLEDGE", "dest_qp": 0x11,
                   "psn": 100 + i,
                   "aeth": {"syndrome": byte, "kind": kind, "value": value, "msn": 0x00ab_cdef},
                   "payload_len": 0, "icrc": icrc_of(&f), "icrc_ok": true}),
        ));
        frames.push(f);
    }

    // 5: compare-swap, u64 values above 2^53
    let mut h = Headers::new(BthRepr {
        ack_req: true,
        ..bth(Opcode::RC_COMPARE_SWAP, 0x12, 0xff_ffff)
    });
    h.atomic_eth = Some(AtomicEthRepr {
        va: 0xffff_ffff_ffff_f000,
        rkey: 1,
        swap_add: u64::MAX,
        compare: 0x8000_0000_0000_0001,
    });
    let f = roce(&v4(true), &h, &[]);
    want.push(expect(
        5,
        AB4,
        json!({"opcode": 0x13, "opcode_name": "RC_COMPARE_SWAP", "dest_qp": 0x12,
               "psn": 0xff_ffff, "ack_req": true,
               "atomic_eth": {"va": 0xffff_ffff_ffff_f000u64, "rkey": 1,
                              "swap_add": u64::MAX, "compare": 0x8000_0000_0000_0001u64},
               "payload_len": 0, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 6: atomic acknowledge
    let mut h = Headers::new(bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0x11, 0xff_ffff));
    h.aeth = Some(AethRepr::default());
    h.atomic_ack = Some(AtomicAckEthRepr { orig: u64::MAX - 1 });
    let f = roce(&v4(false), &h, &[]);
    want.push(expect(
        6,
        BA4,
        json!({"opcode": 0x12, "opcode_name": "RC_ATOMIC_ACKNOWLEDGE", "dest_qp": 0x11,
               "psn": 0xff_ffff,
               "aeth": {"syndrome": 0x1f, "kind": "ack", "value": 0x1f, "msn": 0},
               "atomic_ack": {"orig": u64::MAX - 1},
               "payload_len": 0, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 7: UD send with immediate over IPv6, pad 3, SE
    let mut h = Headers::new(BthRepr {
        se: true,
        ..bth(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, 0x13, 5)
    });
    h.deth = Some(DethRepr {
        qkey: 0x1111_1111,
        src_qp: 0x11,
    });
    h.imm = Some(0xcafe_f00d);
    let f = roce(&v6(true), &h, b"hello");
    want.push(expect(
        7,
        AB6,
        json!({"opcode": 0x65, "opcode_name": "UD_SEND_ONLY_WITH_IMMEDIATE", "se": true,
               "pad": 3, "dest_qp": 0x13, "psn": 5,
               "deth": {"qkey": 0x1111_1111, "src_qp": 0x11}, "imm": 0xcafe_f00du32,
               "payload_len": 5, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 8: send with invalidate, VLAN-tagged
    let mut h = Headers::new(bth(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, 0x12, 7));
    h.ieth = Some(0x0102_0304);
    let mut f = roce(&v4(true), &h, &[1, 2]);
    f.splice(12..12, [0x81, 0x00, 0x00, 0x07]);
    want.push(expect(
        8,
        AB4,
        json!({"opcode": 0x17, "opcode_name": "RC_SEND_ONLY_WITH_INVALIDATE", "pad": 2,
               "dest_qp": 0x12, "psn": 7, "ieth": {"rkey": 0x0102_0304},
               "payload_len": 2, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 9: CNP over IPv6
    let h = Headers::new(BthRepr {
        becn: true,
        ..bth(Opcode::CNP, 0x11, 0)
    });
    let f = roce(&v6(false), &h, &[]);
    want.push(expect(
        9,
        BA6,
        json!({"opcode": 0x81, "opcode_name": "CNP", "becn": true, "dest_qp": 0x11, "psn": 0,
               "payload_len": 0, "icrc": icrc_of(&f), "icrc_ok": true}),
    ));
    frames.push(f);

    // 10: ARP (skipped)
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&MAC_A);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    arp.extend_from_slice(&[0; 20]);
    frames.push(arp);

    // 11: DNS over UDP (skipped)
    let mut p = v4(true);
    p.src_port = 5353;
    p.dst_port = 53;
    let mut buf = vec![0u8; 128];
    let n = build_frame(&p, b"not roce", &mut buf).expect("build");
    frames.push(buf[..n].to_vec());

    // 12: bad ICRC: well formed, icrc_ok false, no error
    let h = Headers::new(bth(Opcode::RC_SEND_ONLY, 0x12, 8));
    let mut f = roce(&v4(true), &h, &[9; 4]);
    let last = f.len() - 1;
    f[last] ^= 0x80;
    want.push(expect(
        12,
        AB4,
        json!({"opcode": 4, "opcode_name": "RC_SEND_ONLY", "dest_qp": 0x12, "psn": 8,
               "payload_len": 4, "icrc": icrc_of(&f), "icrc_ok": false}),
    ));
    frames.push(f);

    // 13: truncated inside the RETH (IP and UDP lengths consistent)
    let mut h = Headers::new(bth(Opcode::RC_RDMA_WRITE_ONLY, 0x12, 9));
    h.reth = Some(RethRepr::default());
    let whole = roce(&v4(true), &h, &[1; 16]);
    let udp_payload = &whole[42..42 + 22];
    let mut buf = vec![0u8; 128];
    let n = build_frame(&v4(true), udp_payload, &mut buf).expect("build");
    let f = buf[..n].to_vec();
    want.push(expect(
        13,
        AB4,
        json!({"opcode": 0x0a, "opcode_name": "RC_RDMA_WRITE_ONLY", "dest_qp": 0x12, "psn": 9,
               "icrc": icrc_of(&f), "icrc_ok": false,
               "error": "truncated: RC_RDMA_WRITE_ONLY needs 32 bytes, 22 available"}),
    ));
    frames.push(f);

    // 14: 10 bytes of UDP payload: no BTH
    let n = build_frame(&v4(true), &[4; 10], &mut buf).expect("build");
    frames.push(buf[..n].to_vec());
    want.push(
        json!({"frame": 14, "src": AB4.0, "dst": AB4.1, "sport": AB4.2, "dport": AB4.3,
                     "error": "truncated: BTH+ICRC needs 16 bytes, 10 available"}),
    );

    // 15: from port 4791 to another port (either direction counts), TVer 1
    let mut p = v4(false);
    p.src_port = 4791;
    p.dst_port = 50_000;
    let h = Headers::new(BthRepr {
        tver: 1,
        ..bth(Opcode::RC_SEND_ONLY, 0x11, 10)
    });
    let f = roce(&p, &h, &[]);
    want.push(expect(
        15,
        ("10.1.0.2", "10.1.0.1", 4791, 50_000),
        json!({"opcode": 4, "opcode_name": "RC_SEND_ONLY", "tver": 1, "dest_qp": 0x11,
               "psn": 10, "icrc": icrc_of(&f), "icrc_ok": true,
               "error": "unsupported transport header version 1"}),
    ));
    frames.push(f);

    // 16: unknown opcode 0x15: no opcode_name
    let mut f = roce(
        &v4(true),
        &Headers::new(bth(Opcode::RC_SEND_ONLY, 0x12, 11)),
        &[],
    );
    f[42] = 0x15;
    want.push(expect(
        16,
        AB4,
        json!({"opcode": 0x15, "dest_qp": 0x12, "psn": 11, "icrc": icrc_of(&f),
               "icrc_ok": false, "error": "unknown or reserved opcode 0x15"}),
    ));
    frames.push(f);

    (frames, want)
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut w = CaptureWriter::create(path).expect("create");
    for (i, f) in frames.iter().enumerate() {
        w.write(Duration::from_millis(i as u64), f).expect("write");
    }
    w.finish().expect("finish");
}

#[test]
fn every_key_and_malformed_packets() {
    let dir = TempDir::new("keys");
    let (frames, want) = capture();
    let path = dir.file("t.pcap");
    write_pcap(&path, &frames);
    let (out, lines) = decode(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(lines.len(), want.len(), "{lines:#?}");
    for (got, want) in lines.iter().zip(&want) {
        assert_eq!(got, want);
    }
    assert!(
        stderr.contains("16 frames: 14 RoCEv2 packets (4 malformed, 3 with a bad ICRC), 2 other frames, 0 not decodable"),
        "{stderr}"
    );
    // key order: as listed in the interface
    let first = String::from_utf8_lossy(&out.stdout);
    assert!(first.starts_with(
        r#"{"frame":1,"src":"10.1.0.1","dst":"10.1.0.2","sport":49153,"dport":4791,"opcode":6,"opcode_name":"RC_RDMA_WRITE_FIRST","se":false,"migreq":true,"pad":0,"tver":0,"pkey":65535,"fecn":false,"becn":false,"dest_qp":18,"ack_req":false,"psn":100,"reth":{"va":139637976731648,"rkey":3735928559,"dma_len":3000},"payload_len":8,"icrc":"#
    ));
}

/// A little-endian pcapng block.
fn block(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut body = body.to_vec();
    while body.len() % 4 != 0 {
        body.push(0);
    }
    let len = (body.len() + 12) as u32;
    let mut b = kind.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b.extend_from_slice(&body);
    b.extend_from_slice(&len.to_le_bytes());
    b
}

#[test]
fn pcapng_with_linux_cooked_frames() {
    let dir = TempDir::new("ng");
    let (frames, _) = capture();
    // SHB: magic, version 1.0, section length unknown
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&[1, 0, 0, 0]);
    shb.extend_from_slice(&u64::MAX.to_le_bytes());
    let mut file = block(0x0a0d_0d0a, &shb);
    // IDB: LINKTYPE_LINUX_SLL2, snaplen 0
    let mut idb = 276u16.to_le_bytes().to_vec();
    idb.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    file.extend(block(1, &idb));
    // frames 7 (IPv6 UD) and 1 (IPv4 WRITE FIRST), as SLL2
    for f in [&frames[6], &frames[0]] {
        let mut sll2 = f[12..14].to_vec(); // protocol
        sll2.extend_from_slice(&[0, 0, 0, 0, 0, 1, 0, 1, 4, 6]);
        sll2.extend_from_slice(&f[6..12]);
        sll2.extend_from_slice(&[0, 0]);
        sll2.extend_from_slice(&f[14..]);
        let mut epb = 0u32.to_le_bytes().to_vec(); // interface 0
        epb.extend_from_slice(&[0; 8]); // timestamp
        epb.extend_from_slice(&(sll2.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(sll2.len() as u32).to_le_bytes());
        epb.extend_from_slice(&sll2);
        file.extend(block(6, &epb));
    }
    let path = dir.file("t.pcapng");
    std::fs::write(&path, &file).expect("write");
    let (out, lines) = decode(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["frame"], 1);
    assert_eq!(lines[0]["opcode_name"], "UD_SEND_ONLY_WITH_IMMEDIATE");
    assert_eq!(lines[0]["src"], "fd00::a");
    assert_eq!(lines[0]["icrc_ok"], true);
    assert_eq!(lines[1]["frame"], 2);
    assert_eq!(lines[1]["reth"]["dma_len"], 3000);
    assert_eq!(lines[1]["icrc_ok"], true);
}

#[test]
fn sample_pcap_then_decode() {
    let dir = TempDir::new("sample");
    let path = dir.file("x.pcap");
    let p = path.to_str().expect("utf-8");
    let out = uroce(&["sample-pcap", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (out, lines) = decode(&path);
    assert!(out.status.success());
    let names: Vec<&str> = Opcode::all().map(|i| i.name).collect();
    assert_eq!(lines.len(), 2 * names.len());
    let mut pads = [false; 4];
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["frame"], i as u64 + 1);
        assert_eq!(l["opcode_name"], names[i % names.len()], "{l}");
        assert_eq!(l["icrc_ok"], true, "{l}");
        assert!(l.get("error").is_none(), "{l}");
        assert_eq!(
            l["src"].as_str().map(|s| s.contains(':')),
            Some(i >= names.len())
        );
        if let Some(p) = l["pad"].as_u64() {
            pads[p as usize] = true;
        }
    }
    assert_eq!(pads, [true; 4]);
    for (flag, n) in [("--ipv4", 0usize), ("--ipv6", names.len())] {
        let out = uroce(&["sample-pcap", flag, p]);
        assert!(out.status.success());
        let (_, lines) = decode(&path);
        assert_eq!(lines.len(), names.len());
        assert_eq!(lines[0]["src"], lines_src(n));
    }
}

fn lines_src(n: usize) -> &'static str {
    if n == 0 {
        "192.168.50.1"
    } else {
        "fd00:5e::1"
    }
}

#[test]
fn exit_status() {
    let dir = TempDir::new("exit");
    // missing file
    let out = uroce(&["decode", dir.file("missing.pcap").to_str().expect("utf-8")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing.pcap"), "{err}");
    // not a capture
    let junk = dir.file("junk.pcap");
    std::fs::write(&junk, b"this is not a capture file").expect("write");
    let (out, lines) = decode(&junk);
    assert!(!out.status.success());
    assert!(lines.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a pcap or pcapng file"));
    // an empty but valid capture: fine
    let empty = dir.file("empty.pcap");
    write_pcap(&empty, &[]);
    let (out, lines) = decode(&empty);
    assert!(out.status.success());
    assert!(lines.is_empty());
    // a capture cut short in its second record: the first is printed,
    // then a non-zero exit with a message
    let (frames, _) = capture();
    let cut = dir.file("cut.pcap");
    write_pcap(&cut, &frames[..2]);
    let bytes = std::fs::read(&cut).expect("read");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).expect("write");
    let (out, lines) = decode(&cut);
    assert!(!out.status.success());
    assert_eq!(lines.len(), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cut short"));
    // an unsupported link type
    let ppp = dir.file("ppp.pcap");
    let mut w = CaptureWriter::with_link_type(
        std::fs::File::create(&ppp).expect("create"),
        uroce_wire::frame::LinkType::Other(9),
    )
    .expect("header");
    w.write(Duration::ZERO, &[0; 20]).expect("write");
    w.finish().expect("finish");
    let (out, _) = decode(&ppp);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("link type 9"));
}
