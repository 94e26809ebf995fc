//! The RC responder (IBA 9.7.5): PSN classes, then for a request at the
//! expected PSN the checks (opcode sequence, length, receive queue,
//! R_Key) and the execution; duplicates answered from the record; the
//! error classes and the QP state each leaves (IBA 9.9).

use super::answer::{nak, psn_add, psn_diff, Want};
use super::memory::{self, check_rkey, Place};
use super::requester;
use super::rules::{self, Rule};
use super::{Input, Pkt, Recv, World, WC_RECV, WC_RECV_RDMA_WITH_IMM};
use crate::target::{access, Conn, KeyState};
use uroce_wire::{Operation, Position, Transport as Wire};

/// The largest message (IBA 9.4: 2^31 bytes).
const MAX_MESSAGE: u64 = 1 << 31;

/// A message in progress.
#[derive(Clone, Debug)]
pub enum Msg {
    /// A SEND into receive WR `wr`, `len` bytes so far.
    Send {
        /// The WR.
        wr: u64,
        /// Bytes so far.
        len: u64,
    },
    /// A WRITE of `dma` bytes at `place`, `done` so far.
    Write {
        /// Where.
        place: Place,
        /// DMA length.
        dma: u64,
        /// Bytes so far.
        done: u64,
    },
}

impl Msg {
    /// Whether a MIDDLE or LAST of `op` continues this message.
    pub fn continues(&self, op: Operation) -> bool {
        matches!(
            (self, op),
            (Msg::Send { .. }, Operation::Send) | (Msg::Write { .. }, Operation::RdmaWrite)
        )
    }

    /// The range a WRITE in progress may have placed bytes in.
    pub fn forget(&self, w: &mut super::memory::Region) {
        if let Msg::Write { place, dma, .. } = *self {
            match place {
                Place::Exposed(off) => w.forget(off, dma as usize),
                Place::Elsewhere => w.forget(0, w.0.len()),
                Place::Nothing => {}
            }
        }
    }
}

/// A READ, atomic, ATOMIC WRITE or FLUSH the responder executed (its
/// record, IBA 9.7.5.2).
#[derive(Clone, Debug)]
pub struct Record {
    /// PSN.
    pub psn: u32,
    /// PSNs it takes (a READ: one per response).
    pub n: u32,
    /// The MSN once it was executed (counting it).
    pub msn: u32,
    /// Which operation.
    pub op: Operation,
    /// An atomic's original value (None: a READ, or not known).
    pub orig: Option<Option<u64>>,
}

/// The RC responder's state.
#[derive(Clone, Debug)]
pub struct Rc {
    /// Expected PSN.
    pub epsn: u32,
    /// Message sequence number: messages completed.
    pub msn: u32,
    /// The message in progress.
    pub cur: Option<Msg>,
    /// A PSN sequence error NAK was sent for the current gap.
    pub nak_sent: bool,
    /// Executed READs and atomics.
    pub records: Vec<Record>,
    /// Each executed SEND or WRITE packet's PSN and the MSN after it.
    pub acked_msn: Vec<(u32, u32)>,
    /// The requester's side.
    pub req: super::requester::Requester,
}

impl Rc {
    /// A responder expecting `epsn`.
    pub fn new(epsn: u32) -> Rc {
        Rc {
            epsn,
            msn: 0,
            cur: None,
            nak_sent: false,
            records: Vec::new(),
            acked_msn: Vec::new(),
            req: Default::default(),
        }
    }
}

/// PSN class of a request (IBA 9.7.5.1): the expected PSN; the 2^23
/// PSNs before it are duplicates; the rest are invalid (ahead: a PSN
/// sequence error). The PSN half the space away is both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsnClass {
    /// The expected PSN.
    Expected,
    /// A duplicate.
    Duplicate,
    /// Ahead of the expected PSN.
    Ahead,
    /// Exactly half the PSN space away: either.
    Either,
}

/// The class of `psn` against `epsn`.
pub fn classify(psn: u32, epsn: u32) -> PsnClass {
    match psn_diff(psn, epsn) {
        0 => PsnClass::Expected,
        d if d < 1 << 23 => PsnClass::Ahead,
        d if d == 1 << 23 => PsnClass::Either,
        _ => PsnClass::Duplicate,
    }
}

/// A request executed: it takes `n` PSNs from `psn`, counts in the MSN
/// and is kept for a duplicate (`orig`: an atomic's original value).
/// Returns the MSN it got.
fn executed(w: &mut World, psn: u32, n: u32, op: Operation, orig: Option<Option<u64>>) -> u32 {
    let r = rc(w);
    r.epsn = psn_add(psn, n);
    r.msn = psn_add(r.msn, 1);
    let msn = r.msn;
    r.records.push(Record {
        psn,
        n,
        msn,
        op,
        orig,
    });
    msn
}

fn rc(w: &mut World) -> &mut Rc {
    match &mut w.t {
        super::Transport::Rc(r) => r,
        _ => unreachable!("an RC world"),
    }
}

/// One input on an RC QP.
pub fn step(mut w: World, conn: &Conn, input: &Input) -> Vec<World> {
    if w.err {
        // IBA 10.3.1: a QP in Error takes no packets. (A responder that
        // holds new requests behind READ responses and answers
        // duplicates at once may still answer a duplicate that arrived
        // after the failing request but before it was executed.)
        if let Input::Pkt(p) = input {
            let epsn = rc(&mut w).epsn;
            if p.info.is_request && classify(p.psn, epsn) == PsnClass::Duplicate {
                return vec![duplicate(w, conn, p)];
            }
        }
        return vec![w];
    }
    // The requester may have given up on its requests by now.
    let mut out = Vec::new();
    if requester::busy(&mut w) {
        out.push(requester::give_up(w.clone()));
    }
    out.extend(packet(w, conn, input));
    out
}

fn packet(mut w: World, conn: &Conn, input: &Input) -> Vec<World> {
    let p = match input {
        Input::Malformed { psn, why } => {
            // A request the responder cannot read, or a response the
            // requester cannot read.
            let mut out = malformed(w.clone(), *psn, why);
            if requester::busy(&mut w) {
                out.push(requester::fail(w, Vec::new()));
            }
            return out;
        }
        Input::Pkt(p) => p,
    };
    if !p.info.is_request {
        // A response: for the requester.
        return requester::response(w, conn, input);
    }
    if p.info.transport != Wire::Rc {
        // IBA 9.6: an opcode of another transport; dropped, or taken
        // as an invalid request.
        return malformed(w, p.psn, &p.why);
    }
    if !implemented(conn, p.info.operation) {
        // IBA 9.6.1 (header checks): an opcode the device does not
        // implement is reserved for it (IBA 1.5's placement operations
        // on an older device): dropped, or taken as an invalid request.
        return malformed(w, p.psn, &p.why);
    }
    let epsn = rc(&mut w).epsn;
    match classify(p.psn, epsn) {
        PsnClass::Expected => expected(w, conn, p),
        PsnClass::Duplicate => vec![duplicate(w, conn, p)],
        PsnClass::Ahead => vec![ahead(w, &p.why)],
        PsnClass::Either => vec![duplicate(w.clone(), conn, p), ahead(w, &p.why)],
    }
}

/// Whether the device implements `op`: IBA 1.5's FLUSH and ATOMIC WRITE
/// only where it announces them ([`Conn::ops_1_5`]; not known: yes).
fn implemented(conn: &Conn, op: Operation) -> bool {
    let bit = match op {
        Operation::Flush => crate::target::OPS_FLUSH,
        Operation::AtomicWrite => crate::target::OPS_ATOMIC_WRITE,
        _ => return true,
    };
    conn.ops_1_5.is_none_or(|ops| ops & bit != 0)
}

/// A packet the QP cannot read: dropped; or, at the expected PSN, an
/// invalid request; or, ahead, a sequence error.
fn malformed(w: World, psn: u32, why: &str) -> Vec<World> {
    let mut out = vec![w.clone()];
    let mut w = w;
    let r = rc(&mut w);
    match classify(psn, r.epsn) {
        PsnClass::Expected => {
            r.nak_sent = false;
            out.push(fail(
                w,
                &[nak::INVALID_REQUEST],
                true,
                false,
                rules::INVALID_REQUEST,
                why,
            ));
        }
        PsnClass::Ahead if !r.nak_sent => out.push(ahead(w, why)),
        _ => {}
    }
    out
}

/// IBA 9.7.5.1, invalid PSN: a sequence error NAK naming the expected
/// PSN, once until the expected PSN arrives.
fn ahead(mut w: World, why: &str) -> World {
    let r = rc(&mut w);
    if r.nak_sent {
        return w;
    }
    r.nak_sent = true;
    let psn = r.epsn;
    let codes = vec![nak::SEQUENCE];
    w.expect(Want::Nak { psn, codes }, true, rules::SEQUENCE_NAK, why);
    w
}

/// IBA 9.7.5.2: a duplicate changes nothing; SEND and WRITE are ACKed
/// again (a PSN from the duplicate's to the last executed), a READ is
/// read again (the current bytes), an atomic is answered with the
/// original value the responder saved. Each answer may also be left out
/// (a record the responder recycled; a coalesced ACK).
fn duplicate(mut w: World, conn: &Conn, p: &Pkt) -> World {
    let r = rc(&mut w);
    let since = psn_diff(r.epsn, p.psn);
    let record = r.records.iter().rev().find(|x| x.psn == p.psn).cloned();
    let rule = rules::DUPLICATE;
    match p.info.operation {
        Operation::Send | Operation::RdmaWrite => {
            // The MSN as of the duplicate's PSN, or any later one up to
            // now (the ACK names a PSN from the duplicate's on).
            let r = rc(&mut w);
            let at = r.acked_msn.iter().rev().find(|x| x.0 == p.psn).map(|x| x.1);
            let msn = at.map(|lo| (lo, r.msn));
            let want = Want::Ack {
                from: p.psn,
                n: since,
                msn,
            };
            w.expect(want, false, rule, &p.why);
        }
        Operation::RdmaReadRequest => {
            // The MSN as of the READ it repeats (or a part of), or any
            // later one up to now.
            let r = rc(&mut w);
            let msn = r
                .records
                .iter()
                .rev()
                .find(|x| x.op == Operation::RdmaReadRequest && psn_diff(p.psn, x.psn) < x.n)
                .map(|x| (x.msn, r.msn));
            if let Some(reth) = p.reth {
                let len = u64::from(reth.dma_len);
                let place = check_rkey(conn, &w.keys, reth.rkey, reth.va, len, memory::REMOTE_READ);
                // The requester asks again: the responder may abandon the
                // responses of an earlier READ it still sends for these
                // PSNs (they are answered by this one's).
                for e in &mut w.expects {
                    if let Want::Read {
                        psn, bytes, mtu, ..
                    } = &e.want
                    {
                        let n = (bytes.len() as u32).div_ceil((*mtu).max(1)).max(1);
                        if psn_diff(p.psn, *psn) < n {
                            e.required = false;
                        }
                    }
                }
                if let Some(bytes) = read_bytes(&w, place, len) {
                    let want = Want::Read {
                        psn: p.psn,
                        bytes,
                        mtu: conn.mtu,
                        msn,
                    };
                    w.expect(want, false, rule, &p.why);
                }
            }
        }
        Operation::CompareSwap | Operation::FetchAdd => {
            if let Some(Record {
                orig: Some(orig),
                msn: then,
                ..
            }) = record
            {
                // The MSN as of the atomic, or any later one up to now.
                let msn = Some((then, rc(&mut w).msn));
                let want = Want::AtomicAck {
                    psn: p.psn,
                    orig,
                    msn,
                };
                w.expect(want, false, rule, &p.why);
            }
        }
        op @ (Operation::AtomicWrite | Operation::Flush) => {
            // Answered again as it was (an empty READ response ONLY),
            // without being executed again, if the record is kept.
            if let Some(x) = record.filter(|x| x.op == op) {
                let msn = Some((x.msn, rc(&mut w).msn));
                w.expect(placed_answer(p.psn, msn), false, rule, &p.why);
            }
        }
        _ => {}
    }
    w
}

fn read_bytes(w: &World, place: Option<Place>, len: u64) -> Option<Vec<Option<u8>>> {
    match place? {
        Place::Nothing => Some(Vec::new()),
        Place::Exposed(off) => Some(w.region.read(off, len as usize)),
        Place::Elsewhere if len <= 1 << 20 => Some(vec![None; len as usize]),
        Place::Elsewhere => None,
    }
}

/// A failed check (IBA 9.9, responder error classes): NAK with one of
/// `codes` at the expected PSN (required unless `nak_optional`), the
/// message in progress (and a receive WR this request may have taken)
/// completes in error, a WRITE in progress leaves its range undefined,
/// the QP goes to Error.
fn fail(
    mut w: World,
    codes: &[u8],
    may_take_recv: bool,
    nak_optional: bool,
    rule: &'static Rule,
    why: &str,
) -> World {
    let r = rc(&mut w);
    let psn = r.epsn;
    let cur = r.cur.take();
    if let Some(m) = &cur {
        m.forget(&mut w.region);
    }
    match cur {
        Some(Msg::Send { wr, .. }) => w.in_progress = Some(wr),
        _ if may_take_recv => w.in_progress = Some(w.next_recv),
        _ => {}
    }
    w.enter_error();
    let codes = codes.to_vec();
    w.expect(Want::Nak { psn, codes }, !nak_optional, rule, why);
    w
}

/// A failed check of a request at the expected PSN.
#[derive(Clone, Copy, Debug)]
struct Check {
    codes: &'static [u8],
    rule: &'static Rule,
    nak_optional: bool,
    /// The spec leaves open whether this fails.
    maybe: bool,
    /// The failed message may be acknowledged instead of NAKed (class J).
    acked: bool,
}

const INVALID: Check = Check {
    codes: &[nak::INVALID_REQUEST],
    rule: rules::INVALID_REQUEST,
    nak_optional: false,
    maybe: false,
    acked: false,
};
const ACCESS: Check = Check {
    codes: &[nak::REMOTE_ACCESS],
    rule: rules::REMOTE_ACCESS,
    nak_optional: false,
    maybe: false,
    acked: false,
};

/// The length check's failure for `p`, if any.
fn length_check(p: &Pkt, mtu: u32) -> Option<Check> {
    match length_ok(p, mtu) {
        Ok(()) => None,
        Err(maybe) => Some(Check { maybe, ..INVALID }),
    }
}

/// IBA 9.7.5.1 length checks: FIRST and MIDDLE carry exactly one MTU,
/// LAST and ONLY at most one.
/// A LAST without payload (no requester sends one: a message of whole
/// MTUs ends with a full LAST) may be taken or refused: Err(true).
pub fn length_ok(p: &Pkt, mtu: u32) -> Result<(), bool> {
    let n = p.payload.len() as u64;
    match p.info.position {
        Position::First | Position::Middle if n == u64::from(mtu) => Ok(()),
        Position::Last if n == 0 => Err(true),
        Position::Last | Position::Only if n <= u64::from(mtu) => Ok(()),
        _ => Err(false),
    }
}

/// The outcomes of a request at the expected PSN whose checks found
/// `failed` (any one may be the one reported; IBA leaves their order
/// open, but the opcode sequence comes first) and that needs a receive
/// WR it may not find (`rnr`), else `execute`.
fn outcomes(
    w: World,
    p: &Pkt,
    failed: &[Check],
    rnr: bool,
    execute: impl FnOnce(World) -> World,
) -> Vec<World> {
    // A check whose failure the spec leaves open fails in one world and
    // passes in another.
    let sure = failed.iter().all(|c| !c.maybe);
    let mut out = outcomes_sure(w.clone(), p, failed, rnr);
    if out.is_empty() || (!sure && failed.iter().all(|c| c.maybe) && !rnr) {
        out.push(execute(w));
    }
    out
}

fn outcomes_sure(w: World, p: &Pkt, failed: &[Check], rnr: bool) -> Vec<World> {
    let mut out = Vec::new();
    if rnr {
        // IBA 9.7.6: RNR NAK at the request's PSN, nothing done; its
        // timer field the QP's min_rnr_timer (IBA 9.7.5.2.8).
        let mut v = w.clone();
        let want = Want::Rnr {
            psn: p.psn,
            timer: w.min_rnr_timer,
        };
        v.expect(want, true, rules::RNR, &p.why);
        out.push(v);
    }
    // A failed request may have taken the receive WR it needs.
    let needs_recv = match p.info.operation {
        Operation::Send => p.info.position.starts_message(),
        Operation::RdmaWrite => p.info.position.ends_message() && p.imm.is_some(),
        _ => false,
    };
    for c in failed {
        let took = needs_recv;
        let mut v = fail(w.clone(), c.codes, took, c.nak_optional, c.rule, &p.why);
        if c.acked {
            // IBA 9.9.3 class J (rxe, uroce): no NAK; the message is
            // acknowledged at its PSN, the MSN not counting it.
            let msn = rc(&mut v).msn;
            let want = Want::Ack {
                from: p.psn,
                n: 1,
                msn: Some((msn, msn)),
            };
            v.expect(want, false, c.rule, &p.why);
        }
        out.push(v);
    }
    out
}

/// A request at the expected PSN.
fn expected(mut w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let r = rc(&mut w);
    r.nak_sent = false;
    // IBA 9.7.5.1 opcode sequence: a FIRST or ONLY only between
    // messages, a MIDDLE or LAST only inside one of its operation.
    let starts = p.info.position.starts_message();
    let in_seq = match &r.cur {
        Some(m) => !starts && m.continues(p.info.operation),
        None => starts,
    };
    if !in_seq {
        let check = Check {
            rule: rules::OP_SEQUENCE,
            ..INVALID
        };
        return vec![fail(w, check.codes, false, false, check.rule, &p.why)];
    }
    match p.info.operation {
        Operation::Send => send(w, conn, p),
        Operation::RdmaWrite => write(w, conn, p),
        Operation::RdmaReadRequest => read(w, conn, p),
        Operation::CompareSwap | Operation::FetchAdd => atomic(w, conn, p),
        Operation::AtomicWrite => atomic_write(w, conn, p),
        Operation::Flush => flush(w, conn, p),
        op => vec![w.open(format!("{op:?} is not modelled"))],
    }
}

/// An executed SEND or WRITE packet: it may be ACKed (with the MSN as
/// of it), and with AckReq it must be, by it or a later answer.
fn acked(mut w: World, p: &Pkt) -> World {
    let r = rc(&mut w);
    let (psn, msn) = (p.psn, r.msn);
    r.epsn = psn_add(psn, 1);
    r.acked_msn.push((psn, msn));
    let want = Want::Ack {
        from: psn,
        n: 1,
        msn: Some((msn, msn)),
    };
    w.expect(want, false, rules::ACK, &p.why);
    if p.ack_req {
        w.expect(Want::Covered { from: psn }, true, rules::ACK, &p.why);
    }
    w
}

/// IBA 9.4.1 SEND: the message fills a receive WR (taken by its FIRST
/// or ONLY: RNR when there is none) and completes it at its LAST or
/// ONLY; a SEND with Invalidate then invalidates its key (IBA 10.6.7:
/// only a type 2 window bound through this QP; else the receive WR
/// completes in error and the QP fails, class J: the message may be
/// acknowledged, a NAK left open).
fn send(mut w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let starts = p.info.position.starts_message();
    let ends = p.info.position.ends_message();
    let mut failed = Vec::new();
    failed.extend(length_check(p, conn.mtu));
    let so_far = match rc(&mut w).cur {
        Some(Msg::Send { len, .. }) => len,
        _ => 0,
    };
    let total = so_far + p.payload.len() as u64;
    match conn.recv_len {
        Some(l) if total > u64::from(l) => failed.push(INVALID),
        None if total > u64::from(conn.mtu) => {
            return vec![w.open("a SEND longer than the MTU, receive buffers unknown")]
        }
        _ => {}
    }
    if ends && p.ieth.is_some_and(|k| !memory::invalidatable(&w.keys, k)) {
        failed.push(Check {
            codes: &[
                nak::INVALID_REQUEST,
                nak::REMOTE_ACCESS,
                nak::REMOTE_OPERATIONAL,
            ],
            rule: rules::RECEIVE,
            nak_optional: true,
            maybe: false,
            // IBA 9.9.3 class J: the receive WR completes in error and
            // the QP fails with no NAK (rxe and uroce acknowledge the
            // message); a NAK is left open.
            acked: true,
        });
    }
    let rnr = starts && w.next_recv >= u64::from(conn.recvs_posted);
    outcomes(w, p, &failed, rnr, |mut w| {
        if starts {
            let wr = w.take_recv(conn).expect("checked: a receive WR is left");
            rc(&mut w).cur = Some(Msg::Send { wr, len: 0 });
        }
        let r = rc(&mut w);
        let Some(Msg::Send { wr, len }) = &mut r.cur else {
            unreachable!("the opcode sequence was checked")
        };
        *len += p.payload.len() as u64;
        let (wr, len) = (*wr, *len);
        if ends {
            r.cur = None;
            r.msn = psn_add(r.msn, 1);
            let mut c = Recv::ok(wr, WC_RECV, len as u32, &p.why);
            c.imm = p.imm;
            if let Some(k) = p.ieth {
                c.inv = Some(k);
                for key in w.keys.iter_mut().filter(|x| x.key == k) {
                    key.state = KeyState::Invalidated;
                }
            }
            w.done.push(c);
        }
        acked(w, p)
    })
}

/// IBA 9.4.2 RDMA WRITE: the FIRST or ONLY's RETH names the range (R_Key
/// checked for all of it, IBA 10.6), each packet is placed after the
/// last, and the message carries exactly the DMA length; with immediate
/// data its LAST or ONLY completes a receive WR (RNR when there is none).
fn write(mut w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let ends = p.info.position.ends_message();
    let mut failed = Vec::new();
    failed.extend(length_check(p, conn.mtu));
    let n = p.payload.len() as u64;
    let (place, dma, done) = match (&rc(&mut w).cur, p.reth) {
        (Some(Msg::Write { place, dma, done }), _) => (Some(*place), *dma, *done),
        (_, Some(reth)) => {
            let dma = u64::from(reth.dma_len);
            let need = memory::REMOTE_WRITE;
            let place = check_rkey(conn, &w.keys, reth.rkey, reth.va, dma, need);
            if place.is_none() {
                failed.push(ACCESS);
            }
            if dma > MAX_MESSAGE {
                failed.push(INVALID);
            }
            (place, dma, 0)
        }
        _ => return vec![w.open("a WRITE without RETH")],
    };
    if done + n > dma || (ends && done + n != dma) {
        failed.push(INVALID);
    }
    let rnr = ends && p.imm.is_some() && w.next_recv >= u64::from(conn.recvs_posted);
    outcomes(w, p, &failed, rnr, |mut w| {
        let place = place.expect("checked");
        match place {
            Place::Exposed(off) => w.region.write(off + done as usize, &p.payload),
            Place::Elsewhere => w.region.forget(0, conn.len as usize),
            Place::Nothing => {}
        }
        let r = rc(&mut w);
        r.cur = Some(Msg::Write {
            place,
            dma,
            done: done + n,
        });
        if ends {
            r.cur = None;
            r.msn = psn_add(r.msn, 1);
            if let Some(imm) = p.imm {
                let wr = w.take_recv(conn).expect("checked: a receive WR is left");
                let mut c = Recv::ok(wr, WC_RECV_RDMA_WITH_IMM, dma as u32, &p.why);
                c.imm = Some(imm);
                w.done.push(c);
            }
        }
        acked(w, p)
    })
}

/// IBA 9.4.3 RDMA READ: R_Key checked for the range (IBA 10.6); the
/// responses, one per MTU at consecutive PSNs from the request's, carry
/// the region's bytes as they are when it executes; the request takes
/// as many PSNs as it has responses.
fn read(w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let Some(reth) = p.reth else {
        return vec![w.open("a READ without RETH")];
    };
    let len = u64::from(reth.dma_len);
    let place = check_rkey(conn, &w.keys, reth.rkey, reth.va, len, memory::REMOTE_READ);
    let mut failed = Vec::new();
    if place.is_none() {
        failed.push(ACCESS);
    }
    if len > MAX_MESSAGE {
        failed.push(INVALID);
    }
    if place.is_some() && read_bytes(&w, place, len).is_none() {
        return vec![w.open("a READ of more than 1 MiB elsewhere")];
    }
    outcomes(w, p, &failed, false, |mut w| {
        let bytes = read_bytes(&w, place, len).expect("checked");
        let n = (len as u32).div_ceil(conn.mtu.max(1)).max(1);
        let msn = executed(&mut w, p.psn, n, Operation::RdmaReadRequest, None);
        // IBA 9.7.5.1.6: the MSN counts the READ.
        let want = Want::Read {
            psn: p.psn,
            bytes,
            mtu: conn.mtu,
            msn: Some((msn, msn)),
        };
        w.expect(want, true, rules::READ_RESPONSE, &p.why);
        w
    })
}

/// IBA 9.4.5 atomics: 8 naturally aligned bytes (else an invalid
/// request), R_Key with the atomic right (IBA 10.6); executed once, the
/// original value returned in an atomic ACK at the request's PSN and
/// saved for a duplicate.
fn atomic(w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let Some(a) = p.atomic else {
        return vec![w.open("an atomic without AtomicETH")];
    };
    let mut failed = Vec::new();
    if a.va % 8 != 0 {
        failed.push(INVALID);
    }
    let place = check_rkey(conn, &w.keys, a.rkey, a.va, 8, memory::REMOTE_ATOMIC);
    if place.is_none() {
        failed.push(ACCESS);
    }
    outcomes(w, p, &failed, false, |mut w| {
        let orig = match place {
            Some(Place::Exposed(off)) => {
                let orig = w.region.read_u64(off);
                let new = orig.map(|o| match p.info.operation {
                    Operation::CompareSwap if o == a.compare => a.swap_add,
                    Operation::CompareSwap => o,
                    _ => o.wrapping_add(a.swap_add),
                });
                match new {
                    Some(v) => w.region.write(off, &v.to_le_bytes()),
                    None => w.region.forget(off, 8),
                }
                orig
            }
            _ => {
                w.region.forget(0, conn.len as usize);
                None
            }
        };
        let msn = executed(&mut w, p.psn, 1, p.info.operation, Some(orig));
        // IBA 9.7.5.1.6: the MSN counts the atomic.
        let want = Want::AtomicAck {
            psn: p.psn,
            orig,
            msn: Some((msn, msn)),
        };
        w.expect(want, true, rules::ATOMIC, &p.why);
        w
    })
}

/// The answer to an executed FLUSH or ATOMIC WRITE (IBA 1.5): an RDMA
/// READ response ONLY with no payload at its PSN, its MSN in `msn`.
fn placed_answer(psn: u32, msn: Option<(u32, u32)>) -> Want {
    Want::Read {
        psn,
        bytes: Vec::new(),
        mtu: 1,
        msn,
    }
}

/// A FLUSH or ATOMIC WRITE executed: answered by an empty READ response
/// ONLY counting it in its MSN (IBA 1.5; it is acknowledged like a READ,
/// not by a plain or coalesced ACK: kernel rxe's
/// `send_read_response_ack`, uroce's responder); it takes one PSN,
/// completes a message, and is kept for a duplicate.
fn placed(mut w: World, p: &Pkt) -> World {
    let msn = executed(&mut w, p.psn, 1, p.info.operation, None);
    let want = placed_answer(p.psn, Some((msn, msn)));
    w.expect(want, true, rules::PLACEMENT, &p.why);
    w
}

/// Whether the QP's access flags (`Conn::qp_access`) allow an operation
/// that needs `need` (the remote access enables Modify QP sets, IBA
/// ch. 11; kernel rxe's `check_qp_attr_access`, uroce's
/// `check_op_allowed`): a QP that does not is sent an invalid request.
/// Not said: either.
fn qp_allows(conn: &Conn, need: u32) -> Option<Check> {
    match conn.qp_access {
        Some(q) if q & need == need => None,
        Some(_) => Some(INVALID),
        None => Some(Check {
            maybe: true,
            ..INVALID
        }),
    }
}

/// IBA 1.5 ATOMIC WRITE: 8 bytes of payload, a DMA length of 8 and an
/// aligned address (else an invalid request), on a QP that takes remote
/// writes (else an invalid request), through an R_Key with the remote
/// write right over the 8 bytes (else a remote access error; kernel rxe
/// and uroce ask for the write right, as rdma-core's
/// `ibv_wr_atomic_write` on a region registered for remote write);
/// placed as one store, the region's 8 bytes and no other, answered as
/// [`placed`].
fn atomic_write(w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let Some(reth) = p.reth else {
        return vec![w.open("an ATOMIC WRITE without RETH")];
    };
    let mut failed = Vec::new();
    if p.payload.len() != 8 || reth.va % 8 != 0 || reth.dma_len != 8 {
        failed.push(INVALID);
    }
    let qp = match conn.qp_access {
        // (A QP whose rights are not said takes it, as a WRITE.)
        None => None,
        Some(_) => qp_allows(conn, memory::REMOTE_WRITE),
    };
    failed.extend(qp);
    let place = check_rkey(conn, &w.keys, reth.rkey, reth.va, 8, memory::REMOTE_WRITE);
    // With a DMA length other than 8 a responder may check the R_Key for
    // the length the RETH names before it finds the length wrong (rxe
    // does): the remote access error is one of the two it may report.
    let long = u64::from(reth.dma_len);
    if place.is_none()
        || (long != 8
            && check_rkey(
                conn,
                &w.keys,
                reth.rkey,
                reth.va,
                long,
                memory::REMOTE_WRITE,
            )
            .is_none())
    {
        failed.push(ACCESS);
    }
    outcomes(w, p, &failed, false, |mut w| {
        match place.expect("checked") {
            Place::Exposed(off) => w.region.write(off, &p.payload),
            _ => w.region.forget(0, conn.len as usize),
        }
        placed(w, p)
    })
}

/// IBA 1.5 RDMA FLUSH: the FETH's placement type names the rights it
/// needs (global visibility: IBV_ACCESS_FLUSH_GLOBAL, persistence:
/// IBV_ACCESS_FLUSH_PERSISTENT, both: both); a QP without them is sent an
/// invalid request; the R_Key must grant them, for the RETH's range or,
/// at selectivity level MR, the whole region, checked even for an empty
/// range (else a remote access error); executed, it changes no byte and
/// is answered as [`placed`]. A placement type with neither bit (a
/// reserved value) the spec does not define: refused as an invalid
/// request (uroce), or taken as needing no right, the key still checked
/// (as rxe's `check_rkey` reads; rxe 6.12 was seen to send no answer at
/// all, which the model reports).
fn flush(w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let (Some(feth), Some(reth)) = (p.feth, p.reth) else {
        return vec![w.open("a FLUSH without FETH or RETH")];
    };
    let mut need = 0;
    if feth.placement & uroce_wire::feth::FLUSH_GLOBAL != 0 {
        need |= access::FLUSH_GLOBAL;
    }
    if feth.placement & uroce_wire::feth::FLUSH_PERSISTENT != 0 {
        need |= access::FLUSH_PERSISTENT;
    }
    let whole = feth.selectivity == uroce_wire::feth::FLUSH_MR;
    let len = u64::from(reth.dma_len);
    let key = memory::flush_key_ok(conn, &w.keys, reth.rkey, reth.va, len, need, whole);
    let mut failed = Vec::new();
    if need == 0 {
        failed.push(Check {
            maybe: true,
            ..INVALID
        });
    } else {
        failed.extend(qp_allows(conn, need));
    }
    match key {
        Some(true) => {}
        Some(false) => failed.push(ACCESS),
        None => failed.push(Check {
            maybe: true,
            ..ACCESS
        }),
    }
    outcomes(w, p, &failed, false, |w| placed(w, p))
}
