//! `uroce decode FILE`: every RoCEv2 packet (UDP port 4791, either
//! direction) of a pcap or pcapng capture as one JSON object per line.
//!
//! Keys are omitted when the packet has no such header; a malformed packet
//! still gets a line with what could be read (frame, addresses and ports
//! always, the BTH when its 12 bytes are there, the extension headers that
//! fit before the last four bytes) and an `error`. `icrc_ok` is exact: the
//! ICRC is recomputed over the frame's own IP and UDP headers. A bad ICRC
//! alone is not an `error`: the packet is well formed, `icrc_ok` is false.
//!
//! A UDP GSO message (uroce sends runs of equal-size packets so) crosses
//! `lo` and a veth as one IP packet holding several RoCE packets, and a
//! capture there holds it so. Such a super-packet is split: the segment
//! size is the one at which every piece's ICRC verifies over the headers
//! the kernel gives that piece when it segments the message (the lengths
//! of the piece, IPv4 identification counting up from the message's);
//! each piece gets its own line, with `gso` saying which piece of how many,
//! and a note on stderr says the frame was split.

use serde::Serialize;
use std::io::{self, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use uroce_wire::bth::{Bth, BTH_LEN};
use uroce_wire::frame::{parse_frame, Frame, LinkType};
use uroce_wire::pcap::{CaptureError, CaptureReader};
use uroce_wire::{
    icrc, packet, Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Deth,
    DethRepr, Ext, Headers, Ieth, ImmDt, Opcode, Reth, RethRepr, ICRC_LEN,
};

/// At most this many per-frame warnings are printed.
const MAX_WARNINGS: u64 = 20;
/// At most this many frames are named as GSO super-packets.
const MAX_GSO_NOTES: u64 = 5;

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RethJson {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length.
    pub dma_len: u32,
}

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AethJson {
    /// The raw syndrome byte.
    pub syndrome: u8,
    /// "ack", "rnr_nak", "nak" (or "reserved").
    pub kind: &'static str,
    /// Credit count, RNR timer code or NAK code.
    pub value: u8,
    /// Message sequence number.
    pub msn: u32,
}

/// AtomicETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AtomicEthJson {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (compare-swap) or add (fetch-add) data.
    pub swap_add: u64,
    /// Compare data.
    pub compare: u64,
}

/// AtomicAckETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AtomicAckJson {
    /// The original remote value.
    pub orig: u64,
}

/// DETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DethJson {
    /// Queue key.
    pub qkey: u32,
    /// Source QP.
    pub src_qp: u32,
}

/// IETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IethJson {
    /// The R_Key to invalidate.
    pub rkey: u32,
}

/// A FETH (RDMA FLUSH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FethJson {
    /// Placement type (1 global visibility, 2 persistence).
    pub placement: u8,
    /// Selectivity level (0 the RETH's range, 1 the whole region).
    pub selectivity: u8,
}

/// One output line: a RoCEv2 packet as `uroce decode` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PacketLine {
    /// Frame number in the capture, from 1.
    pub frame: u64,
    /// Source IP address.
    pub src: String,
    /// Destination IP address.
    pub dst: String,
    /// UDP source port.
    pub sport: u16,
    /// UDP destination port.
    pub dport: u16,
    /// BTH opcode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opcode: Option<u8>,
    /// The opcode's name in the table (absent for unknown opcodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opcode_name: Option<&'static str>,
    /// Solicited event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub se: Option<bool>,
    /// Migration request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migreq: Option<bool>,
    /// Pad count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad: Option<u8>,
    /// Transport header version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tver: Option<u8>,
    /// Partition key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pkey: Option<u16>,
    /// FECN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fecn: Option<bool>,
    /// BECN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub becn: Option<bool>,
    /// Destination QP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dest_qp: Option<u32>,
    /// AckReq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_req: Option<bool>,
    /// PSN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psn: Option<u32>,
    /// FETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feth: Option<FethJson>,
    /// RETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<RethJson>,
    /// AETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<AethJson>,
    /// AtomicETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_eth: Option<AtomicEthJson>,
    /// AtomicAckETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack: Option<AtomicAckJson>,
    /// DETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<DethJson>,
    /// Immediate data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imm: Option<u32>,
    /// IETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<IethJson>,
    /// Payload length, pad excluded (well-formed packets only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_len: Option<usize>,
    /// The stored ICRC as the spec defines it ([`packet::ParsedPacket::icrc`]:
    /// the last four bytes read little-endian).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc: Option<u32>,
    /// Whether the ICRC matches the frame's own IP and UDP headers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc_ok: Option<bool>,
    /// The CM MAD a packet to QP1 carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mad: Option<MadJson>,
    /// The piece of a UDP GSO super-packet this packet was (the frame
    /// held several RoCE packets; see the module docs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gso: Option<GsoJson>,
    /// Why the packet is malformed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where a packet lay in a UDP GSO super-packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GsoJson {
    /// Its place, from 0.
    pub index: usize,
    /// Packets in the super-packet.
    pub count: usize,
    /// The segment size: every packet's length but the last's.
    pub segment_size: usize,
}

/// A CM MAD's main fields (`uroce_wire::cm`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MadJson {
    /// The message (Wireshark's name), or why the MAD is not a CM MAD.
    pub msg: String,
    /// Transaction ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u64>,
    /// Sender's communication ID (SIDR: the request ID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_comm_id: Option<u32>,
    /// Receiver's communication ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_comm_id: Option<u32>,
    /// Service ID (REQ, SIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u64>,
    /// QPN the message carries (REQ, REP: the sender's; DREQ: the
    /// receiver's; SIDR_REP: the service's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    /// Starting PSN (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starting_psn: Option<u32>,
    /// REJ reason and its name; SIDR_REP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<u16>,
    /// The reason's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_name: Option<&'static str>,
    /// Bytes of private data up to the last non-zero one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_data_len: Option<usize>,
    /// The CMA header (rdma_cm's IP addresses and the active side's
    /// port), when the REQ or SIDR_REQ of an IP port space has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cma: Option<String>,
}

fn used(b: &[u8]) -> usize {
    b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1)
}

fn cma_of(service_id: u64, pd: &[u8]) -> Option<String> {
    use uroce_wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
    let (ps, port) = cma::parse_service_id(service_id)?;
    if ps == PortSpace::Ib {
        return None;
    }
    let h = CmaHeaderRepr::parse(&CmaHeader::new_checked(pd).ok()?).ok()?;
    Some(format!("{:?} {}:{} -> {}:{port}", ps, h.src, h.port, h.dst))
}

/// The CM MAD in a UD payload to QP 1.
pub fn mad_json(payload: &[u8]) -> MadJson {
    use uroce_wire::cm::{rej_reason_name, CmMad, CmMessage};
    let m = match CmMad::parse(payload) {
        Ok(m) => m,
        Err(e) => {
            return MadJson {
                msg: e.to_string(),
                ..MadJson::default()
            }
        }
    };
    let mut j = MadJson {
        msg: m.msg.attr().name().into(),
        tid: Some(m.tid),
        ..MadJson::default()
    };
    match &m.msg {
        CmMessage::Req(r) => {
            j.local_comm_id = Some(r.local_comm_id);
            j.service_id = Some(r.service_id);
            j.qpn = Some(r.local_qpn);
            j.starting_psn = Some(r.starting_psn);
            j.private_data_len = Some(used(&r.private_data));
            j.cma = cma_of(r.service_id, &r.private_data);
        }
        CmMessage::Rep(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
            j.qpn = Some(r.local_qpn);
            j.starting_psn = Some(r.starting_psn);
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::Rej(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
            j.reason = Some(r.reason);
            j.reason_name = Some(rej_reason_name(r.reason));
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::Mra(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
        }
        CmMessage::Rtu(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::Dreq(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
            j.qpn = Some(r.remote_qpn);
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::Drep(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::SidrReq(r) => {
            j.local_comm_id = Some(r.request_id);
            j.service_id = Some(r.service_id);
            j.private_data_len = Some(used(&r.private_data));
            j.cma = cma_of(r.service_id, &r.private_data);
        }
        CmMessage::SidrRep(r) => {
            j.local_comm_id = Some(r.request_id);
            j.service_id = Some(r.service_id);
            j.qpn = Some(r.qpn);
            j.reason = Some(r.status.into());
            j.private_data_len = Some(used(&r.private_data));
        }
        CmMessage::Lap(r) | CmMessage::Apr(r) => {
            (j.local_comm_id, j.remote_comm_id) = (Some(r.local_comm_id), Some(r.remote_comm_id));
        }
    }
    j
}

impl PacketLine {
    fn set_headers(&mut self, h: &Headers) {
        self.feth = h.feth.map(|f| FethJson {
            placement: f.placement,
            selectivity: f.selectivity,
        });
        self.reth = h.reth.map(reth_json);
        self.aeth = h.aeth.map(aeth_json);
        self.atomic_eth = h.atomic_eth.map(atomic_json);
        self.atomic_ack = h.atomic_ack.map(|a| AtomicAckJson { orig: a.orig });
        self.deth = h.deth.map(deth_json);
        self.imm = h.imm;
        self.ieth = h.ieth.map(|rkey| IethJson { rkey });
    }
}

fn reth_json(r: RethRepr) -> RethJson {
    RethJson {
        va: r.va,
        rkey: r.rkey,
        dma_len: r.dma_len,
    }
}

fn aeth_json(a: AethRepr) -> AethJson {
    AethJson {
        syndrome: a.syndrome.to_byte(),
        kind: a.syndrome.kind(),
        value: a.syndrome.value(),
        msn: a.msn,
    }
}

fn atomic_json(a: AtomicEthRepr) -> AtomicEthJson {
    AtomicEthJson {
        va: a.va,
        rkey: a.rkey,
        swap_add: a.swap_add,
        compare: a.compare,
    }
}

fn deth_json(d: DethRepr) -> DethJson {
    DethJson {
        qkey: d.qkey,
        src_qp: d.src_qp,
    }
}

/// Decodes the RoCEv2 packet a frame carries into an output line.
pub fn packet_line(frame_no: u64, f: &Frame<'_>) -> PacketLine {
    let bytes = f.payload;
    let mut line = PacketLine {
        frame: frame_no,
        src: f.src.to_string(),
        dst: f.dst.to_string(),
        sport: f.src_port,
        dport: f.dst_port,
        ..PacketLine::default()
    };
    if let Ok(bth) = Bth::new_checked(bytes) {
        line.opcode = Some(bth.opcode().0);
        line.opcode_name = bth.opcode().info().map(|i| i.name);
        line.se = Some(bth.se());
        line.migreq = Some(bth.migreq());
        line.pad = Some(bth.pad());
        line.tver = Some(bth.tver());
        line.pkey = Some(bth.pkey());
        line.fecn = Some(bth.fecn());
        line.becn = Some(bth.becn());
        line.dest_qp = Some(bth.dest_qp());
        line.ack_req = Some(bth.ack_req());
        line.psn = Some(bth.psn().value());
    }
    if let Some(stored) = icrc::stored(bytes).filter(|_| bytes.len() >= BTH_LEN + ICRC_LEN) {
        line.icrc = Some(stored);
        line.icrc_ok = f.compute_icrc().ok().map(|c| c == stored);
    }
    match packet::parse(bytes) {
        Ok(p) => {
            line.set_headers(&p.headers());
            line.payload_len = Some(p.payload.len());
            if p.bth.dest_qp == uroce_wire::mad::GSI_QPN && p.deth().is_some() {
                line.mad = Some(mad_json(p.payload));
            }
        }
        Err(e) => {
            line.error = Some(e.to_string());
            if let Some(op) = line.opcode {
                line.set_headers(&readable_extensions(Opcode(op), bytes));
            }
        }
    }
    line
}

/// The IP and UDP headers the kernel gives piece `k` (of `len` bytes) when
/// it segments the UDP GSO message `f` holds: the lengths of the piece,
/// and for IPv4 the identification `k` past the message's (checksums are
/// not covered by the ICRC and left as they are).
fn piece_headers(f: &Frame<'_>, k: usize, len: usize) -> (Vec<u8>, [u8; 8]) {
    let mut ip = f.ip_header.to_vec();
    let udp_len = (8 + len) as u16;
    match f.ipv4_ident() {
        Some((ident, _)) => {
            let ihl = ip.len() as u16;
            ip[2..4].copy_from_slice(&(ihl + udp_len).to_be_bytes());
            ip[4..6].copy_from_slice(&ident.wrapping_add(k as u16).to_be_bytes());
        }
        None => ip[4..6].copy_from_slice(&udp_len.to_be_bytes()),
    }
    let mut udp = [0u8; 8];
    udp.copy_from_slice(&f.udp_header[..8]);
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    (ip, udp)
}

/// Whether piece `k` of super-packet `f` carries a good ICRC for the
/// headers the kernel gives it.
fn piece_verifies(f: &Frame<'_>, k: usize, piece: &[u8]) -> bool {
    let (ip, udp) = piece_headers(f, k, piece.len());
    icrc::stored(piece).is_some_and(|stored| {
        icrc::compute_with_ip_header(&ip, &udp, piece).is_ok_and(|c| c == stored)
    })
}

/// The segment size at which the UDP payload of `f` is a UDP GSO message
/// of two or more RoCE packets, each with a good ICRC, if there is one:
/// the pieces are `seg` bytes long but the last, which has the rest.
/// Candidates are cheap to reject: RoCE packets are whole 32-bit words,
/// and a second piece starts with a BTH of a known opcode to the same
/// QP; only those are checked by their ICRCs.
pub fn gso_segment_size(f: &Frame<'_>) -> Option<usize> {
    let b = f.payload;
    let min = BTH_LEN + ICRC_LEN;
    if b.len() % 4 != 0 || b.len() < 2 * min {
        return None;
    }
    let qp = Bth::new_checked(b).ok()?.dest_qp();
    (min..=b.len() - min).step_by(4).find(|&seg| {
        let last = b.len() - (b.len() - 1) / seg * seg;
        let second = Bth::new_checked(&b[seg..]).ok();
        last >= min
            && second.is_some_and(|s| s.dest_qp() == qp && s.opcode().info().is_some())
            && b.chunks(seg)
                .enumerate()
                .all(|(k, p)| piece_verifies(f, k, p))
    })
}

/// The lines of a frame: one, or one per piece of a UDP GSO super-packet
/// (a frame whose payload is not one good RoCE packet, and splits into
/// several at a segment size, [`gso_segment_size`]), each piece decoded
/// over the headers the kernel gives it.
pub fn frame_lines(frame_no: u64, f: &Frame<'_>) -> Vec<PacketLine> {
    let whole = packet_line(frame_no, f);
    if whole.error.is_none() && whole.icrc_ok != Some(false) {
        return vec![whole];
    }
    let Some(seg) = gso_segment_size(f) else {
        return vec![whole];
    };
    let count = f.payload.len().div_ceil(seg);
    f.payload
        .chunks(seg)
        .enumerate()
        .map(|(index, piece)| {
            let (ip, udp) = piece_headers(f, index, piece.len());
            let pf = Frame {
                ip_header: &ip,
                udp_header: &udp,
                payload: piece,
                ..*f
            };
            PacketLine {
                gso: Some(GsoJson {
                    index,
                    count,
                    segment_size: seg,
                }),
                ..packet_line(frame_no, &pf)
            }
        })
        .collect()
}

/// The extension headers of a malformed packet that lie whole before its
/// last four bytes (which may or may not be an ICRC).
fn readable_extensions(op: Opcode, bytes: &[u8]) -> Headers {
    let mut h = Headers::default();
    let Some(info) = op.info() else {
        return h;
    };
    let limit = bytes.len().saturating_sub(ICRC_LEN);
    let mut off = BTH_LEN;
    for &ext in info.headers {
        let Some(b) = bytes
            .get(off..off + ext.len())
            .filter(|_| off + ext.len() <= limit)
        else {
            break;
        };
        match ext {
            Ext::Deth => h.deth = DethRepr::parse(&Deth::new_unchecked(b)).ok(),
            Ext::Feth => {
                h.feth = uroce_wire::FethRepr::parse(&uroce_wire::Feth::new_unchecked(b)).ok()
            }
            Ext::Reth => h.reth = RethRepr::parse(&Reth::new_unchecked(b)).ok(),
            Ext::AtomicEth => {
                h.atomic_eth = AtomicEthRepr::parse(&AtomicEth::new_unchecked(b)).ok()
            }
            Ext::Aeth => h.aeth = AethRepr::parse(&Aeth::new_unchecked(b)).ok(),
            Ext::AtomicAckEth => {
                h.atomic_ack = AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(b)).ok()
            }
            Ext::ImmDt => h.imm = Some(ImmDt::new_unchecked(b).imm()),
            Ext::Ieth => h.ieth = Some(Ieth::new_unchecked(b).rkey()),
            Ext::CnpReserved => {}
        }
        off += ext.len();
    }
    h
}

/// What a decode run saw.
#[derive(Debug, Default)]
pub struct DecodeReport {
    /// Frames read.
    pub frames: u64,
    /// RoCEv2 packets printed.
    pub packets: u64,
    /// Of those, malformed (with an `error`).
    pub malformed: u64,
    /// Of those, with a wrong ICRC.
    pub bad_icrc: u64,
    /// Frames that were UDP GSO super-packets, split into their packets.
    pub gso_frames: u64,
    /// Frames that are not UDP to or from port 4791.
    pub skipped: u64,
    /// Frames that could not be parsed down to UDP (warned about).
    pub undecodable: u64,
    /// The error that stopped reading before the end of the file, if any.
    pub read_error: Option<CaptureError>,
}

/// Decodes every frame of `reader`, writing one JSON line per RoCEv2
/// packet to `out` and calling `warn` for frames that cannot be parsed.
/// Fails only when writing to `out` fails; a capture that stops being
/// readable ends the run with [`DecodeReport::read_error`] set.
pub fn decode<R: Read, W: Write>(
    reader: &mut CaptureReader<R>,
    out: &mut W,
    warn: &mut dyn FnMut(String),
) -> io::Result<DecodeReport> {
    let mut rep = DecodeReport::default();
    while let Some(rec) = reader.next_record() {
        let rec = match rec {
            Ok(rec) => rec,
            Err(e @ CaptureError::UnknownInterface { .. }) => {
                rep.frames += 1;
                rep.undecodable += 1;
                warn(e.to_string());
                continue;
            }
            Err(e) => {
                rep.read_error = Some(e);
                break;
            }
        };
        rep.frames += 1;
        match parse_frame(rec.link, rec.data) {
            Ok(Some(f)) => {
                let lines = frame_lines(rec.index, &f);
                if let Some(g) = lines.first().and_then(|l| l.gso) {
                    rep.gso_frames += 1;
                    // A note for the first few; the summary counts them all.
                    if rep.gso_frames <= MAX_GSO_NOTES {
                        warn(format!(
                            "frame {}: GSO super-packet: {} RoCE packets of {} bytes, decoded \
                             one by one",
                            rec.index, g.count, g.segment_size
                        ));
                    }
                }
                for line in lines {
                    rep.packets += 1;
                    rep.malformed += u64::from(line.error.is_some());
                    rep.bad_icrc += u64::from(line.icrc_ok == Some(false));
                    serde_json::to_writer(&mut *out, &line)?;
                    out.write_all(b"\n")?;
                }
            }
            Ok(None) => rep.skipped += 1,
            Err(e) => {
                rep.undecodable += 1;
                warn(format!("frame {}: not decoded: {e}", rec.index));
            }
        }
    }
    Ok(rep)
}

/// The `uroce decode` command. Exit status 0 when the whole file was read,
/// whatever its packets held; 1 when it cannot be read.
pub fn run(path: &Path) -> ExitCode {
    let name = path.display();
    let mut reader = match CaptureReader::open(path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uroce decode: {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(LinkType::Other(n)) = reader.pcap_link_type() {
        eprintln!(
            "uroce decode: {name}: link type {n} is not supported \
             (Ethernet, Linux SLL, Linux SLL2 and raw IP are)"
        );
        return ExitCode::FAILURE;
    }
    let mut warned = 0u64;
    let mut warn = |m: String| {
        if warned < MAX_WARNINGS {
            eprintln!("uroce decode: {m}");
        } else if warned == MAX_WARNINGS {
            eprintln!("uroce decode: (further warnings not shown)");
        }
        warned += 1;
    };
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let rep = match decode(&mut reader, &mut out, &mut warn).and_then(|r| out.flush().map(|()| r)) {
        Ok(rep) => rep,
        // `uroce decode x.pcap | head`: not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uroce decode: writing the output: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "uroce decode: {} frames: {} RoCEv2 packets ({} malformed, {} with a bad ICRC), \
         {} other frames, {} not decodable",
        rep.frames, rep.packets, rep.malformed, rep.bad_icrc, rep.skipped, rep.undecodable
    );
    if rep.gso_frames > 0 {
        eprintln!(
            "uroce decode: {} frames were UDP GSO super-packets (several RoCE packets in one \
             IP packet, as a capture on lo or a veth shows uroce's GSO sends), split into \
             their packets; UROCE_PCAP=FILE, or UROCE_GSO=0, captures one packet per frame",
            rep.gso_frames
        );
    }
    match rep.read_error {
        Some(e) => {
            eprintln!(
                "uroce decode: {name}: stopped after frame {}: {e}",
                rep.frames
            );
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use uroce_wire::frame::{build_roce_frame, FrameParams};
    use uroce_wire::{AethSyndrome, BthRepr, NakCode, Psn};

    fn frame_of(h: &Headers, payload: &[u8]) -> Vec<u8> {
        let p = FrameParams::v4(
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            0x1234,
            0xc001,
        );
        let mut buf = vec![0u8; 512];
        let n = build_roce_frame(&p, h, payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    fn line_of(bytes: &[u8]) -> PacketLine {
        let f = parse_frame(LinkType::Ethernet, bytes).unwrap().unwrap();
        packet_line(3, &f)
    }

    /// A REQ to QP1 with rdma_cm's CMA header decodes to its fields.
    #[test]
    fn cm_mad_line() {
        use uroce_wire::cm::{CmMad, CmMessage, ReqRepr};
        use uroce_wire::cma::{self, CmaHeader, CmaHeaderRepr, PortSpace};
        use uroce_wire::DethRepr;
        let mut req = ReqRepr {
            local_comm_id: 0x1234,
            service_id: cma::service_id(PortSpace::Tcp, 7471),
            local_qpn: 0x11,
            starting_psn: 0x22,
            ..ReqRepr::default()
        };
        CmaHeaderRepr {
            port: 40000,
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
        }
        .emit(&mut CmaHeader::new_unchecked(&mut req.private_data[..36]))
        .unwrap();
        req.private_data[36..38].copy_from_slice(b"hi");
        let mut mad = [0u8; 256];
        CmMad {
            tid: 9,
            msg: CmMessage::Req(req),
        }
        .emit(&mut mad)
        .unwrap();
        let mut h = Headers::new(BthRepr {
            opcode: Opcode::UD_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: 1,
            ..BthRepr::default()
        });
        h.deth = Some(DethRepr {
            qkey: uroce_wire::mad::GSI_QKEY,
            src_qp: 1,
        });
        let l = line_of(&frame_of(&h, &mad));
        let m = l.mad.expect("a MAD");
        assert_eq!(m.msg, "ConnectRequest");
        assert_eq!((m.tid, m.local_comm_id), (Some(9), Some(0x1234)));
        assert_eq!((m.qpn, m.starting_psn), (Some(0x11), Some(0x22)));
        assert_eq!(m.service_id, Some(0x0106_1d2f));
        assert_eq!(m.private_data_len, Some(38));
        assert_eq!(
            m.cma.as_deref(),
            Some("Tcp 10.0.0.1:40000 -> 10.0.0.2:7471")
        );
        // Not a CM MAD: said so.
        mad[1] = 0x04;
        let l = line_of(&frame_of(&h, &mad));
        assert!(l.mad.unwrap().msg.contains("not the CM class"));
    }

    /// Three packets of a SEND (FIRST and MIDDLE of 256 payload bytes,
    /// LAST of 100) as a UDP GSO message shows them on `lo`: one frame,
    /// IPv4 identification 0x4000 for the message, the packets' ICRCs
    /// computed for identifications 0x4000, 0x4001, 0x4002.
    fn super_packet() -> Vec<u8> {
        use uroce_wire::icrc::{IpContext, IpFields, IPV4_DF};
        let (src, dst) = (Ipv4Addr::new(127, 118, 0, 1), Ipv4Addr::new(127, 118, 0, 2));
        let ops = [
            (Opcode::RC_SEND_FIRST, 256),
            (Opcode::RC_SEND_MIDDLE, 256),
            (Opcode::RC_SEND_LAST, 100),
        ];
        let mut udp = Vec::new();
        for (k, (op, len)) in ops.into_iter().enumerate() {
            let h = Headers::new(BthRepr {
                opcode: op,
                pkey: 0xffff,
                dest_qp: 0x1234,
                psn: Psn::new(0xfffffe + k as u32),
                ..BthRepr::default()
            });
            let ctx = IpContext {
                ip: IpFields::V4 {
                    src,
                    dst,
                    ident: 0x4000 + k as u16,
                    flags_frag: IPV4_DF,
                },
                src_port: 4791,
                dst_port: 4791,
            };
            let mut buf = vec![0u8; 512];
            let hdr = packet::emit_headers(&h, len, &mut buf).unwrap();
            buf[hdr..hdr + len].fill(k as u8 + 1);
            let n = packet::finish(&mut buf, hdr, len, &ctx).unwrap();
            udp.extend_from_slice(&buf[..n]);
        }
        let p = FrameParams::v4([0; 6], [0; 6], src, dst, 0x4000, 4791);
        let mut frame = vec![0u8; 2048];
        let n = uroce_wire::frame::build_frame(&p, &udp, &mut frame).unwrap();
        frame.truncate(n);
        frame
    }

    #[test]
    fn a_gso_super_packet_is_split_where_every_icrc_verifies() {
        let frame = super_packet();
        let f = parse_frame(LinkType::Ethernet, &frame).unwrap().unwrap();
        let whole = packet_line(1, &f);
        assert_eq!(whole.icrc_ok, Some(false), "whole, its ICRC is wrong");
        assert_eq!(gso_segment_size(&f), Some(12 + 256 + 4));
        let lines = frame_lines(1, &f);
        assert_eq!(lines.len(), 3);
        for (k, l) in lines.iter().enumerate() {
            assert_eq!(l.error, None, "{l:?}");
            assert_eq!(l.icrc_ok, Some(true), "{l:?}");
            assert_eq!(l.psn, Some((0xfffffe + k as u32) & 0xffffff));
            assert_eq!(
                l.gso,
                Some(GsoJson {
                    index: k,
                    count: 3,
                    segment_size: 272
                })
            );
        }
        assert_eq!(lines[2].payload_len, Some(100));
        let v = serde_json::to_value(&lines[1]).unwrap();
        assert_eq!(v["gso"]["segment_size"], 272);

        // One bad ICRC in a piece: no segment size fits, the frame stays
        // one malformed line.
        let mut bad = frame.clone();
        let at = bad.len() - 100;
        bad[at] ^= 1;
        let f = parse_frame(LinkType::Ethernet, &bad).unwrap().unwrap();
        assert_eq!(gso_segment_size(&f), None);
        let lines = frame_lines(1, &f);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].icrc_ok == Some(false) && lines[0].gso.is_none());
    }

    #[test]
    fn nak_line() {
        let mut h = Headers::new(BthRepr {
            opcode: Opcode::RC_ACKNOWLEDGE,
            pkey: 0xffff,
            dest_qp: 0xabcdef,
            psn: Psn::new(0xffffff),
            ..BthRepr::default()
        });
        h.aeth = Some(AethRepr {
            syndrome: AethSyndrome::Nak(NakCode::RemoteAccessError),
            msn: 77,
        });
        let l = line_of(&frame_of(&h, &[]));
        assert_eq!(
            l.aeth,
            Some(AethJson {
                syndrome: 0x62,
                kind: "nak",
                value: 2,
                msn: 77
            })
        );
        assert_eq!(l.icrc_ok, Some(true));
        assert_eq!(l.payload_len, Some(0));
        assert_eq!(l.error, None);
        let v = serde_json::to_value(&l).unwrap();
        assert_eq!(v["psn"], 0xffffff);
        assert!(v.get("reth").is_none());
    }

    #[test]
    fn malformed_keeps_what_it_can() {
        let mut h = Headers::new(BthRepr {
            opcode: Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
            pkey: 0xffff,
            dest_qp: 5,
            ..BthRepr::default()
        });
        h.reth = Some(RethRepr {
            va: u64::MAX,
            rkey: 9,
            dma_len: 3,
        });
        h.imm = Some(0xfeed);
        let f = frame_of(&h, &[1, 2, 3]);
        // one more byte before the ICRC: headers all there, payload area
        // not a multiple of 4
        let mut udp = f[42..].to_vec();
        udp.insert(udp.len() - 4, 0);
        let p = FrameParams::v4(
            [0; 6],
            [0; 6],
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::LOCALHOST,
            0,
            4791,
        );
        let mut buf = vec![0u8; 128];
        let n = uroce_wire::frame::build_frame(&p, &udp, &mut buf).unwrap();
        let l = line_of(&buf[..n]);
        assert!(l.error.as_deref().unwrap_or("").contains("pad"), "{l:?}");
        assert_eq!(l.reth.map(|r| r.va), Some(u64::MAX));
        assert_eq!(l.imm, Some(0xfeed));
        assert_eq!(l.payload_len, None);
        assert_eq!(l.icrc_ok, Some(false));
        // 10 bytes of UDP payload: no BTH
        let n = uroce_wire::frame::build_frame(&p, &[4; 10], &mut buf).unwrap();
        let l = line_of(&buf[..n]);
        assert_eq!(l.opcode, None);
        assert_eq!(l.icrc, None);
        assert!(l.error.is_some());
        let v = serde_json::to_value(&l).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
    }
}
