//! The RC requester (IBA 9.7.4 requester side, 9.7.5.x response
//! handling as the requester sees it): the target's posts take PSNs in
//! order from its send PSN; the fuzzer's answers complete them.
//!
//! * an ACK at PSN q acknowledges every request up to q (coalesced
//!   ACKs); a READ or atomic it passes without its response is retried
//!   (implied NAK), and nothing after it completes first (completions
//!   come in posting order, IBA 10.8);
//! * a PSN sequence error or RNR NAK at q acknowledges what is before q
//!   and has the rest retried;
//! * a NAK invalid request / remote access / remote operational at q
//!   acknowledges what is before q, fails the request holding q with the
//!   matching status, and moves the QP to Error (the rest flushed);
//! * READ responses are taken in PSN order, each at its offset, the
//!   LAST completes the READ; an atomic ACK at the atomic's PSN completes
//!   it with the original value in its local buffer;
//! * an answer for a PSN never sent, or one already answered (a ghost or
//!   a duplicate) is dropped.
//!
//! * a post whose local buffer the target's memory does not hold (past
//!   the exposed region, or longer than a message may be) sends nothing
//!   and fails with a local error (length or protection, IBA 10.8.3.1
//!   / 11.6.2 local errors) once the requests before it are done, the
//!   QP going to Error (IBA 10.3.1); until then the requester may send
//!   the posts after it or stop at it ([`post`]); but a READ or atomic
//!   whose buffer only receives its response is sent like any other (as
//!   rxe and NICs send it: the L_Key is checked where the response is
//!   placed), and the response, when it comes, fails it with a local
//!   error instead of being placed ([`Requester::misplaced`]);
//!
//! Open choices: the requester may give up at any point (its retries
//! run out while the case still answers: the request then fails with
//! transport retry or RNR retry exceeded, the QP goes to Error); an
//! answer the model does not read (a reserved syndrome, a READ response
//! of the wrong length, a response opcode out of place) may be dropped
//! or fail the request as a bad response. Requests left unanswered at
//! the end fail so.

use super::answer::{psn_add, psn_diff};
use super::{Input, World};
use crate::case::{Post, PostOp};
use crate::target::Conn;
use uroce_wire::{AethSyndrome, Operation, Position};

/// `ibv_wc_status` numbers a requester completes with.
pub mod status {
    /// Remote invalid request.
    pub const REM_INV_REQ: u32 = 9;
    /// Remote access error.
    pub const REM_ACCESS: u32 = 10;
    /// Remote operational error.
    pub const REM_OP: u32 = 11;
    /// Transport retry counter exceeded.
    pub const RETRY_EXC: u32 = 12;
    /// RNR retry counter exceeded.
    pub const RNR_RETRY_EXC: u32 = 13;
}

/// A send completion the model expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendDone {
    /// The WR.
    pub wr_id: u64,
    /// Allowed statuses (empty: any error).
    pub status: Vec<u32>,
    /// Of a successful one: its `ibv_wc_opcode` (None: not judged).
    pub opcode: Option<u32>,
    /// Of a successful one: its length (None: not judged).
    pub byte_len: Option<u32>,
}

/// The requester's state.
#[derive(Clone, Debug, Default)]
pub struct Requester {
    /// The posts with the PSN each starts at.
    pub posts: Vec<(Post, u32)>,
    /// Whether each post fails locally (it takes no PSNs).
    pub bad: Vec<bool>,
    /// Whether each post is a READ or atomic whose local buffer the
    /// region does not hold: sent, and failed by its response.
    pub misplaced: Vec<bool>,
    /// The first post not completed.
    pub next: usize,
    /// READ responses taken for it, by index.
    pub read_got: Vec<bool>,
    /// Send completions so far.
    pub done: Vec<SendDone>,
    /// The requester stopped at this post, which fails locally: it
    /// sends none of the posts after it.
    pub stop: Option<usize>,
}

impl Requester {
    /// PSNs sent so far, from the send PSN at set-up.
    fn sent(&self, mtu: u32) -> u32 {
        self.posts
            .iter()
            .zip(&self.bad)
            .filter(|(_, &bad)| !bad)
            .fold(0, |n, ((w, _), _)| n.wrapping_add(w.span(mtu)))
    }

    /// Post `w` (signaled) on a target whose exposed region is
    /// `region_len` bytes long.
    pub fn post(&mut self, w: &Post, sq_psn: u32, mtu: u32, region_len: u32) {
        let start = psn_add(sq_psn, self.sent(mtu));
        self.posts.push((w.clone(), start));
        let local = fails_locally(w, region_len);
        let misplaced = local && !sends_nothing(w, region_len);
        self.bad.push(local && !misplaced);
        self.misplaced.push(misplaced);
    }

    fn last_psn(&self, i: usize, mtu: u32) -> u32 {
        let (w, s) = &self.posts[i];
        psn_add(*s, w.span(mtu) - 1)
    }

    /// Whether `psn` is one of the outstanding requests' (from the first
    /// not completed to the last sent).
    fn outstanding(&self, psn: u32, mtu: u32) -> Option<usize> {
        let end = self.stop.unwrap_or(self.posts.len());
        (self.next..end).find(|&i| {
            let (w, s) = &self.posts[i];
            !self.bad[i] && psn_diff(psn, *s) < w.span(mtu)
        })
    }
}

/// Whether post `w` fails locally on a target whose exposed region (its
/// local buffers' memory region) is `region_len` bytes long: its
/// scatter/gather element reaches past the region (the L_Key check), or
/// the message is longer than 2^31 bytes (IBA 9.4).
pub fn fails_locally(w: &Post, region_len: u32) -> bool {
    let len = match w.op {
        PostOp::CompareSwap | PostOp::FetchAdd => 8,
        _ => u64::from(w.len),
    };
    (len > 0 && u64::from(w.local_off) + len > u64::from(region_len)) || len > 1 << 31
}

/// Whether post `w`, which [`fails_locally`], sends nothing: all but a
/// READ or atomic of a length a message may have, whose buffer only
/// receives the response (sent as rxe and NICs send it, failed where the
/// response is placed).
pub fn sends_nothing(w: &Post, region_len: u32) -> bool {
    let response = match w.op {
        PostOp::CompareSwap | PostOp::FetchAdd => true,
        PostOp::Read => u64::from(w.len) <= 1 << 31,
        PostOp::Send | PostOp::Write => false,
    };
    fails_locally(w, region_len) && !response
}

/// `ibv_wc_status`: the local errors a post that [`fails_locally`]
/// completes with (local length error, local protection error).
pub const LOCAL_ERRORS: [u32; 2] = [1, 4];

/// Has `w`'s target post `post`; a post that fails locally and is the
/// first not completed fails at once.
///
/// One that fails locally behind requests still outstanding fails once
/// they are done (completions in posting order, IBA 10.8); the posts
/// after it complete flushed when it moves the QP to Error (IBA
/// 10.3.1). Whether the requester meanwhile sends the posts after it
/// (it may find the error only as it executes the WR, as for a READ's
/// local buffer when its responses come) or stops at it (the WRs are
/// begun in posting order, IBA 10.8) the spec leaves open: both worlds.
pub fn post(mut w: World, post: &Post, conn: &Conn) -> Vec<World> {
    let r = req(&mut w);
    r.post(post, conn.sq_psn, conn.mtu, conn.len);
    settle(&mut w);
    let err = w.err;
    let r = req(&mut w);
    let i = r.posts.len() - 1;
    if err || !r.bad[i] || r.next >= r.posts.len() || r.stop.is_some() {
        return vec![w];
    }
    let mut stops = w.clone();
    req(&mut stops).stop = Some(i);
    vec![w, stops]
}

/// A post that fails locally fails when the requests before it are
/// done.
fn settle(w: &mut World) {
    let r = req(w);
    if r.next < r.posts.len() && r.bad[r.next] && !w.err {
        *w = fail(w.clone(), LOCAL_ERRORS.to_vec());
    }
}

fn complete(w: &mut World, i: usize, status: Vec<u32>) {
    let r = req(w);
    let post = &r.posts[i].0;
    let ok = status == [super::WC_SUCCESS];
    let (opcode, byte_len) = super::sender::wc_of(post);
    let done = SendDone {
        wr_id: post.wr_id,
        status,
        opcode: ok.then_some(opcode),
        byte_len: ok.then_some(byte_len),
    };
    r.done.push(done);
    r.next = i + 1;
    r.read_got.clear();
}

fn req(w: &mut World) -> &mut Requester {
    match &mut w.t {
        super::Transport::Rc(r) => &mut r.req,
        _ => unreachable!("an RC world"),
    }
}

/// Completes the SENDs and WRITEs before `psn` (before index `upto`), up
/// to the first READ or atomic not answered.
fn ack_before(w: &mut World, upto: usize) {
    while req(w).next < upto {
        let i = req(w).next;
        if req(w).bad[i] {
            return;
        }
        match req(w).posts[i].0.op {
            PostOp::Send | PostOp::Write => complete(w, i, vec![super::WC_SUCCESS]),
            _ => return,
        }
    }
}

/// Fails the first request not completed with one of `status` (empty:
/// any error), its local buffer left undefined, and moves the QP to
/// Error (the rest are flushed at the end).
pub fn fail(mut w: World, status: Vec<u32>) -> World {
    let r = req(&mut w);
    if r.next >= r.posts.len() {
        return w;
    }
    let i = r.next;
    let post = r.posts[i].0.clone();
    if let Some((off, len)) = post.local_write() {
        w.region.forget(off as usize, len as usize);
    }
    complete(&mut w, i, status);
    w.enter_error();
    w
}

/// The requester gives up on the first request not completed.
pub fn give_up(w: World) -> World {
    fail(w, vec![status::RETRY_EXC, status::RNR_RETRY_EXC])
}

/// Whether a request is still outstanding.
pub fn busy(w: &mut World) -> bool {
    let r = req(w);
    r.next < r.posts.len()
}

/// The send completions this world ends with: those done, the rest
/// flushed when the QP is in Error.
pub fn completions(w: &World) -> Vec<SendDone> {
    let super::Transport::Rc(rc) = &w.t else {
        // UC and UD: each post completed when it was made.
        return w.sender.done.clone();
    };
    let r = &rc.req;
    let mut v = r.done.clone();
    if w.err {
        for (p, _) in &r.posts[r.next.min(r.posts.len())..] {
            v.push(SendDone {
                wr_id: p.wr_id,
                status: vec![super::WC_WR_FLUSH_ERR],
                opcode: None,
                byte_len: None,
            });
        }
    }
    v
}

/// A response packet for the requester.
pub fn response(w: World, conn: &Conn, input: &Input) -> Vec<World> {
    let mut out = answered(w, conn, input);
    for w in &mut out {
        settle(w);
    }
    out
}

fn answered(mut w: World, conn: &Conn, input: &Input) -> Vec<World> {
    let mtu = conn.mtu;
    let Input::Pkt(p) = input else {
        return unreadable(w, 0);
    };
    let Some(i) = req(&mut w).outstanding(p.psn, mtu) else {
        // A ghost or a duplicate: dropped.
        return vec![w];
    };
    let (post, start) = req(&mut w).posts[i].clone();
    // A PSN of the READ in progress whose responses up to it are all in
    // is answered already: anything for it is a duplicate.
    let r = req(&mut w);
    let k = psn_diff(p.psn, start) as usize;
    if i == r.next
        && post.op == PostOp::Read
        && r.read_got.get(..=k).is_some_and(|g| g.iter().all(|&g| g))
    {
        return vec![w];
    }
    match (p.info.operation, p.aeth.map(|a| a.syndrome)) {
        (Operation::Acknowledge, Some(AethSyndrome::Ack { .. })) => {
            // Everything up to q; a READ or atomic at q or before is
            // retried, and so is everything after it.
            let own = psn_diff(p.psn, req(&mut w).last_psn(i, mtu)) == 0;
            let upto = if own { i + 1 } else { i };
            ack_before(&mut w, upto);
            vec![w]
        }
        (Operation::Acknowledge, Some(AethSyndrome::RnrNak { .. })) => {
            ack_before(&mut w, i);
            vec![w]
        }
        (Operation::Acknowledge, Some(AethSyndrome::Nak(code))) => {
            ack_before(&mut w, i);
            let status = match code.code() {
                0 => return vec![w],
                1 => vec![status::REM_INV_REQ],
                2 => vec![status::REM_ACCESS],
                3 => vec![status::REM_OP],
                _ => Vec::new(),
            };
            // A READ before it, or the READ it falls inside (past the
            // READ's own PSN), is unanswered: retried first, or failed by
            // the NAK; a code RC does not use (invalid RD request,
            // reserved): ignored, or a failure.
            let inside = psn_diff(p.psn, start) > 0 && post.op == PostOp::Read;
            if req(&mut w).next < i || inside || status.is_empty() {
                return vec![w.clone(), fail(w, Vec::new())];
            }
            vec![fail(w, status)]
        }
        (Operation::RdmaReadResponse, _) if post.op == PostOp::Read => {
            ack_before(&mut w, i);
            if req(&mut w).next < i {
                // A READ before it unanswered: dropped.
                return vec![w];
            }
            let n = post.span(mtu);
            let k = psn_diff(p.psn, start);
            let r = req(&mut w);
            r.read_got.resize(n as usize, false);
            let first_missing = r.read_got.iter().position(|&g| !g).unwrap_or(n as usize) as u32;
            if r.read_got[k as usize] {
                // A duplicate.
                return vec![w];
            }
            // Its opcode fits its place in a stream of FIRST, MIDDLE...,
            // LAST or ONLY: the READ's first response opens the stream; a
            // later one may open the stream of a re-request (the
            // requester asking again for the rest) or continue one; only
            // the last ends it.
            let fits = match (k, p.info.position) {
                (0, pos) => {
                    pos == if n == 1 {
                        Position::Only
                    } else {
                        Position::First
                    }
                }
                (k, Position::First | Position::Middle) => k + 1 < n,
                (k, Position::Last | Position::Only) => k + 1 == n,
            };
            let want_len = (post.len - k * mtu).min(mtu) as usize;
            if !fits || p.payload.len() != want_len {
                return unreadable(w, i);
            }
            if req(&mut w).misplaced[i] {
                // No buffer to place it in: in order, a local error;
                // ahead of a hole, discarded.
                if k != first_missing {
                    return vec![w];
                }
                return vec![fail(w, LOCAL_ERRORS.to_vec())];
            }
            let mut out = Vec::new();
            if k != first_missing {
                // Ahead of a hole: discarded (the READ asked again), or
                // placed at its offset to wait for the hole (the spec
                // requires the completion to wait, not the discard).
                out.push(w.clone());
            }
            let at = (post.local_off + k * mtu) as usize;
            w.region.write(at, &p.payload);
            let r = req(&mut w);
            r.read_got[k as usize] = true;
            if r.read_got.iter().all(|&g| g) {
                complete(&mut w, i, vec![super::WC_SUCCESS]);
            }
            out.push(w);
            out
        }
        (Operation::AtomicAcknowledge, _)
            if matches!(post.op, PostOp::CompareSwap | PostOp::FetchAdd) =>
        {
            ack_before(&mut w, i);
            if req(&mut w).next < i {
                return vec![w];
            }
            if req(&mut w).misplaced[i] {
                return vec![fail(w, LOCAL_ERRORS.to_vec())];
            }
            let orig = p.atomic_ack.map_or(0, |a| a.orig);
            w.region.write(post.local_off as usize, &orig.to_le_bytes());
            complete(&mut w, i, vec![super::WC_SUCCESS]);
            vec![w]
        }
        _ => unreadable(w, i),
    }
}

/// A response the model does not read, at a PSN of request `i`:
/// dropped, or the first request not completed fails as a bad response;
/// either after taking it as the acknowledgement of the SENDs and WRITEs
/// before `i` (its PSN says the responder got them) or not.
fn unreadable(w: World, i: usize) -> Vec<World> {
    let mut acked = w.clone();
    ack_before(&mut acked, i);
    let mut out = Vec::new();
    for mut v in [w, acked] {
        out.push(v.clone());
        if busy(&mut v) {
            out.push(fail(v, Vec::new()));
        }
    }
    out
}
