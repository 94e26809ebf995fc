//! `IP_TOS` on a stream rsocket reaches its CM id (as rsocket.c's
//! `rdma_set_option(RDMA_OPTION_ID_TOS)`), and the CM's REQ leaves with
//! it: a plain UDP socket with `IP_RECVTOS` stands where the peer
//! device's RoCE port would be and reads the REQ's IP TOS.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use uroce_rdmacm::rsocket::RSocket;

// The verbs crate's test set-up: its datagram reader with IP fields.
#[path = "../../../tests/common/mod.rs"]
mod common;
use common::{recv_datagram, report_ip_field};

const PEER: &str = "127.111.7.1";
const OURS: &str = "127.111.7.2";

/// One datagram's IP TOS (`IP_RECVTOS`), if one comes within `within`.
fn recv_tos(sock: &UdpSocket, within: Duration) -> Option<u8> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        match recv_datagram(sock, libc::MSG_DONTWAIT) {
            Some(d) => return d.tos,
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    None
}

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rtos={OURS}")
}

#[test]
fn ip_tos_reaches_the_cm_req() {
    crate::init();
    let peer = UdpSocket::bind(SocketAddr::new(PEER.parse().unwrap(), 4791)).unwrap();
    report_ip_field(&peer, libc::IP_RECVTOS);

    let s = RSocket::new().unwrap();
    s.set_tos(0xb8);
    assert_eq!(s.tos(), 0xb8);
    assert_eq!(s.cm_id().tos(), 0xb8, "IP_TOS reached the CM id");
    s.set_nonblocking(true);
    let dst = SocketAddr::new(PEER.parse().unwrap(), 20110);
    let end = Instant::now() + Duration::from_secs(10);
    let mut tos = None;
    while tos.is_none() && Instant::now() < end {
        // Each call takes the connect a step further (address, route,
        // REQ); no REP ever comes.
        match s.connect(dst) {
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) if e.raw_os_error() == Some(libc::EALREADY) => {}
            r => panic!("connect: {r:?}"),
        }
        tos = recv_tos(&peer, Duration::from_millis(50));
    }
    assert_eq!(tos, Some(0xb8), "the REQ's IP TOS");
    s.close();
}
