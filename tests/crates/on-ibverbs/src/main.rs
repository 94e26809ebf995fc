//! Two processes, one RC connection, through the `ibverbs` crate's public
//! API only (rust-ibverbs 0.9: devices, contexts, CQs, PDs, memory
//! regions, `QueuePairBuilder::handshake`, SEND and RECV; its safe API
//! has no RDMA WRITE or READ).
//!
//! The QP uses GID index 1, as programs written for kernel rxe (and the
//! crate's own `loopback` example) do. Messages of growing sizes, up to
//! several MTUs, go from the client to the server and back; every byte is
//! checked on both sides.
//!
//! Usage: `on-ibverbs server ADDR:PORT` / `on-ibverbs client ADDR:PORT`
//! (a TCP address for exchanging the QP endpoints), with `UROCE_DEVICES`
//! naming one device per process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

const SIZES: &[usize] = &[1, 7, 64, 1000, 1024, 4096, 4097, 10_000, 65_536];
const MAX: usize = 65_536;
const ROUNDS: usize = 3;
const SEND_WR: u64 = 1;
const RECV_WR: u64 = 2;

fn pattern(round: usize, size: usize, from_server: bool) -> impl Iterator<Item = u8> {
    let salt = if from_server { 0x5a } else { 0xa5 };
    (0..size).map(move |i| (i.wrapping_mul(31) ^ round.wrapping_mul(7) ^ size ^ salt) as u8)
}

fn fail(msg: String) -> ! {
    eprintln!("on-ibverbs: {msg}");
    std::process::exit(1)
}

fn send_msg(s: &mut TcpStream, bytes: &[u8]) {
    let n = (bytes.len() as u32).to_be_bytes();
    s.write_all(&n)
        .and_then(|_| s.write_all(bytes))
        .unwrap_or_else(|e| fail(format!("tcp: {e}")));
}

fn recv_msg(s: &mut TcpStream) -> Vec<u8> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)
        .unwrap_or_else(|e| fail(format!("tcp: {e}")));
    let mut v = vec![0u8; u32::from_be_bytes(n) as usize];
    s.read_exact(&mut v)
        .unwrap_or_else(|e| fail(format!("tcp: {e}")));
    v
}

/// Completions polled but not yet waited for (a RECV may complete before
/// the SEND whose ACK the peer sends later).
#[derive(Default)]
struct Waiter {
    early: Vec<(u64, usize)>,
}

impl Waiter {
    /// Waits for `wr_id`'s completion; checks its status; returns its length.
    fn wait(&mut self, cq: &ibverbs::CompletionQueue<'_>, wr_id: u64) -> usize {
        if let Some(i) = self.early.iter().position(|&(id, _)| id == wr_id) {
            return self.early.remove(i).1;
        }
        let t0 = Instant::now();
        let mut wc = [ibverbs::ibv_wc::default(); 4];
        loop {
            let done = cq
                .poll(&mut wc)
                .unwrap_or_else(|e| fail(format!("poll: {e}")));
            for c in done.iter() {
                if let Some((status, vendor)) = c.error() {
                    fail(format!(
                        "wr {} completed with status {status} ({vendor})",
                        c.wr_id()
                    ));
                }
                self.early.push((c.wr_id(), c.len()));
            }
            if let Some(i) = self.early.iter().position(|&(id, _)| id == wr_id) {
                return self.early.remove(i).1;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                fail(format!("no completion for wr {wr_id} in 20 s"));
            }
            std::thread::yield_now();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 || (args[1] != "server" && args[1] != "client") {
        fail("usage: on-ibverbs server|client ADDR:PORT".into());
    }
    let server = args[1] == "server";
    let mut tcp = if server {
        let l = TcpListener::bind(&args[2]).unwrap_or_else(|e| fail(format!("listen: {e}")));
        l.accept()
            .unwrap_or_else(|e| fail(format!("accept: {e}")))
            .0
    } else {
        let t0 = Instant::now();
        loop {
            match TcpStream::connect(&args[2]) {
                Ok(s) => break s,
                Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => fail(format!("connect: {e}")),
            }
        }
    };

    let devices = ibverbs::devices().unwrap_or_else(|e| fail(format!("devices: {e}")));
    let dev = devices
        .iter()
        .next()
        .unwrap_or_else(|| fail("no RDMA device".into()));
    let ctx = dev.open().unwrap_or_else(|e| fail(format!("open: {e}")));
    // Code written for rxe finds the RoCEv2 GID at index 1.
    let gids = ctx.gid_table();
    if gids.len() < 2 || gids[1].gid != gids[0].gid || gids[1].ndev_ifindex == 0 {
        fail(format!("GID table: {gids:?}"));
    }
    let cq = ctx
        .create_cq(64, 0)
        .unwrap_or_else(|e| fail(format!("create_cq: {e}")));
    let pd = ctx
        .alloc_pd()
        .unwrap_or_else(|e| fail(format!("alloc_pd: {e}")));
    let prepared = pd
        .create_qp(&cq, &cq, ibverbs::ibv_qp_type::IBV_QPT_RC)
        .set_gid_index(1)
        .build()
        .unwrap_or_else(|e| fail(format!("create_qp: {e}")));
    let mine = prepared.endpoint();
    send_msg(&mut tcp, &bincode::serialize(&mine).unwrap());
    let theirs: ibverbs::QueuePairEndpoint = bincode::deserialize(&recv_msg(&mut tcp))
        .unwrap_or_else(|e| fail(format!("endpoint: {e}")));
    let mut qp = prepared
        .handshake(theirs)
        .unwrap_or_else(|e| fail(format!("handshake: {e}")));
    let mut tx = pd
        .allocate::<u8>(MAX)
        .unwrap_or_else(|e| fail(format!("reg tx: {e}")));
    let mut rx = pd
        .allocate::<u8>(MAX)
        .unwrap_or_else(|e| fail(format!("reg rx: {e}")));

    // SAFETY (both posts below): the regions outlive the QP's use of them;
    // each is waited for before it is touched again.
    unsafe { qp.post_receive(&mut rx, .., RECV_WR) }
        .unwrap_or_else(|e| fail(format!("post_recv: {e}")));
    // Both sides have a receive posted before either sends.
    send_msg(&mut tcp, b"ready");
    recv_msg(&mut tcp);

    let mut bytes = 0usize;
    let mut w = Waiter::default();
    for round in 0..ROUNDS {
        for &size in SIZES {
            if !server {
                for (d, s) in tx[..size].iter_mut().zip(pattern(round, size, false)) {
                    *d = s;
                }
                unsafe { qp.post_send(&mut tx, ..size, SEND_WR) }
                    .unwrap_or_else(|e| fail(format!("post_send: {e}")));
                w.wait(&cq, SEND_WR);
            }
            let got = w.wait(&cq, RECV_WR);
            let want_from_server = !server;
            if got != size
                || !rx[..size]
                    .iter()
                    .copied()
                    .eq(pattern(round, size, want_from_server))
            {
                fail(format!(
                    "round {round} size {size}: received {got} bytes, not the pattern"
                ));
            }
            bytes += size;
            unsafe { qp.post_receive(&mut rx, .., RECV_WR) }
                .unwrap_or_else(|e| fail(format!("post_recv: {e}")));
            if server {
                for (d, s) in tx[..size].iter_mut().zip(pattern(round, size, true)) {
                    *d = s;
                }
                unsafe { qp.post_send(&mut tx, ..size, SEND_WR) }
                    .unwrap_or_else(|e| fail(format!("post_send: {e}")));
                w.wait(&cq, SEND_WR);
            }
        }
    }
    // Neither side tears down while the other may still be sending.
    send_msg(&mut tcp, b"done");
    recv_msg(&mut tcp);
    println!(
        "on-ibverbs {}: {} messages, {bytes} bytes received and checked, GID index 1",
        args[1],
        ROUNDS * SIZES.len()
    );
}
