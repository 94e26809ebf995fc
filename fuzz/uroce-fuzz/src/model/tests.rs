//! The model's rules, case by case, and a survey of its verdicts on
//! uroce's own QP machines.

use super::*;
use crate::gen::{Generator, Mode};
use crate::sim::SimTarget;
use std::collections::BTreeMap;

/// Runs `n` cases of each mode and transport on the sim target and
/// prints the model's verdicts (`UROCE_MODEL_SURVEY=N`).
#[test]
#[ignore = "a survey, run by hand"]
fn survey() {
    let n: u64 = std::env::var("UROCE_MODEL_SURVEY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for qp in [QpType::Rc, QpType::Uc, QpType::Ud] {
        let modes: &[Mode] = match qp {
            QpType::Rc => &[Mode::Fields, Mode::Sequence, Mode::Responder],
            _ => &[Mode::Fields, Mode::Sequence],
        };
        for &mode in modes {
            let mut t = SimTarget::new(1, None);
            let gen = Generator::new(7, mode);
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

#[test]
#[ignore = "probe"]
fn probe_read_order() {
    use crate::case::{PacketSpec, Post, PostOp, Step};
    use uroce_wire::Opcode;
    let mut t = SimTarget::new(1, None);
    let resp = |op, psn: i32, len: u16| {
        let mut a = PacketSpec::response(op, psn);
        a.aeth = Some((0x1f, 1));
        a.payload = (len, 0x55);
        Step::Packet(a)
    };
    for order in [[1, 0, 2], [0, 2, 1], [0, 1, 2], [2, 1, 0]] {
        let mut steps = vec![
            Step::Post(Post {
                wr_id: 1,
                op: PostOp::Read,
                len: 2100,
                local_off: 0,
                remote_va: 0x1000,
                rkey: 0x4242,
                swap_add: 0,
                compare: 0,
            }),
            Step::Wait(1000),
        ];
        for i in order {
            let (op, len) = match i {
                0 => (Opcode::RC_RDMA_READ_RESPONSE_FIRST, 1024),
                1 => (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, 1024),
                _ => (Opcode::RC_RDMA_READ_RESPONSE_LAST, 52),
            };
            steps.push(resp(op, i, len));
        }
        steps.push(Step::Wait(5000));
        let case = crate::case::Case { steps };
        let out = crate::run_case(&mut t, QpType::Rc, 8, &case).expect("sim");
        let sent: Vec<String> = out
            .packets
            .iter()
            .filter(|p| !p.sent)
            .filter_map(|p| uroce_wire::packet::parse(&p.bytes).ok())
            .map(|k| format!("{} {:#x}", k.info.name, k.bth.psn.value() - out.conn.sq_psn))
            .collect();
        println!(
            "{order:?}: {:?} {:?} sent {sent:?}",
            out.obs.completions, out.obs.qp_state
        );
    }
}
