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
//! `StateCell`) and printed to stderr when the
//! environment has `UROCE_EXPLAIN=1`.
//!
//! Cost: nothing on the success path. The facts are gathered where a check
//! failed, and the failed check is described by running it again, verbosely,
//! on the error path only ([`lkey_fault`], [`rkey_fault`]).

use crate::memory::{KeyError, KeyTable, MemError, PdId};
use crate::types::{Access, SendFlags, SendWr, Sge, WcStatus, WrOpcode};
use std::fmt;
use std::sync::OnceLock;

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

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Requester => "requester",
            Side::Responder => "responder",
        })
    }
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

/// Whether explanations are printed (`UROCE_EXPLAIN=1`), read once.
pub fn printing() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("UROCE_EXPLAIN").is_some_and(|v| v == "1"))
}

/// Prints `e` to stderr when asked for.
pub fn emit(e: &Explanation) {
    if printing() {
        eprintln!("uroce: {e}");
    }
}

/// Prints `line` to stderr when asked for.
pub fn emit_line(line: &str) {
    if printing() {
        eprintln!("uroce: {line}");
    }
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
fn bounds(iova: u64, len: usize) -> String {
    format!("[{iova:#x}, {:#x})", iova.wrapping_add(len as u64))
}

/// Why a key check of PD `pd` needing `need` gave `err`, with the region
/// the key names (if any): its bounds, PD and rights.
fn key_fault(
    err: &KeyError,
    mr: Option<&crate::memory::MrInner>,
    pd: PdId,
    need: Access,
) -> String {
    let region = mr.map(|m| {
        format!(
            "region {} ({} bytes, PD {}) rights {}",
            bounds(m.iova(), m.len()),
            m.len(),
            m.pd(),
            rights(m.access())
        )
    });
    match (err, region) {
        (KeyError::BadKey(_), _) | (_, None) => {
            "no memory region has this key (never registered, or deregistered)".into()
        }
        (KeyError::PdMismatch, Some(r)) => {
            format!("the {r} is in another protection domain than the QP's (PD {pd})")
        }
        (KeyError::Access(_), Some(r)) => {
            format!("the {r} lacks {}", rights(need))
        }
        (KeyError::Mem(MemError::OutOfBounds { .. }), Some(r)) => {
            format!("the range is outside the {r}")
        }
        (KeyError::Mem(MemError::Invalid), Some(r)) => {
            format!("the {r} is being deregistered")
        }
        (KeyError::Mem(e), Some(r)) => format!("{e} in the {r}"),
    }
}

/// The first SGE of `sgl` that fails its lkey check (key, PD `pd`, access
/// `need`, bounds), described; `None` when all pass now.
pub fn lkey_fault(keys: &KeyTable, pd: PdId, sgl: &[Sge], need: Access) -> Option<String> {
    sgl.iter().enumerate().find_map(|(i, s)| {
        if s.length == 0 {
            return None;
        }
        let err = keys
            .check_lkey(s.lkey, pd, s.addr, u64::from(s.length), need)
            .err()?;
        let mr = keys.find_lkey(s.lkey);
        Some(format!(
            "SGE {i}: lkey {:#x} addr {:#x} len {}{}: {}",
            s.lkey,
            s.addr,
            s.length,
            if need.is_empty() {
                String::new()
            } else {
                format!(" needs {}", rights(need))
            },
            key_fault(&err, mr.as_deref(), pd, need)
        ))
    })
}

/// The R_Key check of an access of `len` bytes at `va` needing `need`,
/// arriving on QP `qpn` of PD `pd`, described: which part failed, with the
/// region's bounds and rights; `None` when it passes now.
pub fn rkey_fault(
    keys: &KeyTable,
    pd: PdId,
    qpn: u32,
    rkey: u32,
    va: u64,
    len: u64,
    need: Access,
) -> Option<String> {
    let err = keys.check_rkey(rkey, pd, qpn, va, len, need).err()?;
    let head = format!("rkey {rkey:#x} va {va:#x} len {len} needs {}", rights(need));
    let why = match keys.find_rkey(rkey) {
        Some(mr) => key_fault(&err, Some(&mr), pd, need),
        None => match keys.window(rkey) {
            Some(_) => format!("the memory window with this R_Key refuses it: {err}"),
            None => key_fault(&err, None, pd, need),
        },
    };
    Some(format!("{head}: {why}"))
}

/// Why send WR `wr` of a QP of PD `pd` failed locally with `status`, from
/// the WR and the key table (its SGEs checked again). `max_len`: the
/// largest message the QP sends (2^31, or a UD QP's path MTU).
pub fn local_wr_fault(
    keys: &KeyTable,
    pd: PdId,
    wr: &SendWr,
    status: WcStatus,
    max_len: u64,
) -> String {
    let op = wr.opcode;
    let inline = wr.flags.contains(SendFlags::INLINE);
    let len = if inline {
        wr.inline_data.len() as u64
    } else {
        wr.total_len()
    };
    match status {
        WcStatus::LocProtErr => {
            let need = if op.is_read_or_atomic() {
                Access::LOCAL_WRITE
            } else {
                Access::empty()
            };
            match lkey_fault(keys, pd, &wr.sg_list, need) {
                Some(f) => format!("{op:?} WR {:#x}: {f}", wr.wr_id),
                None => format!(
                    "{op:?} WR {:#x}: its SGEs pass their lkey checks now: a region was \
                     deregistered while the WR was being sent",
                    wr.wr_id
                ),
            }
        }
        WcStatus::LocLenErr if op.is_atomic() || op == WrOpcode::AtomicWrite => format!(
            "{op:?} WR {:#x}: an atomic takes exactly 8 bytes, the WR has {len}",
            wr.wr_id
        ),
        WcStatus::LocLenErr => format!(
            "{op:?} WR {:#x}: a message of {len} bytes exceeds the largest this QP \
             sends ({max_len} bytes)",
            wr.wr_id
        ),
        WcStatus::LocQpOpErr => format!(
            "{op:?} WR {:#x}: the operation is not valid on this QP (its type, or a UD \
             destination of another address family)",
            wr.wr_id
        ),
        s => format!("{op:?} WR {:#x}: {s}", wr.wr_id),
    }
}

/// `ns` as milliseconds, to the microsecond.
pub fn ms(ns: u64) -> String {
    format!("{}.{:03} ms", ns / 1_000_000, ns % 1_000_000 / 1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_name_the_key_the_region_and_the_rule() {
        let keys = KeyTable::new();
        let mr = keys
            .register_zeroed(1, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
        let (iova, rkey) = (mr.iova(), mr.rkey());
        let ok = rkey_fault(&keys, 1, 7, rkey, iova, 8, Access::REMOTE_READ);
        assert_eq!(ok, None);
        let w = rkey_fault(&keys, 1, 7, rkey, iova, 8, Access::REMOTE_WRITE).unwrap();
        assert!(w.contains(&format!("rkey {rkey:#x}")), "{w}");
        assert!(w.contains("lacks REMOTE_WRITE"), "{w}");
        assert!(w.contains("rights LOCAL_WRITE|REMOTE_READ"), "{w}");
        let o = rkey_fault(&keys, 1, 7, rkey, iova + 4090, 8, Access::REMOTE_READ).unwrap();
        assert!(o.contains("outside the region"), "{o}");
        assert!(o.contains(&bounds(iova, 4096)), "{o}");
        let b = rkey_fault(&keys, 1, 7, rkey ^ 1, iova, 8, Access::REMOTE_READ).unwrap();
        assert!(b.contains("no memory region has this key"), "{b}");
        let p = rkey_fault(&keys, 2, 7, rkey, iova, 8, Access::REMOTE_READ).unwrap();
        assert!(p.contains("another protection domain"), "{p}");
        let sgl = [
            Sge {
                addr: iova,
                length: 8,
                lkey: mr.lkey(),
            },
            Sge {
                addr: iova + 4096,
                length: 1,
                lkey: mr.lkey(),
            },
        ];
        let l = lkey_fault(&keys, 1, &sgl, Access::empty()).unwrap();
        assert!(
            l.starts_with(&format!("SGE 1: lkey {:#x}", mr.lkey())),
            "{l}"
        );
        assert!(l.contains("outside the region"), "{l}");
        assert_eq!(ms(1_234_567), "1.234 ms");
        assert_eq!(ms(10_240), "0.010 ms");
    }
}
