//! `uroce rc-stress`: every RC operation between two processes (or two
//! hosts), every byte verified.
//!
//! The server exposes a region for RDMA WRITE/READ/atomics and posts
//! receives; the client drives a seeded random mix of SEND, SEND with
//! immediate, RDMA WRITE (+imm), RDMA READ, fetch-add and compare-swap
//! with several WRs in flight. RC executes requests in order, so the
//! client's shadow copy of the server region predicts every READ result
//! and every atomic's original value exactly; the server checks each
//! received message against the pattern its sequence number implies.
//! The out-of-band exchange is one text line each way over TCP.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use uroce_verbs::loopback::{connect_rc, RcParams};
use uroce_verbs::*;

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_ATOMIC);
/// Bytes of the region used for RDMA WRITE/READ.
const DATA: usize = 1 << 20;
/// 8-byte words for atomics, after the data area.
const WORDS: usize = 64;
/// Largest SEND.
const MAX_SEND: usize = 16 << 10;
/// Receive slots on the server.
const RECV_SLOTS: usize = 128;
/// WRs in flight on the client.
const DEPTH: usize = 16;
const END_MARK: u64 = u64::MAX;
/// Longest wait for any completion before giving up.
const TIMEOUT: Duration = Duration::from_secs(15);

/// Options.
#[derive(Debug, Clone)]
pub struct StressOptions {
    /// Server to connect to (`None`: be the server).
    pub server: Option<String>,
    /// TCP port of the exchange.
    pub port: u16,
    /// Device name (default: the first configured device).
    pub ib_dev: Option<String>,
    /// Messages (client).
    pub messages: u64,
    /// Seed of the operation mix (client).
    pub seed: u64,
    /// Path MTU bytes.
    pub mtu: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Client: also RDMA ATOMIC WRITE and FLUSH (IBA 1.5; kernel rxe has
    /// them from Linux 6.2). The server always accepts them.
    pub ext: bool,
}

impl Default for StressOptions {
    fn default() -> Self {
        StressOptions {
            server: None,
            port: 18516,
            ib_dev: None,
            messages: 10_000,
            seed: 1,
            mtu: 1024,
            timeout: 14,
            ext: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StressReport {
    /// Messages of each kind: SEND, WRITE, READ, atomic.
    pub sends: u64,
    /// RDMA WRITEs.
    pub writes: u64,
    /// RDMA READs.
    pub reads: u64,
    /// Atomics.
    pub atomics: u64,
    /// ATOMIC WRITEs and FLUSHes (with `ext`).
    pub ext_ops: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Verification failures (0 on success).
    pub errors: u64,
}

fn err(m: impl Into<String>) -> Error {
    Error::Engine(m.into())
}

/// No completion for too long: the error, and with `UROCE_DEBUG` set the
/// QP's internal state on stderr.
fn stuck(qp: &QueuePair, who: &str) -> Error {
    failed(qp, format!("{who}: no completion for {TIMEOUT:?}"))
}

/// The error `m`, and with `UROCE_DEBUG` set the QP's internal state on
/// stderr.
fn failed(qp: &QueuePair, m: String) -> Error {
    if std::env::var_os("UROCE_DEBUG").is_some() {
        eprintln!("{}", qp.debug_state());
    }
    err(m)
}

/// SEND payload byte `i` of message `seq`.
fn pat(seq: u64, i: usize) -> u8 {
    (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8 ^ (i as u8).wrapping_mul(31)
}

struct Side {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
    psn: u32,
}

fn open(o: &StressOptions, recv_wr: u32) -> Result<Side> {
    let dev = match &o.ib_dev {
        Some(n) => Device::by_name(n)?,
        None => devices()?
            .into_iter()
            .next()
            .ok_or_else(|| Error::NoDevice("none configured".into()))?,
    };
    let ctx = dev.open()?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(4 * RECV_SLOTS as u32 + 4 * DEPTH as u32)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        cap: QpCap {
            max_send_wr: 2 * DEPTH as u32,
            max_recv_wr: recv_wr,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
        srq: None,
    })?;
    Ok(Side {
        ctx,
        pd,
        cq,
        qp,
        psn: uroce_provider::wire::Psn::random().value(),
    })
}

fn line(s: &mut BufReader<TcpStream>) -> Result<Vec<String>> {
    let mut l = String::new();
    s.read_line(&mut l)
        .map_err(|e| err(format!("exchange: {e}")))?;
    Ok(l.split_whitespace().map(String::from).collect())
}

fn num(v: &[String], i: usize) -> Result<u64> {
    let s = v.get(i).ok_or_else(|| err("exchange: short line"))?;
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .map_err(|_| err(format!("exchange: bad number {s}")))
}

/// Runs the server side until the client's end marker; returns what it
/// verified.
pub fn serve(o: &StressOptions) -> Result<StressReport> {
    let s = open(o, RECV_SLOTS as u32)?;
    let region =
        s.pd.alloc_mr(DATA + 8 * WORDS, ALL | Access::FLUSH_GLOBAL)?;
    let slots = s.pd.alloc_mr(RECV_SLOTS * MAX_SEND, Access::LOCAL_WRITE)?;
    let l = TcpListener::bind(("0.0.0.0", o.port))
        .map_err(|e| err(format!("listen {}: {e}", o.port)))?;
    let (tcp, peer) = l.accept().map_err(|e| err(format!("accept: {e}")))?;
    let mut rd = BufReader::new(tcp.try_clone().map_err(|e| err(e.to_string()))?);
    let v = line(&mut rd)?;
    let (qpn, psn, mtu) = (num(&v, 0)? as u32, num(&v, 1)? as u32, num(&v, 2)? as u32);
    let mtu = Mtu::from_bytes(mtu).ok_or_else(|| err("bad MTU"))?;
    // The client's device address (its TCP source address may differ).
    let ip: IpAddr = v.get(3).and_then(|a| a.parse().ok()).unwrap_or(peer.ip());
    let params = RcParams {
        mtu,
        rd_atomic: 16,
        timeout: o.timeout,
    };
    // Remote FLUSH allowed too (a client with `ext` sends them).
    let mut co = params.options();
    co.access |= Access::FLUSH_GLOBAL;
    s.qp.init_with(&co)?;
    s.qp.rtr_rts(&AddressVector::to_ip(ip), qpn, psn, s.psn, &co)?;
    // Receives go up before the client learns our address.
    for i in 0..RECV_SLOTS {
        let wr = RecvWr {
            wr_id: i as u64,
            sg_list: [slots.sge(i * MAX_SEND, MAX_SEND as u32)]
                .into_iter()
                .collect(),
        };
        s.qp.post_recv(&[wr]).map_err(|e| e.1)?;
    }
    let mut w = tcp;
    writeln!(
        w,
        "{:x} {:x} {:x} {:x}",
        s.qp.qp_num(),
        s.psn,
        region.rkey(),
        region.addr()
    )
    .map_err(|e| err(e.to_string()))?;
    let mut rep = StressReport::default();
    let mut last_progress = Instant::now();
    let mut buf = vec![0u8; MAX_SEND];
    'outer: loop {
        let Some(wc) = s.cq.poll_one() else {
            if last_progress.elapsed() > TIMEOUT {
                return Err(stuck(&s.qp, "server"));
            }
            std::thread::yield_now();
            continue;
        };
        last_progress = Instant::now();
        if wc.status != WcStatus::Success {
            return Err(err(format!(
                "server: wr {} completed with {}",
                wc.wr_id, wc.status
            )));
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            continue;
        }
        let slot = wc.wr_id as usize;
        let len = wc.byte_len as usize;
        if wc.opcode == WcOpcode::RecvRdmaWithImm {
            // WRITE with immediate: the immediate is the sequence number.
            rep.writes += 1;
        } else {
            slots
                .read(slot * MAX_SEND, &mut buf[..len])
                .map_err(|e| err(e.to_string()))?;
            if len < 8 {
                rep.errors += 1;
            } else {
                let seq = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
                if seq == END_MARK {
                    break 'outer;
                }
                if wc.wc_flags.contains(WcFlags::WITH_IMM) && wc.imm_data != seq as u32 {
                    rep.errors += 1;
                }
                if buf[8..len]
                    .iter()
                    .enumerate()
                    .any(|(i, &b)| b != pat(seq, i + 8))
                {
                    rep.errors += 1;
                }
                rep.sends += 1;
                rep.bytes += len as u64;
            }
        }
        let wr = RecvWr {
            wr_id: slot as u64,
            sg_list: [slots.sge(slot * MAX_SEND, MAX_SEND as u32)]
                .into_iter()
                .collect(),
        };
        s.qp.post_recv(&[wr]).map_err(|e| e.1)?;
    }
    writeln!(w, "{} {} {}", rep.sends, rep.writes, rep.errors).map_err(|e| err(e.to_string()))?;
    // Stay up (our engine still has to acknowledge the end marker) until
    // the client has its completion and closes the connection.
    let mut rest = String::new();
    let _ = rd.read_line(&mut rest);
    // The QP (with the receive WRs it still holds) goes before the
    // regions those WRs name are deregistered (UROCE_CHECK's lifetime
    // rule).
    drop(s);
    Ok(rep)
}

/// A WR in flight on the client and what its completion must show.
enum Expect {
    None,
    /// READ into local slot bytes that must equal these.
    Read {
        slot: usize,
        data: Vec<u8>,
    },
    /// Atomic whose original value must be this.
    Atomic {
        slot: usize,
        orig: u64,
    },
}

/// Runs the client side; returns what it did and verified.
pub fn drive(o: &StressOptions) -> Result<StressReport> {
    use rand::{Rng, SeedableRng};
    let host = o.server.as_deref().ok_or_else(|| err("no server given"))?;
    let s = open(o, 1)?;
    let mtu = Mtu::from_bytes(o.mtu).ok_or_else(|| err("bad MTU"))?;
    // Local buffers: a source of patterns and DEPTH slots for READ/atomic results.
    let src = s.pd.alloc_mr(DATA + MAX_SEND, ALL)?;
    let slots = s.pd.alloc_mr(DEPTH * MAX_SEND, ALL)?;
    let tcp = TcpStream::connect((host, o.port))
        .map_err(|e| err(format!("connect {host}:{}: {e}", o.port)))?;
    let peer: IpAddr = tcp.peer_addr().map_err(|e| err(e.to_string()))?.ip();
    let mut w = tcp.try_clone().map_err(|e| err(e.to_string()))?;
    let my_ip = s.ctx.device().ip();
    writeln!(w, "{:x} {:x} {:x} {my_ip}", s.qp.qp_num(), s.psn, o.mtu)
        .map_err(|e| err(e.to_string()))?;
    let mut rd = BufReader::new(tcp);
    let v = line(&mut rd)?;
    let (rqpn, rpsn, rkey, raddr) = (
        num(&v, 0)? as u32,
        num(&v, 1)? as u32,
        num(&v, 2)? as u32,
        num(&v, 3)?,
    );
    let rip: IpAddr = v.get(4).and_then(|a| a.parse().ok()).unwrap_or(peer);
    let params = RcParams {
        mtu,
        rd_atomic: 16,
        timeout: o.timeout,
    };
    connect_rc(&s.qp, rip, rqpn, s.psn, rpsn, params)?;

    let mut rng = rand::rngs::SmallRng::seed_from_u64(o.seed);
    let mut shadow = vec![0u8; DATA + 8 * WORDS];
    let mut rep = StressReport::default();
    let mut inflight: VecDeque<(u64, Expect)> = VecDeque::new();
    let mut free_slots: Vec<usize> = (0..DEPTH).collect();
    let check = |wc: &Wc, e: Expect, rep: &mut StressReport, free: &mut Vec<usize>| -> Result<()> {
        if wc.status != WcStatus::Success {
            return Err(err(format!(
                "client: wr {} completed with {}",
                wc.wr_id, wc.status
            )));
        }
        match e {
            Expect::None => {}
            Expect::Read { slot, data } => {
                let got = slots
                    .to_vec(slot * MAX_SEND, data.len())
                    .map_err(|e| err(e.to_string()))?;
                if got != data {
                    let first = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                    eprintln!(
                        "rc-stress: READ wr {} ({} bytes) differs from byte {first}",
                        wc.wr_id,
                        data.len()
                    );
                    rep.errors += 1;
                }
                free.push(slot);
            }
            Expect::Atomic { slot, orig } => {
                let got = slots
                    .atomic_u64(slot * MAX_SEND)
                    .map_err(|e| err(e.to_string()))?
                    .load(Ordering::SeqCst);
                if got != orig {
                    eprintln!(
                        "rc-stress: atomic wr {} returned {got:#x}, expected {orig:#x}",
                        wc.wr_id
                    );
                    rep.errors += 1;
                }
                free.push(slot);
            }
        }
        Ok(())
    };
    let mut seq = 0u64;
    let mut write_imms = 0u64;
    let mut last_progress = Instant::now();
    while seq < o.messages || !inflight.is_empty() {
        // Reap.
        while let Some(wc) = s.cq.poll_one() {
            let (id, e) = inflight
                .pop_front()
                .ok_or_else(|| err("completion without a WR"))?;
            if wc.wr_id != id {
                return Err(err(format!(
                    "completion order: got {} expected {id}",
                    wc.wr_id
                )));
            }
            check(&wc, e, &mut rep, &mut free_slots)?;
            last_progress = Instant::now();
        }
        if last_progress.elapsed() > TIMEOUT {
            return Err(stuck(&s.qp, "client"));
        }
        if seq >= o.messages || inflight.len() >= DEPTH || free_slots.is_empty() {
            std::thread::yield_now();
            continue;
        }
        let kind = rng.random_range(0..if o.ext { 12u32 } else { 10 });
        let mut wr = SendWr::new(seq, WrOpcode::Send);
        wr.flags = SendFlags::SIGNALED;
        let expect = match kind {
            0..=2 => {
                // SEND (with immediate one time in three).
                let len = rng.random_range(8..=MAX_SEND);
                let mut m = vec![0u8; len];
                m[..8].copy_from_slice(&seq.to_le_bytes());
                for (i, b) in m.iter_mut().enumerate().skip(8) {
                    *b = pat(seq, i);
                }
                src.write(DATA, &m).map_err(|e| err(e.to_string()))?;
                // The source must not change before the WR is sent: wait
                // for it (SENDs are the only users of this area).
                wr.sg_list.push(src.sge(DATA, len as u32));
                if kind == 2 {
                    wr.opcode = WrOpcode::SendWithImm;
                    wr.imm_data = seq as u32;
                }
                rep.sends += 1;
                rep.bytes += len as u64;
                Expect::None
            }
            3..=5 => {
                // RDMA WRITE of fresh random bytes to a random range.
                let len = rng.random_range(0..=64 << 10usize);
                let off = rng.random_range(0..=DATA - len);
                let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                src.write(off, &bytes).map_err(|e| err(e.to_string()))?;
                shadow[off..off + len].copy_from_slice(&bytes);
                wr.opcode = if kind == 5 {
                    WrOpcode::RdmaWriteWithImm
                } else {
                    WrOpcode::RdmaWrite
                };
                write_imms += u64::from(kind == 5);
                // READs still in flight may read these bytes, and a READ
                // that is retried re-reads memory: without the fence it
                // could return this WRITE's data. (IBA: a fenced WR waits
                // for earlier READs and atomics to complete.)
                wr.flags |= SendFlags::FENCE;
                wr.imm_data = seq as u32;
                wr.sg_list.push(src.sge(off, len as u32));
                wr.remote_addr = raddr + off as u64;
                wr.rkey = rkey;
                rep.writes += 1;
                rep.bytes += len as u64;
                Expect::None
            }
            6..=7 => {
                let len = rng.random_range(0..=MAX_SEND);
                let off = rng.random_range(0..=DATA - len);
                let slot = free_slots.pop().expect("checked");
                wr.opcode = WrOpcode::RdmaRead;
                wr.sg_list.push(slots.sge(slot * MAX_SEND, len as u32));
                wr.remote_addr = raddr + off as u64;
                wr.rkey = rkey;
                rep.reads += 1;
                rep.bytes += len as u64;
                Expect::Read {
                    slot,
                    data: shadow[off..off + len].to_vec(),
                }
            }
            10 => {
                // ATOMIC WRITE of a random value to a random word.
                let at = DATA + 8 * rng.random_range(0..WORDS);
                let bytes: [u8; 8] = rng.random();
                shadow[at..at + 8].copy_from_slice(&bytes);
                wr = SendWr::atomic_write(seq, raddr + at as u64, rkey, bytes);
                rep.ext_ops += 1;
                Expect::None
            }
            11 => {
                // FLUSH of a random range (or, one time in four, the
                // whole region) for global visibility.
                let len = rng.random_range(0..=64 << 10usize);
                let off = rng.random_range(0..=DATA - len);
                let level = if rng.random_range(0..4) == 0 {
                    uroce_wire::feth::FLUSH_MR
                } else {
                    uroce_wire::feth::FLUSH_RANGE
                };
                wr = SendWr::flush(
                    seq,
                    raddr + off as u64,
                    rkey,
                    len as u32,
                    uroce_wire::feth::FLUSH_GLOBAL,
                    level,
                );
                rep.ext_ops += 1;
                Expect::None
            }
            _ => {
                let word = rng.random_range(0..WORDS);
                let at = DATA + 8 * word;
                let orig = u64::from_ne_bytes(shadow[at..at + 8].try_into().expect("8"));
                let slot = free_slots.pop().expect("checked");
                let new = if kind == 8 {
                    let add: u64 = rng.random_range(1..1000);
                    wr.opcode = WrOpcode::AtomicFetchAndAdd;
                    wr.compare_add = add;
                    orig.wrapping_add(add)
                } else {
                    let swap: u64 = rng.random();
                    wr.opcode = WrOpcode::AtomicCmpAndSwp;
                    // Half the time compare with the right value.
                    wr.compare_add = if rng.random_bool(0.5) { orig } else { orig ^ 1 };
                    wr.swap = swap;
                    if wr.compare_add == orig {
                        swap
                    } else {
                        orig
                    }
                };
                shadow[at..at + 8].copy_from_slice(&new.to_ne_bytes());
                wr.sg_list.push(slots.sge(slot * MAX_SEND, 8));
                wr.remote_addr = raddr + at as u64;
                wr.rkey = rkey;
                rep.atomics += 1;
                Expect::Atomic { slot, orig }
            }
        };
        let reuses_source = kind <= 5;
        s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        inflight.push_back((seq, expect));
        seq += 1;
        if reuses_source {
            // SENDs and WRITEs take their data from a source area the next
            // one overwrites: let everything in flight finish first.
            while !inflight.is_empty() {
                match s.cq.poll_one() {
                    Some(wc) => {
                        let (id, e) = inflight
                            .pop_front()
                            .ok_or_else(|| err("completion without a WR"))?;
                        if wc.wr_id != id {
                            return Err(err(format!(
                                "completion order: got {} expected {id}",
                                wc.wr_id
                            )));
                        }
                        check(&wc, e, &mut rep, &mut free_slots)?;
                        last_progress = Instant::now();
                    }
                    None if last_progress.elapsed() > TIMEOUT => {
                        return Err(stuck(&s.qp, "client"))
                    }
                    None => std::thread::yield_now(),
                }
            }
        }
    }
    // Finally read the whole region back and compare with the shadow.
    let whole = s.pd.alloc_mr(DATA + 8 * WORDS, ALL)?;
    let mut wr = SendWr::new(u64::MAX - 1, WrOpcode::RdmaRead);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(whole.sge(0, (DATA + 8 * WORDS) as u32));
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    s.qp.post_send(&[wr]).map_err(|e| e.1)?;
    let wc = s.cq.wait(1, TIMEOUT);
    if wc.first().map(|w| w.status) != Some(WcStatus::Success) {
        return Err(failed(&s.qp, format!("final READ: {wc:?}")));
    }
    let got = whole
        .to_vec(0, DATA + 8 * WORDS)
        .map_err(|e| err(e.to_string()))?;
    if got != shadow {
        let first = got
            .iter()
            .zip(&shadow)
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        eprintln!("rc-stress: the server region differs from the expected one from byte {first}");
        rep.errors += 1;
    }
    // End marker, then the server's verdict.
    src.write(DATA, &END_MARK.to_le_bytes())
        .map_err(|e| err(e.to_string()))?;
    let mut wr = SendWr::new(u64::MAX, WrOpcode::Send);
    wr.flags = SendFlags::SIGNALED;
    wr.sg_list.push(src.sge(DATA, 8));
    s.qp.post_send(&[wr]).map_err(|e| e.1)?;
    let wc = s.cq.wait(1, TIMEOUT);
    if wc.first().map(|w| w.status) != Some(WcStatus::Success) {
        return Err(failed(&s.qp, format!("end marker: {wc:?}")));
    }
    let v = line(&mut rd)?;
    let (srv_sends, srv_writes_imm, srv_errors) = (
        v.first().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
        v.get(1).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
        v.get(2).and_then(|x| x.parse::<u64>().ok()).unwrap_or(1),
    );
    if srv_sends != rep.sends || srv_writes_imm != write_imms {
        eprintln!(
            "rc-stress: the server received {srv_sends} sends and {srv_writes_imm} writes with immediate, \
             the client sent {} and {write_imms}",
            rep.sends
        );
        rep.errors += 1;
    }
    rep.errors += srv_errors;
    // The QP before the regions its WRs name (as in `serve`).
    drop(s);
    Ok(rep)
}
