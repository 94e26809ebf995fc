//! What RC and UC share about SEND and RDMA WRITE messages (IBA ch. 9.7):
//!
//! * segmentation: [`MAX_MSG_SIZE`], `npkts`, `position`,
//!   `segment` (which bytes packet `k` carries);
//! * the requester's packet of a SEND or WRITE WR: `message_headers`
//!   (RETH on the first packet, immediate data, IETH, SE on the last) and
//!   `fill_payload` (inline bytes or gathered from the WR's buffers);
//! * the responder's checks that do not depend on the transport, each
//!   returning the [`RespError`] it detects (what the error then does is
//!   the one table, [`RespError::action`]): `check_op_allowed`,
//!   `check_payload_length` (with [`payload_length_ok`]),
//!   `check_rkey`;
//! * the message being received, `Inbound`: a SEND placed into a
//!   receive WR (`Inbound::send_packet`), a WRITE placed into a memory
//!   region (`Inbound::write_packet`, `Inbound::place_write`).

use super::sgl::Resolved;
use super::status::{Refusal, RespError};
use super::QpConfig;
use crate::memory::MrInner;
use crate::observe::cause::{Cause, Refused, RkeyFault};
use crate::observe::{self, Event, Topic};
use crate::types::{Access, RecvWr, SendFlags, SendWr};
use std::sync::Arc;
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::{BthRepr, Ext, Operation, Position};

/// Largest message (as rxe: 2^31 bytes), RC and UC.
pub const MAX_MSG_SIZE: u64 = 1 << 31;

/// Position of packet `k` of `n`.
pub(crate) fn position(k: u32, n: u32) -> Position {
    match (k, n) {
        (_, 1) => Position::Only,
        (0, _) => Position::First,
        (k, n) if k + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// Number of packets (PSNs) a message of `len` bytes takes at `mtu`.
pub(crate) fn npkts(len: u64, mtu: u32) -> u32 {
    len.div_ceil(mtu as u64).max(1) as u32
}

/// The bytes packet `k` of a message of `len` bytes carries at `mtu`: its
/// offset in the message and its length.
pub(crate) fn segment(len: u64, k: u32, mtu: u64) -> (u64, usize) {
    let off = u64::from(k) * mtu;
    (off, (len - off.min(len)).min(mtu) as usize)
}

/// The payload length rule for a request packet, the same for RC and UC
/// (IBA ch. 9.7, the responder's length checks): every packet but the
/// last of a message carries exactly the path MTU; the last carries 1 to
/// MTU bytes; an only packet 0 to MTU.
pub fn payload_length_ok(position: Position, len: usize, mtu: usize) -> bool {
    match position {
        Position::First | Position::Middle => len == mtu,
        Position::Last => (1..=mtu).contains(&len),
        Position::Only => len <= mtu,
    }
}

/// The headers of a packet at `pos` of a SEND or RDMA WRITE WR of `len`
/// bytes, whose BTH (the opcode for `pos`, PSN, destination QP) is `bth`:
/// the RETH where the opcode has one (the first packet of a WRITE), the
/// immediate data, the R_Key to invalidate, SE on the last packet of a
/// solicited WR. `None` for an opcode the table does not know.
pub(crate) fn message_headers(
    bth: BthRepr,
    wr: &SendWr,
    len: u64,
    pos: Position,
) -> Option<Headers> {
    let info = bth.opcode.info()?;
    let mut h = Headers::new(bth);
    if info.has(Ext::Reth) {
        h.reth = Some(uroce_wire::RethRepr {
            va: wr.remote_addr,
            rkey: wr.rkey,
            dma_len: len as u32,
        });
    }
    if info.has_imm() {
        h.imm = Some(wr.imm_data);
    }
    if info.has_ieth() {
        h.ieth = Some(wr.invalidate_rkey);
    }
    h.bth.se = pos.ends_message() && wr.flags.contains(SendFlags::SOLICITED);
    Some(h)
}

/// Fills `dst` with the message bytes from offset `off` of a send WR: its
/// inline bytes (`inline`), or gathered from its resolved buffers `data`.
/// False when they are not there (a deregistered buffer). UD's one packet
/// is filled so too.
pub(crate) fn fill_payload(
    wr: &SendWr,
    data: &Resolved,
    inline: bool,
    off: u64,
    dst: &mut [u8],
) -> bool {
    if !inline {
        return data.gather(off, dst).is_ok();
    }
    let s = off as usize;
    match wr.inline_data.get(s..s + dst.len()) {
        Some(src) => {
            dst.copy_from_slice(src);
            true
        }
        None => false,
    }
}

/// Op validity (IBA ch. 9.7 and 10.6): the QP's access flags must allow
/// the operation (remote write, read, atomic); SENDs need none. Else:
/// invalid request.
pub(crate) fn check_op_allowed(op: Operation, qp_access: Access) -> Result<(), Refusal> {
    let need = match op {
        Operation::RdmaWrite => Access::REMOTE_WRITE,
        Operation::RdmaReadRequest => Access::REMOTE_READ,
        Operation::CompareSwap | Operation::FetchAdd => Access::REMOTE_ATOMIC,
        Operation::AtomicWrite => Access::REMOTE_WRITE,
        // FLUSH: what it needs depends on its FETH (RC's `flush_access`).
        _ => Access::empty(),
    };
    if qp_access.contains(need) {
        Ok(())
    } else {
        Err(RespError::InvalidRequest.with(Refused::OpNotAllowed { qp_access }))
    }
}

/// Packet length (IBA ch. 9.7, [`payload_length_ok`]): every packet of a
/// message but the last carries the path MTU. Else: invalid request.
pub(crate) fn check_payload_length(pkt: &ParsedPacket<'_>, mtu: usize) -> Result<(), Refusal> {
    let len = pkt.payload.len();
    if pkt.info.has_payload && !payload_length_ok(pkt.info.position, len, mtu) {
        Err(RespError::InvalidRequest.with(Refused::PayloadLength { len, mtu }))
    } else {
        Ok(())
    }
}

/// A region and the offset in it where remote memory `va` starts.
pub(crate) type Target = (Option<Arc<MrInner>>, usize);

/// R_Key check (IBA ch. 9.7 and 10.6: key, PD, access rights, bounds) of
/// an access of `len` bytes at `va` needing `need`; an access of length
/// zero needs no valid key (and has no region). Else: remote access error.
pub(crate) fn check_rkey(
    cfg: &QpConfig,
    rkey: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Result<Target, Refusal> {
    if len == 0 {
        return Ok((None, 0));
    }
    cfg.keys
        .check_rkey(rkey, cfg.pd, cfg.qpn, va, len, need)
        .map(|(mr, off)| (Some(mr), off))
        .map_err(|e| {
            let f = RkeyFault::found(&cfg.keys, cfg.pd, (rkey, va, len), need, e);
            RespError::RemoteAccess.with(Refused::Rkey(f))
        })
}

/// A receive WR taken for a message, its buffers resolved.
#[derive(Debug)]
pub(crate) struct RecvTarget {
    pub wr_id: u64,
    pub sgl: Resolved,
}

impl RecvTarget {
    /// Resolves the buffers of receive WR `wr` for writing. `Err` with
    /// the SGE that failed when they are bad: a local error of the receive
    /// queue.
    pub fn resolve(cfg: &QpConfig, wr: &RecvWr) -> Result<RecvTarget, Cause> {
        match Resolved::resolve(&cfg.keys, cfg.recv_pd, &wr.sg_list, Access::LOCAL_WRITE) {
            Ok(sgl) => Ok(RecvTarget {
                wr_id: wr.wr_id,
                sgl,
            }),
            Err(f) => Err(Cause::RecvWr {
                wr_id: wr.wr_id,
                lkey: Some(f),
            }),
        }
    }
}

/// The message being received across packets (RC and UC responders).
#[derive(Debug)]
pub(crate) enum Inbound {
    /// A SEND, into a receive WR.
    Send { recv: RecvTarget, written: u64 },
    /// An RDMA WRITE, into a region.
    Write {
        mr: Option<Arc<MrInner>>,
        offset: usize,
        total: u64,
        written: u64,
    },
}

impl Inbound {
    /// Whether a MIDDLE or LAST packet of `op` continues this message (op
    /// sequence, IBA ch. 9.7).
    pub fn continues(&self, op: Operation) -> bool {
        matches!(
            (self, op),
            (Inbound::Send { .. }, Operation::Send) | (Inbound::Write { .. }, Operation::RdmaWrite)
        )
    }

    /// The receive WR of a SEND, if this is one.
    pub fn into_recv(self) -> Option<RecvTarget> {
        match self {
            Inbound::Send { recv, .. } => Some(recv),
            Inbound::Write { .. } => None,
        }
    }

    /// Places a SEND packet into the receive WR of the SEND in progress
    /// (`cur`). Errors: no SEND in progress (invalid request); the message
    /// is longer than the WR's buffers (length error); a buffer was
    /// deregistered under the WR (the WR's own fault: remote operational
    /// error). At the last packet the message is finished: returns its
    /// receive WR and length, and nothing is in progress any more.
    pub fn send_packet(
        cur: &mut Option<Inbound>,
        pkt: &ParsedPacket<'_>,
    ) -> Result<Option<(RecvTarget, u64)>, RespError> {
        let Some(Inbound::Send { recv, written }) = cur else {
            return Err(RespError::InvalidRequest);
        };
        match recv.sgl.scatter(*written, pkt.payload) {
            Ok(()) => {}
            Err(crate::memory::MemError::OutOfBounds { .. }) => return Err(RespError::LengthError),
            Err(_) => return Err(RespError::RemoteOperational),
        }
        *written += pkt.payload.len() as u64;
        if !pkt.info.position.ends_message() {
            return Ok(None);
        }
        Ok(cur.take().and_then(|m| match m {
            Inbound::Send { recv, written } => Some((recv, written)),
            Inbound::Write { .. } => None,
        }))
    }

    /// The checks of a WRITE packet before anything is placed: a first
    /// packet opens the WRITE from its RETH (invalid request without one;
    /// the R_Key checked, [`check_rkey`]); then a WRITE must be in
    /// progress and the packet must fit its length (the last one ending
    /// it exactly). Else: invalid request.
    pub fn write_packet(
        cur: &mut Option<Inbound>,
        cfg: &QpConfig,
        pkt: &ParsedPacket<'_>,
    ) -> Result<(), Refusal> {
        if pkt.info.position.starts_message() {
            let reth = pkt.reth().ok_or(RespError::InvalidRequest)?;
            let total = u64::from(reth.dma_len);
            let (mr, offset) = check_rkey(cfg, reth.rkey, reth.va, total, Access::REMOTE_WRITE)?;
            *cur = Some(Inbound::Write {
                mr,
                offset,
                total,
                written: 0,
            });
        }
        let Some(Inbound::Write { total, written, .. }) = cur else {
            return Err(RespError::InvalidRequest.into());
        };
        let end = *written + pkt.payload.len() as u64;
        if end > *total || (pkt.info.position.ends_message() && end != *total) {
            return Err(RespError::InvalidRequest.with(Refused::WriteLength));
        }
        Ok(())
    }

    /// Writes a WRITE packet (checked by [`Inbound::write_packet`]) at its
    /// place; the region gone is a remote access error. At the last packet
    /// the WRITE is finished: returns its length, and nothing is in
    /// progress any more.
    pub fn place_write(
        cur: &mut Option<Inbound>,
        pkt: &ParsedPacket<'_>,
    ) -> Result<Option<u64>, RespError> {
        let Some(Inbound::Write {
            mr,
            offset,
            total,
            written,
        }) = cur
        else {
            return Err(RespError::InvalidRequest);
        };
        if !pkt.payload.is_empty() {
            let mr = mr.as_ref().ok_or(RespError::RemoteAccess)?;
            let at = *offset + *written as usize;
            observe::tell(Topic::CHECK_BUFFER, || Event::NicWrote {
                mr,
                offset: at,
                len: pkt.payload.len(),
            });
            mr.write(*offset + *written as usize, pkt.payload)
                .map_err(|_| RespError::RemoteAccess)?;
        }
        *written += pkt.payload.len() as u64;
        if !pkt.info.position.ends_message() {
            return Ok(None);
        }
        let total = *total;
        *cur = None;
        Ok(Some(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_segments() {
        assert_eq!(position(0, 1), Position::Only);
        assert_eq!(position(0, 3), Position::First);
        assert_eq!(position(1, 3), Position::Middle);
        assert_eq!(position(2, 3), Position::Last);
        assert_eq!(npkts(0, 1024), 1);
        assert_eq!(npkts(2049, 1024), 3);
        assert_eq!(segment(2049, 0, 1024), (0, 1024));
        assert_eq!(segment(2049, 2, 1024), (2048, 1));
        assert_eq!(segment(0, 0, 1024), (0, 0));
    }
}
