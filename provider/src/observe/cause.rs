//! Why a WR, a request or a QP failed, as the facts the failing check
//! found: the check, the key, address and length, the region's bounds and
//! rights, the NAK's syndrome, the PSNs, the peer.
//!
//! The transports build a [`Fault`] where a check fails (error paths
//! only; every cause here is `Copy` and allocates nothing) and hand it to
//! the QP's [`Explanation`], the line a QP keeps of an error; the words
//! are `Display` in [`crate::diag::explain`], the one place that composes
//! them.

use crate::memory::{KeyError, KeyTable, MrInner, MwError, PdId};
use crate::types::{Access, Sge, WcStatus, WrOpcode};
use std::net::IpAddr;
use uroce_wire::aeth::{AethSyndrome, NakCode};

/// A memory region as a failed key check saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Its first address.
    pub iova: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Its protection domain.
    pub pd: PdId,
    /// Its access rights.
    pub access: Access,
}

impl Region {
    /// The facts of `mr`.
    pub fn of(mr: &MrInner) -> Region {
        Region {
            iova: mr.iova(),
            len: mr.len(),
            pd: mr.pd(),
            access: mr.access(),
        }
    }
}

/// What the key of a failed check names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// A memory region.
    Region(Region),
    /// A memory window (R_Keys only).
    Window,
    /// Nothing (never registered, or deregistered).
    Nothing,
}

/// A failed key check (lkey or R_Key) of an access needing `need` by a QP
/// of PD `pd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyFault {
    /// What the check returned.
    pub err: KeyError,
    /// What the key names.
    pub named: Named,
    /// The QP's protection domain.
    pub pd: PdId,
    /// The rights the access needs.
    pub need: Access,
}

impl KeyFault {
    /// The check of a QP of PD `pd` needing `need` gave `err`; the key
    /// names `named`.
    pub fn new(err: KeyError, named: Named, pd: PdId, need: Access) -> KeyFault {
        KeyFault {
            err,
            named,
            pd,
            need,
        }
    }
}

/// The first SGE of a list that failed its lkey check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LkeyFault {
    /// Its place in the list.
    pub index: usize,
    /// The SGE.
    pub sge: Sge,
    /// Why it failed.
    pub key: KeyFault,
}

impl LkeyFault {
    /// The lkey check of SGE `index` (`sge`) failed with `err`: the facts,
    /// with the region the key names (looked up on the error path only).
    pub fn found(
        keys: &KeyTable,
        pd: PdId,
        index: usize,
        sge: Sge,
        need: Access,
        err: KeyError,
    ) -> LkeyFault {
        let named = keys
            .find_lkey(sge.lkey)
            .map_or(Named::Nothing, |m| Named::Region(Region::of(&m)));
        let key = KeyFault::new(err, named, pd, need);
        LkeyFault { index, sge, key }
    }
}

/// A failed R_Key check of an access of `len` bytes at `va`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RkeyFault {
    /// The R_Key.
    pub rkey: u32,
    /// The address.
    pub va: u64,
    /// The length.
    pub len: u64,
    /// Why it failed.
    pub key: KeyFault,
}

impl RkeyFault {
    /// The R_Key check of QP PD `pd` needing `need` failed with `err`: the
    /// facts, with what the key names (looked up on the error path only).
    pub fn found(
        keys: &KeyTable,
        pd: PdId,
        (rkey, va, len): (u32, u64, u64),
        need: Access,
        err: KeyError,
    ) -> RkeyFault {
        let named = match keys.find_rkey(rkey) {
            Some(m) => Named::Region(Region::of(&m)),
            None if keys.window(rkey).is_some() => Named::Window,
            None => Named::Nothing,
        };
        let key = KeyFault::new(err, named, pd, need);
        RkeyFault { rkey, va, len, key }
    }
}

/// The connected peer: its address and QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its address.
    pub ip: IpAddr,
    /// Its QPN.
    pub qpn: u32,
}

/// What a failed local check of a send WR found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrCheck {
    /// An SGE failed its lkey check.
    Lkey(LkeyFault),
    /// Its SGEs pass their lkey checks now: a region went away while the
    /// WR was being sent.
    KeysPassNow,
    /// An atomic of other than 8 bytes.
    AtomicLen {
        /// The WR's bytes.
        len: u64,
    },
    /// A message longer than the QP sends.
    TooLong {
        /// The WR's bytes.
        len: u64,
        /// The largest message the QP sends.
        max: u64,
    },
    /// An operation the QP does not do.
    BadOp,
    /// A local operation (BIND_MW, LOCAL_INV) the QP does not have.
    NotLocal,
    /// BIND_MW without a window.
    NoWindow,
    /// BIND_MW refused.
    Bind {
        /// The window's R_Key.
        mw_rkey: u32,
        /// The region's lkey.
        mr_lkey: u32,
        /// The address bound.
        addr: u64,
        /// The length bound.
        len: u64,
        /// Why.
        err: MwError,
    },
    /// LOCAL_INV refused.
    Invalidate {
        /// The R_Key.
        rkey: u32,
        /// Why.
        err: MwError,
    },
    /// No check names it: the status alone.
    Status(WcStatus),
}

/// What a responder's check found wrong with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Op sequence: it starts a message while one is in progress
    /// (`starts`), or continues none.
    OpSequence {
        /// It starts a message.
        starts: bool,
    },
    /// Op validity: the QP's access flags do not allow it.
    OpNotAllowed {
        /// The QP's access flags.
        qp_access: Access,
    },
    /// Resources: the QP offers no responder resources.
    NoResources,
    /// Length: the payload breaks the rule for its place in the message.
    PayloadLength {
        /// Its payload bytes.
        len: usize,
        /// The path MTU.
        mtu: usize,
    },
    /// The R_Key check.
    Rkey(RkeyFault),
    /// An atomic's address is not 8-byte aligned.
    Misaligned {
        /// The address.
        va: u64,
    },
    /// A SEND exceeds its receive WR's buffers.
    SendTooLong {
        /// Its bytes so far.
        so_far: u64,
        /// The receive WR's bytes.
        cap: u64,
    },
    /// The message exceeds the receive WR's buffers.
    TooLong,
    /// The region of the WRITE in progress went away mid-message.
    WriteRegionLost,
    /// SEND with Invalidate of an R_Key that is no window bound through
    /// this QP.
    Invalidate {
        /// The R_Key.
        rkey: u32,
    },
    /// The WRITE's packets do not add up to its RETH's DMA length.
    WriteLength,
    /// No check names it: the error's name in the table.
    Other(&'static str),
}

/// Why something failed: the facts of the check that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A send WR failed a local check.
    SendWr {
        /// Its operation.
        op: WrOpcode,
        /// Its ID.
        wr_id: u64,
        /// What failed.
        check: WrCheck,
    },
    /// A receive WR's buffers failed their lkey check (`None`: they pass
    /// now).
    RecvWr {
        /// Its ID.
        wr_id: u64,
        /// The SGE that failed.
        lkey: Option<LkeyFault>,
    },
    /// A receive WR's buffer went away while a message was placed in it.
    RecvBufferLost {
        /// Its ID.
        wr_id: u64,
    },
    /// A completion was lost to a full CQ (QP_FATAL).
    CqOverflow,
    /// `ibv_modify_qp` moved the QP to ERR.
    ModifiedToErr,
    /// No ACK came for `psn`: the retries are spent.
    RetryExceeded {
        /// The peer.
        peer: Peer,
        /// The PSN unacknowledged.
        psn: u32,
        /// The QP's `retry_cnt`.
        retry_cnt: u8,
        /// The QP's `timeout` attribute.
        timeout: u8,
        /// That timeout in nanoseconds.
        timeout_ns: u64,
        /// How long ago the peer was last heard from (`None`: never
        /// since the QP was connected).
        last_seen_ns: Option<u64>,
    },
    /// RNR NAKs for `psn` spent the RNR retries.
    RnrRetryExceeded {
        /// The peer.
        peer: Peer,
        /// The PSN NAKed.
        psn: u32,
        /// The syndrome.
        syndrome: AethSyndrome,
        /// Its RNR timer field.
        timer: u8,
        /// That timer in nanoseconds.
        timer_ns: u64,
        /// The QP's `rnr_retry`.
        rnr_retry: u8,
        /// How long ago the peer was last heard from.
        last_seen_ns: Option<u64>,
    },
    /// The peer NAKed `psn`.
    NakReceived {
        /// The peer.
        peer: Peer,
        /// The syndrome.
        syndrome: AethSyndrome,
        /// The PSN.
        psn: u32,
        /// What the WR holding `psn` asked for.
        asked: Option<Asked>,
    },
    /// A responder's check refused a request.
    Request {
        /// Its opcode's name.
        name: &'static str,
        /// Its PSN.
        psn: u32,
        /// What failed.
        refused: Refused,
    },
    /// The region a READ was answered from went away while its responses
    /// went out.
    ReadSourceLost,
    /// A UC SEND exceeded its receive WR: the message is dropped.
    UcSendTooLong {
        /// The packet's opcode name.
        name: &'static str,
        /// Its PSN.
        psn: u32,
        /// The receive WR.
        wr_id: u64,
        /// Its bytes.
        cap: u64,
    },
    /// A receive WR taken from an SRQ by a message UC then dropped.
    UcSrqDropped {
        /// The receive WR.
        wr_id: u64,
    },
    /// A responder's error no check described: its name in the table.
    Resp(&'static str),
    /// A datagram exceeded its receive WR: it is dropped.
    UdTooLong {
        /// Its PSN.
        psn: u32,
        /// Its sender.
        src: IpAddr,
        /// Its sender's QP.
        src_qp: u32,
        /// Its GRH bytes.
        grh: usize,
        /// Its payload bytes.
        payload: usize,
        /// The receive WR.
        wr_id: u64,
        /// Its bytes.
        cap: u64,
    },
}

/// What the WR of a NAKed PSN asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    /// Its ID.
    pub wr_id: u64,
    /// Its operation.
    pub op: WrOpcode,
    /// Its R_Key (not for SENDs).
    pub rkey: u32,
    /// Its remote address (not for SENDs).
    pub va: u64,
    /// Its bytes.
    pub len: u64,
}

/// What follows a cause: what the failure then did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Nothing more to say.
    Nothing,
    /// The QP moves to SQE and flushes its send queue (UC, UD).
    Sqe,
    /// The responder sent no NAK (IBA class J): the message is
    /// acknowledged to the peer, the QP goes to ERR.
    NoNak {
        /// To whom.
        peer: Peer,
        /// The PSN acknowledged.
        psn: u32,
    },
    /// The responder sent a NAK.
    NakSent {
        /// Its code.
        nak: NakCode,
        /// To whom.
        peer: Peer,
        /// For which PSN.
        psn: u32,
    },
}

/// One failure of a QP: its cause and what followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The check that failed.
    pub cause: Cause,
    /// What followed.
    pub then: Then,
}

impl From<Cause> for Fault {
    fn from(cause: Cause) -> Fault {
        Fault {
            cause,
            then: Then::Nothing,
        }
    }
}

/// Which side's check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A check of the QP's own WR, before or while it was sent (local
    /// errors, IBA 9.9.2 class A).
    Local,
    /// The requester learned it from its peer (a NAK) or from the peer's
    /// silence (retry or RNR retry exceeded).
    Requester,
    /// The responder's check of a request from the peer (IBA 9.9.3).
    Responder,
}

/// One explained error of a QP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The QP.
    pub qpn: u32,
    /// The completion status explained; `None` when no completion of the
    /// QP carries it (the responder of a WRITE that failed its R_Key
    /// check completes nothing: its QP moves to ERR).
    pub status: Option<WcStatus>,
    /// Whose check failed.
    pub side: Side,
    /// What failed, in the spec's terms.
    pub text: String,
}

impl Side {
    /// The side that explains a requester's completion with `status`: the
    /// requester for what the peer answered or did not, else local.
    pub fn of_send_status(status: WcStatus) -> Side {
        use WcStatus::*;
        match status {
            RemAccessErr | RemInvReqErr | RemOpErr | RemInvRdReqErr | BadRespErr | RetryExcErr
            | RnrRetryExcErr | RemAbortErr => Side::Requester,
            _ => Side::Local,
        }
    }
}

/// What a QP keeps of its errors.
#[derive(Debug, Default, Clone)]
pub struct ExplainLog {
    /// The last explanation.
    pub last: Option<Explanation>,
    /// Why the QP is in ERR: the explanation that moved it there
    /// (forgotten at RESET).
    pub cause: Option<Explanation>,
}
