//! The IPv4 and IPv6 wildcard addresses on one port, as the kernel's CMA
//! answers them (`cma_check_port`, `afonly`): an IPv4 id is restricted to
//! IPv4; an IPv6 id only with `rdma_set_afonly` (or
//! `net.ipv6.bindv6only=1`). tgtd binds `0.0.0.0` then `[::]` with AFONLY
//! on its iSER port.

use crate::{addr, expect};
use uroce_rdmacm::cm::{CmEventType, CmId, ConnParam, EventChannel, PortSpace};

const SERVER: &str = "127.102.7.1";
const CLIENT: &str = "127.102.7.2";

/// This module's devices (in the binary's `UROCE_DEVICES`).
pub fn devices() -> String {
    format!("afs={SERVER},afc={CLIENT}")
}

fn bindv6only() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|v| v.trim() == "1")
}

#[test]
fn ipv6_wildcard_after_ipv4_wildcard_needs_afonly() {
    crate::init();
    if bindv6only() {
        return; // the host's default makes every IPv6 id AFONLY
    }
    let port = 19210;
    let ch = EventChannel::new().unwrap();
    let v4 = CmId::new(&ch, PortSpace::Tcp).unwrap();
    v4.bind_addr(addr("0.0.0.0", port)).unwrap();
    // Without AFONLY the IPv6 wildcard takes IPv4 too: EADDRNOTAVAIL.
    let v6 = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let e = v6.bind_addr(addr("::", port)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
    // With it, both bind and listen.
    v6.set_afonly(true).unwrap();
    v6.bind_addr(addr("::", port)).unwrap();
    v4.listen(8).unwrap();
    v6.listen(8).unwrap();
    // A third IPv4 id on the port still meets the first.
    let again = CmId::new(&ch, PortSpace::Tcp).unwrap();
    again.set_afonly(true).unwrap();
    let e = again.bind_addr(addr("0.0.0.0", port)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
    // Too late once listening, as the kernel says.
    assert!(v6.set_afonly(false).is_err());
}

#[test]
fn ipv4_wildcard_after_ipv6_wildcard_needs_afonly_on_the_ipv6_id() {
    crate::init();
    if bindv6only() {
        return;
    }
    let port = 19211;
    let ch = EventChannel::new().unwrap();
    let v6 = CmId::new(&ch, PortSpace::Tcp).unwrap();
    v6.bind_addr(addr("::", port)).unwrap();
    let v4 = CmId::new(&ch, PortSpace::Tcp).unwrap();
    let e = v4.bind_addr(addr("0.0.0.0", port)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRNOTAVAIL, "{e}");
    // AFONLY on the bound IPv6 id (allowed in ADDR_BOUND) lets it in.
    v6.set_afonly(true).unwrap();
    v4.bind_addr(addr("0.0.0.0", port)).unwrap();
}

/// Both wildcards listening on one port: an IPv4 connection goes to the
/// IPv4 listener (the IPv6 one is AFONLY), as with the kernel's
/// `cma_match_private_data`.
/// Resolves `c` from the client's address to the server's `port` and
/// sends its REQ (QP `qpn`).
fn connect(c: &CmId, cch: &EventChannel, port: u16, qpn: u32) {
    c.resolve_addr(Some(addr(CLIENT, 0)), addr(SERVER, port))
        .unwrap();
    expect(cch, CmEventType::AddrResolved);
    c.resolve_route().unwrap();
    expect(cch, CmEventType::RouteResolved);
    c.connect(&ConnParam {
        qp_num: qpn,
        ..ConnParam::default()
    })
    .unwrap();
}

#[test]
fn an_ipv4_request_goes_to_the_ipv4_listener() {
    crate::init();
    let port = 19212;
    let ch4 = EventChannel::new().unwrap();
    let ch6 = EventChannel::new().unwrap();
    let v4 = CmId::new(&ch4, PortSpace::Tcp).unwrap();
    let v6 = CmId::new(&ch6, PortSpace::Tcp).unwrap();
    // The IPv6 id listens first: it must not take the IPv4 request.
    v6.set_afonly(true).unwrap();
    v6.bind_addr(addr("::", port)).unwrap();
    v6.listen(8).unwrap();
    v4.bind_addr(addr("0.0.0.0", port)).unwrap();
    v4.listen(8).unwrap();
    let cch = EventChannel::new().unwrap();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    connect(&c, &cch, port, 0x123);
    let req = expect(&ch4, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id.as_ref(), Some(&v4));
    assert!(
        ch6.try_get_event().is_err(),
        "the IPv6 listener got nothing"
    );
    req.id.reject(&[]).unwrap();
    expect(&cch, CmEventType::Rejected);
    // With the IPv4 listener gone, nobody takes IPv4: the AFONLY IPv6
    // id does not get it. The service is still listened to, so the REQ is
    // refused as the kernel's CM does when rdma_cm finds no listener for
    // it (cma_find_listener fails, the CM id is destroyed in REQ_RCVD):
    // REJ reason 28, consumer defined.
    drop(req);
    v4.destroy();
    c.destroy();
    let c = CmId::new(&cch, PortSpace::Tcp).unwrap();
    connect(&c, &cch, port, 0x124);
    let e = expect(&cch, CmEventType::Rejected);
    assert_eq!(e.status, 28, "REJ reason 28: consumer defined");
    assert!(
        ch6.try_get_event().is_err(),
        "the IPv6 listener got nothing"
    );
}
