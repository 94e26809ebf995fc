//! Oracles: what must hold after every case, whatever the fuzzer sent.
//!
//! * the target is alive and a legitimate SEND and WRITE on its untouched
//!   control QP still succeed;
//! * the private region (no remote access) is unchanged, and the exposed
//!   region changed only inside the ranges of WRITEs and atomics that
//!   carried its valid rkey (a sound over-approximation of what a
//!   correct responder may write);
//! * the fuzzed QP is in a state a responder can be in after incoming
//!   packets (RTS, or ERR for RC and UC after a fatal error), and still
//!   RTS with nothing written and nothing completed when every packet of
//!   the case is one the spec says to drop silently;
//! * completions name receive WRs that were posted, each once, and no
//!   more receives succeed than the case sent messages;
//! * the fuzzer as responder (the case has the target post requests):
//!   send completions name posted WRs, each once, in the order posted;
//!   a WR completes successfully only if the case answered it (an ACK,
//!   a sequence or RNR NAK past it, or a later response, at a PSN the
//!   target sent; a READ's last response; an atomic ACK at its PSN), and
//!   a successful READ holds the bytes its responses carried;
//! * the reference model ([`crate::model`]): the answers, receive
//!   completions, QP state and region bytes are one of the outcomes the
//!   spec allows for the case's packets ([`Violation::Model`] names the
//!   rule and its section).

use super::case::{Case, Key, PacketSpec, Post, PostOp};
use super::target::{Conn, Observation, PATTERN};
use serde::{Deserialize, Serialize};
use uroce_provider::types::{QpState, QpType};
use uroce_wire::{AethSyndrome, Operation};

/// A broken rule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Violation {
    /// The target stopped answering (crashed, hung, panicked).
    TargetDead(String),
    /// The target logged a problem (kernel BUG/WARNING/KASAN, ...).
    TargetLog(String),
    /// The region without remote access changed.
    PrivateRegionChanged,
    /// The exposed region changed where no valid request could write.
    WriteOutsideGrant {
        /// First changed offset.
        offset: usize,
    },
    /// The fuzzed QP is in a state a responder does not enter on its own.
    IllegalState(#[serde(with = "crate::serde_qp::QpStateDef")] QpState),
    /// Packets the spec says to drop silently changed the QP's state.
    StateChangedBySilentDrop(#[serde(with = "crate::serde_qp::QpStateDef")] QpState),
    /// Packets the spec says to drop silently completed a WR or wrote.
    EffectOfSilentDrop(String),
    /// The untouched control QP stopped working.
    ControlQpBroken,
    /// A completion for a WR that was never posted.
    UnknownCompletion(u64),
    /// A WR completed twice.
    DuplicateCompletion(u64),
    /// Send completions out of the order the WRs were posted in.
    OutOfOrderCompletion(u64),
    /// A WR completed successfully that no answer of the case covered
    /// (a ghost ACK, a NAK, a partial READ was taken for success).
    UnearnedSuccess(u64),
    /// A READ completed successfully with other bytes than its responses
    /// carried.
    ReadDataWrong {
        /// The WR.
        wr_id: u64,
        /// First wrong offset in the region.
        offset: usize,
    },
    /// The reference model ([`crate::model`]) allows no outcome like
    /// the one observed.
    Model {
        /// The rule broken (an id of [`crate::model::rules`]).
        rule: String,
        /// Where the spec states it.
        section: String,
        /// What the model allowed.
        allowed: String,
        /// What was observed.
        observed: String,
    },
    /// More successful receives than messages sent.
    TooManyReceives {
        /// Successful receive completions.
        got: usize,
        /// Messages the case could have delivered.
        max: usize,
    },
}

impl Violation {
    /// The kind, without the details: findings with the same kinds are
    /// one finding; the minimizer keeps a case that trips the same kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Violation::TargetDead(_) => "target-dead",
            Violation::TargetLog(_) => "target-log",
            Violation::PrivateRegionChanged => "private-region-changed",
            Violation::WriteOutsideGrant { .. } => "write-outside-grant",
            Violation::IllegalState(_) => "illegal-state",
            Violation::StateChangedBySilentDrop(_) => "state-changed-by-silent-drop",
            Violation::EffectOfSilentDrop(_) => "effect-of-silent-drop",
            Violation::ControlQpBroken => "control-qp-broken",
            Violation::UnknownCompletion(_) => "unknown-completion",
            Violation::DuplicateCompletion(_) => "duplicate-completion",
            Violation::TooManyReceives { .. } => "too-many-receives",
            Violation::OutOfOrderCompletion(_) => "out-of-order-completion",
            Violation::UnearnedSuccess(_) => "unearned-success",
            Violation::ReadDataWrong { .. } => "read-data-wrong",
            Violation::Model { rule, .. } => {
                crate::model::rules::find(rule).map_or("model", |r| r.id)
            }
        }
    }

    /// The IBA rule broken, where the fuzzer knows it.
    pub fn rule(&self) -> &'static str {
        match self {
            Violation::PrivateRegionChanged | Violation::WriteOutsideGrant { .. } => {
                "IBA 10.6.3: remote access only within a region granted by its R_Key"
            }
            Violation::StateChangedBySilentDrop(_) | Violation::EffectOfSilentDrop(_) => {
                "IBA 9.6.1 / 9.7.1 (C9-xx): packets failing header or ICRC checks are silently dropped"
            }
            Violation::IllegalState(_) => {
                "IBA 10.3.1: responder errors move an RC/UC QP to Error only; a UC/UD send error to SQE"
            }
            Violation::OutOfOrderCompletion(_) => {
                "IBA 10.8.6 (C10-?): an RC send queue's WRs complete in the order posted"
            }
            Violation::UnearnedSuccess(_) => {
                "IBA 9.7.5.1 (C9-92..): a request completes only when acknowledged; ghost ACKs are dropped, NAKs and implied NAKs retry or fail it"
            }
            Violation::ReadDataWrong { .. } => {
                "IBA 9.7.5.1.1: READ responses are placed in PSN order, each at its offset"
            }
            Violation::TooManyReceives { .. }
            | Violation::UnknownCompletion(_)
            | Violation::DuplicateCompletion(_) => "IBA 10.8: each WR completes exactly once",
            Violation::Model { rule, .. } => crate::model::rules::find(rule).map_or("", |r| r.section),
            _ => "",
        }
    }
}

/// Bytes of the exposed region a request in `p` may write (offset,
/// length), if any: a sound over-approximation. The packet is read both
/// as the target's parser would (the opcode byte it carries) and as it
/// was laid out, and either reading with the valid rkey grants its range.
fn grants(p: &PacketSpec, conn: &Conn) -> Vec<(i64, u64)> {
    let mut g = Vec::new();
    if p.silently_dropped(conn) {
        return g;
    }
    let off = |va: u64| va.wrapping_sub(conn.va) as i64;
    if let Some(seen) = p.seen(conn) {
        if let Some(r) = seen.reth.filter(|r| r.rkey == conn.rkey) {
            g.push((off(r.va), u64::from(r.dma_len).max(u64::from(p.payload.0))));
        }
        if let Some(a) = seen.atomic.filter(|a| a.rkey == conn.rkey) {
            g.push((off(a.va), 8));
        }
    }
    let valid = |k: Key| k == Key::Valid || k == Key::Raw(conn.rkey);
    if let Some((o, _, len)) = p.reth.filter(|r| valid(r.1)) {
        g.push((o, u64::from(len).max(u64::from(p.payload.0))));
    }
    if let Some((o, ..)) = p.atomic.filter(|a| valid(a.1)) {
        g.push((o, 8));
    }
    // (MIDDLE and LAST packets write inside their FIRST's DMA length.)
    g
}

/// Messages that may complete a receive: packets ending a SEND or a
/// WRITE with immediate, not silently dropped.
fn may_receive(case: &Case, conn: &Conn) -> usize {
    case.packets()
        .filter(|p| !p.silently_dropped(conn))
        .filter_map(|p| p.seen(conn))
        .map(|s| s.info)
        .filter(|i| {
            i.is_request
                && i.position.ends_message()
                && (i.operation == Operation::Send || i.has_imm())
        })
        .count()
}

/// The answers of `case` that the target takes as answers: responses not
/// silently dropped, as it parses them, with their PSN offsets as the
/// target sees them: in the 24-bit PSN space, within half of it of the
/// PSN it sends first (an offset of 2^24 + 4 is the PSN at 4).
fn answers<'a>(
    case: &'a Case,
    conn: &'a Conn,
) -> impl Iterator<Item = (&'static uroce_wire::OpcodeInfo, i32, &'a PacketSpec)> + 'a {
    case.packets()
        .filter(|p| p.resp && !p.silently_dropped(conn))
        .filter_map(|p| Some((p.seen(conn)?.info, psn_space(p.psn_off), p)))
}

/// `off` modulo 2^24, from -2^23 to 2^23 - 1.
fn psn_space(off: i32) -> i32 {
    (off << 8) >> 8
}

/// Whether the successful completion of `posts[i]` was earned by an
/// answer of the case, and (a READ) holds its data.
fn check_success(
    conn: &Conn,
    case: &Case,
    posts: &[&Post],
    i: usize,
    obs: &Observation,
) -> Vec<Violation> {
    let mtu = conn.mtu;
    let start: i32 = posts[..i].iter().map(|w| w.span(mtu) as i32).sum();
    let w = posts[i];
    let last = start + w.span(mtu) as i32 - 1;
    let sent = case.request_span(mtu) as i32;
    let aeth = |p: &PacketSpec| AethSyndrome::from_byte(p.aeth.map_or(0, |a| a.0));
    let earned = answers(case, conn).any(|(info, psn, p)| match w.op {
        PostOp::Send | PostOp::Write => {
            // An answer at a PSN the target sent acknowledges everything
            // before it (and an ACK-class one its own PSN too).
            let own = match info.operation {
                Operation::Acknowledge => matches!(aeth(p), AethSyndrome::Ack { .. }),
                Operation::AtomicAcknowledge | Operation::RdmaReadResponse => true,
                _ => false,
            };
            let acks = matches!(
                info.operation,
                Operation::Acknowledge | Operation::AtomicAcknowledge | Operation::RdmaReadResponse
            );
            acks && psn < sent && (psn > last || (own && psn == last))
        }
        PostOp::Read => {
            info.operation == Operation::RdmaReadResponse
                && info.position.ends_message()
                && psn == last
        }
        PostOp::CompareSwap | PostOp::FetchAdd => {
            info.operation == Operation::AtomicAcknowledge && psn == start
        }
    });
    let mut v = Vec::new();
    if !earned {
        v.push(Violation::UnearnedSuccess(w.wr_id));
        return v;
    }
    // A READ's bytes: all its responses carry one fill byte; checked when
    // no other post writes the same bytes and no response carries data.
    if w.op == PostOp::Read && w.len > 0 {
        let lo = w.local_off as usize;
        let hi = lo + w.len as usize;
        let overlaps = posts.iter().enumerate().any(|(j, o)| {
            j != i
                && o.local_write()
                    .is_some_and(|(a, l)| (a as usize) < hi && lo < (a + l) as usize)
        });
        let fills: Vec<u8> = answers(case, conn)
            .filter(|(info, psn, p)| {
                info.operation == Operation::RdmaReadResponse
                    && *psn >= start
                    && *psn <= last
                    && p.data.is_none()
            })
            .map(|(.., p)| p.payload.1)
            .collect();
        let one_fill = fills.windows(2).all(|f| f[0] == f[1]);
        if let (false, true, Some(&fill), Some(bytes)) =
            (overlaps, one_fill, fills.first(), obs.exposed.get(lo..hi))
        {
            if let Some(k) = bytes.iter().position(|&b| b != fill) {
                v.push(Violation::ReadDataWrong {
                    wr_id: w.wr_id,
                    offset: lo + k,
                });
            }
        }
    }
    v
}

/// Checks `obs` after `case` on `conn`.
pub fn check(conn: &Conn, case: &Case, obs: &Observation) -> Vec<Violation> {
    let mut v = Vec::new();
    if !obs.alive {
        v.push(Violation::TargetDead("no answer after the case".into()));
        return v;
    }
    v.extend(obs.log.iter().map(|l| Violation::TargetLog(l.clone())));
    if !obs.private_intact {
        v.push(Violation::PrivateRegionChanged);
    }
    let mut grants: Vec<(i64, u64)> = case.packets().flat_map(|p| grants(p, conn)).collect();
    grants.extend(
        case.posts()
            .filter_map(|w| w.local_write())
            .map(|(o, l)| (i64::from(o), u64::from(l))),
    );
    let granted = |i: usize| {
        grants.iter().any(|&(off, len)| {
            let i = i as i64;
            i >= off && (i - off) < len.min(1 << 40) as i64
        })
    };
    if let Some(offset) = obs
        .exposed
        .iter()
        .enumerate()
        .find(|&(i, &b)| b != PATTERN && !granted(i))
        .map(|(i, _)| i)
    {
        v.push(Violation::WriteOutsideGrant { offset });
    }
    // A UC or UD send WR that completes in error moves its QP to SQE
    // (IBA 10.3.1, "Send Queue Error"): the case's own posts may.
    let posted = case.posts().next().is_some();
    let allowed: &[QpState] = match (conn.qp_type, posted) {
        (QpType::Rc, _) | (QpType::Uc, false) => &[QpState::Rts, QpState::Err],
        (QpType::Uc, true) => &[QpState::Rts, QpState::Sqe, QpState::Err],
        (QpType::Ud, false) => &[QpState::Rts],
        (QpType::Ud, true) => &[QpState::Rts, QpState::Sqe],
    };
    if !allowed.contains(&obs.qp_state) {
        v.push(Violation::IllegalState(obs.qp_state));
    }
    let posts: Vec<&Post> = case.posts().collect();
    let all_silent = posts.is_empty() && case.packets().all(|p| p.silently_dropped(conn));
    if all_silent {
        if obs.qp_state != QpState::Rts && allowed.contains(&obs.qp_state) {
            v.push(Violation::StateChangedBySilentDrop(obs.qp_state));
        }
        if !obs.completions.is_empty() {
            v.push(Violation::EffectOfSilentDrop(format!(
                "{} completions",
                obs.completions.len()
            )));
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut ok_recvs = 0;
    let mut last_send = None;
    for c in &obs.completions {
        if !c.recv {
            match posts.iter().position(|w| w.wr_id == c.wr_id) {
                None => v.push(Violation::UnknownCompletion(c.wr_id)),
                Some(_) if !seen.insert((false, c.wr_id)) => {
                    v.push(Violation::DuplicateCompletion(c.wr_id))
                }
                Some(i) => {
                    if last_send.is_some_and(|l| l > i) {
                        v.push(Violation::OutOfOrderCompletion(c.wr_id));
                    }
                    last_send = Some(i);
                    // (A UC or UD send WR completes once its packets are
                    // sent, IBA 9.8.3 / 9.8.4: nothing need earn it.)
                    if c.status == 0 && conn.qp_type == QpType::Rc {
                        v.extend(check_success(conn, case, &posts, i, obs));
                    }
                }
            }
        } else if c.wr_id >= u64::from(conn.recvs_posted) {
            v.push(Violation::UnknownCompletion(c.wr_id));
        } else if !seen.insert((true, c.wr_id)) {
            v.push(Violation::DuplicateCompletion(c.wr_id));
        } else if c.status == 0 {
            ok_recvs += 1;
        }
    }
    let max = may_receive(case, conn);
    if ok_recvs > max {
        v.push(Violation::TooManyReceives { got: ok_recvs, max });
    }
    if !obs.control_ok {
        v.push(Violation::ControlQpBroken);
    }
    if let crate::model::Verdict::Illegal(ms) = crate::model::judge(conn, case, obs) {
        v.extend(ms.into_iter().map(|m| {
            Violation::Model {
                section: crate::model::rules::find(m.rule)
                    .map_or("", |r| r.section)
                    .into(),
                rule: m.rule.into(),
                allowed: m.allowed,
                observed: m.observed,
            }
        }));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Step;
    use crate::target::Completion;
    use std::net::{IpAddr, Ipv4Addr};
    use uroce_wire::Opcode;

    fn conn() -> Conn {
        let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 0, 0, b));
        Conn {
            qp_type: QpType::Rc,
            target: ip(1),
            fuzzer: ip(2),
            src_port: 4791,
            qpn: 0x11,
            fuzzer_qpn: 0x22,
            control_qpn: 0x33,
            rq_psn: 100,
            sq_psn: 200,
            va: 0x10_0000,
            len: 4096,
            rkey: 0x1234,
            private_rkey: 0x5678,
            qkey: 0x1111_1111,
            mtu: 1024,
            recvs_posted: 8,
            keys: Vec::new(),
            recv_len: Some(4096),
            min_rnr_timer: None,
            access: None,
            qp_access: None,
            ops_1_5: None,
        }
    }

    fn post(wr_id: u64, op: PostOp, len: u32, local_off: u32) -> Step {
        Step::Post(Post {
            wr_id,
            op,
            len,
            local_off,
            remote_va: 0,
            rkey: 0x4242,
            swap_add: 0,
            compare: 0,
        })
    }

    fn answer(op: Opcode, psn: i32, len: u16, syndrome: u8) -> Step {
        let mut p = PacketSpec::response(op, psn);
        p.aeth = Some((syndrome, 1));
        p.payload = (len, 7);
        Step::Packet(p)
    }

    /// A READ of 2,000 bytes (PSNs 0-1) into offset 0 and a SEND (PSN 2),
    /// both answered correctly, both completed.
    fn answered() -> (Case, Observation) {
        let case = Case {
            steps: vec![
                post(1, PostOp::Read, 2000, 0),
                post(2, PostOp::Send, 10, 0),
                answer(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 0, 1024, 0x1f),
                answer(Opcode::RC_RDMA_READ_RESPONSE_LAST, 1, 976, 0x1f),
                answer(Opcode::RC_ACKNOWLEDGE, 2, 0, 0x1f),
            ],
        };
        let mut exposed = vec![PATTERN; 4096];
        exposed[..2000].fill(7);
        let send = |wr_id| Completion {
            wr_id,
            status: 0,
            recv: false,
            ..Completion::default()
        };
        let obs = Observation {
            alive: true,
            qp_state: QpState::Rts,
            completions: vec![send(1), send(2)],
            events: Vec::new(),
            exposed,
            private_intact: true,
            control_ok: true,
            log: Vec::new(),
            answers: None,
        };
        (case, obs)
    }

    #[test]
    fn answered_requests_that_complete_break_nothing() {
        let (case, obs) = answered();
        assert_eq!(check(&conn(), &case, &obs), []);
    }

    /// The verdicts of the oracles other than the reference model.
    fn classic(c: &Conn, case: &Case, obs: &Observation) -> Vec<Violation> {
        check(c, case, obs)
            .into_iter()
            .filter(|v| !matches!(v, Violation::Model { .. }))
            .collect()
    }

    /// A UC QP whose own send WR fails is in SQE (IBA 10.3.1); without a
    /// post of the case's, SQE is illegal.
    #[test]
    fn a_failed_uc_send_may_leave_sqe() {
        let c = Conn {
            qp_type: QpType::Uc,
            ..conn()
        };
        let (_, mut obs) = answered();
        obs.completions = vec![Completion {
            wr_id: 1,
            status: 1,
            recv: false,
            ..Completion::default()
        }];
        obs.qp_state = QpState::Sqe;
        obs.exposed.fill(PATTERN);
        let posted = Case {
            steps: vec![post(1, PostOp::Send, 1 << 30, 0)],
        };
        assert_eq!(classic(&c, &posted, &obs), []);
        // A UC SEND completes once sent, unanswered.
        obs.completions[0].status = 0;
        obs.qp_state = QpState::Rts;
        assert_eq!(classic(&c, &posted, &obs), []);
        obs.qp_state = QpState::Sqe;
        obs.completions.clear();
        let packets = Case {
            steps: vec![answer(Opcode::UC_SEND_ONLY, 0, 10, 0)],
        };
        assert_eq!(
            classic(&c, &packets, &obs),
            [Violation::IllegalState(QpState::Sqe)]
        );
    }

    #[test]
    fn the_responder_oracles_each_trip() {
        let c = conn();
        // A READ short of its bytes.
        let (case, mut obs) = answered();
        obs.exposed[1500] = PATTERN;
        // (The reference model sees it too.)
        assert!(check(&c, &case, &obs)
            .iter()
            .any(|v| matches!(v, Violation::Model { .. })));
        assert_eq!(
            classic(&c, &case, &obs),
            [Violation::ReadDataWrong {
                wr_id: 1,
                offset: 1500
            }]
        );
        // Completions out of posting order.
        let (case, mut obs) = answered();
        obs.completions.reverse();
        assert_eq!(
            classic(&c, &case, &obs),
            [Violation::OutOfOrderCompletion(1)]
        );
        // A READ without its LAST response.
        let (mut case, obs) = answered();
        case.steps.remove(3);
        assert_eq!(classic(&c, &case, &obs), [Violation::UnearnedSuccess(1)]);
        // The SEND acknowledged by a ghost ACK (a PSN never sent).
        let (mut case, obs) = answered();
        case.steps[4] = answer(Opcode::RC_ACKNOWLEDGE, 3, 0, 0x1f);
        assert_eq!(classic(&c, &case, &obs), [Violation::UnearnedSuccess(2)]);
        // A NAK for the SEND's PSN does not acknowledge it.
        let (mut case, obs) = answered();
        case.steps[4] = answer(Opcode::RC_ACKNOWLEDGE, 2, 0, 0x62);
        assert_eq!(classic(&c, &case, &obs), [Violation::UnearnedSuccess(2)]);
        // The PSN space has 24 bits: an ACK 2^24 PSNs on is the same ACK.
        let (mut case, obs) = answered();
        case.steps[4] = answer(Opcode::RC_ACKNOWLEDGE, 2 + (1 << 24), 0, 0x1f);
        assert_eq!(classic(&c, &case, &obs), []);
        // A completion nobody posted, and one twice.
        let (case, mut obs) = answered();
        obs.completions.push(Completion {
            wr_id: 99,
            status: 0,
            recv: false,
            ..Completion::default()
        });
        obs.completions.push(obs.completions[1].clone());
        assert_eq!(
            classic(&c, &case, &obs),
            [
                Violation::UnknownCompletion(99),
                Violation::DuplicateCompletion(2)
            ]
        );
        // A write outside the READ's local buffer.
        let (case, mut obs) = answered();
        obs.exposed[3000] = 0;
        assert_eq!(
            classic(&c, &case, &obs),
            [Violation::WriteOutsideGrant { offset: 3000 }]
        );
    }
}
