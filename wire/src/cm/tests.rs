use super::*;
use proptest::prelude::*;

/// A REQ with a distinctive value in every field, written byte by byte
/// from IBA table 106's offsets (data offset + 24 for the MAD header).
fn golden_req() -> [u8; MAD_LEN] {
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    b[16..18].copy_from_slice(&0x0010u16.to_be_bytes());
    let d = &mut b[24..];
    d[0..4].copy_from_slice(&0xdead_beefu32.to_be_bytes()); // local comm ID
    d[5..8].copy_from_slice(&[0x00, 0x14, 0x05]); // vendor ID
    d[8..16].copy_from_slice(&0x0000_0000_0106_1d2fu64.to_be_bytes()); // service ID
    d[16..24].copy_from_slice(&0x0275_72ff_fe00_0001u64.to_be_bytes()); // CA GUID
    d[28..32].copy_from_slice(&0x1234_5678u32.to_be_bytes()); // Q_Key
    d[32..35].copy_from_slice(&[0xab, 0xcd, 0xef]); // QPN
    d[35] = 4; // responder resources
    d[36..39].copy_from_slice(&[0, 0, 9]); // local EECN
    d[39] = 3; // initiator depth
    d[40..43].copy_from_slice(&[0, 0, 8]); // remote EECN
    d[43] = (20 << 3) | (1 << 1) | 1; // remote CM timeout 20, UC, E2E
    d[44..47].copy_from_slice(&[0x11, 0x22, 0x33]); // starting PSN
    d[47] = (18 << 3) | 6; // local CM timeout 18, retry 6
    d[48..50].copy_from_slice(&0xffffu16.to_be_bytes()); // P_Key
    d[50] = (5 << 4) | (1 << 3) | 7; // MTU 4096, RDC, RNR retry 7
    d[51] = (15 << 4) | (1 << 3) | 2; // max CM retries 15, SRQ, ext 2
    d[52..54].copy_from_slice(&0xffffu16.to_be_bytes()); // primary local LID
    d[54..56].copy_from_slice(&0xfffeu16.to_be_bytes()); // primary remote LID
    d[56..72].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 1]);
    d[72..88].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 99, 0, 2]);
    d[88..92].copy_from_slice(&((0xabcdeu32 << 12) | 3).to_be_bytes()); // flow label, rate 3
    d[92] = 0x28; // traffic class
    d[93] = 64; // hop limit
    d[94] = (5 << 4) | (1 << 3); // SL 5, subnet local
    d[95] = 17 << 3; // local ACK timeout
    d[139] = (9 << 3) | (1 << 2); // alternate ACK timeout 9, SAP supported
    d[140..145].copy_from_slice(b"hello");
    b
}

#[test]
fn golden_req_parses_and_round_trips() {
    let g = golden_req();
    let m = CmMad::parse(&g).unwrap();
    assert_eq!(m.tid, 0x0102_0304_0506_0708);
    let CmMessage::Req(r) = m.msg else {
        panic!("{m:?}")
    };
    assert_eq!(r.local_comm_id, 0xdead_beef);
    assert_eq!(r.vendor_id, 0x1405);
    assert_eq!(r.service_id, 0x0106_1d2f);
    assert_eq!(r.local_ca_guid, 0x0275_72ff_fe00_0001);
    assert_eq!(r.local_qkey, 0x1234_5678);
    assert_eq!(r.local_qpn, 0xab_cdef);
    assert_eq!((r.responder_resources, r.initiator_depth), (4, 3));
    assert_eq!((r.local_eecn, r.remote_eecn), (9, 8));
    assert_eq!(r.remote_cm_response_timeout, 20);
    assert_eq!(r.transport_service_type, 1);
    assert!(r.end_to_end_flow_control);
    assert_eq!(r.starting_psn, 0x11_2233);
    assert_eq!((r.local_cm_response_timeout, r.retry_count), (18, 6));
    assert_eq!(r.pkey, 0xffff);
    assert_eq!((r.path_mtu, r.rdc_exists, r.rnr_retry_count), (5, true, 7));
    assert_eq!(
        (r.max_cm_retries, r.srq, r.extended_transport_type),
        (15, true, 2)
    );
    let p = r.primary;
    assert_eq!((p.local_lid, p.remote_lid), (0xffff, 0xfffe));
    assert_eq!(&p.local_gid[12..], &[10, 99, 0, 1]);
    assert_eq!(&p.remote_gid[12..], &[10, 99, 0, 2]);
    assert_eq!((p.flow_label, p.packet_rate), (0xabcde, 3));
    assert_eq!((p.traffic_class, p.hop_limit, p.sl), (0x28, 64, 5));
    assert!(p.subnet_local);
    assert_eq!(p.local_ack_timeout, 17);
    assert_eq!(r.alternate.local_ack_timeout, 9);
    assert!(r.sap_supported);
    assert_eq!(&r.private_data[..5], b"hello");
    let mut out = [0xffu8; MAD_LEN + 8];
    assert_eq!(m.emit(&mut out).unwrap(), MAD_LEN);
    assert_eq!(&out[..MAD_LEN], &g[..]);
}

#[test]
fn golden_rep_rej_dreq_sidr() {
    // REP.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[16..18].copy_from_slice(&0x0013u16.to_be_bytes());
    let d = &mut b[24..];
    d[0..4].copy_from_slice(&1u32.to_be_bytes());
    d[4..8].copy_from_slice(&2u32.to_be_bytes());
    d[8..12].copy_from_slice(&3u32.to_be_bytes());
    d[12..15].copy_from_slice(&[0, 0x12, 0x34]);
    d[15] = 0xaa; // vendor high
    d[20..23].copy_from_slice(&[0x55, 0x66, 0x77]);
    d[24] = 16;
    d[25] = 8;
    d[26] = (15 << 3) | 1;
    d[27] = (6 << 5) | (1 << 4);
    d[28..36].copy_from_slice(&0x0102u64.to_be_bytes());
    d[36] = b'x';
    let CmMessage::Rep(r) = CmMad::parse(&b).unwrap().msg else {
        panic!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id, r.local_qkey), (1, 2, 3));
    assert_eq!((r.local_qpn, r.starting_psn), (0x1234, 0x55_6677));
    assert_eq!(r.vendor_id, 0xaa_0000);
    assert_eq!((r.responder_resources, r.initiator_depth), (16, 8));
    assert_eq!((r.target_ack_delay, r.end_to_end_flow_control), (15, true));
    assert_eq!((r.rnr_retry_count, r.srq), (6, true));
    assert_eq!(r.local_ca_guid, 0x0102);
    assert_eq!(r.private_data[0], b'x');
    let mut out = [0u8; MAD_LEN];
    CmMad::parse(&b).unwrap().emit(&mut out).unwrap();
    assert_eq!(out, b);

    // REJ.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[16..18].copy_from_slice(&0x0012u16.to_be_bytes());
    let d = &mut b[24..];
    d[4..8].copy_from_slice(&0x77u32.to_be_bytes());
    d[8] = 1 << 6; // REP rejected
    d[9] = 8 << 1; // 8 bytes of ARI
    d[10..12].copy_from_slice(&28u16.to_be_bytes());
    d[12] = 0xa1;
    d[84] = 0xb2;
    let CmMessage::Rej(r) = CmMad::parse(&b).unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (r.remote_comm_id, r.message_rejected, r.reject_info_len),
        (0x77, 1, 8)
    );
    assert_eq!(r.reason, 28);
    assert_eq!(rej_reason_name(r.reason), "consumer reject");
    assert_eq!((r.ari[0], r.private_data[0]), (0xa1, 0xb2));
    let mut out = [0u8; MAD_LEN];
    CmMad::parse(&b).unwrap().emit(&mut out).unwrap();
    assert_eq!(out, b);

    // DREQ.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[16..18].copy_from_slice(&0x0015u16.to_be_bytes());
    b[24 + 8..24 + 11].copy_from_slice(&[0x0a, 0x0b, 0x0c]);
    b[24 + 12] = 0xcc;
    let CmMessage::Dreq(r) = CmMad::parse(&b).unwrap().msg else {
        panic!()
    };
    assert_eq!((r.remote_qpn, r.private_data[0]), (0x0a_0b0c, 0xcc));

    // SIDR_REQ and SIDR_REP.
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[16..18].copy_from_slice(&0x0017u16.to_be_bytes());
    b[24..28].copy_from_slice(&5u32.to_be_bytes());
    b[28..30].copy_from_slice(&0xffffu16.to_be_bytes());
    b[32..40].copy_from_slice(&0x0111_1d2fu64.to_be_bytes());
    b[40] = 0xdd;
    let CmMessage::SidrReq(r) = CmMad::parse(&b).unwrap().msg else {
        panic!()
    };
    assert_eq!(
        (r.request_id, r.pkey, r.service_id),
        (5, 0xffff, 0x0111_1d2f)
    );
    assert_eq!(r.private_data[0], 0xdd);
    let mut b = [0u8; MAD_LEN];
    b[..4].copy_from_slice(&[1, 7, 2, 3]);
    b[16..18].copy_from_slice(&0x0018u16.to_be_bytes());
    let d = &mut b[24..];
    d[0..4].copy_from_slice(&5u32.to_be_bytes());
    d[4] = 0;
    d[8..11].copy_from_slice(&[0, 3, 0x33]);
    d[12..20].copy_from_slice(&0x0111_1d2fu64.to_be_bytes());
    d[20..24].copy_from_slice(&0x0123_4567u32.to_be_bytes());
    d[96] = 0xee;
    let CmMessage::SidrRep(r) = CmMad::parse(&b).unwrap().msg else {
        panic!()
    };
    assert_eq!((r.request_id, r.status, r.qpn), (5, 0, 0x333));
    assert_eq!(
        (r.service_id, r.qkey, r.private_data[0]),
        (0x0111_1d2f, 0x0123_4567, 0xee)
    );
    let mut out = [0u8; MAD_LEN];
    CmMad::parse(&b).unwrap().emit(&mut out).unwrap();
    assert_eq!(out, b);
}

#[test]
fn wrong_headers_and_values_are_refused() {
    let g = golden_req();
    assert!(CmMad::parse(&g[..255]).is_err());
    for (at, v) in [(0, 2u8), (1, 4), (2, 1), (3, 0x83), (17, 0x30), (17, 0x01)] {
        let mut b = g;
        b[at] = v;
        assert!(
            matches!(CmMad::parse(&b), Err(Error::BadMad(_))),
            "{at} {v}"
        );
    }
    let mut r = ReqRepr {
        local_qpn: 1 << 24,
        ..ReqRepr::default()
    };
    let mut out = [0u8; MAD_LEN];
    let emit = |r: ReqRepr, out: &mut [u8]| {
        CmMad {
            tid: 0,
            msg: CmMessage::Req(r),
        }
        .emit(out)
    };
    assert!(matches!(emit(r, &mut out), Err(Error::OutOfRange(_))));
    r.local_qpn = 0;
    r.retry_count = 8;
    assert!(emit(r, &mut out).is_err());
    r.retry_count = 0;
    assert!(emit(r, &mut out[..255]).is_err());
    assert!(emit(r, &mut out).is_ok());
}

fn arb_bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    proptest::collection::vec(any::<u8>(), N).prop_map(|v| {
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        a
    })
}

fn arb_gid() -> impl Strategy<Value = Gid> {
    arb_bytes::<16>()
}

prop_compose! {
    fn arb_path()(lids in any::<(u16, u16)>(), g in (arb_gid(), arb_gid()),
                  flow in 0u32..1 << 20, rate in 0u8..64, tc in any::<u8>(), hop in any::<u8>(),
                  sl in 0u8..16, local in any::<bool>(), ack in 0u8..32) -> CmPath {
        CmPath { local_lid: lids.0, remote_lid: lids.1, local_gid: g.0, remote_gid: g.1,
                 flow_label: flow, packet_rate: rate, traffic_class: tc, hop_limit: hop, sl,
                 subnet_local: local, local_ack_timeout: ack }
    }
}

prop_compose! {
    fn arb_req()(ids in any::<(u32, u64, u64, u32)>(), vendor in 0u32..1 << 24,
                 qpn in 0u32..1 << 24, psn in 0u32..1 << 24, ee in (0u32..1 << 24, 0u32..1 << 24),
                 rr in any::<(u8, u8)>(), t in (0u8..32, 0u8..32, 0u8..4, 0u8..8, 0u8..16, 0u8..8,
                 0u8..8, 0u8..16), flags in any::<(bool, bool, bool, bool)>(), pkey in any::<u16>(),
                 p in (arb_path(), arb_path()), pd in arb_bytes::<REQ_PRIVATE_DATA_LEN>())
                 -> ReqRepr {
        ReqRepr { local_comm_id: ids.0, vendor_id: vendor, service_id: ids.1, local_ca_guid: ids.2,
                  local_qkey: ids.3, local_qpn: qpn, responder_resources: rr.0,
                  local_eecn: ee.0, initiator_depth: rr.1, remote_eecn: ee.1,
                  remote_cm_response_timeout: t.0, transport_service_type: t.2,
                  end_to_end_flow_control: flags.0, starting_psn: psn,
                  local_cm_response_timeout: t.1, retry_count: t.3, pkey, path_mtu: t.4,
                  rdc_exists: flags.1, rnr_retry_count: t.5, max_cm_retries: t.7 % 16,
                  srq: flags.2, extended_transport_type: t.6, primary: p.0, alternate: p.1,
                  sap_supported: flags.3, private_data: pd }
    }
}

fn arb_msg() -> impl Strategy<Value = CmMessage> {
    let ids = any::<(u32, u32)>();
    prop_oneof![
        arb_req().prop_map(CmMessage::Req),
        (ids, 0u8..4, 0u8..32, arb_bytes::<MRA_PRIVATE_DATA_LEN>()).prop_map(|(i, m, t, p)| {
            CmMessage::Mra(MraRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                message_mraed: m,
                service_timeout: t,
                private_data: p,
            })
        }),
        (
            ids,
            0u8..4,
            0u8..128,
            any::<u16>(),
            arb_bytes::<72>(),
            arb_bytes::<148>()
        )
            .prop_map(|(i, m, l, r, a, p)| CmMessage::Rej(RejRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                message_rejected: m,
                reject_info_len: l,
                reason: r,
                ari: a,
                private_data: p,
            })),
        (
            ids,
            any::<(u32, u64, u8, u8, bool, bool)>(),
            (0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24),
            (0u8..32, 0u8..4, 0u8..8),
            arb_bytes::<REP_PRIVATE_DATA_LEN>()
        )
            .prop_map(|(i, a, n, t, p)| CmMessage::Rep(RepRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                local_qkey: a.0,
                local_qpn: n.0,
                local_eecn: n.1,
                starting_psn: n.2,
                vendor_id: n.3,
                responder_resources: a.2,
                initiator_depth: a.3,
                target_ack_delay: t.0,
                failover_accepted: t.1,
                end_to_end_flow_control: a.4,
                rnr_retry_count: t.2,
                srq: a.5,
                local_ca_guid: a.1,
                private_data: p,
            })),
        (ids, arb_bytes::<RTU_PRIVATE_DATA_LEN>()).prop_map(|(i, p)| CmMessage::Rtu(RtuRepr {
            local_comm_id: i.0,
            remote_comm_id: i.1,
            private_data: p
        })),
        (ids, 0u32..1 << 24, arb_bytes::<DREQ_PRIVATE_DATA_LEN>()).prop_map(|(i, q, p)| {
            CmMessage::Dreq(DreqRepr {
                local_comm_id: i.0,
                remote_comm_id: i.1,
                remote_qpn: q,
                private_data: p,
            })
        }),
        (ids, arb_bytes::<DREP_PRIVATE_DATA_LEN>()).prop_map(|(i, p)| CmMessage::Drep(DrepRepr {
            local_comm_id: i.0,
            remote_comm_id: i.1,
            private_data: p
        })),
        (
            any::<(u32, u16, u64)>(),
            arb_bytes::<SIDR_REQ_PRIVATE_DATA_LEN>()
        )
            .prop_map(|(a, p)| CmMessage::SidrReq(SidrReqRepr {
                request_id: a.0,
                pkey: a.1,
                service_id: a.2,
                private_data: p,
            })),
        (
            any::<(u32, u8, u8, u64, u32)>(),
            (0u32..1 << 24, 0u32..1 << 24),
            arb_bytes::<72>(),
            arb_bytes::<SIDR_REP_PRIVATE_DATA_LEN>()
        )
            .prop_map(|(a, n, ai, p)| CmMessage::SidrRep(SidrRepRepr {
                request_id: a.0,
                status: a.1,
                add_info_len: a.2,
                vendor_id: n.1,
                qpn: n.0,
                service_id: a.3,
                qkey: a.4,
                add_info: ai,
                private_data: p,
            })),
        (ids, arb_bytes::<{ CM_DATA_LEN - 8 }>()).prop_map(|(i, r)| CmMessage::Lap(AltPathRepr {
            local_comm_id: i.0,
            remote_comm_id: i.1,
            rest: r
        })),
    ]
}

proptest! {
    #[test]
    fn every_message_round_trips(tid in any::<u64>(), msg in arb_msg()) {
        let m = CmMad { tid, msg };
        let mut b = [0u8; MAD_LEN];
        prop_assert_eq!(m.emit(&mut b).unwrap(), MAD_LEN);
        prop_assert_eq!(CmMad::parse(&b).unwrap(), m);
    }

    /// Any bytes: parse never panics, and what parses emits the same
    /// fields back (reserved bits aside).
    #[test]
    fn parse_never_panics(mut b in proptest::collection::vec(any::<u8>(), 0..300),
                          attr in 0x10u16..0x1b) {
        if b.len() >= 18 {
            b[..4].copy_from_slice(&[1, 7, 2, 3]);
            b[16..18].copy_from_slice(&attr.to_be_bytes());
        }
        if let Ok(m) = CmMad::parse(&b) {
            let mut out = [0u8; MAD_LEN];
            m.emit(&mut out).unwrap();
            prop_assert_eq!(CmMad::parse(&out).unwrap(), m);
        }
    }
}
