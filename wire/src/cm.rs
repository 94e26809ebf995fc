//! Communication Management messages (IBA vol. 1 ch. 12.6): the 232 bytes
//! of a CM MAD after the common header. Offsets below are from the start of
//! that data (the kernel's `ibta_vol1_c12.h` uses the same); bit fields are
//! counted from the most significant bit of their byte.
//!
//! [`CmMad::parse`] checks the MAD header (base version 1, class 0x07,
//! class version 2, method Send) and the attribute, then reads every field
//! of the message; [`CmMad::emit`] writes the whole 256-byte MAD. Values
//! too wide for their field (a QPN or PSN over 24 bits, a timeout over 5
//! bits, ...) are refused with [`Error::OutOfRange`] rather than cut.

use crate::error::{Error, Result};
use crate::fields::*;
use crate::mad::*;

/// A GID (for RoCEv2: an IPv6 address, IPv4-mapped for IPv4).
pub type Gid = [u8; 16];

/// Bytes of CM data after the MAD header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// REQ private data.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// MRA private data.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// REJ private data.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// REJ additional rejection information.
pub const REJ_ARI_LEN: usize = 72;
/// REP private data.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// RTU private data.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// DREQ private data.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// DREP private data.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// SIDR_REQ private data.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// SIDR_REP private data.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// SIDR_REP additional information.
pub const SIDR_REP_ADD_INFO_LEN: usize = 72;

/// CM attribute IDs (IBA table 103).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum CmAttr {
    ClassPortInfo = 0x0001,
    Req = 0x0010,
    Mra = 0x0011,
    Rej = 0x0012,
    Rep = 0x0013,
    Rtu = 0x0014,
    Dreq = 0x0015,
    Drep = 0x0016,
    SidrReq = 0x0017,
    SidrRep = 0x0018,
    Lap = 0x0019,
    Apr = 0x001A,
}

impl CmAttr {
    /// The attribute with this ID.
    pub fn from_u16(v: u16) -> Option<CmAttr> {
        use CmAttr::*;
        Some(match v {
            0x0001 => ClassPortInfo,
            0x0010 => Req,
            0x0011 => Mra,
            0x0012 => Rej,
            0x0013 => Rep,
            0x0014 => Rtu,
            0x0015 => Dreq,
            0x0016 => Drep,
            0x0017 => SidrReq,
            0x0018 => SidrRep,
            0x0019 => Lap,
            0x001A => Apr,
            _ => return None,
        })
    }
    /// The message's name, as Wireshark shows it.
    pub fn name(self) -> &'static str {
        use CmAttr::*;
        match self {
            ClassPortInfo => "ClassPortInfo",
            Req => "ConnectRequest",
            Mra => "MsgRcptAck",
            Rej => "ConnectReject",
            Rep => "ConnectReply",
            Rtu => "ReadyToUse",
            Dreq => "DisconnectRequest",
            Drep => "DisconnectReply",
            SidrReq => "ServiceIDResReq",
            SidrRep => "ServiceIDResReqResp",
            Lap => "LoadAlternatePath",
            Apr => "AlternatePathResponse",
        }
    }
}

/// The name of a REJ reason (IBA table 112).
pub fn rej_reason_name(reason: u16) -> &'static str {
    match reason {
        1 => "no QP",
        2 => "no EEC",
        3 => "no resources",
        4 => "timeout",
        5 => "unsupported REQ",
        6 => "invalid comm ID",
        7 => "invalid comm instance",
        8 => "invalid service ID",
        9 => "invalid transport service type",
        10 => "stale connection",
        11 => "RDC does not exist",
        12 => "invalid GID",
        13 => "invalid LID",
        14 => "invalid SL",
        15 => "invalid traffic class",
        16 => "invalid hop limit",
        17 => "invalid packet rate",
        18 => "invalid alternate GID",
        19 => "invalid alternate LID",
        20 => "invalid alternate SL",
        21 => "invalid alternate traffic class",
        22 => "invalid alternate hop limit",
        23 => "invalid alternate packet rate",
        24 => "port CM redirect",
        25 => "port redirect",
        26 => "invalid MTU",
        27 => "insufficient responder resources",
        28 => "consumer reject",
        29 => "invalid RNR retry",
        30 => "duplicate local comm ID",
        31 => "unsupported class version",
        32 => "invalid flow label",
        33 => "invalid alternate flow label",
        _ => "unknown",
    }
}

// ---------------------------------------------------------------------
// Field helpers over the 232 data bytes
// ---------------------------------------------------------------------

/// The top `n` bits of byte `at`, shifted down, after skipping `skip`
/// bits from the top.
fn bits(d: &[u8], at: usize, skip: u32, n: u32) -> u8 {
    (d[at] << skip) >> (8 - n)
}

/// Writes `v` into `n` bits of byte `at` after `skip` bits from the top.
fn put_bits(d: &mut [u8], at: usize, skip: u32, n: u32, v: u8) {
    let shift = 8 - skip - n;
    let mask = (((1u16 << n) - 1) as u8) << shift;
    d[at] = (d[at] & !mask) | ((v << shift) & mask);
}

fn check(v: u32, bits: u32, what: &'static str) -> Result<()> {
    if v >> bits != 0 {
        Err(Error::OutOfRange(what))
    } else {
        Ok(())
    }
}

fn gid(d: &[u8], at: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&d[at..at + 16]);
    g
}

fn arr<const N: usize>(d: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&d[at..at + N]);
    a
}

// ---------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------

/// A path in a REQ (primary at data offset 52, alternate at 96).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmPath {
    /// Local port LID (RoCE: 0xFFFF, permissive).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// The REQ sender's GID.
    pub local_gid: Gid,
    /// The REQ receiver's GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBA rate enum).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, IBA time).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl CmPath {
    fn parse(d: &[u8], at: usize) -> CmPath {
        CmPath {
            local_lid: be16(d, at),
            remote_lid: be16(d, at + 2),
            local_gid: gid(d, at + 4),
            remote_gid: gid(d, at + 20),
            flow_label: be32(d, at + 36) >> 12,
            packet_rate: d[at + 39] & 0x3f,
            traffic_class: d[at + 40],
            hop_limit: d[at + 41],
            sl: bits(d, at + 42, 0, 4),
            subnet_local: bits(d, at + 42, 4, 1) != 0,
            local_ack_timeout: bits(d, at + 43, 0, 5),
        }
    }
    fn check(&self) -> Result<()> {
        check(self.flow_label, 20, "flow label")?;
        check(self.packet_rate.into(), 6, "packet rate")?;
        check(self.sl.into(), 4, "SL")?;
        check(self.local_ack_timeout.into(), 5, "local ACK timeout")
    }
    /// Writes the path; the low bits of byte 43 (the REQ's SAP flag for
    /// the alternate path) are left as they are.
    fn emit(&self, d: &mut [u8], at: usize) {
        put16(d, at, self.local_lid);
        put16(d, at + 2, self.remote_lid);
        d[at + 4..at + 20].copy_from_slice(&self.local_gid);
        d[at + 20..at + 36].copy_from_slice(&self.remote_gid);
        put32(
            d,
            at + 36,
            (self.flow_label << 12) | u32::from(self.packet_rate & 0x3f),
        );
        d[at + 40] = self.traffic_class;
        d[at + 41] = self.hop_limit;
        d[at + 42] = (self.sl << 4) | (u8::from(self.subnet_local) << 3);
        put_bits(d, at + 43, 0, 5, self.local_ack_timeout);
    }
}

/// REQ (IBA table 106).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr {
    pub local_comm_id: u32,
    /// Vendor ID (24 bits at offset 5).
    pub vendor_id: u32,
    pub service_id: u64,
    pub local_ca_guid: u64,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    pub responder_resources: u8,
    pub local_eecn: u32,
    pub initiator_depth: u8,
    pub remote_eecn: u32,
    /// 5 bits, IBA time.
    pub remote_cm_response_timeout: u8,
    /// 2 bits: 0 RC, 1 UC, 2 RD, 3 XRC when the extended type says so.
    pub transport_service_type: u8,
    pub end_to_end_flow_control: bool,
    /// 24 bits.
    pub starting_psn: u32,
    /// 5 bits, IBA time.
    pub local_cm_response_timeout: u8,
    /// 3 bits.
    pub retry_count: u8,
    pub pkey: u16,
    /// 4 bits, IBA MTU enum (1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    pub rdc_exists: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    /// 4 bits.
    pub max_cm_retries: u8,
    pub srq: bool,
    /// 3 bits.
    pub extended_transport_type: u8,
    pub primary: CmPath,
    pub alternate: CmPath,
    pub sap_supported: bool,
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Default for ReqRepr {
    fn default() -> Self {
        ReqRepr {
            local_comm_id: 0,
            vendor_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: 0,
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: 0,
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: 0,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary: CmPath::default(),
            alternate: CmPath::default(),
            sap_supported: false,
            private_data: [0; REQ_PRIVATE_DATA_LEN],
        }
    }
}

impl ReqRepr {
    fn parse(d: &[u8]) -> ReqRepr {
        ReqRepr {
            local_comm_id: be32(d, 0),
            vendor_id: be24(d, 5),
            service_id: be64(d, 8),
            local_ca_guid: be64(d, 16),
            local_qkey: be32(d, 28),
            local_qpn: be24(d, 32),
            responder_resources: d[35],
            local_eecn: be24(d, 36),
            initiator_depth: d[39],
            remote_eecn: be24(d, 40),
            remote_cm_response_timeout: bits(d, 43, 0, 5),
            transport_service_type: bits(d, 43, 5, 2),
            end_to_end_flow_control: bits(d, 43, 7, 1) != 0,
            starting_psn: be24(d, 44),
            local_cm_response_timeout: bits(d, 47, 0, 5),
            retry_count: bits(d, 47, 5, 3),
            pkey: be16(d, 48),
            path_mtu: bits(d, 50, 0, 4),
            rdc_exists: bits(d, 50, 4, 1) != 0,
            rnr_retry_count: bits(d, 50, 5, 3),
            max_cm_retries: bits(d, 51, 0, 4),
            srq: bits(d, 51, 4, 1) != 0,
            extended_transport_type: bits(d, 51, 5, 3),
            primary: CmPath::parse(d, 52),
            alternate: CmPath::parse(d, 52 + PATH_LEN),
            sap_supported: bits(d, 139, 5, 1) != 0,
            private_data: arr(d, 140),
        }
    }
    fn emit(&self, d: &mut [u8]) -> Result<()> {
        check(self.vendor_id, 24, "vendor ID")?;
        check(self.local_qpn, 24, "local QPN")?;
        check(self.local_eecn, 24, "local EECN")?;
        check(self.remote_eecn, 24, "remote EECN")?;
        check(
            self.remote_cm_response_timeout.into(),
            5,
            "remote CM response timeout",
        )?;
        check(
            self.transport_service_type.into(),
            2,
            "transport service type",
        )?;
        check(self.starting_psn, 24, "starting PSN")?;
        check(
            self.local_cm_response_timeout.into(),
            5,
            "local CM response timeout",
        )?;
        check(self.retry_count.into(), 3, "retry count")?;
        check(self.path_mtu.into(), 4, "path MTU")?;
        check(self.rnr_retry_count.into(), 3, "RNR retry count")?;
        check(self.max_cm_retries.into(), 4, "max CM retries")?;
        check(
            self.extended_transport_type.into(),
            3,
            "extended transport type",
        )?;
        self.primary.check()?;
        self.alternate.check()?;
        put32(d, 0, self.local_comm_id);
        d[4] = 0;
        put24(d, 5, self.vendor_id);
        put64(d, 8, self.service_id);
        put64(d, 16, self.local_ca_guid);
        put32(d, 24, 0);
        put32(d, 28, self.local_qkey);
        put24(d, 32, self.local_qpn);
        d[35] = self.responder_resources;
        put24(d, 36, self.local_eecn);
        d[39] = self.initiator_depth;
        put24(d, 40, self.remote_eecn);
        d[43] = (self.remote_cm_response_timeout << 3)
            | (self.transport_service_type << 1)
            | u8::from(self.end_to_end_flow_control);
        put24(d, 44, self.starting_psn);
        d[47] = (self.local_cm_response_timeout << 3) | self.retry_count;
        put16(d, 48, self.pkey);
        d[50] = (self.path_mtu << 4) | (u8::from(self.rdc_exists) << 3) | self.rnr_retry_count;
        d[51] =
            (self.max_cm_retries << 4) | (u8::from(self.srq) << 3) | self.extended_transport_type;
        self.primary.emit(d, 52);
        d[95] &= 0xf8;
        self.alternate.emit(d, 52 + PATH_LEN);
        d[139] = (d[139] & 0xf8) | (u8::from(self.sap_supported) << 2);
        d[140..140 + REQ_PRIVATE_DATA_LEN].copy_from_slice(&self.private_data);
        Ok(())
    }
}

/// MRA (IBA table 107).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: 0 REQ, 1 REP, 2 LAP.
    pub message_mraed: u8,
    /// 5 bits, IBA time.
    pub service_timeout: u8,
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Default for MraRepr {
    fn default() -> Self {
        MraRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: 0,
            service_timeout: 0,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        }
    }
}

/// REJ (IBA table 108).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 2 bits: 0 REQ, 1 REP, 2 other.
    pub message_rejected: u8,
    /// 7 bits: bytes of `ari` in use.
    pub reject_info_len: u8,
    pub reason: u16,
    pub ari: [u8; REJ_ARI_LEN],
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Default for RejRepr {
    fn default() -> Self {
        RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: 0,
            reject_info_len: 0,
            reason: 0,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        }
    }
}

/// REP (IBA table 110).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub local_qkey: u32,
    /// 24 bits.
    pub local_qpn: u32,
    /// 24 bits.
    pub local_eecn: u32,
    /// 24 bits.
    pub starting_psn: u32,
    /// The vendor ID's three bytes (offsets 15, 19, 23).
    pub vendor_id: u32,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    /// 5 bits.
    pub target_ack_delay: u8,
    /// 2 bits.
    pub failover_accepted: u8,
    pub end_to_end_flow_control: bool,
    /// 3 bits.
    pub rnr_retry_count: u8,
    pub srq: bool,
    pub local_ca_guid: u64,
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Default for RepRepr {
    fn default() -> Self {
        RepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: 0,
            local_eecn: 0,
            starting_psn: 0,
            vendor_id: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_DATA_LEN],
        }
    }
}

/// RTU (IBA table 111).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl Default for RtuRepr {
    fn default() -> Self {
        RtuRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; RTU_PRIVATE_DATA_LEN],
        }
    }
}

/// DREQ (IBA table 112).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// 24 bits: the receiver's QPN.
    pub remote_qpn: u32,
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Default for DreqRepr {
    fn default() -> Self {
        DreqRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn: 0,
            private_data: [0; DREQ_PRIVATE_DATA_LEN],
        }
    }
}

/// DREP (IBA table 113).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrepRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl Default for DrepRepr {
    fn default() -> Self {
        DrepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            private_data: [0; DREP_PRIVATE_DATA_LEN],
        }
    }
}

/// SIDR_REQ (IBA table 119).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr {
    pub request_id: u32,
    pub pkey: u16,
    pub service_id: u64,
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl Default for SidrReqRepr {
    fn default() -> Self {
        SidrReqRepr {
            request_id: 0,
            pkey: 0,
            service_id: 0,
            private_data: [0; SIDR_REQ_PRIVATE_DATA_LEN],
        }
    }
}

/// SIDR_REP (IBA table 120).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr {
    pub request_id: u32,
    /// 0 QP valid, 1 service ID not supported, 2 rejected, 3 no QP,
    /// 4 redirect, 5 unsupported class version.
    pub status: u8,
    pub add_info_len: u8,
    /// The vendor ID's bytes (offsets 6, 7 and 11).
    pub vendor_id: u32,
    /// 24 bits.
    pub qpn: u32,
    pub service_id: u64,
    pub qkey: u32,
    pub add_info: [u8; SIDR_REP_ADD_INFO_LEN],
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl Default for SidrRepRepr {
    fn default() -> Self {
        SidrRepRepr {
            request_id: 0,
            status: 0,
            add_info_len: 0,
            vendor_id: 0,
            qpn: 0,
            service_id: 0,
            qkey: 0,
            add_info: [0; SIDR_REP_ADD_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
        }
    }
}

/// LAP and APR: only the IDs are read (uroce refuses alternate paths,
/// as the kernel's CM does on RoCE); the rest is kept as bytes.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AltPathRepr {
    pub local_comm_id: u32,
    pub remote_comm_id: u32,
    /// The data after the two IDs.
    pub rest: [u8; CM_DATA_LEN - 8],
}

impl Default for AltPathRepr {
    fn default() -> Self {
        AltPathRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            rest: [0; CM_DATA_LEN - 8],
        }
    }
}

/// One CM message.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmMessage {
    Req(ReqRepr),
    Mra(MraRepr),
    Rej(RejRepr),
    Rep(RepRepr),
    Rtu(RtuRepr),
    Dreq(DreqRepr),
    Drep(DrepRepr),
    SidrReq(SidrReqRepr),
    SidrRep(SidrRepRepr),
    Lap(AltPathRepr),
    Apr(AltPathRepr),
}

impl CmMessage {
    /// The attribute ID.
    pub fn attr(&self) -> CmAttr {
        match self {
            CmMessage::Req(_) => CmAttr::Req,
            CmMessage::Mra(_) => CmAttr::Mra,
            CmMessage::Rej(_) => CmAttr::Rej,
            CmMessage::Rep(_) => CmAttr::Rep,
            CmMessage::Rtu(_) => CmAttr::Rtu,
            CmMessage::Dreq(_) => CmAttr::Dreq,
            CmMessage::Drep(_) => CmAttr::Drep,
            CmMessage::SidrReq(_) => CmAttr::SidrReq,
            CmMessage::SidrRep(_) => CmAttr::SidrRep,
            CmMessage::Lap(_) => CmAttr::Lap,
            CmMessage::Apr(_) => CmAttr::Apr,
        }
    }
}

/// A CM MAD: the transaction ID and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID.
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// Reads a CM MAD from the first 256 bytes of `bytes` (a UD payload
    /// may carry more; it is ignored).
    pub fn parse(bytes: &[u8]) -> Result<CmMad> {
        crate::error::check_len("CM MAD", bytes, MAD_LEN)?;
        let h = MadHeaderRepr::parse(&MadHeader::new_unchecked(bytes))?;
        if h.base_version != MAD_BASE_VERSION {
            return Err(Error::BadMad("base version is not 1"));
        }
        if h.mgmt_class != MGMT_CLASS_CM {
            return Err(Error::BadMad("not the CM class"));
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(Error::BadMad("CM class version is not 2"));
        }
        if h.method != METHOD_SEND {
            return Err(Error::BadMad("method is not Send"));
        }
        let d = &bytes[MAD_HDR_LEN..MAD_LEN];
        let attr = CmAttr::from_u16(h.attr_id).ok_or(Error::BadMad("unknown CM attribute"))?;
        let ids = (be32(d, 0), be32(d, 4));
        let msg = match attr {
            CmAttr::ClassPortInfo => {
                return Err(Error::BadMad("ClassPortInfo is not a CM message"))
            }
            CmAttr::Req => CmMessage::Req(ReqRepr::parse(d)),
            CmAttr::Mra => CmMessage::Mra(MraRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message_mraed: bits(d, 8, 0, 2),
                service_timeout: bits(d, 9, 0, 5),
                private_data: arr(d, 10),
            }),
            CmAttr::Rej => CmMessage::Rej(RejRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                message_rejected: bits(d, 8, 0, 2),
                reject_info_len: bits(d, 9, 0, 7),
                reason: be16(d, 10),
                ari: arr(d, 12),
                private_data: arr(d, 84),
            }),
            CmAttr::Rep => CmMessage::Rep(RepRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                vendor_id: (u32::from(d[15]) << 16) | (u32::from(d[19]) << 8) | u32::from(d[23]),
                local_eecn: be24(d, 16),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: bits(d, 26, 0, 5),
                failover_accepted: bits(d, 26, 5, 2),
                end_to_end_flow_control: bits(d, 26, 7, 1) != 0,
                rnr_retry_count: bits(d, 27, 0, 3),
                srq: bits(d, 27, 3, 1) != 0,
                local_ca_guid: be64(d, 28),
                private_data: arr(d, 36),
            }),
            CmAttr::Rtu => CmMessage::Rtu(RtuRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                private_data: arr(d, 8),
            }),
            CmAttr::Dreq => CmMessage::Dreq(DreqRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                remote_qpn: be24(d, 8),
                private_data: arr(d, 12),
            }),
            CmAttr::Drep => CmMessage::Drep(DrepRepr {
                local_comm_id: ids.0,
                remote_comm_id: ids.1,
                private_data: arr(d, 8),
            }),
            CmAttr::SidrReq => CmMessage::SidrReq(SidrReqRepr {
                request_id: ids.0,
                pkey: be16(d, 4),
                service_id: be64(d, 8),
                private_data: arr(d, 16),
            }),
            CmAttr::SidrRep => CmMessage::SidrRep(SidrRepRepr {
                request_id: ids.0,
                status: d[4],
                add_info_len: d[5],
                vendor_id: (u32::from(be16(d, 6)) << 8) | u32::from(d[11]),
                qpn: be24(d, 8),
                service_id: be64(d, 12),
                qkey: be32(d, 20),
                add_info: arr(d, 24),
                private_data: arr(d, 96),
            }),
            CmAttr::Lap | CmAttr::Apr => {
                let r = AltPathRepr {
                    local_comm_id: ids.0,
                    remote_comm_id: ids.1,
                    rest: arr(d, 8),
                };
                if attr == CmAttr::Lap {
                    CmMessage::Lap(r)
                } else {
                    CmMessage::Apr(r)
                }
            }
        };
        Ok(CmMad { tid: h.tid, msg })
    }

    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        MAD_LEN
    }

    /// Writes the 256-byte MAD (method Send, status 0) into `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        if buf.len() < MAD_LEN {
            return Err(Error::BufferTooSmall {
                need: MAD_LEN,
                have: buf.len(),
            });
        }
        let buf = &mut buf[..MAD_LEN];
        buf.fill(0);
        MadHeaderRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            tid: self.tid,
            attr_id: self.msg.attr() as u16,
            ..MadHeaderRepr::default()
        }
        .emit(&mut MadHeader::new_unchecked(&mut buf[..MAD_HDR_LEN]));
        let d = &mut buf[MAD_HDR_LEN..];
        let ids = |d: &mut [u8], l: u32, r: u32| {
            put32(d, 0, l);
            put32(d, 4, r);
        };
        match &self.msg {
            CmMessage::Req(r) => r.emit(d)?,
            CmMessage::Mra(m) => {
                check(m.message_mraed.into(), 2, "message MRAed")?;
                check(m.service_timeout.into(), 5, "service timeout")?;
                ids(d, m.local_comm_id, m.remote_comm_id);
                d[8] = m.message_mraed << 6;
                d[9] = m.service_timeout << 3;
                d[10..].copy_from_slice(&m.private_data);
            }
            CmMessage::Rej(r) => {
                check(r.message_rejected.into(), 2, "message rejected")?;
                check(r.reject_info_len.into(), 7, "reject info length")?;
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8] = r.message_rejected << 6;
                d[9] = r.reject_info_len << 1;
                put16(d, 10, r.reason);
                d[12..84].copy_from_slice(&r.ari);
                d[84..].copy_from_slice(&r.private_data);
            }
            CmMessage::Rep(r) => {
                check(r.local_qpn, 24, "local QPN")?;
                check(r.local_eecn, 24, "local EECN")?;
                check(r.starting_psn, 24, "starting PSN")?;
                check(r.vendor_id, 24, "vendor ID")?;
                check(r.target_ack_delay.into(), 5, "target ACK delay")?;
                check(r.failover_accepted.into(), 2, "failover accepted")?;
                check(r.rnr_retry_count.into(), 3, "RNR retry count")?;
                ids(d, r.local_comm_id, r.remote_comm_id);
                put32(d, 8, r.local_qkey);
                put24(d, 12, r.local_qpn);
                d[15] = (r.vendor_id >> 16) as u8;
                put24(d, 16, r.local_eecn);
                d[19] = (r.vendor_id >> 8) as u8;
                put24(d, 20, r.starting_psn);
                d[23] = r.vendor_id as u8;
                d[24] = r.responder_resources;
                d[25] = r.initiator_depth;
                d[26] = (r.target_ack_delay << 3)
                    | (r.failover_accepted << 1)
                    | u8::from(r.end_to_end_flow_control);
                d[27] = (r.rnr_retry_count << 5) | (u8::from(r.srq) << 4);
                put64(d, 28, r.local_ca_guid);
                d[36..].copy_from_slice(&r.private_data);
            }
            CmMessage::Rtu(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8..].copy_from_slice(&r.private_data);
            }
            CmMessage::Dreq(r) => {
                check(r.remote_qpn, 24, "remote QPN")?;
                ids(d, r.local_comm_id, r.remote_comm_id);
                put24(d, 8, r.remote_qpn);
                d[12..].copy_from_slice(&r.private_data);
            }
            CmMessage::Drep(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8..].copy_from_slice(&r.private_data);
            }
            CmMessage::SidrReq(r) => {
                put32(d, 0, r.request_id);
                put16(d, 4, r.pkey);
                put64(d, 8, r.service_id);
                d[16..].copy_from_slice(&r.private_data);
            }
            CmMessage::SidrRep(r) => {
                check(r.qpn, 24, "QPN")?;
                check(r.vendor_id, 24, "vendor ID")?;
                put32(d, 0, r.request_id);
                d[4] = r.status;
                d[5] = r.add_info_len;
                put16(d, 6, (r.vendor_id >> 8) as u16);
                put24(d, 8, r.qpn);
                d[11] = r.vendor_id as u8;
                put64(d, 12, r.service_id);
                put32(d, 20, r.qkey);
                d[24..96].copy_from_slice(&r.add_info);
                d[96..].copy_from_slice(&r.private_data);
            }
            CmMessage::Lap(r) | CmMessage::Apr(r) => {
                ids(d, r.local_comm_id, r.remote_comm_id);
                d[8..].copy_from_slice(&r.rest);
            }
        }
        Ok(MAD_LEN)
    }
}

#[cfg(test)]
mod tests;
