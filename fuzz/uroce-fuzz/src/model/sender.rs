//! The UC and UD requesters (IBA 9.8, 10.8): the target's posts on a UC
//! or UD QP go out without answers and complete once sent.
//!
//! * a UC SEND or RDMA WRITE of n bytes goes out as one packet per MTU
//!   (FIRST, MIDDLE..., LAST, or ONLY; an empty message is one empty
//!   ONLY) at consecutive PSNs from the QP's send PSN, the WRITE's first
//!   packet with a RETH naming the post's remote address, R_Key and
//!   length; a UD SEND as one SEND ONLY datagram with a DETH naming the
//!   QP as its source, one PSN each; each packet carries its part of the
//!   local buffer;
//! * each completes, in posting order, successfully with its opcode
//!   (IBV_WC_SEND, IBV_WC_RDMA_WRITE) and its length (what kernel rxe and
//!   uroce report; the verbs define `byte_len` of a send completion only
//!   for READs and atomics);
//! * a post the transport has no operation for (a READ or an atomic on
//!   UC; anything but SEND on UD) is refused at posting (no completion,
//!   as rdma-core providers do) or completes with a local QP operation
//!   error; a post whose local buffer the target does not hold completes
//!   with a local length or protection error; either error moves the QP
//!   to the send queue error state SQE (IBA 10.3.1: UC and UD, not
//!   Error), which flushes the posts after it and leaves the receive
//!   side running;
//! * a UD datagram longer than the path MTU (a UD QP's limit is its
//!   port's MTU, which the target does not tell) may go out, be refused
//!   at posting or complete with a local length error;
//! * in SQE or Error, a post is flushed and sends nothing.
//!
//! Bytes of the local buffer that the case's packets change after the
//! post are left open (the transport may read them before or after).

use super::answer::psn_add;
use super::requester::{SendDone, LOCAL_ERRORS};
use super::{Transport, World, WC_SUCCESS, WC_WR_FLUSH_ERR};
use crate::case::{Post, PostOp};
use crate::target::Conn;
use uroce_wire::{Opcode, Operation};

/// `ibv_wc_status`: local QP operation error.
pub const WC_LOC_QP_OP_ERR: u32 = 2;
/// `ibv_wc_status`: local length error.
pub const WC_LOC_LEN_ERR: u32 = 1;

/// A request packet the model expects the target to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantReq {
    /// Opcode.
    pub opcode: Opcode,
    /// PSN.
    pub psn: u32,
    /// RETH: remote address, R_Key, DMA length.
    pub reth: Option<(u64, u32, u32)>,
    /// Payload (None: any value).
    pub payload: Vec<Option<u8>>,
    /// The post it belongs to (WR ID).
    pub wr_id: u64,
}

/// The UC or UD requester's state.
#[derive(Clone, Debug, Default)]
pub struct Sender {
    /// PSNs sent so far.
    pub sent_psns: u32,
    /// Send completions so far.
    pub done: Vec<SendDone>,
    /// The packets sent so far.
    pub packets: Vec<WantReq>,
    /// The QP is in SQE.
    pub sqe: bool,
    /// Per packet of `packets`: the exposed region's bytes it was read
    /// from (offset), to leave open those changed later.
    pub from: Vec<Option<usize>>,
}

/// `ibv_wc_opcode` of a successful send completion of `op`, and its
/// length.
pub fn wc_of(post: &Post) -> (u32, u32) {
    match post.op {
        PostOp::Send => (0, post.len),
        PostOp::Write => (1, post.len),
        PostOp::Read => (2, post.len),
        PostOp::CompareSwap => (3, 8),
        PostOp::FetchAdd => (4, 8),
    }
}

fn sender(w: &mut World) -> &mut Sender {
    &mut w.sender
}

fn complete(w: &mut World, post: &Post, status: Vec<u32>) {
    let ok = status == [WC_SUCCESS];
    let (opcode, byte_len) = wc_of(post);
    sender(w).done.push(SendDone {
        wr_id: post.wr_id,
        status,
        opcode: ok.then_some(opcode),
        byte_len: ok.then_some(byte_len),
    });
}

/// A local error: the post completes with one of `status`, the QP goes to
/// SQE (unless in Error).
fn local_error(mut w: World, post: &Post, status: Vec<u32>) -> World {
    complete(&mut w, post, status);
    if !w.err {
        sender(&mut w).sqe = true;
    }
    w
}

/// Has `w`'s target post `post` on its UC or UD QP: the worlds after.
pub fn post(mut w: World, post: &Post, conn: &Conn) -> Vec<World> {
    if w.err || w.sender.sqe {
        complete(&mut w, post, vec![WC_WR_FLUSH_ERR]);
        return vec![w];
    }
    let ud = matches!(w.t, Transport::Ud(_));
    let takes = match post.op {
        PostOp::Send => true,
        PostOp::Write => !ud,
        _ => false,
    };
    if !takes {
        // Refused at posting, or a local QP operation error.
        let refused = w.clone();
        return vec![refused, local_error(w, post, vec![WC_LOC_QP_OP_ERR])];
    }
    if super::requester::fails_locally(post, conn.len) {
        return vec![local_error(w, post, LOCAL_ERRORS.to_vec())];
    }
    if ud && post.len > conn.mtu {
        let refused = w.clone();
        let failed = local_error(w.clone(), post, vec![WC_LOC_LEN_ERR]);
        return vec![refused, failed, send(w, post, conn, ud)];
    }
    vec![send(w, post, conn, ud)]
}

/// The post goes out and completes.
fn send(mut w: World, post: &Post, conn: &Conn, ud: bool) -> World {
    let n = if ud { 1 } else { post.span(conn.mtu) };
    let mtu = if ud { post.len.max(1) } else { conn.mtu };
    for i in 0..n {
        let position = super::answer::packet_position(i, n);
        let (transport, op) = match (ud, post.op) {
            (true, _) => (uroce_wire::Transport::Ud, Operation::Send),
            (false, PostOp::Write) => (uroce_wire::Transport::Uc, Operation::RdmaWrite),
            (false, _) => (uroce_wire::Transport::Uc, Operation::Send),
        };
        let Some(opcode) = Opcode::all()
            .find(|o| {
                o.transport == transport
                    && o.operation == op
                    && o.position == position
                    && o.is_request
                    && !o.has_imm()
                    && !o.has_ieth()
            })
            .map(|o| Opcode(o.code))
        else {
            return w.open(format!("no {transport:?} {op:?} {position:?} opcode"));
        };
        let off = (i * mtu) as usize;
        let len = (post.len - i * mtu).min(mtu) as usize;
        let at = post.local_off as usize + off;
        let reth =
            (op == Operation::RdmaWrite && i == 0).then_some((post.remote_va, post.rkey, post.len));
        let psn = psn_add(conn.sq_psn, w.sender.sent_psns);
        let payload = w.region.read(at, len);
        let s = sender(&mut w);
        s.sent_psns += 1;
        s.packets.push(WantReq {
            opcode,
            psn,
            reth,
            payload,
            wr_id: post.wr_id,
        });
        s.from.push(Some(at));
    }
    complete(&mut w, post, vec![WC_SUCCESS]);
    w
}

/// A request packet the target sent, as the model reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenReq {
    /// Opcode.
    pub opcode: Opcode,
    /// PSN.
    pub psn: u32,
    /// Destination QP.
    pub dest_qp: u32,
    /// RETH.
    pub reth: Option<(u64, u32, u32)>,
    /// DETH's source QP.
    pub src_qp: Option<u32>,
    /// Payload.
    pub payload: Vec<u8>,
}

impl SeenReq {
    /// Reads a packet the target sent; None for anything but a request.
    pub fn parse(bytes: &[u8]) -> Option<SeenReq> {
        let p = uroce_wire::packet::parse(bytes).ok()?;
        p.info.is_request.then(|| SeenReq {
            opcode: p.bth.opcode,
            psn: p.bth.psn.value(),
            dest_qp: p.bth.dest_qp,
            reth: p.reth().map(|r| (r.va, r.rkey, r.dma_len)),
            src_qp: p.deth().map(|d| d.src_qp),
            payload: p.payload.to_vec(),
        })
    }
}

/// The packets `w` expects, their payload bytes left open where the
/// region changed after they were read.
fn expected(w: &World) -> Vec<WantReq> {
    w.sender
        .packets
        .iter()
        .zip(&w.sender.from)
        .map(|(p, from)| {
            let mut p = p.clone();
            if let Some(at) = *from {
                let now = w.region.read(at, p.payload.len());
                for (b, n) in p.payload.iter_mut().zip(now) {
                    if *b != n {
                        *b = None;
                    }
                }
            }
            p
        })
        .collect()
}

/// Mismatches between the requests the target sent (`answers`) and those
/// `w` expects, in order (IBA 9.8: a UC or UD requester sends each packet
/// once; no retransmissions).
pub fn judge(conn: &Conn, w: &World, answers: &[Vec<u8>]) -> Vec<super::Mismatch> {
    let seen: Vec<SeenReq> = answers.iter().filter_map(|b| SeenReq::parse(b)).collect();
    let want = expected(w);
    let ud = matches!(w.t, Transport::Ud(_));
    let fits = |r: &WantReq, s: &SeenReq| {
        s.opcode == r.opcode
            && s.psn == r.psn
            && s.dest_qp == conn.fuzzer_qpn
            && s.reth == r.reth
            && (!ud || s.src_qp == Some(conn.qpn))
            && s.payload.len() == r.payload.len()
            && r.payload
                .iter()
                .zip(&s.payload)
                .all(|(w, b)| w.is_none_or(|w| w == *b))
    };
    let rule = if ud {
        super::rules::UD
    } else {
        super::rules::UC
    };
    if let Some((r, s)) = super::first_misfit(&want, &seen, fits) {
        return vec![super::Mismatch {
            rule: rule.id,
            allowed: r.map_or("no further request".into(), |r| {
                format!(
                    "{} PSN {:#x}, {} bytes{} (post {:#x})",
                    r.opcode.info().map_or("?", |i| i.name),
                    r.psn,
                    r.payload.len(),
                    r.reth.map_or(String::new(), |(va, k, l)| format!(
                        ", RETH {va:#x} {k:#x} {l}"
                    )),
                    r.wr_id
                )
            }),
            observed: s.map_or("none".into(), |s| {
                format!(
                    "{} PSN {:#x} to QP {:#x}, {} bytes, RETH {:?}, source QP {:?}",
                    s.opcode.info().map_or("?", |i| i.name),
                    s.psn,
                    s.dest_qp,
                    s.payload.len(),
                    s.reth,
                    s.src_qp
                )
            }),
        }];
    }
    Vec::new()
}
