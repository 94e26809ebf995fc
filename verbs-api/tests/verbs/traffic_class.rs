//! The traffic class of an address handle is each UD packet's IP TOS,
//! over real UDP between two devices on loopback addresses (127.103.3.x):
//! the receiver's GRH area reports what the kernel received, and a reply
//! made from it carries the same.

use uroce_verbs::*;

use crate::common::{open, qp, recv, recv_datagram, report_ip_field, two, ud_up, T};

const QKEY: u32 = 0x1111_1111;

#[test]
fn ud_traffic_class_reaches_the_receivers_grh() {
    let (ai, bi) = ("127.103.3.1", "127.103.3.2");
    let (_a, _b, apd, bpd, acq, bcq, aqp, bqp) = two(ai, bi, QpType::Ud);
    ud_up(&aqp, QKEY, 0);
    ud_up(&bqp, QKEY, 0);
    let smr = apd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rmr = bpd.alloc_mr(4 * 128, Access::LOCAL_WRITE).unwrap();
    let amr = apd.alloc_mr(128, Access::LOCAL_WRITE).unwrap();
    // DSCP 46 (EF); DSCP 10 with ECT(0); none.
    let classes = [0xb8u8, 0x2a, 0];
    for (k, &tc) in classes.iter().enumerate() {
        bqp.post_recv(&[recv(k as u64, &rmr, k * 128, 128)])
            .unwrap();
        let mut av = AddressVector::to_ip(bi.parse().unwrap());
        av.traffic_class = tc;
        let ah = apd.create_ah(&av).unwrap();
        let mut w = SendWr::new(k as u64, WrOpcode::Send);
        w.flags = SendFlags::SIGNALED;
        w.sg_list.push(smr.sge(0, 8));
        w.ud = Some(ah.ud_dest(bqp.qp_num(), QKEY));
        aqp.post_send(&[w]).unwrap();
        assert_eq!(acq.wait(1, T)[0].status, WcStatus::Success);
        let wc = bcq.wait(1, T);
        assert_eq!(wc[0].status, WcStatus::Success);
        let grh = rmr.to_vec(k * 128, 40).unwrap();
        assert_eq!(grh[20], 0x45);
        assert_eq!(grh[21], tc, "the IPv4 header's TOS");
        if tc == 0xb8 {
            // The reply an AH made from the GRH sends has it too.
            let back = bpd.create_ah_from_wc(&wc[0], &grh).unwrap();
            assert_eq!(back.attr().traffic_class, tc);
            aqp.post_recv(&[recv(9, &amr, 0, 128)]).unwrap();
            let bs = bpd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
            let mut w = SendWr::new(9, WrOpcode::Send);
            w.flags = SendFlags::SIGNALED;
            w.sg_list.push(bs.sge(0, 8));
            w.ud = Some(back.ud_dest(aqp.qp_num(), QKEY));
            bqp.post_send(&[w]).unwrap();
            assert_eq!(bcq.wait(1, T)[0].status, WcStatus::Success);
            assert_eq!(acq.wait(1, T)[0].status, WcStatus::Success);
            assert_eq!(amr.to_vec(21, 1).unwrap(), [tc]);
        }
    }
}

/// A plain UDP socket on port 4791 that reports each datagram's IP TOS
/// (`IP_RECVTOS`): the far end of an RC or UC QP, seeing what the kernel
/// put on the wire.
struct TosSink(std::net::UdpSocket);

impl TosSink {
    fn bind(ip: &str) -> TosSink {
        let s = std::net::UdpSocket::bind((ip, uroce_wire::ROCEV2_UDP_PORT)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        report_ip_field(&s, libc::IP_RECVTOS);
        TosSink(s)
    }

    /// The next datagram's first byte (the BTH's opcode) and its TOS.
    fn next(&self) -> (u8, u8) {
        let d = recv_datagram(&self.0, 0).expect("a datagram");
        (d.bytes[0], d.tos.expect("an IP_TOS control message"))
    }
}

/// An RC or UC QP's path traffic class (its RTR `ah_attr`) is the IP TOS of
/// every packet it sends, over real UDP: a plain socket in the peer's
/// place reads it from the kernel (127.103.5.x).
#[test]
fn rc_and_uc_packets_carry_the_paths_traffic_class() {
    let (ai, sink_ip) = ("127.103.5.1", "127.103.5.2");
    let sink = TosSink::bind(sink_ip);
    let a = open(ai);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(64).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    // (type, traffic class, SEND ONLY's opcode)
    for (t, tc, op) in [(QpType::Rc, 0xb8u8, 0x04u8), (QpType::Uc, 0x2a, 0x24)] {
        let q = qp(&pd, &cq, t, None);
        let o = ConnectOptions::default();
        q.init_with(&o).unwrap();
        let mut av = AddressVector::to_ip(sink_ip.parse().unwrap());
        av.traffic_class = tc;
        q.rtr_rts(&av, 0x123, 0, 0, &o).unwrap();
        let mut w = SendWr::new(1, WrOpcode::Send);
        w.sg_list.push(mr.sge(0, 8));
        q.post_send(&[w]).unwrap();
        let (got_op, got_tos) = sink.next();
        assert_eq!(got_op, op, "{t:?}: a SEND ONLY");
        assert_eq!(got_tos, tc, "{t:?}: the path's traffic class as IP TOS");
        // No ACK comes: the RC QP would retransmit; it goes now, and what
        // it resent before is read away.
        drop(q);
        sink.0.set_nonblocking(true).unwrap();
        while sink.0.recv(&mut [0u8; 4200]).is_ok() {}
        sink.0.set_nonblocking(false).unwrap();
    }
}
