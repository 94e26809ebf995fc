//! Non-blocking rsocket connects, as rsocket.c's: `connect` answers
//! `EINPROGRESS`, the connection completes through `poll` (`POLLOUT`),
//! and a refused one shows as `POLLERR` with `SO_ERROR` ECONNREFUSED.

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use uroce_rdmacm::rsocket::RSocket;

const SERVER: &str = "127.107.3.1";
const CLIENT: &str = "127.107.3.2";

/// Polls `s` for `events` until one of `want` shows (20 s at most).
fn poll_until(s: &RSocket, events: i16, want: i16) -> i16 {
    let t = Instant::now();
    loop {
        let r = s.poll_events(events);
        if r & want != 0 {
            return r;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no {want:#x} in 20 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rnb1={SERVER},rnb2={CLIENT}")
}

#[test]
fn nonblocking_connect_completes_through_poll() {
    crate::init();
    let port = 19703;
    let listener = RSocket::new().unwrap();
    listener
        .bind(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    listener.listen(1).unwrap();
    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        let mut b = [0u8; 5];
        let mut got = 0;
        while got < 5 {
            got += s.recv(&mut b[got..], 0).unwrap();
        }
        assert_eq!(&b, b"hello");
        assert_eq!(s.send(b"world", 0).unwrap(), 5);
        let mut e = [0u8; 1];
        assert_eq!(s.recv(&mut e, 0).unwrap(), 0, "EOF");
        s.close();
        listener.close();
    });

    let c = RSocket::new().unwrap();
    c.bind(SocketAddr::new(CLIENT.parse().unwrap(), 0)).unwrap();
    c.set_nonblocking(true);
    let dst = SocketAddr::new(SERVER.parse().unwrap(), port);
    assert_eq!(
        c.connect(dst).unwrap_err().raw_os_error(),
        Some(libc::EINPROGRESS),
        "a non-blocking connect does not wait for the peer"
    );
    let r = poll_until(&c, libc::POLLOUT, libc::POLLOUT | libc::POLLERR);
    assert_eq!(r, libc::POLLOUT, "connected, no error");
    assert_eq!(c.take_error(), 0);
    // Connected: a further connect says so, as TCP does.
    assert_eq!(
        c.connect(dst).unwrap_err().raw_os_error(),
        Some(libc::EISCONN)
    );
    assert_eq!(c.peer_addr().unwrap().port(), port);
    assert_eq!(c.send(b"hello", 0).unwrap(), 5);
    poll_until(&c, libc::POLLIN, libc::POLLIN);
    let mut b = [0u8; 5];
    assert_eq!(c.recv(&mut b, 0).unwrap(), 5);
    assert_eq!(&b, b"world");
    c.shutdown(libc::SHUT_RDWR).unwrap();
    server.join().unwrap();
    c.close();

    // Nobody listens on this port (the server's device stays open, held
    // by a listener on another): the connect fails later, seen by poll.
    let other = RSocket::new().unwrap();
    other
        .bind(SocketAddr::new(SERVER.parse().unwrap(), port + 2))
        .unwrap();
    other.listen(1).unwrap();
    let r = RSocket::new().unwrap();
    r.bind(SocketAddr::new(CLIENT.parse().unwrap(), 0)).unwrap();
    r.set_nonblocking(true);
    let none = SocketAddr::new(SERVER.parse().unwrap(), port + 1);
    assert_eq!(
        r.connect(none).unwrap_err().raw_os_error(),
        Some(libc::EINPROGRESS)
    );
    let ev = poll_until(&r, libc::POLLOUT, libc::POLLERR);
    assert_eq!(ev & libc::POLLERR, libc::POLLERR);
    assert_eq!(r.take_error(), libc::ECONNREFUSED);
    r.close();
    other.close();
}
