//! CM MADs: whatever `CmMad::parse` accepts emits back to bytes that parse
//! to the same message; and a stream of MADs from two peers, with time
//! passing and the user accepting, establishing and disconnecting at
//! random, never panics a CM agent, which stays within its bounds and
//! whose every outgoing MAD encodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::sync::Arc;
use uroce_provider::sans_io::cm::{CmAgent, CmConfig, CmEvent, Nanos, MAX_CONNS};
use uroce_provider::counters::Counters;
use uroce_wire::cm::{CmMad, RepRepr, ReqRepr};
use uroce_wire::mad::MAD_LEN;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = CmMad::parse(data) {
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).expect("a parsed MAD emits");
        assert_eq!(CmMad::parse(&out).expect("and parses again"), m);
    }
    let peers: [IpAddr; 2] = ["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()];
    let mut cfg = CmConfig::new("10.0.0.1".parse().unwrap(), 1);
    cfg.response_timeout = 12;
    cfg.packet_lifetime = 8;
    cfg.max_retries = 2;
    let mut a = CmAgent::new(cfg, Arc::new(Counters::default()));
    let _ = a.listen(0x0106_1d2f);
    let _ = a.listen(0x0111_1d2f);
    let mut now = Nanos(0);
    let mut conns: Vec<u32> = Vec::new();
    for chunk in data.chunks(1 + MAD_LEN) {
        let ctl = chunk[0];
        let mut mad = [0u8; MAD_LEN];
        mad[..chunk.len() - 1].copy_from_slice(&chunk[1..]);
        if ctl & 0x80 != 0 {
            // A valid header, so that the messages are reached.
            mad[..4].copy_from_slice(&[1, 7, 2, 3]);
        }
        now = Nanos(now.0 + (1u64 << (ctl & 0x1f)));
        a.handle_mad(now, peers[(ctl >> 5 & 1) as usize], 1, &mad);
        if ctl & 0x40 != 0 {
            a.handle_timeout(now);
        }
        while let Some(e) = a.poll_event() {
            match e {
                CmEvent::ReqReceived { conn, .. } => {
                    let _ = a.accept(now, conn, &RepRepr::default());
                    conns.push(conn);
                }
                CmEvent::RepReceived { conn, .. } => {
                    let _ = a.establish(conn, &[]);
                }
                CmEvent::SidrReqReceived { conn, .. } => {
                    let _ = a.sidr_reply(now, conn, 0, 5, 6, &[]);
                }
                _ => {}
            }
        }
        if ctl & 0x1f == 0x1f {
            if let Some(&c) = conns.first() {
                let _ = a.disconnect(now, c, b"bye");
                a.destroy(now, c);
                conns.remove(0);
            }
            let _ = a.connect(now, peers[0], &ReqRepr::default());
        }
        assert!(a.len() <= MAX_CONNS);
        while let Some(o) = a.poll_transmit() {
            let mut out = [0u8; MAD_LEN];
            o.mad.emit(&mut out).expect("the agent's MADs encode");
        }
    }
});
