//! Replaying a capture: the requests of one connection of a pcap or
//! pcapng file (uroce's own, a finding's, or any other capture `wire`
//! parses: Ethernet, raw IP, Linux cooked) turned into a [`Case`] whose
//! packets are relative to the live connection, so that they run against
//! any [`Target`](super::target::Target).
//!
//! What is rewritten: the destination QP (the target's fuzzed QP), the
//! PSNs (each one's distance from the flow's first request, in 24-bit
//! sequence space), the flow's usual rkey (the one its RETHs and
//! AtomicETHs name most: the live exposed region's rkey) and the
//! addresses that go with any rkey (an offset from the lowest address
//! seen with that rkey, so that the replay lands at the same relative
//! place of the live region), and a DETH's usual Q_Key (the live one).
//! Everything else goes out as recorded: opcodes, flags, partition key,
//! immediate data, payload bytes, and an ICRC that was wrong stays wrong
//! by the same bits. Responses (the other direction) are counted, not
//! replayed: the target makes its own.

use super::case::{Case, Icrc, Key, PacketSpec, Step};
use super::gen::one_mutation;
use super::target::Conn;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use uroce_provider::types::QpType;
use uroce_wire::frame::parse_frame;
use uroce_wire::pcap::{CaptureError, CaptureReader};
use uroce_wire::{Error as WireError, Transport};

/// Longest gap between two replayed packets (µs); longer ones are cut.
pub const MAX_GAP_US: u32 = 10_000;
/// The wait after the last packet (µs): the target answers.
pub const FINAL_WAIT_US: u32 = 5_000;
/// RoCEv2 packets read at most (the rest of a larger capture is ignored).
pub const MAX_PACKETS: usize = 100_000;

/// How to replay.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The flow to replay (its number in the listing, from 1); `None`:
    /// the one with the most requests.
    pub flow: Option<usize>,
    /// The transport of the live QP; `None`: the flow's.
    pub qp_type: Option<QpType>,
    /// Mutants of the replayed case to run after it.
    pub mutate: u64,
    /// Seed of the mutants (and of a simulated target).
    pub seed: u64,
}

/// One direction of a connection: requests from `src` to QP `dest_qp`
/// at `dst`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// The requester's address.
    pub src: IpAddr,
    /// The responder's address.
    pub dst: IpAddr,
    /// The responder's QP.
    pub dest_qp: u32,
    /// Request packets.
    pub requests: usize,
    /// Packets from `dst` to `src` that are not requests (responses,
    /// acknowledgements, CNPs).
    pub responses: usize,
    /// The transport most of its requests are of.
    pub transport: Option<Transport>,
}

/// A request packet of the capture.
#[derive(Clone, Debug)]
struct Captured {
    at: Duration,
    src: IpAddr,
    dst: IpAddr,
    dest_qp: u32,
    transport: Transport,
    /// The UDP payload (BTH to ICRC).
    bytes: Vec<u8>,
    /// Recorded ICRC XOR the right one (0: right).
    icrc_error: u32,
}

/// A replayed packet that names a range of the live region (with the
/// mapped rkey).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    /// Its number among the replayed packets, from 1.
    pub packet: usize,
    /// Opcode name.
    pub opcode: &'static str,
    /// Offset from the live region's start.
    pub offset: i64,
    /// Bytes.
    pub len: u64,
}

/// What a capture holds and how its chosen flow is replayed.
#[derive(Clone, Debug)]
pub struct ReplayPlan {
    /// Frames in the file.
    pub frames: u64,
    /// Frames that did not parse (unsupported link type, cut short, ...).
    pub bad_frames: u64,
    /// RoCEv2 packets (UDP to port 4791) that parse.
    pub roce: usize,
    /// RoCEv2 datagrams whose headers do not parse (not replayed).
    pub unparsable: usize,
    /// RoCEv2 packets whose recorded ICRC is wrong (they are replayed
    /// with the same error).
    pub bad_icrc: usize,
    /// The file had more than [`MAX_PACKETS`] RoCEv2 packets.
    pub cut: bool,
    /// The flows, most requests first.
    pub flows: Vec<Flow>,
    /// The replayed one (an index into `flows`).
    pub chosen: usize,
    /// The live QP's transport.
    pub qp_type: QpType,
    /// The flow's first PSN.
    pub first_psn: u32,
    /// The rkey mapped to the live region's, if the flow names any.
    pub rkey: Option<u32>,
    /// Other rkeys, kept as they are.
    pub other_rkeys: Vec<u32>,
    /// Each rkey's lowest address (offsets are from it).
    pub bases: BTreeMap<u32, u64>,
    /// The Q_Key mapped to the live one (UD), if any.
    pub qkey: Option<u32>,
    /// Replayed packets with a bad ICRC.
    pub flow_bad_icrc: usize,
    /// The case.
    pub case: Case,
}

/// The most frequent value (the first seen of equally frequent ones).
fn most_common<T: Copy + Eq>(vals: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: Vec<(T, usize)> = Vec::new();
    for v in vals {
        match counts.iter_mut().find(|(x, _)| *x == v) {
            Some(c) => c.1 += 1,
            None => counts.push((v, 1)),
        }
    }
    let max = counts.iter().map(|c| c.1).max()?;
    counts.into_iter().find(|c| c.1 == max).map(|c| c.0)
}

impl ReplayPlan {
    /// Reads `path` and plans the replay of one of its flows.
    pub fn from_file(path: &Path, opts: &Options) -> Result<ReplayPlan, String> {
        let name = path.display();
        let mut reader = CaptureReader::open(path).map_err(|e| format!("{name}: {e}"))?;
        let mut plan = ReplayPlan::empty();
        let mut packets = Vec::new();
        let mut responses: Vec<(IpAddr, IpAddr)> = Vec::new();
        while let Some(rec) = reader.next_record() {
            plan.frames += 1;
            let rec = match rec {
                Ok(r) => r,
                Err(CaptureError::UnknownInterface { .. }) => {
                    plan.bad_frames += 1;
                    continue;
                }
                Err(e) => return Err(format!("{name}: frame {}: {e}", plan.frames)),
            };
            let frame = match parse_frame(rec.link, rec.data) {
                Ok(Some(f)) if f.dst_port == uroce_wire::ROCEV2_UDP_PORT => f,
                Ok(_) => continue,
                Err(_) => {
                    plan.bad_frames += 1;
                    continue;
                }
            };
            let Ok(p) = uroce_wire::packet::parse(frame.payload) else {
                plan.unparsable += 1;
                continue;
            };
            plan.roce += 1;
            let icrc_error = match frame.verify_icrc() {
                Err(WireError::IcrcMismatch { found, computed }) => found ^ computed,
                _ => 0,
            };
            if icrc_error != 0 {
                plan.bad_icrc += 1;
            }
            // A CNP is not a request: the target's congestion control,
            // not its responder, handles it.
            if p.info.is_request && p.info.transport != Transport::Cnp {
                packets.push(Captured {
                    at: rec.timestamp,
                    src: frame.src,
                    dst: frame.dst,
                    dest_qp: p.bth.dest_qp,
                    transport: p.info.transport,
                    bytes: frame.payload.to_vec(),
                    icrc_error,
                });
            } else {
                responses.push((frame.src, frame.dst));
            }
            if plan.roce >= MAX_PACKETS {
                plan.cut = true;
                break;
            }
        }
        plan.flows = flows(&packets, &responses);
        if plan.flows.is_empty() {
            return Err(format!(
                "{name}: no RoCEv2 requests in {} frames ({} RoCEv2 packets, {} unparsable)",
                plan.frames, plan.roce, plan.unparsable
            ));
        }
        // None chosen yet (for the listing in an error).
        plan.chosen = usize::MAX;
        plan.chosen = match opts.flow {
            None => 0,
            Some(n) if (1..=plan.flows.len()).contains(&n) => n - 1,
            Some(n) => {
                return Err(format!(
                    "{name}: no flow {n}: the capture has {} (1 to {})\n{}",
                    plan.flows.len(),
                    plan.flows.len(),
                    plan.listing().trim_end()
                ))
            }
        };
        let f = plan.flows[plan.chosen].clone();
        let mine: Vec<Captured> = packets
            .into_iter()
            .filter(|c| c.src == f.src && c.dst == f.dst && c.dest_qp == f.dest_qp)
            .collect();
        plan.qp_type = opts.qp_type.unwrap_or(match f.transport {
            Some(Transport::Uc) => QpType::Uc,
            Some(Transport::Ud) => QpType::Ud,
            _ => QpType::Rc,
        });
        plan.build(&mine);
        Ok(plan)
    }

    fn empty() -> ReplayPlan {
        ReplayPlan {
            frames: 0,
            bad_frames: 0,
            roce: 0,
            unparsable: 0,
            bad_icrc: 0,
            cut: false,
            flows: Vec::new(),
            chosen: 0,
            qp_type: QpType::Rc,
            first_psn: 0,
            rkey: None,
            other_rkeys: Vec::new(),
            bases: BTreeMap::new(),
            qkey: None,
            flow_bad_icrc: 0,
            case: Case::default(),
        }
    }

    /// Makes the case from the flow's packets (each one parsed before).
    fn build(&mut self, mine: &[Captured]) {
        let parsed: Vec<_> = mine
            .iter()
            .filter_map(|c| uroce_wire::packet::parse(&c.bytes).ok().map(|p| (c, p)))
            .collect();
        let keyed = parsed.iter().flat_map(|(_, p)| {
            let r = p.reth().map(|r| (r.rkey, r.va));
            let a = p.atomic_eth().map(|a| (a.rkey, a.va));
            r.into_iter().chain(a)
        });
        for (rkey, va) in keyed.clone() {
            let b = self.bases.entry(rkey).or_insert(va);
            *b = (*b).min(va);
        }
        self.rkey = most_common(keyed.map(|k| k.0));
        self.other_rkeys = self
            .bases
            .keys()
            .copied()
            .filter(|k| Some(*k) != self.rkey)
            .collect();
        self.qkey = most_common(parsed.iter().filter_map(|(_, p)| p.deth().map(|d| d.qkey)));
        self.first_psn = parsed.first().map_or(0, |(_, p)| p.bth.psn.value());
        let mut steps = Vec::new();
        let mut last: Option<Duration> = None;
        for (c, p) in &parsed {
            if let Some(prev) = last {
                let gap = c.at.saturating_sub(prev).as_micros();
                let gap = u32::try_from(gap).unwrap_or(u32::MAX).min(MAX_GAP_US);
                if gap > 0 {
                    steps.push(Step::Wait(gap));
                }
            }
            last = Some(c.at);
            if c.icrc_error != 0 {
                self.flow_bad_icrc += 1;
            }
            steps.push(Step::Packet(self.spec(p, c.icrc_error)));
        }
        steps.push(Step::Wait(FINAL_WAIT_US));
        self.case = Case { steps };
    }

    fn key(&self, rkey: u32) -> Key {
        if Some(rkey) == self.rkey {
            Key::Valid
        } else {
            Key::Raw(rkey)
        }
    }

    fn offset(&self, rkey: u32, va: u64) -> i64 {
        va.wrapping_sub(self.bases.get(&rkey).copied().unwrap_or(va)) as i64
    }

    /// One recorded request as a packet of the case. The pad count needs
    /// no field of its own: `parse` only accepts the one the payload's
    /// length implies, which `emit` writes.
    fn spec(&self, p: &uroce_wire::packet::ParsedPacket<'_>, icrc_error: u32) -> PacketSpec {
        let b = &p.bth;
        let payload = p.payload;
        PacketSpec {
            opcode: b.opcode.0,
            raw_opcode: None,
            psn_off: b.psn.diff(uroce_wire::Psn::new(self.first_psn)),
            dest: super::case::Dest::Target,
            se: b.se,
            ack_req: b.ack_req,
            migreq: b.migreq,
            pad: None,
            tver: b.tver,
            pkey: b.pkey,
            reth: p
                .reth()
                .map(|r| (self.offset(r.rkey, r.va), self.key(r.rkey), r.dma_len)),
            atomic: p.atomic_eth().map(|a| {
                let off = self.offset(a.rkey, a.va);
                (off, self.key(a.rkey), a.swap_add, a.compare)
            }),
            aeth: None,
            atomic_ack: None,
            imm: p.imm(),
            ieth: p.ieth().map(|k| self.key(k)),
            deth: p.deth().map(|d| {
                let qkey = (Some(d.qkey) != self.qkey).then_some(d.qkey);
                (qkey, d.src_qp)
            }),
            payload: (u16::try_from(payload.len()).unwrap_or(u16::MAX), 0),
            data: (!payload.is_empty()).then(|| payload.to_vec()),
            icrc: if icrc_error == 0 {
                Icrc::Right
            } else {
                Icrc::Wrong(icrc_error)
            },
            truncate: None,
            resp: false,
            feth: p.feth().map(|f| (f.placement, f.selectivity)),
        }
    }

    /// The chosen flow.
    pub fn flow(&self) -> &Flow {
        &self.flows[self.chosen]
    }

    /// Replayed packets that name a range of the live region (the mapped
    /// rkey) reaching past its `len` bytes (or before it): a correct
    /// target rejects them.
    pub fn out_of_range(&self, len: u32) -> Vec<Range> {
        let mut v = Vec::new();
        for (i, p) in self.case.packets().enumerate() {
            let name = p.info().map_or("unknown opcode", |i| i.name);
            let mut push = |offset: i64, n: u64| {
                let end = offset.saturating_add(n.min(i64::MAX as u64) as i64);
                if offset < 0 || end > i64::from(len) {
                    v.push(Range {
                        packet: i + 1,
                        opcode: name,
                        offset,
                        len: n,
                    });
                }
            };
            if let Some((off, Key::Valid, dma)) = p.reth {
                push(off, u64::from(dma).max(u64::from(p.payload.0)));
            }
            if let Some((off, Key::Valid, ..)) = p.atomic {
                push(off, 8);
            }
        }
        v
    }

    /// Replayed packets whose payload is longer than `mtu`: a correct
    /// target rejects them.
    pub fn over_mtu(&self, mtu: u32) -> usize {
        self.case
            .packets()
            .filter(|p| u32::from(p.payload.0) > mtu)
            .count()
    }

    /// Receive WRs to post: one per message that consumes one (at least
    /// 8, at most 64).
    pub fn recvs(&self) -> u32 {
        let n = self
            .case
            .packets()
            .filter_map(|p| p.info())
            .filter(|i| {
                i.position.ends_message()
                    && (i.operation == uroce_wire::Operation::Send || i.has_imm())
            })
            .count();
        u32::try_from(n).unwrap_or(u32::MAX).clamp(8, 64)
    }

    /// The flows, numbered from 1, the chosen one marked.
    pub fn listing(&self) -> String {
        let mut s = String::new();
        for (i, f) in self.flows.iter().enumerate() {
            let t = f.transport.map_or("?".to_string(), |t| format!("{t:?}"));
            s += &format!(
                "  flow {}: {} -> {} QP {:#x}, {} {} requests, {} responses{}\n",
                i + 1,
                f.src,
                f.dst,
                f.dest_qp,
                f.requests,
                t.to_uppercase(),
                f.responses,
                if i == self.chosen {
                    "  <- replayed"
                } else {
                    ""
                }
            );
        }
        s
    }

    /// Mutant `index` of the case (deterministic from `seed`): one to
    /// three of its packets mutated with the field mutations of the
    /// generator, for `conn`'s shape.
    pub fn mutant(&self, seed: u64, index: u64, conn: &Conn) -> Case {
        let mut rng = SmallRng::seed_from_u64(seed ^ index.wrapping_mul(0xa076_1d64_78bd_642f));
        let mut case = self.case.clone();
        let at: Vec<usize> = (0..case.steps.len())
            .filter(|&i| matches!(case.steps[i], Step::Packet(_)))
            .collect();
        if at.is_empty() {
            return case;
        }
        for _ in 0..rng.random_range(1..=3) {
            let i = at[rng.random_range(0..at.len())];
            if let Step::Packet(p) = &mut case.steps[i] {
                one_mutation(p, &mut rng, conn);
            }
        }
        case
    }
}

/// Groups request packets by (source, destination, destination QP), most
/// requests first (the first seen of equal ones); counts each flow's
/// responses (non-requests from its destination to its source).
fn flows(packets: &[Captured], responses: &[(IpAddr, IpAddr)]) -> Vec<Flow> {
    let mut flows: Vec<(Flow, Vec<Transport>)> = Vec::new();
    for c in packets {
        let qp = c.dest_qp;
        let i = match flows
            .iter()
            .position(|(f, _)| f.src == c.src && f.dst == c.dst && f.dest_qp == qp)
        {
            Some(i) => i,
            None => {
                let f = Flow {
                    src: c.src,
                    dst: c.dst,
                    dest_qp: qp,
                    requests: 0,
                    responses: 0,
                    transport: None,
                };
                flows.push((f, Vec::new()));
                flows.len() - 1
            }
        };
        flows[i].0.requests += 1;
        flows[i].1.push(c.transport);
    }
    let mut out: Vec<Flow> = flows
        .into_iter()
        .map(|(mut f, ts)| {
            f.transport = most_common(ts.into_iter());
            f.responses = responses
                .iter()
                .filter(|(s, d)| *s == f.dst && *d == f.src)
                .count();
            f
        })
        .collect();
    // A stable sort keeps the order of appearance among equals.
    out.sort_by_key(|f| std::cmp::Reverse(f.requests));
    out
}

impl fmt::Display for ReplayPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} frames, {} RoCEv2 packets ({} with a bad ICRC, {} unparsable), {} other frames unreadable{}",
            self.frames,
            self.roce,
            self.bad_icrc,
            self.unparsable,
            self.bad_frames,
            if self.cut {
                format!(" (only the first {MAX_PACKETS} RoCEv2 packets read)")
            } else {
                String::new()
            }
        )?;
        write!(f, "{}", self.listing())?;
        let flow = self.flow();
        writeln!(
            f,
            "replaying flow {} as {}: {} requests from PSN {:#08x}{}, {} responses not replayed",
            self.chosen + 1,
            format!("{:?}", self.qp_type).to_uppercase(),
            self.case.packets().count(),
            self.first_psn,
            match self.flow_bad_icrc {
                0 => String::new(),
                n => format!(" ({n} with a bad ICRC, replayed as bad)"),
            },
            flow.responses
        )?;
        if let Some(k) = self.rkey {
            let base = self.bases.get(&k).copied().unwrap_or(0);
            writeln!(
                f,
                "  rkey {k:#x} -> the live region's rkey, addresses from {base:#x} -> offsets into the live region"
            )?;
        }
        for k in &self.other_rkeys {
            let base = self.bases.get(k).copied().unwrap_or(0);
            writeln!(f, "  rkey {k:#x} kept, addresses from {base:#x} -> offsets")?;
        }
        if let Some(q) = self.qkey {
            writeln!(f, "  Q_Key {q:#x} -> the live Q_Key")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::Icrc;
    use crate::run_case;
    use crate::sim::SimTarget;
    use crate::target::PATTERN;
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::sync::Arc;
    use uroce_provider::sans_io::engine::capture::Capture;
    use uroce_provider::sans_io::memory::MrInner;
    use uroce_provider::sans_io::net::sim::Faults;
    use uroce_provider::testing::{sge, signaled_wr, PairParams, RcPair};
    use uroce_provider::types::{Access, WrOpcode};

    const ALL: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ)
        .union(Access::REMOTE_ATOMIC);

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("uroce-replay-{}-{name}", std::process::id()))
    }

    /// A pair at MTU 1024 whose network keeps every packet, with an 8 KiB
    /// region on each side (a's filled from `local`).
    fn pair(local: &[u8]) -> (RcPair, Arc<MrInner>, Arc<MrInner>) {
        let mut pair = RcPair::new(11, Faults::default(), PairParams::default());
        pair.net.trace = Some(Vec::new());
        let a = pair.mr(true, 8192, ALL);
        let b = pair.mr(false, 8192, ALL);
        a.write(0, local).expect("fits");
        (pair, a, b)
    }

    fn write(
        a: &MrInner,
        b: &MrInner,
        id: u64,
        from: u64,
        to: u64,
        len: u32,
    ) -> uroce_provider::types::SendWr {
        let mut w = signaled_wr(id, WrOpcode::RdmaWrite, &[sge(a, from, len)]);
        w.remote_addr = b.iova() + to;
        w.rkey = b.rkey();
        w
    }

    /// Writes the packets the pair exchanged (as uroce's sockets send
    /// them: port 4791, IPv4 ID 0, DF), `edit` applied to each.
    fn save(pair: &RcPair, path: &Path, edit: impl Fn(&mut Vec<u8>)) {
        let mut cap = Capture::create(path).expect("create");
        for (_, s, d, b) in pair.net.trace.iter().flatten() {
            let mut b = b.clone();
            edit(&mut b);
            let port = uroce_wire::ROCEV2_UDP_PORT;
            cap.record(
                SocketAddr::new(*s, port),
                SocketAddr::new(*d, port),
                (0, true),
                (0, None),
                &b,
            );
        }
        cap.finish().expect("finish");
    }

    fn bytes(n: usize, k: usize) -> Vec<u8> {
        (0..n).map(|i| (i * k % 251) as u8).collect()
    }

    /// A SEND, a three-packet RDMA WRITE, a READ and an atomic, recorded
    /// by uroce, replayed on the simulated target: each lands there,
    /// rewritten to the new connection.
    #[test]
    fn a_uroce_capture_replays_rewritten() {
        let send = bytes(100, 3);
        let data = bytes(3072, 7);
        let mut local = send.clone();
        local.resize(1024, 0);
        local.extend_from_slice(&data);
        let (mut p, a, b) = pair(&local);
        p.post_recv(false, 1, &[sge(&b, 4096, 256)]);
        p.post_send(true, signaled_wr(1, WrOpcode::Send, &[sge(&a, 0, 100)]));
        p.post_send(true, write(&a, &b, 2, 1024, 512, 3072));
        let mut r = signaled_wr(3, WrOpcode::RdmaRead, &[sge(&a, 4096, 256)]);
        (r.remote_addr, r.rkey) = (b.iova(), b.rkey());
        p.post_send(true, r);
        let mut f = signaled_wr(4, WrOpcode::AtomicFetchAndAdd, &[sge(&a, 6000, 8)]);
        (f.remote_addr, f.rkey, f.compare_add) = (b.iova() + 3584, b.rkey(), 0x0101);
        p.post_send(true, f);
        assert_eq!(p.wait(true, true, 4, 1_000_000_000).len(), 4);
        let path = tmp("exchange.pcap");
        save(&p, &path, |_| {});

        let plan = ReplayPlan::from_file(&path, &Options::default()).expect("plan");
        let _ = std::fs::remove_file(&path);
        assert_eq!(plan.flows.len(), 1, "{plan}");
        assert_eq!(plan.flow().requests, 6, "{plan}");
        assert!(
            plan.flow().responses >= 3,
            "ACKs, READ response, atomic ACK: {plan}"
        );
        assert_eq!((plan.qp_type, plan.bad_icrc), (QpType::Rc, 0));
        assert_eq!(plan.rkey, Some(b.rkey()));
        assert_eq!(plan.bases.get(&b.rkey()), Some(&b.iova()));
        assert!(plan.out_of_range(4096).is_empty());
        let offs: Vec<i32> = plan.case.packets().map(|p| p.psn_off).collect();
        assert_eq!(offs, [0, 1, 2, 3, 4, 5]);

        let mut t = SimTarget::new(3, None);
        let out = run_case(&mut t, plan.qp_type, plan.recvs(), &plan.case).expect("run");
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        // The SEND went to the new QP at its PSN, with its bytes, and
        // completed the receive.
        let first = out.packets.iter().find(|p| p.sent).expect("sent");
        let sent = uroce_wire::packet::parse(&first.bytes).expect("parses");
        assert_eq!(sent.bth.dest_qp, out.conn.qpn);
        assert_eq!(sent.bth.psn.value(), out.conn.rq_psn);
        assert_eq!(sent.payload, &send[..]);
        assert!(out.obs.completions.iter().any(|c| c.recv && c.status == 0));
        // The WRITE at its offset, the atomic's 8 bytes, nothing else.
        assert_eq!(&out.obs.exposed[512..512 + 3072], &data[..]);
        assert_ne!(out.obs.exposed[3584..3592], [PATTERN; 8]);
        assert!(out.obs.exposed[..512].iter().all(|&x| x == PATTERN));
        let answers: Vec<String> = crate::diff::answer_kinds(&out);
        assert!(answers.iter().any(|a| a == "READ response"), "{answers:?}");
        assert!(answers.iter().any(|a| a == "atomic ACK"), "{answers:?}");
    }

    /// A packet recorded with a bad ICRC is replayed with the same error
    /// (and dropped), a WRITE past the live region is reported (and
    /// rejected); neither trips an oracle.
    #[test]
    fn bad_icrc_and_out_of_range_are_reported() {
        let (mut p, a, b) = pair(&bytes(2048, 5));
        p.post_recv(false, 1, &[sge(&b, 0, 256)]);
        p.post_send(true, write(&a, &b, 1, 0, 0, 64));
        p.post_send(true, signaled_wr(2, WrOpcode::Send, &[sge(&a, 0, 32)]));
        p.post_send(true, write(&a, &b, 3, 0, 6000, 1000));
        assert_eq!(p.wait(true, true, 3, 1_000_000_000).len(), 3);
        let path = tmp("bad.pcap");
        // The SEND (RC SEND ONLY) gets a wrong ICRC.
        save(&p, &path, |b| {
            if b.first() == Some(&0x04) {
                if let Some(x) = b.last_mut() {
                    *x ^= 0x40;
                }
            }
        });
        let plan = ReplayPlan::from_file(&path, &Options::default()).expect("plan");
        let _ = std::fs::remove_file(&path);
        assert_eq!((plan.bad_icrc, plan.flow_bad_icrc), (1, 1), "{plan}");
        let icrcs: Vec<Icrc> = plan.case.packets().map(|p| p.icrc).collect();
        assert_eq!(
            icrcs.iter().filter(|i| **i != Icrc::Right).count(),
            1,
            "{icrcs:?}"
        );
        let far = plan.out_of_range(4096);
        assert_eq!(far.len(), 1, "{far:?}");
        assert_eq!((far[0].offset, far[0].len), (6000, 1000));
        let mut t = SimTarget::new(3, None);
        let out = run_case(&mut t, plan.qp_type, plan.recvs(), &plan.case).expect("run");
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        assert!(!out.obs.completions.iter().any(|c| c.recv && c.status == 0));
        // The session prints it all, and the mutants run.
        let path = tmp("bad2.pcap");
        save(&p, &path, |_| {});
        let mut log = Vec::new();
        let opts = Options {
            mutate: 3,
            ..Options::default()
        };
        let dir = tmp("findings");
        let r = crate::session::replay_pcap(
            &path,
            &opts,
            &crate::session::TargetSpec::Sim(None),
            &dir,
            &mut log,
        );
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_dir_all(&dir);
        let log = String::from_utf8_lossy(&log);
        assert!(r.is_ok(), "{r:?}\n{log}");
        assert!(log.contains("outside the live region"), "{log}");
        assert!(log.contains("3 mutants"), "{log}");
    }

    /// Files that are not captures, cut short or without RoCEv2 give
    /// errors that say so.
    #[test]
    fn bad_files_give_clear_errors() {
        let (mut p, a, b) = pair(&[1; 64]);
        p.post_send(true, write(&a, &b, 1, 0, 0, 64));
        p.settle(1_000_000_000);
        let path = tmp("cut.pcap");
        save(&p, &path, |_| {});
        let whole = std::fs::read(&path).expect("read");
        let cases: [(&[u8], &str); 4] = [
            (b"not a capture at all", "not a pcap"),
            (&[], "not a pcap"),
            (&whole[..whole.len() - 7], "cut short"),
            (&whole[..24], "no RoCEv2 requests"),
        ];
        for (data, want) in cases {
            std::fs::write(&path, data).expect("write");
            let e = ReplayPlan::from_file(&path, &Options::default()).expect_err("an error");
            assert!(e.contains(want), "{e}");
        }
        std::fs::write(&path, &whole).expect("write");
        let o = Options {
            flow: Some(2),
            ..Options::default()
        };
        let e = ReplayPlan::from_file(&path, &o).expect_err("one flow only");
        assert!(e.contains("no flow 2"), "{e}");
        let _ = std::fs::remove_file(&path);
        assert!(ReplayPlan::from_file(&tmp("absent"), &Options::default()).is_err());
    }

    /// A capture made by hand (UD SENDs, one with another Q_Key): the
    /// usual Q_Key becomes the live one, the other stays and is dropped.
    #[test]
    fn ud_qkeys_map_to_the_live_one() {
        let rec = Conn {
            qp_type: QpType::Ud,
            target: IpAddr::from([10, 0, 0, 2]),
            fuzzer: IpAddr::from([10, 0, 0, 1]),
            src_port: uroce_wire::ROCEV2_UDP_PORT,
            qpn: 0x42,
            fuzzer_qpn: 0x43,
            control_qpn: 0x44,
            rq_psn: 100,
            sq_psn: 0,
            va: 0,
            len: 0,
            rkey: 0,
            private_rkey: 0,
            qkey: 0x1234,
            mtu: 1024,
            recvs_posted: 0,
            keys: Vec::new(),
            recv_len: None,
            min_rnr_timer: None,
            access: None,
            qp_access: None,
            ops_1_5: None,
        };
        let path = tmp("ud.pcap");
        let mut cap = Capture::create(&path).expect("create");
        for i in 0..4 {
            let mut p = PacketSpec::new(uroce_wire::Opcode(0x64), i);
            p.payload = (16, 0xab);
            p.deth = Some(((i == 3).then_some(0x9999), 0x43));
            let b = p.emit(&rec).expect("emits");
            let port = uroce_wire::ROCEV2_UDP_PORT;
            let (s, d) = (
                SocketAddr::new(rec.fuzzer, port),
                SocketAddr::new(rec.target, port),
            );
            cap.record(s, d, (0, true), (0, None), &b);
        }
        cap.finish().expect("finish");
        let plan = ReplayPlan::from_file(&path, &Options::default()).expect("plan");
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            (plan.qp_type, plan.qkey, plan.bad_icrc),
            (QpType::Ud, Some(0x1234), 0)
        );
        let deths: Vec<_> = plan.case.packets().map(|p| p.deth).collect();
        let mut want = vec![Some((None, 0x43)); 3];
        want.push(Some((Some(0x9999), 0x43)));
        assert_eq!(deths, want);
        let mut t = SimTarget::new(3, None);
        let out = run_case(&mut t, plan.qp_type, plan.recvs(), &plan.case).expect("run");
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let ok = out
            .obs
            .completions
            .iter()
            .filter(|c| c.recv && c.status == 0);
        assert_eq!(ok.count(), 3);
    }

    /// A capture made elsewhere (scapy's test vectors: IPv4 and IPv6, RC,
    /// UD, CNPs): every flow of requests replays; CNPs are no flow.
    #[test]
    fn a_foreign_capture_replays() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wire/tests/data/scapy_roce.pcap");
        let plan = ReplayPlan::from_file(&path, &Options::default()).expect("plan");
        assert_eq!(
            (plan.roce, plan.bad_icrc, plan.flows.len()),
            (9, 0, 5),
            "{plan}"
        );
        let mut t = SimTarget::new(3, None);
        for n in 1..=plan.flows.len() {
            let o = Options {
                flow: Some(n),
                ..Options::default()
            };
            let plan = ReplayPlan::from_file(&path, &o).expect("plan");
            let out = run_case(&mut t, plan.qp_type, plan.recvs(), &plan.case).expect("run");
            assert!(out.violations.is_empty(), "flow {n}: {:?}", out.violations);
        }
    }
}
