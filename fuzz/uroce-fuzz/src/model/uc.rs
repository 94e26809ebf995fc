//! The UC responder (IBA 9.8): no ACKs or NAKs, ever; a packet out of
//! sequence drops the message in progress, a FIRST or ONLY (at any PSN)
//! starts a new message, a MIDDLE or LAST without its FIRST is dropped
//! with the rest of its message; a message that fails a check is
//! dropped and the QP stays up.

use super::answer::{psn_add, psn_diff};
use super::memory::{self, check_rkey, Place};
use super::rc::Msg;
use super::{Input, Pkt, Recv, Status, World, WC_RECV, WC_RECV_RDMA_WITH_IMM};
use crate::target::Conn;
use uroce_wire::{Operation, Transport as Wire};

/// The UC responder's state.
#[derive(Clone, Debug)]
pub struct Uc {
    /// Expected PSN.
    pub epsn: u32,
    /// The message in progress.
    pub cur: Option<Msg>,
    /// The rest of a message is being dropped (until a FIRST or ONLY).
    pub dropping: bool,
}

impl Uc {
    /// A responder expecting `epsn`.
    pub fn new(epsn: u32) -> Uc {
        Uc {
            epsn,
            cur: None,
            dropping: false,
        }
    }
}

fn uc(w: &mut World) -> &mut Uc {
    match &mut w.t {
        super::Transport::Uc(u) => u,
        _ => unreachable!("a UC world"),
    }
}

/// One input on a UC QP.
pub fn step(w: World, conn: &Conn, input: &Input) -> Vec<World> {
    let p = match input {
        // Dropped; or taken as a packet in sequence that fails a check,
        // which drops the message in progress.
        Input::Malformed { .. } => {
            let mut out = vec![w.clone()];
            out.extend(drop_message(w));
            return out;
        }
        Input::Pkt(p) => p,
    };
    if !p.info.is_request || p.info.transport != Wire::Uc {
        // IBA 9.6: not a UC request: dropped.
        return vec![w];
    }
    let mut w = w;
    let u = uc(&mut w);
    let starts = p.info.position.starts_message();
    let in_order = psn_diff(p.psn, u.epsn) == 0 && !u.dropping;
    let continues = u
        .cur
        .as_ref()
        .is_some_and(|m| m.continues(p.info.operation));
    if starts {
        // A new message, at any PSN: the one in progress (if any) is
        // incomplete and dropped.
        let ws = if u.cur.is_some() {
            drop_message(w)
        } else {
            vec![w]
        };
        return ws.into_iter().flat_map(|w| accept(w, conn, p)).collect();
    }
    if in_order && continues {
        return accept(w, conn, p);
    }
    // A MIDDLE or LAST out of sequence or without its FIRST.
    drop_message(w)
}

/// IBA 9.8: the message in progress is dropped (and the rest of it,
/// until a FIRST or ONLY); a WRITE's range is left undefined; the
/// receive WR it took is kept for the next message, or completes in
/// error (the spec leaves which).
fn drop_message(mut w: World) -> Vec<World> {
    let u = uc(&mut w);
    u.dropping = true;
    let cur = u.cur.take();
    match cur {
        Some(Msg::Send { wr, .. }) => {
            let mut kept = w.clone();
            kept.next_recv = wr;
            let mut failed = w;
            failed
                .done
                .push(Recv::failed(wr, Status::AnyError, "a UC message dropped"));
            vec![kept, failed]
        }
        Some(m) => {
            m.forget(&mut w.region);
            vec![w]
        }
        None => vec![w],
    }
}

/// A packet that continues or starts a message, in sequence: checked,
/// then executed.
fn accept(mut w: World, conn: &Conn, p: &Pkt) -> Vec<World> {
    let u = uc(&mut w);
    u.dropping = false;
    u.epsn = psn_add(p.psn, 1);
    let n = p.payload.len() as u64;
    let mtu = u64::from(conn.mtu);
    let starts = p.info.position.starts_message();
    let ends = p.info.position.ends_message();
    match super::rc::length_ok(p, conn.mtu) {
        Ok(()) => {}
        Err(false) => return drop_message(w),
        Err(true) => {
            let mut out = drop_message(w.clone());
            out.extend(execute(w, conn, p, starts, ends, n, mtu));
            return out;
        }
    }
    execute(w, conn, p, starts, ends, n, mtu)
}

/// Executes a packet that passed the length check.
fn execute(
    mut w: World,
    conn: &Conn,
    p: &Pkt,
    starts: bool,
    ends: bool,
    n: u64,
    mtu: u64,
) -> Vec<World> {
    match p.info.operation {
        Operation::Send => {
            if starts {
                // No receive WR: the message is dropped (no RNR on UC).
                let Some(wr) = w.take_recv(conn) else {
                    return drop_message(w);
                };
                uc(&mut w).cur = Some(Msg::Send { wr, len: 0 });
            }
            let Some(Msg::Send { wr, len }) = &mut uc(&mut w).cur else {
                return vec![w.open("a UC SEND out of its message")];
            };
            *len += n;
            let (wr, len) = (*wr, *len);
            match conn.recv_len {
                Some(l) if len > u64::from(l) => return too_long(w),
                None if len > mtu => {
                    return vec![w.open("a SEND longer than the MTU, receive buffers unknown")]
                }
                _ => {}
            }
            if ends {
                uc(&mut w).cur = None;
                let mut c = Recv::ok(wr, WC_RECV, len as u32, &p.why);
                c.imm = p.imm;
                w.done.push(c);
            }
            vec![w]
        }
        Operation::RdmaWrite => {
            let (place, dma, done) = match (&uc(&mut w).cur, p.reth) {
                (Some(Msg::Write { place, dma, done }), _) => (*place, *dma, *done),
                (_, Some(r)) => {
                    let dma = u64::from(r.dma_len);
                    let need = memory::REMOTE_WRITE;
                    match check_rkey(conn, &w.keys, r.rkey, r.va, dma, need) {
                        Some(place) => (place, dma, 0),
                        None => return drop_message(w),
                    }
                }
                _ => return vec![w.open("a UC WRITE without RETH")],
            };
            if done + n > dma || (ends && done + n != dma) {
                return drop_message(w);
            }
            let recv = if ends && p.imm.is_some() {
                match w.take_recv(conn) {
                    Some(wr) => Some(wr),
                    None => return drop_message(w),
                }
            } else {
                None
            };
            match place {
                Place::Exposed(off) => w.region.write(off + done as usize, &p.payload),
                Place::Elsewhere => w.region.forget(0, conn.len as usize),
                Place::Nothing => {}
            }
            uc(&mut w).cur = (!ends).then_some(Msg::Write {
                place,
                dma,
                done: done + n,
            });
            if let Some(wr) = recv {
                let mut c = Recv::ok(wr, WC_RECV_RDMA_WITH_IMM, dma as u32, &p.why);
                c.imm = p.imm;
                w.done.push(c);
            }
            vec![w]
        }
        op => vec![w.open(format!("UC {op:?} is not modelled"))],
    }
}

/// A SEND longer than its receive WR: the message is dropped, the WR
/// completes with a length error (or is kept), and the QP may go to
/// Error (a local length error; the spec leaves UC's choice open here).
fn too_long(w: World) -> Vec<World> {
    let mut out = drop_message(w);
    let fatal: Vec<World> = out
        .iter()
        .cloned()
        .map(|mut w| {
            w.enter_error();
            w
        })
        .collect();
    out.extend(fatal);
    out
}
