//! # The reference model
//!
//! An executable model of the InfiniBand Architecture's responder rules
//! for RC, UC and UD (IBA vol. 1 ch. 9 and 10), written from the spec,
//! not from uroce's transport: given the packets of a case it predicts
//! the *set* of legal observable outcomes — the answers (ACK, NAK with
//! its class and PSN, RNR NAK, READ responses with their PSNs and bytes,
//! atomic ACKs with the original value), the receive completions (status,
//! opcode, length, immediate data, invalidated key, source QP), the QP's
//! state after the case and the exposed region's bytes — and
//! [`judge`] names the rule an observation outside the set breaks.
//!
//! Where the spec leaves a choice open the set holds every allowed
//! outcome: ACKs may be coalesced and repeated, independent answers come
//! in any order, a duplicate READ or atomic may be answered or dropped
//! (its record may have been recycled), a packet that does not parse may
//! be dropped or taken as an invalid request, of several failing checks
//! any one may be the one reported, a UC message cut short may give its
//! receive WR back or complete it in error. The model follows each
//! choice as a world of its own ([`World`]); an observation is legal when
//! one world explains all of it.
//!
//! What it leaves open (the verdict is [`Verdict::Open`], the other
//! oracles still judge): a SEND longer than the MTU on a target that does
//! not say how large its receive buffers are, and cases whose choices
//! make more than [`MAX_WORLDS`] worlds. The target's posts are judged
//! by the RC requester ([`requester`]) and the UC and UD one
//! ([`sender`]).
//!
//! The rules are a table ([`rules`]); the transports are one module each
//! ([`rc`], [`uc`], [`ud`]; the requesters [`requester`], [`sender`]), each a function per packet class citing the
//! section it follows. uroce's codec is used to parse header fields, and
//! nothing else of uroce.

pub mod answer;
pub mod memory;
pub mod rc;
pub mod requester;
pub mod rules;
pub mod sender;
pub mod uc;
pub mod ud;

#[cfg(test)]
mod tests;

use crate::case::{Case, Step};
use crate::target::{Conn, ExposedKey, Observation};
use answer::{Expect, Mismatch, Seen, Want};
use memory::Region;
use rules::Rule;
use uroce_provider::types::{QpState, QpType};
use uroce_wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, DethRepr, FethRepr, OpcodeInfo, RethRepr,
};

/// The most worlds the model follows at once.
pub const MAX_WORLDS: usize = 64;

/// `ibv_wc_status`: success.
pub const WC_SUCCESS: u32 = 0;
/// `ibv_wc_status`: WR flushed.
pub const WC_WR_FLUSH_ERR: u32 = 5;
/// `ibv_wc_opcode`: RECV.
pub const WC_RECV: u32 = 128;
/// `ibv_wc_opcode`: RECV_RDMA_WITH_IMM.
pub const WC_RECV_RDMA_WITH_IMM: u32 = 129;
/// Bytes of the GRH a UD receive buffer holds first (IBA 11.4.1.2).
pub const GRH_LEN: u32 = 40;

/// One packet of the case as the target parses it.
#[derive(Clone, Debug)]
pub struct Pkt {
    /// The opcode.
    pub info: &'static OpcodeInfo,
    /// Absolute PSN.
    pub psn: u32,
    /// AckReq.
    pub ack_req: bool,
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic: Option<AtomicEthRepr>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH.
    pub ieth: Option<u32>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack: Option<AtomicAckEthRepr>,
    /// FETH (RDMA FLUSH).
    pub feth: Option<FethRepr>,
    /// Payload.
    pub payload: Vec<u8>,
    /// The packet in a finding's words ("packet 3: RC_SEND_ONLY PSN +2").
    pub why: String,
}

/// What reaches the fuzzed QP.
#[derive(Clone, Debug)]
pub enum Input {
    /// A packet that parses.
    Pkt(Pkt),
    /// A packet that passes the checks that drop silently but does not
    /// parse (a bad pad, a payload on an opcode without one, an opcode
    /// the table lacks): its BTH PSN.
    Malformed {
        /// PSN.
        psn: u32,
        /// The packet in a finding's words.
        why: String,
    },
}

/// How a receive WR completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// This status.
    Is(u32),
    /// Some error (the spec names the class, not the status).
    AnyError,
}

/// A receive completion the model expects.
#[derive(Clone, Debug)]
pub struct Recv {
    /// The WR (WRs are posted with IDs 0, 1, ... and taken in order).
    pub wr_id: u64,
    /// Status.
    pub status: Status,
    /// Opcode, length, immediate, invalidated key, source QP (of a
    /// successful one).
    pub opcode: u32,
    /// Length.
    pub byte_len: u32,
    /// Immediate data.
    pub imm: Option<u32>,
    /// Invalidated R_Key.
    pub inv: Option<u32>,
    /// Source QP (UD).
    pub src_qp: Option<u32>,
    /// The message.
    pub why: String,
}

impl Recv {
    /// A successful receive of `byte_len` bytes.
    pub fn ok(wr_id: u64, opcode: u32, byte_len: u32, why: &str) -> Recv {
        Recv {
            wr_id,
            status: Status::Is(WC_SUCCESS),
            opcode,
            byte_len,
            imm: None,
            inv: None,
            src_qp: None,
            why: why.into(),
        }
    }

    /// A receive that completes in error.
    pub fn failed(wr_id: u64, status: Status, why: &str) -> Recv {
        Recv {
            status,
            ..Recv::ok(wr_id, 0, 0, why)
        }
    }
}

/// Transport state of a world.
#[derive(Clone, Debug)]
pub enum Transport {
    /// Reliable connection.
    Rc(rc::Rc),
    /// Unreliable connection.
    Uc(uc::Uc),
    /// Unreliable datagram: the datagrams delivered (source QP, PSN).
    Ud(Vec<(u32, u32)>),
}

/// One consistent history of the fuzzed QP: what it has done, and what
/// it must and may have answered.
#[derive(Clone, Debug)]
pub struct World {
    /// The exposed region.
    pub region: Region,
    /// The keys the target exposes (invalidations applied).
    pub keys: Vec<ExposedKey>,
    /// The next receive WR to take.
    pub next_recv: u64,
    /// Receive completions so far, in order.
    pub done: Vec<Recv>,
    /// The receive WR of a message in progress, or one that a failed
    /// request may have taken: it completes in error when the QP fails.
    pub in_progress: Option<u64>,
    /// The QP is in Error.
    pub err: bool,
    /// The answers' expectations.
    pub expects: Vec<Expect>,
    /// Why this world cannot be judged.
    pub open: Option<String>,
    /// The timer code its RNR NAKs carry (`Conn::min_rnr_timer`).
    pub min_rnr_timer: Option<u8>,
    /// The UC or UD requester (posts on those QPs).
    pub sender: sender::Sender,
    /// Transport state.
    pub t: Transport,
}

impl World {
    fn new(conn: &Conn) -> World {
        World {
            region: Region::new(conn.len as usize),
            keys: conn.keys.clone(),
            next_recv: 0,
            done: Vec::new(),
            in_progress: None,
            err: false,
            expects: Vec::new(),
            open: None,
            min_rnr_timer: conn.min_rnr_timer,
            sender: Default::default(),
            t: match conn.qp_type {
                QpType::Rc => Transport::Rc(rc::Rc::new(conn.rq_psn)),
                QpType::Uc => Transport::Uc(uc::Uc::new(conn.rq_psn)),
                QpType::Ud => Transport::Ud(Vec::new()),
            },
        }
    }

    /// Takes the next receive WR, if one is left.
    pub fn take_recv(&mut self, conn: &Conn) -> Option<u64> {
        (self.next_recv < u64::from(conn.recvs_posted)).then(|| {
            self.next_recv += 1;
            self.next_recv - 1
        })
    }

    /// Expects (or allows) an answer.
    pub fn expect(&mut self, want: Want, required: bool, rule: &'static Rule, why: &str) {
        self.expects.push(Expect {
            want,
            required,
            rule,
            why: why.into(),
        });
    }

    /// The QP enters Error: it sends nothing more, so answers it had yet
    /// to send (READ responses, ACKs held behind them) may never go out.
    pub fn enter_error(&mut self) {
        self.err = true;
        // The receive WR of a SEND in progress completes in error
        // (IBA 10.3.1), whatever moved the QP to Error.
        let cur = match &self.t {
            Transport::Rc(r) => r.cur.as_ref(),
            Transport::Uc(u) => u.cur.as_ref(),
            Transport::Ud(_) => None,
        };
        if let (None, Some(rc::Msg::Send { wr, .. })) = (self.in_progress, cur) {
            self.in_progress = Some(*wr);
        }
        for e in &mut self.expects {
            e.required = false;
        }
    }

    /// This world cannot be judged.
    pub fn open(mut self, why: impl Into<String>) -> World {
        self.open.get_or_insert(why.into());
        self
    }

    /// The receive completions this world ends with: those done, then,
    /// in Error, the one in progress in some error and the rest flushed
    /// (IBA 10.3.1).
    fn receives(&self, conn: &Conn) -> Vec<Recv> {
        let mut v = self.done.clone();
        if self.err {
            let mut next = self.next_recv;
            if let Some(wr) = self
                .in_progress
                .filter(|&wr| wr < u64::from(conn.recvs_posted))
            {
                v.push(Recv::failed(
                    wr,
                    Status::AnyError,
                    "the message in progress",
                ));
                next = next.max(wr + 1);
            }
            for wr in next..u64::from(conn.recvs_posted) {
                v.push(Recv::failed(wr, Status::Is(WC_WR_FLUSH_ERR), "flushed"));
            }
        }
        v
    }
}

/// The model's verdict on one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The observation is one the model allows.
    Legal,
    /// It is not: what the closest world allowed, rule by rule.
    Illegal(Vec<Mismatch>),
    /// The model does not judge this case (why).
    Open(String),
}

/// The packets of `case` as they reach the fuzzed QP, in order with the
/// posts (Err: a post).
fn inputs<'a>(conn: &Conn, case: &'a Case) -> Vec<Result<Input, &'a crate::case::Post>> {
    let mut out = Vec::new();
    let mut i = 0;
    for s in &case.steps {
        match s {
            Step::Post(w) => out.push(Err(w)),
            Step::Wait(_) => {}
            Step::Packet(p) => {
                i += 1;
                // IBA 9.6.1: a packet that fails the header or ICRC checks
                // is dropped without a trace (the existing oracles judge
                // that); the model never sees it.
                if p.silently_dropped(conn) {
                    continue;
                }
                let Some(bytes) = p.emit(conn) else { continue };
                let psn = p.psn(conn).value();
                let off = answer::psn_diff(psn, conn.rq_psn) as i32;
                let off = if off >= 1 << 23 { off - (1 << 24) } else { off };
                match uroce_wire::packet::parse(&bytes) {
                    Ok(k) => out.push(Ok(Input::Pkt(Pkt {
                        info: k.info,
                        psn,
                        ack_req: k.bth.ack_req,
                        reth: k.reth(),
                        atomic: k.atomic_eth(),
                        imm: k.imm(),
                        ieth: k.ieth(),
                        deth: k.deth(),
                        aeth: k.aeth(),
                        atomic_ack: k.atomic_ack(),
                        feth: k.feth(),
                        payload: k.payload.to_vec(),
                        why: format!("packet {i}: {} PSN {off:+}", k.info.name),
                    }))),
                    Err(e) => out.push(Ok(Input::Malformed {
                        psn,
                        why: malformed_why(i, &bytes, off, &e),
                    })),
                }
            }
        }
    }
    out
}

/// A packet that does not parse in a finding's words; `bytes` may be
/// empty (a packet cut to nothing, which a build that does not verify
/// ICRCs takes).
fn malformed_why(i: usize, bytes: &[u8], off: i32, e: &dyn std::fmt::Display) -> String {
    match bytes.first() {
        Some(op) => format!("packet {i}: opcode {op:#04x} PSN {off:+} ({e})"),
        None => format!("packet {i}: no bytes, PSN {off:+} ({e})"),
    }
}

/// Runs the model over `case` on `conn`: the worlds it ends in.
///
/// A post is the target's own act, a packet the fuzzer's: packets sent
/// before a post may still be on their way, or not yet taken, when the
/// target posts (on the sim target those since the last wait always
/// are), so the case's posts may take effect before them. The worlds of
/// each order are legal: the posts between two waits before the packets
/// between them, the requests behind a READ's responses after the
/// responses and posts that follow them (`held_behind_read`), and the
/// first post that fails locally (it moves the QP to Error) before any
/// number of the packets sent before it.
pub fn run(conn: &Conn, case: &Case) -> Result<Vec<World>, String> {
    let mut orders = vec![case.clone()];
    orders.extend(posts_first(case));
    for c in orders.clone() {
        for any_wait in [true, false] {
            if let Some(h) = held_behind_read(conn, &c, any_wait) {
                if !orders.contains(&h) {
                    orders.push(h);
                }
            }
        }
    }
    orders.extend(local_error_earlier(conn, case));
    let mut worlds = Vec::new();
    for c in &orders {
        worlds.extend(run_in_order(conn, c)?);
    }
    Ok(worlds)
}

/// `case` with the requests that follow an RDMA READ request (up to the
/// next wait: of any time when `any_wait`, else of some time) moved after
/// the responses and posts that follow them, if that moves any.
///
/// An RC responder answers in the order of the requests (IBA 9.5,
/// transaction ordering; a READ's responses take consecutive PSNs from
/// the request's, 9.7.5.1), and a QP in Error sends nothing (IBA
/// 10.3.1): the answer to a request behind a READ — an ACK, or the NAK
/// of a check it fails (IBA 9.9, responder error classes: NAK, then the
/// QP to Error) — can go out only after the READ's responses, and the
/// QP's move to Error waits for them too. A responder may therefore take
/// the requests behind a READ only once its responses are out (uroce's
/// does: it holds them). Its QP's requester is independent of it (IBA
/// 9.7.4 and 9.7.5 are separate state machines): meanwhile it handles
/// the responses the peer sends and the application's posts. Those,
/// arriving after the held requests, may take effect before them — a
/// post goes out and is acknowledged before a request ahead of it fails
/// and moves the QP to Error; or a NAK moves the QP to Error before the
/// held requests are executed (a QP in Error executes none). The
/// responses are out at the latest at the next wait of some time (the
/// convention of [`posts_first`]); on the sim target a wait of no time
/// sends them too.
fn held_behind_read(conn: &Conn, case: &Case, any_wait: bool) -> Option<Case> {
    if conn.qp_type != QpType::Rc {
        return None;
    }
    let info =
        |p: &crate::case::PacketSpec| uroce_wire::Opcode(p.raw_opcode.unwrap_or(p.opcode)).info();
    let mut steps = Vec::with_capacity(case.steps.len());
    let mut held = Vec::new();
    let mut reading = false;
    for s in &case.steps {
        match s {
            Step::Wait(t) if any_wait || *t > 0 => {
                steps.append(&mut held);
                reading = false;
                steps.push(s.clone());
            }
            // The requests after the READ (anything that is not a
            // response: what the responder may hold).
            Step::Packet(p) if reading && info(p).is_none_or(|i| i.is_request) => {
                held.push(s.clone())
            }
            Step::Packet(p) => {
                reading |= !p.silently_dropped(conn)
                    && info(p)
                        .is_some_and(|i| i.operation == uroce_wire::Operation::RdmaReadRequest);
                steps.push(s.clone());
            }
            Step::Post(_) | Step::Wait(_) => steps.push(s.clone()),
        }
    }
    steps.append(&mut held);
    (steps != case.steps).then_some(Case { steps })
}

/// `case` with its first post that fails locally moved before each of
/// the packets before it in turn.
fn local_error_earlier(conn: &Conn, case: &Case) -> Vec<Case> {
    let bad = case
        .steps
        .iter()
        .position(|s| matches!(s, Step::Post(p) if requester::sends_nothing(p, conn.len)));
    let Some(j) = bad else {
        return Vec::new();
    };
    (0..j)
        .filter(|&k| matches!(case.steps[k], Step::Packet(_)))
        .map(|k| {
            let mut steps = case.steps.clone();
            let post = steps.remove(j);
            steps.insert(k, post);
            Case { steps }
        })
        .collect()
}

/// `case` with the posts between two waits (of some time) moved before
/// the packets between them (in their order), if that moves any.
fn posts_first(case: &Case) -> Option<Case> {
    let mut steps = Vec::with_capacity(case.steps.len());
    let mut packets = Vec::new();
    for s in &case.steps {
        match s {
            Step::Packet(_) => packets.push(s.clone()),
            Step::Post(_) => steps.push(s.clone()),
            // A wait of no time lets nothing arrive.
            Step::Wait(0) => packets.push(s.clone()),
            Step::Wait(_) => {
                steps.append(&mut packets);
                steps.push(s.clone());
            }
        }
    }
    steps.append(&mut packets);
    (steps != case.steps).then_some(Case { steps })
}

/// [`run`] with the steps taking effect in the case's order.
fn run_in_order(conn: &Conn, case: &Case) -> Result<Vec<World>, String> {
    let mut worlds = vec![World::new(conn)];
    for input in inputs(conn, case) {
        let input = match input {
            Ok(i) => i,
            Err(post) => {
                let mut next = Vec::new();
                for w in worlds {
                    if matches!(w.t, Transport::Rc(_)) {
                        next.extend(requester::post(w, post, conn));
                    } else {
                        next.extend(sender::post(w, post, conn));
                    }
                }
                if let Some(why) = next.iter().find_map(|w| w.open.clone()) {
                    return Err(why);
                }
                if next.len() > MAX_WORLDS {
                    return Err(format!("more than {MAX_WORLDS} worlds"));
                }
                worlds = next;
                continue;
            }
        };
        let mut next = Vec::new();
        for w in worlds {
            next.extend(match &w.t {
                Transport::Rc(_) => rc::step(w, conn, &input),
                Transport::Uc(_) => uc::step(w, conn, &input),
                Transport::Ud(_) => ud::step(w, conn, &input),
            });
        }
        if let Some(why) = next.iter().find_map(|w| w.open.clone()) {
            return Err(why);
        }
        if next.len() > MAX_WORLDS {
            return Err(format!("more than {MAX_WORLDS} worlds"));
        }
        worlds = next;
    }
    // Requests still unanswered fail once their retries run out.
    let worlds = worlds
        .into_iter()
        .map(|mut w| {
            if matches!(w.t, Transport::Rc(_)) && !w.err && requester::busy(&mut w) {
                requester::give_up(w)
            } else {
                w
            }
        })
        .collect();
    Ok(worlds)
}

/// The mismatches between `obs` and world `w`.
fn compare(conn: &Conn, w: &World, obs: &Observation) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let ud = matches!(w.t, Transport::Ud(_));
    // The QP state (IBA 10.3.1).
    let state = match (w.err, w.sender.sqe) {
        (true, _) => QpState::Err,
        (_, true) => QpState::Sqe,
        _ => QpState::Rts,
    };
    if obs.qp_state != state {
        out.push(Mismatch {
            rule: rules::QP_STATE.id,
            allowed: format!("{state:?}"),
            observed: format!("{:?}", obs.qp_state),
        });
    }
    // The region's bytes.
    if !obs.exposed.is_empty() {
        let bad = w
            .region
            .0
            .iter()
            .zip(&obs.exposed)
            .position(|(m, b)| m.is_some_and(|m| m != *b));
        if let Some(i) = bad {
            out.push(Mismatch {
                rule: rules::EXECUTE_ONCE.id,
                allowed: format!("exposed byte {i} = {:#04x}", w.region.0[i].unwrap_or(0)),
                observed: format!("{:#04x}", obs.exposed[i]),
            });
        }
    }
    // The receive completions, in order.
    let want = w.receives(conn);
    let got: Vec<&crate::target::Completion> = obs.completions.iter().filter(|c| c.recv).collect();
    let rule_of = |r: &Recv| match (ud, r.status) {
        (true, _) => rules::UD.id,
        (_, Status::Is(WC_WR_FLUSH_ERR)) => rules::FLUSH.id,
        _ => rules::RECEIVE.id,
    };
    if let Some((r, c)) = first_misfit(&want, &got, |r, c| recv_fits(r, c)) {
        out.push(Mismatch {
            rule: r.map_or(if ud { rules::UD.id } else { rules::RECEIVE.id }, rule_of),
            allowed: r.map_or("no further receive completion".into(), |r| {
                format!(
                    "receive completion {} {:?} (for {})",
                    r.wr_id, r.status, r.why
                )
            }),
            observed: c.map_or("none".into(), |c| format!("{c:?}")),
        });
    }
    // The send completions, in posting order (IBA 10.8).
    let want = requester::completions(w);
    let got: Vec<&crate::target::Completion> = obs.completions.iter().filter(|c| !c.recv).collect();
    let detail = |want: Option<u32>, got: Option<u32>| want.is_none() || got == want;
    let fits = |s: &requester::SendDone, c: &&crate::target::Completion| {
        s.wr_id == c.wr_id
            && (s.status.contains(&c.status) || (s.status.is_empty() && c.status != 0))
            && (c.status != WC_SUCCESS
                || c.opcode.is_none()
                || (detail(s.opcode, c.opcode) && detail(s.byte_len, c.byte_len)))
    };
    if let Some((s, c)) = first_misfit(&want, &got, fits) {
        let rule = match w.t {
            Transport::Rc(_) => rules::REQUESTER,
            Transport::Uc(_) => rules::UC,
            Transport::Ud(_) => rules::UD,
        };
        out.push(Mismatch {
            rule: rule.id,
            allowed: s.map_or("no further send completion".into(), |s| {
                format!(
                    "send completion {:#x} status {:?} (empty: any error), opcode {:?}, length {:?}",
                    s.wr_id, s.status, s.opcode, s.byte_len
                )
            }),
            observed: c.map_or("none".into(), |c| format!("{c:?}")),
        });
    }
    if let Some(ans) = &obs.answers {
        if !matches!(w.t, Transport::Rc(_)) {
            // What the UC or UD requester sent for the posts.
            out.extend(sender::judge(conn, w, ans));
        }
        let seen: Vec<Seen> = ans.iter().filter_map(|b| Seen::parse(b)).collect();
        let end = match &w.t {
            Transport::Rc(r) => r.epsn,
            _ => 0,
        };
        out.extend(answer::judge(&w.expects, &seen, end));
    }
    out
}

/// Where `want` and `got`, taken in step, first part: a pair `fits`
/// refuses, or an entry of the longer list past the other's end; None
/// when they agree throughout.
fn first_misfit<'a, A, B>(
    want: &'a [A],
    got: &'a [B],
    fits: impl Fn(&A, &B) -> bool,
) -> Option<(Option<&'a A>, Option<&'a B>)> {
    (0..want.len().max(got.len()))
        .map(|i| (want.get(i), got.get(i)))
        .find(|pair| !matches!(pair, (Some(a), Some(b)) if fits(a, b)))
}

fn recv_fits(r: &Recv, c: &crate::target::Completion) -> bool {
    let status = match r.status {
        Status::Is(s) => c.status == s,
        Status::AnyError => c.status != WC_SUCCESS,
    };
    let detail = |want: Option<u32>, got: Option<u32>| got.is_none() || got == want;
    status
        && c.wr_id == r.wr_id
        && (r.status != Status::Is(WC_SUCCESS)
            || (detail(Some(r.opcode), c.opcode)
                && detail(Some(r.byte_len), c.byte_len)
                && (c.opcode.is_none() || c.imm == r.imm)
                && (c.opcode.is_none() || c.invalidated_rkey == r.inv)
                && (r.src_qp.is_none() || detail(r.src_qp, c.src_qp))))
}

/// Judges `obs` after `case` on `conn`.
pub fn judge(conn: &Conn, case: &Case, obs: &Observation) -> Verdict {
    if !obs.alive {
        return Verdict::Open("the target is dead".into());
    }
    let worlds = match run(conn, case) {
        Ok(w) => w,
        Err(why) => return Verdict::Open(why),
    };
    let mut best: Option<Vec<Mismatch>> = None;
    for w in &worlds {
        let m = compare(conn, w, obs);
        if m.is_empty() {
            return Verdict::Legal;
        }
        if best.as_ref().is_none_or(|b| m.len() < b.len()) {
            best = Some(m);
        }
    }
    Verdict::Illegal(best.unwrap_or_default())
}
