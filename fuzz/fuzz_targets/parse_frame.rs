//! `frame::parse_frame` on arbitrary bytes (the first byte picks the link
//! type), then everything that can be asked of the frame, and the packet
//! checks on its UDP payload. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uroce_wire::frame::{self, LinkType};
use uroce_wire::{harness, packet};

const LINKS: [LinkType; 5] = [
    LinkType::Ethernet,
    LinkType::LinuxSll,
    LinkType::LinuxSll2,
    LinkType::RawIp,
    LinkType::Other(147),
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let link = LINKS[sel as usize % LINKS.len()];
    let port = if sel & 0x80 != 0 {
        9999
    } else {
        uroce_wire::ROCEV2_UDP_PORT
    };
    let Ok(Some(f)) = frame::parse_frame_on_port(link, bytes, port) else {
        return;
    };
    let _ = f.ipv4_ident();
    let ctx = f.ip_context();
    let _ = f.compute_icrc();
    let _ = f.verify_icrc();
    if let Ok(p) = packet::parse(f.payload) {
        let _ = p.verify_icrc(&ctx);
        let _ = p.verify_icrc_socket(&ctx);
    }
    harness::parse_never_panics(f.payload);
    harness::parse_emit_parse(f.payload);
});
