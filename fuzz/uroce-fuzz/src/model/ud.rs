//! The UD responder (IBA 9.8, 9.6): each datagram is one SEND ONLY
//! packet, at any PSN, delivered only with the QP's Q_Key, within the
//! port's MTU, to a posted receive WR; everything else is dropped
//! silently. Nothing is ever answered.
//!
//! Open choices: a datagram longer than the path MTU (a UD QP has no
//! path MTU: the limit is the port's, which the target does not tell)
//! may be delivered or dropped; a datagram that repeats the source QP
//! and PSN of one delivered before may be taken for a copy the network
//! made and dropped (UD does not guarantee delivery, IBA 9.8).

use super::{Input, Recv, Status, World, GRH_LEN, WC_RECV};
use crate::target::Conn;
use uroce_wire::{Operation, Position, Transport as Wire};

/// One input on a UD QP.
pub fn step(mut w: World, conn: &Conn, input: &Input) -> Vec<World> {
    let Input::Pkt(p) = input else {
        return vec![w];
    };
    let datagram = p.info.is_request
        && p.info.transport == Wire::Ud
        && p.info.operation == Operation::Send
        && p.info.position == Position::Only;
    // IBA 9.6 (Q_Key check; 10.2: a Q_Key with the high-order bit set is
    // a controlled Q_Key only on the sending side, where the QP's own
    // replaces it: a receiver compares the DETH's as it is).
    let qkey_ok = p.deth.is_some_and(|d| d.qkey == conn.qkey);
    if !datagram || !qkey_ok {
        return vec![w];
    }
    // A datagram longer than the MTU (even than the largest, 4096: the
    // UDP it travels in holds more) may be dropped or taken; taken, it
    // fits its receive WR or completes it with a local length error
    // (IBA 11.4.1.2, C9-92: the responder checks a UD packet against the
    // receive buffer; kernel rxe completes IB_WC_LOC_LEN_ERR).
    let src_qp = p.deth.map_or(0, |d| d.src_qp);
    let repeat = ud(&mut w).contains(&(src_qp, p.psn));
    // A later datagram with the same source QP and PSN may be taken for
    // a repeat of this one, whatever became of this one (taken, failed
    // for its length, dropped for its size): remember it in every world.
    if !repeat {
        ud(&mut w).push((src_qp, p.psn));
    }
    if repeat || p.payload.len() as u64 > u64::from(conn.mtu) {
        let dropped = w.clone();
        return vec![dropped]
            .into_iter()
            .chain(deliver(w, conn, p))
            .collect();
    }
    deliver(w, conn, p)
}

/// Datagrams seen so far (past the Q_Key check): (source QP, PSN).
fn ud(w: &mut World) -> &mut Vec<(u32, u32)> {
    match &mut w.t {
        super::Transport::Ud(d) => d,
        _ => unreachable!("a UD world"),
    }
}

/// The datagram is delivered to the next receive WR.
fn deliver(mut w: World, conn: &Conn, p: &super::Pkt) -> Vec<World> {
    let src_qp = p.deth.map_or(0, |d| d.src_qp);
    // No receive WR: dropped (UD has no RNR).
    let Some(wr) = w.take_recv(conn) else {
        return vec![w];
    };
    let len = p.payload.len() as u32 + GRH_LEN;
    match conn.recv_len {
        Some(l) if len > l => {
            // Too long for its WR: dropped, the WR completing with a
            // length error or kept.
            let mut kept = w.clone();
            kept.next_recv = wr;
            w.done
                .push(Recv::failed(wr, Status::AnyError, "a datagram too long"));
            return vec![kept, w];
        }
        None if len > conn.mtu + GRH_LEN => {
            return vec![w.open("receive buffers unknown")];
        }
        _ => {}
    }
    let mut c = Recv::ok(wr, WC_RECV, len, &p.why);
    c.imm = p.imm;
    c.src_qp = Some(src_qp);
    w.done.push(c);
    vec![w]
}
