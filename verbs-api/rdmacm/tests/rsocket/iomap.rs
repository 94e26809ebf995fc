//! rsockets' direct writes (`riomap`/`riowrite`, as rdma-core's
//! riostream uses them): a server maps a buffer, the mapping reaches the
//! client with the next send, and the client's `iowrite`s land in the
//! server's buffer by RDMA WRITE, ordered before the bytes it sends
//! after them. Mapping errors as rsocket.c's.

use std::net::SocketAddr;
use uroce_rdmacm::rsocket::{RSocket, RdmaOpt};

const SERVER: &str = "127.107.2.1";
const CLIENT: &str = "127.107.2.2";

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + (i >> 10)) as u8).collect()
}

fn recv_exact(s: &RSocket, n: usize) -> Vec<u8> {
    let mut v = vec![0; n];
    let mut got = 0;
    while got < n {
        let k = s.recv(&mut v[got..], 0).expect("recv");
        assert!(k > 0, "EOF after {got} of {n} bytes");
        got += k;
    }
    v
}

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("rio1={SERVER},rio2={CLIENT}")
}

#[test]
fn iowrite_lands_in_the_peers_mapping() {
    crate::init();
    const LEN: usize = 300_000;
    const OFF: i64 = 1 << 20;
    let port = 19702;
    let listener = RSocket::new().unwrap();
    listener.set_rdma_option(RdmaOpt::IomapSize, 1).unwrap();
    listener
        .bind(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    listener.listen(1).unwrap();

    let server = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        let buf = Box::into_raw(vec![0u8; LEN].into_boxed_slice()).cast::<u8>();
        // SAFETY: buf is LEN bytes of ours, left alone until iounmap.
        unsafe {
            assert_eq!(s.iomap(buf, LEN, libc::PROT_WRITE, OFF).unwrap(), OFF);
            // The peer offered one entry: a second writable mapping has no room.
            let e = s.iomap(buf, 16, libc::PROT_WRITE, 0).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOMEM));
            assert_eq!(
                s.iomap(buf, 16, libc::PROT_READ, 0)
                    .unwrap_err()
                    .raw_os_error(),
                Some(libc::EINVAL)
            );
        }
        // The mapping goes out with this send.
        assert_eq!(s.send(b"m", 0).unwrap(), 1);
        assert_eq!(recv_exact(&s, 4), b"done");
        assert_eq!(
            s.iounmap(buf, LEN - 1).unwrap_err().raw_os_error(),
            Some(libc::EINVAL)
        );
        s.iounmap(buf, LEN).unwrap();
        // SAFETY: unmapped: the buffer is ours alone again.
        let got = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buf, LEN)) };
        let want = pattern(LEN);
        assert!(
            got[..100] == [0; 100],
            "bytes before the written range untouched"
        );
        assert!(got[100..] == want[100..], "the client's writes landed");
        s.close();
        listener.close();
    });

    let c = RSocket::new().unwrap();
    c.set_rdma_option(RdmaOpt::IomapSize, 1).unwrap();
    c.bind(SocketAddr::new(CLIENT.parse().unwrap(), 0)).unwrap();
    // SAFETY: a mapping needs a connection: refused before any memory is touched.
    let e = unsafe { c.iomap(std::ptr::null_mut(), 8, libc::PROT_WRITE, 0) }.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    c.connect(SocketAddr::new(SERVER.parse().unwrap(), port))
        .unwrap();
    assert_eq!(recv_exact(&c, 1), b"m");
    let data = pattern(LEN);
    // Outside the server's mapping: nothing written.
    assert_eq!(c.iowrite(&data[..10], 5, 0).unwrap(), 0);
    // Into it, from offset 100 to its end; and past its end: cut there.
    let off = OFF as u64;
    assert_eq!(c.iowrite(&data[100..], off + 100, 0).unwrap(), LEN - 100);
    assert_eq!(
        c.iowrite(&data[..64], off + LEN as u64 - 32, 0).unwrap(),
        32
    );
    assert_eq!(
        c.iowrite(&data[LEN - 32..], off + LEN as u64 - 32, 0)
            .unwrap(),
        32
    );
    assert_eq!(c.send(b"done", 0).unwrap(), 4);
    server.join().unwrap();
    c.close();
}
