//! Stream rsockets between two uroce devices in this process: connect,
//! a few MB each way checked byte for byte, a non-blocking receive with
//! nothing queued (EAGAIN), poll readiness, and shutdown seen as EOF.

use std::net::SocketAddr;
use std::time::Duration;
use uroce_rdmacm::rsocket::RSocket;

const SERVER: &str = "127.107.1.1";
const CLIENT: &str = "127.107.1.2";

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rss={SERVER},rsc={CLIENT}")
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn recv_all(s: &RSocket, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    let mut got = 0;
    while got < n {
        let k = s.recv(&mut v[got..], 0).expect("recv");
        assert!(k > 0, "EOF after {got} of {n} bytes");
        got += k;
    }
    v
}

#[test]
fn stream_both_ways_then_eof() {
    crate::init();
    let port = 19701;
    let listener = RSocket::new().unwrap();
    listener
        .bind(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    listener.listen(4).unwrap();
    listener.set_nonblocking(true);
    assert_eq!(
        listener.accept().unwrap_err().raw_os_error(),
        Some(libc::EAGAIN)
    );
    listener.set_nonblocking(false);

    const N: usize = 3 << 20;
    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        let got = recv_all(&s, N);
        assert!(got == pattern(1, N), "client's bytes arrived intact");
        assert_eq!(s.send(&pattern(2, N), 0).unwrap(), N);
        // The client shuts down its side: EOF after the data.
        let mut b = [0u8; 16];
        assert_eq!(s.recv(&mut b, 0).unwrap(), 0, "EOF");
        s.close();
        listener.close();
    });

    let c = RSocket::new().unwrap();
    c.bind(SocketAddr::new(CLIENT.parse().unwrap(), 0)).unwrap();
    c.connect(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    assert_eq!(c.peer_addr().unwrap().port(), port);
    // Nothing has come yet: EAGAIN without blocking; poll says not readable.
    let mut b = [0u8; 8];
    assert_eq!(
        c.recv(&mut b, libc::MSG_DONTWAIT)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EAGAIN)
    );
    assert_eq!(c.poll_events(libc::POLLIN), 0);
    assert_eq!(c.poll_events(libc::POLLOUT), libc::POLLOUT);
    assert_eq!(c.send(&pattern(1, N), 0).unwrap(), N);
    // The answer makes the socket readable.
    let t = std::time::Instant::now();
    while c.poll_events(libc::POLLIN) & libc::POLLIN == 0 {
        assert!(t.elapsed() < Duration::from_secs(20), "readable in 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = recv_all(&c, N);
    assert!(got == pattern(2, N), "server's bytes arrived intact");
    c.shutdown(libc::SHUT_WR).unwrap();
    server.join().unwrap();
    // The server closed: EOF here too, and sending fails.
    assert_eq!(c.recv(&mut b, 0).unwrap(), 0);
    c.close();
}
