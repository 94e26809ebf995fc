//! Ethernet / IPv4 / IPv6 / UDP framing around RoCEv2 packets, for
//! captures and raw sockets.
//!
//! *Building.* [`build_roce_frame`] writes a whole Ethernet frame (Ethernet
//! II, IPv4 with DF or IPv6, UDP to port 4791, the RoCEv2 packet with its
//! ICRC) into a caller's buffer. The ICRC is computed over the very IP and
//! UDP headers that go into the frame ([`FrameParams::ip_context`]), so the
//! two can never disagree. [`build_frame`] wraps a UDP payload that was
//! built elsewhere (by [`packet::emit`] with `params.ip_context()`), and
//! [`write_headers`] does the same around a payload already in place.
//! A raw IP socket takes the frame from [`ETH_HDR_LEN`] on.
//!
//! *Parsing.* [`parse_frame`] takes a captured frame of a given
//! [`LinkType`] (Ethernet with at most one VLAN tag, Linux cooked SLL and
//! SLL2, raw IP) and returns the addresses, ports, the raw IP and UDP
//! headers (for [`icrc::compute_with_ip_header`]: exact ICRC
//! verification) and the UDP payload, cut to the IP and UDP lengths so
//! that Ethernet trailer padding is ignored. A well-formed frame that is
//! not UDP to or from port 4791 is `Ok(None)`; a frame whose IP or UDP
//! header is inconsistent is an error. Lengths are checked here before any
//! `pnet_packet` view is made, so no input can make the parser panic, and
//! nothing is allocated.
//!
//! Not handled, by design: IPv6 extension headers (the frame is reported
//! as not UDP, `Ok(None)`), IPv4 reassembly (a fragment of a RoCEv2
//! datagram is an error; a non-first fragment has no UDP header and is
//! `Ok(None)`), IPv6 jumbograms, and more than one VLAN tag.
//!
//! [`packet::emit`]: crate::packet::emit

use crate::error::{check_len, Error, Result};
use crate::icrc::{self, IpContext, IpFields, IPV4_DF};
use crate::packet::{self, Headers};
use crate::ROCEV2_UDP_PORT;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use pnet_packet::ethernet::{EtherType, EthernetPacket, MutableEthernetPacket};
use pnet_packet::ip::IpNextHeaderProtocols;
use pnet_packet::ipv4::{self, Ipv4Packet, MutableIpv4Packet};
use pnet_packet::ipv6::{Ipv6Packet, MutableIpv6Packet};
use pnet_packet::sll::SLLPacket;
use pnet_packet::sll2::SLL2Packet;
use pnet_packet::udp::{self, MutableUdpPacket, UdpPacket};

/// Length of an Ethernet II header.
pub const ETH_HDR_LEN: usize = 14;
/// Length of an 802.1Q VLAN tag.
pub const VLAN_TAG_LEN: usize = 4;
/// Length of an IPv4 header without options.
pub const IPV4_HDR_LEN: usize = 20;
/// Length of the fixed IPv6 header.
pub const IPV6_HDR_LEN: usize = 40;
/// Length of a UDP header.
pub const UDP_HDR_LEN: usize = 8;
/// Length of a Linux cooked-capture (SLL) header.
pub const SLL_HDR_LEN: usize = 16;
/// Length of a Linux cooked-capture v2 (SLL2) header.
pub const SLL2_HDR_LEN: usize = 20;
/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// EtherType of an 802.1ad (QinQ service) tag, accepted as a single tag.
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// The TTL / hop limit [`FrameParams::v4`] and [`FrameParams::v6`] use.
pub const DEFAULT_TTL: u8 = 64;

const IPPROTO_UDP: u8 = 17;

/// The link-layer header type of a captured frame: the pcap `LINKTYPE_`
/// values the parser understands, and any other value as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// Ethernet II (`LINKTYPE_ETHERNET`, 1), optionally one VLAN tag.
    Ethernet,
    /// Linux cooked capture v1 (`LINKTYPE_LINUX_SLL`, 113): 16-byte header.
    LinuxSll,
    /// Linux cooked capture v2 (`LINKTYPE_LINUX_SLL2`, 276): 20-byte header.
    LinuxSll2,
    /// Raw IPv4 or IPv6, told apart by the version nibble
    /// (`LINKTYPE_RAW` 101, `LINKTYPE_IPV4` 228, `LINKTYPE_IPV6` 229, and
    /// the platform-specific `DLT_RAW` values 12 and 14).
    RawIp,
    /// A link type this crate does not parse; [`parse_frame`] refuses it.
    Other(u32),
}

impl LinkType {
    /// The link type of a pcap/pcapng `LINKTYPE_` number.
    pub const fn from_linktype(v: u32) -> LinkType {
        match v {
            1 => LinkType::Ethernet,
            113 => LinkType::LinuxSll,
            276 => LinkType::LinuxSll2,
            12 | 14 | 101 | 228 | 229 => LinkType::RawIp,
            v => LinkType::Other(v),
        }
    }
    /// The `LINKTYPE_` number to write in a capture file (raw IP: 101).
    pub const fn linktype(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::LinuxSll => 113,
            LinkType::LinuxSll2 => 276,
            LinkType::RawIp => 101,
            LinkType::Other(v) => v,
        }
    }
    /// Whether [`parse_frame`] can parse frames of this type.
    pub const fn is_supported(self) -> bool {
        !matches!(self, LinkType::Other(_))
    }
}

/// A parsed UDP datagram, borrowing the frame it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The VLAN ID of the frame's 802.1Q tag, if it had one.
    pub vlan: Option<u16>,
    /// Source IP address.
    pub src: IpAddr,
    /// Destination IP address.
    pub dst: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// The IP header as on the wire: IPv4 with its options, or the fixed
    /// 40-byte IPv6 header.
    pub ip_header: &'a [u8],
    /// The 8-byte UDP header as on the wire.
    pub udp_header: &'a [u8],
    /// The UDP payload (for RoCEv2: BTH to ICRC), cut to the UDP length.
    pub payload: &'a [u8],
}

impl Frame<'_> {
    /// The IPv4 identification and flags/fragment offset, or `None` for
    /// IPv6.
    pub fn ipv4_ident(&self) -> Option<(u16, u16)> {
        match self.src {
            IpAddr::V4(_) => Some((be16(self.ip_header, 4), be16(self.ip_header, 6))),
            IpAddr::V6(_) => None,
        }
    }

    /// The ICRC context of this frame's real headers (addresses, ports,
    /// and for IPv4 the identification and flags). Exact for frames
    /// whose IPv4 header has no options; [`Frame::compute_icrc`] is exact
    /// for all.
    pub fn ip_context(&self) -> IpContext {
        let ip = match (self.src, self.dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let (ident, flags_frag) = self.ipv4_ident().unwrap_or((0, 0));
                IpFields::V4 {
                    src,
                    dst,
                    ident,
                    flags_frag,
                }
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => IpFields::V6 { src, dst },
            // A frame from `parse_frame` never mixes versions; map the
            // impossible case to IPv4-mapped IPv6 rather than panic.
            (s, d) => IpFields::V6 {
                src: to_v6(s),
                dst: to_v6(d),
            },
        };
        IpContext {
            ip,
            src_port: self.src_port,
            dst_port: self.dst_port,
        }
    }

    /// The ICRC of the UDP payload computed over the frame's own IP and
    /// UDP headers ([`icrc::compute_with_ip_header`]).
    pub fn compute_icrc(&self) -> Result<u32> {
        icrc::compute_with_ip_header(self.ip_header, self.udp_header, self.payload)
    }

    /// Checks the stored ICRC against [`Frame::compute_icrc`]: exact
    /// verification (unlike [`icrc::verify`], not relaxed under
    /// `cfg(fuzzing)`).
    pub fn verify_icrc(&self) -> Result<()> {
        let computed = self.compute_icrc()?;
        let found = icrc::stored(self.payload).unwrap_or(0);
        if computed == found {
            Ok(())
        } else {
            Err(Error::IcrcMismatch { found, computed })
        }
    }
}

fn to_v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(s) => u16::from_be_bytes([s[0], s[1]]),
        None => 0,
    }
}

/// Parses a captured frame and returns its UDP datagram if it is to or
/// from the RoCEv2 port 4791 (either direction).
///
/// `Ok(None)`: a well-formed frame that is not IPv4/IPv6 UDP to or from
/// port 4791 (ARP, TCP, other UDP, IPv6 with extension headers, non-first
/// IPv4 fragments). `Err`: an unsupported link type, a frame too short for
/// its headers, an IP or UDP header whose fields are inconsistent or whose
/// lengths run past the captured bytes, or a fragmented RoCEv2 datagram.
pub fn parse_frame(link: LinkType, bytes: &[u8]) -> Result<Option<Frame<'_>>> {
    parse_frame_on_port(link, bytes, ROCEV2_UDP_PORT)
}

/// [`parse_frame`] for UDP to or from another port.
pub fn parse_frame_on_port(link: LinkType, bytes: &[u8], port: u16) -> Result<Option<Frame<'_>>> {
    let mut vlan = None;
    let (ethertype, l3) = match link {
        LinkType::Ethernet => {
            check_len("Ethernet header", bytes, ETH_HDR_LEN)?;
            let eth = EthernetPacket::new(bytes).ok_or(Error::Truncated {
                what: "Ethernet header",
                need: ETH_HDR_LEN,
                have: bytes.len(),
            })?;
            let et = eth.get_ethertype().0;
            if et == ETHERTYPE_VLAN || et == ETHERTYPE_QINQ {
                check_len("802.1Q tag", bytes, ETH_HDR_LEN + VLAN_TAG_LEN)?;
                vlan = Some(be16(bytes, ETH_HDR_LEN) & 0x0fff);
                (
                    be16(bytes, ETH_HDR_LEN + 2),
                    &bytes[ETH_HDR_LEN + VLAN_TAG_LEN..],
                )
            } else {
                (et, &bytes[ETH_HDR_LEN..])
            }
        }
        LinkType::LinuxSll => {
            check_len("Linux SLL header", bytes, SLL_HDR_LEN)?;
            let sll = SLLPacket::new(bytes).ok_or(Error::Truncated {
                what: "Linux SLL header",
                need: SLL_HDR_LEN,
                have: bytes.len(),
            })?;
            (sll.get_protocol().0, &bytes[SLL_HDR_LEN..])
        }
        LinkType::LinuxSll2 => {
            check_len("Linux SLL2 header", bytes, SLL2_HDR_LEN)?;
            let sll = SLL2Packet::new(bytes).ok_or(Error::Truncated {
                what: "Linux SLL2 header",
                need: SLL2_HDR_LEN,
                have: bytes.len(),
            })?;
            (sll.get_protocol_type().0, &bytes[SLL2_HDR_LEN..])
        }
        LinkType::RawIp => match bytes.first().map(|b| b >> 4) {
            Some(4) => (ETHERTYPE_IPV4, bytes),
            Some(6) => (ETHERTYPE_IPV6, bytes),
            Some(_) => return Err(Error::NotRoce("raw IP frame is neither IPv4 nor IPv6")),
            None => {
                return Err(Error::Truncated {
                    what: "IP header",
                    need: 1,
                    have: 0,
                })
            }
        },
        LinkType::Other(_) => return Err(Error::NotRoce("unsupported link type")),
    };
    match ethertype {
        ETHERTYPE_IPV4 => parse_ipv4(l3, vlan, port),
        ETHERTYPE_IPV6 => parse_ipv6(l3, vlan, port),
        _ => Ok(None),
    }
}

fn parse_ipv4(l3: &[u8], vlan: Option<u16>, port: u16) -> Result<Option<Frame<'_>>> {
    check_len("IPv4 header", l3, IPV4_HDR_LEN)?;
    let ip = Ipv4Packet::new(l3).ok_or(Error::Truncated {
        what: "IPv4 header",
        need: IPV4_HDR_LEN,
        have: l3.len(),
    })?;
    if ip.get_version() != 4 {
        return Err(Error::NotRoce("IPv4 header with a version other than 4"));
    }
    let ihl = ip.get_header_length() as usize * 4;
    if ihl < IPV4_HDR_LEN {
        return Err(Error::NotRoce("IPv4 IHL < 5"));
    }
    check_len("IPv4 header with options", l3, ihl)?;
    let total = ip.get_total_length() as usize;
    if total < ihl {
        return Err(Error::NotRoce("IPv4 total length shorter than its header"));
    }
    check_len("IPv4 packet (total length)", l3, total)?;
    if ip.get_next_level_protocol() != IpNextHeaderProtocols::Udp {
        return Ok(None);
    }
    if ip.get_fragment_offset() != 0 {
        // A later fragment: no UDP header to look at.
        return Ok(None);
    }
    let more_fragments = ip.get_flags() & 0x1 != 0;
    let src = IpAddr::V4(ip.get_source());
    let dst = IpAddr::V4(ip.get_destination());
    parse_udp(
        &l3[..ihl],
        &l3[ihl..total],
        src,
        dst,
        vlan,
        port,
        more_fragments,
    )
}

fn parse_ipv6(l3: &[u8], vlan: Option<u16>, port: u16) -> Result<Option<Frame<'_>>> {
    check_len("IPv6 header", l3, IPV6_HDR_LEN)?;
    let ip = Ipv6Packet::new(l3).ok_or(Error::Truncated {
        what: "IPv6 header",
        need: IPV6_HDR_LEN,
        have: l3.len(),
    })?;
    if ip.get_version() != 6 {
        return Err(Error::NotRoce("IPv6 header with a version other than 6"));
    }
    let total = IPV6_HDR_LEN + ip.get_payload_length() as usize;
    check_len("IPv6 packet (payload length)", l3, total)?;
    if ip.get_next_header().0 != IPPROTO_UDP {
        return Ok(None);
    }
    let src = IpAddr::V6(ip.get_source());
    let dst = IpAddr::V6(ip.get_destination());
    parse_udp(
        &l3[..IPV6_HDR_LEN],
        &l3[IPV6_HDR_LEN..total],
        src,
        dst,
        vlan,
        port,
        false,
    )
}

fn parse_udp<'a>(
    ip_header: &'a [u8],
    ip_payload: &'a [u8],
    src: IpAddr,
    dst: IpAddr,
    vlan: Option<u16>,
    port: u16,
    fragmented: bool,
) -> Result<Option<Frame<'a>>> {
    check_len("UDP header", ip_payload, UDP_HDR_LEN)?;
    let u = UdpPacket::new(ip_payload).ok_or(Error::Truncated {
        what: "UDP header",
        need: UDP_HDR_LEN,
        have: ip_payload.len(),
    })?;
    let (src_port, dst_port) = (u.get_source(), u.get_destination());
    if src_port != port && dst_port != port {
        return Ok(None);
    }
    if fragmented {
        return Err(Error::NotRoce(
            "fragmented IPv4 datagram (reassembly is not supported)",
        ));
    }
    let udp_len = u.get_length() as usize;
    if udp_len < UDP_HDR_LEN {
        return Err(Error::NotRoce("UDP length < 8"));
    }
    check_len("UDP datagram (UDP length)", ip_payload, udp_len)?;
    Ok(Some(Frame {
        vlan,
        src,
        dst,
        src_port,
        dst_port,
        ip_header,
        udp_header: &ip_payload[..UDP_HDR_LEN],
        payload: &ip_payload[UDP_HDR_LEN..udp_len],
    }))
}

/// IP-layer fields of a frame to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpParams {
    /// An IPv4 header without options.
    V4 {
        /// Source address.
        src: Ipv4Addr,
        /// Destination address.
        dst: Ipv4Addr,
        /// Identification. Covered by the ICRC.
        ident: u16,
        /// The DF flag. Covered by the ICRC.
        dont_fragment: bool,
        /// Type of service (DSCP and ECN).
        tos: u8,
        /// Time to live.
        ttl: u8,
    },
    /// An IPv6 header without extension headers.
    V6 {
        /// Source address.
        src: Ipv6Addr,
        /// Destination address.
        dst: Ipv6Addr,
        /// Traffic class (DSCP and ECN).
        traffic_class: u8,
        /// Flow label (20 bits).
        flow_label: u32,
        /// Hop limit.
        hop_limit: u8,
    },
}

impl IpParams {
    /// Length of the IP header these parameters produce.
    pub const fn header_len(&self) -> usize {
        match self {
            IpParams::V4 { .. } => IPV4_HDR_LEN,
            IpParams::V6 { .. } => IPV6_HDR_LEN,
        }
    }
}

/// Everything about a frame to build except its UDP payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameParams {
    /// Ethernet source address.
    pub src_mac: [u8; 6],
    /// Ethernet destination address.
    pub dst_mac: [u8; 6],
    /// IP header fields.
    pub ip: IpParams,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Compute the UDP checksum. `false` writes 0 ("no checksum"), which
    /// only IPv4 allows (and which kernel rxe sends).
    pub udp_checksum: bool,
}

impl FrameParams {
    /// IPv4 to port 4791 with DF, the given identification, TOS 0, TTL 64
    /// and a computed UDP checksum.
    pub const fn v4(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv4Addr,
        dst: Ipv4Addr,
        ident: u16,
        src_port: u16,
    ) -> FrameParams {
        FrameParams {
            src_mac,
            dst_mac,
            ip: IpParams::V4 {
                src,
                dst,
                ident,
                dont_fragment: true,
                tos: 0,
                ttl: DEFAULT_TTL,
            },
            src_port,
            dst_port: ROCEV2_UDP_PORT,
            udp_checksum: true,
        }
    }

    /// IPv6 to port 4791 with traffic class 0, flow label 0, hop limit 64
    /// and a computed UDP checksum.
    pub const fn v6(
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        src: Ipv6Addr,
        dst: Ipv6Addr,
        src_port: u16,
    ) -> FrameParams {
        FrameParams {
            src_mac,
            dst_mac,
            ip: IpParams::V6 {
                src,
                dst,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: DEFAULT_TTL,
            },
            src_port,
            dst_port: ROCEV2_UDP_PORT,
            udp_checksum: true,
        }
    }

    /// The ICRC context of the headers [`write_headers`] writes: build
    /// the RoCEv2 packet with this and the frame's ICRC is right.
    pub const fn ip_context(&self) -> IpContext {
        let ip = match self.ip {
            IpParams::V4 {
                src,
                dst,
                ident,
                dont_fragment,
                ..
            } => IpFields::V4 {
                src,
                dst,
                ident,
                flags_frag: if dont_fragment { IPV4_DF } else { 0 },
            },
            IpParams::V6 { src, dst, .. } => IpFields::V6 { src, dst },
        };
        IpContext {
            ip,
            src_port: self.src_port,
            dst_port: self.dst_port,
        }
    }

    /// Length of the Ethernet, IP and UDP headers: the UDP payload starts
    /// at this offset in the frame.
    pub const fn header_len(&self) -> usize {
        ETH_HDR_LEN + self.ip.header_len() + UDP_HDR_LEN
    }

    /// Length of a frame carrying `udp_payload_len` bytes of UDP payload.
    pub const fn frame_len(&self, udp_payload_len: usize) -> usize {
        self.header_len() + udp_payload_len
    }
}

/// Writes a whole frame: `udp_payload` (a RoCEv2 packet built with
/// [`FrameParams::ip_context`]) wrapped in Ethernet, IP and UDP headers.
/// Returns the frame length.
pub fn build_frame(p: &FrameParams, udp_payload: &[u8], buf: &mut [u8]) -> Result<usize> {
    let need = p.frame_len(udp_payload.len());
    if buf.len() < need {
        return Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        });
    }
    buf[p.header_len()..need].copy_from_slice(udp_payload);
    write_headers(p, udp_payload.len(), buf)
}

/// Builds the RoCEv2 packet (`headers`, `payload`, pad, ICRC computed for
/// this frame's headers) and the frame around it in one go. Returns the
/// frame length.
pub fn build_roce_frame(
    p: &FrameParams,
    headers: &Headers,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<usize> {
    let off = p.header_len();
    let have = buf.len();
    let room = buf.get_mut(off..).ok_or(Error::BufferTooSmall {
        need: off + packet::packet_len(headers, payload.len())?,
        have,
    })?;
    let n = packet::emit(headers, payload, room, &p.ip_context())?;
    write_headers(p, n, buf)
}

/// Writes the Ethernet, IP and UDP headers (with the IPv4 header checksum
/// and, unless disabled, the UDP checksum) in front of a UDP payload of
/// `udp_payload_len` bytes already at `buf[p.header_len()..]`. Returns
/// the frame length.
pub fn write_headers(p: &FrameParams, udp_payload_len: usize, buf: &mut [u8]) -> Result<usize> {
    let need = p.frame_len(udp_payload_len);
    if buf.len() < need {
        return Err(Error::BufferTooSmall {
            need,
            have: buf.len(),
        });
    }
    let udp_len = u16::try_from(UDP_HDR_LEN + udp_payload_len)
        .map_err(|_| Error::OutOfRange("UDP length over 65535"))?;
    let ip_off = ETH_HDR_LEN;
    let udp_off = ip_off + p.ip.header_len();
    let frame = &mut buf[..need];

    let ethertype = match p.ip {
        IpParams::V4 { .. } => ETHERTYPE_IPV4,
        IpParams::V6 { .. } => ETHERTYPE_IPV6,
    };
    {
        let mut eth = MutableEthernetPacket::new(&mut frame[..ETH_HDR_LEN])
            .ok_or(Error::BufferTooSmall { need, have: 0 })?;
        eth.set_destination(p.dst_mac.into());
        eth.set_source(p.src_mac.into());
        eth.set_ethertype(EtherType(ethertype));
    }

    {
        let mut u = MutableUdpPacket::new(&mut frame[udp_off..udp_off + UDP_HDR_LEN])
            .ok_or(Error::BufferTooSmall { need, have: 0 })?;
        u.set_source(p.src_port);
        u.set_destination(p.dst_port);
        u.set_length(udp_len);
        u.set_checksum(0);
    }

    write_ip_header(&p.ip, udp_payload_len, &mut frame[ip_off..udp_off])?;
    match p.ip {
        IpParams::V4 { src, dst, .. } => {
            if p.udp_checksum {
                let c = UdpPacket::new(&frame[udp_off..])
                    .map(|u| udp::ipv4_checksum(&u, &src, &dst))
                    .unwrap_or(0);
                set_udp_checksum(frame, udp_off, c);
            }
        }
        IpParams::V6 { src, dst, .. } => {
            if !p.udp_checksum {
                return Err(Error::OutOfRange("UDP checksum 0 is not allowed over IPv6"));
            }
            let c = UdpPacket::new(&frame[udp_off..])
                .map(|u| udp::ipv6_checksum(&u, &src, &dst))
                .unwrap_or(0);
            set_udp_checksum(frame, udp_off, c);
        }
    }
    Ok(need)
}

/// Writes the IP header alone (IPv4 with its header checksum, or IPv6) for
/// a UDP datagram whose payload is `udp_payload_len` bytes, at the start
/// of `out`. Returns the header length. (Also what a UD receive buffer's
/// GRH area holds.)
pub fn write_ip_header(ip: &IpParams, udp_payload_len: usize, out: &mut [u8]) -> Result<usize> {
    let len = ip.header_len();
    let have = out.len();
    let out = out
        .get_mut(..len)
        .ok_or(Error::BufferTooSmall { need: len, have })?;
    let too_small = Error::BufferTooSmall { need: len, have };
    match *ip {
        IpParams::V4 {
            src,
            dst,
            ident,
            dont_fragment,
            tos,
            ttl,
        } => {
            let total = u16::try_from(IPV4_HDR_LEN + UDP_HDR_LEN + udp_payload_len)
                .map_err(|_| Error::OutOfRange("IPv4 total length over 65535"))?;
            let mut h = MutableIpv4Packet::new(out).ok_or(too_small)?;
            h.set_version(4);
            h.set_header_length(5);
            h.set_dscp(tos >> 2);
            h.set_ecn(tos & 0x3);
            h.set_total_length(total);
            h.set_identification(ident);
            h.set_flags(if dont_fragment { 0b010 } else { 0 });
            h.set_fragment_offset(0);
            h.set_ttl(ttl);
            h.set_next_level_protocol(IpNextHeaderProtocols::Udp);
            h.set_checksum(0);
            h.set_source(src);
            h.set_destination(dst);
            let c = ipv4::checksum(&h.to_immutable());
            h.set_checksum(c);
        }
        IpParams::V6 {
            src,
            dst,
            traffic_class,
            flow_label,
            hop_limit,
        } => {
            if flow_label > 0x000f_ffff {
                return Err(Error::OutOfRange("IPv6 flow label over 20 bits"));
            }
            let udp_len = u16::try_from(UDP_HDR_LEN + udp_payload_len)
                .map_err(|_| Error::OutOfRange("UDP length over 65535"))?;
            let mut h = MutableIpv6Packet::new(out).ok_or(too_small)?;
            h.set_version(6);
            h.set_traffic_class(traffic_class);
            h.set_flow_label(flow_label);
            h.set_payload_length(udp_len);
            h.set_next_header(IpNextHeaderProtocols::Udp);
            h.set_hop_limit(hop_limit);
            h.set_source(src);
            h.set_destination(dst);
        }
    }
    Ok(len)
}

/// True if `h` starts with an option-less IPv4 header whose header
/// checksum verifies.
pub fn ipv4_header_valid(h: &[u8]) -> bool {
    match Ipv4Packet::new(h) {
        Some(ip) => {
            ip.get_version() == 4
                && ip.get_header_length() == 5
                && ipv4::checksum(&ip) == ip.get_checksum()
        }
        None => false,
    }
}

/// Stores a computed UDP checksum; a computed 0 goes on the wire as
/// 0xffff (RFC 768), 0 meaning "no checksum".
fn set_udp_checksum(frame: &mut [u8], udp_off: usize, c: u16) {
    let c = if c == 0 { 0xffff } else { c };
    frame[udp_off + 6..udp_off + 8].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bth::BthRepr;
    use crate::opcode::Opcode;
    use crate::psn::Psn;

    const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

    /// shared/roce-check/ICRC.md example 1 (bytes built by scapy): RC
    /// SEND_ONLY over IPv4, TOS 0x6a, TTL 1, DF, ID 0xec3b, UDP checksum 0,
    /// 3 bytes of payload + 1 pad byte.
    const EX1_FRAME: [u8; 62] = [
        // Ethernet
        0x02, 0, 0, 0, 0, 0x0b, 0x02, 0, 0, 0, 0, 0x0a, 0x08, 0x00, //
        // IPv4
        0x45, 0x6a, 0x00, 0x30, 0xec, 0x3b, 0x40, 0x00, 0x01, 0x11, 0xf7, 0xc3, 0xc0, 0xa8, 0x0a,
        0x01, 0xc0, 0xa8, 0x0a, 0x02, //
        // UDP
        0xc1, 0x13, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, //
        // BTH
        0x04, 0x50, 0x80, 0x01, 0x00, 0x1d, 0x3a, 0x6a, 0x80, 0x1b, 0x4b, 0x3d, //
        // payload, pad, ICRC
        0xdd, 0xe4, 0xeb, 0x00, 0xea, 0xdd, 0x47, 0x88,
    ];

    fn ex1_params() -> FrameParams {
        FrameParams {
            ip: IpParams::V4 {
                src: Ipv4Addr::new(192, 168, 10, 1),
                dst: Ipv4Addr::new(192, 168, 10, 2),
                ident: 0xec3b,
                dont_fragment: true,
                tos: 0x6a,
                ttl: 1,
            },
            src_port: 0xc113,
            udp_checksum: false,
            ..FrameParams::v4(
                MAC_A,
                MAC_B,
                Ipv4Addr::UNSPECIFIED,
                Ipv4Addr::UNSPECIFIED,
                0,
                0,
            )
        }
    }

    #[test]
    fn builds_example1_byte_for_byte() {
        let p = ex1_params();
        let pkt = crate::packet::parse(&EX1_FRAME[42..]).unwrap();
        let mut buf = [0u8; 128];
        let n = build_roce_frame(&p, &pkt.headers(), pkt.payload, &mut buf).unwrap();
        assert_eq!(&buf[..n], &EX1_FRAME[..]);
        // and from a ready UDP payload
        let mut buf2 = [0u8; 128];
        let n2 = build_frame(&p, &EX1_FRAME[42..], &mut buf2).unwrap();
        assert_eq!(&buf2[..n2], &EX1_FRAME[..]);
    }

    #[test]
    fn parses_example1() {
        let f = parse_frame(LinkType::Ethernet, &EX1_FRAME)
            .unwrap()
            .unwrap();
        assert_eq!(f.src, IpAddr::V4(Ipv4Addr::new(192, 168, 10, 1)));
        assert_eq!(f.dst, IpAddr::V4(Ipv4Addr::new(192, 168, 10, 2)));
        assert_eq!((f.src_port, f.dst_port), (0xc113, 4791));
        assert_eq!(f.vlan, None);
        assert_eq!(f.ip_header, &EX1_FRAME[14..34]);
        assert_eq!(f.udp_header, &EX1_FRAME[34..42]);
        assert_eq!(f.payload, &EX1_FRAME[42..]);
        assert_eq!(f.ipv4_ident(), Some((0xec3b, IPV4_DF)));
        assert_eq!(f.compute_icrc(), Ok(0x8847_ddea));
        f.verify_icrc().unwrap();
        assert_eq!(f.ip_context(), ex1_params().ip_context());
        // Trailer padding (60-byte minimum frames, FCS) is ignored.
        let mut padded = EX1_FRAME.to_vec();
        padded.extend_from_slice(&[0xaa; 10]);
        let g = parse_frame(LinkType::Ethernet, &padded).unwrap().unwrap();
        assert_eq!(g.payload, f.payload);
    }

    #[test]
    fn checksums_are_valid() {
        let mut p = ex1_params();
        p.udp_checksum = true;
        let mut buf = [0u8; 128];
        let n = build_frame(&p, &EX1_FRAME[42..], &mut buf).unwrap();
        // IPv4 header checksum: one's complement sum over the header is 0xffff.
        assert_eq!(ones_sum(&buf[14..34]), 0xffff);
        // UDP checksum over pseudo header + datagram.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&buf[26..34]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&((n - 34) as u16).to_be_bytes());
        pseudo.extend_from_slice(&buf[34..n]);
        assert_ne!(be16(&buf, 40), 0);
        assert_eq!(ones_sum(&pseudo), 0xffff);
        // The ICRC does not cover the UDP checksum.
        parse_frame(LinkType::Ethernet, &buf[..n])
            .unwrap()
            .unwrap()
            .verify_icrc()
            .unwrap();
    }

    fn ones_sum(b: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in b.chunks(2) {
            s += u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0));
        }
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    fn v6_params() -> FrameParams {
        let mut p = FrameParams::v6(
            MAC_A,
            MAC_B,
            "fd00::1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
            0xc0de,
        );
        if let IpParams::V6 {
            traffic_class,
            flow_label,
            hop_limit,
            ..
        } = &mut p.ip
        {
            *traffic_class = 0x68;
            *flow_label = 0xcc1de;
            *hop_limit = 255;
        }
        p
    }

    fn send_only() -> Headers {
        Headers::new(BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            pkey: 0xffff,
            dest_qp: 0x11,
            psn: Psn::new(7),
            ack_req: true,
            ..BthRepr::default()
        })
    }

    #[test]
    fn ipv6_golden_and_roundtrip() {
        let p = v6_params();
        let mut buf = [0u8; 128];
        let n = build_roce_frame(&p, &send_only(), b"abcde", &mut buf).unwrap();
        assert_eq!(n, 14 + 40 + 8 + 12 + 8 + 4);
        assert_eq!(&buf[12..14], &[0x86, 0xdd]);
        // version 6, TC 0x68, flow label 0xcc1de, payload length 32, UDP, hop 255
        assert_eq!(
            &buf[14..22],
            &[0x66, 0x8c, 0xc1, 0xde, 0x00, 0x20, 0x11, 0xff]
        );
        assert_eq!(&buf[54..60], &[0xc0, 0xde, 0x12, 0xb7, 0x00, 0x20]);
        let f = parse_frame(LinkType::Ethernet, &buf[..n]).unwrap().unwrap();
        assert_eq!(f.src, "fd00::1".parse::<IpAddr>().unwrap());
        assert_eq!(f.ipv4_ident(), None);
        assert_eq!(f.ip_context(), p.ip_context());
        f.verify_icrc().unwrap();
        let pkt = crate::packet::parse_verified(f.payload, &f.ip_context()).unwrap();
        assert_eq!(pkt.payload, b"abcde");
        // UDP checksum over the IPv6 pseudo header.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&buf[22..54]);
        pseudo.extend_from_slice(&[0, 0, 0, 32, 0, 0, 0, 17]);
        pseudo.extend_from_slice(&buf[54..n]);
        assert_eq!(ones_sum(&pseudo), 0xffff);
        // checksum 0 is refused over IPv6, bad flow label too
        let mut q = p;
        q.udp_checksum = false;
        assert!(matches!(
            build_roce_frame(&q, &send_only(), b"", &mut buf),
            Err(Error::OutOfRange(_))
        ));
        let mut q = p;
        if let IpParams::V6 { flow_label, .. } = &mut q.ip {
            *flow_label = 0x10_0000;
        }
        assert!(matches!(
            build_roce_frame(&q, &send_only(), b"", &mut buf),
            Err(Error::OutOfRange(_))
        ));
    }

    #[test]
    fn other_link_types() {
        let ip = &EX1_FRAME[14..];
        // raw IP
        let f = parse_frame(LinkType::RawIp, ip).unwrap().unwrap();
        assert_eq!(f.payload, &EX1_FRAME[42..]);
        // SLL: packet type, ARPHRD_ETHER, addr len 6, addr (8), protocol
        let mut sll = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 0x0a, 0, 0, 0x08, 0x00];
        sll.extend_from_slice(ip);
        let f = parse_frame(LinkType::LinuxSll, &sll).unwrap().unwrap();
        assert_eq!(f.udp_header, &EX1_FRAME[34..42]);
        // SLL2: protocol, reserved, ifindex, ARPHRD, packet type, addr len, addr
        let mut sll2 = vec![
            0x08, 0x00, 0, 0, 0, 0, 0, 1, 0, 1, 4, 6, 2, 0, 0, 0, 0, 0x0a, 0, 0,
        ];
        sll2.extend_from_slice(ip);
        let f = parse_frame(LinkType::LinuxSll2, &sll2).unwrap().unwrap();
        f.verify_icrc().unwrap();
        // one VLAN tag
        let mut tagged = EX1_FRAME[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x20, 0x64, 0x08, 0x00]);
        tagged.extend_from_slice(ip);
        let f = parse_frame(LinkType::Ethernet, &tagged).unwrap().unwrap();
        assert_eq!(f.vlan, Some(100));
        f.verify_icrc().unwrap();
        // unsupported link type
        assert!(matches!(
            parse_frame(LinkType::Other(147), &EX1_FRAME),
            Err(Error::NotRoce(_))
        ));
        assert_eq!(LinkType::from_linktype(228), LinkType::RawIp);
        assert_eq!(LinkType::from_linktype(276).linktype(), 276);
        assert!(!LinkType::from_linktype(0).is_supported());
    }

    #[test]
    fn not_roce_is_none() {
        // ARP
        let mut arp = EX1_FRAME.to_vec();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(parse_frame(LinkType::Ethernet, &arp), Ok(None));
        // TCP
        let mut tcp = EX1_FRAME.to_vec();
        tcp[23] = 6;
        assert_eq!(parse_frame(LinkType::Ethernet, &tcp), Ok(None));
        // other UDP port, either direction counts
        let mut other = EX1_FRAME.to_vec();
        other[36..38].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(parse_frame(LinkType::Ethernet, &other), Ok(None));
        assert!(parse_frame_on_port(LinkType::Ethernet, &other, 53)
            .unwrap()
            .is_some());
        other[34..36].copy_from_slice(&4791u16.to_be_bytes());
        assert!(parse_frame(LinkType::Ethernet, &other).unwrap().is_some());
        // a later fragment
        let mut frag = EX1_FRAME.to_vec();
        frag[20..22].copy_from_slice(&[0x00, 0x10]);
        assert_eq!(parse_frame(LinkType::Ethernet, &frag), Ok(None));
        // IPv6 with a hop-by-hop extension header
        let mut buf = [0u8; 128];
        let n = build_roce_frame(&v6_params(), &send_only(), b"", &mut buf).unwrap();
        buf[20] = 0;
        assert_eq!(parse_frame(LinkType::Ethernet, &buf[..n]), Ok(None));
    }

    #[test]
    fn malformed_is_error_not_panic() {
        fn e(b: &[u8]) -> Result<Option<Frame<'_>>> {
            parse_frame(LinkType::Ethernet, b)
        }
        // short Ethernet, short VLAN tag
        assert!(matches!(e(&EX1_FRAME[..13]), Err(Error::Truncated { .. })));
        let mut tagged = EX1_FRAME[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x20]);
        assert!(matches!(e(&tagged), Err(Error::Truncated { .. })));
        // short IPv4 header
        assert!(matches!(e(&EX1_FRAME[..30]), Err(Error::Truncated { .. })));
        // IHL < 5
        let mut b = EX1_FRAME.to_vec();
        b[14] = 0x44;
        assert_eq!(e(&b), Err(Error::NotRoce("IPv4 IHL < 5")));
        // IHL beyond the total length / the buffer
        b[14] = 0x4f;
        assert!(e(&b).is_err());
        b[14] = 0x4f;
        assert!(e(&b[..40]).is_err());
        // wrong version for the EtherType
        b[14] = 0x65;
        assert!(matches!(e(&b), Err(Error::NotRoce(_))));
        // total length beyond the buffer
        let mut b = EX1_FRAME.to_vec();
        b[16..18].copy_from_slice(&1500u16.to_be_bytes());
        assert!(matches!(e(&b), Err(Error::Truncated { need: 1500, .. })));
        // total length shorter than the header
        b[16..18].copy_from_slice(&10u16.to_be_bytes());
        assert!(matches!(e(&b), Err(Error::NotRoce(_))));
        // total length leaves no room for UDP
        b[16..18].copy_from_slice(&24u16.to_be_bytes());
        assert!(matches!(e(&b), Err(Error::Truncated { .. })));
        // UDP length beyond the IP payload, and below 8
        let mut b = EX1_FRAME.to_vec();
        b[38..40].copy_from_slice(&100u16.to_be_bytes());
        assert!(matches!(e(&b), Err(Error::Truncated { need: 100, .. })));
        b[38..40].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(e(&b), Err(Error::NotRoce("UDP length < 8")));
        // UDP length shorter than the IP payload: payload cut to it
        b[38..40].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(e(&b).unwrap().unwrap().payload.len(), 12);
        // first fragment of a RoCE datagram
        let mut b = EX1_FRAME.to_vec();
        b[20] |= 0x20;
        assert!(matches!(e(&b), Err(Error::NotRoce(_))));
        // IPv6: short header, payload length beyond the buffer
        let mut buf = [0u8; 128];
        let n = build_roce_frame(&v6_params(), &send_only(), b"", &mut buf).unwrap();
        assert!(matches!(e(&buf[..50]), Err(Error::Truncated { .. })));
        assert!(matches!(e(&buf[..n - 1]), Err(Error::Truncated { .. })));
        // raw IP with a bad version nibble, empty
        assert!(parse_frame(LinkType::RawIp, &[0x50; 40]).is_err());
        assert!(parse_frame(LinkType::RawIp, &[]).is_err());
        assert!(parse_frame(LinkType::LinuxSll, &[0; 15]).is_err());
        assert!(parse_frame(LinkType::LinuxSll2, &[0; 19]).is_err());
        // every prefix of valid frames: never a panic
        for f in [&EX1_FRAME[..], &buf[..n]] {
            for link in [
                LinkType::Ethernet,
                LinkType::RawIp,
                LinkType::LinuxSll,
                LinkType::LinuxSll2,
            ] {
                for i in 0..f.len() {
                    let _ = parse_frame(link, &f[..i]);
                    let _ = parse_frame(link, &f[i..]);
                }
            }
        }
    }

    #[test]
    fn build_errors() {
        let p = ex1_params();
        let mut small = [0u8; 50];
        assert!(matches!(
            build_frame(&p, &EX1_FRAME[42..], &mut small),
            Err(Error::BufferTooSmall { need: 62, .. })
        ));
        assert!(matches!(
            build_roce_frame(&p, &send_only(), &[0; 40], &mut small),
            Err(Error::BufferTooSmall { .. })
        ));
        assert!(matches!(
            build_roce_frame(&p, &send_only(), &[0; 40], &mut small[..10]),
            Err(Error::BufferTooSmall { .. })
        ));
        let mut big = vec![0u8; 70_000];
        assert!(matches!(
            write_headers(&p, 65_530, &mut big),
            Err(Error::OutOfRange(_))
        ));
    }
}
