//! Errors that explain themselves: every error completion and every move
//! of a QP to ERR gets one line in the spec's terms, saying which check
//! failed on which side: for a local error the lkey, address, length and
//! the region's bounds and rights; for a NAK its syndrome and PSN and, on
//! the responder, the R_Key, address, length and the region that failed;
//! for "retry exceeded" the retries spent, the timeout, the peer and when
//! a packet from it was last seen; for flushes why the QP is in ERR.
//!
//! The line is always kept per QP (the last one, and the one that moved
//! the QP to ERR: [`ExplainLog`], read through the QP's
//! `StateCell`) and, when the environment has `UROCE_EXPLAIN=1`, told
//! through the seam ([`Topic::EXPLAIN`]) to the tools, which print it to
//! stderr.
//!
//! Cost: nothing on the success path. The check that fails returns its
//! facts as a typed cause ([`crate::observe::cause`]: `Copy`, no
//! allocation); the words are the `Display` of those causes, here, and are
//! composed only when an error is explained.

use crate::memory::{KeyError, MemError};
use crate::observe::cause::{
    Cause, Fault, KeyFault, LkeyFault, Named, Peer, Refused, Region, RkeyFault, Then, WrCheck,
};
pub use crate::observe::cause::{ExplainLog, Explanation, Side};
use crate::observe::{self, Topic};
use crate::types::{Access, WcStatus, WrOpcode};
use std::fmt;
use std::sync::Once;
use uroce_wire::aeth::AethSyndrome;

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Requester => "requester",
            Side::Responder => "responder",
        })
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "QP {:#08x} ", self.qpn)?;
        match self.status {
            Some(s) => write!(f, "{}", status_name(s))?,
            None => f.write_str("enters ERR")?,
        }
        write!(f, " ({}): {}", self.side, self.text)
    }
}

/// Reads `UROCE_EXPLAIN` (once per process): with `1`, the seam tells
/// the tools each error a QP explains ([`Topic::EXPLAIN`]) and they
/// print it.
pub fn init_from_env() {
    static FROM_ENV: Once = Once::new();
    FROM_ENV.call_once(|| {
        if std::env::var_os("UROCE_EXPLAIN").is_some_and(|v| v == "1") {
            observe::want(Topic::EXPLAIN);
        }
    });
}

/// Prints `e` to stderr.
pub fn emit(e: &Explanation) {
    eprintln!("uroce: {e}");
}

/// The name rdma-core gives `s` (`enum ibv_wc_status`).
pub fn status_name(s: WcStatus) -> &'static str {
    use WcStatus::*;
    match s {
        Success => "IBV_WC_SUCCESS",
        LocLenErr => "IBV_WC_LOC_LEN_ERR",
        LocQpOpErr => "IBV_WC_LOC_QP_OP_ERR",
        LocEecOpErr => "IBV_WC_LOC_EEC_OP_ERR",
        LocProtErr => "IBV_WC_LOC_PROT_ERR",
        WrFlushErr => "IBV_WC_WR_FLUSH_ERR",
        MwBindErr => "IBV_WC_MW_BIND_ERR",
        BadRespErr => "IBV_WC_BAD_RESP_ERR",
        LocAccessErr => "IBV_WC_LOC_ACCESS_ERR",
        RemInvReqErr => "IBV_WC_REM_INV_REQ_ERR",
        RemAccessErr => "IBV_WC_REM_ACCESS_ERR",
        RemOpErr => "IBV_WC_REM_OP_ERR",
        RetryExcErr => "IBV_WC_RETRY_EXC_ERR",
        RnrRetryExcErr => "IBV_WC_RNR_RETRY_EXC_ERR",
        LocRddViolErr => "IBV_WC_LOC_RDD_VIOL_ERR",
        RemInvRdReqErr => "IBV_WC_REM_INV_RD_REQ_ERR",
        RemAbortErr => "IBV_WC_REM_ABORT_ERR",
        InvEecnErr => "IBV_WC_INV_EECN_ERR",
        InvEecStateErr => "IBV_WC_INV_EEC_STATE_ERR",
        FatalErr => "IBV_WC_FATAL_ERR",
        RespTimeoutErr => "IBV_WC_RESP_TIMEOUT_ERR",
        GeneralErr => "IBV_WC_GENERAL_ERR",
    }
}

/// Access rights as `REMOTE_WRITE|LOCAL_WRITE`, or `none`.
pub fn rights(a: Access) -> String {
    let names: Vec<&str> = a.iter_names().map(|(n, _)| n).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join("|")
    }
}

/// `[start, end)` of a region of `len` bytes at `iova`.
struct Bounds(u64, usize);

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Bounds(iova, len) = *self;
        write!(f, "[{iova:#x}, {:#x})", iova.wrapping_add(len as u64))
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "region {} ({} bytes, PD {}) rights {}",
            Bounds(self.iova, self.len),
            self.len,
            self.pd,
            rights(self.access)
        )
    }
}

impl fmt::Display for KeyFault {
    /// Why a key check of PD `pd` needing `need` gave `err`, with the
    /// region the key names (if any): its bounds, PD and rights.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = match (self.err, self.named) {
            (KeyError::BadKey(_), _) | (_, Named::Nothing) => {
                return f
                    .write_str("no memory region has this key (never registered, or deregistered)")
            }
            (err, Named::Window) => {
                return write!(f, "the memory window with this R_Key refuses it: {err}")
            }
            (_, Named::Region(r)) => r,
        };
        match self.err {
            KeyError::PdMismatch => write!(
                f,
                "the {r} is in another protection domain than the QP's (PD {})",
                self.pd
            ),
            KeyError::Access(_) => write!(f, "the {r} lacks {}", rights(self.need)),
            KeyError::Mem(MemError::OutOfBounds { .. }) => {
                write!(f, "the range is outside the {r}")
            }
            KeyError::Mem(MemError::Invalid) => write!(f, "the {r} is being deregistered"),
            KeyError::Mem(e) => write!(f, "{e} in the {r}"),
            KeyError::BadKey(_) => Ok(()),
        }
    }
}

impl fmt::Display for LkeyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.sge;
        write!(
            f,
            "SGE {}: lkey {:#x} addr {:#x} len {}",
            self.index, s.lkey, s.addr, s.length
        )?;
        if !self.key.need.is_empty() {
            write!(f, " needs {}", rights(self.key.need))?;
        }
        write!(f, ": {}", self.key)
    }
}

impl fmt::Display for RkeyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rkey {:#x} va {:#x} len {} needs {}: {}",
            self.rkey,
            self.va,
            self.len,
            rights(self.key.need),
            self.key
        )
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {} QP {:#08x}", self.ip, self.qpn)
    }
}

/// When the connected peer was last heard from.
struct LastSeen(Option<u64>);

impl fmt::Display for LastSeen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(ns) => write!(f, "last packet from it {} ago", ms(ns)),
            None => f.write_str("no packet from it since the QP was connected"),
        }
    }
}

/// A send WR's local check, after `{op:?} WR {wr_id:#x}`.
fn wr_check(f: &mut fmt::Formatter<'_>, op: WrOpcode, wr_id: u64, c: &WrCheck) -> fmt::Result {
    match *c {
        WrCheck::Bind {
            mw_rkey,
            mr_lkey,
            addr,
            len,
            err,
        } => {
            return write!(
                f,
                "BIND_MW WR {wr_id:#x} of window rkey {mw_rkey:#x} to lkey {mr_lkey:#x} \
                 addr {addr:#x} len {len}: {err}"
            )
        }
        WrCheck::NoWindow => return write!(f, "BIND_MW WR {wr_id:#x} names no window"),
        WrCheck::Invalidate { rkey, err } => {
            return write!(f, "LOCAL_INV WR {wr_id:#x} of rkey {rkey:#x}: {err}")
        }
        WrCheck::NotLocal => return write!(f, "{op:?} WR {wr_id:#x} is not a local operation"),
        _ => {}
    }
    write!(f, "{op:?} WR {wr_id:#x}: ")?;
    match *c {
        WrCheck::Lkey(l) => write!(f, "{l}"),
        WrCheck::KeysPassNow => f.write_str(
            "its SGEs pass their lkey checks now: a region was deregistered while the WR \
             was being sent",
        ),
        WrCheck::AtomicLen { len } => {
            write!(f, "an atomic takes exactly 8 bytes, the WR has {len}")
        }
        WrCheck::TooLong { len, max } => write!(
            f,
            "a message of {len} bytes exceeds the largest this QP sends ({max} bytes)"
        ),
        WrCheck::BadOp => f.write_str(
            "the operation is not valid on this QP (its type, or a UD destination of \
             another address family)",
        ),
        WrCheck::Status(s) => write!(f, "{s}"),
        _ => Ok(()),
    }
}

/// A responder's refusal of request `head` (`{name} PSN {psn}`).
fn refused(f: &mut fmt::Formatter<'_>, name: &str, psn: u32, r: &Refused) -> fmt::Result {
    if let Refused::OpSequence { starts } = *r {
        return write!(
            f,
            "op sequence: {name} PSN {psn:#08x} {}",
            if starts {
                "starts a message while one is in progress"
            } else {
                "continues no message of its operation in progress"
            }
        );
    }
    write!(f, "{name} PSN {psn:#08x}: ")?;
    match *r {
        Refused::OpSequence { .. } => Ok(()),
        Refused::OpNotAllowed { qp_access } => write!(
            f,
            "op validity: the QP's access flags ({}) do not allow it",
            rights(qp_access)
        ),
        Refused::NoResources => {
            f.write_str("resources: the QP offers no responder resources (max_dest_rd_atomic 0)")
        }
        Refused::PayloadLength { len, mtu } => write!(
            f,
            "length: {len} payload bytes break the rule for its place in the message at \
             path MTU {mtu}"
        ),
        Refused::Rkey(k) => write!(f, "R_Key check: {k}"),
        Refused::Misaligned { va } => {
            write!(
                f,
                "R_Key check: va {va:#x} of an atomic is not 8-byte aligned"
            )
        }
        Refused::SendTooLong { so_far, cap } => write!(
            f,
            "length: the SEND's {so_far} bytes so far exceed the receive WR's {cap} bytes \
             of buffers"
        ),
        Refused::TooLong => f.write_str("length: the message exceeds the receive WR's buffers"),
        Refused::WriteRegionLost => {
            f.write_str("the region of the RDMA WRITE in progress was deregistered mid-message")
        }
        Refused::Invalidate { rkey } => write!(
            f,
            "SEND with Invalidate of rkey {rkey:#x}, which is no memory window bound \
             through this QP"
        ),
        Refused::WriteLength => {
            f.write_str("length: the WRITE's packets do not add up to its RETH's DMA length")
        }
        Refused::Other(e) => f.write_str(e),
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Cause::SendWr { op, wr_id, check } => wr_check(f, op, wr_id, &check),
            Cause::RecvWr { wr_id, lkey } => match lkey {
                Some(l) => write!(f, "receive WR {wr_id:#x}: {l}"),
                None => write!(f, "receive WR {wr_id:#x}: its buffers are bad"),
            },
            Cause::RecvBufferLost { wr_id } => write!(
                f,
                "receive WR {wr_id:#x}: a buffer was deregistered while a message was \
                 placed in it"
            ),
            Cause::CqOverflow => f.write_str(
                "a completion was lost to a full CQ: the QP's catastrophic error \
                 (IBA 11.4.2.1, QP_FATAL)",
            ),
            Cause::ModifiedToErr => f.write_str(
                "ibv_modify_qp moved it to ERR; outstanding WRs complete with \
                 IBV_WC_WR_FLUSH_ERR",
            ),
            Cause::RetryExceeded {
                peer,
                psn,
                retry_cnt,
                timeout,
                timeout_ns,
                last_seen_ns,
            } => write!(
                f,
                "no ACK from {peer} for PSN {psn:#08x}: {retry_cnt} retries of the {} local \
                 ACK timeout (timeout {timeout}) spent (retry_cnt {retry_cnt}); {}",
                ms(timeout_ns),
                LastSeen(last_seen_ns)
            ),
            Cause::RnrRetryExceeded {
                peer,
                psn,
                syndrome,
                timer,
                timer_ns,
                rnr_retry,
                last_seen_ns,
            } => write!(
                f,
                "{peer} answered PSN {psn:#08x} with an RNR NAK (syndrome {:#04x}, RNR timer \
                 {timer}: {}) after rnr_retry {rnr_retry} retries were spent: no receive WR \
                 was posted at the peer; {}",
                syndrome.to_byte(),
                ms(timer_ns),
                LastSeen(last_seen_ns)
            ),
            Cause::NakReceived {
                peer,
                syndrome,
                psn,
                asked,
            } => {
                write!(f, "{peer} sent NAK ")?;
                match syndrome {
                    AethSyndrome::Nak(c) => write!(f, "{c}")?,
                    s => f.write_str(s.kind())?,
                }
                write!(
                    f,
                    " (syndrome {:#04x}) for PSN {psn:#08x}",
                    syndrome.to_byte()
                )?;
                match asked {
                    Some(a)
                        if !matches!(
                            a.op,
                            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv
                        ) =>
                    {
                        write!(
                            f,
                            "; the WR {:#x} asked {:?} rkey {:#x} va {:#x} len {}",
                            a.wr_id, a.op, a.rkey, a.va, a.len
                        )
                    }
                    Some(a) => write!(
                        f,
                        "; the WR {:#x} was a {:?} of {} bytes",
                        a.wr_id, a.op, a.len
                    ),
                    None => Ok(()),
                }
            }
            Cause::Request {
                name,
                psn,
                refused: r,
            } => refused(f, name, psn, &r),
            Cause::ReadSourceLost => f.write_str(
                "the region an RDMA READ was answered from was deregistered while its \
                 responses went out",
            ),
            Cause::UcSendTooLong {
                name,
                psn,
                wr_id,
                cap,
            } => write!(
                f,
                "{name} PSN {psn:#08x}: length: the SEND exceeds receive WR {wr_id:#x}'s \
                 {cap} bytes of buffers; UC drops the message"
            ),
            Cause::UcSrqDropped { wr_id } => write!(
                f,
                "receive WR {wr_id:#x} from the SRQ was taken by a message UC then dropped \
                 (a check of the message failed)"
            ),
            Cause::Resp(e) => f.write_str(e),
            Cause::UdTooLong {
                psn,
                src,
                src_qp,
                grh,
                payload,
                wr_id,
                cap,
            } => write!(
                f,
                "datagram PSN {psn:#08x} from {src} QP {src_qp:#08x}: length: {grh} bytes \
                 of GRH + {payload} of payload exceed receive WR {wr_id:#x}'s {cap} bytes of \
                 buffers; the datagram is dropped"
            ),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.cause)?;
        match self.then {
            Then::Nothing => Ok(()),
            Then::Sqe => {
                f.write_str("; the QP moves to SQE, WRs waiting in its send queue are flushed")
            }
            Then::NoNak { peer, psn } => write!(
                f,
                "; no NAK (IBA class J): PSN {psn:#08x} is acknowledged to {peer}, whose \
                 SEND completes with success, and this QP goes to ERR"
            ),
            Then::NakSent { nak, peer, psn } => write!(
                f,
                "; NAK {nak} (syndrome {:#04x}) sent to {peer} for PSN {psn:#08x}",
                AethSyndrome::Nak(nak).to_byte()
            ),
        }
    }
}

impl Explanation {
    /// The explanation of `fault` on QP `qpn` (`status`: the completion
    /// it explains, `None`: the QP's move to ERR).
    pub fn new(qpn: u32, status: Option<WcStatus>, side: Side, fault: &Fault) -> Explanation {
        Explanation {
            qpn,
            status,
            side,
            text: fault.to_string(),
        }
    }

    /// WRs posted to QP `qpn` in ERR are flushed; `cause`: why it is in
    /// ERR, when known.
    pub fn flushed_in_err(qpn: u32, cause: Option<&Explanation>) -> Explanation {
        let text = match cause {
            Some(c) => format!("WRs posted to the QP in ERR are flushed; it is in ERR: {c}"),
            None => "WRs posted to the QP in ERR are flushed".into(),
        };
        Explanation {
            qpn,
            status: Some(WcStatus::WrFlushErr),
            side: Side::Local,
            text,
        }
    }
}

/// Prints the line that follows an explanation of `status` that moved
/// QP `qpn` to ERR.
pub fn emit_entered_err(qpn: u32, status: WcStatus) {
    eprintln!(
        "uroce: QP {qpn:#08x} enters ERR: outstanding WRs complete with \
         IBV_WC_WR_FLUSH_ERR (cause: the {} above)",
        status_name(status)
    );
}

/// `ns` as milliseconds, to the microsecond.
pub fn ms(ns: u64) -> String {
    format!("{}.{:03} ms", ns / 1_000_000, ns % 1_000_000 / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::KeyTable;
    use crate::types::Sge;

    #[test]
    fn faults_name_the_key_the_region_and_the_rule() {
        let keys = KeyTable::new();
        let mr = keys
            .register_zeroed(1, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let (iova, rkey) = (mr.iova(), mr.rkey());
        // The R_Key check of QP 7 of PD `pd`, described when it fails.
        let rkey_fault = |pd, rkey, va, need| {
            let err = keys.check_rkey(rkey, pd, 7, va, 8, need).err()?;
            Some(RkeyFault::found(&keys, pd, (rkey, va, 8), need, err).to_string())
        };
        assert_eq!(rkey_fault(1, rkey, iova, Access::REMOTE_READ), None);
        let w = rkey_fault(1, rkey, iova, Access::REMOTE_WRITE).unwrap();
        assert!(w.contains(&format!("rkey {rkey:#x}")), "{w}");
        assert!(w.contains("lacks REMOTE_WRITE"), "{w}");
        assert!(w.contains("rights LOCAL_WRITE|REMOTE_READ"), "{w}");
        let o = rkey_fault(1, rkey, iova + 4090, Access::REMOTE_READ).unwrap();
        assert!(o.contains("outside the region"), "{o}");
        assert!(o.contains(&Bounds(iova, 4096).to_string()), "{o}");
        let b = rkey_fault(1, rkey ^ 1, iova, Access::REMOTE_READ).unwrap();
        assert!(b.contains("no memory region has this key"), "{b}");
        let p = rkey_fault(2, rkey, iova, Access::REMOTE_READ).unwrap();
        assert!(p.contains("another protection domain"), "{p}");
        let sge = Sge {
            addr: iova + 4096,
            length: 1,
            lkey: mr.lkey(),
        };
        let err = keys
            .check_lkey(sge.lkey, 1, sge.addr, 1, Access::empty())
            .unwrap_err();
        let l = LkeyFault::found(&keys, 1, 1, sge, Access::empty(), err).to_string();
        assert!(
            l.starts_with(&format!("SGE 1: lkey {:#x}", mr.lkey())),
            "{l}"
        );
        assert!(l.contains("outside the region"), "{l}");
        assert_eq!(ms(1_234_567), "1.234 ms");
        assert_eq!(ms(10_240), "0.010 ms");
    }
}
