//! Many QPs over real UDP on loopback: four client devices with 250 RC
//! QPs each write into one server device's 1,000 QPs at once, an incast
//! that overflowed the server's socket and ran QPs out of retries before
//! the engine had a response to congestion. Every WRITE must complete and
//! every byte arrive; the counters show what the congestion cost.

use std::time::Duration;
use uroce_verbs::*;

const CLIENTS: usize = 4;
const PER_CLIENT: usize = 250;
const MSGS: usize = 8;
const LEN: usize = 8192;

fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

#[test]
fn four_clients_times_250_qps_into_one_server() {
    let server_ip = "127.10.11.1";
    let server = Device::new("srv", server_ip.parse().unwrap())
        .open()
        .unwrap();
    let spd = server.alloc_pd().unwrap();
    let scq = server.create_cq(4096).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let n = CLIENTS * PER_CLIENT;
    let dst = spd.alloc_mr(n * MSGS * LEN, access).unwrap();
    let params = uroce_verbs::loopback::RcParams {
        mtu: Mtu::Mtu4096,
        rd_atomic: 1,
        timeout: 14,
    };
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let ip = format!("127.10.11.{}", c + 2);
        let ctx = Device::new("cli", ip.parse().unwrap()).open().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(4096).unwrap();
        let src = pd.alloc_mr(LEN, access).unwrap();
        src.write(0, &vec![c as u8 + 1; LEN]).unwrap();
        let mut qps = Vec::new();
        for _ in 0..PER_CLIENT {
            let qp = pd
                .create_qp(&QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: cap(),
                    qp_type: QpType::Rc,
                    sq_sig_all: true,
                    srq: None,
                })
                .unwrap();
            let sqp = spd
                .create_qp(&QpInitAttr {
                    send_cq: &scq,
                    recv_cq: &scq,
                    cap: cap(),
                    qp_type: QpType::Rc,
                    sq_sig_all: true,
                    srq: None,
                })
                .unwrap();
            let connect = uroce_verbs::loopback::connect_rc;
            connect(&qp, server_ip.parse().unwrap(), sqp.qp_num(), 1, 2, params).unwrap();
            connect(&sqp, ip.parse().unwrap(), qp.qp_num(), 2, 1, params).unwrap();
            qps.push((qp, sqp));
        }
        clients.push((ctx, pd, cq, src, qps));
    }
    // Every QP posts all its WRITEs at once: 1,000 QPs x 8 x 8 KiB.
    for (c, (_, _, _, src, qps)) in clients.iter().enumerate() {
        for (i, (qp, _)) in qps.iter().enumerate() {
            let slot = (c * PER_CLIENT + i) * MSGS;
            let wrs: Vec<SendWr> = (0..MSGS)
                .map(|m| {
                    let mut w = SendWr::new(m as u64, WrOpcode::RdmaWrite);
                    w.sg_list = [src.sge(0, LEN as u32)].into_iter().collect();
                    w.remote_addr = dst.addr() + ((slot + m) * LEN) as u64;
                    w.rkey = dst.rkey();
                    w
                })
                .collect();
            qp.post_send(&wrs).unwrap();
        }
    }
    for (c, (ctx, _, cq, _, _)) in clients.iter().enumerate() {
        let wcs = cq.wait(PER_CLIENT * MSGS, Duration::from_secs(120));
        assert_eq!(wcs.len(), PER_CLIENT * MSGS, "client {c}: completions");
        if let Some(bad) = wcs.iter().find(|w| w.status != WcStatus::Success) {
            panic!(
                "client {c}: {:?}; counters {:?}",
                bad.status,
                ctx.counters()
            );
        }
    }
    let got = dst.to_vec(0, n * MSGS * LEN).unwrap();
    for (q, chunk) in got.chunks(MSGS * LEN).enumerate() {
        let want = (q / PER_CLIENT) as u8 + 1;
        assert!(chunk.iter().all(|&b| b == want), "QP {q}'s data");
    }
    let s = server.counters();
    let retrans: u64 = clients.iter().map(|c| c.0.counters().retransmits).sum();
    eprintln!(
        "incast: server received {} packets, socket drops {}, GRO aggregates {}; clients resent {retrans}",
        s.rcvd_pkts, s.rx_socket_drops, s.rx_gro_msgs
    );
}
