//! The one place that maps a responder's failed check to what it does:
//! per transport ([`RespError::action`]: RC NAKs and may move the QP to
//! ERR, UC drops the message, UD drops the datagram), the NAK code, and
//! the completion statuses on both sides (IBA ch. 9.7-9.9; rxe_resp.c's
//! error states).

use crate::observe::cause::Refused;
use crate::types::{QpType, WcStatus};
use uroce_wire::NakCode;

/// What a failed responder check does (see [`RespError::action`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// RC: this NAK goes to the requester; the receive WR of the message
    /// in progress completes with `recv_status`; the QP goes to ERR.
    NakAndError {
        /// The NAK code.
        nak: NakCode,
        /// Status of a receive WR the message consumed.
        recv_status: WcStatus,
    },
    /// RC, IBA 9.9.3 class J (rxe's `RESPST_ERR_INVALIDATE_RKEY`): no
    /// NAK; the message is acknowledged as received, its receive WR
    /// completes with `recv_status`, and the QP goes to ERR.
    ErrorNoNak {
        /// Status of the message's receive WR.
        recv_status: WcStatus,
    },
    /// RC, no receive WR for a SEND: an RNR NAK; nothing is consumed and
    /// the QP stays up.
    RnrNak,
    /// UC: the message is dropped and reception resumes at the next FIRST
    /// or ONLY packet; the QP stays up. A receive WR the message took is
    /// kept for the next message, or, taken from an SRQ, completes with
    /// `srq_status`.
    DropMessage {
        /// Status of a receive WR taken from an SRQ.
        srq_status: WcStatus,
    },
    /// UD: the datagram is dropped; the QP stays up. A receive WR the
    /// datagram took (one too small for it) completes with `recv_status`.
    DropDatagram {
        /// Status of a receive WR the datagram consumed.
        recv_status: WcStatus,
    },
}

/// A responder check that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RespError {
    /// Opcode out of sequence, opcode the QP does not allow, bad length of a
    /// middle packet, misaligned atomic: NAK invalid request.
    InvalidRequest,
    /// The SEND does not fit the receive buffers: the receive WR completes
    /// with LOC_LEN_ERR, the requester sees an invalid request.
    LengthError,
    /// Bad R_Key, bounds, PD or access: NAK remote access error.
    RemoteAccess,
    /// The receive WR's own buffers are bad, or memory vanished: NAK
    /// remote operational error.
    RemoteOperational,
    /// No receive WR for a SEND: an RNR NAK was queued; nothing consumed,
    /// not an error of the QP.
    Rnr,
    /// The invalidation a SEND with Invalidate asks for fails (an R_Key of
    /// no memory window, of a type 1 window, or of one bound through
    /// another QP): class J, its receive WR completes with REM_INV_REQ_ERR
    /// and no NAK is sent.
    InvalidateFailed,
}

/// A responder check that failed, with what it found (`None`: the error
/// alone says it, described where it is handled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The error (what it does: [`RespError::action`]).
    pub err: RespError,
    /// The check's facts.
    pub why: Option<Refused>,
}

impl From<RespError> for Refusal {
    fn from(err: RespError) -> Refusal {
        Refusal { err, why: None }
    }
}

impl RespError {
    /// The error with the facts of the check that found it.
    pub fn with(self, why: Refused) -> Refusal {
        Refusal {
            err: self,
            why: Some(why),
        }
    }

    /// Its name (as `Debug` writes it).
    pub fn name(self) -> &'static str {
        match self {
            RespError::InvalidRequest => "InvalidRequest",
            RespError::LengthError => "LengthError",
            RespError::RemoteAccess => "RemoteAccess",
            RespError::RemoteOperational => "RemoteOperational",
            RespError::Rnr => "Rnr",
            RespError::InvalidateFailed => "InvalidateFailed",
        }
    }

    /// What the error does on a QP of type `t`: the one table of the
    /// responder's error policy. A new transport is a new column here.
    pub const fn action(self, t: QpType) -> ErrorAction {
        match (t, self) {
            (QpType::Rc, RespError::Rnr) => ErrorAction::RnrNak,
            (QpType::Rc, e @ RespError::InvalidateFailed) => ErrorAction::ErrorNoNak {
                recv_status: e.recv_status(),
            },
            (QpType::Rc, e) => ErrorAction::NakAndError {
                nak: e.nak(),
                recv_status: e.recv_status(),
            },
            (QpType::Uc, e) => ErrorAction::DropMessage {
                srq_status: e.recv_status(),
            },
            (QpType::Ud, e) => ErrorAction::DropDatagram {
                recv_status: e.recv_status(),
            },
        }
    }
    /// The NAK code sent (class J sends none: its column says so).
    pub const fn nak(self) -> NakCode {
        match self {
            RespError::InvalidRequest
            | RespError::LengthError
            | RespError::Rnr
            | RespError::InvalidateFailed => NakCode::InvalidRequest,
            RespError::RemoteAccess => NakCode::RemoteAccessError,
            RespError::RemoteOperational => NakCode::RemoteOperationalError,
        }
    }
    /// Status of a receive WR consumed by the failed message, if any.
    pub const fn recv_status(self) -> WcStatus {
        match self {
            RespError::InvalidRequest | RespError::Rnr | RespError::InvalidateFailed => {
                WcStatus::RemInvReqErr
            }
            RespError::LengthError => WcStatus::LocLenErr,
            RespError::RemoteAccess => WcStatus::RemAccessErr,
            RespError::RemoteOperational => WcStatus::LocProtErr,
        }
    }
}

/// The status a requester gives a WR NAKed with `code`.
pub const fn requester_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
        NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
        NakCode::PsnSequenceError | NakCode::Reserved(_) => WcStatus::BadRespErr,
    }
}
