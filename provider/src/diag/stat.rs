//! Live state: what `uroce stat` shows of a running process.
//!
//! Every process that opens a uroce device serves its state on a Unix
//! socket of its own, `$XDG_RUNTIME_DIR/uroce/PID.sock` (without
//! `XDG_RUNTIME_DIR`: `/tmp/uroce-UID/PID.sock`), in a directory of mode
//! 0700 owned by the user, the socket itself of mode 0600; the server
//! also checks that the peer's UID is its own (`SO_PEERCRED`). The first
//! device the process opens starts one small thread that answers it;
//! `UROCE_STAT=0` turns it off (no thread, no socket). The socket is
//! removed when the process exits normally; `uroce stat` removes those
//! of processes that died without doing so.
//!
//! The channel is read-only: a client sends the request `state` (one
//! line) and reads one JSON document, a [`ProcessState`]; anything else
//! is answered with `{"error": ...}` and nothing is done. The document
//! is what kernel devices show through `rdma resource show` and `rdma
//! statistic`: the devices with their port, PDs, MRs, CQs, SRQs, QPs
//! (type, state, PSNs, WRs outstanding, retransmissions, last error) and
//! counters.

use crate::userdir::{euid, private_dir};
use serde::{Deserialize, Serialize};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable that turns the state socket off (`0`).
pub const STAT_ENV: &str = "UROCE_STAT";
/// The one request the socket answers.
pub const REQUEST: &str = "state";
/// The longest request line the server reads.
const MAX_REQUEST: u64 = 64;
/// How long either side waits for the other.
const IO_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the server waits for an engine to describe its QPs.
pub(crate) const ENGINE_WAIT: Duration = Duration::from_secs(1);

/// One process's uroce state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessState {
    /// Its process ID.
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
    /// Its open devices.
    pub devices: Vec<DeviceState>,
}

/// One open device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceState {
    /// Its name (`uroce0`, or the address when the verbs layer gave none).
    pub name: String,
    /// Its address.
    pub addr: String,
    /// Its port (always 1).
    pub port: u8,
    /// The port's state (a uroce port is always ACTIVE).
    pub port_state: String,
    /// The port's active MTU in bytes.
    pub active_mtu: u32,
    /// The MTU of the interface holding the address.
    pub netdev_mtu: u32,
    /// The engine's batched I/O (GSO, GRO on or off).
    pub io_path: String,
    /// Protection domains.
    pub pds: Vec<PdState>,
    /// Memory regions.
    pub mrs: Vec<MrState>,
    /// Completion queues.
    pub cqs: Vec<CqState>,
    /// Shared receive queues.
    pub srqs: Vec<SrqState>,
    /// Queue pairs (QP1, the connection manager's, is not listed).
    pub qps: Vec<QpStat>,
    /// The device's counters, in declaration order (`rdma statistic`).
    #[serde(with = "ordered_map")]
    pub counters: Vec<(String, u64)>,
}

/// A protection domain and how many objects are in it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PdState {
    /// Its number.
    pub pdn: u32,
    /// Memory regions in it.
    pub mrs: usize,
    /// QPs in it.
    pub qps: usize,
    /// SRQs in it.
    pub srqs: usize,
}

/// A memory region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MrState {
    /// Its protection domain.
    pub pdn: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
    /// The address peers and SGEs use for its first byte.
    pub iova: u64,
    /// Length in bytes.
    pub length: u64,
    /// Access rights (`LOCAL_WRITE`, `REMOTE_READ`, ...).
    pub access: Vec<String>,
}

/// A completion queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CqState {
    /// Its handle (what completion events name).
    pub cqn: u32,
    /// Capacity.
    pub cqe: usize,
    /// Completions waiting to be polled.
    pub pending: usize,
    /// Completion events delivered and not acknowledged.
    pub unacked_events: u32,
}

/// A shared receive queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SrqState {
    /// Its handle.
    pub srqn: u32,
    /// Its protection domain.
    pub pdn: u32,
    /// Capacity in WRs.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Receive WRs posted and not yet taken.
    pub posted: usize,
    /// The armed limit (0: none).
    pub limit: u32,
}

/// A queue pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QpStat {
    /// QP number.
    pub qpn: u32,
    /// Transport: RC, UC, UD.
    pub qp_type: String,
    /// State: RESET, INIT, RTR, RTS, SQD, SQE, ERR.
    pub state: String,
    /// Its protection domain.
    pub pdn: u32,
    /// The connected peer's QP number (RC, UC; 0 before RTR).
    pub dest_qpn: u32,
    /// The connected peer's address (RC, UC after RTR).
    pub dest_addr: Option<String>,
    /// Path MTU in bytes.
    pub path_mtu: u32,
    /// The next send PSN (`sq_psn`).
    pub sq_psn: u32,
    /// The expected receive PSN (`rq_psn`).
    pub rq_psn: u32,
    /// Send CQ handle.
    pub send_cq: u32,
    /// Receive CQ handle.
    pub recv_cq: u32,
    /// The SRQ receives come from.
    pub srq: Option<u32>,
    /// Send WRs posted and not yet completed (or retired).
    pub sq_wrs: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive WRs posted and not yet consumed (0 with an SRQ).
    pub rq_wrs: usize,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Request PSNs sent and not yet acknowledged (RC).
    pub inflight_psns: u32,
    /// Request packets sent again.
    pub retransmits: u64,
    /// Retransmission timer expiries.
    pub retry_timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks_rcvd: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks_rcvd: u64,
    /// The last error completion's status (`ibv_wc_status`), if any.
    pub last_error_status: Option<u32>,
    /// The last error completion's `wr_id`.
    pub last_error_wr_id: Option<u64>,
    /// The last error in words: the QP's explanation (why it entered
    /// ERR, else its last explained error: which check failed, on which
    /// side), else the last error completion's status and WR.
    pub last_error: Option<String>,
}

/// `Vec<(String, u64)>` as a JSON object whose keys keep their order.
mod ordered_map {
    use serde::de::{MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(v.len()))?;
        for (k, x) in v {
            m.serialize_entry(k, x)?;
        }
        m.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, u64)>, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Vec<(String, u64)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of counter names to numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = a.next_entry()? {
                    v.push(e);
                }
                Ok(v)
            }
        }
        d.deserialize_map(Entries)
    }
}

impl ProcessState {
    /// This process's state now.
    pub fn current() -> ProcessState {
        ProcessState {
            pid: std::process::id(),
            comm: comm(std::process::id()),
            devices: SOURCE.get().map_or_else(Vec::new, |states| states()),
        }
    }
}

/// A process's command name, as `/proc/PID/comm` gives it.
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

// ------------------------------------------------------------- the directory

/// The directories where state sockets may be, in the order the server
/// chooses: `$XDG_RUNTIME_DIR/uroce` (when it names an absolute path),
/// then `/tmp/uroce-UID`.
pub fn socket_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        let x = PathBuf::from(x);
        if x.is_absolute() && x.is_dir() {
            dirs.push(x.join("uroce"));
        }
    }
    dirs.push(PathBuf::from(format!("/tmp/uroce-{}", euid())));
    dirs
}

// ------------------------------------------------------------- the server

/// The server of this process: (its PID, the socket's path). A child made
/// by `fork` has no server thread: it starts its own.
static SERVER: parking_lot::Mutex<Option<(u32, Option<PathBuf>)>> = parking_lot::Mutex::new(None);

/// Where the devices' states come from: the face's list of open devices,
/// handed over by the first device that opens (the tools import nothing
/// above the seam).
static SOURCE: std::sync::OnceLock<fn() -> Vec<DeviceState>> = std::sync::OnceLock::new();

/// True unless `UROCE_STAT=0`.
fn enabled() -> bool {
    !crate::env::turned_off(STAT_ENV)
}

/// Starts this process's state server if it has none (called by every
/// device open with the function that lists the open devices' states;
/// `UROCE_STAT=0`: never). A failure to make the socket is reported on
/// stderr once and costs the process nothing else.
pub(crate) fn serve_lazily(states: fn() -> Vec<DeviceState>) {
    if !crate::diag::COMPILED || !enabled() {
        return;
    }
    let _ = SOURCE.set(states);
    let pid = std::process::id();
    let mut server = SERVER.lock();
    if server.as_ref().is_some_and(|(p, _)| *p == pid) {
        return;
    }
    let path = match start(pid) {
        Ok(path) => Some(path),
        Err(e) => {
            eprintln!("uroce: no state socket for `uroce stat` ({e}); {STAT_ENV}=0 silences this");
            None
        }
    };
    *server = Some((pid, path));
}

fn start(pid: u32) -> io::Result<PathBuf> {
    let dir = socket_dirs()
        .into_iter()
        .find(|d| private_dir(d).is_ok())
        .ok_or_else(|| io::Error::other("no private directory for it"))?;
    let path = dir.join(format!("{pid}.sock"));
    // Made under another name and renamed once it listens, with its
    // mode: a client never finds the name without a listener behind it
    // (which `uroce stat` takes for a dead process's socket). The rename
    // replaces a socket of an earlier process with this PID.
    let tmp = dir.join(format!(".{pid}.sock.new"));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = crate::threads::spawn("uroce-stat".into(), move || serve(listener)) {
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    register_cleanup();
    Ok(path)
}

/// Removes the socket at exit (once per process image).
fn register_cleanup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `remove_socket` is an `extern "C" fn()` that stays
        // valid as long as this library is loaded (atexit handlers of a
        // shared object run when it is unloaded).
        unsafe { libc::atexit(remove_socket) };
    });
}

extern "C" fn remove_socket() {
    // At exit the server thread may hold nothing: try_lock.
    if let Some(server) = SERVER.try_lock() {
        if let Some((pid, Some(path))) = server.as_ref() {
            if *pid == std::process::id() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn serve(listener: UnixListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let _ = answer(stream);
    }
}

/// The UID of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given,
    // and the descriptor belongs to `s` for the call.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Answers one client: `state` gets the process's state, anything else
/// an error; a peer of another user gets nothing.
fn answer(mut s: UnixStream) -> io::Result<()> {
    if peer_uid(&s)? != euid() {
        return Ok(());
    }
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&s).take(MAX_REQUEST)).read_line(&mut line)?;
    let reply = if line.trim() == REQUEST {
        serde_json::to_vec(&ProcessState::current()).map_err(io::Error::other)?
    } else {
        serde_json::to_vec(&serde_json::json!({
            "error": format!("unknown request; the only one is `{REQUEST}`")
        }))
        .map_err(io::Error::other)?
    };
    s.write_all(&reply)?;
    s.write_all(b"\n")
}

// ------------------------------------------------------------- the client

/// Asks the server at `path` for its process's state.
pub fn query(path: &Path) -> io::Result<ProcessState> {
    let mut s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.write_all(format!("{REQUEST}\n").as_bytes())?;
    let mut reply = Vec::new();
    s.read_to_end(&mut reply)?;
    serde_json::from_slice(&reply).map_err(|e| {
        let text = String::from_utf8_lossy(&reply);
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}: {}", path.display(), text.trim()),
        )
    })
}

/// The socket of process `pid`, if it serves one.
pub fn socket_of(pid: u32) -> Option<PathBuf> {
    socket_dirs()
        .into_iter()
        .map(|d| d.join(format!("{pid}.sock")))
        .find(|p| p.exists())
}

/// Asks process `pid` for its state.
pub fn query_pid(pid: u32) -> io::Result<ProcessState> {
    let path = socket_of(pid).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {pid} serves no uroce state socket"),
        )
    })?;
    query(&path)
}

/// What asking one process gave.
#[derive(Debug)]
pub struct Answer {
    /// The process.
    pub pid: u32,
    /// Its socket.
    pub path: PathBuf,
    /// Its state, or why there is none.
    pub state: io::Result<ProcessState>,
}

/// Asks every uroce process of this user for its state, in PID order.
/// Sockets nobody listens on (their process died without removing them)
/// are removed and not listed.
pub fn query_all() -> Vec<Answer> {
    let mut socks: Vec<(u32, PathBuf)> = Vec::new();
    for dir in socket_dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            let pid = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".sock"))
                .and_then(|n| n.parse::<u32>().ok());
            if let Some(pid) = pid {
                socks.push((pid, path));
            }
        }
    }
    socks.sort();
    let mut out = Vec::new();
    for (pid, path) in socks {
        let state = query(&path);
        if let Err(e) = &state {
            if stale(pid, e) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
        }
        out.push(Answer { pid, path, state });
    }
    out
}

/// True when a socket's failure means nobody will ever answer on it: no
/// listener (ECONNREFUSED), or its process is gone.
fn stale(pid: u32, e: &io::Error) -> bool {
    if e.kind() == io::ErrorKind::ConnectionRefused {
        return true;
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn counters_keep_their_order_through_json() {
        let dev = DeviceState {
            name: "uroce0".into(),
            addr: "127.119.0.9".into(),
            port: 1,
            port_state: "ACTIVE".into(),
            active_mtu: 1024,
            netdev_mtu: 1500,
            io_path: String::new(),
            pds: vec![],
            mrs: vec![],
            cqs: vec![],
            srqs: vec![],
            qps: vec![],
            counters: vec![("z".into(), 1), ("a".into(), 2)],
        };
        let json = serde_json::to_string(&dev).unwrap();
        assert!(json.contains(r#""counters":{"z":1,"a":2}"#), "{json}");
        let back: DeviceState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, dev);
    }

    #[test]
    fn a_directory_open_to_others_is_refused() {
        let dir = std::env::temp_dir().join(format!("uroce-stat-test-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = private_dir(&dir).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        std::fs::remove_dir(&dir).unwrap();
    }
}
