//! Capture files: a pcap writer and a pcap/pcapng reader (over the
//! `pcap-file` crate).
//!
//! [`CaptureWriter`] writes classic pcap files (microsecond timestamps,
//! little-endian, link type Ethernet unless told otherwise) with
//! timestamps given by the caller. [`CaptureReader`] reads pcap (either
//! byte order, micro- or nanosecond timestamps) and pcapng (any number of
//! sections and interfaces, each interface's `if_tsresol` honoured),
//! detected by the file's magic number, and hands out one [`Record`] per
//! packet with its 1-based frame number (the number Wireshark shows), its
//! timestamp, its [`LinkType`] and its bytes, ready for
//! [`frame::parse_frame`](crate::frame::parse_frame).
//!
//! This module does I/O and is kept apart from the codec's hot path. The
//! reader never panics on a malformed file: it returns an error and then
//! ends.

use crate::frame::LinkType;
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, Endianness, PcapError as FileError, TsResolution};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::time::Duration;

/// Snapshot length written in pcap headers: frames up to this size are
/// stored whole (tcpdump's default).
pub const SNAPLEN: u32 = 262_144;

const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
    [0x4d, 0x3c, 0xb2, 0xa1],
];
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// Why a capture file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The underlying reader or writer failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The file starts with neither a pcap nor a pcapng magic number.
    #[error("not a pcap or pcapng file (it starts with {0:02x?})")]
    NotACapture(Vec<u8>),
    /// The file ends in the middle of a header or record.
    #[error("the file ends in the middle of a record (cut short?)")]
    Truncated,
    /// A header or record is malformed.
    #[error("malformed capture: {0}")]
    Malformed(String),
    /// A pcapng packet names an interface the section did not describe.
    /// The reader goes on after this error.
    #[error("frame {frame}: packet on interface {interface}, which the file does not describe")]
    UnknownInterface {
        /// The frame number of the packet.
        frame: u64,
        /// Its interface ID.
        interface: u32,
    },
}

impl From<FileError> for CaptureError {
    fn from(e: FileError) -> Self {
        match e {
            FileError::IncompleteBuffer => CaptureError::Truncated,
            FileError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                CaptureError::Truncated
            }
            FileError::IoError(e) => CaptureError::Io(e),
            e => CaptureError::Malformed(e.to_string()),
        }
    }
}

/// The container format of a capture file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Classic libpcap format.
    Pcap,
    /// pcapng.
    PcapNg,
}

/// One packet of a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    /// Frame number in the file, from 1 (what Wireshark shows).
    pub index: u64,
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Link-layer type of `data`.
    pub link: LinkType,
    /// Length of the packet on the wire (`data` may be shorter if the
    /// capture cut it to its snapshot length).
    pub orig_len: u32,
    /// The captured bytes, from the link-layer header on.
    pub data: &'a [u8],
}

struct Iface {
    link: LinkType,
    tsresol: u8,
}

enum Inner<R: Read> {
    Pcap {
        reader: PcapReader<Peeked<R>>,
        link: LinkType,
        nanos: bool,
    },
    PcapNg {
        reader: PcapNgReader<Peeked<R>>,
        ifaces: Vec<Iface>,
    },
}

type Peeked<R> = io::Chain<io::Cursor<[u8; 4]>, R>;

/// Reads pcap and pcapng files, one [`Record`] at a time.
///
/// ```no_run
/// use uroce_wire::pcap::CaptureReader;
/// let mut r = CaptureReader::open("x.pcap")?;
/// while let Some(rec) = r.next_record() {
///     let rec = rec?;
///     println!("{} {:?} {} bytes", rec.index, rec.link, rec.data.len());
/// }
/// # Ok::<(), uroce_wire::pcap::CaptureError>(())
/// ```
pub struct CaptureReader<R: Read> {
    inner: Inner<R>,
    frames: u64,
    done: bool,
    scratch: Vec<u8>,
}

impl CaptureReader<File> {
    /// Opens a capture file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        CaptureReader::new(File::open(path)?)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header (pcap or pcapng, told apart by the magic
    /// number) from `reader`. The reader buffers by itself.
    pub fn new(mut reader: R) -> Result<Self, CaptureError> {
        let mut magic = [0u8; 4];
        let mut got = 0;
        while got < magic.len() {
            match reader.read(&mut magic[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        if got < magic.len() {
            return Err(CaptureError::NotACapture(magic[..got].to_vec()));
        }
        let peeked = io::Cursor::new(magic).chain(reader);
        let inner = if PCAP_MAGICS.contains(&magic) {
            let reader = PcapReader::new(peeked)?;
            let h = reader.header();
            Inner::Pcap {
                link: LinkType::from_linktype(u32::from(h.datalink)),
                nanos: h.ts_resolution == TsResolution::NanoSecond,
                reader,
            }
        } else if magic == PCAPNG_MAGIC {
            Inner::PcapNg {
                reader: PcapNgReader::new(peeked)?,
                ifaces: Vec::new(),
            }
        } else {
            return Err(CaptureError::NotACapture(magic.to_vec()));
        };
        Ok(CaptureReader {
            inner,
            frames: 0,
            done: false,
            scratch: Vec::new(),
        })
    }

    /// The file's format.
    pub fn format(&self) -> Format {
        match self.inner {
            Inner::Pcap { .. } => Format::Pcap,
            Inner::PcapNg { .. } => Format::PcapNg,
        }
    }

    /// The link type of a pcap file; `None` for pcapng, where each
    /// interface has its own.
    pub fn pcap_link_type(&self) -> Option<LinkType> {
        match self.inner {
            Inner::Pcap { link, .. } => Some(link),
            Inner::PcapNg { .. } => None,
        }
    }

    /// The next packet, `None` at the end of the file. After an error
    /// other than [`CaptureError::UnknownInterface`] the reader ends.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, CaptureError>> {
        if self.done {
            return None;
        }
        let r = match &mut self.inner {
            Inner::Pcap {
                reader,
                link,
                nanos,
            } => next_pcap(reader, *link, *nanos, &mut self.frames, &mut self.scratch),
            Inner::PcapNg { reader, ifaces } => {
                next_pcapng(reader, ifaces, &mut self.frames, &mut self.scratch)
            }
        };
        match &r {
            None => self.done = true,
            Some(Err(CaptureError::UnknownInterface { .. })) | Some(Ok(_)) => {}
            Some(Err(_)) => self.done = true,
        }
        r
    }
}

fn next_pcap<'a, R: Read>(
    reader: &'a mut PcapReader<R>,
    link: LinkType,
    nanos: bool,
    frames: &mut u64,
    scratch: &'a mut Vec<u8>,
) -> Option<Result<Record<'a>, CaptureError>> {
    let raw = match reader.next_raw_packet()? {
        Ok(raw) => raw,
        Err(e) => return Some(Err(e.into())),
    };
    *frames += 1;
    let frac = if nanos {
        u64::from(raw.ts_frac)
    } else {
        u64::from(raw.ts_frac) * 1000
    };
    let timestamp = Duration::from_secs(u64::from(raw.ts_sec)) + Duration::from_nanos(frac);
    let data: &'a [u8] = match raw.data {
        Cow::Borrowed(b) => b,
        Cow::Owned(v) => {
            *scratch = v;
            scratch
        }
    };
    Some(Ok(Record {
        index: *frames,
        timestamp,
        link,
        orig_len: raw.orig_len,
        data,
    }))
}

fn next_pcapng<'a, R: Read>(
    reader: &mut PcapNgReader<R>,
    ifaces: &mut Vec<Iface>,
    frames: &mut u64,
    scratch: &'a mut Vec<u8>,
) -> Option<Result<Record<'a>, CaptureError>> {
    // Packet bytes are copied into `scratch` (reused, so no allocation per
    // packet once it has grown): a record borrowed from the reader could
    // not be returned from inside this loop.
    loop {
        let block = match reader.next_block()? {
            Ok(b) => b,
            Err(e) => return Some(Err(e.into())),
        };
        let (interface, raw_ts, orig_len, data) = match block {
            Block::SectionHeader(_) => {
                ifaces.clear();
                continue;
            }
            Block::InterfaceDescription(idb) => {
                let tsresol = idb
                    .options
                    .iter()
                    .find_map(|o| match o {
                        InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                        _ => None,
                    })
                    .unwrap_or(6);
                ifaces.push(Iface {
                    link: LinkType::from_linktype(u32::from(idb.linktype)),
                    tsresol,
                });
                continue;
            }
            // pcap-file hands the raw 64-bit timestamp as nanoseconds,
            // whatever the interface's resolution; undone below.
            Block::EnhancedPacket(epb) => (
                epb.interface_id,
                u64::try_from(epb.timestamp.as_nanos()).unwrap_or(u64::MAX),
                epb.original_len,
                epb.data,
            ),
            Block::Packet(pb) => (
                u32::from(pb.interface_id),
                pb.timestamp,
                pb.original_len,
                pb.data,
            ),
            Block::SimplePacket(spb) => {
                let n = spb.data.len().min(spb.original_len as usize);
                let data = match spb.data {
                    Cow::Borrowed(b) => Cow::Borrowed(&b[..n]),
                    Cow::Owned(mut v) => {
                        v.truncate(n);
                        Cow::Owned(v)
                    }
                };
                (0, 0, spb.original_len, data)
            }
            _ => continue,
        };
        *frames += 1;
        let Some(iface) = ifaces.get(interface as usize) else {
            return Some(Err(CaptureError::UnknownInterface {
                frame: *frames,
                interface,
            }));
        };
        scratch.clear();
        scratch.extend_from_slice(&data);
        return Some(Ok(Record {
            index: *frames,
            timestamp: scale_timestamp(raw_ts, iface.tsresol),
            link: iface.link,
            orig_len,
            data: scratch,
        }));
    }
}

/// A pcapng timestamp in units of the interface's `if_tsresol`: bit 7
/// clear, 10^-n s; set, 2^-n s.
fn scale_timestamp(raw: u64, tsresol: u8) -> Duration {
    let e = u32::from(tsresol & 0x7f);
    let raw = u128::from(raw);
    let nanos: u128 = if tsresol & 0x80 == 0 {
        if e <= 9 {
            raw * 10u128.pow(9 - e)
        } else {
            10u128.checked_pow(e - 9).map_or(0, |d| raw / d)
        }
    } else {
        (raw * 1_000_000_000) >> e
    };
    let secs = u64::try_from(nanos / 1_000_000_000).unwrap_or(u64::MAX);
    // < 1e9, fits
    let sub = (nanos % 1_000_000_000) as u32;
    Duration::new(secs, sub)
}

/// Writes a classic pcap file, one frame at a time.
pub struct CaptureWriter<W: Write> {
    writer: PcapWriter<W>,
}

impl CaptureWriter<BufWriter<File>> {
    /// Creates (or truncates) an Ethernet pcap file.
    pub fn create(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        CaptureWriter::new(BufWriter::new(File::create(path)?))
    }
}

impl<W: Write> CaptureWriter<W> {
    /// Writes the header of an Ethernet pcap file to `writer`.
    pub fn new(writer: W) -> Result<Self, CaptureError> {
        CaptureWriter::with_link_type(writer, LinkType::Ethernet)
    }

    /// Writes the header of a pcap file of the given link type.
    pub fn with_link_type(writer: W, link: LinkType) -> Result<Self, CaptureError> {
        let header = PcapHeader {
            snaplen: SNAPLEN,
            datalink: DataLink::from(link.linktype()),
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::Little,
            ..PcapHeader::default()
        };
        Ok(CaptureWriter {
            writer: PcapWriter::with_header(writer, header)?,
        })
    }

    /// Appends one frame captured at `timestamp` (since the Unix epoch;
    /// stored to the microsecond, seconds up to `u32::MAX`).
    pub fn write(&mut self, timestamp: Duration, frame: &[u8]) -> Result<(), CaptureError> {
        let len = u32::try_from(frame.len())
            .ok()
            .filter(|&n| n <= SNAPLEN)
            .ok_or(CaptureError::Malformed(format!(
                "frame of {} bytes is longer than the snapshot length {SNAPLEN}",
                frame.len()
            )))?;
        self.writer
            .write_packet(&PcapPacket::new(timestamp, len, frame))?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(self) -> Result<W, CaptureError> {
        let mut w = self.writer.into_writer();
        w.flush()?;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
    use pcap_file::pcapng::PcapNgWriter;

    fn frames() -> Vec<(Duration, Vec<u8>)> {
        (0..5u8)
            .map(|i| {
                (
                    Duration::new(1_700_000_000 + u64::from(i), u32::from(i) * 1_001_000),
                    vec![i; 60 + usize::from(i)],
                )
            })
            .collect()
    }

    /// (index, timestamp, link type, original length, data)
    type Owned = (u64, Duration, LinkType, u32, Vec<u8>);

    fn read_all<R: Read>(mut r: CaptureReader<R>) -> Vec<Result<Owned, String>> {
        let mut out = Vec::new();
        while let Some(rec) = r.next_record() {
            out.push(
                rec.map(|r| (r.index, r.timestamp, r.link, r.orig_len, r.data.to_vec()))
                    .map_err(|e| e.to_string()),
            );
        }
        out
    }

    #[test]
    fn pcap_roundtrip() {
        let mut w = CaptureWriter::new(Vec::new()).unwrap();
        for (ts, f) in frames() {
            w.write(ts, &f).unwrap();
        }
        let bytes = w.finish().unwrap();
        assert_eq!(&bytes[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
        // link type 1 at offset 20
        assert_eq!(&bytes[20..24], &[1, 0, 0, 0]);
        let r = CaptureReader::new(&bytes[..]).unwrap();
        assert_eq!(r.format(), Format::Pcap);
        assert_eq!(r.pcap_link_type(), Some(LinkType::Ethernet));
        let got = read_all(r);
        assert_eq!(got.len(), 5);
        for (i, (g, (ts, f))) in got.into_iter().zip(frames()).enumerate() {
            let g = g.unwrap();
            assert_eq!(g, (i as u64 + 1, ts, LinkType::Ethernet, f.len() as u32, f));
        }
    }

    #[test]
    fn pcap_other_link_types_and_files() {
        let dir = std::env::temp_dir().join(format!("uroce-pcap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("raw.pcap");
        let file = BufWriter::new(File::create(&path).unwrap());
        let mut w = CaptureWriter::with_link_type(file, LinkType::RawIp).unwrap();
        w.write(Duration::from_micros(1_500_000), &[0x45; 28])
            .unwrap();
        w.finish().unwrap();
        let mut r = CaptureReader::open(&path).unwrap();
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.link, LinkType::RawIp);
        assert_eq!(rec.timestamp, Duration::from_millis(1500));
        assert!(r.next_record().is_none());
        assert!(r.next_record().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            CaptureReader::open(dir.join("missing.pcap")),
            Err(CaptureError::Io(_))
        ));
    }

    #[test]
    fn pcap_big_endian_nanoseconds() {
        let header = PcapHeader {
            datalink: DataLink::LINUX_SLL2,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Big,
            ..PcapHeader::default()
        };
        let mut w = PcapWriter::with_header(Vec::new(), header).unwrap();
        let ts = Duration::new(12, 345_678_901);
        w.write_packet(&PcapPacket::new(ts, 30, &[7; 30])).unwrap();
        let bytes = w.into_writer();
        let got = read_all(CaptureReader::new(&bytes[..]).unwrap());
        assert_eq!(got, vec![Ok((1, ts, LinkType::LinuxSll2, 30, vec![7; 30]))]);
    }

    #[test]
    fn pcapng_interfaces_and_resolutions() {
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        // interface 0: Ethernet, default (microsecond) resolution
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0xffff))
            .unwrap();
        // interface 1: SLL, nanosecond resolution
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::LINUX_SLL,
            snaplen: 0xffff,
            options: vec![InterfaceDescriptionOption::IfTsResol(9)],
        })
        .unwrap();
        // interface 2: raw IPv4, 2^-10 s
        w.write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::IPV4,
            snaplen: 0xffff,
            options: vec![InterfaceDescriptionOption::IfTsResol(0x80 | 10)],
        })
        .unwrap();
        // pcap-file writes the raw timestamp units as "nanoseconds"
        let epb = |iface: u32, raw: u64, data: &'static [u8]| EnhancedPacketBlock {
            interface_id: iface,
            timestamp: Duration::from_nanos(raw),
            original_len: data.len() as u32,
            data: Cow::Borrowed(data),
            options: vec![],
        };
        w.write_pcapng_block(epb(0, 1_700_000_000_123_456, &[1; 20]))
            .unwrap();
        w.write_pcapng_block(epb(1, 1_700_000_000_123_456_789, &[2; 21]))
            .unwrap();
        w.write_pcapng_block(epb(2, 3 * 1024 + 512, &[0x45; 22]))
            .unwrap();
        w.write_pcapng_block(SimplePacketBlock {
            original_len: 3,
            data: Cow::Borrowed(&[9, 9, 9]),
        })
        .unwrap();
        let bytes = w.into_inner();
        let r = CaptureReader::new(&bytes[..]).unwrap();
        assert_eq!(r.format(), Format::PcapNg);
        assert_eq!(r.pcap_link_type(), None);
        let got = read_all(r);
        assert_eq!(
            got,
            vec![
                Ok((
                    1,
                    Duration::new(1_700_000_000, 123_456_000),
                    LinkType::Ethernet,
                    20,
                    vec![1; 20]
                )),
                Ok((
                    2,
                    Duration::new(1_700_000_000, 123_456_789),
                    LinkType::LinuxSll,
                    21,
                    vec![2; 21]
                )),
                Ok((
                    3,
                    Duration::from_millis(3500),
                    LinkType::RawIp,
                    22,
                    vec![0x45; 22]
                )),
                // padding of the simple packet block cut off
                Ok((4, Duration::ZERO, LinkType::Ethernet, 3, vec![9, 9, 9])),
            ]
        );
    }

    #[test]
    fn pcapng_unknown_interface_is_not_fatal() {
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0xffff))
            .unwrap();
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::ZERO,
            original_len: 4,
            data: Cow::Borrowed(&[1, 2, 3, 4]),
            options: vec![],
        })
        .unwrap();
        let mut bytes = w.into_inner();
        // A second EPB on interface 5: the writer refuses to write it, so
        // patch the interface ID of a copy.
        let epb_start = bytes.len() - 36;
        let mut copy = bytes[epb_start..].to_vec();
        copy[8] = 5;
        bytes.extend_from_slice(&copy);
        let got = read_all(CaptureReader::new(&bytes[..]).unwrap());
        assert_eq!(got.len(), 2);
        assert!(got[0].is_ok());
        assert_eq!(
            got[1],
            Err("frame 2: packet on interface 5, which the file does not describe".into())
        );
    }

    #[test]
    fn bad_files_are_errors() {
        assert!(matches!(
            CaptureReader::new(&b""[..]),
            Err(CaptureError::NotACapture(_))
        ));
        assert!(matches!(
            CaptureReader::new(&b"GET / HTTP/1.1"[..]),
            Err(CaptureError::NotACapture(_))
        ));
        // pcap header cut short
        assert!(matches!(
            CaptureReader::new(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0][..]),
            Err(CaptureError::Truncated)
        ));
        // a record cut short: the first record is read, then an error, then the end
        let mut w = CaptureWriter::new(Vec::new()).unwrap();
        w.write(Duration::ZERO, &[1; 40]).unwrap();
        w.write(Duration::ZERO, &[2; 40]).unwrap();
        let bytes = w.finish().unwrap();
        let mut r = CaptureReader::new(&bytes[..bytes.len() - 10]).unwrap();
        assert!(r.next_record().unwrap().is_ok());
        assert!(matches!(
            r.next_record(),
            Some(Err(CaptureError::Truncated))
        ));
        assert!(r.next_record().is_none());
        // every prefix of a pcapng file: errors, never a panic
        let mut w = PcapNgWriter::new(Vec::new()).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0xffff))
            .unwrap();
        w.write_pcapng_block(EnhancedPacketBlock {
            interface_id: 0,
            timestamp: Duration::ZERO,
            original_len: 5,
            data: Cow::Borrowed(&[1, 2, 3, 4, 5]),
            options: vec![],
        })
        .unwrap();
        let ng = w.into_inner();
        for n in 0..ng.len() {
            if let Ok(r) = CaptureReader::new(&ng[..n]) {
                let _ = read_all(r);
            }
        }
        // a frame over the snapshot length is refused by the writer
        let mut w = CaptureWriter::new(Vec::new()).unwrap();
        assert!(w.write(Duration::ZERO, &vec![0; 300_000]).is_err());
    }

    #[test]
    fn timestamp_scaling() {
        assert_eq!(scale_timestamp(1_500_000, 6), Duration::from_millis(1500));
        assert_eq!(scale_timestamp(15, 1), Duration::from_millis(1500));
        assert_eq!(
            scale_timestamp(1_500_000_000_000, 12),
            Duration::from_millis(1500)
        );
        assert_eq!(scale_timestamp(u64::MAX, 127), Duration::ZERO);
        assert_eq!(scale_timestamp(3, 0x81), Duration::from_millis(1500));
        assert_eq!(scale_timestamp(u64::MAX, 0xff), Duration::ZERO);
        let _ = scale_timestamp(u64::MAX, 0);
    }
}
