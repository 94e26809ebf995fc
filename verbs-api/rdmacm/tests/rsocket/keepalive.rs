//! rsocket keepalive (`SO_KEEPALIVE`, `TCP_KEEPIDLE`), as rsocket.c's
//! tcp_svc: an idle connected socket sends nothing until keepalive is
//! on, then one control message every `TCP_KEEPIDLE` seconds; the peer
//! takes them silently and the stream goes on.

use std::net::SocketAddr;
use std::time::Duration;
use uroce_rdmacm::rsocket::RSocket;

const SERVER: &str = "127.107.4.1";
const CLIENT: &str = "127.107.4.2";

fn sent(s: &RSocket) -> u64 {
    s.cm_id().context().expect("a device").counters().sent_pkts
}

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rka1={SERVER},rka2={CLIENT}")
}

#[test]
fn keepalives_go_out_while_idle() {
    crate::init();
    let port = 19704;
    let listener = RSocket::new().unwrap();
    listener
        .bind(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    listener.listen(1).unwrap();
    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        let mut b = [0u8; 3];
        let mut got = 0;
        while got < 3 {
            got += s.recv(&mut b[got..], 0).unwrap();
        }
        assert_eq!(&b, b"end", "keepalives are not data");
        s.close();
        listener.close();
    });

    let c = RSocket::new().unwrap();
    c.bind(SocketAddr::new(CLIENT.parse().unwrap(), 0)).unwrap();
    c.connect(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    // The connection's last packets (the CM's RTU, the first credit
    // update) leave just after connect returns: let them go first.
    std::thread::sleep(Duration::from_millis(1000));
    let idle = sent(&c);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sent(&c), idle, "an idle socket without keepalive is silent");

    c.set_keepalive_time(1);
    assert_eq!(c.keepalive_time(), 1);
    c.set_keepalive(true);
    assert!(c.flag(0, libc::SO_KEEPALIVE as u32));
    std::thread::sleep(Duration::from_millis(2600));
    let n = sent(&c) - idle;
    // Two keepalives are due (at 1 s and 2 s); each is one packet.
    assert!((2..=3).contains(&n), "{n} packets in 2.6 s");

    c.set_keepalive(false);
    // Let the completions of those sends be taken and a late one pass.
    std::thread::sleep(Duration::from_millis(1100));
    let off = sent(&c);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sent(&c), off, "silent again once keepalive is off");
    assert_eq!(c.send(b"end", 0).unwrap(), 3);
    server.join().unwrap();
    c.close();
}
