//! `UROCE_TRACE`: a lossy RC pair over real UDP on loopback writes a
//! Chrome trace whose WR spans, packets, retransmissions, RNR waits and
//! state changes are all there and well-formed. Its own test binary: the
//! trace is per process and opened with the first device.

mod common;

use common::T;
use serde_json::Value;
use std::collections::HashMap;
use uroce_verbs::*;

const A: &str = "127.120.0.1";
const B: &str = "127.120.0.2";
const MSGS: u64 = 40;
const LEN: u32 = 3000;

fn end(ip: &str) -> (Context, ProtectionDomain, CompletionQueue, QueuePair) {
    let ctx = common::open(ip);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let qp = common::qp(&pd, &cq, QpType::Rc, None);
    (ctx, pd, cq, qp)
}

fn send(id: u64, mr: &MemoryRegion) -> SendWr {
    let mut w = SendWr::new(id, WrOpcode::Send);
    w.flags = SendFlags::SIGNALED;
    w.sg_list = [mr.sge(0, LEN)].into_iter().collect();
    w
}

/// The trace's events, the file checked to be a JSON array whose closing
/// bracket is there (the writer closed it) or missing (a process that
/// died): both are the format.
fn load(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.starts_with("[\n"), "{}", &text[..text.len().min(200)]);
    let whole = if text.trim_end().ends_with(']') {
        text
    } else {
        text + "]"
    };
    serde_json::from_str(&whole).expect("the trace is a JSON array")
}

#[test]
fn a_lossy_rc_pair_leaves_a_well_formed_timeline() {
    let path = std::env::temp_dir().join(format!("uroce-trace-{}.json", std::process::id()));
    std::env::set_var("UROCE_TRACE", &path);
    let (a_ctx, a_pd, a_cq, a_qp) = end(A);
    let (_b_ctx, b_pd, b_cq, b_qp) = end(B);
    assert!(uroce_provider::trace::on(), "tracing is on");
    let p = loopback::RcParams::default();
    loopback::connect_rc(&a_qp, B.parse().unwrap(), b_qp.qp_num(), 1, 2, p).unwrap();
    loopback::connect_rc(&b_qp, A.parse().unwrap(), a_qp.qp_num(), 2, 1, p).unwrap();
    a_ctx
        .set_faults(Some(Faults {
            loss: 0.15,
            seed: 27,
            ..Faults::default()
        }))
        .unwrap();
    let src = a_pd.alloc_mr(LEN as usize, Access::LOCAL_WRITE).unwrap();
    let dst = b_pd
        .alloc_mr(LEN as usize * 8, Access::LOCAL_WRITE)
        .unwrap();

    // A SEND with no receive posted: RNR NAKs until one is.
    a_qp.post_send(&[send(1000, &src)]).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    b_qp.post_recv(&[common::recv(2000, &dst, 0, LEN)]).unwrap();
    assert_eq!(a_cq.wait(1, T)[0].status, WcStatus::Success);
    assert_eq!(b_cq.wait(1, T)[0].status, WcStatus::Success);

    // Then a stream through the lossy link, 8 in flight.
    let mut done = 0;
    for i in 0..MSGS {
        let off = (i % 8) as usize * LEN as usize;
        b_qp.post_recv(&[common::recv(2001 + i, &dst, off, LEN)])
            .unwrap();
        a_qp.post_send(&[send(1001 + i, &src)]).unwrap();
        if i >= 7 {
            let wc = a_cq.wait(1, T);
            assert_eq!(wc[0].status, WcStatus::Success);
            done += 1;
        }
    }
    while done < MSGS {
        assert_eq!(a_cq.wait(1, T)[0].status, WcStatus::Success);
        done += 1;
    }
    assert_eq!(b_cq.wait(MSGS as usize, T).len(), MSGS as usize);
    // Receives nobody answers, then the QP destroyed under them.
    for i in 0..3 {
        b_qp.post_recv(&[common::recv(3000 + i, &dst, 0, LEN)])
            .unwrap();
    }
    let lost = a_ctx.counters();
    let (qa, qb) = (a_qp.qp_num(), b_qp.qp_num());
    // The devices close: their QPs' events are in the file.
    drop((a_qp, b_qp, a_cq, b_cq, src, dst, a_pd, b_pd, a_ctx, _b_ctx));

    let ev = load(&path);
    let _ = std::fs::remove_file(&path);
    let pid = u64::from(std::process::id());
    for e in &ev {
        assert_eq!(e["pid"], pid, "{e}");
        let ph = e["ph"].as_str().unwrap();
        assert!(["M", "i", "b", "e", "X"].contains(&ph), "{e}");
        if ph != "M" {
            assert!(e["ts"].as_f64().unwrap() > 0.0, "{e}");
            assert!(e["tid"].as_u64().is_some(), "{e}");
        }
    }
    let named = |tid: u32| {
        ev.iter().any(|e| {
            e["ph"] == "M"
                && e["name"] == "thread_name"
                && e["tid"] == u64::from(tid)
                && e["args"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("RC QP {tid:#08x}"))
        })
    };
    assert!(named(qa) && named(qb), "one named track per QP");

    // State changes on both QPs, in order.
    for q in [qa, qb] {
        let states: Vec<&str> = ev
            .iter()
            .filter(|e| {
                e["tid"] == u64::from(q) && e["name"].as_str().unwrap().starts_with("state ")
            })
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            &states[..3],
            ["state RESET->INIT", "state INIT->RTR", "state RTR->RTS"],
            "QP {q:#x}"
        );
    }

    // Every WR a span: a `b` and an `e` with the same ID, on its QP's
    // track, ending after it began.
    let mut open: HashMap<&str, &Value> = HashMap::new();
    let mut spans = Vec::new();
    for e in ev.iter().filter(|e| e["cat"] == "wr") {
        let id = e["id2"]["local"].as_str().unwrap();
        match e["ph"].as_str().unwrap() {
            "b" => assert!(open.insert(id, e).is_none(), "span {id} begun twice"),
            "e" => {
                let b = open.remove(id).expect("an end has its begin");
                assert_eq!(
                    (b["tid"].clone(), b["name"].clone()),
                    (e["tid"].clone(), e["name"].clone())
                );
                assert!(e["ts"].as_f64().unwrap() >= b["ts"].as_f64().unwrap());
                spans.push((b, e));
            }
            _ => panic!("{e}"),
        }
    }
    assert!(open.is_empty(), "every span ends");
    let sends: Vec<_> = spans
        .iter()
        .filter(|(b, _)| b["tid"] == u64::from(qa) && b["name"] == "SEND")
        .collect();
    let recvs: Vec<_> = spans
        .iter()
        .filter(|(b, _)| b["tid"] == u64::from(qb) && b["name"] == "RECV")
        .collect();
    assert_eq!(
        (sends.len() as u64, recvs.len() as u64),
        (MSGS + 1, MSGS + 4)
    );
    type Span<'a> = &'a (&'a Value, &'a Value);
    let (gone, recvs): (Vec<Span>, Vec<Span>) = recvs
        .into_iter()
        .partition(|(b, _)| b["args"]["wr_id"].as_u64().unwrap() >= 3000);
    assert_eq!(gone.len(), 3);
    for (_, e) in &gone {
        assert_eq!(e["args"]["status"], "destroyed", "{e}");
    }
    for (b, e) in sends.iter().chain(&recvs) {
        assert_eq!(b["args"]["length"], u64::from(LEN));
        assert_eq!(e["args"]["status"], "success");
        assert!(b["args"]["wr_id"].as_u64().unwrap() >= 1000);
    }
    let first = sends
        .iter()
        .find(|(b, _)| b["args"]["wr_id"] == 1000)
        .unwrap();
    let waited = first.1["ts"].as_f64().unwrap() - first.0["ts"].as_f64().unwrap();
    assert!(
        waited >= 15_000.0,
        "the RNR'd SEND's span covers the wait: {waited} us"
    );

    // Packets, ACKs, losses, retransmissions and the RNR wait.
    let count = |tid: u32, name: &str| {
        ev.iter()
            .filter(|e| e["tid"] == u64::from(tid) && e["name"] == name)
            .count()
    };
    assert!(count(qa, "tx RC_SEND_FIRST") >= MSGS as usize);
    assert!(count(qb, "rx RC_SEND_LAST") >= MSGS as usize);
    assert!(
        count(qa, "lost RC_SEND_MIDDLE")
            + count(qa, "lost RC_SEND_FIRST")
            + count(qa, "lost RC_SEND_LAST")
            > 0
    );
    let acks: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"] == u64::from(qa) && e["name"] == "rx RC_ACKNOWLEDGE")
        .collect();
    assert!(acks
        .iter()
        .any(|e| e["args"]["syndrome"].as_str().unwrap().starts_with("ACK")));
    assert!(acks.iter().any(|e| e["args"]["syndrome"]
        .as_str()
        .unwrap()
        .starts_with("RNR NAK")));
    let retx: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"] == u64::from(qa) && e["name"] == "retransmit")
        .collect();
    assert!(!retx.is_empty(), "counters: {lost:?}");
    for r in &retx {
        assert!(r["args"]["psn"].as_u64().is_some());
        let why = r["args"]["why"].as_str().unwrap();
        assert!(
            why == "ACK timeout" || why == "PSN sequence error NAK",
            "{why}"
        );
    }
    let rnr: Vec<_> = ev
        .iter()
        .filter(|e| e["tid"] == u64::from(qa) && e["name"] == "RNR wait")
        .collect();
    assert!(!rnr.is_empty());
    assert_eq!(rnr[0]["ph"], "X");
    assert!(rnr[0]["dur"].as_f64().unwrap() > 0.0);
}
