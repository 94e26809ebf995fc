//! Independent ICRC evidence: `tests/data/scapy_roce.pcap` holds RoCEv2
//! packets over IPv4 and IPv6 whose ICRC scapy computed
//! (`tests/data/gen_scapy.py`, run once by hand, not by CI). Read with our
//! pcap reader, frame parser and packet parser, every ICRC must verify
//! exactly, the IPv4 IDs must be recovered from the ICRC alone, and every
//! frame must be rebuilt byte for byte by our frame builder.

use core::net::IpAddr;
use uroce_wire::frame::{build_roce_frame, parse_frame, FrameParams, IpParams, LinkType};
use uroce_wire::icrc::{self, IpContext, IpFields, IPV4_DF};
use uroce_wire::pcap::CaptureReader;
use uroce_wire::{packet, Opcode};

const CAPTURE: &[u8] = include_bytes!("data/scapy_roce.pcap");

/// Opcode, payload length, pad, and for IPv4 (ident, flags/fragment).
type Expected = (Opcode, usize, u8, Option<(u16, u16)>);

const EXPECTED: [Expected; 9] = [
    (Opcode::RC_SEND_ONLY, 3, 1, Some((0xec3b, IPV4_DF))),
    (Opcode::RC_RDMA_WRITE_FIRST, 16, 0, Some((0x1234, 0))),
    (Opcode::RC_ACKNOWLEDGE, 0, 0, Some((0xc105, IPV4_DF))),
    (
        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        6,
        2,
        Some((0xffff, IPV4_DF)),
    ),
    (Opcode::CNP, 0, 0, Some((0x8001, IPV4_DF))),
    (Opcode::RC_SEND_ONLY, 5, 3, None),
    (Opcode::RC_RDMA_READ_RESPONSE_ONLY, 7, 1, None),
    (Opcode::UD_SEND_ONLY, 2, 2, None),
    (Opcode::CNP, 0, 0, None),
];

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The parameters that rebuild a parsed frame.
fn params_of(frame: &[u8], f: &uroce_wire::frame::Frame<'_>) -> FrameParams {
    let mut dst_mac = [0u8; 6];
    let mut src_mac = [0u8; 6];
    dst_mac.copy_from_slice(&frame[..6]);
    src_mac.copy_from_slice(&frame[6..12]);
    let h = f.ip_header;
    let ip = match (f.src, f.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpParams::V4 {
            src,
            dst,
            ident: be16(h, 4),
            dont_fragment: be16(h, 6) == IPV4_DF,
            tos: h[1],
            ttl: h[8],
        },
        (IpAddr::V6(src), IpAddr::V6(dst)) => IpParams::V6 {
            src,
            dst,
            traffic_class: (h[0] << 4) | (h[1] >> 4),
            flow_label: u32::from_be_bytes([0, h[1] & 0x0f, h[2], h[3]]),
            hop_limit: h[7],
        },
        _ => panic!("mixed IP versions"),
    };
    FrameParams {
        src_mac,
        dst_mac,
        ip,
        src_port: f.src_port,
        dst_port: f.dst_port,
        udp_checksum: be16(f.udp_header, 6) != 0,
    }
}

#[test]
fn scapy_icrcs_verify_exactly() {
    let mut reader = CaptureReader::new(CAPTURE).expect("pcap header");
    let mut n = 0;
    while let Some(rec) = reader.next_record() {
        let rec = rec.expect("record");
        let (op, len, pad, v4) = EXPECTED[n];
        n += 1;
        assert_eq!(rec.index, n as u64);
        assert_eq!(rec.link, LinkType::Ethernet);
        let f = parse_frame(rec.link, rec.data)
            .expect("frame")
            .expect("RoCEv2");
        assert_eq!(f.dst_port, 4791);

        // Exact: over the frame's own IP and UDP headers.
        let stored = icrc::stored(f.payload).expect("ICRC");
        assert_eq!(f.compute_icrc(), Ok(stored), "frame {n}");
        f.verify_icrc().expect("ICRC");
        // The same through the context built from the frame.
        let p = packet::parse_verified(f.payload, &f.ip_context()).expect("packet");
        assert_eq!(p.bth.opcode, op, "frame {n}");
        assert_eq!(p.payload.len(), len, "frame {n}");
        assert_eq!(p.bth.pad, pad, "frame {n}");
        assert_eq!(p.icrc, stored);
        if n == 1 {
            // shared/roce-check/ICRC.md example 1
            assert_eq!(stored, 0x8847_ddea);
        }

        // Any flipped bit outside the masked fields breaks it.
        let mut bad = f.payload.to_vec();
        bad[5] ^= 0x01; // DestQP
        assert!(icrc::compute_with_ip_header(f.ip_header, f.udp_header, &bad) != Ok(stored));

        match (v4, f.ip_context().ip) {
            (Some((ident, flags_frag)), IpFields::V4 { src, dst, .. }) => {
                assert_eq!(f.ipv4_ident(), Some((ident, flags_frag)));
                // A UDP socket does not see the ID: solve for it.
                let ctx = IpContext::for_socket_v4(src, dst, f.src_port, f.dst_port);
                let sol = icrc::verify_unknown_ipv4_id(&ctx, f.payload).expect("ID solved");
                assert_eq!(
                    (sol.ident, sol.flags_frag),
                    (ident, flags_frag),
                    "frame {n}"
                );
                let sol = p.verify_icrc_socket(&ctx).expect("ID solved");
                assert_eq!(sol.ident, ident);
            }
            (None, IpFields::V6 { .. }) => assert_eq!(f.ipv4_ident(), None),
            (want, got) => panic!("frame {n}: expected {want:?}, got {got:?}"),
        }

        // Our builder produces scapy's frame byte for byte (IP header
        // checksum, UDP checksum or 0, pad, ICRC).
        let params = params_of(rec.data, &f);
        assert_eq!(params.ip_context(), f.ip_context());
        let mut buf = [0u8; 256];
        let m = build_roce_frame(&params, &p.headers(), p.payload, &mut buf).expect("build");
        assert_eq!(&buf[..m], rec.data, "frame {n} rebuilt");
    }
    assert_eq!(n, EXPECTED.len());
}
