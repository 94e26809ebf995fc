//! The one place that maps a responder's failed check to its NAK and to
//! the completion statuses on both sides (IBA 9.7.5.2.x, 9.9; rxe_resp.c's
//! error states).

use crate::types::WcStatus;
use uroce_wire::NakCode;

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
}

impl RespError {
    /// The NAK code sent.
    pub const fn nak(self) -> NakCode {
        match self {
            RespError::InvalidRequest | RespError::LengthError | RespError::Rnr => {
                NakCode::InvalidRequest
            }
            RespError::RemoteAccess => NakCode::RemoteAccessError,
            RespError::RemoteOperational => NakCode::RemoteOperationalError,
        }
    }
    /// Status of a receive WR consumed by the failed message, if any.
    pub const fn recv_status(self) -> WcStatus {
        match self {
            RespError::InvalidRequest | RespError::Rnr => WcStatus::RemInvReqErr,
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
