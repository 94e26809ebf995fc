//! The model's rules, case by case, and a survey of its verdicts on
//! uroce's own QP machines.

use super::*;
use crate::case::{Key, PacketSpec, Post, PostOp, Step};
use crate::gen::{Generator, Mode};
use crate::sim::SimTarget;
use crate::target::{Completion, PATTERN};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use uroce_wire::Opcode;

/// Runs `n` cases of each mode and transport on the sim target and
/// prints the model's verdicts (`UROCE_MODEL_SURVEY=N`).
#[test]
#[ignore = "a survey, run by hand"]
fn survey() {
    let n: u64 = std::env::var("UROCE_MODEL_SURVEY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    // UROCE_MODEL_SURVEY_POSTS=1: the responder mode's posts alone.
    let only_posts = std::env::var("UROCE_MODEL_SURVEY_POSTS").is_ok();
    for qp in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let modes: &[Mode] = match qp {
            _ if only_posts => &[Mode::Responder],
            QpType::Rc => &[
                Mode::Fields,
                Mode::Sequence,
                Mode::Responder,
                Mode::Keys,
                Mode::Duplicates,
            ],
            // (Responder: its posts, on UC and UD with nothing to answer.)
            _ => &[
                Mode::Fields,
                Mode::Sequence,
                Mode::Keys,
                Mode::Duplicates,
                Mode::Responder,
            ],
        };
        for &mode in modes {
            let mut t = SimTarget::new(1, None);
            let seed = std::env::var("UROCE_MODEL_SEED")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(7);
            let gen = Generator::new(seed, mode);
            let probe = crate::target::Target::setup(&mut t, qp, 8).expect("sim");
            let mut tally: BTreeMap<String, u64> = BTreeMap::new();
            let mut shown = 0;
            for i in 0..n {
                let case = gen.case(i, &probe);
                let out = crate::run_case(&mut t, qp, 8, &case).expect("sim");
                let v = judge(&out.conn, &case, &out.obs);
                let key = match &v {
                    Verdict::Legal => "legal".to_string(),
                    Verdict::Open(w) => format!("open: {w}"),
                    Verdict::Illegal(m) => format!("ILLEGAL {}", m[0].rule),
                };
                if let (Verdict::Illegal(m), true) = (&v, shown < 3) {
                    shown += 1;
                    println!("--- {qp:?} {mode:?} case {i}: {m:#?}");
                    for s in &case.steps {
                        println!("   {}", serde_json::to_string(s).unwrap_or_default());
                    }
                    for a in out.obs.answers.iter().flatten() {
                        println!("   answer {:?}", answer::Seen::parse(a));
                    }
                    for p in out.packets.iter().filter(|p| !p.sent) {
                        if let Ok(k) = uroce_wire::packet::parse(&p.bytes) {
                            let psn = k.bth.psn.value();
                            println!(
                                "   sent {} psn {psn:#x} ({} bytes)",
                                k.info.name,
                                k.payload.len()
                            );
                        }
                    }
                    for i in inputs(&out.conn, &case) {
                        match i {
                            Ok(Input::Pkt(p)) => println!(
                                "   input {} req {} psn {:#x} len {}",
                                p.why,
                                p.info.is_request,
                                p.psn,
                                p.payload.len()
                            ),
                            Ok(Input::Malformed { why, .. }) => println!("   input {why}"),
                            Err(_) => {}
                        }
                    }
                    for w in run(&out.conn, &case).unwrap_or_default() {
                        println!("   world: {:?}", compare(&out.conn, &w, &out.obs));
                    }
                    let (c, s) = (&out.obs.completions, out.obs.qp_state);
                    println!(
                        "   completions {c:?} state {s:?} conn sq_psn {:#x}",
                        out.conn.sq_psn
                    );
                }
                *tally.entry(key).or_default() += 1;
            }
            println!("{qp:?} {mode:?}: {tally:?}");
        }
    }
}

fn conn(qp_type: QpType) -> Conn {
    let ip = |b| IpAddr::V4(Ipv4Addr::new(10, 0, 0, b));
    Conn {
        qp_type,
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
        recvs_posted: 2,
        keys: Vec::new(),
        recv_len: Some(4096),
        min_rnr_timer: Some(12),
        access: None,
        qp_access: None,
        ops_1_5: None,
    }
}

/// A request of `op` at `psn` (from the expected PSN), `len` bytes of
/// `fill`, the RETH (if any) at offset 0 of the exposed region.
fn req(op: Opcode, psn: i32, len: u16, fill: u8) -> PacketSpec {
    let mut p = PacketSpec::new(op, psn);
    p.payload = (len, fill);
    p.reth = Some((0, Key::Valid, u32::from(len)));
    p
}

/// An answer of the target: `op` at `psn` from the expected PSN (or, with
/// `resp`, from the send PSN), with AETH `syndrome` and `msn`.
fn answer(c: &Conn, op: Opcode, psn: i32, syndrome: u8, msn: u32) -> Vec<u8> {
    let mut p = PacketSpec::new(op, psn);
    p.aeth = Some((syndrome, msn));
    p.emit(c).expect("emits")
}

fn case(steps: Vec<PacketSpec>) -> Case {
    Case {
        steps: steps.into_iter().map(Step::Packet).collect(),
    }
}

fn recv(wr_id: u64, status: u32) -> Completion {
    Completion {
        wr_id,
        status,
        recv: true,
        ..Completion::default()
    }
}

fn send(wr_id: u64, status: u32) -> Completion {
    Completion {
        recv: false,
        ..recv(wr_id, status)
    }
}

/// What a target shows: RTS, nothing completed, the region untouched,
/// no answers.
fn quiet() -> Observation {
    Observation {
        alive: true,
        qp_state: QpState::Rts,
        completions: Vec::new(),
        events: Vec::new(),
        exposed: vec![PATTERN; 4096],
        private_intact: true,
        control_ok: true,
        log: Vec::new(),
        answers: Some(Vec::new()),
    }
}

/// The rules the verdict names (empty: legal).
fn broken(c: &Conn, k: &Case, o: &Observation) -> Vec<&'static str> {
    match judge(c, k, o) {
        Verdict::Legal => Vec::new(),
        Verdict::Illegal(m) => m.iter().map(|m| m.rule).collect(),
        Verdict::Open(why) => panic!("not judged: {why}"),
    }
}

const ACK: u8 = 0x1f;

#[test]
fn a_duplicate_write_is_acked_again_not_executed_again() {
    let c = conn(QpType::Rc);
    let k = case(vec![
        req(Opcode::RC_RDMA_WRITE_ONLY, 0, 8, 0x11),
        req(Opcode::RC_RDMA_WRITE_ONLY, 0, 8, 0x22),
    ]);
    let mut o = quiet();
    o.exposed[..8].fill(0x11);
    let ack = answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 1);
    o.answers = Some(vec![ack.clone(), ack]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Executed again: the duplicate's bytes.
    o.exposed[..8].fill(0x22);
    assert_eq!(broken(&c, &k, &o), [rules::EXECUTE_ONCE.id]);
    // Not acknowledged at all (AckReq was set).
    o.exposed[..8].fill(0x11);
    o.answers = Some(Vec::new());
    assert_eq!(broken(&c, &k, &o), [rules::ACK.id]);
    // An ACK with another MSN than the messages completed.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 2)]);
    assert!(broken(&c, &k, &o).contains(&rules::ACK.id));
}

#[test]
fn a_duplicate_send_takes_no_second_receive() {
    let c = conn(QpType::Rc);
    let k = case(vec![
        req(Opcode::RC_SEND_ONLY, 0, 8, 1),
        req(Opcode::RC_SEND_ONLY, 0, 8, 1),
    ]);
    let mut o = quiet();
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 1)]);
    o.completions = vec![recv(0, 0)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.completions.push(recv(1, 0));
    assert_eq!(broken(&c, &k, &o), [rules::RECEIVE.id]);
    // The receive's length and opcode are judged where reported.
    let mut r = recv(0, 0);
    (r.opcode, r.byte_len) = (Some(WC_RECV), Some(9));
    o.completions = vec![r];
    assert_eq!(broken(&c, &k, &o), [rules::RECEIVE.id]);
}

#[test]
fn a_duplicate_atomic_is_answered_with_the_saved_value() {
    let c = conn(QpType::Rc);
    let mut faa = PacketSpec::new(Opcode::RC_FETCH_ADD, 0);
    faa.atomic = Some((0, Key::Valid, 1, 0));
    let k = case(vec![faa.clone(), faa]);
    let orig = u64::from_le_bytes([PATTERN; 8]);
    let ack = |v: u64| {
        let mut p = PacketSpec::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0);
        p.aeth = Some((ACK, 1));
        p.atomic_ack = Some(v);
        p.emit(&c).expect("emits")
    };
    let mut o = quiet();
    o.exposed[..8].copy_from_slice(&(orig + 1).to_le_bytes());
    o.answers = Some(vec![ack(orig), ack(orig)]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Replayed by executing again: the value after the first, and the
    // region added to twice.
    o.exposed[..8].copy_from_slice(&(orig + 2).to_le_bytes());
    o.answers = Some(vec![ack(orig), ack(orig + 1)]);
    let b = broken(&c, &k, &o);
    assert!(b.contains(&rules::EXECUTE_ONCE.id), "{b:?}");
    assert!(b.contains(&rules::ATOMIC.id), "{b:?}");
    // The atomic ACK's MSN counts the atomic (IBA 9.7.5.1.6): not the
    // count before it, nor one past it.
    o.exposed[..8].copy_from_slice(&(orig + 1).to_le_bytes());
    for m in [0, 2] {
        let mut p = PacketSpec::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, 0);
        p.aeth = Some((ACK, m));
        p.atomic_ack = Some(orig);
        o.answers = Some(vec![p.emit(&c).expect("emits"), ack(orig)]);
        assert_eq!(broken(&c, &k, &o), [rules::ATOMIC.id], "MSN {m}");
    }
}

#[test]
fn a_gap_is_naked_once_with_the_expected_psn() {
    let c = conn(QpType::Rc);
    let k = case(vec![
        req(Opcode::RC_SEND_ONLY, 2, 8, 1),
        req(Opcode::RC_SEND_ONLY, 3, 8, 1),
    ]);
    let mut o = quiet();
    let nak = answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0);
    o.answers = Some(vec![nak.clone()]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.answers = Some(Vec::new());
    assert_eq!(broken(&c, &k, &o), [rules::SEQUENCE_NAK.id]);
    // A second NAK for the same gap (IBA 9.7.5.1: once per gap).
    o.answers = Some(vec![nak.clone(), nak.clone()]);
    assert_eq!(broken(&c, &k, &o), [rules::SEQUENCE_NAK.id]);
    // Naming the packet's PSN instead of the expected one.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 2, 0x60, 0)]);
    assert_eq!(
        broken(&c, &k, &o),
        [rules::UNEXPECTED_ANSWER.id, rules::SEQUENCE_NAK.id]
    );
    // Executed although out of sequence.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0)]);
    o.completions = vec![recv(0, 0)];
    assert_eq!(broken(&c, &k, &o), [rules::RECEIVE.id]);
}

#[test]
fn a_bad_rkey_is_a_remote_access_error_that_fails_the_qp() {
    let c = conn(QpType::Rc);
    let mut w = req(Opcode::RC_RDMA_WRITE_ONLY, 0, 8, 1);
    w.reth = Some((0, Key::Private, 8));
    let k = case(vec![w]);
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.completions = vec![recv(0, WC_WR_FLUSH_ERR), recv(1, WC_WR_FLUSH_ERR)];
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x62, 0)]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Another NAK class.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x61, 0)]);
    assert_eq!(
        broken(&c, &k, &o),
        [rules::REMOTE_ACCESS.id, rules::REMOTE_ACCESS.id]
    );
    // The QP left up, its receive WRs not flushed.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x62, 0)]);
    o.qp_state = QpState::Rts;
    o.completions.clear();
    assert_eq!(broken(&c, &k, &o), [rules::QP_STATE.id, rules::FLUSH.id]);
}

#[test]
fn a_middle_without_first_is_an_invalid_request() {
    let c = conn(QpType::Rc);
    let k = case(vec![req(Opcode::RC_SEND_MIDDLE, 0, 1024, 1)]);
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.completions = vec![recv(0, WC_WR_FLUSH_ERR), recv(1, WC_WR_FLUSH_ERR)];
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x61, 0)]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.answers = Some(Vec::new());
    assert_eq!(broken(&c, &k, &o), [rules::OP_SEQUENCE.id]);
}

#[test]
fn no_receive_wr_is_an_rnr_nak_and_nothing_done() {
    let c = Conn {
        recvs_posted: 0,
        ..conn(QpType::Rc)
    };
    let k = case(vec![req(Opcode::RC_SEND_ONLY, 0, 8, 1)]);
    let mut o = quiet();
    // The timer field is the QP's min_rnr_timer (12: 0x20 | 12).
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x2c, 0)]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 1)]);
    assert_eq!(broken(&c, &k, &o), [rules::RNR.id, rules::RNR.id]);
    // Another timer (IBA 9.7.5.2.8).
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x21, 0)]);
    assert_eq!(broken(&c, &k, &o), [rules::RNR.id, rules::RNR.id]);
    // A target that does not say its timer: any.
    let c = Conn {
        min_rnr_timer: None,
        ..c
    };
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
}

#[test]
fn a_read_is_answered_with_the_bytes_as_they_were() {
    let c = conn(QpType::Rc);
    let mut read = PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, 1);
    read.reth = Some((0, Key::Valid, 1500));
    let k = case(vec![req(Opcode::RC_RDMA_WRITE_ONLY, 0, 8, 0x33), read]);
    let resp = |op: Opcode, psn: i32, len: u16, fill: u8| {
        let mut p = PacketSpec::new(op, psn);
        p.aeth = Some((ACK, 2));
        p.payload = (len, fill);
        let mut data = vec![PATTERN; usize::from(len)];
        if psn == 1 {
            data[..8].fill(fill);
        }
        p.data = Some(data);
        p.emit(&c).expect("emits")
    };
    let mut o = quiet();
    o.exposed[..8].fill(0x33);
    o.answers = Some(vec![
        resp(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1, 1024, 0x33),
        resp(Opcode::RC_RDMA_READ_RESPONSE_LAST, 2, 476, 0x33),
    ]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // The bytes before the WRITE.
    o.answers = Some(vec![
        resp(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1, 1024, PATTERN),
        resp(Opcode::RC_RDMA_READ_RESPONSE_LAST, 2, 476, PATTERN),
    ]);
    let b = broken(&c, &k, &o);
    assert!(b.contains(&rules::READ_RESPONSE.id), "{b:?}");
}

#[test]
fn uc_answers_nothing_and_restarts_on_a_first() {
    let c = conn(QpType::Uc);
    let k = case(vec![
        req(Opcode::UC_SEND_FIRST, 0, 1024, 1),
        req(Opcode::UC_SEND_FIRST, 5, 1024, 1),
        req(Opcode::UC_SEND_LAST, 6, 10, 1),
    ]);
    let mut o = quiet();
    // The first message's WR kept for the second, or completed in error.
    o.completions = vec![recv(0, 0)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.completions = vec![recv(0, 1), recv(1, 0)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // A NAK from UC.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0)]);
    assert_eq!(broken(&c, &k, &o), [rules::UNEXPECTED_ANSWER.id]);
    // A LAST out of sequence completing a message.
    let k = case(vec![
        req(Opcode::UC_SEND_FIRST, 0, 1024, 1),
        req(Opcode::UC_SEND_LAST, 2, 10, 1),
    ]);
    o.answers = Some(Vec::new());
    o.completions = vec![recv(0, 0)];
    assert_eq!(broken(&c, &k, &o), [rules::RECEIVE.id]);
}

#[test]
fn ud_compares_the_qkey_as_it_is() {
    let c = conn(QpType::Ud);
    let mut d = req(Opcode::UD_SEND_ONLY, 0, 8, 1);
    d.reth = None;
    let mut controlled = d.clone();
    controlled.deth = Some((Some(c.qkey | 0x8000_0000), c.fuzzer_qpn));
    let mut o = quiet();
    let mut r = recv(0, 0);
    (r.byte_len, r.src_qp) = (Some(8 + GRH_LEN), Some(c.fuzzer_qpn));
    o.completions = vec![r];
    assert_eq!(broken(&c, &case(vec![d.clone()]), &o), [] as [&str; 0]);
    // A Q_Key with the high-order bit set is not the QP's.
    assert_eq!(broken(&c, &case(vec![controlled]), &o), [rules::UD.id]);
    // Another source QP in the completion.
    o.completions[0].src_qp = Some(0x99);
    assert_eq!(broken(&c, &case(vec![d]), &o), [rules::UD.id]);
}

fn post(wr_id: u64, op: PostOp, len: u32) -> Step {
    Step::Post(Post {
        wr_id,
        op,
        len,
        local_off: 0,
        remote_va: 0,
        rkey: 0x4242,
        swap_add: 0,
        compare: 0,
    })
}

fn response(op: Opcode, psn: i32, syndrome: u8) -> Step {
    let mut p = PacketSpec::response(op, psn);
    p.aeth = Some((syndrome, 1));
    Step::Packet(p)
}

#[test]
fn requester_completions_follow_the_answers() {
    let c = conn(QpType::Rc);
    let two_sends = |answer: Step| Case {
        steps: vec![post(1, PostOp::Send, 8), post(2, PostOp::Send, 8), answer],
    };
    // A coalesced ACK completes both.
    let k = two_sends(response(Opcode::RC_ACKNOWLEDGE, 1, ACK));
    let mut o = quiet();
    o.completions = vec![send(1, 0), send(2, 0)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // A NAK remote access at the second: the first done, the second
    // failed with its status, the QP in error.
    let k = two_sends(response(Opcode::RC_ACKNOWLEDGE, 1, 0x62));
    o.qp_state = QpState::Err;
    o.completions = vec![send(1, 0), send(2, 10), recv(0, 5), recv(1, 5)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.completions[1].status = 9;
    assert_eq!(broken(&c, &k, &o), [rules::REQUESTER.id]);
    // A ghost ACK completes nothing.
    let k = two_sends(response(Opcode::RC_ACKNOWLEDGE, 5, ACK));
    o.completions = vec![send(1, 0), send(2, 0)];
    o.qp_state = QpState::Rts;
    assert!(broken(&c, &k, &o).contains(&rules::REQUESTER.id));
}

#[test]
fn an_ack_past_an_unanswered_read_does_not_complete_it() {
    let c = conn(QpType::Rc);
    let k = Case {
        steps: vec![
            post(1, PostOp::Read, 8),
            post(2, PostOp::Send, 8),
            response(Opcode::RC_ACKNOWLEDGE, 1, ACK),
        ],
    };
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.completions = vec![send(1, 12), send(2, 5), recv(0, 5), recv(1, 5)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.completions[0].status = 0;
    assert!(broken(&c, &k, &o).contains(&rules::REQUESTER.id));
}

#[test]
fn every_rule_has_a_section() {
    for r in rules::ALL {
        assert!(
            r.id.starts_with("model:") && r.section.starts_with("IBA"),
            "{r:?}"
        );
        assert_eq!(rules::find(r.id).map(|x| x.id), Some(r.id));
    }
}

/// Runs the finding at `UROCE_MODEL_FINDING` on the sim target and
/// prints what every world of the model makes of it (triage by hand).
#[test]
#[ignore = "triage, run by hand"]
fn explain_finding() {
    let Ok(path) = std::env::var("UROCE_MODEL_FINDING") else {
        return;
    };
    let f = crate::Finding::load(std::path::Path::new(&path)).expect("a finding");
    let mut t = SimTarget::new(f.seed, None);
    let out = crate::run_case(&mut t, f.qp_type, f.recvs, &f.case).expect("sim");
    for a in out.obs.answers.iter().flatten() {
        println!("answer {:?}", answer::Seen::parse(a));
    }
    println!(
        "completions {:?} state {:?}",
        out.obs.completions, out.obs.qp_state
    );
    for w in run(&out.conn, &f.case).unwrap_or_default() {
        println!("world: {:?}", compare(&out.conn, &w, &out.obs));
    }
}

/// Replays a `sim_case` input (`UROCE_MODEL_REPLAY=FILE`) and prints the
/// model's view of it: how a finding of the coverage-guided target is
/// triaged.
#[test]
#[ignore = "a triage aid, run by hand"]
fn replay() {
    let Ok(path) = std::env::var("UROCE_MODEL_REPLAY") else {
        return;
    };
    let input = crate::input::FuzzInput::decode(&std::fs::read(path).expect("reads"));
    let out = input.run().expect("sim");
    println!(
        "{:?} recvs {} violations {:#?}",
        input.qp_type, input.recvs, out.violations
    );
    for s in &input.case.steps {
        println!("   {}", serde_json::to_string(s).unwrap_or_default());
    }
    for p in &out.packets {
        if let Ok(k) = uroce_wire::packet::parse(&p.bytes) {
            println!(
                "   {} {} psn {:#x} ack_req {} aeth {:?} ({} bytes)",
                if p.sent { "in " } else { "OUT" },
                k.info.name,
                k.bth.psn.value(),
                k.bth.ack_req,
                k.aeth(),
                k.payload.len()
            );
        }
    }
    for i in inputs(&out.conn, &input.case) {
        match i {
            Ok(Input::Pkt(p)) => println!("   input {} psn {:#x}", p.why, p.psn),
            Ok(Input::Malformed { why, .. }) => println!("   input {why}"),
            Err(p) => println!("   post {p:?}"),
        }
    }
    for w in run(&out.conn, &input.case).unwrap_or_default() {
        println!("   world: {:?}", compare(&out.conn, &w, &out.obs));
    }
    println!(
        "   completions {:?} state {:?} conn rq_psn {:#x} sq_psn {:#x}",
        out.obs.completions, out.obs.qp_state, out.conn.rq_psn, out.conn.sq_psn
    );
}

/// The model's violations on a `sim_case` input run on the sim target.
fn model_findings(bytes: &[u8]) -> Vec<crate::oracle::Violation> {
    let input = crate::input::FuzzInput::decode(bytes);
    let out = input.run().expect("sim");
    out.violations
        .into_iter()
        .filter(|v| matches!(v, crate::oracle::Violation::Model { .. }))
        .collect()
}

/// `sim_case` findings that were the model's mistakes (reproducers under
/// model/repro/): uroce's QP machines did what the spec allows.
#[test]
fn sim_case_findings_are_legal() {
    for (name, bytes) in [
        // A WRITE whose local buffer is past the region: a local error
        // when its turn comes, after the WRITE before it was ACKed.
        (
            "local-error-write",
            &include_bytes!("repro/local-error-write.bin")[..],
        ),
        // An atomic whose local buffer is past the region.
        (
            "local-error-atomic",
            include_bytes!("repro/local-error-atomic.bin"),
        ),
        // The same, posted while the packets sent before it are still on
        // their way: the QP is in Error before they arrive.
        (
            "local-error-before-packets",
            include_bytes!("repro/local-error-before-packets.bin"),
        ),
        // The same after a wait of no time (nothing arrives meanwhile).
        (
            "local-error-after-wait-zero",
            include_bytes!("repro/local-error-after-wait-zero.bin"),
        ),
        // The same after a wait of 1 µs: the SEND before it not yet
        // taken either.
        (
            "local-error-before-waited-packets",
            include_bytes!("repro/local-error-before-waited-packets.bin"),
        ),
        // A UD datagram of 38,400 bytes: too long for its receive WR.
        (
            "ud-longer-than-4096",
            include_bytes!("repro/ud-longer-than-4096.bin"),
        ),
        // A SEND in progress when the requester's retries run out: its
        // receive WR completes in error before the rest are flushed.
        (
            "send-in-progress-requester-error",
            include_bytes!("repro/send-in-progress-requester-error.bin"),
        ),
        // A UD datagram too long for its receive WR (completed with a
        // length error), then one with the same source QP and PSN:
        // uroce takes it for a repeat and drops it.
        (
            "ud-repeat-of-a-failed-datagram",
            include_bytes!("repro/ud-repeat-of-a-failed-datagram.bin"),
        ),
        // (On a build that verifies ICRCs) a packet cut to nothing.
        ("cut-to-nothing", include_bytes!("repro/cut-to-nothing.bin")),
        // A READ, then a WRITE with immediate that fails its length
        // check, then a SEND posted and ACKed by the fuzzer: uroce holds
        // the WRITE behind the READ's responses, so the SEND goes out
        // and succeeds before the QP enters Error (`held_behind_read`).
        (
            "post-behind-read-then-invalid-request",
            include_bytes!("repro/post-behind-read-then-invalid-request.bin"),
        ),
        // A SEND outstanding, then a READ whose local buffer is past the
        // region, then more posts: uroce stops at the READ (sends nothing
        // after it), so an ACK for a later PSN is a ghost and the QP is
        // still in RTS (a FLUSH ahead gets its sequence NAK) until the
        // SEND's retries run out (`requester::post`).
        (
            "requester-stopped-at-local-error",
            include_bytes!("repro/requester-stopped-at-local-error.bin"),
        ),
    ] {
        let found = model_findings(bytes);
        assert!(found.is_empty(), "{name}: {found:#?}");
    }
}

/// A post whose local buffer the region does not hold fails with a local
/// error and takes no PSNs; the model says so, and holds uroce to it.
#[test]
fn local_error_post() {
    let c = conn(QpType::Rc);
    let post = |wr_id, op, len, local_off| Post {
        wr_id,
        op,
        len,
        local_off,
        remote_va: 0,
        rkey: 0x99,
        swap_add: 0,
        compare: 0,
    };
    assert!(requester::fails_locally(
        &post(0, PostOp::Write, 100, 4000),
        4096
    ));
    assert!(requester::fails_locally(
        &post(0, PostOp::FetchAdd, 0, 4089),
        4096
    ));
    assert!(!requester::fails_locally(
        &post(0, PostOp::FetchAdd, 0, 4088),
        4096
    ));
    assert!(!requester::fails_locally(
        &post(0, PostOp::Write, 0, u32::MAX),
        4096
    ));
    assert!(requester::fails_locally(
        &post(0, PostOp::Read, u32::MAX, 0),
        u32::MAX
    ));
    let case = Case {
        steps: vec![
            Step::Post(post(7, PostOp::Write, 100, 0)),
            Step::Post(post(8, PostOp::Write, 100, 4090)),
            Step::Post(post(9, PostOp::Send, 10, 0)),
        ],
    };
    let worlds = run(&c, &case).expect("modelled");
    // Unanswered, the first fails (its retries run out), the QP in Error.
    assert!(worlds.iter().all(|w| w.err));
    // The bad post takes no PSNs: an ACK at the first's last PSN + 1 is
    // the third's (SEND), not a PSN of the second.
    let mut ack = PacketSpec::new(Opcode::RC_ACKNOWLEDGE, 0);
    ack.aeth = Some((0, 1));
    ack.resp = true;
    let case = Case {
        steps: vec![
            Step::Post(post(7, PostOp::Write, 100, 0)),
            Step::Post(post(8, PostOp::Write, 100, 4090)),
            Step::Wait(10),
            Step::Packet(ack),
        ],
    };
    let worlds = run(&c, &case).expect("modelled");
    let done: Vec<Vec<requester::SendDone>> = worlds.iter().map(requester::completions).collect();
    let ok_then_local = vec![
        requester::SendDone {
            wr_id: 7,
            status: vec![WC_SUCCESS],
            opcode: Some(1),
            byte_len: Some(100),
        },
        requester::SendDone {
            wr_id: 8,
            status: requester::LOCAL_ERRORS.to_vec(),
            opcode: None,
            byte_len: None,
        },
    ];
    assert!(done.contains(&ok_then_local), "{done:#?}");
}

/// A packet that does not parse and has no bytes at all is named, not a
/// panic (a cargo-fuzz build, which does not verify ICRCs, takes a
/// packet cut to nothing).
#[test]
fn malformed_without_bytes() {
    let e = "too short";
    assert_eq!(
        malformed_why(3, &[], -1, &e),
        "packet 3: no bytes, PSN -1 (too short)"
    );
    assert_eq!(
        malformed_why(3, &[0x04], 2, &e),
        "packet 3: opcode 0x04 PSN +2 (too short)"
    );
}

/// A SEND in progress when the QP enters Error for another reason (the
/// requester's retries run out) completes its receive WR in error; the
/// WRs after it are flushed (IBA 10.3.1).
#[test]
fn send_in_progress_fails_with_the_qp() {
    let c = conn(QpType::Rc);
    let mut first = req(Opcode::RC_SEND_FIRST, 0, 1024, 1);
    first.reth = None;
    let worlds = run(&c, &case(vec![first])).expect("modelled");
    assert_eq!(worlds.len(), 1);
    let mut w = worlds[0].clone();
    w.enter_error();
    let got: Vec<(u64, Status)> = w.receives(&c).iter().map(|r| (r.wr_id, r.status)).collect();
    assert_eq!(
        got,
        vec![(0, Status::AnyError), (1, Status::Is(WC_WR_FLUSH_ERR))]
    );
}

/// The orders the model also follows: posts before the packets since the
/// last wait of some time, and the first post that fails locally before
/// any of the packets before it.
#[test]
fn post_orders() {
    let c = conn(QpType::Rc);
    let post = |wr_id, local_off| {
        Step::Post(Post {
            wr_id,
            op: PostOp::Send,
            len: 8,
            local_off,
            remote_va: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
        })
    };
    let pkt = |psn| Step::Packet(req(Opcode::RC_SEND_ONLY, psn, 0, 0));
    let case = Case {
        steps: vec![
            pkt(0),
            Step::Wait(5),
            pkt(1),
            Step::Wait(0),
            pkt(2),
            post(1, 0),
        ],
    };
    let early = posts_first(&case).expect("moves");
    assert_eq!(
        early.steps,
        vec![
            pkt(0),
            Step::Wait(5),
            post(1, 0),
            pkt(1),
            Step::Wait(0),
            pkt(2)
        ]
    );
    assert!(local_error_earlier(&c, &case).is_empty());
    let case = Case {
        steps: vec![pkt(0), Step::Wait(5), pkt(1), post(1, 4090), post(2, 0)],
    };
    let moved: Vec<Vec<Step>> = local_error_earlier(&c, &case)
        .into_iter()
        .map(|c| c.steps)
        .collect();
    assert_eq!(
        moved,
        vec![
            vec![post(1, 4090), pkt(0), Step::Wait(5), pkt(1), post(2, 0)],
            vec![pkt(0), Step::Wait(5), post(1, 4090), pkt(1), post(2, 0)],
        ]
    );
    // The SEND at +0 may or may not have been taken before the QP failed.
    let worlds = run(&c, &case).expect("modelled");
    let first: Vec<Status> = worlds.iter().map(|w| w.receives(&c)[0].status).collect();
    assert!(first.contains(&Status::Is(WC_SUCCESS)), "{first:?}");
    assert!(first.contains(&Status::Is(WC_WR_FLUSH_ERR)), "{first:?}");
}

/// A request behind a READ (here a WRITE with immediate whose payload is
/// not its DMA length: an invalid request) may be taken only once the
/// READ's responses are out, and the QP enters Error only then: a SEND
/// posted and acknowledged meanwhile completes with success. Not so when
/// nothing holds the request (no READ before it), nor after a wait (the
/// responses were out by then).
#[test]
fn a_request_held_behind_a_read_fails_after_the_answers_that_follow() {
    let c = conn(QpType::Rc);
    let mut read = PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, 0);
    read.reth = Some((0, Key::Valid, 8));
    let bad = |psn| {
        let mut p = req(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn, 8, 1);
        p.reth = Some((0, Key::Valid, 16));
        p.imm = Some(7);
        Step::Packet(p)
    };
    let ack = response(Opcode::RC_ACKNOWLEDGE, 0, ACK);
    let k = Case {
        steps: vec![
            Step::Packet(read.clone()),
            bad(1),
            post(1, PostOp::Send, 8),
            ack.clone(),
        ],
    };
    // The order the model follows besides the case's.
    let held = held_behind_read(&c, &k, true).expect("moves");
    assert_eq!(
        held.steps,
        vec![
            Step::Packet(read.clone()),
            post(1, PostOp::Send, 8),
            ack.clone(),
            bad(1)
        ]
    );
    let mut resp = PacketSpec::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0);
    resp.aeth = Some((ACK, 1));
    resp.payload = (8, PATTERN);
    resp.data = Some(vec![PATTERN; 8]);
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.completions = vec![send(1, 0), recv(0, 5), recv(1, 5)];
    o.answers = Some(vec![
        resp.emit(&c).expect("emits"),
        answer(&c, Opcode::RC_ACKNOWLEDGE, 1, 0x61, 1),
    ]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // The READ's responses out at a wait before the post: the QP failed
    // first, the SEND is flushed.
    let waited = Case {
        steps: vec![
            Step::Packet(read),
            bad(1),
            Step::Wait(5),
            post(1, PostOp::Send, 8),
            ack.clone(),
        ],
    };
    assert!(held_behind_read(&c, &waited, false).is_none());
    assert_eq!(broken(&c, &waited, &o), [rules::REQUESTER.id]);
    // No READ before the failing request: nothing holds it.
    let alone = Case {
        steps: vec![bad(0), post(1, PostOp::Send, 8), ack],
    };
    assert!(held_behind_read(&c, &alone, true).is_none());
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x61, 0)]);
    assert_eq!(broken(&c, &alone, &o), [rules::REQUESTER.id]);
}

/// A post that fails locally behind a request still outstanding: the
/// requester may stop at it (sending none of the posts after it) until
/// the request before it is done. An ACK for a later PSN is then a
/// ghost, and the QP still serves requests (a PSN gap is NAKed) until
/// the first request's retries run out; the posts after it are flushed.
/// A requester that sent the posts after it may take the ACK for them.
#[test]
fn the_requester_may_stop_at_a_post_that_fails_locally() {
    let c = conn(QpType::Rc);
    // A WRITE: its buffer is its source (a READ's, which only receives
    // the response, is sent all the same).
    let bad_read = Step::Post(Post {
        wr_id: 2,
        op: PostOp::Write,
        len: 8,
        local_off: 4090,
        remote_va: 0,
        rkey: 0x4242,
        swap_add: 0,
        compare: 0,
    });
    let k = Case {
        steps: vec![
            post(1, PostOp::Send, 8),
            bad_read,
            post(3, PostOp::Send, 8),
            Step::Wait(5),
            // The third's PSN (the READ takes none).
            response(Opcode::RC_ACKNOWLEDGE, 1, ACK),
            Step::Packet(req(Opcode::RC_SEND_ONLY, 1, 8, 1)),
        ],
    };
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0)]);
    o.completions = vec![send(1, 12), send(2, 5), send(3, 5), recv(0, 5), recv(1, 5)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Sent past it: the ACK completes the first, the WRITE then fails
    // with a local error, the third flushed.
    o.answers = Some(Vec::new());
    o.completions = vec![send(1, 0), send(2, 4), send(3, 5), recv(0, 5), recv(1, 5)];
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Stopped at it, the ACK is a ghost: the first cannot succeed.
    let worlds = run(&c, &k).expect("modelled");
    let stopped = worlds.iter().filter(|w| match &w.t {
        Transport::Rc(r) => r.req.stop == Some(1),
        _ => false,
    });
    for w in stopped {
        assert_ne!(requester::completions(w)[0].status, [WC_SUCCESS]);
    }
}

/// A gap closed by the expected PSN and opened again may be NAKed again
/// with the same expected PSN (the request there failed with an RNR NAK,
/// so the expected PSN did not move).
#[test]
fn a_gap_opened_again_is_naked_again() {
    let mut c = conn(QpType::Rc);
    c.recvs_posted = 0;
    let k = case(vec![
        req(Opcode::RC_SEND_ONLY, 2, 8, 1),
        req(Opcode::RC_SEND_ONLY, 0, 8, 1),
        req(Opcode::RC_SEND_ONLY, 2, 8, 1),
    ]);
    let mut o = quiet();
    let nak = answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0);
    let rnr = answer(&c, Opcode::RC_ACKNOWLEDGE, 0, 0x2c, 0);
    o.answers = Some(vec![nak.clone(), rnr, nak]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
}

/// On the sim target an RNR NAK carries the min_rnr_timer `Conn` names.
#[test]
fn sim_rnr_nak_carries_the_qps_timer() {
    let input = crate::input::FuzzInput {
        seed: 1,
        qp_type: QpType::Rc,
        recvs: 0,
        case: Case {
            steps: vec![
                Step::Packet(req(Opcode::RC_SEND_ONLY, 0, 8, 1)),
                Step::Wait(100),
            ],
        },
    };
    let out = input.run().expect("sim");
    let seen: Vec<answer::Seen> = out
        .obs
        .answers
        .iter()
        .flatten()
        .filter_map(|b| answer::Seen::parse(b))
        .collect();
    let timer = out.conn.min_rnr_timer.expect("the sim says");
    assert!(
        seen.iter()
            .any(|s| matches!(*s, answer::Seen::Rnr { timer: t, .. } if t == timer)),
        "{seen:?}"
    );
    assert!(out.violations.is_empty(), "{:#?}", out.violations);
}

/// READ responses carry the MSN counting the READ (IBA 9.7.5.1.6): the
/// LAST and ONLY must, the FIRST may also carry the one before.
#[test]
fn read_responses_carry_the_msn_counting_the_read() {
    let c = conn(QpType::Rc);
    let mut read = PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, 1);
    read.reth = Some((0, Key::Valid, 1500));
    let k = case(vec![req(Opcode::RC_RDMA_WRITE_ONLY, 0, 8, 0x33), read]);
    let resp = |op: Opcode, psn: i32, len: u16, msn: u32| {
        let mut p = PacketSpec::new(op, psn);
        p.aeth = Some((ACK, msn));
        let mut data = vec![PATTERN; usize::from(len)];
        if psn == 1 {
            data[..8].fill(0x33);
        }
        p.payload = (len, 0);
        p.data = Some(data);
        p.emit(&c).expect("emits")
    };
    let mut o = quiet();
    o.exposed[..8].fill(0x33);
    let first = |m| resp(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1, 1024, m);
    let last = |m| resp(Opcode::RC_RDMA_READ_RESPONSE_LAST, 2, 476, m);
    for f in [1, 2] {
        o.answers = Some(vec![first(f), last(2)]);
        assert_eq!(broken(&c, &k, &o), [] as [&str; 0], "FIRST MSN {f}");
    }
    // The LAST not counting the READ (as a responder that does not
    // advance the MSN on a READ sends it).
    o.answers = Some(vec![first(1), last(1)]);
    let b = broken(&c, &k, &o);
    assert!(b.contains(&rules::READ_RESPONSE.id), "{b:?}");
    // An MSN counting more than was done.
    o.answers = Some(vec![first(3), last(2)]);
    let b = broken(&c, &k, &o);
    assert!(b.contains(&rules::READ_RESPONSE.id), "{b:?}");
    // An ONLY carries the count with the READ.
    let mut only = PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, 0);
    only.reth = Some((0, Key::Valid, 8));
    let k = case(vec![only]);
    let o = |m| {
        let mut o = quiet();
        let mut p = PacketSpec::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0);
        p.aeth = Some((ACK, m));
        p.payload = (8, PATTERN);
        o.answers = Some(vec![p.emit(&c).expect("emits")]);
        o
    };
    assert_eq!(broken(&c, &k, &o(1)), [] as [&str; 0]);
    assert!(broken(&c, &k, &o(0)).contains(&rules::READ_RESPONSE.id));
}

/// A duplicate READ's responses carry an MSN from the one as of the READ
/// to the current one.
#[test]
fn a_duplicate_reads_msn_is_between_its_own_and_now() {
    let c = conn(QpType::Rc);
    let mut read = PacketSpec::new(Opcode::RC_RDMA_READ_REQUEST, 0);
    read.reth = Some((0, Key::Valid, 8));
    let k = case(vec![
        read.clone(),
        req(Opcode::RC_RDMA_WRITE_ONLY, 1, 8, PATTERN),
        read,
    ]);
    let only = |m| {
        let mut p = PacketSpec::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0);
        p.aeth = Some((ACK, m));
        p.payload = (8, PATTERN);
        p.emit(&c).expect("emits")
    };
    let ack = answer(&c, Opcode::RC_ACKNOWLEDGE, 1, ACK, 2);
    let mut o = quiet();
    for m in [1, 2] {
        o.answers = Some(vec![only(1), ack.clone(), only(m)]);
        assert_eq!(broken(&c, &k, &o), [] as [&str; 0], "MSN {m}");
    }
    for m in [0, 3] {
        o.answers = Some(vec![only(1), ack.clone(), only(m)]);
        // (Named by the first expectation at its PSN: the READ's own.)
        assert_eq!(broken(&c, &k, &o), [rules::READ_RESPONSE.id], "MSN {m}");
    }
}

/// A connection whose region and QP say their rights: the remote three
/// and FLUSH for global visibility (as the sim target's).
fn flush_conn() -> Conn {
    use crate::target::access;
    Conn {
        access: Some(access::LOCAL_WRITE | access::REMOTE | access::FLUSH_GLOBAL),
        qp_access: Some(access::LOCAL_WRITE | access::REMOTE | access::FLUSH_GLOBAL),
        ..conn(QpType::Rc)
    }
}

fn flush(placement: u8, selectivity: u8, off: i64, key: Key, len: u32) -> PacketSpec {
    let mut p = PacketSpec::new(Opcode::RC_FLUSH, 0);
    p.reth = Some((off, key, len));
    p.feth = Some((placement, selectivity));
    p
}

/// The empty READ response ONLY that answers a FLUSH or ATOMIC WRITE.
fn placed_answer(c: &Conn, psn: i32, msn: u32) -> Vec<u8> {
    answer(c, Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn, ACK, msn)
}

/// What a target shows after a request that failed a check: QP in
/// Error, both receive WRs flushed, the NAK `syndrome`.
fn failed(c: &Conn, syndrome: u8) -> Observation {
    let mut o = quiet();
    o.qp_state = QpState::Err;
    o.completions = vec![recv(0, WC_WR_FLUSH_ERR), recv(1, WC_WR_FLUSH_ERR)];
    o.answers = Some(vec![answer(c, Opcode::RC_ACKNOWLEDGE, 0, syndrome, 0)]);
    o
}

/// An RDMA FLUSH (IBA 1.5): the rights of its placement type on the QP
/// and the key, the range (or the whole region), answered by an empty
/// READ response ONLY counting it, and no byte changed.
#[test]
fn a_flush_is_checked_answered_and_changes_nothing() {
    let c = flush_conn();
    let (global, persistent) = (1, 2);
    let ok = case(vec![flush(global, 0, 64, Key::Valid, 128)]);
    let mut o = quiet();
    o.answers = Some(vec![placed_answer(&c, 0, 1)]);
    assert_eq!(broken(&c, &ok, &o), [] as [&str; 0]);
    // A plain ACK is not its answer (nor is the response's MSN another).
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 1)]);
    assert_eq!(
        broken(&c, &ok, &o),
        [rules::PLACEMENT.id, rules::PLACEMENT.id]
    );
    o.answers = Some(vec![placed_answer(&c, 0, 0)]);
    assert!(broken(&c, &ok, &o).contains(&rules::PLACEMENT.id));
    // It changes no byte.
    o.answers = Some(vec![placed_answer(&c, 0, 1)]);
    o.exposed[64] = 0;
    assert_eq!(broken(&c, &ok, &o), [rules::EXECUTE_ONCE.id]);
    // Refused although it was valid.
    assert!(!broken(&c, &ok, &failed(&c, 0x61)).is_empty());
    // Persistence: the QP does not take it: an invalid request.
    let persist = case(vec![flush(persistent, 0, 64, Key::Valid, 128)]);
    assert_eq!(broken(&c, &persist, &failed(&c, 0x61)), [] as [&str; 0]);
    o.exposed[64] = PATTERN;
    assert!(!broken(&c, &persist, &o).is_empty());
    // The QP takes it but the region lacks the right: a remote access
    // error.
    let c2 = Conn {
        qp_access: c
            .qp_access
            .map(|a| a | crate::target::access::FLUSH_PERSISTENT),
        ..c.clone()
    };
    assert_eq!(broken(&c2, &persist, &failed(&c2, 0x62)), [] as [&str; 0]);
    assert!(!broken(&c2, &persist, &failed(&c2, 0x61)).is_empty());
    // A range past the region: an access error; the whole region
    // (selectivity MR) checks no range.
    let past = case(vec![flush(global, 0, 4000, Key::Valid, 200)]);
    assert_eq!(broken(&c, &past, &failed(&c, 0x62)), [] as [&str; 0]);
    let whole = case(vec![flush(global, 1, 4000, Key::Valid, 200)]);
    assert_eq!(broken(&c, &whole, &o), [] as [&str; 0]);
    // The key is checked even for an empty range.
    let empty = case(vec![flush(global, 0, 0, Key::Private, 0)]);
    assert_eq!(broken(&c, &empty, &failed(&c, 0x62)), [] as [&str; 0]);
    assert!(!broken(&c, &empty, &o).is_empty());
}

/// An ATOMIC WRITE (IBA 1.5): 8 aligned bytes through a key with the
/// remote write right, placed exactly there, answered by an empty READ
/// response ONLY counting it.
#[test]
fn an_atomic_write_places_its_eight_bytes_and_no_other() {
    use crate::target::{access, ExposedKey, KeyKind, KeyState};
    let mut c = flush_conn();
    let key = |name: &str, key, access| ExposedKey {
        name: name.into(),
        key,
        kind: KeyKind::Region,
        va: 0x80_0000,
        len: 1024,
        access,
        same_pd: true,
        bound_to_qp: true,
        state: KeyState::Valid,
    };
    c.keys = vec![
        key(
            "no-write",
            0x901,
            access::REMOTE_READ | access::REMOTE_ATOMIC,
        ),
        key(
            "write-only",
            0x902,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        ),
    ];
    let aw = |off: i64, k: Key, dma: u32, len: u16| {
        let mut p = PacketSpec::new(Opcode::RC_ATOMIC_WRITE, 0);
        p.reth = Some((off, k, dma));
        p.payload = (len, 0x77);
        case(vec![p])
    };
    let mut o = quiet();
    o.answers = Some(vec![placed_answer(&c, 0, 1)]);
    o.exposed[8..16].fill(0x77);
    assert_eq!(broken(&c, &aw(8, Key::Valid, 8, 8), &o), [] as [&str; 0]);
    // A byte more, or one fewer, changed.
    o.exposed[16] = 0x77;
    assert_eq!(
        broken(&c, &aw(8, Key::Valid, 8, 8), &o),
        [rules::EXECUTE_ONCE.id]
    );
    o.exposed[16] = PATTERN;
    o.exposed[15] = PATTERN;
    assert_eq!(
        broken(&c, &aw(8, Key::Valid, 8, 8), &o),
        [rules::EXECUTE_ONCE.id]
    );
    o.exposed[15] = 0x77;
    // Answered by a plain ACK.
    o.answers = Some(vec![answer(&c, Opcode::RC_ACKNOWLEDGE, 0, ACK, 1)]);
    assert!(broken(&c, &aw(8, Key::Valid, 8, 8), &o).contains(&rules::PLACEMENT.id));
    // Length, DMA length and alignment: invalid requests.
    for k in [
        aw(8, Key::Valid, 16, 8),
        aw(8, Key::Valid, 8, 4),
        aw(4, Key::Valid, 8, 8),
    ] {
        assert_eq!(broken(&c, &k, &failed(&c, 0x61)), [] as [&str; 0], "{k:?}");
    }
    // The write right, not the atomic one.
    let write_only = aw(0, Key::Exposed(1), 8, 8);
    let mut elsewhere = quiet();
    elsewhere.answers = Some(vec![placed_answer(&c, 0, 1)]);
    assert_eq!(broken(&c, &write_only, &elsewhere), [] as [&str; 0]);
    let no_write = aw(0, Key::Exposed(0), 8, 8);
    assert_eq!(broken(&c, &no_write, &failed(&c, 0x62)), [] as [&str; 0]);
    assert!(!broken(&c, &no_write, &elsewhere).is_empty());
}

/// On the sim target (uroce's QP machines, the exposed region and the QP
/// taking FLUSH for global visibility) FLUSHes and ATOMIC WRITEs are
/// judged, and uroce's answers are legal.
#[test]
fn sim_flush_and_atomic_write_are_judged_legal() {
    let mut aw = PacketSpec::new(Opcode::RC_ATOMIC_WRITE, 2);
    aw.reth = Some((16, Key::Valid, 8));
    aw.payload = (8, 0x42);
    for (steps, needs_read_response) in [
        (vec![flush(1, 0, 0, Key::Valid, 64), aw.clone()], true),
        (vec![flush(1, 1, 0, Key::Valid, 0)], true),
        (vec![flush(2, 0, 0, Key::Valid, 64)], false),
        (vec![flush(1, 0, 4090, Key::Valid, 64)], false),
        (vec![flush(0, 0, 0, Key::Valid, 64)], false),
        (vec![flush(1, 0, 0, Key::Private, 0)], false),
    ] {
        let mut steps: Vec<Step> = steps.into_iter().map(Step::Packet).collect();
        if steps.len() == 2 {
            // The ATOMIC WRITE after a FLUSH at +0 takes PSN +1.
            if let Step::Packet(p) = &mut steps[1] {
                p.psn_off = 1;
            }
        }
        steps.push(Step::Wait(100));
        let input = crate::input::FuzzInput {
            seed: 3,
            qp_type: QpType::Rc,
            recvs: 1,
            case: Case { steps },
        };
        let out = input.run().expect("sim");
        assert!(out.violations.is_empty(), "{:#?}", out.violations);
        assert!(
            matches!(judge(&out.conn, &input.case, &out.obs), Verdict::Legal),
            "{input:?}"
        );
        let reads = out
            .obs
            .answers
            .iter()
            .flatten()
            .filter(|b| matches!(answer::Seen::parse(b), Some(answer::Seen::Read { .. })))
            .count();
        assert_eq!(reads > 0, needs_read_response, "{input:?}");
    }
}

/// A send completion with its details, as a target reports a successful
/// one.
fn sent(wr_id: u64, opcode: u32, byte_len: u32) -> Completion {
    Completion {
        opcode: Some(opcode),
        byte_len: Some(byte_len),
        ..send(wr_id, 0)
    }
}

fn uc_post(wr_id: u64, op: PostOp, len: u32, local_off: u32) -> Step {
    Step::Post(Post {
        wr_id,
        op,
        len,
        local_off,
        remote_va: 0x7000,
        rkey: 0x4242,
        swap_add: 0,
        compare: 0,
    })
}

/// A request the target sends: `op` at `psn` from its send PSN, `len`
/// bytes of the pattern, a RETH of the post's.
fn request(c: &Conn, op: Opcode, psn: i32, len: u16, reth: Option<u32>) -> Vec<u8> {
    let mut p = PacketSpec::response(op, psn);
    p.dest = crate::case::Dest::Raw(c.fuzzer_qpn);
    p.payload = (len, PATTERN);
    p.reth = reth.map(|l| (0x7000 - c.va as i64, Key::Raw(0x4242), l));
    if c.qp_type == QpType::Ud {
        p.deth = Some((None, c.qpn));
    }
    p.emit(c).expect("emits")
}

/// Posts on a UC QP are judged: each goes out once as its packets, and
/// completes successfully with its opcode and length; a READ is refused
/// or fails with a local QP operation error that moves the QP to SQE and
/// flushes the posts after it.
#[test]
fn uc_posts_are_judged() {
    let c = conn(QpType::Uc);
    let k = Case {
        steps: vec![
            uc_post(1, PostOp::Send, 10, 0),
            uc_post(2, PostOp::Write, 1500, 0),
        ],
    };
    let mut o = quiet();
    o.completions = vec![sent(1, 0, 10), sent(2, 1, 1500)];
    o.answers = Some(vec![
        request(&c, Opcode::UC_SEND_ONLY, 0, 10, None),
        request(&c, Opcode::UC_RDMA_WRITE_FIRST, 1, 1024, Some(1500)),
        request(&c, Opcode::UC_RDMA_WRITE_LAST, 2, 476, None),
    ]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // The length, the opcode, the status of a completion.
    o.completions[1].byte_len = Some(1024);
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    o.completions[1] = sent(2, 0, 1500);
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    o.completions[1] = send(2, 12);
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    o.completions[1] = sent(2, 1, 1500);
    // A packet missing, or sent twice, or another length or PSN.
    let all = o.answers.clone().expect("set");
    o.answers = Some(all[..2].to_vec());
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    o.answers = Some([&all[..], &all[2..]].concat());
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    let mut other = all.clone();
    other[0] = request(&c, Opcode::UC_SEND_ONLY, 0, 9, None);
    o.answers = Some(other.clone());
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    other[0] = request(&c, Opcode::UC_SEND_ONLY, 1, 10, None);
    o.answers = Some(other);
    assert_eq!(broken(&c, &k, &o), [rules::UC.id]);
    // A READ on UC: refused, or a local QP operation error, the QP to
    // SQE and the SEND after it flushed.
    let k = Case {
        steps: vec![
            uc_post(1, PostOp::Read, 10, 0),
            uc_post(2, PostOp::Send, 10, 0),
        ],
    };
    let mut o = quiet();
    o.completions = vec![sent(2, 0, 10)];
    o.answers = Some(vec![request(&c, Opcode::UC_SEND_ONLY, 0, 10, None)]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    o.completions = vec![send(1, sender::WC_LOC_QP_OP_ERR), send(2, WC_WR_FLUSH_ERR)];
    o.answers = Some(Vec::new());
    o.qp_state = QpState::Sqe;
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // ... not RTS, not Error.
    o.qp_state = QpState::Rts;
    assert_eq!(broken(&c, &k, &o), [rules::QP_STATE.id]);
    // A READ on UC completing successfully.
    o.qp_state = QpState::Rts;
    o.completions = vec![sent(1, 2, 10), sent(2, 0, 10)];
    o.answers = Some(vec![request(&c, Opcode::UC_SEND_ONLY, 0, 10, None)]);
    assert!(!broken(&c, &k, &o).is_empty());
}

/// Posts on a UD QP: a SEND is one datagram from the QP, completed with
/// its length; a WRITE is refused or fails locally.
#[test]
fn ud_posts_are_judged() {
    let c = conn(QpType::Ud);
    let k = Case {
        steps: vec![
            uc_post(1, PostOp::Send, 10, 0),
            uc_post(2, PostOp::Send, 0, 0),
        ],
    };
    let mut o = quiet();
    o.completions = vec![sent(1, 0, 10), sent(2, 0, 0)];
    o.answers = Some(vec![
        request(&c, Opcode::UD_SEND_ONLY, 0, 10, None),
        request(&c, Opcode::UD_SEND_ONLY, 1, 0, None),
    ]);
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
    // Another source QP in the DETH.
    let mut p = PacketSpec::response(Opcode::UD_SEND_ONLY, 1);
    p.dest = crate::case::Dest::Raw(c.fuzzer_qpn);
    p.deth = Some((None, 0x99));
    o.answers = Some(vec![
        request(&c, Opcode::UD_SEND_ONLY, 0, 10, None),
        p.emit(&c).expect("emits"),
    ]);
    assert_eq!(broken(&c, &k, &o), [rules::UD.id]);
    // Not sent at all, though completed.
    o.answers = Some(Vec::new());
    assert_eq!(broken(&c, &k, &o), [rules::UD.id]);
    // A WRITE on UD completing successfully.
    let k = Case {
        steps: vec![uc_post(1, PostOp::Write, 10, 0)],
    };
    o.completions = vec![sent(1, 1, 10)];
    assert!(!broken(&c, &k, &o).is_empty());
    o.completions = vec![send(1, sender::WC_LOC_QP_OP_ERR)];
    o.qp_state = QpState::Sqe;
    assert_eq!(broken(&c, &k, &o), [] as [&str; 0]);
}

/// On the sim target, UC and UD posts get a verdict, and uroce's is
/// legal: what it sends and how the posts complete.
#[test]
fn sim_uc_and_ud_posts_are_judged_legal() {
    for (qp_type, steps) in [
        (
            QpType::Uc,
            vec![
                uc_post(0x100, PostOp::Send, 10, 0),
                uc_post(0x101, PostOp::Write, 2500, 100),
                uc_post(0x102, PostOp::Send, 0, 0),
            ],
        ),
        (
            QpType::Uc,
            vec![
                uc_post(0x100, PostOp::Send, 10, 0),
                uc_post(0x101, PostOp::FetchAdd, 8, 0),
                uc_post(0x102, PostOp::Write, 10, 0),
            ],
        ),
        (QpType::Uc, vec![uc_post(0x100, PostOp::Write, 100, 4090)]),
        (
            QpType::Ud,
            vec![
                uc_post(0x100, PostOp::Send, 10, 0),
                uc_post(0x101, PostOp::Send, 1000, 8),
                uc_post(0x102, PostOp::Read, 10, 0),
                uc_post(0x103, PostOp::Send, 10, 0),
            ],
        ),
        (QpType::Ud, vec![uc_post(0x100, PostOp::Send, 2000, 0)]),
    ] {
        let mut steps = steps;
        steps.push(Step::Wait(100));
        let input = crate::input::FuzzInput {
            seed: 5,
            qp_type,
            recvs: 1,
            case: Case { steps },
        };
        let out = input.run().expect("sim");
        assert!(out.violations.is_empty(), "{:#?}", out.violations);
        let v = judge(&out.conn, &input.case, &out.obs);
        assert!(matches!(v, Verdict::Legal), "{input:?}: {v:?}");
        assert!(
            out.obs.completions.iter().any(|c| !c.recv),
            "{:?}",
            out.obs.completions
        );
    }
}

/// IBA 1.5's placement operations on a device that does not announce
/// them (rxe 6.1; `Conn::ops_1_5`): their opcodes are reserved for it,
/// so a FLUSH or ATOMIC WRITE may be dropped (no answer, the expected
/// PSN unmoved) or refused as an invalid request. On a device that
/// announces them the same silence is a finding.
#[test]
fn placement_operations_a_device_lacks_are_reserved_opcodes() {
    let lacks = Conn {
        ops_1_5: Some(0),
        ..flush_conn()
    };
    let has = Conn {
        ops_1_5: Some(crate::target::OPS_FLUSH | crate::target::OPS_ATOMIC_WRITE),
        ..flush_conn()
    };
    let mut aw = PacketSpec::new(Opcode::RC_ATOMIC_WRITE, 0);
    aw.reth = Some((64, Key::Valid, 8));
    aw.payload = (8, 7);
    for k in [case(vec![flush(1, 0, 64, Key::Valid, 128)]), case(vec![aw])] {
        // Dropped, or an invalid request.
        assert_eq!(broken(&lacks, &k, &quiet()), [] as [&str; 0]);
        assert_eq!(broken(&lacks, &k, &failed(&lacks, 0x61)), [] as [&str; 0]);
        // Executed where it is reserved: the bytes of an ATOMIC WRITE.
        assert!(!broken(&has, &k, &quiet()).is_empty());
    }
    // A request after it at the next PSN: a sequence error (the dropped
    // one did not move the expected PSN).
    let mut send = PacketSpec::new(Opcode::RC_SEND_ONLY, 1);
    send.payload = (8, 1);
    let k = case(vec![flush(1, 0, 64, Key::Valid, 128), send]);
    let mut o = quiet();
    o.answers = Some(vec![answer(&lacks, Opcode::RC_ACKNOWLEDGE, 0, 0x60, 0)]);
    assert_eq!(broken(&lacks, &k, &o), [] as [&str; 0]);
}
