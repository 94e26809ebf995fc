//! RC ping-pong on uroce's Rust API: two devices on loopback addresses, a
//! server and a client thread, endpoints swapped over a channel (two
//! programs would swap the same 24 bytes over TCP), then messages back and
//! forth, each checked.
//!
//! ```text
//! cargo run --example rc_pingpong
//! ```

use std::sync::mpsc;
use std::time::Duration;
use uroce_verbs::{Device, Endpoint, RecvWr, SendWr, WcStatus, WrOpcode};

const ROUNDS: u32 = 1000;
const SIZE: usize = 4096;

fn side(
    ip: &str,
    me: mpsc::Sender<[u8; Endpoint::LEN]>,
    peer: mpsc::Receiver<[u8; Endpoint::LEN]>,
    serve: bool,
) -> uroce_verbs::Result<()> {
    let ctx = Device::new("pp", ip.parse().unwrap()).open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.cq_builder().build()?;
    let qp = pd.qp_builder(&cq).build()?;
    let mr = pd.alloc_mr(2 * SIZE, uroce_verbs::Access::LOCAL_WRITE)?;
    let recv = RecvWr {
        wr_id: 1,
        sg_list: [mr.sge(SIZE, SIZE as u32)].into_iter().collect(),
    };
    me.send(qp.endpoint().to_bytes()).unwrap();
    let remote = Endpoint::from_bytes(&peer.recv().unwrap())?;
    qp.connect(&remote)?;
    println!("{ip}: {} connected to {remote}", qp.endpoint());
    // A receive is posted on both sides before either sends (a send
    // finding none would wait out RNR NAKs instead).
    qp.post_recv(std::slice::from_ref(&recv))
        .map_err(|(_, e)| e)?;
    me.send([0; Endpoint::LEN]).unwrap();
    peer.recv().unwrap();

    let mut send = SendWr::new(2, WrOpcode::Send);
    send.flags = uroce_verbs::SendFlags::SIGNALED;
    send.sg_list = [mr.sge(0, SIZE as u32)].into_iter().collect();
    let mut payload = vec![0u8; SIZE];
    for round in 0..ROUNDS {
        // The client speaks first; the server answers what it got.
        if !serve {
            payload.fill(round as u8);
            mr.write(0, &payload).unwrap();
            qp.post_send(std::slice::from_ref(&send))
                .map_err(|(_, e)| e)?;
        }
        for wc in cq.wait(if serve { 1 } else { 2 }, Duration::from_secs(10)) {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.wr_id == 1 {
                let got = mr.to_vec(SIZE, SIZE).unwrap();
                assert!(
                    got.iter().all(|&b| b == round as u8),
                    "round {round}: wrong bytes"
                );
                qp.post_recv(std::slice::from_ref(&recv))
                    .map_err(|(_, e)| e)?;
            }
        }
        if serve {
            mr.write(0, &mr.to_vec(SIZE, SIZE).unwrap()).unwrap();
            qp.post_send(std::slice::from_ref(&send))
                .map_err(|(_, e)| e)?;
            let wc = cq.wait(1, Duration::from_secs(10));
            assert!(wc.len() == 1 && wc[0].status == WcStatus::Success, "{wc:?}");
        }
    }
    println!("{ip}: {ROUNDS} rounds of {SIZE} bytes, every byte checked");
    Ok(())
}

fn main() {
    let (to_client, from_server) = mpsc::channel();
    let (to_server, from_client) = mpsc::channel();
    let server = std::thread::spawn(move || side("127.80.1.1", to_client, from_client, true));
    let client = side("127.80.1.2", to_server, from_server, false);
    client.expect("client");
    server.join().unwrap().expect("server");
}
