//! The capture tap: every packet a device sends and receives, written to
//! a pcap file as the whole Ethernet/IP/UDP frame it was (or would be on
//! an Ethernet link), so that Wireshark and `shared/roce-check/check_pcap`
//! can read it.
//!
//! Sent packets carry the header our socket produces (DF, IPv4 ID 0, TTL
//! 64, or a multicast datagram's own); received ones their TOS and TTL as
//! the socket reported them. For received IPv4 packets the sender's
//! identification is the one the ICRC check solved for, so a capture of a
//! kernel rxe peer's packets still verifies exactly. MAC addresses are made up from the IP
//! addresses (locally administered).

use parking_lot::Mutex;
use std::fs::File;
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use uroce_wire::frame::{build_frame, FrameParams, IpParams};
use uroce_wire::pcap::CaptureWriter;

/// Bytes held before [`Capture::record`] writes them out itself.
const HELD_MAX: usize = 64 * 1024;

/// Where the pcap writer puts its bytes: held in memory until the capture
/// hands them to the file, whole records at a time.
#[derive(Clone, Default)]
struct Held(Arc<Mutex<Vec<u8>>>);

impl Write for Held {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An open capture file. The file only ever grows by whole records (one
/// `write` of the records held since the last), so a program that exits
/// or is killed leaves a file every reader can read to its end; the
/// engine writes what is held after each pass and when the process exits.
pub struct Capture {
    writer: CaptureWriter<Held>,
    held: Held,
    file: File,
    buf: Vec<u8>,
    path: PathBuf,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Capture({})", self.path.display())
    }
}

fn mac_of(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let b = v6.octets();
            [b[12], b[13], b[14], b[15]]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

impl Capture {
    /// Creates (truncates) the file.
    pub fn create(path: &Path) -> Result<Capture, String> {
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let file = File::create(path).map_err(|e| err(&e))?;
        let held = Held::default();
        let writer = CaptureWriter::new(held.clone()).map_err(|e| err(&e))?;
        let mut c = Capture {
            writer,
            held,
            file,
            buf: vec![0u8; 4096 + 512],
            path: path.to_path_buf(),
        };
        c.flush().map_err(|e| err(&e))?;
        Ok(c)
    }

    /// Writes the records held so far to the file, in one `write`.
    pub fn flush(&mut self) -> io::Result<()> {
        let mut held = self.held.0.lock();
        if held.is_empty() {
            return Ok(());
        }
        let r = self.file.write_all(&held);
        held.clear();
        r
    }

    /// Records one RoCEv2 UDP payload from `src` to `dst` with TOS /
    /// traffic class and TTL / hop limit `(tclass, ttl)` (`None`: 64);
    /// for IPv4, with the given identification and DF flag.
    pub fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        ipv4_id: (u16, bool),
        (tclass, ttl): (u8, Option<u8>),
        udp_payload: &[u8],
    ) {
        let ttl = ttl.unwrap_or(64);
        let ip = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => IpParams::V4 {
                src: s,
                dst: d,
                ident: ipv4_id.0,
                dont_fragment: ipv4_id.1,
                tos: tclass,
                ttl,
            },
            (s, d) => IpParams::V6 {
                src: v6(s),
                dst: v6(d),
                traffic_class: tclass,
                flow_label: 0,
                hop_limit: ttl,
            },
        };
        let p = FrameParams {
            src_mac: mac_of(src.ip()),
            dst_mac: mac_of(dst.ip()),
            ip,
            src_port: src.port(),
            dst_port: dst.port(),
            udp_checksum: true,
        };
        if let Ok(n) = build_frame(&p, udp_payload, &mut self.buf) {
            let ts = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let _ = self.writer.write(ts, &self.buf[..n]);
        }
        if self.held.0.lock().len() >= HELD_MAX {
            let _ = self.flush();
        }
    }

    /// Writes what is held and closes the file.
    pub fn finish(mut self) -> Result<(), String> {
        self.flush().map_err(|e| e.to_string())
    }
}

fn v6(ip: IpAddr) -> std::net::Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}
