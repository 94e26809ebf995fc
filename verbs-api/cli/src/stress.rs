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
    // Slot `i`'s receive, posted (again once a message in it is read).
    let post_slot = |i: usize| {
        let wr = RecvWr {
            wr_id: i as u64,
            sg_list: [slots.sge(i * MAX_SEND, MAX_SEND as u32)]
                .into_iter()
                .collect(),
        };
        s.qp.post_recv(&[wr]).map_err(|e| e.1)
    };
    // Receives go up before the client learns our address.
    for i in 0..RECV_SLOTS {
        post_slot(i)?;
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
        post_slot(slot)?;
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
    let host = o.server.as_deref().ok_or_else(|| err("no server given"))?;
    let s = open(o, 1)?;
    let mtu = Mtu::from_bytes(o.mtu).ok_or_else(|| err("bad MTU"))?;
    // Local buffers: a source of patterns and DEPTH slots for READ/atomic results.
    let src = s.pd.alloc_mr(DATA + MAX_SEND, ALL)?;
    let slots = s.pd.alloc_mr(DEPTH * MAX_SEND, ALL)?;
    let (mut rd, remote) = connect_to_server(o, host, &s, mtu)?;
    let mut c = Client::new(o, &s, &src, &slots, remote);
    c.run(o)?;
    // Finally read the whole region back and compare with the shadow.
    let whole = s.pd.alloc_mr(DATA + 8 * WORDS, ALL)?;
    c.compare_region(&whole)?;
    let rep = c.finish(&mut rd)?;
    // The QP before the regions its WRs name (as in `serve`).
    drop(s);
    Ok(rep)
}

/// The server's region, as its exchange line names it.
#[derive(Debug, Clone, Copy)]
struct Remote {
    rkey: u32,
    addr: u64,
}

/// The client's exchange: our QP, PSN, MTU and device address to the
/// server, its QP, PSN and region back; then our QP is connected. Returns
/// the rest of the TCP connection (the server's verdict comes on it).
fn connect_to_server(
    o: &StressOptions,
    host: &str,
    s: &Side,
    mtu: Mtu,
) -> Result<(BufReader<TcpStream>, Remote)> {
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
    Ok((rd, Remote { rkey, addr: raddr }))
}

/// The client's state while it drives the mix.
struct Client<'a> {
    s: &'a Side,
    /// Where SENDs and WRITEs take their data from.
    src: &'a MemoryRegion,
    /// DEPTH slots for READ and atomic results.
    slots: &'a MemoryRegion,
    remote: Remote,
    rng: rand::rngs::SmallRng,
    /// What the server's region must hold.
    shadow: Vec<u8>,
    rep: StressReport,
    inflight: VecDeque<(u64, Expect)>,
    free_slots: Vec<usize>,
    /// The next message's sequence number (its wr_id).
    seq: u64,
    /// RDMA WRITEs with immediate posted (the server counts them).
    write_imms: u64,
    last_progress: Instant,
}

impl<'a> Client<'a> {
    fn new(
        o: &StressOptions,
        s: &'a Side,
        src: &'a MemoryRegion,
        slots: &'a MemoryRegion,
        remote: Remote,
    ) -> Self {
        use rand::SeedableRng;
        Client {
            s,
            src,
            slots,
            remote,
            rng: rand::rngs::SmallRng::seed_from_u64(o.seed),
            shadow: vec![0u8; DATA + 8 * WORDS],
            rep: StressReport::default(),
            inflight: VecDeque::new(),
            free_slots: (0..DEPTH).collect(),
            seq: 0,
            write_imms: 0,
            last_progress: Instant::now(),
        }
    }

    /// The loop: `o.messages` WRs of the seeded mix, up to DEPTH in
    /// flight, until every one has completed and been checked.
    fn run(&mut self, o: &StressOptions) -> Result<()> {
        use rand::Rng;
        while self.seq < o.messages || !self.inflight.is_empty() {
            // Reap.
            while let Some(wc) = self.s.cq.poll_one() {
                self.reap(&wc)?;
            }
            if self.last_progress.elapsed() > TIMEOUT {
                return Err(stuck(&self.s.qp, "client"));
            }
            if self.seq >= o.messages || self.inflight.len() >= DEPTH || self.free_slots.is_empty()
            {
                std::thread::yield_now();
                continue;
            }
            let kind = self.rng.random_range(0..if o.ext { 12u32 } else { 10 });
            let (wr, expect) = self.next_wr(kind)?;
            let reuses_source = kind <= 5;
            self.s.qp.post_send(&[wr]).map_err(|e| e.1)?;
            self.inflight.push_back((self.seq, expect));
            self.seq += 1;
            if reuses_source {
                // SENDs and WRITEs take their data from a source area the
                // next one overwrites: let everything in flight finish first.
                self.drain()?;
            }
        }
        Ok(())
    }

    /// Waits until nothing is in flight.
    fn drain(&mut self) -> Result<()> {
        while !self.inflight.is_empty() {
            match self.s.cq.poll_one() {
                Some(wc) => self.reap(&wc)?,
                None if self.last_progress.elapsed() > TIMEOUT => {
                    return Err(stuck(&self.s.qp, "client"))
                }
                None => std::thread::yield_now(),
            }
        }
        Ok(())
    }

    /// A completion: it must be the oldest WR's (RC completes in order),
    /// and show what that WR expects.
    fn reap(&mut self, wc: &Wc) -> Result<()> {
        let (id, e) = self
            .inflight
            .pop_front()
            .ok_or_else(|| err("completion without a WR"))?;
        if wc.wr_id != id {
            return Err(err(format!(
                "completion order: got {} expected {id}",
                wc.wr_id
            )));
        }
        self.check(wc, e)?;
        self.last_progress = Instant::now();
        Ok(())
    }

    /// Checks a completion against what its WR expects; a READ's or an
    /// atomic's slot is free again.
    fn check(&mut self, wc: &Wc, e: Expect) -> Result<()> {
        if wc.status != WcStatus::Success {
            return Err(err(format!(
                "client: wr {} completed with {}",
                wc.wr_id, wc.status
            )));
        }
        match e {
            Expect::None => {}
            Expect::Read { slot, data } => {
                let got = self
                    .slots
                    .to_vec(slot * MAX_SEND, data.len())
                    .map_err(|e| err(e.to_string()))?;
                if got != data {
                    let first = got.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(0);
                    eprintln!(
                        "rc-stress: READ wr {} ({} bytes) differs from byte {first}",
                        wc.wr_id,
                        data.len()
                    );
                    self.rep.errors += 1;
                }
                self.free_slots.push(slot);
            }
            Expect::Atomic { slot, orig } => {
                let got = self
                    .slots
                    .atomic_u64(slot * MAX_SEND)
                    .map_err(|e| err(e.to_string()))?
                    .load(Ordering::SeqCst);
                if got != orig {
                    eprintln!(
                        "rc-stress: atomic wr {} returned {got:#x}, expected {orig:#x}",
                        wc.wr_id
                    );
                    self.rep.errors += 1;
                }
                self.free_slots.push(slot);
            }
        }
        Ok(())
    }

    /// The WR of mix entry `kind` (0..12) for message `seq`, and what its
    /// completion must show; the shadow and the counts are updated.
    fn next_wr(&mut self, kind: u32) -> Result<(SendWr, Expect)> {
        let mut wr = SendWr::new(self.seq, WrOpcode::Send);
        wr.flags = SendFlags::SIGNALED;
        let expect = match kind {
            0..=2 => self.send(&mut wr, kind == 2)?,
            3..=5 => self.write(&mut wr, kind == 5)?,
            6..=7 => self.read(&mut wr),
            10 => {
                wr = self.atomic_write();
                Expect::None
            }
            11 => {
                wr = self.flush();
                Expect::None
            }
            _ => self.atomic(&mut wr, kind == 8),
        };
        Ok((wr, expect))
    }

    /// SEND (with immediate if `imm`) of a random length, the sequence
    /// number first, then its pattern.
    fn send(&mut self, wr: &mut SendWr, imm: bool) -> Result<Expect> {
        use rand::Rng;
        let seq = self.seq;
        let len = self.rng.random_range(8..=MAX_SEND);
        let mut m = vec![0u8; len];
        m[..8].copy_from_slice(&seq.to_le_bytes());
        for (i, b) in m.iter_mut().enumerate().skip(8) {
            *b = pat(seq, i);
        }
        self.src.write(DATA, &m).map_err(|e| err(e.to_string()))?;
        // The source must not change before the WR is sent: wait for it
        // (SENDs are the only users of this area).
        wr.sg_list.push(self.src.sge(DATA, len as u32));
        if imm {
            wr.opcode = WrOpcode::SendWithImm;
            wr.imm_data = seq as u32;
        }
        self.rep.sends += 1;
        self.rep.bytes += len as u64;
        Ok(Expect::None)
    }

    /// RDMA WRITE (with immediate if `imm`) of fresh random bytes to a
    /// random range.
    fn write(&mut self, wr: &mut SendWr, imm: bool) -> Result<Expect> {
        use rand::Rng;
        let len = self.rng.random_range(0..=64 << 10usize);
        let off = self.rng.random_range(0..=DATA - len);
        let bytes: Vec<u8> = (0..len).map(|_| self.rng.random()).collect();
        self.src
            .write(off, &bytes)
            .map_err(|e| err(e.to_string()))?;
        self.shadow[off..off + len].copy_from_slice(&bytes);
        wr.opcode = if imm {
            WrOpcode::RdmaWriteWithImm
        } else {
            WrOpcode::RdmaWrite
        };
        self.write_imms += u64::from(imm);
        // READs still in flight may read these bytes, and a READ that is
        // retried re-reads memory: without the fence it could return this
        // WRITE's data. (IBA: a fenced WR waits for earlier READs and
        // atomics to complete.)
        wr.flags |= SendFlags::FENCE;
        wr.imm_data = self.seq as u32;
        wr.sg_list.push(self.src.sge(off, len as u32));
        wr.remote_addr = self.remote.addr + off as u64;
        wr.rkey = self.remote.rkey;
        self.rep.writes += 1;
        self.rep.bytes += len as u64;
        Ok(Expect::None)
    }

    /// RDMA READ of a random range into a free slot; the shadow says what
    /// must arrive.
    fn read(&mut self, wr: &mut SendWr) -> Expect {
        use rand::Rng;
        let len = self.rng.random_range(0..=MAX_SEND);
        let off = self.rng.random_range(0..=DATA - len);
        let slot = self.free_slots.pop().expect("checked");
        wr.opcode = WrOpcode::RdmaRead;
        wr.sg_list.push(self.slots.sge(slot * MAX_SEND, len as u32));
        wr.remote_addr = self.remote.addr + off as u64;
        wr.rkey = self.remote.rkey;
        self.rep.reads += 1;
        self.rep.bytes += len as u64;
        Expect::Read {
            slot,
            data: self.shadow[off..off + len].to_vec(),
        }
    }

    /// ATOMIC WRITE of a random value to a random word.
    fn atomic_write(&mut self) -> SendWr {
        use rand::Rng;
        let at = DATA + 8 * self.rng.random_range(0..WORDS);
        let bytes: [u8; 8] = self.rng.random();
        self.shadow[at..at + 8].copy_from_slice(&bytes);
        self.rep.ext_ops += 1;
        SendWr::atomic_write(
            self.seq,
            self.remote.addr + at as u64,
            self.remote.rkey,
            bytes,
        )
    }

    /// FLUSH of a random range (or, one time in four, the whole region)
    /// for global visibility.
    fn flush(&mut self) -> SendWr {
        use rand::Rng;
        let len = self.rng.random_range(0..=64 << 10usize);
        let off = self.rng.random_range(0..=DATA - len);
        let level = if self.rng.random_range(0..4) == 0 {
            uroce_wire::feth::FLUSH_MR
        } else {
            uroce_wire::feth::FLUSH_RANGE
        };
        self.rep.ext_ops += 1;
        SendWr::flush(
            self.seq,
            self.remote.addr + off as u64,
            self.remote.rkey,
            len as u32,
            uroce_wire::feth::FLUSH_GLOBAL,
            level,
        )
    }

    /// Fetch-add (`add`) or compare-swap (comparing with the right value
    /// half the time) on a random word, its original value into a free
    /// slot.
    fn atomic(&mut self, wr: &mut SendWr, add: bool) -> Expect {
        use rand::Rng;
        let word = self.rng.random_range(0..WORDS);
        let at = DATA + 8 * word;
        let orig = u64::from_ne_bytes(self.shadow[at..at + 8].try_into().expect("8"));
        let slot = self.free_slots.pop().expect("checked");
        let new = if add {
            let add: u64 = self.rng.random_range(1..1000);
            wr.opcode = WrOpcode::AtomicFetchAndAdd;
            wr.compare_add = add;
            orig.wrapping_add(add)
        } else {
            let swap: u64 = self.rng.random();
            wr.opcode = WrOpcode::AtomicCmpAndSwp;
            wr.compare_add = if self.rng.random_bool(0.5) {
                orig
            } else {
                orig ^ 1
            };
            wr.swap = swap;
            if wr.compare_add == orig {
                swap
            } else {
                orig
            }
        };
        self.shadow[at..at + 8].copy_from_slice(&new.to_ne_bytes());
        wr.sg_list.push(self.slots.sge(slot * MAX_SEND, 8));
        wr.remote_addr = self.remote.addr + at as u64;
        wr.rkey = self.remote.rkey;
        self.rep.atomics += 1;
        Expect::Atomic { slot, orig }
    }

    /// Reads the server's whole region into `whole` and compares it with
    /// the shadow.
    fn compare_region(&mut self, whole: &MemoryRegion) -> Result<()> {
        let mut wr = SendWr::new(u64::MAX - 1, WrOpcode::RdmaRead);
        wr.flags = SendFlags::SIGNALED;
        wr.sg_list.push(whole.sge(0, (DATA + 8 * WORDS) as u32));
        wr.remote_addr = self.remote.addr;
        wr.rkey = self.remote.rkey;
        self.s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        let wc = self.s.cq.wait(1, TIMEOUT);
        if wc.first().map(|w| w.status) != Some(WcStatus::Success) {
            return Err(failed(&self.s.qp, format!("final READ: {wc:?}")));
        }
        let got = whole
            .to_vec(0, DATA + 8 * WORDS)
            .map_err(|e| err(e.to_string()))?;
        if got != self.shadow {
            let first = got
                .iter()
                .zip(&self.shadow)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            eprintln!(
                "rc-stress: the server region differs from the expected one from byte {first}"
            );
            self.rep.errors += 1;
        }
        Ok(())
    }

    /// The end marker, then the server's verdict on the exchange `rd`:
    /// the report with the server's counts compared and its errors added.
    fn finish(self, rd: &mut BufReader<TcpStream>) -> Result<StressReport> {
        self.src
            .write(DATA, &END_MARK.to_le_bytes())
            .map_err(|e| err(e.to_string()))?;
        let mut wr = SendWr::new(u64::MAX, WrOpcode::Send);
        wr.flags = SendFlags::SIGNALED;
        wr.sg_list.push(self.src.sge(DATA, 8));
        self.s.qp.post_send(&[wr]).map_err(|e| e.1)?;
        let wc = self.s.cq.wait(1, TIMEOUT);
        if wc.first().map(|w| w.status) != Some(WcStatus::Success) {
            return Err(failed(&self.s.qp, format!("end marker: {wc:?}")));
        }
        let v = line(rd)?;
        let (srv_sends, srv_writes_imm, srv_errors) = (
            v.first().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
            v.get(1).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0),
            v.get(2).and_then(|x| x.parse::<u64>().ok()).unwrap_or(1),
        );
        let mut rep = self.rep;
        if srv_sends != rep.sends || srv_writes_imm != self.write_imms {
            eprintln!(
                "rc-stress: the server received {srv_sends} sends and {srv_writes_imm} writes with immediate, \
                 the client sent {} and {}",
                rep.sends, self.write_imms
            );
            rep.errors += 1;
        }
        rep.errors += srv_errors;
        Ok(rep)
    }
}
