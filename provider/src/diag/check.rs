//! The verbs checker (`UROCE_CHECK`): application mistakes reported as
//! they happen, each with the call that made it and the rule it breaks.
//!
//! A NIC stays silent about a send buffer reused before its completion or
//! a region deregistered under a WR in flight: the program works until the
//! day it does not. uroce sees every WR and byte in the program's own
//! process, so it can say so at once. `UROCE_CHECK=1` (or `all`) turns on
//! every category; `UROCE_CHECK=buffer,queue` some of them:
//!
//! | category   | reports |
//! | ---------- | ------- |
//! | `buffer`   | a SEND/WRITE source buffer changed after `ibv_post_send`: before it was sent (compared at the engine's first copy for the wire), or after it and before the completion; a receive buffer or READ target written by the application before the engine places data into it |
//! | `lifetime` | a region deregistered, or a QP destroyed, with send WRs outstanding on it; a receive WR completing after its region was deregistered; an address handle used after it was destroyed |
//! | `queue`    | a send queue overrun by WRs no polled completion covers (what fails with ENOMEM on a NIC that frees unsignaled WRs only then); a CQ smaller than the completions its QPs' posted WRs owe it |
//! | `event`    | a CQ destroyed with completion events not acknowledged; a CQ whose event was taken and that was not polled afterwards (at its next event, or its destroy, with completions waiting) |
//! | `post`     | an L_Key that names no region, a region of another PD, too small or without the right; inline data beyond `max_inline_data`; posting to a QP that went to ERR before any of its error completions was polled |
//!
//! Each report goes to stderr as one block (the category, what happened,
//! the rule with its source, and the application's call as a symbolised
//! backtrace: `std::backtrace::Backtrace`, which names the C program's
//! own functions and lines too when it is built with `-g`), and is
//! counted ([`reports`]). Off, a hook costs one relaxed load of [`on`]'s
//! flag word; the per-QP ledger ([`QpLedger`]) exists only for QPs created
//! while the checker is on.

use crate::cq::CqInner;
use crate::memory::{KeyTable, PdId};
use crate::observe::{self, Event, QpCall, Topic};
use crate::qp_attr::QpCap;
use crate::types::{Access, QpState, SendFlags, SendWr, Sge, Wc, WrOpcode};
use parking_lot::Mutex;
use std::backtrace::Backtrace;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Once, Weak};

/// The environment variable that turns the checker on: `1` or `all` for
/// every category, or a comma-separated list of category names.
pub const CHECK_ENV: &str = "UROCE_CHECK";

value_enum! {
    /// What the checker looks for (see the module docs' table).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Category: u32 {
        /// Source buffers changed before the completion.
        Buffer = 1 => "buffer",
        /// Objects gone while work uses them.
        Lifetime = 2 => "lifetime",
        /// Queue sizing: send queue overruns, CQs too small.
        Queue = 4 => "queue",
        /// Completion events.
        Event = 8 => "event",
        /// The rules each WR must pass.
        Post = 16 => "post",
    }
    /// Every category.
    pub ALL: all;
    /// The name `UROCE_CHECK` takes.
    pub name: names;
}

static FROM_ENV: Once = Once::new();
static REPORTS: AtomicU64 = AtomicU64::new(0);
/// Reports printed in full; later ones are only counted.
const PRINTED: u64 = 100;

/// The categories a `UROCE_CHECK` value names, as a mask; the unknown
/// name otherwise. Empty and `0` are off.
pub fn parse(v: &str) -> Result<u32, String> {
    let mut mask = 0;
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        mask |= match name {
            "0" => 0,
            "1" | "all" => Category::ALL.iter().fold(0, |m, c| m | *c as u32),
            _ => match Category::ALL.iter().find(|c| c.name() == name) {
                Some(c) => *c as u32,
                None => return Err(name.to_string()),
            },
        };
    }
    Ok(mask)
}

/// Reads `UROCE_CHECK` (once per process; opening a device does it).
pub fn init_from_env() {
    FROM_ENV.call_once(|| {
        let Ok(v) = std::env::var(CHECK_ENV) else {
            return;
        };
        match parse(&v) {
            Ok(mask) => enable(mask),
            Err(bad) => {
                let names: Vec<_> = Category::ALL.iter().map(|c| c.name()).collect();
                eprintln!(
                    "uroce check: {CHECK_ENV}: unknown category {bad:?} (known: 1, all, {})",
                    names.join(", ")
                );
            }
        }
    });
}

/// Turns categories on (a mask of [`Category`] values) from now on, as
/// `UROCE_CHECK` does; QPs created before keep no ledger.
pub fn enable(mask: u32) {
    observe::want(Topic::from_bits_truncate(mask) & Topic::CHECK);
}

/// True when category `c` is checked: one relaxed load.
#[inline]
pub fn on(c: Category) -> bool {
    observe::wants(Topic::from_bits_retain(c as u32))
}

/// True when any category is checked.
#[inline]
pub fn any() -> bool {
    observe::wants(Topic::CHECK)
}

/// Reports made so far in this process.
pub fn reports() -> u64 {
    REPORTS.load(Ordering::Relaxed)
}

/// The application's call a report points at: a backtrace captured in
/// it, symbolised only when printed.
pub struct Caller(Backtrace);

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Caller")
    }
}

impl Caller {
    /// The call in progress.
    pub fn here() -> Caller {
        Caller(Backtrace::force_capture())
    }
    /// The frames of the application's call: those of the library (the
    /// backtrace machinery, uroce, std) are left out, and the listing
    /// stops at `main`, at the runtime under it, or after a dozen frames.
    pub fn frames(&self) -> Vec<String> {
        let text = self.0.to_string();
        let mut frames: Vec<Vec<&str>> = Vec::new();
        for line in text.lines() {
            let head = line.trim_start();
            let is_head = head
                .split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            if is_head {
                frames.push(vec![head.split_once(": ").map_or(head, |(_, f)| f)]);
            } else if let Some(f) = frames.last_mut() {
                f.push(head);
            }
        }
        let start = frames.iter().position(|f| !internal(f[0])).unwrap_or(0);
        let mut out = Vec::new();
        for f in frames.iter().skip(start).take(12) {
            let name = f[0];
            // The runtime under the program's code (a Rust program's
            // `lang_start`, a test harness) is left out too.
            if !out.is_empty() && (internal(name) || name.starts_with("__libc_start")) {
                break;
            }
            out.push(f.join("\n      "));
            if name == "main" || name.ends_with("::main") {
                break;
            }
        }
        out
    }
}

/// A frame of the library itself (or of Rust's runtime under it).
fn internal(name: &str) -> bool {
    let name = name.trim_start_matches('<');
    // A closure's or function pointer's shim (`<fn() -> .. as FnOnce>`).
    if name.starts_with("fn(") {
        return true;
    }
    [
        "std::",
        "core::",
        "alloc::",
        "uroce_",
        "__rust",
        "rust_",
        "test::",
        "backtrace::",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || name.starts_with("<unknown>")
}

/// Reports one mistake: `what` happened, breaking `rule`; `at` is the
/// application's call (or where the mistake shows, for a report made at
/// the completion).
pub fn report(cat: Category, what: &str, rule: &str, at: &[(&str, &Caller)]) {
    let n = REPORTS.fetch_add(1, Ordering::Relaxed) + 1;
    if n > PRINTED {
        if n == PRINTED + 1 {
            eprintln!(
                "uroce check: more than {PRINTED} reports: the rest are counted, not printed"
            );
        }
        return;
    }
    let mut s = format!("uroce check [{}]: {what}\n  rule: {rule}\n", cat.name());
    for (label, caller) in at {
        s.push_str(&format!("  {label}:\n"));
        for f in caller.frames() {
            s.push_str(&format!("    {f}\n"));
        }
    }
    eprint!("{s}");
}

/// The opcodes whose SG list the peer reads: what must not change until
/// the completion.
fn reads_sources(op: WrOpcode) -> bool {
    matches!(
        op,
        WrOpcode::Send
            | WrOpcode::SendWithImm
            | WrOpcode::SendWithInv
            | WrOpcode::RdmaWrite
            | WrOpcode::RdmaWriteWithImm
    )
}

const REUSE_RULE: &str = "ibv_post_send(3): \"The buffers used by a WR can only be safely \
reused after WR the request is fully executed and a work completion has been retrieved from \
the corresponding completion queue (CQ).\" A NIC may read the buffer at any time until then \
(and again to retransmit)";

const RECV_RULE: &str = "ibv_post_recv(3): \"The buffers used by a WR can only be safely \
reused after WR the request is fully executed and a work completion has been retrieved from \
the corresponding completion queue (CQ).\" Until then the NIC may write the message into them \
at any time";

/// A send WR posted and not yet retired, as the ledger keeps it.
struct Posted {
    wr_id: u64,
    signaled: bool,
    opcode: WrOpcode,
    /// Each source SGE of a SEND/WRITE with the checksum of its bytes at
    /// post time (at its first transmission, once sent); each local target
    /// of a READ until its first response is placed.
    sums: Vec<Watched>,
    /// A SEND/WRITE whose first packet went out.
    sent: bool,
    /// A READ whose first response was placed.
    placed: bool,
    lkeys: Vec<u32>,
    caller: Option<Caller>,
}

/// A receive WR posted and not yet polled.
struct PostedRecv {
    wr_id: u64,
    lkeys: Vec<u32>,
    /// Its buffers with their checksums at post (`buffer`), until the
    /// engine takes the WR for a message.
    sums: Vec<Watched>,
    /// The engine took it for a message.
    taken: bool,
    /// Where the program had written into it then (the message offset,
    /// and the SGE): reported at its completion if the message covers
    /// it (the NIC overwrote what the program wrote).
    written: Option<(u64, Sge)>,
    caller: Option<Caller>,
    /// Where a region it uses was deregistered (reported if a message
    /// then completes into it: a QP destroyed first makes it harmless).
    deregistered: Option<(u32, Arc<Caller>)>,
}

/// A send WR retired by the transport whose completion (its own, or a
/// later one's) the application has not polled yet.
struct Unreaped {
    wr_id: u64,
    /// Its completion is generated even when it succeeds.
    signaled: bool,
}

#[derive(Default)]
struct LedgerState {
    pending: VecDeque<Posted>,
    unreaped: VecDeque<Unreaped>,
    /// An overrun was reported; reset once the queue drains below.
    overrun_reported: bool,
    /// The application moved the QP to ERR itself.
    app_set_err: bool,
    /// The application polled an error completion of the QP.
    saw_error: bool,
    err_post_reported: bool,
    /// Signaled send WRs and receive WRs posted whose completions the
    /// application has not polled: what the QP owes its CQs.
    send_owed: i64,
    recv_owed: i64,
    /// Receive WRs posted to the QP's own receive queue whose completions
    /// the application has not polled (they complete in order).
    recvs: VecDeque<PostedRecv>,
}

/// What the checker counts of a CQ: the completions the WRs posted to its
/// QPs owe it (signaled send WRs and receive WRs whose completions are not
/// polled yet, those waiting in the CQ included).
#[derive(Debug, Default)]
pub struct CqLedger {
    owed: AtomicI64,
    reported: AtomicBool,
}

/// A QP's side of one of its CQs (see [`CqLedger`]).
#[derive(Debug)]
pub struct CqOwing {
    cq: Arc<CqInner>,
    ledger: Arc<CqLedger>,
}

impl CqOwing {
    /// The QP's completions go to `cq`, counted in `ledger`.
    pub fn new(cq: Arc<CqInner>, ledger: Arc<CqLedger>) -> CqOwing {
        CqOwing { cq, ledger }
    }

    /// WR `wr_id` posted to QP `qpn` will complete into the CQ: reported
    /// (once per CQ) when that makes more completions than the CQ holds.
    fn owe(&self, qpn: u32, wr_id: u64, kind: &str) {
        let owed = self.ledger.owed.fetch_add(1, Ordering::Relaxed) + 1;
        let depth = self.cq.depth() as i64;
        if owed <= depth
            || !on(Category::Queue)
            || self.ledger.reported.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let what = format!(
            "{kind} WR wr_id {wr_id} posted to QP {qpn:#x} makes {owed} completions that CQ {} \
             will hold before the application polls them (signaled send WRs and receive WRs \
             posted to its QPs, completions waiting included), but it holds {depth}: once they \
             complete the CQ overruns, and the CQ and its QPs go to error \
             (IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL)",
            self.cq.handle()
        );
        report(
            Category::Queue,
            &what,
            "ibv_create_cq(3): cqe, the minimum number of entries the CQ must hold; IBA \
             11.4.2.1: a CQ overrun is an error of the CQ (CQ Error event) and of its QPs",
            &[("posted at", &Caller::here())],
        );
    }

    fn paid(&self, n: i64) {
        self.ledger.owed.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What the checker knows of one QP's send queue: the WRs posted and not
/// retired (with their sources' checksums and the posting call), and the
/// retired ones no polled completion covers yet.
pub struct QpLedger {
    qpn: u32,
    pd: PdId,
    keys: Arc<KeyTable>,
    max_send_wr: u32,
    max_inline: u32,
    sq_sig_all: bool,
    /// The send CQ's and the receive CQ's counts.
    cqs: [CqOwing; 2],
    state: Mutex<LedgerState>,
}

impl std::fmt::Debug for QpLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QpLedger({:#x})", self.qpn)
    }
}

type LedgerKey = (usize, u32);

/// Every live ledger by (key table, QPN): what a poll, a deregistration or
/// a destroy looks up.
fn ledgers() -> &'static Mutex<HashMap<LedgerKey, Weak<QpLedger>>> {
    static L: std::sync::OnceLock<Mutex<HashMap<LedgerKey, Weak<QpLedger>>>> =
        std::sync::OnceLock::new();
    L.get_or_init(Default::default)
}

fn key_of(keys: &Arc<KeyTable>, qpn: u32) -> LedgerKey {
    (Arc::as_ptr(keys) as usize, qpn)
}

/// Bytes per checksum of a watched receive buffer or READ target: where
/// the program wrote is known to this precision.
const BLOCK: usize = 64;

/// A buffer the checker watches: an SGE, the checksums of its bytes when
/// it was taken (at post, or at its first transmission), where it lies in
/// the message and in the host's memory, and the engine's write count
/// ([`nic_writes`]) then.
#[derive(Clone)]
struct Watched {
    sge: Sge,
    /// Its offset in the message (the SGEs before it).
    msg_off: u64,
    /// Bytes per checksum in `sums` (`usize::MAX`: one for the SGE).
    block: usize,
    sums: Vec<u64>,
    host: usize,
    since: u64,
}

impl Watched {
    /// The SGE's bytes now (`None` when they cannot be read: a bad key or
    /// range, which the post rules report).
    fn take(keys: &KeyTable, sge: &Sge, msg_off: u64, block: usize) -> Option<Watched> {
        let (sums, host) = checksums(keys, sge, block)?;
        Some(Watched {
            sge: *sge,
            msg_off,
            block,
            sums,
            host,
            since: nic_writes(),
        })
    }

    /// The same bytes taken again now (itself if they cannot be read).
    fn retaken(&self, keys: &KeyTable) -> Watched {
        Watched::take(keys, &self.sge, self.msg_off, self.block).unwrap_or_else(|| self.clone())
    }

    /// Where the bytes first changed (the offset in the SGE of the first
    /// changed block) that the engine did not write since they were
    /// taken: the application did it.
    fn changed_by_app(&self, keys: &KeyTable) -> Option<usize> {
        let (now, _) = checksums(keys, &self.sge, self.block)?;
        let len = self.sge.length as usize;
        self.sums
            .iter()
            .zip(&now)
            .enumerate()
            .filter(|(_, (then, now))| then != now)
            .map(|(i, _)| i.saturating_mul(self.block))
            .find(|&off| {
                let n = (len - off).min(self.block);
                !nic_wrote_since(self.since, self.host.wrapping_add(off), n)
            })
    }
}

/// The watched SGEs of `sgl`, a checksum per `block` bytes (those of
/// length 0 and unreadable ones left out).
fn watch(keys: &KeyTable, sgl: &[Sge], block: usize) -> Vec<Watched> {
    let mut off = 0u64;
    let mut out = Vec::new();
    for s in sgl.iter().filter(|s| s.length > 0) {
        out.extend(Watched::take(keys, s, off, block));
        off += u64::from(s.length);
    }
    out
}

/// Checksums of the `len` bytes at `addr` of the region `lkey` names, one
/// per `block` bytes, and their host address (`None` if they cannot be
/// read: the key or range is bad, which the post rules report).
fn checksums(keys: &KeyTable, sge: &Sge, block: usize) -> Option<(Vec<u64>, usize)> {
    let mr = keys.find_lkey(sge.lkey)?;
    let off = mr.offset_of(sge.addr, sge.length as u64).ok()?;
    let mut sums = Vec::new();
    let mut h = Sum::default();
    let mut buf = [0u8; 4096];
    let (mut done, mut in_block) = (0usize, 0usize);
    let len = sge.length as usize;
    while done < len {
        let n = (len - done).min(buf.len()).min(block - in_block);
        mr.read(off + done, &mut buf[..n]).ok()?;
        h.write(&buf[..n]);
        done += n;
        in_block += n;
        if in_block == block || done == len {
            sums.push(h.finish());
            h = Sum::default();
            in_block = 0;
        }
    }
    Some((sums, mr.host_addr(off)))
}

/// The checksum of watched bytes: a multiply-rotate mix of 8-byte words,
/// several times faster than SipHash (a receive WR's buffers are summed
/// at every post, which must not slow the program down so much that its
/// peer's messages find no receive WR). Not for an adversary: it tells
/// whether the program changed the bytes.
#[derive(Default)]
struct Sum {
    h: u64,
    len: u64,
    /// Bytes of a word not complete yet (a write may end mid-word).
    tail: [u8; 8],
    tail_len: usize,
}

impl Sum {
    fn mix(h: u64, w: u64) -> u64 {
        (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
    }
    fn write(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        while self.tail_len > 0 && !bytes.is_empty() {
            self.tail[self.tail_len] = bytes[0];
            self.tail_len += 1;
            bytes = &bytes[1..];
            if self.tail_len == 8 {
                self.h = Sum::mix(self.h, u64::from_le_bytes(self.tail));
                self.tail_len = 0;
            }
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let w: [u8; 8] = w.try_into().unwrap_or_default();
            self.h = Sum::mix(self.h, u64::from_le_bytes(w));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
        self.tail_len = rest.len();
    }
    fn finish(&self) -> u64 {
        let mut last = [0u8; 8];
        last[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        Sum::mix(Sum::mix(self.h, u64::from_le_bytes(last)), self.len)
    }
}

/// The engine's recent writes into registered memory (received messages,
/// RDMA WRITEs, READ responses, atomic results), by host address: a
/// watched buffer that changed where the engine wrote is not the
/// application's doing (a receive buffer shared by several receive WRs,
/// a SEND source that is also a receive buffer).
struct NicWrites {
    /// Writes made so far.
    count: u64,
    /// The newest writes, oldest first: `[start, end)` and the count when
    /// it was last written. Adjacent writes (the packets of one message)
    /// share an entry.
    recent: VecDeque<(usize, usize, u64)>,
    /// The newest count that fell off `recent`.
    forgotten: u64,
}

/// Entries [`NicWrites`] keeps.
const NIC_WRITES_KEPT: usize = 4096;

fn nic_log() -> &'static Mutex<NicWrites> {
    static L: std::sync::OnceLock<Mutex<NicWrites>> = std::sync::OnceLock::new();
    L.get_or_init(|| {
        Mutex::new(NicWrites {
            count: 0,
            recent: VecDeque::new(),
            forgotten: 0,
        })
    })
}

/// The engine's writes so far.
fn nic_writes() -> u64 {
    nic_log().lock().count
}

/// The engine wrote `len` bytes at `offset` of region `mr` (with the
/// `buffer` category on; a relaxed load otherwise).
#[inline]
pub fn nic_wrote(mr: &crate::memory::MrInner, offset: usize, len: usize) {
    if on(Category::Buffer) && len > 0 {
        note_nic_write(mr.host_addr(offset), len);
    }
}

fn note_nic_write(start: usize, len: usize) {
    let end = start.saturating_add(len);
    let mut log = nic_log().lock();
    log.count += 1;
    let count = log.count;
    if let Some(last) = log.recent.back_mut().filter(|l| l.1 == start) {
        last.1 = end;
        last.2 = count;
        return;
    }
    log.recent.push_back((start, end, count));
    if log.recent.len() > NIC_WRITES_KEPT {
        if let Some((_, _, c)) = log.recent.pop_front() {
            log.forgotten = c;
        }
    }
}

/// Whether the engine may have written into `[start, start+len)` after
/// its write count was `since` (true when that is too long ago to tell).
fn nic_wrote_since(since: u64, start: usize, len: usize) -> bool {
    let end = start.saturating_add(len);
    let log = nic_log().lock();
    if log.forgotten > since {
        return true;
    }
    log.recent
        .iter()
        .rev()
        .take_while(|w| w.2 > since)
        .any(|w| w.0 < end && start < w.1)
}

impl QpLedger {
    /// A ledger for QP `qpn` of PD `pd`, registered for lookups while it
    /// lives (`None` when the checker is off).
    pub fn new(
        keys: &Arc<KeyTable>,
        qpn: u32,
        pd: PdId,
        cap: &QpCap,
        sq_sig_all: bool,
        cqs: [CqOwing; 2],
    ) -> Option<Arc<QpLedger>> {
        if !any() {
            return None;
        }
        let l = Arc::new(QpLedger {
            qpn,
            pd,
            keys: keys.clone(),
            max_send_wr: cap.max_send_wr.max(1),
            max_inline: cap.max_inline_data,
            sq_sig_all,
            cqs,
            state: Mutex::default(),
        });
        ledgers()
            .lock()
            .insert(key_of(keys, qpn), Arc::downgrade(&l));
        Some(l)
    }

    /// Posts `wr` through `push` (the send queue's own post), keeping its
    /// record when `push` takes it; reports an overrun first.
    pub fn post<E>(&self, wr: SendWr, push: impl FnOnce(SendWr) -> Result<(), E>) -> Result<(), E> {
        let inline = wr.flags.contains(SendFlags::INLINE);
        let watched = reads_sources(wr.opcode) || wr.opcode == WrOpcode::RdmaRead;
        let sums = if on(Category::Buffer) && !inline && watched {
            // A READ's target: where the program wrote matters.
            let block = if reads_sources(wr.opcode) {
                usize::MAX
            } else {
                BLOCK
            };
            watch(&self.keys, &wr.sg_list, block)
        } else {
            Vec::new()
        };
        let lkeys = if inline {
            Vec::new()
        } else {
            wr.sg_list
                .iter()
                .filter(|s| s.length > 0)
                .map(|s| s.lkey)
                .collect()
        };
        let caller = (on(Category::Buffer) || on(Category::Lifetime)).then(Caller::here);
        let (wr_id, opcode) = (wr.wr_id, wr.opcode);
        let signaled = self.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        let mut st = self.state.lock();
        let queued = st.pending.len() + st.unreaped.len();
        if on(Category::Queue) && queued >= self.max_send_wr as usize && !st.overrun_reported {
            st.overrun_reported = true;
            self.report_overrun(&st, wr_id);
        }
        push(wr)?;
        if signaled {
            st.send_owed += 1;
            self.cqs[0].owe(self.qpn, wr_id, "send");
        }
        st.pending.push_back(Posted {
            wr_id,
            signaled,
            opcode,
            sums,
            sent: false,
            placed: false,
            lkeys,
            caller,
        });
        Ok(())
    }

    fn report_overrun(&self, st: &LedgerState, wr_id: u64) {
        let n = st.pending.len() + st.unreaped.len();
        let what = format!(
            "ibv_post_send on QP {:#x}: WR wr_id {wr_id} makes {} send WRs that no polled \
             completion covers yet, beyond max_send_wr {} ({} of them already executed): a NIC \
             frees an unsignaled WR's slot only when a completion of a later WR of the QP is \
             polled, so there this post fails with ENOMEM. Signal a WR at least every \
             max_send_wr posts and poll its completion",
            self.qpn,
            n + 1,
            self.max_send_wr,
            st.unreaped.len()
        );
        report(
            Category::Queue,
            &what,
            "ibv_create_qp(3) cap.max_send_wr, the most outstanding WRs of the send queue; \
             ibv_post_send(3) sq_sig_all/IBV_SEND_SIGNALED: an unsignaled WR is outstanding \
             until a later signaled WR's completion is retrieved (mlx5 and other NICs free send \
             queue slots only then)",
            &[("posted at", &Caller::here())],
        );
    }

    /// The transport retired `n` WRs (completed, flushed or discarded):
    /// their sources are compared with their checksums at post.
    pub fn retire(&self, n: u32) {
        let mut st = self.state.lock();
        for _ in 0..n {
            let Some(p) = st.pending.pop_front() else {
                break;
            };
            self.verify(&p);
            st.unreaped.push_back(Unreaped {
                wr_id: p.wr_id,
                signaled: p.signaled,
            });
            // Only what an overrun needs is kept.
            if st.unreaped.len() > self.max_send_wr as usize {
                st.unreaped.pop_front();
            }
        }
    }

    /// At the completion: the sources of a SEND/WRITE compared with their
    /// checksums at post, or at the first transmission once it was sent.
    fn verify(&self, p: &Posted) {
        if !reads_sources(p.opcode) {
            return;
        }
        let when = if p.sent {
            "changed after it was sent (between its first transmission and its completion): a \
             retransmission may carry other bytes than the first transmission, so the peer \
             may have received either contents, or a mix"
        } else {
            "changed between ibv_post_send and the WR's completion: the peer may have \
             received either contents, or a mix"
        };
        self.report_changed_sources(p, when);
    }

    /// Reports each watched SGE of `p` the application changed, `when`
    /// saying between which moments and what it did.
    fn report_changed_sources(&self, p: &Posted, when: &str) {
        for w in p
            .sums
            .iter()
            .filter(|w| w.changed_by_app(&self.keys).is_some())
        {
            let what = format!(
                "the source buffer of {} WR wr_id {} on QP {:#x} ({} bytes at {:#x}, lkey \
                 {:#x}) {when}",
                p.opcode.name(),
                p.wr_id,
                self.qpn,
                w.sge.length,
                w.sge.addr,
                w.sge.lkey
            );
            let at: Vec<(&str, &Caller)> = p.caller.iter().map(|c| ("posted at", c)).collect();
            report(Category::Buffer, &what, REUSE_RULE, &at);
        }
    }

    /// The engine copies the first packet of SEND/WRITE WR `wr_id` out of
    /// its sources for the wire: a source changed since the post is
    /// reported now (the peer gets the new bytes, or a mix), and the
    /// completion compares with what is sent.
    pub fn sending(&self, wr_id: u64) {
        self.first_time(
            wr_id,
            reads_sources,
            |p| &mut p.sent,
            |p| {
                if p.sums.is_empty() {
                    return;
                }
                self.report_changed_sources(
                p,
                "changed after ibv_post_send and before it was sent (the engine's first copy of \
                 it for the wire): the peer received the new bytes, or a mix of old and new",
            );
                for w in &mut p.sums {
                    *w = w.retaken(&self.keys);
                }
            },
        );
    }

    /// With the `buffer` category on: the pending WR `wr_id` whose opcode
    /// `is` picks and whose `flag` is still clear gets the flag set and is
    /// handed to `then` (under the lock); nothing when there is none.
    fn first_time(
        &self,
        wr_id: u64,
        is: impl Fn(WrOpcode) -> bool,
        flag: impl Fn(&mut Posted) -> &mut bool,
        then: impl FnOnce(&mut Posted),
    ) {
        if !on(Category::Buffer) {
            return;
        }
        let mut st = self.state.lock();
        for p in st.pending.iter_mut() {
            if is(p.opcode) && p.wr_id == wr_id && !*flag(p) {
                *flag(p) = true;
                then(p);
                return;
            }
        }
    }

    /// The engine is about to place the first response of RDMA READ WR
    /// `wr_id` into its local buffers: a buffer the application wrote
    /// since the post is reported (the response overwrites it).
    pub fn read_placing(&self, wr_id: u64) {
        let is_read = |op| op == WrOpcode::RdmaRead;
        self.first_time(
            wr_id,
            is_read,
            |p| &mut p.placed,
            |p| {
                let sums = std::mem::take(&mut p.sums);
                for w in &sums {
                    let Some(at) = w.changed_by_app(&self.keys) else {
                        continue;
                    };
                    let what = format!(
                    "the application wrote into the local buffer of RDMA READ WR wr_id {wr_id} on \
                     QP {:#x} ({} bytes at {:#x}, lkey {:#x}; first at byte {} of the READ) \
                     between ibv_post_send and the arrival of the READ's response, which \
                     overwrites it: that memory was the NIC's until the READ's completion",
                    self.qpn,
                    w.sge.length,
                    w.sge.addr,
                    w.sge.lkey,
                    w.msg_off + at as u64
                );
                    let at: Vec<(&str, &Caller)> =
                        p.caller.iter().map(|c| ("posted at", c)).collect();
                    report(Category::Buffer, &what, REUSE_RULE, &at);
                }
            },
        );
    }

    /// The engine took receive WR `wr_id` of the QP's own receive queue
    /// for a message, and places the message into its buffers next when
    /// `places` (a WRITE with immediate writes none): where the program
    /// wrote into them since the post is kept, and reported at the WR's
    /// completion if the message covers it (see `polled`).
    pub fn recv_taken(&self, wr_id: u64, places: bool) {
        if !on(Category::Buffer) {
            return;
        }
        let mut st = self.state.lock();
        let Some(r) = st.recvs.iter_mut().find(|r| !r.taken) else {
            return;
        };
        r.taken = true;
        let sums = std::mem::take(&mut r.sums);
        if r.wr_id != wr_id || !places {
            // Not the WR the ledger expects (no verdict), or nothing placed.
            return;
        }
        r.written = sums.iter().find_map(|w| {
            let at = w.changed_by_app(&self.keys)?;
            Some((w.msg_off + at as u64, w.sge))
        });
    }

    /// Receive WR `wc.wr_id`'s message overwrote bytes the program had
    /// written into its buffer (`sge`) after posting it, the first at
    /// message offset `off`.
    fn report_recv_overwritten(&self, wc: &Wc, off: u64, sge: &Sge, at: Option<&Caller>) {
        let what = format!(
            "the application wrote into the buffer of receive WR wr_id {} on QP {:#x} ({} bytes \
             at {:#x}, lkey {:#x}; first at byte {off} of the message) between ibv_post_recv \
             and the arrival of the message, which overwrote what it wrote ({} bytes \
             received): that memory was the NIC's until the WR's completion",
            wc.wr_id, self.qpn, sge.length, sge.addr, sge.lkey, wc.byte_len
        );
        let at: Vec<(&str, &Caller)> = at.iter().map(|c| ("posted at", *c)).collect();
        report(Category::Buffer, &what, RECV_RULE, &at);
    }

    /// Receive WR `wr_id` was posted to the QP's own receive queue.
    /// Posts receive WR `wr` through `push` (the receive queue's own
    /// post), keeping its record when `push` takes it (the record is in
    /// place before the WR can complete).
    pub fn post_recv<E>(
        &self,
        wr: crate::types::RecvWr,
        push: impl FnOnce(crate::types::RecvWr) -> Result<(), E>,
    ) -> Result<(), E> {
        let lkeys = wr
            .sg_list
            .iter()
            .filter(|s| s.length > 0)
            .map(|s| s.lkey)
            .collect();
        let wr_id = wr.wr_id;
        let (sums, caller) = if on(Category::Buffer) {
            (watch(&self.keys, &wr.sg_list, BLOCK), Some(Caller::here()))
        } else {
            (Vec::new(), None)
        };
        let mut st = self.state.lock();
        push(wr)?;
        st.recv_owed += 1;
        st.recvs.push_back(PostedRecv {
            wr_id,
            lkeys,
            sums,
            taken: false,
            written: None,
            caller,
            deregistered: None,
        });
        drop(st);
        self.cqs[1].owe(self.qpn, wr_id, "receive");
        Ok(())
    }

    /// The QP went to RESET: its WRs and completions are gone.
    pub fn reset(&self) {
        let mut st = self.state.lock();
        self.forget_owed(&mut st);
        st.pending.clear();
        st.unreaped.clear();
        st.recvs.clear();
        st.overrun_reported = false;
        st.app_set_err = false;
        st.saw_error = false;
        st.err_post_reported = false;
    }

    fn forget_owed(&self, st: &mut LedgerState) {
        self.cqs[0].paid(std::mem::take(&mut st.send_owed));
        self.cqs[1].paid(std::mem::take(&mut st.recv_owed));
    }

    /// The application polled `wc`, a completion of this QP.
    fn polled(&self, wc: &Wc) {
        let mut st = self.state.lock();
        if wc.status != crate::types::WcStatus::Success {
            st.saw_error = true;
        }
        // An unsignaled WR's error completion was not counted.
        let send = (wc.opcode as u32) < 128;
        let owed = if send {
            &mut st.send_owed
        } else {
            &mut st.recv_owed
        };
        if *owed > 0 {
            *owed -= 1;
            self.cqs[usize::from(!send)].paid(1);
        }
        if !send {
            let r = st.recvs.pop_front();
            let flushed = wc.status == crate::types::WcStatus::WrFlushErr;
            let ok = wc.status == crate::types::WcStatus::Success;
            if let Some(r) = r {
                match (r.written, r.deregistered) {
                    (Some((off, sge)), _) if ok && off < u64::from(wc.byte_len) => {
                        self.report_recv_overwritten(wc, off, &sge, r.caller.as_ref());
                    }
                    (_, Some((lkey, at))) if !flushed => {
                        self.report_recv_into_deregistered(wc, lkey, &at);
                    }
                    _ => {}
                }
            }
        }
        if send {
            // A send completion covers its WR and every earlier one: a
            // successful one is the first signaled WR's, an error one the
            // first WR of its wr_id's (wr_ids need not be unique).
            let ok = wc.status == crate::types::WcStatus::Success;
            let its = |u: &Unreaped| if ok { u.signaled } else { u.wr_id == wc.wr_id };
            let covered = st.unreaped.iter().position(its).map_or(1, |i| i + 1);
            let covered = covered.min(st.unreaped.len());
            st.unreaped.drain(..covered);
            if st.pending.len() + st.unreaped.len() < self.max_send_wr as usize {
                st.overrun_reported = false;
            }
        }
    }

    fn report_recv_into_deregistered(&self, wc: &Wc, lkey: u32, at: &Caller) {
        let what = format!(
            "receive WR wr_id {} on QP {:#x} completed ({}) after the region with lkey \
             {lkey:#x} it names was deregistered (ibv_dereg_mr while the WR was posted): a \
             NIC completes it with IBV_WC_LOC_PROT_ERR and moves the QP to ERR",
            wc.wr_id, self.qpn, wc.status
        );
        report(
            Category::Lifetime,
            &what,
            "ibv_post_recv(3): the buffers of a receive WR are the device's until its \
             completion is retrieved; IBA 10.6.3: an L_Key stops being valid at \
             deregistration. Deregister after the completion, or after destroying (or \
             resetting) the QP",
            &[("deregistered at", at)],
        );
    }

    /// The application moved the QP to ERR itself.
    pub fn set_err_by_app(&self) {
        self.state.lock().app_set_err = true;
    }

    /// A post to the QP in ERR: reported once, if the QP went there on its
    /// own and the application has polled none of its error completions.
    pub fn post_in_err(&self) {
        let mut st = self.state.lock();
        if st.app_set_err || st.saw_error || st.err_post_reported {
            return;
        }
        st.err_post_reported = true;
        let what = format!(
            "a WR posted to QP {:#x}, which is in the ERR state (it went there after an error \
             completion the application has not polled): the WR only completes with \
             IBV_WC_WR_FLUSH_ERR. Poll the CQ and look at the first completion whose status is \
             not IBV_WC_SUCCESS",
            self.qpn
        );
        report(
            Category::Post,
            &what,
            "ibv_poll_cq(3): a QP that fails moves to the error state; ibv_modify_qp(3)/IBA \
             10.3.1: in ERR, WRs posted are completed with flush errors",
            &[("posted at", &Caller::here())],
        );
    }

    /// The QP is being destroyed: send WRs still outstanding are reported.
    fn destroyed(&self) {
        let st = self.state.lock();
        let Some(first) = st.pending.front() else {
            return;
        };
        let what = format!(
            "QP {:#x} destroyed with {} send WR(s) outstanding (oldest: {} wr_id {}): they \
             never complete, and what they were doing on the wire is cut off",
            self.qpn,
            st.pending.len(),
            first.opcode.name(),
            first.wr_id
        );
        let here = Caller::here();
        let mut at = vec![("destroyed at", &here)];
        if let Some(c) = &first.caller {
            at.push(("the oldest WR posted at", c));
        }
        report(
            Category::Lifetime,
            &what,
            "ibv_post_send(3): a WR's buffers are the application's again only once its \
             completion is retrieved; ibv_destroy_qp discards outstanding WRs without \
             completions (rdma-core and the kernel alike), so that moment never comes: wait \
             for the completions, or move the QP to ERR and poll the flushes, first",
            &at,
        );
    }

    /// Inline data beyond the QP's max_inline_data (the post fails with
    /// EINVAL, as on a NIC).
    pub fn inline_too_long(&self, len: usize) {
        let what = format!(
            "ibv_post_send on QP {:#x}: {len} bytes of IBV_SEND_INLINE data exceed the QP's \
             max_inline_data ({}); the post fails with EINVAL",
            self.qpn, self.max_inline
        );
        report(
            Category::Post,
            &what,
            "ibv_create_qp(3): cap.max_inline_data, the most data that can be posted inline \
             to the send queue",
            &[("posted at", &Caller::here())],
        );
    }

    /// The rules of a send WR's SG list (not for inline data).
    pub fn check_send_wr(&self, wr: &SendWr) {
        if wr.flags.contains(SendFlags::INLINE) || wr.opcode.is_local() {
            return;
        }
        let response = wr.opcode == WrOpcode::RdmaRead || wr.opcode.is_atomic();
        let need = if response {
            Access::LOCAL_WRITE
        } else {
            Access::empty()
        };
        // A READ's or atomic's buffers receive the response: the request
        // goes anyway (as on rxe and NICs), a remote atomic executes, and
        // the response is not placed.
        let then = if response {
            "the request is sent anyway (a bad rkey's NAK, REM_ACCESS_ERR, comes first; else the \
             remote side executes it), then placing its response fails: the WR completes with \
             IBV_WC_LOC_PROT_ERR and the QP goes to ERR"
        } else {
            LOC_PROT_THEN
        };
        for s in wr.sg_list.iter().filter(|s| s.length > 0) {
            check_sge(
                &self.keys,
                self.pd,
                self.qpn,
                ("send", then),
                wr.wr_id,
                s,
                need,
            );
        }
    }
}

/// What a WR with a bad L_Key does (a SEND's, a WRITE's, a receive's).
const LOC_PROT_THEN: &str = "the WR completes with IBV_WC_LOC_PROT_ERR and the QP goes to ERR";

/// The L_Key rules of one SGE (IBA 10.6.3): reports a key that names no
/// region, a region of another PD, outside it, or without `need`; `what`:
/// the kind of WR, and what its bad key then does.
pub fn check_sge(
    keys: &KeyTable,
    pd: PdId,
    qpn: u32,
    (what, then): (&str, &str),
    wr_id: u64,
    sge: &Sge,
    need: Access,
) {
    let Err(e) = keys.check_lkey(sge.lkey, pd, sge.addr, sge.length as u64, need) else {
        return;
    };
    let why = match keys.find_lkey(sge.lkey) {
        None => format!(
            "lkey {:#x} names no registered region (never registered, or deregistered)",
            sge.lkey
        ),
        Some(mr) if mr.pd() != pd => format!(
            "lkey {:#x} is a region of another protection domain (the region's PD {}, the \
             QP's {pd})",
            sge.lkey,
            mr.pd()
        ),
        Some(mr) => format!(
            "{e} (the region: {:#x}..{:#x}, access {:?})",
            mr.iova(),
            mr.iova() + mr.len() as u64,
            mr.access()
        ),
    };
    let msg = format!(
        "{what} WR wr_id {wr_id} on QP {qpn:#x}, SGE {} bytes at {:#x}: {why}; {then}",
        sge.length, sge.addr
    );
    report(
        Category::Post,
        &msg,
        "ibv_post_send(3)/ibv_post_recv(3) sg_list: lkey is the local key of a memory region \
         registered in the QP's protection domain, and [addr, addr+length) lies inside it with \
         the rights the operation needs (IBA 10.6.3: L_Key checks)",
        &[("posted at", &Caller::here())],
    );
}

impl Drop for QpLedger {
    fn drop(&mut self) {
        let mut st = std::mem::take(&mut *self.state.lock());
        self.forget_owed(&mut st);
        let key = key_of(&self.keys, self.qpn);
        let mut l = ledgers().lock();
        if l.get(&key).is_some_and(|w| w.strong_count() == 0) {
            l.remove(&key);
        }
    }
}

/// The ledger of QP `qpn` on the device with key table `keys` (what a
/// poll finds by the completions' QPNs).
fn ledger(keys: &Arc<KeyTable>, qpn: u32) -> Option<Arc<QpLedger>> {
    ledgers().lock().get(&key_of(keys, qpn))?.upgrade()
}

/// What the device tells of the application's posts, polls, state
/// changes and deregistrations: the checker's rules of them, with the
/// QP's ledger (a call carries it: the record the QP's handle holds; the
/// tools' observer hands on each event of a category that is on).
pub fn device_event(e: &Event<'_>) {
    match *e {
        Event::QpCall { qp, call } => {
            let Some(l) = qp.downcast_ref::<QpLedger>() else {
                return;
            };
            match call {
                QpCall::PostSend(wr) => l.check_send_wr(wr),
                QpCall::PostInErr => l.post_in_err(),
                QpCall::InlineTooLong(len) => l.inline_too_long(len),
                QpCall::Modify(QpState::Err) => l.set_err_by_app(),
                QpCall::Modify(QpState::Reset) => l.reset(),
                QpCall::Modify(_) => {}
            }
        }
        Event::RecvPosting {
            keys,
            pd,
            owner,
            wr,
        } => {
            // The buffers are written: local write.
            for s in wr.sg_list.iter().filter(|s| s.length > 0) {
                let what = ("receive", LOC_PROT_THEN);
                check_sge(keys, pd, owner, what, wr.wr_id, s, Access::LOCAL_WRITE);
            }
        }
        Event::Polled { keys, wcs } => polled(keys, wcs),
        Event::Deregistering { keys, lkey } => deregistering(keys, lkey),
        _ => {}
    }
}

/// The application polled `wcs` from a CQ of the device with `keys`.
pub fn polled(keys: &Arc<KeyTable>, wcs: &[Wc]) {
    let mut last: Option<(u32, Arc<QpLedger>)> = None;
    for wc in wcs {
        let l = match &last {
            Some((q, l)) if *q == wc.qp_num => l.clone(),
            _ => match ledger(keys, wc.qp_num) {
                Some(l) => {
                    last = Some((wc.qp_num, l.clone()));
                    l
                }
                None => continue,
            },
        };
        l.polled(wc);
    }
}

/// The QP `qpn` is being destroyed.
pub fn qp_destroyed(l: &QpLedger) {
    if on(Category::Lifetime) {
        l.destroyed();
    }
    // Gone for lookups now (the engine may hold the send queue a while).
    let mut st = std::mem::take(&mut *l.state.lock());
    l.forget_owed(&mut st);
    let key = key_of(&l.keys, l.qpn);
    let mut all = ledgers().lock();
    if all.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), l)) {
        all.remove(&key);
    }
}

/// CQ `cq` is being destroyed with `unacked` completion events taken and
/// not acknowledged (uroce refuses the destroy with EBUSY).
pub fn cq_destroyed_unacked(cq: u32, unacked: u32) {
    let what = format!(
        "ibv_destroy_cq of CQ {cq} with {unacked} completion events from ibv_get_cq_event not \
         acknowledged: a kernel device's ibv_destroy_cq blocks here until they are (forever, \
         in a single-threaded program); uroce refuses with EBUSY"
    );
    report(
        Category::Event,
        &what,
        "ibv_get_cq_event(3): \"All completion events that ibv_get_cq_event() returns must be \
         acknowledged using ibv_ack_cq_events(). To avoid races, destroying a CQ will wait for \
         all completion events to be acknowledged\"",
        &[("destroyed at", &Caller::here())],
    );
}

/// CQ `cq` holds `waiting` completions the application has not polled
/// since it took the CQ's last completion event: it is being destroyed
/// (`at_destroy`), or the application took another event of it.
pub fn cq_not_polled(cq: u32, waiting: usize, at_destroy: bool) {
    let what = if at_destroy {
        format!(
            "ibv_destroy_cq of CQ {cq} with {waiting} completion(s) waiting that the program \
             never polled after taking the CQ's last completion event (ibv_get_cq_event): an \
             event says completions wait, and only polling the CQ empty takes them; a program \
             that waits for another event instead hangs, since those waiting make none"
        )
    } else {
        format!(
            "ibv_get_cq_event returned a second completion event of CQ {cq} while the program \
             has not polled the CQ since the previous one ({waiting} completion(s) waiting): \
             after an event, poll the CQ until it is empty; a completion that came before the \
             CQ was re-armed makes no event, so a program that waits for one instead of \
             polling hangs"
        )
    };
    report(
        Category::Event,
        &what,
        "ibv_get_cq_event(3), EXAMPLES: \"3. Wait for the completion event and ack it; 4. \
         Request for notification upon the next completion event; 5. Empty the CQ\"; \
         ibv_req_notify_cq(3): \"Upon the addition of a new CQ entry (CQE) to cq, a \
         completion event will be added\" (not for the CQEs already in it)",
        &[(
            if at_destroy {
                "destroyed at"
            } else {
                "event taken at"
            },
            &Caller::here(),
        )],
    );
}

/// The region with local key `lkey` is being deregistered: send WRs still
/// outstanding that use it are reported, receive WRs that use it marked
/// (see `PostedRecv`).
pub fn deregistering(keys: &Arc<KeyTable>, lkey: u32) {
    if !on(Category::Lifetime) {
        return;
    }
    let live: Vec<Arc<QpLedger>> = ledgers()
        .lock()
        .iter()
        .filter(|((k, _), _)| *k == Arc::as_ptr(keys) as usize)
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    let here = Arc::new(Caller::here());
    for l in live {
        let mut st = l.state.lock();
        // Receive WRs that use the region are reported only if a message
        // completes into one (a QP destroyed first never uses them).
        for r in st.recvs.iter_mut().filter(|r| r.lkeys.contains(&lkey)) {
            r.deregistered.get_or_insert_with(|| (lkey, here.clone()));
        }
        let users: Vec<&Posted> = st
            .pending
            .iter()
            .filter(|p| p.lkeys.contains(&lkey))
            .collect();
        let Some(first) = users.first() else {
            continue;
        };
        let what = format!(
            "ibv_dereg_mr of the region with lkey {lkey:#x} while {} send WR(s) outstanding on QP \
             {:#x} use it (oldest: {} wr_id {}): on a NIC they complete with \
             IBV_WC_LOC_PROT_ERR, or carry whatever the memory holds when it is read",
            users.len(),
            l.qpn,
            first.opcode.name(),
            first.wr_id
        );
        let mut at: Vec<(&str, &Caller)> = vec![("deregistered at", &here)];
        if let Some(c) = &first.caller {
            at.push(("the oldest WR posted at", c));
        }
        report(
            Category::Lifetime,
            &what,
            "ibv_post_send(3): the buffers of a WR may be reused (and so deregistered) only \
             after its completion has been retrieved; IBA 10.6.3: an L_Key stops being valid at \
             deregistration",
            &at,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_writes_are_told_from_the_applications() {
        // Addresses no test's memory has.
        let a = usize::MAX / 2;
        let since = nic_writes();
        assert!(!nic_wrote_since(since, a, 100), "nothing written yet");
        note_nic_write(a, 64);
        // The packets of one message share an entry.
        note_nic_write(a + 64, 64);
        assert!(
            nic_wrote_since(since, a + 100, 8),
            "inside the second write"
        );
        assert!(nic_wrote_since(since, a - 4, 8), "overlapping the first");
        assert!(!nic_wrote_since(since, a + 128, 8), "just after them");
        assert!(!nic_wrote_since(since, a - 8, 8), "just before them");
        let later = nic_writes();
        assert!(!nic_wrote_since(later, a, 128), "not since the second");
        // Beyond what the log keeps, any buffer may have been written.
        for i in 0..=NIC_WRITES_KEPT {
            note_nic_write(a + 4096 + 2 * i, 1);
        }
        assert!(nic_wrote_since(later, a - 100_000, 8));
    }

    #[test]
    fn a_checksum_sees_any_byte_change_and_not_how_bytes_are_split() {
        let data: Vec<u8> = (0..100u8).collect();
        let sum = |parts: &[&[u8]]| {
            let mut s = Sum::default();
            parts.iter().for_each(|p| s.write(p));
            s.finish()
        };
        let whole = sum(&[&data]);
        assert_eq!(whole, sum(&[&data[..3], &data[3..50], &data[50..]]));
        for i in 0..data.len() {
            let mut d = data.clone();
            d[i] ^= 1;
            assert_ne!(whole, sum(&[&d]), "byte {i}");
        }
        assert_ne!(sum(&[&[0u8; 7]]), sum(&[&[0u8; 8]]), "the length counts");
    }

    #[test]
    fn uroce_check_names_categories() {
        let all = Category::ALL.iter().fold(0, |m, c| m | *c as u32);
        assert_eq!(parse("1"), Ok(all));
        assert_eq!(parse("all"), Ok(all));
        assert_eq!(parse(""), Ok(0));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(
            parse("buffer, post"),
            Ok(Category::Buffer as u32 | Category::Post as u32)
        );
        assert_eq!(parse("buffer,bogus"), Err("bogus".to_string()));
    }
}
