//! QP attributes and the modify-QP rules (IBA 11.2.5, table 91; the same
//! table as the kernel's `ib_modify_qp_is_ok`), as data.

use crate::types::{Access, Mtu, QpState, QpType};
use bitflags::bitflags;
use std::net::IpAddr;

bitflags! {
    /// Which attributes a modify-QP call sets (`ibv_qp_attr_mask`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AttrMask: u32 {
        #[allow(missing_docs)] const STATE = 1;
        #[allow(missing_docs)] const CUR_STATE = 1 << 1;
        #[allow(missing_docs)] const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        #[allow(missing_docs)] const ACCESS_FLAGS = 1 << 3;
        #[allow(missing_docs)] const PKEY_INDEX = 1 << 4;
        #[allow(missing_docs)] const PORT = 1 << 5;
        #[allow(missing_docs)] const QKEY = 1 << 6;
        #[allow(missing_docs)] const AV = 1 << 7;
        #[allow(missing_docs)] const PATH_MTU = 1 << 8;
        #[allow(missing_docs)] const TIMEOUT = 1 << 9;
        #[allow(missing_docs)] const RETRY_CNT = 1 << 10;
        #[allow(missing_docs)] const RNR_RETRY = 1 << 11;
        #[allow(missing_docs)] const RQ_PSN = 1 << 12;
        #[allow(missing_docs)] const MAX_QP_RD_ATOMIC = 1 << 13;
        #[allow(missing_docs)] const ALT_PATH = 1 << 14;
        #[allow(missing_docs)] const MIN_RNR_TIMER = 1 << 15;
        #[allow(missing_docs)] const SQ_PSN = 1 << 16;
        #[allow(missing_docs)] const MAX_DEST_RD_ATOMIC = 1 << 17;
        #[allow(missing_docs)] const PATH_MIG_STATE = 1 << 18;
        #[allow(missing_docs)] const CAP = 1 << 19;
        #[allow(missing_docs)] const DEST_QPN = 1 << 20;
    }
}

impl AttrMask {
    /// What a connected QP's INIT -> RTR carries (IBA 11.2.4.2's required
    /// attributes): the path, the peer's QPN and PSN; RC adds its
    /// responder's READ/atomic depth and RNR timer.
    pub const fn to_rtr(rc: bool) -> AttrMask {
        let m = AttrMask::STATE
            .union(AttrMask::AV)
            .union(AttrMask::PATH_MTU)
            .union(AttrMask::DEST_QPN)
            .union(AttrMask::RQ_PSN);
        if rc {
            m.union(AttrMask::MAX_DEST_RD_ATOMIC)
                .union(AttrMask::MIN_RNR_TIMER)
        } else {
            m
        }
    }

    /// What a connected QP's RTR -> RTS carries: its send PSN; RC adds the
    /// ACK timeout, retry counts and its READ/atomic depth.
    pub const fn to_rts(rc: bool) -> AttrMask {
        let m = AttrMask::STATE.union(AttrMask::SQ_PSN);
        if rc {
            m.union(AttrMask::TIMEOUT)
                .union(AttrMask::RETRY_CNT)
                .union(AttrMask::RNR_RETRY)
                .union(AttrMask::MAX_QP_RD_ATOMIC)
        } else {
            m
        }
    }

    /// The `IBV_QP_*` name of the lowest attribute in the mask.
    pub fn first_name(self) -> &'static str {
        const NAMES: [&str; 21] = [
            "IBV_QP_STATE",
            "IBV_QP_CUR_STATE",
            "IBV_QP_EN_SQD_ASYNC_NOTIFY",
            "IBV_QP_ACCESS_FLAGS",
            "IBV_QP_PKEY_INDEX",
            "IBV_QP_PORT",
            "IBV_QP_QKEY",
            "IBV_QP_AV",
            "IBV_QP_PATH_MTU",
            "IBV_QP_TIMEOUT",
            "IBV_QP_RETRY_CNT",
            "IBV_QP_RNR_RETRY",
            "IBV_QP_RQ_PSN",
            "IBV_QP_MAX_QP_RD_ATOMIC",
            "IBV_QP_ALT_PATH",
            "IBV_QP_MIN_RNR_TIMER",
            "IBV_QP_SQ_PSN",
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            "IBV_QP_PATH_MIG_STATE",
            "IBV_QP_CAP",
            "IBV_QP_DEST_QPN",
        ];
        NAMES
            .get(self.bits().trailing_zeros() as usize)
            .copied()
            .unwrap_or("unknown attribute")
    }
}

/// Address vector: where an RC/UC QP's peer, or a UD destination, is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// Destination GID (for RoCEv2: the peer's IP as an IPv6 address,
    /// IPv4-mapped for IPv4).
    pub dgid: [u8; 16],
    /// Source GID index (0: the device's RoCEv2 GID).
    pub sgid_index: u8,
    /// Hop limit (TTL).
    pub hop_limit: u8,
    /// Traffic class (DSCP/ECN).
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Service level.
    pub sl: u8,
    /// Port (1).
    pub port_num: u8,
}

impl Default for AddressVector {
    fn default() -> Self {
        AddressVector {
            dgid: [0; 16],
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            sl: 0,
            port_num: 1,
        }
    }
}

/// The size of a device's GID table (`gid_tbl_len`): the first
/// [`GID_ENTRIES`] entries hold a GID, the rest are empty, as most of a
/// kernel device's table is (`ibv_query_gid_ex` answers ENODATA for them,
/// `ibv_query_gid` the zero GID).
pub const GID_TABLE_LEN: u8 = 16;

/// The populated entries of a device's GID table. Both hold the device's
/// one RoCEv2 GID ([`gid_of`] its address): index 0 for those who ask for
/// the first entry, and index 1 where kernel rxe puts its IPv4-mapped
/// RoCEv2 GID (rxe's index 0 is the link-local GID), which programs
/// written against rxe hard-code.
pub const GID_ENTRIES: u8 = 2;

/// The RoCEv2 GID of an IP address: IPv4-mapped IPv6 for IPv4.
pub fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The IP address a RoCEv2 GID stands for.
pub fn ip_of_gid(gid: &[u8; 16]) -> IpAddr {
    let v6 = std::net::Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

impl AddressVector {
    /// An address vector to an IP address.
    pub fn to_ip(ip: IpAddr) -> AddressVector {
        AddressVector {
            dgid: gid_of(ip),
            ..AddressVector::default()
        }
    }
    /// The destination IP.
    pub fn ip(&self) -> IpAddr {
        ip_of_gid(&self.dgid)
    }
}

impl QpAttr {
    /// Takes the attributes `mask` names from `from`, after
    /// [`check_modify`] accepted the call (so every one named is one this
    /// QP type has). An address vector must be of the device's IP version
    /// (`local`); otherwise nothing is taken.
    pub fn take_masked(
        &mut self,
        from: &QpAttr,
        mask: AttrMask,
        local: IpAddr,
    ) -> Result<(), ModifyError> {
        if mask.contains(AttrMask::AV) && local.is_ipv4() != from.ah_attr.ip().is_ipv4() {
            return Err(ModifyError::BadValue {
                attr: "IBV_QP_AV (dgid)",
                value: 0,
                why: "the destination's IP version differs from the device's",
            });
        }
        macro_rules! take {
            ($($bit:ident => $field:ident),*) => {
                $( if mask.contains(AttrMask::$bit) { self.$field = from.$field; } )*
            };
        }
        take!(ACCESS_FLAGS => qp_access_flags, PKEY_INDEX => pkey_index, PORT => port_num,
              AV => ah_attr, PATH_MTU => path_mtu, DEST_QPN => dest_qp_num,
              MAX_DEST_RD_ATOMIC => max_dest_rd_atomic, MIN_RNR_TIMER => min_rnr_timer,
              TIMEOUT => timeout, RETRY_CNT => retry_cnt, RNR_RETRY => rnr_retry,
              MAX_QP_RD_ATOMIC => max_rd_atomic, QKEY => qkey,
              EN_SQD_ASYNC_NOTIFY => en_sqd_async_notify);
        Ok(())
    }
}

/// Queue capacities (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline data bytes per send WR.
    pub max_inline_data: u32,
}

/// The largest send or receive queue a QP (or SRQ) may ask for.
pub const MAX_QP_WR: u32 = 16384;
/// The largest number of SGEs per work request.
pub const MAX_SGE: u32 = 32;
/// The most inline data per send WR, in bytes.
pub const MAX_INLINE: u32 = 256;

/// A QP's requested capacities beyond what the device offers: the error
/// names the attribute (EINVAL in verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{attr} {value} exceeds the device's {max}")]
pub struct CapError {
    /// The attribute (`max_send_wr`, ...).
    pub attr: &'static str,
    /// What was asked for.
    pub value: u32,
    /// The device's limit.
    pub max: u32,
}

impl CapError {
    /// The capacity `attr` asks for, `value`, within the device's `max`,
    /// or the error naming it.
    pub fn check(attr: &'static str, value: u32, max: u32) -> Result<(), CapError> {
        if value > max {
            return Err(CapError { attr, value, max });
        }
        Ok(())
    }
}

/// A work request beyond one of its queue's limits (EINVAL in verbs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{value} {what} exceed {attr} ({max})")]
pub struct LimitError {
    /// What was counted (`SGEs`, `bytes of inline data`).
    pub what: &'static str,
    /// The limit's name (`max_send_sge`, ...).
    pub attr: &'static str,
    /// What the WR has.
    pub value: usize,
    /// The limit.
    pub max: u32,
}

impl LimitError {
    /// `value` within `max`, or the error naming both.
    pub fn check(
        what: &'static str,
        attr: &'static str,
        value: usize,
        max: u32,
    ) -> Result<(), LimitError> {
        if value > max as usize {
            return Err(LimitError {
                what,
                attr,
                value,
                max,
            });
        }
        Ok(())
    }
}

impl QpCap {
    /// A send WR's SGE count within `max_send_sge`: the one rule, checked
    /// when a WR is posted and before a caller reads a foreign SGE array
    /// of that length.
    pub fn check_send_sges(&self, n: usize) -> Result<(), LimitError> {
        LimitError::check("SGEs", "max_send_sge", n, self.max_send_sge)
    }
    /// A receive WR's SGE count within `max_recv_sge`.
    pub fn check_recv_sges(&self, n: usize) -> Result<(), LimitError> {
        LimitError::check("SGEs", "max_recv_sge", n, self.max_recv_sge)
    }
    /// An inline send's length within `max_inline_data`.
    pub fn check_inline(&self, len: usize) -> Result<(), LimitError> {
        LimitError::check(
            "bytes of inline data",
            "max_inline_data",
            len,
            self.max_inline_data,
        )
    }
    /// Checks every capacity against the device's limits.
    pub fn check(&self) -> Result<(), CapError> {
        for (attr, value, max) in [
            ("max_send_wr", self.max_send_wr, MAX_QP_WR),
            ("max_recv_wr", self.max_recv_wr, MAX_QP_WR),
            ("max_send_sge", self.max_send_sge, MAX_SGE),
            ("max_recv_sge", self.max_recv_sge, MAX_SGE),
            ("max_inline_data", self.max_inline_data, MAX_INLINE),
        ] {
            CapError::check(attr, value, max)?;
        }
        Ok(())
    }
}

/// QP attributes (`ibv_qp_attr`); which ones a call sets is an [`AttrMask`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct QpAttr {
    pub qp_state: QpState,
    pub cur_qp_state: QpState,
    pub path_mtu: Mtu,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: Access,
    pub cap: QpCap,
    pub ah_attr: AddressVector,
    pub pkey_index: u16,
    pub sq_draining: bool,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub en_sqd_async_notify: bool,
}

impl Default for QpAttr {
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu1024,
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: 0,
            qp_access_flags: Access::empty(),
            cap: QpCap::default(),
            ah_attr: AddressVector::default(),
            pkey_index: 0,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            en_sqd_async_notify: false,
        }
    }
}

/// Why a modify-QP call is refused (EINVAL in verbs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The state transition is not allowed for this QP type.
    #[error("invalid QP state transition {from:?} -> {to:?} for a {qp_type:?} QP")]
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// QP type.
        qp_type: QpType,
    },
    /// A required attribute is missing from the mask.
    #[error("{from:?} -> {to:?} requires {attr}")]
    Missing {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// The attribute's mask name.
        attr: &'static str,
    },
    /// The mask names an attribute this transition does not take.
    #[error("{attr} may not be given for {from:?} -> {to:?} on a {qp_type:?} QP")]
    NotAllowed {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// QP type.
        qp_type: QpType,
        /// The attribute's mask name.
        attr: &'static str,
    },
    /// IBV_QP_CUR_STATE does not match the QP's state.
    #[error("IBV_QP_CUR_STATE {given:?} does not match the QP's state {actual:?}")]
    CurState {
        /// Given.
        given: QpState,
        /// Actual.
        actual: QpState,
    },
    /// An attribute value is out of range.
    #[error("{attr} = {value}: {why}")]
    BadValue {
        /// Attribute mask name.
        attr: &'static str,
        /// The value given.
        value: u64,
        /// What is allowed.
        why: &'static str,
    },
}

/// (required, optional) attributes per QP type; `None` where the
/// transition is invalid for that type.
struct Rule {
    rc: Option<(AttrMask, AttrMask)>,
    uc: Option<(AttrMask, AttrMask)>,
    ud: Option<(AttrMask, AttrMask)>,
}

const NONE: (AttrMask, AttrMask) = (AttrMask::empty(), AttrMask::empty());

const fn m(bits: u32) -> AttrMask {
    AttrMask::from_bits_truncate(bits)
}

/// The transition table: (required, optional) per QP type, or `None`
/// where the transition is invalid.
fn rule(from: QpState, to: QpState) -> Option<Rule> {
    use QpState::*;
    const CUR: u32 = AttrMask::CUR_STATE.bits();
    const SQD_N: u32 = AttrMask::EN_SQD_ASYNC_NOTIFY.bits();
    const ACC: u32 = AttrMask::ACCESS_FLAGS.bits();
    const PKEY: u32 = AttrMask::PKEY_INDEX.bits();
    const PORT: u32 = AttrMask::PORT.bits();
    const QKEY: u32 = AttrMask::QKEY.bits();
    const AV: u32 = AttrMask::AV.bits();
    const MTU: u32 = AttrMask::PATH_MTU.bits();
    const TMO: u32 = AttrMask::TIMEOUT.bits();
    const RETRY: u32 = AttrMask::RETRY_CNT.bits();
    const RNR: u32 = AttrMask::RNR_RETRY.bits();
    const RQPSN: u32 = AttrMask::RQ_PSN.bits();
    const RDA: u32 = AttrMask::MAX_QP_RD_ATOMIC.bits();
    const ALT: u32 = AttrMask::ALT_PATH.bits();
    const MINRNR: u32 = AttrMask::MIN_RNR_TIMER.bits();
    const SQPSN: u32 = AttrMask::SQ_PSN.bits();
    const DRDA: u32 = AttrMask::MAX_DEST_RD_ATOMIC.bits();
    const MIG: u32 = AttrMask::PATH_MIG_STATE.bits();
    const DQPN: u32 = AttrMask::DEST_QPN.bits();
    let all = |x: (AttrMask, AttrMask)| Rule {
        rc: Some(x),
        uc: Some(x),
        ud: Some(x),
    };
    Some(match (from, to) {
        (_, Reset) | (_, Err) => all(NONE),
        (Reset, Init) => Rule {
            rc: Some((m(PKEY | PORT | ACC), m(0))),
            uc: Some((m(PKEY | PORT | ACC), m(0))),
            ud: Some((m(PKEY | PORT | QKEY), m(0))),
        },
        (Init, Init) => Rule {
            rc: Some((m(0), m(PKEY | PORT | ACC))),
            uc: Some((m(0), m(PKEY | PORT | ACC))),
            ud: Some((m(0), m(PKEY | PORT | QKEY))),
        },
        (Init, Rtr) => Rule {
            rc: Some((
                m(AV | MTU | DQPN | RQPSN | DRDA | MINRNR),
                m(ALT | ACC | PKEY),
            )),
            uc: Some((m(AV | MTU | DQPN | RQPSN), m(ALT | ACC | PKEY))),
            ud: Some((m(0), m(PKEY | QKEY))),
        },
        (Rtr, Rts) => Rule {
            rc: Some((
                m(TMO | RETRY | RNR | SQPSN | RDA),
                m(CUR | ALT | ACC | MINRNR | MIG),
            )),
            uc: Some((m(SQPSN), m(CUR | ALT | ACC | MIG))),
            ud: Some((m(SQPSN), m(CUR | QKEY))),
        },
        (Rts, Rts) => Rule {
            rc: Some((m(0), m(CUR | ACC | ALT | MIG | MINRNR))),
            uc: Some((m(0), m(CUR | ACC | ALT | MIG))),
            ud: Some((m(0), m(CUR | QKEY))),
        },
        (Rts, Sqd) => all((m(0), m(SQD_N))),
        (Sqd, Rts) => Rule {
            rc: Some((m(0), m(CUR | ALT | ACC | MINRNR | MIG))),
            uc: Some((m(0), m(CUR | ALT | ACC | MIG))),
            ud: Some((m(0), m(CUR | QKEY))),
        },
        (Sqd, Sqd) => Rule {
            rc: Some((
                m(0),
                m(PORT | AV | TMO | RETRY | RNR | RDA | DRDA | ALT | ACC | PKEY | MINRNR | MIG),
            )),
            uc: Some((m(0), m(AV | ALT | ACC | PKEY | MIG))),
            ud: Some((m(0), m(PKEY | QKEY))),
        },
        (Sqe, Rts) => Rule {
            rc: None,
            uc: Some((m(0), m(CUR | ACC))),
            ud: Some((m(0), m(CUR | QKEY))),
        },
        _ => return None,
    })
}

/// Device limits a modify call is checked against.
#[derive(Debug, Clone, Copy)]
pub struct ModifyLimits {
    /// Largest max_rd_atomic / max_dest_rd_atomic.
    pub max_rd_atom: u8,
    /// The port's active MTU (path MTU may not exceed it).
    pub active_mtu: Mtu,
    /// The caller may set a controlled Q_Key (high bit set), as a
    /// CAP_NET_RAW process may with the kernel's verbs.
    pub privileged_qkey: bool,
}

/// The high bit of a Q_Key: controlled Q_Keys (IBA 10.2.4) may only be
/// set on a QP by privileged callers; in a UD send WR it means "use the
/// QP's Q_Key".
pub const QKEY_CONTROLLED: u32 = 0x8000_0000;

/// Checks a modify-QP call against the spec's rules; returns the state
/// the QP will be in.
pub fn check_modify(
    qp_type: QpType,
    cur: QpState,
    attr: &QpAttr,
    mask: AttrMask,
    limits: &ModifyLimits,
) -> Result<QpState, ModifyError> {
    let to = if mask.contains(AttrMask::STATE) {
        attr.qp_state
    } else {
        cur
    };
    if mask.contains(AttrMask::CUR_STATE) {
        if !matches!(
            cur,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            return Err(ModifyError::NotAllowed {
                from: cur,
                to,
                qp_type,
                attr: "IBV_QP_CUR_STATE",
            });
        }
        if attr.cur_qp_state != cur {
            return Err(ModifyError::CurState {
                given: attr.cur_qp_state,
                actual: cur,
            });
        }
    }
    let bad = ModifyError::BadTransition {
        from: cur,
        to,
        qp_type,
    };
    let r = rule(cur, to).ok_or_else(|| bad.clone())?;
    let (req, opt) = match qp_type {
        QpType::Rc => r.rc,
        QpType::Uc => r.uc,
        QpType::Ud => r.ud,
    }
    .ok_or(bad)?;
    let missing = req - mask;
    if !missing.is_empty() {
        return Err(ModifyError::Missing {
            from: cur,
            to,
            attr: missing.first_name(),
        });
    }
    let extra = mask - req - opt - AttrMask::STATE;
    if !extra.is_empty() {
        return Err(ModifyError::NotAllowed {
            from: cur,
            to,
            qp_type,
            attr: extra.first_name(),
        });
    }
    check_values(attr, mask, limits)?;
    Ok(to)
}

fn check_values(a: &QpAttr, mask: AttrMask, l: &ModifyLimits) -> Result<(), ModifyError> {
    let bad = |attr, value: u64, why| Err(ModifyError::BadValue { attr, value, why });
    if mask.contains(AttrMask::PORT) && a.port_num != 1 {
        return bad("IBV_QP_PORT", a.port_num as u64, "the only port is 1");
    }
    if mask.contains(AttrMask::QKEY) && a.qkey & QKEY_CONTROLLED != 0 && !l.privileged_qkey {
        return bad(
            "IBV_QP_QKEY",
            a.qkey as u64,
            "a Q_Key with the high bit set is controlled: only privileged callers may set it",
        );
    }
    if mask.contains(AttrMask::PKEY_INDEX) && a.pkey_index != 0 {
        return bad(
            "IBV_QP_PKEY_INDEX",
            a.pkey_index as u64,
            "the P_Key table has one entry (index 0)",
        );
    }
    if mask.contains(AttrMask::ACCESS_FLAGS) && !(Access::all()).contains(a.qp_access_flags) {
        return bad(
            "IBV_QP_ACCESS_FLAGS",
            a.qp_access_flags.bits() as u64,
            "unknown access flag",
        );
    }
    // The attributes with a largest value, in the order they are checked.
    let psn = 0xff_ffff;
    let at_most: [(AttrMask, u64, u64, &str); 10] = [
        (
            AttrMask::PATH_MTU,
            a.path_mtu as u64,
            l.active_mtu as u64,
            "larger than the port's active MTU",
        ),
        (AttrMask::TIMEOUT, a.timeout.into(), 31, "must be 0..=31"),
        (AttrMask::RETRY_CNT, a.retry_cnt.into(), 7, "must be 0..=7"),
        (AttrMask::RNR_RETRY, a.rnr_retry.into(), 7, "must be 0..=7"),
        (
            AttrMask::MIN_RNR_TIMER,
            a.min_rnr_timer.into(),
            31,
            "must be 0..=31",
        ),
        (AttrMask::RQ_PSN, a.rq_psn.into(), psn, "a PSN has 24 bits"),
        (AttrMask::SQ_PSN, a.sq_psn.into(), psn, "a PSN has 24 bits"),
        (
            AttrMask::DEST_QPN,
            a.dest_qp_num.into(),
            psn,
            "a QP number has 24 bits",
        ),
        (
            AttrMask::MAX_QP_RD_ATOMIC,
            a.max_rd_atomic.into(),
            l.max_rd_atom.into(),
            "above the device's max_qp_rd_atom",
        ),
        (
            AttrMask::MAX_DEST_RD_ATOMIC,
            a.max_dest_rd_atomic.into(),
            l.max_rd_atom.into(),
            "above the device's max_qp_init_rd_atom",
        ),
    ];
    for (attr, value, max, why) in at_most {
        if mask.contains(attr) && value > max {
            return bad(attr.first_name(), value, why);
        }
    }
    if mask.contains(AttrMask::AV) {
        if a.ah_attr.sgid_index >= GID_ENTRIES {
            return bad(
                "IBV_QP_AV (sgid_index)",
                a.ah_attr.sgid_index as u64,
                "not a populated GID table entry (indices 0 and 1)",
            );
        }
        if a.ah_attr.ip().is_unspecified() {
            return bad("IBV_QP_AV (dgid)", 0, "the destination GID is unspecified");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: ModifyLimits = ModifyLimits {
        max_rd_atom: 16,
        active_mtu: Mtu::Mtu4096,
        privileged_qkey: false,
    };

    fn to(state: QpState) -> QpAttr {
        QpAttr {
            qp_state: state,
            ah_attr: AddressVector::to_ip("127.0.0.2".parse().unwrap()),
            ..QpAttr::default()
        }
    }

    #[test]
    fn rc_happy_path() {
        let init = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Reset, &to(QpState::Init), init, &L),
            Ok(QpState::Init)
        );
        let rtr = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Init, &to(QpState::Rtr), rtr, &L),
            Ok(QpState::Rtr)
        );
        let rts = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert_eq!(
            check_modify(QpType::Rc, QpState::Rtr, &to(QpState::Rts), rts, &L),
            Ok(QpState::Rts)
        );
        for s in [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Err,
        ] {
            assert_eq!(
                check_modify(QpType::Rc, s, &to(QpState::Err), AttrMask::STATE, &L),
                Ok(QpState::Err)
            );
            assert_eq!(
                check_modify(QpType::Rc, s, &to(QpState::Reset), AttrMask::STATE, &L),
                Ok(QpState::Reset)
            );
        }
    }

    #[test]
    fn misuse_is_named() {
        // missing attribute
        let e = check_modify(
            QpType::Rc,
            QpState::Reset,
            &to(QpState::Init),
            AttrMask::STATE | AttrMask::PORT,
            &L,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "Reset -> Init requires IBV_QP_ACCESS_FLAGS");
        // attribute not allowed
        let e = check_modify(
            QpType::Ud,
            QpState::Reset,
            &to(QpState::Init),
            AttrMask::STATE | AttrMask::PORT | AttrMask::PKEY_INDEX | AttrMask::QKEY | AttrMask::AV,
            &L,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                ModifyError::NotAllowed {
                    attr: "IBV_QP_AV",
                    ..
                }
            ),
            "{e}"
        );
        // skipping a state
        let e = check_modify(
            QpType::Rc,
            QpState::Reset,
            &to(QpState::Rts),
            AttrMask::STATE,
            &L,
        )
        .unwrap_err();
        assert!(matches!(e, ModifyError::BadTransition { .. }));
        // SQE -> RTS is UC/UD only
        assert!(check_modify(
            QpType::Rc,
            QpState::Sqe,
            &to(QpState::Rts),
            AttrMask::STATE,
            &L
        )
        .is_err());
        assert!(check_modify(
            QpType::Uc,
            QpState::Sqe,
            &to(QpState::Rts),
            AttrMask::STATE,
            &L
        )
        .is_ok());
        // bad values
        let mut a = to(QpState::Init);
        a.port_num = 2;
        let e = check_modify(
            QpType::Rc,
            QpState::Reset,
            &a,
            AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
            &L,
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "IBV_QP_PORT = 2: the only port is 1");
        let mut a = to(QpState::Rts);
        a.retry_cnt = 8;
        let rts = AttrMask::STATE
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::SQ_PSN
            | AttrMask::MAX_QP_RD_ATOMIC;
        assert!(matches!(
            check_modify(QpType::Rc, QpState::Rtr, &a, rts, &L),
            Err(ModifyError::BadValue {
                attr: "IBV_QP_RETRY_CNT",
                ..
            })
        ));
        // CUR_STATE must match
        let mut a = to(QpState::Rts);
        a.cur_qp_state = QpState::Rtr;
        assert!(matches!(
            check_modify(
                QpType::Rc,
                QpState::Rts,
                &a,
                AttrMask::STATE | AttrMask::CUR_STATE,
                &L
            ),
            Err(ModifyError::CurState { .. })
        ));
    }

    #[test]
    fn gid_mapping() {
        let ip: IpAddr = "10.99.0.1".parse().unwrap();
        let g = gid_of(ip);
        assert_eq!(&g[10..], &[0xff, 0xff, 10, 99, 0, 1]);
        assert_eq!(ip_of_gid(&g), ip);
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(ip_of_gid(&gid_of(v6)), v6);
    }
}
