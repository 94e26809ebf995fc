//! Verbs value types shared by the transport, the engine and the API:
//! work requests, work completions, access flags, QP types and states.
//! Numeric values equal rdma-core's (`ibv_wc_status`, `ibv_wr_opcode`, ...),
//! so the C ABI can pass them through unchanged.

pub use crate::memory::Access;
use bitflags::bitflags;
use core::fmt;
use smallvec::SmallVec;

bitflags! {
    /// Send work request flags (`ibv_send_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for earlier READ/atomic WRs to complete before starting.
        const FENCE = 1;
        /// Generate a completion.
        const SIGNALED = 2;
        /// Set the solicited event bit on the last packet.
        const SOLICITED = 4;
        /// Copy the data at post time instead of reading it from MRs.
        const INLINE = 8;
    }
}

bitflags! {
    /// Work completion flags (`ibv_wc_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The buffer starts with a 40-byte GRH area (UD).
        const GRH = 1;
        /// `imm_data` is valid.
        const WITH_IMM = 2;
        /// IP checksum verified.
        const IP_CSUM_OK = 4;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 8;
    }
}

value_enum! {
    /// Work completion status (`ibv_wc_status`); `Display` gives the spec's
    /// words, as `ibv_wc_status_str` does.
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum WcStatus: u32 {
        Success = 0 => "success",
        LocLenErr = 1 => "local length error",
        LocQpOpErr = 2 => "local QP operation error",
        LocEecOpErr = 3 => "local EE context operation error",
        LocProtErr = 4 => "local protection error",
        WrFlushErr = 5 => "Work Request Flushed Error",
        MwBindErr = 6 => "memory management operation error",
        BadRespErr = 7 => "bad response error",
        LocAccessErr = 8 => "local access error",
        RemInvReqErr = 9 => "remote invalid request error",
        RemAccessErr = 10 => "remote access error",
        RemOpErr = 11 => "remote operation error",
        RetryExcErr = 12 => "transport retry counter exceeded",
        RnrRetryExcErr = 13 => "RNR retry counter exceeded",
        LocRddViolErr = 14 => "local RDD violation error",
        RemInvRdReqErr = 15 => "remote invalid RD request",
        RemAbortErr = 16 => "aborted error",
        InvEecnErr = 17 => "invalid EE context number",
        InvEecStateErr = 18 => "invalid EE context state",
        FatalErr = 19 => "fatal error",
        RespTimeoutErr = 20 => "response timeout error",
        GeneralErr = 21 => "general error",
    }
    /// The spec's words (`ibv_wc_status_str`).
    words: names;
    /// The status with this `ibv_wc_status` value.
    pub from_u32: values;
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.words())
    }
}

value_enum! {
    /// Work completion opcode (`ibv_wc_opcode`).
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum WcOpcode: u32 {
        Send = 0,
        RdmaWrite = 1,
        RdmaRead = 2,
        CompSwap = 3,
        FetchAdd = 4,
        BindMw = 5,
        LocalInv = 6,
        Flush = 8,
        AtomicWrite = 9,
        Recv = 128,
        RecvRdmaWithImm = 129,
    }
    /// The opcode with this `ibv_wc_opcode` value.
    pub from_u32: values;
}

value_enum! {
    /// Send work request opcode (`ibv_wr_opcode`).
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum WrOpcode: u32 {
        RdmaWrite = 0 => "RDMA_WRITE",
        RdmaWriteWithImm = 1 => "RDMA_WRITE_WITH_IMM",
        Send = 2 => "SEND",
        SendWithImm = 3 => "SEND_WITH_IMM",
        RdmaRead = 4 => "RDMA_READ",
        AtomicCmpAndSwp = 5 => "ATOMIC_CMP_AND_SWP",
        AtomicFetchAndAdd = 6 => "ATOMIC_FETCH_AND_ADD",
        LocalInv = 7 => "LOCAL_INV",
        BindMw = 8 => "BIND_MW",
        SendWithInv = 9 => "SEND_WITH_INV",
        /// RDMA FLUSH (IBA 1.5; rdma-core's `ibv_wr_flush`).
        Flush = 14 => "FLUSH",
        /// RDMA ATOMIC WRITE (IBA 1.5; `ibv_wr_atomic_write`): the 8 bytes
        /// are the WR's `inline_data`.
        AtomicWrite = 15 => "ATOMIC_WRITE",
    }
    /// The verbs name (`ibv_wr_opcode` without `IBV_WR_`).
    pub name: names;
    /// Every send opcode.
    pub ALL: all;
}

impl WrOpcode {
    /// The wire operation of a request WR and what its last packet carries
    /// (the opcode table then gives each packet's opcode:
    /// [`uroce_wire::Opcode::request`]); `None` for local operations.
    pub const fn request_kind(self) -> Option<(uroce_wire::Operation, uroce_wire::RequestExtra)> {
        use uroce_wire::{Operation as O, RequestExtra as X};
        Some(match self {
            WrOpcode::Send => (O::Send, X::None),
            WrOpcode::SendWithImm => (O::Send, X::Immediate),
            WrOpcode::SendWithInv => (O::Send, X::Invalidate),
            WrOpcode::RdmaWrite => (O::RdmaWrite, X::None),
            WrOpcode::RdmaWriteWithImm => (O::RdmaWrite, X::Immediate),
            WrOpcode::RdmaRead => (O::RdmaReadRequest, X::None),
            WrOpcode::AtomicCmpAndSwp => (O::CompareSwap, X::None),
            WrOpcode::AtomicFetchAndAdd => (O::FetchAdd, X::None),
            WrOpcode::Flush => (O::Flush, X::None),
            WrOpcode::AtomicWrite => (O::AtomicWrite, X::None),
            WrOpcode::LocalInv | WrOpcode::BindMw => return None,
        })
    }
    /// The request opcode of packet `pos` of a WR on `transport`, from the
    /// opcode table (a READ or an atomic is one request packet whatever
    /// `pos` says); `None` when the transport has no such operation.
    pub const fn request_opcode(
        self,
        transport: uroce_wire::Transport,
        pos: uroce_wire::Position,
    ) -> Option<uroce_wire::Opcode> {
        use uroce_wire::Operation as O;
        match self.request_kind() {
            // One request packet, whatever the number of responses.
            Some((
                op
                @ (O::RdmaReadRequest | O::CompareSwap | O::FetchAdd | O::Flush | O::AtomicWrite),
                extra,
            )) => uroce_wire::Opcode::request(transport, op, uroce_wire::Position::Only, extra),
            Some((op, extra)) => uroce_wire::Opcode::request(transport, op, pos, extra),
            None => None,
        }
    }
    /// The completion opcode of a send WR with this opcode.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpAndSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAndAdd => WcOpcode::FetchAdd,
            WrOpcode::LocalInv => WcOpcode::LocalInv,
            WrOpcode::BindMw => WcOpcode::BindMw,
            WrOpcode::Flush => WcOpcode::Flush,
            WrOpcode::AtomicWrite => WcOpcode::AtomicWrite,
        }
    }
    /// Takes one of the requester's `max_rd_atomic` credits: READ, the
    /// atomics and ATOMIC WRITE (as rxe counts them; FLUSH does not).
    pub const fn takes_rd_atomic_credit(self) -> bool {
        self.is_read_or_atomic() || matches!(self, WrOpcode::AtomicWrite)
    }
    /// FLUSH or ATOMIC WRITE: one request packet answered by an empty
    /// READ RESPONSE ONLY (or completed by a later ACK, as a WRITE is).
    pub const fn is_flush_or_atomic_write(self) -> bool {
        matches!(self, WrOpcode::Flush | WrOpcode::AtomicWrite)
    }
    /// READ or atomic: occupies a responder resource (max_rd_atomic).
    pub const fn is_read_or_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::RdmaRead | WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
    /// A local operation (BIND_MW, LOCAL_INV): no packet, executed when
    /// the send queue reaches it.
    pub const fn is_local(self) -> bool {
        matches!(self, WrOpcode::LocalInv | WrOpcode::BindMw)
    }
    /// Compare-swap or fetch-add.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            WrOpcode::AtomicCmpAndSwp | WrOpcode::AtomicFetchAndAdd
        )
    }
}

/// A scatter/gather element: `length` bytes at virtual address `addr` of
/// the MR with local key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address (the MR's iova space).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// A scatter/gather list; up to four elements live inline.
pub type SgList = SmallVec<[Sge; 4]>;

/// Inline send data; up to 64 bytes without a heap allocation.
pub type InlineData = SmallVec<[u8; 64]>;

/// A send work request (`ibv_send_wr`, without the `next` link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Flags.
    pub flags: SendFlags,
    /// Local buffers (data to send, or where READ/atomic results land).
    pub sg_list: SgList,
    /// With [`SendFlags::INLINE`]: the data itself, copied at post time
    /// (the SG list is then ignored, as verbs does for inline sends).
    pub inline_data: InlineData,
    /// Immediate data (SEND/WRITE with immediate), as the 32-bit value
    /// the ImmDt header carries big-endian.
    pub imm_data: u32,
    /// R_Key to invalidate (SEND with invalidate).
    pub invalidate_rkey: u32,
    /// Remote address (WRITE/READ/atomic).
    pub remote_addr: u64,
    /// Remote key (WRITE/READ/atomic).
    pub rkey: u32,
    /// Compare value (compare-swap) or addend (fetch-add).
    pub compare_add: u64,
    /// Swap value (compare-swap).
    pub swap: u64,
    /// UD: destination.
    pub ud: Option<UdDest>,
    /// BIND_MW: the window, the new key and what it grants.
    pub bind: Option<crate::memory::MwBind>,
    /// FLUSH: the length at `remote_addr`, the placement type and the
    /// selectivity level (`uroce_wire::feth`).
    pub flush: FlushSpec,
}

/// What an RDMA FLUSH asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlushSpec {
    /// Bytes at the WR's `remote_addr` (the RETH's length).
    pub len: u32,
    /// Placement type: `uroce_wire::feth::FLUSH_GLOBAL` /
    /// `FLUSH_PERSISTENT`.
    pub placement: u8,
    /// Selectivity level: `FLUSH_RANGE` or `FLUSH_MR`.
    pub selectivity: u8,
}

/// Where a UD send goes (address handle, remote QPN and Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    /// Remote IP address.
    pub ip: std::net::IpAddr,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Q_Key (a WR Q_Key with the high bit set means "use the QP's").
    pub remote_qkey: u32,
    /// The traffic class (IP TOS, DSCP and ECN bits) the packet carries
    /// (the address handle's `grh.traffic_class`).
    pub tclass: u8,
    /// The address handle's `grh.hop_limit`: the IP TTL / hop limit of a
    /// datagram to a multicast group (see the transport's `Transmit`);
    /// unicast datagrams carry the route's.
    pub hop_limit: u8,
}

impl SendWr {
    /// A WR with the given id and opcode and everything else empty.
    pub fn new(wr_id: u64, opcode: WrOpcode) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            flags: SendFlags::empty(),
            sg_list: SgList::new(),
            inline_data: InlineData::new(),
            imm_data: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
            ud: None,
            bind: None,
            flush: FlushSpec::default(),
        }
    }
    /// An RDMA ATOMIC WRITE of `bytes` (as they are in memory) to the
    /// 8-byte-aligned `remote_addr`, signaled.
    pub fn atomic_write(wr_id: u64, remote_addr: u64, rkey: u32, bytes: [u8; 8]) -> SendWr {
        let mut w = SendWr::new(wr_id, WrOpcode::AtomicWrite);
        w.flags = SendFlags::SIGNALED;
        w.remote_addr = remote_addr;
        w.rkey = rkey;
        w.inline_data.extend_from_slice(&bytes);
        w
    }
    /// An RDMA FLUSH of `len` bytes at `remote_addr` (`selectivity`
    /// `FLUSH_RANGE`) or of the whole region (`FLUSH_MR`), with placement
    /// type `placement` (`uroce_wire::feth::FLUSH_GLOBAL`), signaled.
    pub fn flush(
        wr_id: u64,
        remote_addr: u64,
        rkey: u32,
        len: u32,
        placement: u8,
        selectivity: u8,
    ) -> SendWr {
        let mut w = SendWr::new(wr_id, WrOpcode::Flush);
        w.flags = SendFlags::SIGNALED;
        w.remote_addr = remote_addr;
        w.rkey = rkey;
        w.flush = FlushSpec {
            len,
            placement,
            selectivity,
        };
        w
    }
    /// Total length of the SG list (saturating).
    pub fn total_len(&self) -> u64 {
        self.sg_list.iter().map(|s| s.length as u64).sum()
    }
    /// The bytes the WR's message holds: its inline data when it is
    /// inline, else its SG list's.
    pub fn message_len(&self) -> u64 {
        if self.flags.contains(SendFlags::INLINE) {
            self.inline_data.len() as u64
        } else {
            self.total_len()
        }
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecvWr {
    /// Caller's identifier.
    pub wr_id: u64,
    /// Where received data goes.
    pub sg_list: SgList,
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    /// The WR's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for successful completions).
    pub opcode: WcOpcode,
    /// Vendor error (0).
    pub vendor_err: u32,
    /// Bytes received (receive completions), or transferred.
    pub byte_len: u32,
    /// Immediate data when `wc_flags` has `WITH_IMM`.
    pub imm_data: u32,
    /// Invalidated rkey when `wc_flags` has `WITH_INV`.
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: u32,
    /// Remote QP number (UD).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index (0).
    pub pkey_index: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits (0).
    pub dlid_path_bits: u8,
    /// When the engine generated the completion, on the completion clock
    /// ([`crate::device::clock_ns`]), if its CQ stamps completions
    /// ([`crate::device::CqHandle::stamp_completions`]); else 0.
    pub timestamp: u64,
}

impl Wc {
    /// A completion with only id, status, opcode and QP set.
    pub fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Wc {
        Wc {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            timestamp: 0,
        }
    }
    /// A successful receive completion (`Recv` or `RecvRdmaWithImm`) of a
    /// message of `byte_len` bytes from QP `src_qp`, with `WITH_IMM` and the
    /// value when the message carried immediate data.
    pub fn received(
        wr_id: u64,
        opcode: WcOpcode,
        qp_num: u32,
        byte_len: u32,
        src_qp: u32,
        imm: Option<u32>,
    ) -> Wc {
        let mut wc = Wc::new(wr_id, WcStatus::Success, opcode, qp_num);
        wc.byte_len = byte_len;
        wc.src_qp = src_qp;
        if let Some(imm) = imm {
            wc.imm_data = imm;
            wc.wc_flags = WcFlags::WITH_IMM;
        }
        wc
    }
}

/// QP transport type (`ibv_qp_type`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpType {
    Rc = 2,
    Uc = 3,
    Ud = 4,
}

impl QpType {
    /// The transport its packets belong to (the BTH opcode's high bits).
    pub const fn transport(self) -> uroce_wire::Transport {
        match self {
            QpType::Rc => uroce_wire::Transport::Rc,
            QpType::Uc => uroce_wire::Transport::Uc,
            QpType::Ud => uroce_wire::Transport::Ud,
        }
    }

    /// Whether a QP of this type may post `op`: the one table of what each
    /// QP type sends. A request operation must have an opcode on the
    /// type's transport in the opcode table (IBA table 38: UC has SEND and
    /// RDMA WRITE, UD SEND alone); the local operations (LOCAL_INV,
    /// BIND_MW) run on the connected types, as rxe allows them. Posting
    /// anything else is EINVAL; the engine completes it with
    /// LOC_QP_OP_ERR should it get there.
    pub const fn may_post(self, op: WrOpcode) -> bool {
        if op.is_local() {
            return !matches!(self, QpType::Ud);
        }
        op.request_opcode(self.transport(), uroce_wire::Position::Only)
            .is_some()
    }
}

value_enum! {
    /// QP state (`ibv_qp_state`).
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum QpState: u32 {
        Reset = 0 => "RESET",
        Init = 1 => "INIT",
        Rtr = 2 => "RTR",
        Rts = 3 => "RTS",
        Sqd = 4 => "SQD",
        Sqe = 5 => "SQE",
        Err = 6 => "ERR",
    }
    /// The name `rdma resource show qp` writes (`ibv_qp_state` without
    /// `IBV_QPS_`).
    pub name: names;
    /// The state with this `ibv_qp_state` value.
    pub from_u32: values;
}

value_enum! {
    /// Path MTU (`ibv_mtu`): 256..4096 bytes.
    #[allow(missing_docs)]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Mtu: u32 {
        Mtu256 = 1,
        Mtu512 = 2,
        Mtu1024 = 3,
        Mtu2048 = 4,
        Mtu4096 = 5,
    }
    /// From the enum value (1..=5).
    pub from_u32: values;
}

impl Mtu {
    /// Bytes.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    /// From a byte count (exact: 256, 512, 1024, 2048, 4096).
    pub const fn from_bytes(b: u32) -> Option<Mtu> {
        // 256 = 128 << 1 ... 4096 = 128 << 5: the enum value is log2 - 7.
        if b.is_power_of_two() {
            Mtu::from_u32(b.trailing_zeros().wrapping_sub(7))
        } else {
            None
        }
    }
    /// The largest IB MTU whose RoCEv2 packets fit an interface MTU, as
    /// rxe computes its active MTU (1500 -> 1024, 9000 -> 4096).
    pub const fn for_interface_mtu(if_mtu: u32) -> Mtu {
        // IPv6 (40) + UDP (8) + BTH (12) + largest ext (28) + ICRC (4),
        // rounded as rxe does (RXE_MAX_HDR_LENGTH = 80).
        let room = if_mtu.saturating_sub(80);
        if room >= 4096 {
            Mtu::Mtu4096
        } else if room >= 2048 {
            Mtu::Mtu2048
        } else if room >= 1024 {
            Mtu::Mtu1024
        } else if room >= 512 {
            Mtu::Mtu512
        } else {
            Mtu::Mtu256
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn mtu() {
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::for_interface_mtu(1500), Mtu::Mtu1024);
        assert_eq!(Mtu::for_interface_mtu(9000), Mtu::Mtu4096);
        assert_eq!(Mtu::for_interface_mtu(65536), Mtu::Mtu4096);
        assert_eq!(Mtu::for_interface_mtu(576), Mtu::Mtu256);
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
        assert_eq!(Mtu::from_u32(6), None);
    }
    #[test]
    fn status_values_match_rdma_core() {
        assert_eq!(WcStatus::WrFlushErr as u32, 5);
        assert_eq!(WcStatus::RemAccessErr as u32, 10);
        assert_eq!(WcStatus::RnrRetryExcErr as u32, 13);
        assert_eq!(
            WcStatus::WrFlushErr.to_string(),
            "Work Request Flushed Error"
        );
        assert_eq!(WcOpcode::RecvRdmaWithImm as u32, 129);
        assert_eq!(WrOpcode::SendWithInv as u32, 9);
    }
    #[test]
    fn what_each_qp_type_may_post() {
        use WrOpcode::*;
        let allowed = |t: QpType| -> Vec<WrOpcode> {
            WrOpcode::ALL
                .into_iter()
                .filter(|&op| t.may_post(op))
                .collect()
        };
        assert_eq!(allowed(QpType::Rc), WrOpcode::ALL.to_vec());
        assert_eq!(
            allowed(QpType::Uc),
            [
                RdmaWrite,
                RdmaWriteWithImm,
                Send,
                SendWithImm,
                LocalInv,
                BindMw
            ]
        );
        assert_eq!(allowed(QpType::Ud), [Send, SendWithImm]);
    }
}
