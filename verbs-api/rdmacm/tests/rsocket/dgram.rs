//! Datagram rsockets (rsocket.c's `ds_*`): the first datagram to a peer
//! goes over UDP with a `ds_udp_header`, the answer carries the peer's
//! QPN, and the datagrams after it go over UD (counted by the devices),
//! each delivered whole with its sender's address.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use uroce_rdmacm::rsocket_dgram::DSocket;

const SERVER: &str = "127.111.5.1";
const CLIENT: &str = "127.111.5.2";

/// A datagram within 10 s (a lost one fails the test, not hangs it).
fn recv(s: &DSocket, b: &mut [u8]) -> (usize, SocketAddr) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        match s.recv_from(b, libc::MSG_DONTWAIT) {
            Ok(r) => return r,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && Instant::now() < end => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => panic!("no datagram: {e}"),
        }
    }
}

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rds1={SERVER},rds2={CLIENT}")
}

/// The server's socket is bound to its device's address in 127/8: its
/// UD QP is on that device (rsocket.c's `rs_any_addr` takes only
/// 127.0.0.1 for "any"), so its answer leaves from the server's device
/// and reaches the client's.
#[test]
fn datagrams_over_udp_then_ud() {
    crate::init();
    let port = 20105;
    let server = DSocket::new(false).unwrap();
    let saddr = SocketAddr::new(SERVER.parse().unwrap(), port);
    server.bind(saddr).unwrap();
    let mut b = [0u8; 2048];
    server.set_nonblocking(true);
    assert_eq!(
        server.recv_from(&mut b, 0).unwrap_err().raw_os_error(),
        Some(libc::EAGAIN)
    );
    server.set_nonblocking(false);

    let client = DSocket::new(false).unwrap();
    // Both devices are in this process: the client says which is its own
    // (a process with one device is bound to it by connect).
    client
        .bind(SocketAddr::new(CLIENT.parse().unwrap(), 0))
        .unwrap();
    client.connect(saddr).unwrap();
    let caddr = client.local_addr().unwrap();
    assert_eq!(client.peer_addr(), Some(saddr));
    assert_eq!(client.send(b"hello", 0).unwrap(), 5);
    let (n, from) = recv(&server, &mut b);
    assert_eq!((&b[..n], from), (&b"hello"[..], caddr));
    // The server learned the client's QPN from the UDP header: UD now.
    let ud0 = client.rcvd_pkts();
    assert_eq!(server.send_to(b"world", 0, from).unwrap(), 5);
    let (n, from2) = recv(&client, &mut b);
    assert_eq!((&b[..n], from2), (&b"world"[..], saddr));
    assert!(client.rcvd_pkts() > ud0, "the answer came over RoCE");

    // The client had the server's QPN from its answer to "hello".
    let before = server.rcvd_pkts();
    for i in 0..100u32 {
        let m: Vec<u8> = (0..1000u32).map(|j| (i * 7 + j) as u8).collect();
        assert_eq!(client.send(&m, 0).unwrap(), 1000);
    }
    for i in 0..100u32 {
        let (n, from) = recv(&server, &mut b);
        assert_eq!(from, caddr);
        let m: Vec<u8> = (0..1000u32).map(|j| (i * 7 + j) as u8).collect();
        assert!(b[..n] == m[..], "datagram {i} whole and in order");
    }
    assert!(
        server.rcvd_pkts() >= before + 100,
        "over RoCE, one packet each"
    );
    // A short buffer takes the start of the datagram, the rest is dropped.
    assert_eq!(client.send(b"0123456789", 0).unwrap(), 10);
    let mut small = [0u8; 4];
    assert_eq!(recv(&server, &mut small).0, 4);
    assert_eq!(&small, b"0123");
    // Larger than a datagram's room (2048 bytes with the header).
    assert_eq!(
        client.send(&[0u8; 2041], 0).unwrap_err().raw_os_error(),
        Some(libc::EMSGSIZE)
    );
    client.close();
    server.close();
}
