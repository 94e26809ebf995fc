//! The timeline: `UROCE_TRACE=FILE` makes a process write what its devices
//! do in the Chrome trace event format (a JSON array of events), which
//! Perfetto's UI and chrome://tracing load.
//!
//! * One track per QP: `pid` is the process, `tid` the QPN, named by a
//!   `thread_name` metadata event ("RC QP 0x001234").
//! * Each WR from post to completion is a span: an async `b`/`e` pair of
//!   category `wr` with a process-local ID (`id2.local`), since a QP's
//!   WRs overlap and the format's `B`/`E`/`X` slices of one thread must
//!   nest. Name the opcode, args `qpn`, `wr_id`, `length` (as posted),
//!   `status` and `byte_len` (at completion). The `tid` is the QPN;
//!   Perfetto shows a process's async spans on tracks named after them
//!   (`SEND`, `RECV`).
//! * Packets sent and received are instant events on the QP's track
//!   (`tx RC_SEND_ONLY`, `rx RC_ACKNOWLEDGE`, args opcode, PSN, length; an
//!   ACK's or NAK's syndrome and MSN), so are packets the fault injector
//!   drops, retransmissions (`retransmit`: from which PSN and why), state
//!   changes (`state RTR->RTS`); an RNR wait is a span of the time the
//!   requester waits. CM MADs and events go to QP1's track.
//! * Timestamps are `CLOCK_MONOTONIC` in microseconds: two processes on
//!   one host write comparable times, and their `pid`s differ, so their
//!   two files concatenated (`uroce trace-merge`) load as one trace.
//!
//! Off (no `UROCE_TRACE`), every hook costs one relaxed load of a static
//! flag ([`on`]). On, the hooks send small events over a channel to one
//! writer thread per process, which formats them and writes whole records
//! through a buffer, and writes what it has whenever the channel runs dry.
//! Each such flush ends the file with the array's closing `]`, which the
//! next write goes back over: between flushes the file is a whole JSON
//! document, so that of a process ended by a signal (SIGTERM, SIGKILL: no
//! exit handler runs) loads in `json.load` as well as in Perfetto's UI. A
//! process that dies in the middle of a write leaves whole records and no
//! `]`, which the format allows (the spec's "JSON Array Format": the `]`
//! may be missing) and Perfetto loads. A file that cannot seek (a pipe)
//! gets its `]` only at exit. The writer is flushed when a device closes
//! and flushed and closed at exit.
//!
//! `FILE` may hold `%p`, replaced by the process ID, so that both
//! processes of a pair started with one environment write their own files.

use crate::observe::{self, Dir, Fact, Gone, PacketInfo, Resend, Topic};
use crate::types::{QpType, WcStatus};
use crossbeam::channel::{self, Receiver, Sender};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Once, OnceLock};
use std::time::Duration;
use uroce_wire::aeth::AethSyndrome;

/// The environment variable naming the trace file.
pub const TRACE_ENV: &str = "UROCE_TRACE";

/// The track (`tid`) of the CM's MADs and events: QP1's.
pub const CM_TID: u32 = 1;

/// The writer's channel, once started.
static SINK: OnceLock<Sink> = OnceLock::new();

/// How long a flush (a device closing, the process exiting) waits for the
/// writer.
const FLUSH_WAIT: Duration = Duration::from_millis(500);

/// Posted WRs remembered per queue at most: a queue whose WRs are never
/// seen to complete (its QP destroyed with WRs posted) cannot grow the
/// writer without bound.
const POSTED_MAX: usize = 1 << 16;

/// What ends the file's array.
const CLOSING: &[u8] = b"\n]\n";

/// Bytes the writer buffers before it writes.
const BUF_BYTES: usize = 64 * 1024;

struct Sink {
    tx: Sender<Msg>,
}

/// Whether the process writes a trace: the one check on every hot path.
///
/// The timeline is the seam's topic [`Topic::TIMELINE`], set once the
/// trace file is open (cleared in a child after `fork`, which has no
/// writer thread).
#[inline(always)]
pub fn on() -> bool {
    observe::wants(Topic::TIMELINE)
}

/// Opens the trace named by `UROCE_TRACE` (once per process; the devices
/// call it as they open). An unwritable file is reported on stderr and
/// tracing stays off.
pub fn init() {
    static INIT: Once = Once::new();
    if !observe::COMPILED {
        return;
    }
    INIT.call_once(|| {
        let Some(path) = std::env::var_os(TRACE_ENV).filter(|p| !p.is_empty()) else {
            return;
        };
        let path = path
            .to_string_lossy()
            .replace("%p", &std::process::id().to_string());
        if let Err(e) = start(std::path::Path::new(&path)) {
            eprintln!("uroce: {TRACE_ENV}={path}: {e}");
        }
    });
}

fn start(path: &std::path::Path) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    let (tx, rx) = channel::unbounded();
    let mut w = Writer::new(file);
    w.process_name();
    w.flush();
    crate::threads::spawn("uroce-trace".into(), move || w.run(&rx))?;
    if SINK.set(Sink { tx }).is_err() {
        return Ok(());
    }
    extern "C" fn child_after_fork() {
        // The child has no writer thread: it traces nothing.
        observe::unwant(Topic::TIMELINE);
    }
    // SAFETY: registers plain functions that take no arguments and
    // return nothing, as atexit and pthread_atfork want; neither unwinds
    // (`finish_at_exit` catches panics; the fork handler only stores).
    unsafe {
        libc::atexit(finish_at_exit);
        libc::pthread_atfork(None, None, Some(child_after_fork));
    }
    observe::want(Topic::TIMELINE);
    Ok(())
}

extern "C" fn finish_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        observe::unwant(Topic::TIMELINE);
        if let Some(s) = SINK.get() {
            let (tx, rx) = channel::bounded(1);
            if s.tx.send(Msg::Close(tx)).is_ok() {
                let _ = rx.recv_timeout(FLUSH_WAIT);
            }
        }
    });
}

/// Returns once the writer has written every event sent before the call
/// (at most `FLUSH_WAIT`); a device flushes as it closes.
pub fn flush() {
    if !on() {
        return;
    }
    if let Some(s) = SINK.get() {
        let (tx, rx) = channel::bounded(1);
        if s.tx.send(Msg::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(FLUSH_WAIT);
        }
    }
}

/// The trace clock: `CLOCK_MONOTONIC` in nanoseconds.
fn now() -> u64 {
    crate::cq::clock_ns()
}

// -------------------------------------------------------------------
// What the seam tells (each event only while the timeline is on)
// -------------------------------------------------------------------

/// Records one fact of the seam on the timeline: the writer keeps it as
/// it is.
#[cold]
#[inline(never)]
pub fn record(f: Fact) {
    if let Some(s) = SINK.get() {
        let _ = s.tx.send(Msg::Fact(now(), f));
    }
}

/// Records a CM MAD or event (`what`) of connection `conn` on QP1's
/// track, with its `detail` (the peer, the transaction).
#[cold]
#[inline(never)]
pub fn cm(what: &'static str, conn: Option<u32>, detail: &str) {
    if let Some(s) = SINK.get() {
        let _ = s.tx.send(Msg::Cm(now(), what, conn, detail.to_string()));
    }
}

// -------------------------------------------------------------------
// The writer thread
// -------------------------------------------------------------------

enum Msg {
    Fact(u64, Fact),
    /// The CM's event: its name, connection and (borrowed by the seam)
    /// detail, owned here.
    Cm(u64, &'static str, Option<u32>, String),
    Flush(Sender<()>),
    Close(Sender<()>),
}

/// A WR posted and not yet seen to leave its queue.
struct Posted {
    wr_id: u64,
    op: &'static str,
    len: u64,
    ts: u64,
}

struct Writer {
    out: std::io::BufWriter<std::fs::File>,
    /// The file can seek back over its closing `]` (not a pipe).
    seekable: bool,
    pid: u32,
    /// No record written yet (the next one needs no comma before it).
    first: bool,
    closed: bool,
    /// Posted WRs per queue, oldest first.
    posted: HashMap<usize, VecDeque<Posted>>,
    /// Spans written (their async IDs).
    spans: u64,
    /// Tracks named already.
    named: std::collections::HashSet<u32>,
    rec: String,
}

/// `ns` as the format's microseconds, to the nanosecond.
fn us(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// `s` as a JSON string's contents.
fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

fn syndrome(s: AethSyndrome) -> String {
    match s {
        AethSyndrome::Ack { credits } => format!("ACK (credits {credits:#x})"),
        AethSyndrome::RnrNak { timer } => format!("RNR NAK (timer {timer})"),
        AethSyndrome::Nak(code) => format!("NAK: {code}"),
        AethSyndrome::Reserved(b) => format!("reserved syndrome {b:#04x}"),
    }
}

impl Writer {
    fn new(mut file: std::fs::File) -> Writer {
        use std::io::Seek;
        let seekable = file.stream_position().is_ok();
        let mut out = std::io::BufWriter::with_capacity(BUF_BYTES, file);
        let _ = out.write_all(b"[\n");
        Writer {
            out,
            seekable,
            pid: std::process::id(),
            first: true,
            closed: false,
            posted: HashMap::new(),
            spans: 0,
            named: Default::default(),
            rec: String::with_capacity(512),
        }
    }

    fn run(mut self, rx: &Receiver<Msg>) {
        while let Ok(m) = rx.recv() {
            self.take(m);
            while let Ok(m) = rx.try_recv() {
                self.take(m);
            }
            // The channel ran dry: what is buffered goes to the file.
            self.flush();
        }
        self.close();
    }

    fn take(&mut self, m: Msg) {
        match m {
            Msg::Fact(ts, f) => self.event(ts, f),
            Msg::Cm(ts, what, conn, detail) => self.cm(ts, what, conn, &detail),
            Msg::Flush(done) => {
                self.flush();
                let _ = done.send(());
            }
            Msg::Close(done) => {
                self.close();
                let _ = done.send(());
            }
        }
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = self.out.write_all(CLOSING);
            let _ = self.out.flush();
        }
    }

    /// Writes what is buffered and the array's closing `]`, then moves
    /// back over the `]`, which the next record overwrites (each begins
    /// with `,\n` or, the first, with `{`: longer than the `]`): the file
    /// is a whole JSON document until then.
    fn flush(&mut self) {
        use std::io::Seek;
        if self.closed || !self.seekable {
            let _ = self.out.flush();
            return;
        }
        let _ = self.out.write_all(CLOSING);
        let _ = self.out.flush();
        let back = -(CLOSING.len() as i64);
        if self.out.seek(std::io::SeekFrom::Current(back)).is_err() {
            // Cannot go back: leave the `]` and write nothing more.
            self.closed = true;
        }
    }

    /// Writes one record (an object's fields, without braces).
    fn record(&mut self, fields: std::fmt::Arguments<'_>) {
        if self.closed {
            return;
        }
        self.rec.clear();
        if !self.first {
            self.rec.push_str(",\n");
        }
        self.first = false;
        let _ = write!(self.rec, "{{\"pid\":{},{}}}", self.pid, fields);
        let _ = self.out.write_all(self.rec.as_bytes());
    }

    fn process_name(&mut self) {
        let exe = std::env::args()
            .next()
            .map(|a| a.rsplit('/').next().unwrap_or(&a).to_string())
            .unwrap_or_default();
        let name = escape(&format!("{exe} (pid {})", self.pid));
        self.record(format_args!(
            "\"ph\":\"M\",\"name\":\"process_name\",\"args\":{{\"name\":\"uroce: {name}\"}}"
        ));
        self.name_track(CM_TID, "QP1 (CM)".into());
    }

    fn name_track(&mut self, tid: u32, name: String) {
        self.named.insert(tid);
        let name = escape(&name);
        self.record(format_args!(
            "\"ph\":\"M\",\"name\":\"thread_name\",\"tid\":{tid},\"args\":{{\"name\":\"{name}\"}}"
        ));
        self.record(format_args!(
            "\"ph\":\"M\",\"name\":\"thread_sort_index\",\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}"
        ));
    }

    /// An instant event on track `tid`.
    fn instant(&mut self, ts: u64, tid: u32, name: &str, args: std::fmt::Arguments<'_>) {
        if !self.named.contains(&tid) {
            self.name_track(tid, format!("QP {tid:#08x}"));
        }
        self.record(format_args!(
            "\"ph\":\"i\",\"s\":\"t\",\"ts\":{},\"tid\":{tid},\"name\":\"{name}\",\"args\":{{{args}}}",
            us(ts)
        ));
    }

    fn event(&mut self, ts: u64, f: Fact) {
        match f {
            Fact::QpCreated {
                qpn,
                qp_type,
                ip,
                sq,
                rq,
            } => {
                self.posted.remove(&sq);
                if let Some(rq) = rq {
                    self.posted.remove(&rq);
                }
                let t = match qp_type {
                    QpType::Rc => "RC",
                    QpType::Uc => "UC",
                    QpType::Ud => "UD",
                };
                self.name_track(qpn, format!("{t} QP {qpn:#08x}"));
                self.instant(
                    ts,
                    qpn,
                    "create",
                    format_args!("\"qpn\":{qpn},\"device\":\"{ip}\""),
                );
            }
            Fact::StateChanged { qpn, from, to } => {
                let name = format!("state {}->{}", from.name(), to.name());
                self.instant(
                    ts,
                    qpn,
                    &name,
                    format_args!("\"from\":\"{}\",\"to\":\"{}\"", from.name(), to.name()),
                );
            }
            Fact::SendPosted {
                queue,
                wr_id,
                opcode,
                len,
            } => self.posted(ts, queue, wr_id, opcode.name(), len),
            Fact::RecvPosted { queue, wr_id, len } => self.posted(ts, queue, wr_id, "RECV", len),
            Fact::SendDone {
                qpn,
                queue,
                wr_id,
                status,
                byte_len,
                completed,
            } => self.done(ts, qpn, queue, wr_id, status, byte_len, completed),
            Fact::RecvDone {
                qpn,
                queue,
                wr_id,
                status,
                byte_len,
            } => self.done(ts, qpn, queue, wr_id, status, byte_len, true),
            Fact::QueuesGone { qpn, sq, rq, why } => {
                let why = match why {
                    Gone::Reset => "discarded (RESET)",
                    Gone::Destroyed => "destroyed",
                };
                for queue in std::iter::once(sq).chain(rq) {
                    let left = self.posted.remove(&queue).unwrap_or_default();
                    for p in left {
                        let id = p.wr_id;
                        self.span(ts, qpn, id, Some(p), Err(why), 0, false);
                    }
                }
            }
            Fact::Packet { qpn, dir, pkt } => {
                let d = match dir {
                    Dir::Tx => "tx",
                    Dir::Rx => "rx",
                    Dir::Lost => "lost",
                };
                let PacketInfo {
                    opcode,
                    psn,
                    dest_qp,
                    len,
                    aeth,
                } = pkt;
                let name = format!("{d} {opcode}");
                let ack = match aeth {
                    Some((s, msn)) => format!(",\"syndrome\":\"{}\",\"msn\":{msn}", syndrome(s)),
                    None => String::new(),
                };
                self.instant(
                    ts,
                    qpn,
                    &name,
                    format_args!(
                        "\"opcode\":\"{opcode}\",\"psn\":{psn},\"dest_qp\":{dest_qp},\"len\":{len}{ack}"
                    ),
                );
            }
            Fact::Retransmit {
                qpn,
                psn,
                cause,
                retries_left,
            } => {
                let why = match cause {
                    Resend::AckTimeout => "ACK timeout",
                    Resend::SeqNak => "PSN sequence error NAK",
                };
                self.instant(
                    ts,
                    qpn,
                    "retransmit",
                    format_args!("\"psn\":{psn},\"why\":\"{why}\",\"retries_left\":{retries_left}"),
                )
            }
            Fact::RnrWait {
                qpn,
                psn,
                wait_ns,
                retries_left,
            } => {
                if !self.named.contains(&qpn) {
                    self.name_track(qpn, format!("QP {qpn:#08x}"));
                }
                self.record(format_args!(
                    "\"ph\":\"X\",\"ts\":{},\"dur\":{},\"tid\":{qpn},\"name\":\"RNR wait\",\"args\":{{\"psn\":{psn},\"retries_left\":{retries_left}}}",
                    us(ts),
                    us(wait_ns)
                ));
            }
        }
    }

    /// A CM MAD or event on QP1's track.
    fn cm(&mut self, ts: u64, what: &str, conn: Option<u32>, detail: &str) {
        let conn = conn.map_or(String::new(), |c| format!("\"conn\":{c},"));
        let detail = escape(detail);
        self.instant(
            ts,
            CM_TID,
            what,
            format_args!("{conn}\"detail\":\"{detail}\""),
        );
    }

    /// WR `wr_id` (operation `op`, `len` bytes) was posted to `queue`.
    fn posted(&mut self, ts: u64, queue: usize, wr_id: u64, op: &'static str, len: u64) {
        let q = self.posted.entry(queue).or_default();
        if q.len() >= POSTED_MAX {
            q.pop_front();
        }
        q.push_back(Posted { wr_id, op, len, ts });
    }

    /// WR `wr_id` of QP `qpn` left `queue`: its span ends.
    #[allow(clippy::too_many_arguments)]
    fn done(
        &mut self,
        ts: u64,
        qpn: u32,
        queue: usize,
        wr_id: u64,
        status: WcStatus,
        byte_len: u64,
        signaled: bool,
    ) {
        let p = self.posted.get_mut(&queue).and_then(|q| {
            let i = q.iter().position(|p| p.wr_id == wr_id)?;
            q.remove(i)
        });
        self.span(ts, qpn, wr_id, p, Ok(status), byte_len, signaled);
    }

    /// A WR's span: from its post (`p`; the end itself if the post was
    /// not seen) to `end`, on QP `qpn`'s track. `status` `Err`: the WR
    /// left without a completion (the QP went to RESET, or was destroyed).
    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        end: u64,
        qpn: u32,
        wr_id: u64,
        p: Option<Posted>,
        status: Result<WcStatus, &'static str>,
        byte_len: u64,
        signaled: bool,
    ) {
        if !self.named.contains(&qpn) {
            self.name_track(qpn, format!("QP {qpn:#08x}"));
        }
        self.spans += 1;
        let id = format!("{:#x}", self.spans);
        let (start, op, len) = p.map_or((end, "WR", 0), |p| (p.ts.min(end), p.op, p.len));
        self.record(format_args!(
            "\"ph\":\"b\",\"cat\":\"wr\",\"id2\":{{\"local\":\"{id}\"}},\"ts\":{},\"tid\":{qpn},\"name\":\"{op}\",\"args\":{{\"qpn\":{qpn},\"wr_id\":{wr_id},\"length\":{len}}}",
            us(start)
        ));
        let status = status.map_or_else(str::to_string, |s| s.to_string());
        self.record(format_args!(
            "\"ph\":\"e\",\"cat\":\"wr\",\"id2\":{{\"local\":\"{id}\"}},\"ts\":{},\"tid\":{qpn},\"name\":\"{op}\",\"args\":{{\"status\":\"{}\",\"byte_len\":{byte_len},\"signaled\":{signaled}}}",
            us(end),
            escape(&status)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> (Writer, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!(
            "uroce-trace-unit-{}-{:?}.json",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::File::create(&path).unwrap();
        (Writer::new(f), path)
    }

    #[test]
    fn spans_pair_posts_with_completions_out_of_order_and_unclosed_files_load() {
        let (mut w, path) = writer();
        let q = 0x1000;
        for (i, id) in [7u64, 8, 9].into_iter().enumerate() {
            w.event(
                1_000 + i as u64,
                Fact::RecvPosted {
                    queue: q,
                    wr_id: id,
                    len: 64,
                },
            );
        }
        // An SRQ's WRs may complete out of posting order.
        for (ts, id) in [(5_000u64, 8u64), (6_000, 7)] {
            w.event(
                ts,
                Fact::RecvDone {
                    queue: q,
                    qpn: 0x12,
                    wr_id: id,
                    status: WcStatus::Success,
                    byte_len: 10,
                },
            );
        }
        w.event(
            7_000,
            Fact::QueuesGone {
                qpn: 0x12,
                sq: q,
                rq: None,
                why: Gone::Reset,
            },
        );
        let _ = w.out.flush();
        // Not closed: the array lacks its `]`, as a crashed process's.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.trim_end().ends_with(']'));
        let v: Vec<serde_json::Value> = serde_json::from_str(&(text.clone() + "]")).unwrap();
        let begins: Vec<_> = v.iter().filter(|e| e["ph"] == "b").collect();
        assert_eq!(begins.len(), 3);
        // wr_id 8 began at its post (1.001 µs) and ended at 5 µs.
        assert!(text.contains(
            "\"ts\":1.001,\"tid\":18,\"name\":\"RECV\",\"args\":{\"qpn\":18,\"wr_id\":8"
        ));
        assert!(text.contains(
            "\"ts\":5.000,\"tid\":18,\"name\":\"RECV\",\"args\":{\"status\":\"success\""
        ));
        assert!(text.contains("discarded (RESET)"));
        // The writer's own flush leaves a whole document, and the next
        // records go over its `]`.
        w.flush();
        let whole = |path: &std::path::Path| -> Vec<serde_json::Value> {
            let text = std::fs::read_to_string(path).unwrap();
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
        };
        assert_eq!(whole(&path).len(), v.len());
        w.instant(8_000, 0x12, "discarded (ERR)", format_args!(""));
        w.flush();
        let after = whole(&path);
        assert!(after.len() > v.len(), "{after:?}");
        assert!(after
            .iter()
            .any(|e| e.to_string().contains("discarded (ERR)")));
        w.close();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.trim_end().ends_with(']'));
        let _ = std::fs::remove_file(&path);
    }
}
