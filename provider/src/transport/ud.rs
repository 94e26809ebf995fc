//! Unreliable datagram QPs (IBA vol. 1 ch. 9-11: the UD service, Q_Keys,
//! the SQ Error state, the GRH area of a UD receive buffer; kernel rxe as
//! the behavioural reference), as one sans-IO state machine.
//!
//! UD is connectionless: every send WR names its destination (address,
//! QP number, Q_Key) and becomes exactly one packet, `UD_SEND_ONLY` or
//! `UD_SEND_ONLY_WITH_IMMEDIATE`, with a DETH carrying the Q_Key and our QP
//! number. Nothing is acknowledged or resent.
//!
//! * requester: a WR completes once its packet has been produced. A local
//!   error (an opcode other than SEND/SEND with immediate, posted as rxe
//!   and NICs take it: LOC_QP_OP_ERR; no destination, a destination of the
//!   other IP version: LOC_QP_OP_ERR; a bad SGE: LOC_PROT_ERR; a message
//!   longer than the port's active MTU: LOC_LEN_ERR) completes the WR in
//!   error and moves the QP to SQE, where later WRs are flushed until
//!   SQE -> RTS; the receive queue keeps working (IBA ch. 10, the SQ Error
//!   state).
//! * responder: checks transport and opcode, P_Key and Q_Key (a mismatch
//!   is dropped silently and counted, as IBA 10.2.4 and rxe do), drops
//!   exact duplicates (see [`DUP_WINDOW`]), drops a datagram too long for
//!   the receive WR at the head (GRH + payload; counted, the WR stays:
//!   IBA class D, rxe since 6.10), takes a receive WR (none: dropped and
//!   counted), writes the 40-byte GRH area ([`build_grh`]) and then the
//!   payload, and completes the WR. A receive WR whose buffers are bad
//!   completes with LOC_PROT_ERR and moves the QP to ERR (rxe: a
//!   malformed WQE); one taken from an SRQ and too small completes with
//!   LOC_LEN_ERR (class E) and the QP stays up.
//!
//! As a [`Service`] of the one QP engine ([`super::core`]), UD supplies
//! its PSN and duplicate filter, the datagram path (`receive`, `request`)
//! and the flush of WRs posted in SQE on SQE -> RTS; modify checks the
//! spec's table for UD, with the controlled Q_Key rule. It holds no WR
//! between calls, so ERR and SQD need nothing of it. Its responder's drop
//! decisions go through the error table's UD column
//! ([`RespError::action`], `DropDatagram`).
//!
//! Where uroce differs from rxe: rxe delivers a datagram the network
//! duplicated twice; uroce remembers the last [`DUP_WINDOW`] PSNs of up to
//! [`MAX_DUP_SOURCES`] senders (source address and QP) and drops repeats,
//! counted in `duplicate_requests`.

use super::core::{LocalFault, Qp, Service};
use super::message::{fill_payload, RecvTarget};
use super::status::{ErrorAction, RespError};
use super::{pkey_matches, to_v6, Drop, Nanos, RxMeta, Transmit, PKEY};
use crate::counters::Counters;
use crate::observe::cause::Cause;
use crate::observe::cause::Side;
use crate::qp_attr::{AttrMask, QpAttr, QKEY_CONTROLLED};
use crate::types::{QpState, QpType, SendFlags, SendWr, Wc, WcFlags, WcOpcode, WcStatus, WrOpcode};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use uroce_wire::frame::{ipv4_header_valid, write_ip_header, IpParams};
use uroce_wire::icrc::IPV4_DF;
use uroce_wire::packet::{Headers, ParsedPacket};
use uroce_wire::{BthRepr, DethRepr, Operation, Psn, Transport};

/// Bytes a UD receive buffer gives the GRH area before the payload.
pub const GRH_LEN: usize = 40;
/// How many PSNs per sender the duplicate filter remembers (a power of
/// two dividing 2^24): a datagram overtaken by more than this many later
/// ones from the same sender is no longer recognised as a repeat.
pub const DUP_WINDOW: u32 = 1024;
/// How many senders the duplicate filter remembers; the one heard from
/// least recently is forgotten first.
pub const MAX_DUP_SOURCES: usize = 256;

const IPV4_HDR_LEN: usize = 20;
const UDP_HDR_LEN: usize = 8;

/// A UD QP: the engine ([`Qp`]) with UD's datagram service.
pub type UdQp = Qp<UdService>;

/// UD's part of a QP.
#[derive(Debug, Default)]
pub struct UdService {
    /// PSN of the next packet.
    next_psn: Psn,
    /// Datagrams seen recently, per sender.
    seen: DupFilter,
}

impl UdQp {
    /// Takes one packet addressed to this QP (parsed and ICRC-checked).
    fn receive_datagram(&mut self, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        let c = &self.core.cfg.counters;
        let bth = &pkt.bth;
        let receiving = self.core.receiving();
        let deth = match pkt.deth() {
            Some(d)
                if receiving
                    && pkt.info.transport == Transport::Ud
                    && pkt.info.operation == Operation::Send
                    && pkt.info.is_request =>
            {
                d
            }
            _ => return Drop::BadState.count(c),
        };
        if !pkey_matches(bth.pkey) {
            return Drop::BadPkey.count(c);
        }
        Counters::inc(&c.rcvd_pkts);
        // IBA 10.2.4: a datagram whose Q_Key differs from the QP's is
        // discarded (the Q_Key is a datagram's access key).
        if planted!(deth.qkey != self.core.attr.qkey, UdQkeyUnchecked => false) {
            Counters::inc(&c.qkey_violations);
            return self.drop_datagram(RespError::RemoteAccess, None);
        }
        // Not one of the spec's checks (a UD responder checks no PSN):
        // uroce's filter of datagrams the network repeated.
        let src = meta.src.to_canonical();
        let src_qp = deth.src_qp & 0xff_ffff;
        if self.svc.seen.is_duplicate(src, src_qp, bth.psn) {
            Counters::inc(&c.duplicate_requests);
            return;
        }
        // Length (IBA 9.8.3 class D; rxe since 6.10): a datagram the
        // head receive WR cannot hold (GRH + payload) is dropped, the WR
        // left for the next one. A WR of an SRQ is taken first and
        // completes in error (class E: `too_long` below).
        let len = GRH_LEN + pkt.payload.len();
        let rq = &self.core.cfg.rq;
        if !rq.is_srq() && rq.head_len().is_some_and(|cap| (len as u64) > cap) {
            Counters::inc(&c.ud_too_long_drops);
            return;
        }
        // Resources: no RNR for UD, without a receive WR the datagram is
        // lost.
        let Some(wr) = self.core.cfg.rq.take() else {
            Counters::inc(&c.ud_no_recv_drops);
            return self.drop_datagram(RespError::Rnr, None);
        };
        self.core.cfg.recv_taken(&wr, true);
        // The datagram consumed a WR: a repeat of it is a duplicate from
        // now on (one lost for want of a WR may still come again).
        self.svc.seen.record(src, src_qp, bth.psn);
        let sgl = match RecvTarget::resolve(&self.core.cfg, &wr) {
            Ok(RecvTarget { sgl, .. }) => sgl,
            Err(cause) => {
                self.core.why = Some(cause);
                return self.recv_local_error(wr.wr_id, WcStatus::LocProtErr);
            }
        };
        // Length: the buffer must hold GRH + payload (an SRQ's WR, or one
        // whose buffers resolve shorter than its SGEs say).
        if len as u64 > sgl.total() {
            let cause = Cause::UdTooLong {
                psn: bth.psn.value(),
                src: meta.src,
                src_qp,
                grh: GRH_LEN,
                payload: pkt.payload.len(),
                wr_id: wr.wr_id,
                cap: sgl.total(),
            };
            let status = RespError::LengthError.recv_status();
            self.explain(Some(status), Side::Responder, cause);
            self.core.err_cause = None;
            return self.drop_datagram(RespError::LengthError, Some(wr.wr_id));
        }
        let mut grh = [0u8; GRH_LEN];
        build_grh(meta, pkt.bytes.len(), &mut grh);
        if sgl.scatter(0, &grh).is_err() || sgl.scatter(GRH_LEN as u64, pkt.payload).is_err() {
            // Memory deregistered under the WR.
            return self.recv_local_error(wr.wr_id, WcStatus::LocProtErr);
        }
        let qpn = self.core.cfg.qpn;
        let byte_len = planted!(len, UdByteLenWithoutGrh => pkt.payload.len()) as u32;
        let mut wc = Wc::received(wr.wr_id, WcOpcode::Recv, qpn, byte_len, src_qp, pkt.imm());
        wc.wc_flags |= WcFlags::GRH;
        wc.sl = roce_packet_type(meta);
        self.complete(false, wc, bth.se);
    }

    /// A failed check, as the one policy table says for UD
    /// ([`RespError::action`]): the datagram is dropped and the QP stays
    /// up; a receive WR it consumed (`consumed`) completes with the
    /// table's status (LOC_LEN_ERR for a buffer too small).
    fn drop_datagram(&mut self, err: RespError, consumed: Option<u64>) {
        let ErrorAction::DropDatagram { recv_status } = err.action(QpType::Ud) else {
            return;
        };
        if let Some(wr_id) = consumed {
            self.complete_recv(wr_id, recv_status);
        }
    }

    // ---------------------------------------------------------------
    // Requester
    // ---------------------------------------------------------------

    /// Takes the next send WR and produces its packet.
    fn transmit(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let wr = self.core.cfg.sq.take()?;
        let (t, msg_len) = match self.build(&wr, buf) {
            Ok(x) => x,
            Err(f) => {
                self.send_error(&wr, f);
                return None;
            }
        };
        self.svc.next_psn = self.svc.next_psn.next();
        self.retire_send(&wr, WcStatus::Success, msg_len);
        Some(t)
    }

    /// Checks a send WR locally and writes its packet into `buf`: returns
    /// the packet and the message length.
    fn build(&self, wr: &SendWr, buf: &mut [u8]) -> Result<(Transmit, u64), LocalFault> {
        // From the opcode table: UD has SEND ONLY (with immediate) alone.
        let opcode = wr
            .opcode
            .request_opcode(Transport::Ud, uroce_wire::Position::Only)
            .ok_or(WcStatus::LocQpOpErr)?;
        let ud = wr.ud.ok_or(WcStatus::LocQpOpErr)?;
        let dst = ud.ip.to_canonical();
        if dst.is_ipv4() != self.core.cfg.local_ip.is_ipv4() || dst.is_unspecified() {
            return Err(WcStatus::LocQpOpErr.into());
        }
        let inline = wr.flags.contains(SendFlags::INLINE);
        let (data, len) = self.core.cfg.send_buffers(wr)?;
        // A UD message is one packet: at most the PMTU (the port's active
        // MTU). Longer: LOC_LEN_ERR and SQE, as a NIC completes it (rxe
        // sends it anyway and completes it with success).
        if len > self.core.cfg.limits.active_mtu.bytes() as u64 {
            return Err(WcStatus::LocLenErr.into());
        }
        // IBA 10.2.4: a WR Q_Key with the high bit set means the QP's own.
        let qkey = if ud.remote_qkey & QKEY_CONTROLLED != 0 {
            self.core.attr.qkey
        } else {
            ud.remote_qkey
        };
        let mut h = Headers::new(BthRepr {
            opcode,
            se: wr.flags.contains(SendFlags::SOLICITED),
            pkey: PKEY,
            dest_qp: ud.remote_qpn & 0xff_ffff,
            psn: self.svc.next_psn,
            ack_req: false,
            ..BthRepr::default()
        });
        h.deth = Some(DethRepr {
            qkey,
            src_qp: self.core.cfg.qpn,
        });
        if wr.opcode == WrOpcode::SendWithImm {
            h.imm = Some(wr.imm_data);
        }
        if len > 0 && !inline {
            // The copy of its bytes for the wire: the checker compares
            // its sources now.
            self.core.cfg.sq.sending(wr.wr_id);
        }
        let n = self
            .core
            .cfg
            .emit(dst, &h, len as usize, buf, |out| {
                fill_payload(wr, &data, inline, 0, out)
            })
            // The memory went away since it was resolved (or the caller's
            // buffer is too small for the packet).
            .ok_or(WcStatus::LocProtErr)?;
        let t = Transmit {
            dst,
            len: n,
            tclass: ud.tclass,
            hop_limit: dst.is_multicast().then_some(ud.hop_limit),
        };
        Ok((t, len))
    }
}

impl Service for UdService {
    const QP_TYPE: QpType = QpType::Ud;

    /// No receive PSN: a datagram is taken whatever its PSN.
    fn psns(&self) -> (Psn, Psn) {
        (self.next_psn, Psn::default())
    }

    /// A UD QP's path MTU is the port's active MTU.
    fn query(qp: &UdQp) -> QpAttr {
        let mut a = qp.core.query(qp.svc.next_psn.value(), 0);
        a.path_mtu = qp.core.cfg.limits.active_mtu;
        a.port_num = 1;
        a
    }

    /// The send PSN. WRs posted while in SQE are flushed on SQE -> RTS,
    /// even if the engine has not come round to them before the QP leaves
    /// SQE.
    fn apply_modify(qp: &mut UdQp, attr: &QpAttr, mask: AttrMask, to: QpState) {
        if mask.contains(AttrMask::SQ_PSN) {
            qp.svc.next_psn = Psn::new(attr.sq_psn);
        }
        if qp.core.state == QpState::Sqe && to == QpState::Rts {
            qp.flush_sends();
        }
    }

    /// Nothing held: every WR goes out whole as soon as it is taken, and a
    /// datagram is placed as soon as it comes.
    fn on_error(_qp: &mut UdQp) {}

    /// Every WR goes out whole as soon as it is taken, so the send queue
    /// is drained the moment the QP reaches SQD.
    fn drained(&self) -> bool {
        true
    }

    fn on_reset(qp: &mut UdQp) {
        qp.svc = UdService::default();
    }

    fn receive(qp: &mut UdQp, _now: Nanos, meta: &RxMeta, pkt: &ParsedPacket<'_>) {
        qp.receive_datagram(meta, pkt);
    }

    /// SQD: no new WR starts (and none is ever half sent).
    fn request(qp: &mut UdQp, _now: Nanos, buf: &mut [u8], allow_new: bool) -> Option<Transmit> {
        if allow_new {
            qp.transmit(buf)
        } else {
            None
        }
    }
}

// -------------------------------------------------------------------
// Duplicate filter
// -------------------------------------------------------------------

const WORDS: usize = (DUP_WINDOW / 64) as usize;

/// The PSNs seen from one sender: the highest, and a ring of
/// [`DUP_WINDOW`] bits indexed by PSN modulo the window.
#[derive(Debug, Clone)]
struct SourceWindow {
    top: Psn,
    bits: [u64; WORDS],
    /// When the sender was last heard from (the filter's clock).
    used: u64,
}

impl SourceWindow {
    fn new(psn: Psn, used: u64) -> SourceWindow {
        let mut w = SourceWindow {
            top: psn,
            bits: [0; WORDS],
            used,
        };
        w.set(psn);
        w
    }
    fn slot(psn: Psn) -> (usize, u64) {
        let i = psn.value() % DUP_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }
    fn test(&self, psn: Psn) -> bool {
        let (w, b) = Self::slot(psn);
        self.bits[w] & b != 0
    }
    fn set(&mut self, psn: Psn) {
        let (w, b) = Self::slot(psn);
        self.bits[w] |= b;
    }
    fn clear(&mut self, psn: Psn) {
        let (w, b) = Self::slot(psn);
        self.bits[w] &= !b;
    }
    /// How far `psn` lies behind the highest PSN seen, if it is not ahead.
    fn behind(&self, psn: Psn) -> Option<u32> {
        let d = psn.diff(self.top);
        (d <= 0).then_some(d.unsigned_abs())
    }
    fn contains(&self, psn: Psn) -> bool {
        self.behind(psn)
            .is_some_and(|b| b < DUP_WINDOW && self.test(psn))
    }
    fn insert(&mut self, psn: Psn) {
        match self.behind(psn) {
            Some(b) if b < DUP_WINDOW => self.set(psn),
            // Far behind: a sender that started over (a new QP with the
            // same number and another PSN) more likely than a datagram
            // overtaken by DUP_WINDOW others. Start the window there.
            Some(_) => *self = SourceWindow::new(psn, self.used),
            None => {
                let ahead = psn.diff(self.top) as u32;
                if ahead >= DUP_WINDOW {
                    self.bits = [0; WORDS];
                } else {
                    for k in 1..=ahead {
                        self.clear(self.top.add(k));
                    }
                }
                self.top = psn;
                self.set(psn);
            }
        }
    }
}

/// Recently seen datagrams per sender (address, QP number).
#[derive(Debug, Default)]
struct DupFilter {
    sources: HashMap<(IpAddr, u32), SourceWindow>,
    clock: u64,
}

impl DupFilter {
    fn is_duplicate(&self, src: IpAddr, qpn: u32, psn: Psn) -> bool {
        self.sources
            .get(&(src, qpn))
            .is_some_and(|w| w.contains(psn))
    }
    fn record(&mut self, src: IpAddr, qpn: u32, psn: Psn) {
        self.clock += 1;
        let now = self.clock;
        if let Some(w) = self.sources.get_mut(&(src, qpn)) {
            w.used = now;
            w.insert(psn);
            return;
        }
        if self.sources.len() >= MAX_DUP_SOURCES {
            if let Some(k) = self
                .sources
                .iter()
                .min_by_key(|(_, w)| w.used)
                .map(|(k, _)| *k)
            {
                self.sources.remove(&k);
            }
        }
        self.sources.insert((src, qpn), SourceWindow::new(psn, now));
    }
}

// -------------------------------------------------------------------
// The GRH area
// -------------------------------------------------------------------

/// What a UD receive completion's `sl` says on RoCE: the packet's L3
/// header type, as mlx5 reports it there (1 IPv6, 2 IPv4; the spec's
/// A17.4.5.1 has the CQE tell IPv4 from IPv6, and `sl` is where verbs
/// programs find it). UCX's ud_verbs reads it to know where the
/// destination address sits in the 40-byte GRH area, and drops every
/// packet whose address it then cannot find among its own: with 0
/// (rxe's value) it looks for an IPv6 GID in an IPv4 header.
pub fn roce_packet_type(meta: &RxMeta) -> u8 {
    match meta.src.to_canonical() {
        IpAddr::V4(_) => 2,
        IpAddr::V6(_) => 1,
    }
}

/// Writes the 40-byte GRH area of a UD receive buffer for a datagram
/// described by `meta` whose UDP payload (BTH to ICRC) was
/// `udp_payload_len` bytes, as kernel rxe does (and libibverbs'
/// `ibv_init_ah_from_wc` reads it):
///
/// * IPv4 sender: 20 zero bytes, then the IPv4 header as received
///   (version 4, IHL 5, TOS, total length, identification, flags and
///   fragment offset, TTL, protocol UDP, a valid header checksum, source,
///   destination);
/// * IPv6 sender: the IPv6 header (version 6, traffic class, flow label,
///   payload length, next header UDP, hop limit, source, destination).
pub fn build_grh(meta: &RxMeta, udp_payload_len: usize, out: &mut [u8; GRH_LEN]) {
    *out = [0; GRH_LEN];
    let ip = match (meta.src.to_canonical(), meta.dst.to_canonical()) {
        (IpAddr::V4(src), dst) => IpParams::V4 {
            src,
            dst: match dst {
                IpAddr::V4(d) => d,
                IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
            },
            ident: meta.ipv4_id,
            dont_fragment: meta.ipv4_flags_frag & IPV4_DF != 0,
            tos: meta.tclass,
            ttl: meta.hop_limit,
        },
        (IpAddr::V6(src), dst) => IpParams::V6 {
            src,
            dst: to_v6(dst),
            traffic_class: meta.tclass,
            flow_label: meta.flow_label & 0xf_ffff,
            hop_limit: meta.hop_limit,
        },
    };
    let at = GRH_LEN - ip.header_len();
    // Lengths saturate at the IP length fields' 65535 (a datagram from a
    // UDP socket never gets there); with that and a 20-bit flow label the
    // write cannot fail.
    let room = match ip {
        IpParams::V4 { .. } => 0xffff - IPV4_HDR_LEN - UDP_HDR_LEN,
        IpParams::V6 { .. } => 0xffff - UDP_HDR_LEN,
    };
    let _ = write_ip_header(&ip, udp_payload_len.min(room), &mut out[at..]);
}

/// The sender of a UD datagram, read from the GRH area at the start of
/// its receive buffer (what `ibv_init_ah_from_wc` needs on RoCEv2): the
/// source of the IPv4 header at bytes 20..40 if they hold a valid one
/// (version 4, IHL 5, checksum verifies); else, if byte 0 says IP version
/// 6, the IPv6 source (an IPv4-mapped one as IPv4); else `None`.
pub fn grh_source(grh: &[u8]) -> Option<IpAddr> {
    let g = grh.get(..GRH_LEN)?;
    let v4 = &g[GRH_LEN - IPV4_HDR_LEN..];
    if ipv4_header_valid(v4) {
        return Some(IpAddr::V4(Ipv4Addr::new(v4[12], v4[13], v4[14], v4[15])));
    }
    if g[0] >> 4 == 6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&g[8..24]);
        return Some(Ipv6Addr::from(a).to_canonical());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The IPv4 header checksum computed the textbook way (RFC 1071):
    /// sum the ten words with the checksum field as zero, fold, invert.
    fn rfc1071(h: &[u8]) -> u16 {
        let mut sum = 0u32;
        for i in 0..10 {
            if i != 5 {
                sum += (h[2 * i] as u32) << 8 | h[2 * i + 1] as u32;
            }
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        !(sum as u16)
    }

    fn meta_v4() -> RxMeta {
        RxMeta::new(
            "192.168.0.1".parse().unwrap(),
            "192.168.0.199".parse().unwrap(),
        )
    }

    #[test]
    fn ipv4_grh_golden() {
        // The header of the well-known checksum example
        // 4500 0073 0000 4000 4011 b861 c0a8 0001 c0a8 00c7.
        let mut out = [0xaau8; 40];
        build_grh(&meta_v4(), 0x73 - 28, &mut out);
        assert_eq!(out[..20], [0u8; 20]);
        assert_eq!(
            out[20..],
            [
                0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
                0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7
            ]
        );
        assert_eq!(grh_source(&out), Some("192.168.0.1".parse().unwrap()));
    }

    #[test]
    fn ipv4_grh_fields_and_checksum() {
        let mut m = meta_v4();
        m.ipv4_id = 0xc0fa;
        m.ipv4_flags_frag = 0x4000;
        m.hop_limit = 1;
        m.tclass = 0xb8;
        for len in [0usize, 1, 33, 1000, 4200, 70_000] {
            let mut out = [0u8; 40];
            build_grh(&m, len, &mut out);
            let h = &out[20..];
            assert_eq!(h[0], 0x45);
            assert_eq!(h[1], 0xb8);
            let total = u16::from_be_bytes([h[2], h[3]]) as usize;
            assert_eq!(total, (28 + len).min(0xffff));
            assert_eq!(u16::from_be_bytes([h[4], h[5]]), 0xc0fa);
            assert_eq!(u16::from_be_bytes([h[6], h[7]]), 0x4000);
            assert_eq!((h[8], h[9]), (1, 17));
            assert_eq!(u16::from_be_bytes([h[10], h[11]]), rfc1071(h), "len {len}");
            assert_eq!(h[12..16], [192, 168, 0, 1]);
            assert_eq!(h[16..20], [192, 168, 0, 199]);
            assert_eq!(grh_source(&out), Some(m.src));
            // A broken checksum is not IPv4 (and byte 0 is not 6).
            out[31] ^= 1;
            assert_eq!(grh_source(&out), None);
        }
        // An IPv4-mapped source is IPv4.
        let mut mm = m;
        mm.src = IpAddr::V6("::ffff:10.1.2.3".parse().unwrap());
        let mut out = [0u8; 40];
        build_grh(&mm, 10, &mut out);
        assert_eq!(out[20], 0x45);
        assert_eq!(grh_source(&out), Some("10.1.2.3".parse().unwrap()));
    }

    #[test]
    fn ipv6_grh() {
        let mut m = RxMeta::new("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        m.tclass = 0xab;
        m.flow_label = 0x1_2345;
        m.hop_limit = 7;
        let mut out = [0u8; 40];
        build_grh(&m, 100, &mut out);
        assert_eq!(out[..8], [0x6a, 0xb1, 0x23, 0x45, 0, 108, 17, 7]);
        assert_eq!(out[8..24], "fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(out[24..], "fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source(&out), Some(m.src));
        // IPv4-mapped IPv6 sources are reported as IPv4.
        out[8..24].copy_from_slice(&"::ffff:10.0.0.9".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(grh_source(&out), Some("10.0.0.9".parse().unwrap()));
        // Neither IPv4 nor IPv6, or too short.
        assert_eq!(grh_source(&[0u8; 40]), None);
        assert_eq!(grh_source(&[0x60u8; 39]), None);
    }

    #[test]
    fn dup_window() {
        let mut w = SourceWindow::new(Psn::new(0xff_fffe), 0);
        assert!(w.contains(Psn::new(0xff_fffe)));
        assert!(!w.contains(Psn::new(0xff_ffff)));
        // Across the 24-bit wrap, with a gap and a late arrival.
        w.insert(Psn::new(1));
        assert!(w.contains(Psn::new(1)));
        assert!(!w.contains(Psn::new(0)) && !w.contains(Psn::new(0xff_ffff)));
        w.insert(Psn::new(0xff_ffff));
        assert!(w.contains(Psn::new(0xff_ffff)));
        assert!(!w.contains(Psn::new(0)));
        // Advancing clears what the ring held for the new PSNs.
        for p in 2..2 + DUP_WINDOW {
            w.insert(Psn::new(p));
        }
        assert!(!w.contains(Psn::new(1)), "out of the window");
        assert!(w.contains(Psn::new(2)) && w.contains(Psn::new(DUP_WINDOW + 1)));
        w.insert(Psn::new(DUP_WINDOW + 5));
        assert!(!w.contains(Psn::new(DUP_WINDOW + 3)));
        assert!(w.contains(Psn::new(DUP_WINDOW + 1)));
        // A jump of more than the window forgets everything.
        w.insert(Psn::new(10 * DUP_WINDOW));
        assert!(!w.contains(Psn::new(DUP_WINDOW + 5)));
        assert!(w.contains(Psn::new(10 * DUP_WINDOW)));
        // Far behind: a restarted sender, the window starts over there.
        w.insert(Psn::new(5));
        assert!(w.contains(Psn::new(5)));
        assert!(!w.contains(Psn::new(4)) && !w.contains(Psn::new(10 * DUP_WINDOW)));
        w.insert(Psn::new(6));
        assert!(w.contains(Psn::new(5)) && w.contains(Psn::new(6)));
    }

    #[test]
    fn dup_filter_per_source_and_bounded() {
        let mut f = DupFilter::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        f.record(a, 1, Psn::new(7));
        assert!(f.is_duplicate(a, 1, Psn::new(7)));
        assert!(!f.is_duplicate(a, 2, Psn::new(7)));
        assert!(!f.is_duplicate(b, 1, Psn::new(7)));
        for q in 0..MAX_DUP_SOURCES as u32 + 10 {
            f.record(b, 100 + q, Psn::new(1));
            f.record(a, 1, Psn::new(8 + q)); // a stays recent
        }
        assert_eq!(f.sources.len(), MAX_DUP_SOURCES);
        assert!(f.is_duplicate(a, 1, Psn::new(7)));
        assert!(!f.is_duplicate(b, 100, Psn::new(1)), "oldest forgotten");
        assert!(f.is_duplicate(b, 100 + MAX_DUP_SOURCES as u32 + 9, Psn::new(1)));
    }
}
