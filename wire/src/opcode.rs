//! The opcode table (IBA vol. 1 table 38, plus the RoCEv2 CNP), as data.
//!
//! One row per opcode that RoCE uses, indexed by the raw opcode byte. The
//! packet parser, the builder and the transport's validity checks all read
//! this table: which extension headers follow the BTH and in what order,
//! whether the packet has payload, its position in a message, and whether it
//! is a request or a response.

use core::fmt;

/// An extension header that may follow the BTH, in wire order.
///
/// IBA 9.2: `BTH, [RDETH], [DETH], [RETH], [AtomicETH], [AETH],
/// [AtomicAckETH], [ImmDt], [IETH], payload` (brackets: optional), with
/// IBA 1.5's FETH before the RETH of an RDMA FLUSH. RD is not used by
/// RoCE; the CNP's 16 reserved bytes are modelled as one more "header".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ext {
    /// Datagram extended transport header (UD).
    Deth,
    /// FLUSH extended transport header (RDMA FLUSH).
    Feth,
    /// RDMA extended transport header.
    Reth,
    /// Atomic extended transport header.
    AtomicEth,
    /// ACK extended transport header.
    Aeth,
    /// Atomic acknowledge extended transport header.
    AtomicAckEth,
    /// Immediate data.
    ImmDt,
    /// Invalidate extended transport header.
    Ieth,
    /// The 16 reserved bytes of a RoCEv2 congestion notification packet.
    CnpReserved,
}

impl Ext {
    /// Every extension header, in wire order.
    pub const ALL: [Ext; 9] = [
        Ext::Deth,
        Ext::Feth,
        Ext::Reth,
        Ext::AtomicEth,
        Ext::Aeth,
        Ext::AtomicAckEth,
        Ext::ImmDt,
        Ext::Ieth,
        Ext::CnpReserved,
    ];
    /// Length of the header in bytes.
    #[allow(clippy::len_without_is_empty)] // a header kind, not a container
    pub const fn len(self) -> usize {
        match self {
            Ext::Deth => 8,
            Ext::Feth => 4,
            Ext::Reth => 16,
            Ext::AtomicEth => 28,
            Ext::Aeth => 4,
            Ext::AtomicAckEth => 8,
            Ext::ImmDt => 4,
            Ext::Ieth => 4,
            Ext::CnpReserved => 16,
        }
    }
    /// The spec's name for the header.
    pub const fn name(self) -> &'static str {
        match self {
            Ext::Deth => "DETH",
            Ext::Feth => "FETH",
            Ext::Reth => "RETH",
            Ext::AtomicEth => "AtomicETH",
            Ext::Aeth => "AETH",
            Ext::AtomicAckEth => "AtomicAckETH",
            Ext::ImmDt => "ImmDt",
            Ext::Ieth => "IETH",
            Ext::CnpReserved => "CNP reserved",
        }
    }
}

impl fmt::Display for Ext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport service an opcode belongs to (its top three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (0x00-0x1f).
    Rc,
    /// Unreliable connected (0x20-0x3f).
    Uc,
    /// Unreliable datagram (0x60-0x7f).
    Ud,
    /// RoCEv2 congestion notification (0x81).
    Cnp,
}

/// What the packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (any variant).
    Send,
    /// RDMA WRITE (any variant).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// Acknowledge (ACK/NAK).
    Acknowledge,
    /// Atomic acknowledge.
    AtomicAcknowledge,
    /// Compare and swap.
    CompareSwap,
    /// Fetch and add.
    FetchAdd,
    /// Congestion notification.
    Cnp,
    /// RDMA FLUSH (IBA 1.5): make written data visible or persistent.
    Flush,
    /// RDMA ATOMIC WRITE (IBA 1.5): an 8-byte write done as one store.
    AtomicWrite,
}

/// The packet's place in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First packet of a multi-packet message.
    First,
    /// Middle packet of a multi-packet message.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The only packet of a message.
    Only,
}

impl Position {
    /// True for FIRST and ONLY: the packet starts a message.
    pub const fn starts_message(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }
    /// True for LAST and ONLY: the packet ends a message.
    pub const fn ends_message(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }
}

/// One row of the opcode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The raw opcode.
    pub code: u8,
    /// Name as used by Wireshark and rxe, e.g. `RC_SEND_ONLY`.
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// What the packet does.
    pub operation: Operation,
    /// Place in the message.
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [Ext],
    /// Whether the packet may carry payload.
    pub has_payload: bool,
    /// Request (requester to responder) or response.
    pub is_request: bool,
    /// Total length of `headers`, computed once when the table is built
    /// (the parser reads it for every packet).
    ext_bytes: u8,
    /// Where each extension header starts, from the start of the BTH,
    /// indexed by [`Ext`] (0: absent), so that reading one header of a
    /// parsed packet is one lookup.
    ext_at: [u8; 9],
}

impl OpcodeInfo {
    /// Total length of the extension headers.
    #[inline]
    pub const fn ext_len(&self) -> usize {
        self.ext_bytes as usize
    }
    /// Offset of the given extension header from the start of the BTH, if
    /// the opcode carries it.
    #[inline]
    pub const fn ext_offset(&self, ext: Ext) -> Option<usize> {
        match self.ext_at[ext as usize] {
            0 => None,
            at => Some(at as usize),
        }
    }
    /// Whether the opcode carries the given extension header.
    pub fn has(&self, ext: Ext) -> bool {
        self.headers.contains(&ext)
    }
    /// Byte offset of `ext` after the end of the BTH, if present.
    pub fn offset_of(&self, ext: Ext) -> Option<usize> {
        let mut off = 0;
        for h in self.headers {
            if *h == ext {
                return Some(off);
            }
            off += h.len();
        }
        None
    }
    /// Carries immediate data.
    pub fn has_imm(&self) -> bool {
        self.has(Ext::ImmDt)
    }
    /// Carries an invalidate rkey.
    pub fn has_ieth(&self) -> bool {
        self.has(Ext::Ieth)
    }
}

/// An opcode byte. Any value round-trips; [`Opcode::info`] says whether it
/// is one RoCE uses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Opcode(pub u8);

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => write!(f, "{}({:#04x})", i.name, self.0),
            None => write!(f, "Unknown({:#04x})", self.0),
        }
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => f.write_str(i.name),
            None => write!(f, "UNKNOWN_{:#04x}", self.0),
        }
    }
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Opcode {
        Opcode(v)
    }
}

impl Opcode {
    /// The table row, or `None` for reserved and unused opcodes.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }
    /// The table row, or [`crate::Error::UnknownOpcode`].
    #[inline]
    pub fn checked_info(self) -> crate::Result<&'static OpcodeInfo> {
        self.info().ok_or(crate::Error::UnknownOpcode(self.0))
    }
    /// All opcodes in the table, in numeric order.
    pub fn all() -> impl Iterator<Item = &'static OpcodeInfo> {
        TABLE.iter().filter_map(|r| r.as_ref())
    }
}

macro_rules! opcodes {
    ($( $konst:ident = $code:literal, $tr:ident, $op:ident, $pos:ident, [$($ext:ident),*], $payload:literal, $req:literal; )*) => {
        #[allow(missing_docs)]
        impl Opcode {
            $( pub const $konst: Opcode = Opcode($code); )*
        }
        const ROWS: &[OpcodeInfo] = &[
            $( OpcodeInfo {
                code: $code,
                name: stringify!($konst),
                transport: Transport::$tr,
                operation: Operation::$op,
                position: Position::$pos,
                headers: &[$(Ext::$ext),*],
                has_payload: $payload,
                is_request: $req,
                ext_bytes: sum_len(&[$(Ext::$ext),*]),
                ext_at: offsets(&[$(Ext::$ext),*]),
            }, )*
        ];
    };
}

opcodes! {
    RC_SEND_FIRST = 0x00, Rc, Send, First, [], true, true;
    RC_SEND_MIDDLE = 0x01, Rc, Send, Middle, [], true, true;
    RC_SEND_LAST = 0x02, Rc, Send, Last, [], true, true;
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, Rc, Send, Last, [ImmDt], true, true;
    RC_SEND_ONLY = 0x04, Rc, Send, Only, [], true, true;
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, Rc, Send, Only, [ImmDt], true, true;
    RC_RDMA_WRITE_FIRST = 0x06, Rc, RdmaWrite, First, [Reth], true, true;
    RC_RDMA_WRITE_MIDDLE = 0x07, Rc, RdmaWrite, Middle, [], true, true;
    RC_RDMA_WRITE_LAST = 0x08, Rc, RdmaWrite, Last, [], true, true;
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, Rc, RdmaWrite, Last, [ImmDt], true, true;
    RC_RDMA_WRITE_ONLY = 0x0a, Rc, RdmaWrite, Only, [Reth], true, true;
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, Rc, RdmaWrite, Only, [Reth, ImmDt], true, true;
    RC_RDMA_READ_REQUEST = 0x0c, Rc, RdmaReadRequest, Only, [Reth], false, true;
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, Rc, RdmaReadResponse, First, [Aeth], true, false;
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, Rc, RdmaReadResponse, Middle, [], true, false;
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, Rc, RdmaReadResponse, Last, [Aeth], true, false;
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, Rc, RdmaReadResponse, Only, [Aeth], true, false;
    RC_ACKNOWLEDGE = 0x11, Rc, Acknowledge, Only, [Aeth], false, false;
    RC_ATOMIC_ACKNOWLEDGE = 0x12, Rc, AtomicAcknowledge, Only, [Aeth, AtomicAckEth], false, false;
    RC_COMPARE_SWAP = 0x13, Rc, CompareSwap, Only, [AtomicEth], false, true;
    RC_FETCH_ADD = 0x14, Rc, FetchAdd, Only, [AtomicEth], false, true;
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, Rc, Send, Last, [Ieth], true, true;
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, Rc, Send, Only, [Ieth], true, true;
    RC_FLUSH = 0x1c, Rc, Flush, Only, [Feth, Reth], false, true;
    RC_ATOMIC_WRITE = 0x1d, Rc, AtomicWrite, Only, [Reth], true, true;
    UC_SEND_FIRST = 0x20, Uc, Send, First, [], true, true;
    UC_SEND_MIDDLE = 0x21, Uc, Send, Middle, [], true, true;
    UC_SEND_LAST = 0x22, Uc, Send, Last, [], true, true;
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, Uc, Send, Last, [ImmDt], true, true;
    UC_SEND_ONLY = 0x24, Uc, Send, Only, [], true, true;
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, Uc, Send, Only, [ImmDt], true, true;
    UC_RDMA_WRITE_FIRST = 0x26, Uc, RdmaWrite, First, [Reth], true, true;
    UC_RDMA_WRITE_MIDDLE = 0x27, Uc, RdmaWrite, Middle, [], true, true;
    UC_RDMA_WRITE_LAST = 0x28, Uc, RdmaWrite, Last, [], true, true;
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, Uc, RdmaWrite, Last, [ImmDt], true, true;
    UC_RDMA_WRITE_ONLY = 0x2a, Uc, RdmaWrite, Only, [Reth], true, true;
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, Uc, RdmaWrite, Only, [Reth, ImmDt], true, true;
    UD_SEND_ONLY = 0x64, Ud, Send, Only, [Deth], true, true;
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, Ud, Send, Only, [Deth, ImmDt], true, true;
    CNP = 0x81, Cnp, Cnp, Only, [CnpReserved], false, true;
}

/// What a request carries besides its operation, on the last or only
/// packet of its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestExtra {
    /// Nothing.
    None,
    /// Immediate data (ImmDt).
    Immediate,
    /// An R_Key to invalidate (IETH).
    Invalidate,
}

const N_TRANSPORT: usize = 4;
const N_OPERATION: usize = 11;
const N_POSITION: usize = 4;
const N_EXTRA: usize = 3;

const fn request_index(t: Transport, op: Operation, pos: Position, x: RequestExtra) -> usize {
    ((t as usize * N_OPERATION + op as usize) * N_POSITION + pos as usize) * N_EXTRA + x as usize
}

const fn has_ext(headers: &[Ext], e: Ext) -> bool {
    let mut i = 0;
    while i < headers.len() {
        if headers[i] as u8 == e as u8 {
            return true;
        }
        i += 1;
    }
    false
}

/// Request opcodes by (transport, operation, position, extra), built from
/// the table at compile time: the transports look their request opcodes
/// up here instead of restating them.
const REQUESTS: [Option<Opcode>; N_TRANSPORT * N_OPERATION * N_POSITION * N_EXTRA] = {
    let mut out = [None; N_TRANSPORT * N_OPERATION * N_POSITION * N_EXTRA];
    let mut i = 0;
    while i < ROWS.len() {
        let r = &ROWS[i];
        if r.is_request {
            let x = if has_ext(r.headers, Ext::ImmDt) {
                RequestExtra::Immediate
            } else if has_ext(r.headers, Ext::Ieth) {
                RequestExtra::Invalidate
            } else {
                RequestExtra::None
            };
            out[request_index(r.transport, r.operation, r.position, x)] = Some(Opcode(r.code));
        }
        i += 1;
    }
    out
};

impl Opcode {
    /// The request opcode of `transport` for packet `position` of an
    /// `operation` message that carries `extra` (which only the last or
    /// only packet shows), from the table; `None` when the transport has
    /// no such packet (UC has no READ, UD only SEND ONLY, ...).
    pub const fn request(
        transport: Transport,
        operation: Operation,
        position: Position,
        extra: RequestExtra,
    ) -> Option<Opcode> {
        let x = if position.ends_message() {
            extra
        } else {
            RequestExtra::None
        };
        REQUESTS[request_index(transport, operation, position, x)]
    }
}

/// Total length of a list of extension headers (at most 28 bytes).
const fn sum_len(headers: &[Ext]) -> u8 {
    let mut n = 0;
    let mut i = 0;
    while i < headers.len() {
        n += headers[i].len();
        i += 1;
    }
    n as u8
}

/// Where each of a list of extension headers starts after the BTH.
const fn offsets(headers: &[Ext]) -> [u8; 9] {
    let mut at = [0u8; 9];
    let mut off = crate::bth::BTH_LEN;
    let mut i = 0;
    while i < headers.len() {
        at[headers[i] as usize] = off as u8;
        off += headers[i].len();
        i += 1;
    }
    at
}

/// The table, indexed by the raw opcode.
pub static TABLE: [Option<OpcodeInfo>; 256] = build_table();

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    let mut i = 0;
    while i < ROWS.len() {
        t[ROWS[i].code as usize] = Some(ROWS[i]);
        i += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        assert_eq!(Opcode::all().count(), 40);
        for info in Opcode::all() {
            // every row is stored at its own index and names its transport
            assert_eq!(TABLE[info.code as usize].unwrap().code, info.code);
            let prefix = match info.transport {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Ud => "UD_",
                Transport::Cnp => "CNP",
            };
            assert!(info.name.starts_with(prefix), "{}", info.name);
            assert_eq!(info.name.contains("IMMEDIATE"), info.has_imm());
            assert_eq!(info.name.contains("INVALIDATE"), info.has_ieth());
            // headers in wire order (the enum's declaration order)
            for w in info.headers.windows(2) {
                assert!((w[0] as u8) < (w[1] as u8), "{}", info.name);
            }
            // each header's offset is the BTH plus the headers before it
            let mut off = crate::bth::BTH_LEN;
            for ext in Ext::ALL {
                if info.has(ext) {
                    assert_eq!(info.ext_offset(ext), Some(off), "{} {ext}", info.name);
                    off += ext.len();
                } else {
                    assert_eq!(info.ext_offset(ext), None, "{} {ext}", info.name);
                }
            }
            assert_eq!(off, crate::bth::BTH_LEN + info.ext_len(), "{}", info.name);
        }
        assert!(Opcode(0x15).info().is_none());
        assert!(Opcode(0x40).info().is_none()); // RD: not RoCE
        assert_eq!(
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .ext_len(),
            20
        );
        assert_eq!(
            Opcode::RC_ATOMIC_ACKNOWLEDGE
                .info()
                .unwrap()
                .offset_of(Ext::AtomicAckEth),
            Some(4)
        );
        assert_eq!(format!("{:?}", Opcode(0xff)), "Unknown(0xff)");
        assert_eq!(Opcode::CNP.to_string(), "CNP");
    }

    #[test]
    fn request_lookup_covers_every_request_row() {
        for info in Opcode::all().filter(|i| i.is_request && i.transport != Transport::Cnp) {
            let extra = if info.has_imm() {
                RequestExtra::Immediate
            } else if info.has_ieth() {
                RequestExtra::Invalidate
            } else {
                RequestExtra::None
            };
            assert_eq!(
                Opcode::request(info.transport, info.operation, info.position, extra),
                Some(Opcode(info.code)),
                "{}",
                info.name
            );
        }
        // Extras show only at the end of a message; transports lack some.
        assert_eq!(
            Opcode::request(
                Transport::Rc,
                Operation::Send,
                Position::First,
                RequestExtra::Immediate
            ),
            Some(Opcode::RC_SEND_FIRST)
        );
        assert_eq!(
            Opcode::request(
                Transport::Uc,
                Operation::RdmaReadRequest,
                Position::Only,
                RequestExtra::None
            ),
            None
        );
        assert_eq!(
            Opcode::request(
                Transport::Uc,
                Operation::Send,
                Position::Only,
                RequestExtra::Invalidate
            ),
            None
        );
        assert_eq!(
            Opcode::request(
                Transport::Ud,
                Operation::Send,
                Position::First,
                RequestExtra::None
            ),
            None
        );
    }
}
