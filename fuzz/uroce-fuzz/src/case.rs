//! A fuzz case: a sequence of steps, each packet described relative to
//! the live connection (PSN as an offset from the PSN the target expects
//! when the case starts, keys as "the valid one" / "the private one" /
//! raw, addresses as offsets into the target's region), so that a case
//! found against one connection replays against any other, and a
//! finding's JSON is readable.

use super::target::Conn;
use serde::{Deserialize, Serialize};
use uroce_wire::packet::{emit_headers, Headers};
use uroce_wire::{
    icrc, AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ext,
    FethRepr, Opcode, Psn, RethRepr,
};

/// Which key a packet carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Key {
    /// The rkey of the target's exposed region.
    Valid,
    /// The rkey of the target's private region (no remote access).
    Private,
    /// This value.
    Raw(u32),
    /// The key `Conn::keys[i]` (a region or window with other rights, of
    /// another PD, deregistered, ...); an address that goes with it is an
    /// offset from that key's `va`. An index the target does not expose
    /// is key 0.
    Exposed(u8),
}

/// Which QP a packet is addressed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Dest {
    /// The fuzzed QP.
    Target,
    /// The control QP (which the fuzzer must not disturb).
    Control,
    /// This QP number.
    Raw(u32),
}

/// How the ICRC is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Icrc {
    /// Computed for the header the target sees.
    Right,
    /// Computed, then XORed with this value (non-zero).
    Wrong(u32),
}

/// One packet, relative to the connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PacketSpec {
    /// BTH opcode the headers are laid out for.
    pub opcode: u8,
    /// Written into the BTH's opcode byte after layout (a header layout
    /// that does not match the opcode).
    pub raw_opcode: Option<u8>,
    /// PSN: the target's expected PSN at case start plus this.
    pub psn_off: i32,
    /// Destination QP.
    pub dest: Dest,
    /// BTH flags and fields.
    pub se: bool,
    /// AckReq.
    pub ack_req: bool,
    /// MigReq.
    pub migreq: bool,
    /// Pad count written into the BTH (None: the right one).
    pub pad: Option<u8>,
    /// Transport header version (0 is the only valid one; the BTH has
    /// four bits for it, the rest are not sent).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// RETH: offset from the exposed region's address, key, DMA length.
    pub reth: Option<(i64, Key, u32)>,
    /// AtomicETH: offset, key, swap/add, compare.
    pub atomic: Option<(i64, Key, u64, u64)>,
    /// AETH: syndrome byte, MSN.
    pub aeth: Option<(u8, u32)>,
    /// AtomicAckETH: original value.
    pub atomic_ack: Option<u64>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH: the key to invalidate.
    pub ieth: Option<Key>,
    /// DETH: Q_Key (None: the connection's), source QP.
    pub deth: Option<(Option<u32>, u32)>,
    /// Payload length and the byte it is filled with.
    pub payload: (u16, u8),
    /// ICRC.
    pub icrc: Icrc,
    /// Cut the packet to this many bytes (after the ICRC).
    pub truncate: Option<u16>,
    /// A response to the target's requester: the PSN is relative to the
    /// PSN the target sends next at case start (`Conn::sq_psn`), not to
    /// the one it expects.
    #[serde(default, skip_serializing_if = "is_false")]
    pub resp: bool,
    /// The payload's bytes (a replayed capture's), instead of
    /// `payload.1` repeated; `payload.0` is still the length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Vec<u8>>,
    /// FETH (an RDMA FLUSH): placement type (4 bits) and selectivity
    /// level (2 bits); None: both zero. Kept None on opcodes without a
    /// FETH (the input format has it only for those).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feth: Option<(u8, u8)>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl PacketSpec {
    /// A packet of `opcode` at `psn_off` with every field valid for `conn`.
    pub fn new(opcode: Opcode, psn_off: i32) -> PacketSpec {
        PacketSpec {
            opcode: opcode.0,
            raw_opcode: None,
            psn_off,
            dest: Dest::Target,
            se: false,
            ack_req: true,
            migreq: false,
            pad: None,
            tver: 0,
            pkey: 0xffff,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
            deth: None,
            payload: (0, 0),
            icrc: Icrc::Right,
            truncate: None,
            resp: false,
            data: None,
            feth: None,
        }
    }

    /// A response to the target's requester at `psn_off` from the PSN the
    /// target sends next at case start.
    pub fn response(opcode: Opcode, psn_off: i32) -> PacketSpec {
        PacketSpec {
            resp: true,
            ack_req: false,
            ..PacketSpec::new(opcode, psn_off)
        }
    }

    /// Whether the opcode's headers hold a FETH (an RDMA FLUSH).
    pub fn has_feth(&self) -> bool {
        self.info().is_some_and(|i| i.headers.contains(&Ext::Feth))
    }

    /// The opcode's description (None for a code the table lacks).
    pub fn info(&self) -> Option<&'static uroce_wire::OpcodeInfo> {
        Opcode(self.opcode).info()
    }

    /// The absolute PSN for `conn`.
    pub fn psn(&self, conn: &Conn) -> Psn {
        let base = if self.resp { conn.sq_psn } else { conn.rq_psn };
        Psn::new(base.wrapping_add(self.psn_off as u32))
    }

    /// Whether the spec says a receiver drops this packet without a
    /// trace: a bad ICRC, a transport version, partition or destination
    /// QP it does not accept (IBA 9.6.1.x), or a packet too short for
    /// the headers its opcode byte names. No state change, no response,
    /// no completion. Other malformed packets (a payload where the
    /// opcode has none, a length the MTU does not allow, a reserved
    /// opcode) are not judged here: the spec has a responder NAK some of
    /// them and implementations drop others, and the oracles allow both.
    pub fn silently_dropped(&self, conn: &Conn) -> bool {
        let full = PacketSpec {
            truncate: None,
            ..self.clone()
        };
        let Some(bytes) = full.emit(conn) else {
            return true;
        };
        let cut = self.truncate.is_some_and(|t| usize::from(t) < bytes.len());
        let op = bytes.first().copied().unwrap_or(0);
        let need = Opcode(op).info().map_or(12, |i| 12 + i.ext_len()) + 4;
        // (A build that does not verify ICRCs, cargo-fuzz's, takes a
        // damaged ICRC, and a cut packet that still holds its headers.)
        let icrc_damaged = matches!(self.icrc, Icrc::Wrong(_)) || cut;
        (icrc_damaged && icrc::VERIFIES)
            || (self.tver & 0xf) != 0
            || (self.pkey & 0x7fff) != 0x7fff
            || self.dest_qpn(conn) != conn.qpn
            || bytes.len() < need
    }

    /// The packet as the target parses it (None: it does not parse, or
    /// is not emitted at all).
    pub fn seen(&self, conn: &Conn) -> Option<Seen> {
        let bytes = self.emit(conn)?;
        let p = uroce_wire::packet::parse(&bytes).ok()?;
        Some(Seen {
            info: p.info,
            reth: p.reth(),
            atomic: p.atomic_eth(),
        })
    }

    fn key(k: Key, conn: &Conn) -> u32 {
        match k {
            Key::Valid => conn.rkey,
            Key::Private => conn.private_rkey,
            Key::Raw(v) => v,
            Key::Exposed(i) => conn.keys.get(usize::from(i)).map_or(0, |e| e.key),
        }
    }

    /// The address `off` names with key `k`: an offset from the exposed
    /// region's address, or from an exposed key's own.
    fn addr(k: Key, off: i64, conn: &Conn) -> u64 {
        let base = match k {
            Key::Exposed(i) => conn.keys.get(usize::from(i)).map_or(0, |e| e.va),
            _ => conn.va,
        };
        base.wrapping_add(off as u64)
    }

    /// The destination QP number the BTH carries (a raw one may be the
    /// fuzzed QP's own).
    pub fn dest_qpn(&self, conn: &Conn) -> u32 {
        match self.dest {
            Dest::Target => conn.qpn,
            Dest::Control => conn.control_qpn,
            Dest::Raw(q) => q & 0xff_ffff,
        }
    }

    /// The packet's bytes (the UDP payload: BTH to ICRC) for `conn`, with
    /// the ICRC for the IP header a packet from `conn.fuzzer` to
    /// `conn.target` carries when it leaves a UDP socket (IPv4 ID 0).
    pub fn emit(&self, conn: &Conn) -> Option<Vec<u8>> {
        let info = self.info()?;
        let dest_qp = self.dest_qpn(conn);
        let mut h = Headers::new(BthRepr {
            opcode: Opcode(self.opcode),
            se: self.se,
            migreq: self.migreq,
            pad: 0,
            tver: self.tver & 0xf,
            pkey: self.pkey,
            dest_qp,
            ack_req: self.ack_req,
            psn: self.psn(conn),
            ..BthRepr::default()
        });
        for ext in info.headers {
            match ext {
                Ext::Reth => {
                    let (off, k, len) = self.reth.unwrap_or((0, Key::Valid, 0));
                    h.reth = Some(RethRepr {
                        va: Self::addr(k, off, conn),
                        rkey: Self::key(k, conn),
                        dma_len: len,
                    });
                }
                Ext::AtomicEth => {
                    let (off, k, swap_add, compare) = self.atomic.unwrap_or((0, Key::Valid, 1, 0));
                    h.atomic_eth = Some(AtomicEthRepr {
                        va: Self::addr(k, off, conn),
                        rkey: Self::key(k, conn),
                        swap_add,
                        compare,
                    });
                }
                Ext::Aeth => {
                    let (syn, msn) = self.aeth.unwrap_or((0, 0));
                    h.aeth = Some(AethRepr {
                        syndrome: AethSyndrome::from_byte(syn),
                        msn: msn & 0xff_ffff,
                    });
                }
                Ext::AtomicAckEth => {
                    h.atomic_ack = Some(AtomicAckEthRepr {
                        orig: self.atomic_ack.unwrap_or(0),
                    })
                }
                Ext::ImmDt => h.imm = Some(self.imm.unwrap_or(0)),
                Ext::Ieth => h.ieth = Some(Self::key(self.ieth.unwrap_or(Key::Valid), conn)),
                Ext::Deth => {
                    let (qkey, src_qp) = self.deth.unwrap_or((None, conn.fuzzer_qpn));
                    h.deth = Some(DethRepr {
                        qkey: qkey.unwrap_or(conn.qkey),
                        src_qp: src_qp & 0xff_ffff,
                    });
                }
                Ext::Feth => {
                    let (placement, selectivity) = self.feth.unwrap_or((0, 0));
                    h.feth = Some(FethRepr {
                        placement: placement & 0xf,
                        selectivity: selectivity & 0x3,
                    })
                }
                Ext::CnpReserved => {}
            }
        }
        let plen = if info.has_payload {
            usize::from(self.payload.0)
        } else {
            0
        };
        let mut buf = vec![0u8; plen + 128];
        let hdr = emit_headers(&h, plen, &mut buf).ok()?;
        buf[hdr..hdr + plen].fill(self.payload.1);
        if let Some(d) = &self.data {
            let n = d.len().min(plen);
            buf[hdr..hdr + n].copy_from_slice(&d[..n]);
        }
        let ctx = conn.ip_context();
        let total = uroce_wire::packet::finish(&mut buf, hdr, plen, &ctx).ok()?;
        buf.truncate(total);
        if let Some(p) = self.pad {
            buf[1] = (buf[1] & !0x30) | ((p & 3) << 4);
        }
        if let Some(r) = self.raw_opcode {
            buf[0] = r;
        }
        if self.pad.is_some() || self.raw_opcode.is_some() {
            icrc::write(&ctx, &mut buf).ok()?;
        }
        if let Icrc::Wrong(x) = self.icrc {
            let n = buf.len();
            let v = u32::from_le_bytes([buf[n - 4], buf[n - 3], buf[n - 2], buf[n - 1]]) ^ x.max(1);
            buf[n - 4..].copy_from_slice(&v.to_le_bytes());
        }
        if let Some(t) = self.truncate {
            buf.truncate(usize::from(t));
        }
        Some(buf)
    }
}

/// What a target parses out of a packet.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// The opcode's description.
    pub info: &'static uroce_wire::OpcodeInfo,
    /// RETH, if the opcode has one.
    pub reth: Option<RethRepr>,
    /// AtomicETH, if the opcode has one.
    pub atomic: Option<AtomicEthRepr>,
}

/// A work request the target posts on the fuzzed QP's send queue, so
/// that the fuzzer answers its requests (the fuzzer as responder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PostOp {
    /// SEND.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
}

/// One signaled work request for the target to post.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Post {
    /// Work request ID (the completion carries it).
    pub wr_id: u64,
    /// Operation.
    pub op: PostOp,
    /// Bytes (8 for atomics; 0 is a zero-length message).
    pub len: u32,
    /// The local buffer: this offset into the target's exposed region
    /// (a READ's data and an atomic's original value land there).
    pub local_off: u32,
    /// Remote address (in the fuzzer's imaginary memory).
    pub remote_va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap or add value (atomics).
    pub swap_add: u64,
    /// Compare value (compare and swap).
    pub compare: u64,
}

impl Post {
    /// PSNs the request takes on the wire at `mtu`.
    pub fn span(&self, mtu: u32) -> u32 {
        match self.op {
            PostOp::CompareSwap | PostOp::FetchAdd => 1,
            _ => self.len.div_ceil(mtu.max(1)).max(1),
        }
    }

    /// Bytes of the local buffer the target may write for it: a READ's
    /// length, an atomic's 8 bytes.
    pub fn local_write(&self) -> Option<(u32, u32)> {
        match self.op {
            PostOp::Read => Some((self.local_off, self.len)),
            PostOp::CompareSwap | PostOp::FetchAdd => Some((self.local_off, 8)),
            PostOp::Send | PostOp::Write => None,
        }
    }
}

/// One step of a case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// Send this packet to the target.
    Packet(PacketSpec),
    /// Let this many microseconds pass (the target answers, times out).
    Wait(u32),
    /// Have the target post this work request on the fuzzed QP.
    Post(Post),
}

/// A case: what the fuzzer sends, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Case {
    /// The steps.
    pub steps: Vec<Step>,
}

/// PSNs a request takes when it is in sequence: a READ one per response
/// packet (at `mtu`), any other one.
pub fn psn_span(p: &PacketSpec, mtu: u32) -> i32 {
    match p.info().map(|i| i.operation) {
        Some(uroce_wire::Operation::RdmaReadRequest) => {
            let len = p.reth.map_or(0, |r| r.2);
            len.div_ceil(mtu.max(1)).max(1) as i32
        }
        _ => 1,
    }
}

impl Case {
    /// Each packet's PSN against the PSN a requester in sequence would
    /// use there (0: in sequence; the expected PSN moves on past every
    /// packet in sequence). A response's PSN names the target's own
    /// request, which the fuzzer's packets do not move: its delta is its
    /// offset.
    pub fn psn_deltas(&self, mtu: u32) -> Vec<i32> {
        let mut next = 0i32;
        self.packets()
            .map(|p| {
                if p.resp {
                    return p.psn_off;
                }
                let d = p.psn_off.wrapping_sub(next);
                if d == 0 {
                    next = next.wrapping_add(psn_span(p, mtu));
                }
                d
            })
            .collect()
    }

    /// Sets the packets' PSNs from `deltas` (one per packet, as
    /// [`Case::psn_deltas`] gives): after packets are removed, the rest
    /// keep their places in (or out of) sequence.
    pub fn renumber(&mut self, deltas: &[i32], mtu: u32) {
        let mut next = 0i32;
        let mut i = 0;
        for s in &mut self.steps {
            if let Step::Packet(p) = s {
                let d = deltas.get(i).copied().unwrap_or(0);
                i += 1;
                if p.resp {
                    p.psn_off = d;
                    continue;
                }
                p.psn_off = next.wrapping_add(d);
                if d == 0 {
                    next = next.wrapping_add(psn_span(p, mtu));
                }
            }
        }
    }

    /// After the steps `removed` of `old` are gone (this case is what is
    /// left), moves each response's PSN so that it answers the same post
    /// as before: a post removed ahead of it no longer takes PSNs. A
    /// response inside a removed post, or before the first, stays put.
    pub fn rebase_responses(&mut self, old: &Case, removed: std::ops::Range<usize>, mtu: u32) {
        // (old start, new start, span) of each old post; None when removed.
        let (mut old_next, mut new_next) = (0i64, 0i64);
        let mut posts = Vec::new();
        for (i, s) in old.steps.iter().enumerate() {
            if let Step::Post(w) = s {
                let span = i64::from(w.span(mtu));
                let kept = !removed.contains(&i);
                posts.push((old_next, kept.then_some(new_next), span));
                old_next += span;
                if kept {
                    new_next += span;
                }
            }
        }
        if posts.iter().all(|p| p.1.is_some()) {
            return;
        }
        let map = |off: i32| -> i32 {
            let o = i64::from(off);
            if o >= old_next {
                return (o - old_next + new_next) as i32;
            }
            match posts.iter().find(|p| p.0 <= o && o < p.0 + p.2) {
                Some(&(start, Some(new_start), _)) => (new_start + o - start) as i32,
                _ => off,
            }
        };
        for s in &mut self.steps {
            if let Step::Packet(p) = s {
                if p.resp {
                    p.psn_off = map(p.psn_off);
                }
            }
        }
    }

    /// PSNs the target's requests take (the case's posts, in order).
    pub fn request_span(&self, mtu: u32) -> u32 {
        self.posts().map(|w| w.span(mtu)).sum()
    }

    /// The packets of the case.
    pub fn packets(&self) -> impl Iterator<Item = &PacketSpec> {
        self.steps.iter().filter_map(|s| match s {
            Step::Packet(p) => Some(p),
            _ => None,
        })
    }

    /// The work requests the case has the target post.
    pub fn posts(&self) -> impl Iterator<Item = &Post> {
        self.steps.iter().filter_map(|s| match s {
            Step::Post(p) => Some(p),
            _ => None,
        })
    }
}
