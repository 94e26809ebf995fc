//! The answers: what the target sent back (parsed with uroce's codec,
//! which only reads header fields), and what the model allows or
//! requires of them. An answer set is judged as a set: ACK coalescing,
//! repeats and the order of independent answers are left open.

use super::rules::{self, Rule};
use std::fmt;
use uroce_wire::{AethSyndrome, Operation, Position};

const PSN_MASK: u32 = 0xff_ffff;

/// `b - a` in the 24-bit PSN space.
pub fn psn_diff(b: u32, a: u32) -> u32 {
    b.wrapping_sub(a) & PSN_MASK
}

/// `a + n` in the 24-bit PSN space.
pub fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Where packet `i` of a message of `n` packets stands in it.
pub fn packet_position(i: u32, n: u32) -> Position {
    match (n, i) {
        (1, _) => Position::Only,
        (_, 0) => Position::First,
        (_, i) if i + 1 == n => Position::Last,
        _ => Position::Middle,
    }
}

/// One answer the target sent, as the model reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// ACK (any credit count).
    Ack {
        /// PSN.
        psn: u32,
        /// MSN.
        msn: u32,
    },
    /// NAK with this code (0 PSN sequence error, 1 invalid request, 2
    /// remote access, 3 remote operational, 4 invalid RD request).
    Nak {
        /// PSN.
        psn: u32,
        /// The 5-bit code.
        code: u8,
    },
    /// RNR NAK.
    Rnr {
        /// PSN.
        psn: u32,
        /// The 5-bit timer code.
        timer: u8,
    },
    /// An RDMA READ response packet.
    Read {
        /// PSN.
        psn: u32,
        /// FIRST, MIDDLE, LAST or ONLY.
        position: Position,
        /// Its payload.
        payload: Vec<u8>,
        /// The AETH's MSN (FIRST, LAST and ONLY carry one).
        msn: Option<u32>,
    },
    /// An atomic ACK.
    AtomicAck {
        /// PSN.
        psn: u32,
        /// Original value.
        orig: u64,
        /// The AETH's MSN.
        msn: u32,
    },
    /// Anything else a responder sent (a response with a reserved
    /// syndrome, a packet that does not parse).
    Other(String),
}

impl Seen {
    /// Reads one packet the target sent to the fuzzer; None for a request
    /// (the target's requester, not its answers).
    pub fn parse(bytes: &[u8]) -> Option<Seen> {
        let Ok(p) = uroce_wire::packet::parse(bytes) else {
            return Some(Seen::Other(format!(
                "{} bytes that do not parse",
                bytes.len()
            )));
        };
        if p.info.is_request {
            return None;
        }
        let psn = p.bth.psn.value();
        Some(match (p.info.operation, p.aeth().map(|a| a.syndrome)) {
            (Operation::RdmaReadResponse, _) => Seen::Read {
                psn,
                position: p.info.position,
                payload: p.payload.to_vec(),
                msn: p.aeth().map(|a| a.msn),
            },
            (Operation::AtomicAcknowledge, _) => Seen::AtomicAck {
                psn,
                orig: p.atomic_ack().map_or(0, |a| a.orig),
                msn: p.aeth().map_or(0, |a| a.msn),
            },
            (Operation::Acknowledge, Some(AethSyndrome::Ack { .. })) => Seen::Ack {
                psn,
                msn: p.aeth().map_or(0, |a| a.msn),
            },
            (Operation::Acknowledge, Some(AethSyndrome::RnrNak { timer })) => {
                Seen::Rnr { psn, timer }
            }
            (Operation::Acknowledge, Some(AethSyndrome::Nak(c))) => Seen::Nak {
                psn,
                code: c.code(),
            },
            _ => Seen::Other(format!("{} PSN {psn:#x}", p.info.name)),
        })
    }

    fn psn(&self) -> Option<u32> {
        match *self {
            Seen::Ack { psn, .. }
            | Seen::Nak { psn, .. }
            | Seen::Rnr { psn, .. }
            | Seen::Read { psn, .. }
            | Seen::AtomicAck { psn, .. } => Some(psn),
            Seen::Other(_) => None,
        }
    }
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Seen::Ack { psn, msn } => write!(f, "ACK PSN {psn:#x} MSN {msn}"),
            Seen::Nak { psn, code } => write!(f, "NAK {} PSN {psn:#x}", nak_name(*code)),
            Seen::Rnr { psn, timer } => write!(f, "RNR NAK PSN {psn:#x} timer {timer}"),
            Seen::Read {
                psn,
                position,
                payload,
                msn,
            } => {
                write!(
                    f,
                    "READ response {position:?} PSN {psn:#x} of {} bytes",
                    payload.len()
                )?;
                match msn {
                    Some(m) => write!(f, " MSN {m}"),
                    None => Ok(()),
                }
            }
            Seen::AtomicAck { psn, orig, msn } => {
                write!(f, "atomic ACK PSN {psn:#x} value {orig:#x} MSN {msn}")
            }
            Seen::Other(s) => f.write_str(s),
        }
    }
}

/// NAK codes (IBA 9.7.6, AETH syndrome).
pub mod nak {
    /// PSN sequence error.
    pub const SEQUENCE: u8 = 0;
    /// Invalid request.
    pub const INVALID_REQUEST: u8 = 1;
    /// Remote access error.
    pub const REMOTE_ACCESS: u8 = 2;
    /// Remote operational error.
    pub const REMOTE_OPERATIONAL: u8 = 3;
}

fn nak_name(code: u8) -> &'static str {
    match code {
        nak::SEQUENCE => "PSN sequence error",
        nak::INVALID_REQUEST => "invalid request",
        nak::REMOTE_ACCESS => "remote access error",
        nak::REMOTE_OPERATIONAL => "remote operational error",
        _ => "(other code)",
    }
}

/// What the model allows (and maybe requires) of the answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Want {
    /// An ACK naming a PSN in `from .. from + n`, with an MSN in this
    /// range (inclusive; None: any).
    Ack {
        /// First PSN.
        from: u32,
        /// How many.
        n: u32,
        /// MSN range.
        msn: Option<(u32, u32)>,
    },
    /// A NAK at `psn` with one of `codes`.
    Nak {
        /// PSN.
        psn: u32,
        /// Allowed codes.
        codes: Vec<u8>,
    },
    /// An RNR NAK at `psn` with this timer (None: any).
    Rnr {
        /// PSN.
        psn: u32,
        /// The 5-bit timer code.
        timer: Option<u8>,
    },
    /// READ responses from `psn`, one per `mtu` bytes of `bytes` (at
    /// least one), each carrying its part of them; the LAST or ONLY an
    /// MSN in `msn` (inclusive; None: any), the FIRST one in it or the
    /// one before its low end.
    Read {
        /// First PSN.
        psn: u32,
        /// The bytes read (None: any value).
        bytes: Vec<Option<u8>>,
        /// Path MTU.
        mtu: u32,
        /// MSN range.
        msn: Option<(u32, u32)>,
    },
    /// An atomic ACK at `psn` with this original value (None: any) and
    /// an MSN in this range (inclusive; None: any).
    AtomicAck {
        /// PSN.
        psn: u32,
        /// Original value.
        orig: Option<u64>,
        /// MSN range.
        msn: Option<(u32, u32)>,
    },
    /// Required only: some ACK-carrying answer at `from` or later, up to
    /// the expected PSN at the end of the case (a coalesced ACK, a NAK
    /// naming a later PSN, a later response).
    Covered {
        /// The PSN to acknowledge.
        from: u32,
    },
}

impl Want {
    fn read_packets(bytes: usize, mtu: u32) -> u32 {
        (bytes as u32).div_ceil(mtu.max(1)).max(1)
    }

    /// Whether `s` is an answer this allows.
    fn allows(&self, s: &Seen) -> bool {
        match (self, s) {
            (Want::Ack { from, n, msn }, Seen::Ack { psn, msn: m }) => {
                psn_diff(*psn, *from) < *n
                    && msn.is_none_or(|(lo, hi)| psn_diff(*m, lo) <= psn_diff(hi, lo))
            }
            (Want::Nak { psn, codes }, Seen::Nak { psn: p, code }) => {
                psn == p && codes.contains(code)
            }
            (Want::Rnr { psn, timer }, Seen::Rnr { psn: p, timer: t }) => {
                psn == p && timer.is_none_or(|x| x == *t)
            }
            (
                Want::AtomicAck { psn, orig, msn },
                Seen::AtomicAck {
                    psn: p,
                    orig: o,
                    msn: m,
                },
            ) => {
                psn == p
                    && orig.is_none_or(|x| x == *o)
                    && msn.is_none_or(|(lo, hi)| psn_diff(*m, lo) <= psn_diff(hi, lo))
            }
            (
                Want::Read {
                    psn,
                    bytes,
                    mtu,
                    msn,
                },
                Seen::Read {
                    psn: p,
                    position,
                    payload,
                    msn: m,
                },
            ) => {
                let n = Self::read_packets(bytes.len(), *mtu);
                let i = psn_diff(*p, *psn);
                if i >= n {
                    return false;
                }
                let want_pos = packet_position(i, n);
                let lo = (i * mtu) as usize;
                let hi = (lo + *mtu as usize).min(bytes.len());
                let part = bytes.get(lo..hi).unwrap_or(&[]);
                *position == want_pos
                    && payload.len() == part.len()
                    && part
                        .iter()
                        .zip(payload)
                        .all(|(w, b)| w.is_none_or(|w| w == *b))
                    && read_msn_fits(*msn, want_pos, *m)
            }
            _ => false,
        }
    }

    /// Whether the answers `seen` hold what this requires (`end`: the
    /// expected PSN at the end of the case).
    fn satisfied(&self, seen: &[Seen], end: u32) -> bool {
        match self {
            Want::Covered { from } => seen.iter().any(|s| {
                let Some(p) = s.psn() else { return false };
                !matches!(s, Seen::Other(_)) && psn_diff(p, *from) <= psn_diff(end, *from)
            }),
            Want::Read {
                psn,
                bytes,
                mtu,
                msn,
            } => (0..Self::read_packets(bytes.len(), *mtu)).all(|i| {
                let one = Want::Read {
                    psn: *psn,
                    bytes: bytes.clone(),
                    mtu: *mtu,
                    msn: *msn,
                };
                seen.iter()
                    .any(|s| s.psn() == Some(psn_add(*psn, i)) && one.allows(s))
            }),
            w => seen.iter().any(|s| w.allows(s)),
        }
    }
}

impl fmt::Display for Want {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Want::Ack { from, n, msn } => {
                write!(f, "ACK PSN {from:#x}")?;
                if *n > 1 {
                    write!(f, "..={:#x}", psn_add(*from, n - 1))?;
                }
                match msn {
                    Some((lo, hi)) if lo == hi => write!(f, " MSN {lo}"),
                    Some((lo, hi)) => write!(f, " MSN {lo}..={hi}"),
                    None => Ok(()),
                }
            }
            Want::Nak { psn, codes } => {
                let names: Vec<&str> = codes.iter().map(|&c| nak_name(c)).collect();
                write!(f, "NAK {} PSN {psn:#x}", names.join(" or "))
            }
            Want::Rnr { psn, timer: None } => write!(f, "RNR NAK PSN {psn:#x}"),
            Want::Rnr {
                psn,
                timer: Some(t),
            } => write!(f, "RNR NAK PSN {psn:#x} timer {t}"),
            Want::Read {
                psn,
                bytes,
                mtu,
                msn,
            } => {
                write!(
                    f,
                    "{} READ response(s) from PSN {psn:#x}, {} bytes",
                    Self::read_packets(bytes.len(), *mtu),
                    bytes.len()
                )?;
                match msn {
                    Some((lo, hi)) if lo == hi => write!(f, ", MSN {lo}"),
                    Some((lo, hi)) => write!(f, ", MSN {lo}..={hi}"),
                    None => Ok(()),
                }
            }
            Want::AtomicAck { psn, orig, msn } => {
                write!(f, "atomic ACK PSN {psn:#x}")?;
                if let Some(o) = orig {
                    write!(f, " value {o:#x}")?;
                }
                match msn {
                    Some((lo, hi)) if lo == hi => write!(f, " MSN {lo}"),
                    Some((lo, hi)) => write!(f, " MSN {lo}..={hi}"),
                    None => Ok(()),
                }
            }
            Want::Covered { from } => write!(f, "an ACK covering PSN {from:#x}"),
        }
    }
}

/// Whether a READ response at `position` carrying `seen` (its AETH's
/// MSN; MIDDLE carries none) fits the MSN range `want` (IBA 9.7.5.1.6:
/// the MSN counts the requests completed; a READ is complete once its
/// last response is sent, so the LAST or ONLY counts it; whether the
/// FIRST, sent while the READ is still being answered, counts it already
/// the spec leaves open: kernel rxe and uroce count it on the FIRST too).
fn read_msn_fits(want: Option<(u32, u32)>, position: Position, seen: Option<u32>) -> bool {
    let (Some((lo, hi)), Some(m)) = (want, seen) else {
        return true;
    };
    let lo = if position == Position::First {
        lo.wrapping_sub(1) & PSN_MASK
    } else {
        lo
    };
    psn_diff(m, lo) <= psn_diff(hi, lo)
}

/// One expectation, with the rule that makes it and why it applies.
#[derive(Clone, Debug)]
pub struct Expect {
    /// What.
    pub want: Want,
    /// Whether the answers must hold it (else: may).
    pub required: bool,
    /// The rule.
    pub rule: &'static Rule,
    /// The packet it answers.
    pub why: String,
}

/// A mismatch between the answers and the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The rule.
    pub rule: &'static str,
    /// What the model allowed.
    pub allowed: String,
    /// What was observed.
    pub observed: String,
}

/// Judges the answers `seen` against `expects` (`end`: the expected PSN
/// at the end of the case).
pub fn judge(expects: &[Expect], seen: &[Seen], end: u32) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for s in seen {
        if expects.iter().any(|e| e.want.allows(s)) {
            continue;
        }
        let near: Vec<&Expect> = expects
            .iter()
            .filter(|e| want_psn(&e.want).is_some() && want_psn(&e.want) == s.psn())
            .collect();
        let rule = near.first().map_or(rules::UNEXPECTED_ANSWER, |e| e.rule);
        let allowed = if near.is_empty() {
            summary(expects)
        } else {
            summary_of(near.iter().copied())
        };
        out.push(Mismatch {
            rule: rule.id,
            allowed,
            observed: s.to_string(),
        });
    }
    // IBA 9.7.5.1: one PSN sequence error NAK per gap. Each the model
    // allows (one per gap it opened) explains one NAK; ACKs may repeat,
    // these may not.
    let mut seq: std::collections::BTreeMap<u32, usize> = Default::default();
    for s in seen {
        if let Seen::Nak {
            psn,
            code: nak::SEQUENCE,
        } = *s
        {
            *seq.entry(psn).or_default() += 1;
        }
    }
    for (psn, n) in seq {
        let allowed = expects
            .iter()
            .filter(|e| match &e.want {
                Want::Nak { psn: q, codes } => *q == psn && codes.contains(&nak::SEQUENCE),
                _ => false,
            })
            .count();
        if allowed > 0 && n > allowed {
            out.push(Mismatch {
                rule: rules::SEQUENCE_NAK.id,
                allowed: format!("{allowed} PSN sequence error NAK at {psn:#x} (one per gap)"),
                observed: format!("{n} of them"),
            });
        }
    }
    for e in expects.iter().filter(|e| e.required) {
        if !e.want.satisfied(seen, end) {
            out.push(Mismatch {
                rule: e.rule.id,
                allowed: format!("{} (for {})", e.want, e.why),
                observed: if seen.is_empty() {
                    "no answers".into()
                } else {
                    seen.iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join("; ")
                },
            });
        }
    }
    out
}

fn want_psn(w: &Want) -> Option<u32> {
    match *w {
        Want::Ack { from, .. } => Some(from),
        Want::Nak { psn, .. }
        | Want::Rnr { psn, .. }
        | Want::Read { psn, .. }
        | Want::AtomicAck { psn, .. } => Some(psn),
        Want::Covered { .. } => None,
    }
}

fn summary(expects: &[Expect]) -> String {
    if expects
        .iter()
        .all(|e| matches!(e.want, Want::Covered { .. }))
    {
        return "no answer".into();
    }
    summary_of(expects.iter())
}

fn summary_of<'a>(expects: impl Iterator<Item = &'a Expect>) -> String {
    let v: Vec<String> = expects
        .filter(|e| !matches!(e.want, Want::Covered { .. }))
        .map(|e| format!("{} (for {})", e.want, e.why))
        .collect();
    v.join("; ")
}
