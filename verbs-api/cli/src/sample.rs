//! `uroce sample-pcap`: a capture holding one packet of every opcode in
//! the opcode table, over IPv4 and/or IPv6, with realistic header values.
//!
//! Two hosts talk: A (the requester, sending like uroce's engine: IPv4 ID
//! 0 with DF, UDP checksum computed) and B (the responder, sending like
//! kernel rxe: a counting IPv4 ID, UDP checksum 0 over IPv4). Requests go
//! from A to B, responses (ACKs, READ responses, atomic ACKs) and the CNP
//! from B to A. *_FIRST and *_MIDDLE packets carry a full 256-byte path
//! MTU; the others carry small payloads whose lengths cover pad 0..=3.

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;
use uroce_wire::frame::{self, FrameParams, IpParams};
use uroce_wire::opcode::{Operation, Position, Transport};
use uroce_wire::pcap::{CaptureError, CaptureWriter};
use uroce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Headers, Opcode,
    OpcodeInfo, Psn, RethRepr,
};

/// IP version of a sample capture's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Host A's IPv4 address (the requester).
pub const A_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
/// Host B's IPv4 address (the responder).
pub const B_V4: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
/// Host A's IPv6 address.
pub const A_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5e, 0, 0, 0, 0, 0, 1);
/// Host B's IPv6 address.
pub const B_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5e, 0, 0, 0, 0, 0, 2);
/// A's QP number.
pub const QPN_A: u32 = 0x00_0011;
/// B's QP number.
pub const QPN_B: u32 = 0x00_0012;
/// The UD QP the UD sends go to.
pub const QPN_UD: u32 = 0x00_0013;
/// The Q_Key of the UD sends (rdma-core's ibv_ud_pingpong's).
pub const QKEY: u32 = 0x1111_1111;
/// Path MTU of the multi-packet messages: payload of *_FIRST/*_MIDDLE.
pub const PMTU: usize = 256;

const MAC_A: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x00, 0x01];
const MAC_B: [u8; 6] = [0x02, 0x00, 0x5e, 0x00, 0x00, 0x02];
const SPORT_A: u16 = 0xc0d1;
const SPORT_B: u16 = 0xd3a2;
const RKEY: u32 = 0x8f3a_17c5;
const VA: u64 = 0x0000_7f3a_2c40_1000;
const FIRST_PSN: u32 = 0x3a_5b1c;
/// Payload lengths of the packets that end a message, in turn: every
/// pad value 0..=3 comes up several times.
const SHORT_LENGTHS: [usize; 8] = [1, 6, 11, 16, 33, 2, 7, 4];

/// One sample packet: which host sends it, its headers and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplePacket {
    /// Sent by A (requests) rather than B (responses, CNP).
    pub from_a: bool,
    /// The RoCEv2 headers.
    pub headers: Headers,
    /// The payload (pad not included).
    pub payload: Vec<u8>,
}

/// One packet of every opcode of the table, in numeric order.
pub fn sample_packets() -> Vec<SamplePacket> {
    let mut out = Vec::new();
    let mut short = SHORT_LENGTHS.iter().cycle();
    let mut psn = FIRST_PSN;
    let mut msn = 1u32;
    for (i, info) in Opcode::all().enumerate() {
        let from_a = info.is_request && info.transport != Transport::Cnp;
        let len = if !info.has_payload {
            0
        } else if info.operation == uroce_wire::Operation::AtomicWrite {
            8
        } else if matches!(info.position, Position::First | Position::Middle) {
            PMTU
        } else {
            *short.next().unwrap_or(&1)
        };
        let payload: Vec<u8> = (0..len).map(|k| (k * 7 + i * 13 + 0x20) as u8).collect();
        let mut h = Headers::new(bth_for(info, psn));
        fill_extensions(&mut h, info, len, msn, i);
        out.push(SamplePacket {
            from_a,
            headers: h,
            payload,
        });
        psn = (psn + 1) & 0x00ff_ffff;
        if info.position.ends_message() {
            msn += 1;
        }
    }
    out
}

fn bth_for(info: &OpcodeInfo, psn: u32) -> BthRepr {
    let cnp = info.transport == Transport::Cnp;
    let from_a = info.is_request && !cnp;
    BthRepr {
        opcode: Opcode(info.code),
        // Solicited event on the last packet of SENDs with immediate.
        se: info.operation == Operation::Send && info.has_imm(),
        // MigReq: 1 (migrated: no APM) on connected QPs, as NICs send it.
        migreq: matches!(info.transport, Transport::Rc | Transport::Uc),
        pad: 0,
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: cnp,
        dest_qp: match (info.transport, from_a) {
            (Transport::Ud, _) => QPN_UD,
            (_, true) => QPN_B,
            (_, false) => QPN_A,
        },
        ack_req: info.is_request
            && matches!(info.transport, Transport::Rc | Transport::Uc)
            && info.position.ends_message(),
        psn: Psn::new(if cnp { 0 } else { psn }),
    }
}

fn fill_extensions(h: &mut Headers, info: &OpcodeInfo, len: usize, msn: u32, i: usize) {
    use uroce_wire::Ext;
    for &ext in info.headers {
        match ext {
            Ext::Feth => {
                h.feth = Some(uroce_wire::FethRepr {
                    placement: uroce_wire::feth::FLUSH_GLOBAL,
                    selectivity: uroce_wire::feth::FLUSH_RANGE,
                })
            }
            Ext::Reth => {
                let dma_len = match (info.operation, info.position) {
                    (Operation::RdmaReadRequest, _) => 3 * PMTU as u32 + 100,
                    (_, Position::First) => 2 * PMTU as u32 + 37,
                    _ => len as u32,
                };
                h.reth = Some(RethRepr {
                    va: VA + (i as u64) * 0x1000,
                    rkey: RKEY,
                    dma_len,
                });
            }
            Ext::Aeth => {
                h.aeth = Some(AethRepr {
                    syndrome: AethSyndrome::Ack { credits: 0x1f },
                    msn,
                })
            }
            Ext::AtomicEth => {
                let (swap_add, compare) = if info.operation == Operation::CompareSwap {
                    (0xdead_beef_0000_0002, 0x0000_0000_0000_0001)
                } else {
                    (5, 0)
                };
                h.atomic_eth = Some(AtomicEthRepr {
                    va: VA + 0x8000,
                    rkey: RKEY,
                    swap_add,
                    compare,
                });
            }
            Ext::AtomicAckEth => {
                h.atomic_ack = Some(AtomicAckEthRepr {
                    orig: 0x0000_0000_0000_002a,
                })
            }
            Ext::Deth => {
                h.deth = Some(DethRepr {
                    qkey: QKEY,
                    src_qp: QPN_A,
                })
            }
            Ext::ImmDt => h.imm = Some(0x1234_5600 | i as u32),
            Ext::Ieth => h.ieth = Some(RKEY),
            Ext::CnpReserved => {}
        }
    }
}

fn params(family: Family, from_a: bool, ident: u16) -> FrameParams {
    let (src_mac, dst_mac, sport) = if from_a {
        (MAC_A, MAC_B, SPORT_A)
    } else {
        (MAC_B, MAC_A, SPORT_B)
    };
    match family {
        Family::V4 => {
            let (src, dst) = if from_a { (A_V4, B_V4) } else { (B_V4, A_V4) };
            FrameParams {
                ip: IpParams::V4 {
                    src,
                    dst,
                    ident: if from_a { 0 } else { ident },
                    dont_fragment: true,
                    tos: 0x6a, // DSCP 26, ECT(0)
                    ttl: 64,
                },
                // kernel rxe sends UDP checksum 0
                udp_checksum: from_a,
                ..FrameParams::v4(src_mac, dst_mac, src, dst, 0, sport)
            }
        }
        Family::V6 => {
            let (src, dst) = if from_a { (A_V6, B_V6) } else { (B_V6, A_V6) };
            let mut p = FrameParams::v6(src_mac, dst_mac, src, dst, sport);
            if let IpParams::V6 {
                traffic_class,
                flow_label,
                ..
            } = &mut p.ip
            {
                *traffic_class = 0x6a;
                *flow_label = if from_a { 0x2c0d1 } else { 0x3d3a2 };
            }
            p
        }
    }
}

/// Why a sample capture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// A sample packet could not be built (a bug in this module).
    #[error("building {opcode}: {error}")]
    Build {
        /// The packet's opcode.
        opcode: Opcode,
        /// The codec's error.
        error: uroce_wire::Error,
    },
    /// The capture could not be written.
    #[error("{0}")]
    Write(#[from] CaptureError),
}

/// The Ethernet frames of [`sample_packets`] for one IP version.
pub fn sample_frames(family: Family) -> Result<Vec<Vec<u8>>, SampleError> {
    let mut ident_b: u16 = 0xc105;
    let mut out = Vec::new();
    for s in sample_packets() {
        let p = params(family, s.from_a, ident_b);
        if !s.from_a {
            ident_b = ident_b.wrapping_add(1);
        }
        let mut buf = vec![0u8; p.header_len() + 512];
        let n = frame::build_roce_frame(&p, &s.headers, &s.payload, &mut buf).map_err(|error| {
            SampleError::Build {
                opcode: s.headers.bth.opcode,
                error,
            }
        })?;
        buf.truncate(n);
        out.push(buf);
    }
    Ok(out)
}

/// Writes the sample frames of each family in turn to `writer` as an
/// Ethernet pcap, 10 µs apart. Returns the number of frames.
pub fn write_sample<W: Write>(writer: W, families: &[Family]) -> Result<usize, SampleError> {
    let mut w = CaptureWriter::new(writer)?;
    let start = Duration::from_secs(1_700_000_000);
    let mut n = 0u32;
    for &f in families {
        for fr in sample_frames(f)? {
            w.write(start + Duration::from_micros(10) * n, &fr)?;
            n += 1;
        }
    }
    w.finish()?;
    Ok(n as usize)
}

/// Writes the sample capture to a file.
pub fn write_sample_pcap(path: &Path, families: &[Family]) -> Result<usize, SampleError> {
    let file = std::fs::File::create(path).map_err(CaptureError::from)?;
    write_sample(std::io::BufWriter::new(file), families)
}

/// The `uroce sample-pcap` command: IPv4 and IPv6 unless one is asked for.
pub fn run(path: &Path, ipv4: bool, ipv6: bool) -> ExitCode {
    let families: &[Family] = match (ipv4, ipv6) {
        (true, false) => &[Family::V4],
        (false, true) => &[Family::V6],
        _ => &[Family::V4, Family::V6],
    };
    match write_sample_pcap(path, families) {
        Ok(n) => {
            eprintln!(
                "uroce sample-pcap: wrote {n} frames ({} opcodes x {}) to {}",
                Opcode::all().count(),
                match families {
                    [Family::V4] => "IPv4",
                    [Family::V6] => "IPv6",
                    _ => "IPv4, IPv6",
                },
                path.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("uroce sample-pcap: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uroce_wire::frame::{parse_frame, LinkType};
    use uroce_wire::packet;

    #[test]
    fn every_opcode_every_pad_valid_icrc() {
        let mut pads = [0usize; 4];
        for fam in [Family::V4, Family::V6] {
            let frames = sample_frames(fam).unwrap();
            assert_eq!(frames.len(), Opcode::all().count());
            for (f, info) in frames.iter().zip(Opcode::all()) {
                let fr = parse_frame(LinkType::Ethernet, f).unwrap().unwrap();
                fr.verify_icrc().unwrap();
                let p = packet::parse_verified(fr.payload, &fr.ip_context()).unwrap();
                assert_eq!(p.info.code, info.code);
                pads[usize::from(p.bth.pad)] += 1;
                if matches!(info.position, Position::First | Position::Middle) {
                    assert_eq!(p.bth.pad, 0);
                }
            }
        }
        assert!(pads.iter().all(|&n| n > 0), "{pads:?}");
    }
}
