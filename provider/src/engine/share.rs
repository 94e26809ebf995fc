//! One device for every process of a user: the engines of several
//! processes share `<device ip>:4791`, as the processes of a host share a
//! kernel RDMA device.
//!
//! Each process keeps its own engine and its own socket; the sockets are
//! one SO_REUSEPORT group (the kernel allows one only among the sockets of
//! one user), and a classic BPF program attached to the group
//! (SO_ATTACH_REUSEPORT_CBPF, no privilege needed) picks the socket of
//! each datagram from its BTH destination QP. No packet takes an extra
//! hop, and the engine makes no extra system call per packet.
//!
//! - **QPN slots.** A process's QP numbers carry its *slot* in their top
//!   [`SLOT_BITS`] bits: slot `s` owns QPNs `s << 18 ..= s << 18 | 0x3ffff`,
//!   so a QPN names its process and no two processes hand out the same
//!   one. A slot is an exclusive `flock` on `slot-<s>` in the device's
//!   state directory (`/run/user/<uid>/uroce/<ip>/`, else
//!   `/tmp/uroce-<uid>/<ip>/`, private to the user): the kernel releases
//!   it when its holder exits, however it exits. Slot 63 is never taken:
//!   its numbers hold the multicast QPN (0xFFFFFF) and the probe's.
//! - **Steering.** The program returns an index into the group's socket
//!   array, which is in join order, and the kernel moves the last socket
//!   into a closed one's place (out of range, it picks by flow hash). A
//!   member cannot ask the kernel where its socket sits, so a member
//!   *probes*: for every index `i` below the number of live slots it sends
//!   a probe datagram the program steers to index `i`, and the engine that
//!   receives it answers with its slot. The answers make the slot → index
//!   map; a program with that map replaces the group's. A rebuild runs
//!   under `group.lock` (an exclusive `flock`) whenever a member joins,
//!   or a member's helper thread sees the set of held slots change (a
//!   member left or was killed): it looks every [`WATCH`]. A member that
//!   closes its device first attaches the program the group will need
//!   once its socket has gone (the last socket in its place).
//! - **Never the wrong QP.** While the group changes, a datagram may reach
//!   another member's socket. The engine looks at the destination QP's
//!   slot before anything else: one of another live member is dropped and
//!   counted (`rx_foreign`), never handed to a QP; RC's retransmission
//!   recovers it once the program is rebuilt. A datagram of a dead slot
//!   reaches no QP either (its QPNs are nobody's until the slot is taken
//!   again), as a kernel device drops one for a destroyed QP.
//! - **QP1.** The connection manager is not yet shared: datagrams to QP 0
//!   and 1 go to the member with the lowest slot, and each process's CM
//!   answers only for its own connections.
//!
//! `UROCE_SHARE=0` turns sharing off: the socket binds alone (a second
//! process gets EADDRINUSE) and QPNs use all 24 bits, as before.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bits of a QPN that name its process's slot.
pub const SLOT_BITS: u32 = 6;
/// Where the slot starts in a QPN.
pub const SLOT_SHIFT: u32 = 24 - SLOT_BITS;
/// The QPN bits a process chooses within its slot.
pub const SLOT_QPN_MASK: u32 = (1 << SLOT_SHIFT) - 1;
/// Slots processes can take (0..SLOTS; the last one is reserved).
pub const SLOTS: u32 = (1 << SLOT_BITS) - 1;
/// The destination QP of a probe (in the reserved slot).
const PROBE_QPN: u32 = 0xff_fffe;
/// A probe's first byte (an opcode of the manufacturer-specific range,
/// which no RoCE peer sends uroce).
const PROBE_OP: u8 = 0xfe;
const PROBE_MAGIC: [u8; 3] = *b"uRP";
const ANSWER_MAGIC: [u8; 3] = *b"uRA";
/// A probe: opcode, magic, destination QP (bytes 5-7), the socket index
/// asked for (8..12, the word the program returns), a nonce (12..20).
const PROBE_LEN: usize = 20;
/// An answer: the probe with [`ANSWER_MAGIC`], then the slot (20..24).
const ANSWER_LEN: usize = 24;
/// How often a member's helper looks at the set of held slots.
pub const WATCH: Duration = Duration::from_millis(100);
/// How long one round of probes waits for its answers.
const PROBE_WAIT: Duration = Duration::from_millis(100);
/// Rounds of probes before a rebuild settles for what it found.
const PROBE_ROUNDS: usize = 20;

/// Whether devices are shared (`UROCE_SHARE=0` turns it off).
pub fn enabled() -> bool {
    std::env::var("UROCE_SHARE").map_or(true, |v| v.trim() != "0")
}

/// What the engine does with a datagram it received (see
/// [`Steer::screen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    /// Hand it to the endpoint.
    Deliver,
    /// Another live member's: drop and count it.
    Foreign,
    /// A member's probe: answer it.
    Probe,
}

/// What the engine's receive path knows of the group: its own slot and
/// the slots held (updated by the helper).
#[derive(Debug)]
pub struct Steer {
    slot: u32,
    ip: IpAddr,
    /// Bit `s`: slot `s` is held by a live member.
    live: AtomicU64,
}

impl Steer {
    /// The process's slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Where a received datagram goes: a datagram of this member's slot
    /// (the steady state) costs a load and a compare.
    #[inline]
    pub fn screen(&self, pkt: &[u8], from: SocketAddr) -> Screen {
        let Some(q) = pkt.get(5..8) else {
            return Screen::Deliver;
        };
        let dqp = u32::from_be_bytes([0, q[0], q[1], q[2]]);
        if dqp >> SLOT_SHIFT == self.slot {
            return Screen::Deliver;
        }
        self.screen_other(pkt, dqp, from)
    }

    #[cold]
    fn screen_other(&self, pkt: &[u8], dqp: u32, from: SocketAddr) -> Screen {
        let s = dqp >> SLOT_SHIFT;
        if dqp == PROBE_QPN
            && pkt.len() >= PROBE_LEN
            && pkt[0] == PROBE_OP
            && pkt[1..4] == PROBE_MAGIC
            && from.ip() == self.ip
        {
            return Screen::Probe;
        }
        // QP0/QP1 (slot 0's numbers, every process's CM) and numbers of
        // no live member go to the endpoint, as without sharing.
        if dqp > 1 && s < SLOTS && self.live.load(Ordering::Relaxed) & (1 << s) != 0 {
            Screen::Foreign
        } else {
            Screen::Deliver
        }
    }

    /// The answer to probe `pkt` ([`Screen::Probe`]).
    pub fn answer(&self, pkt: &[u8]) -> [u8; ANSWER_LEN] {
        let mut a = [0u8; ANSWER_LEN];
        a[..PROBE_LEN].copy_from_slice(&pkt[..PROBE_LEN]);
        a[1..4].copy_from_slice(&ANSWER_MAGIC);
        a[20..24].copy_from_slice(&self.slot.to_be_bytes());
        a
    }
}

/// Why a process could not join a device's group.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The state directory or a lock file failed.
    #[error("device state in {path}: {err}")]
    State {
        /// The file or directory.
        path: PathBuf,
        /// What failed.
        err: io::Error,
    },
    /// Every slot is taken.
    #[error("{SLOTS} processes share the device already")]
    Full,
}

/// The first half of joining: the group lock (held until the first
/// rebuild) and a slot. The socket is bound between the two halves.
pub struct Joining {
    dir: PathBuf,
    group: File,
    slot: SlotLock,
    steer: Arc<Steer>,
}

impl Joining {
    /// Takes the device's group lock, then a free slot.
    pub fn begin(ip: IpAddr) -> Result<Joining, JoinError> {
        let dir = state_dir(ip)?;
        let group = lock_group(&dir)?;
        let slot = take_slot(&dir)?;
        let steer = Arc::new(Steer {
            slot: slot.slot,
            ip,
            live: AtomicU64::new(1 << slot.slot),
        });
        Ok(Joining {
            dir,
            group,
            slot,
            steer,
        })
    }

    /// What the receive path needs.
    pub fn steer(&self) -> &Arc<Steer> {
        &self.steer
    }

    /// The second half, with the socket bound (`sock`: a duplicate of its
    /// descriptor, for attaching programs): the first rebuild, then a
    /// helper thread that rebuilds on every change. Returns once the
    /// program steers to this member (or after its rounds of probes).
    pub fn finish(self, ip: IpAddr, sock: OwnedFd) -> io::Result<Member> {
        let steer = self.steer;
        let mut group = Group {
            dir: self.dir,
            ip,
            sock,
            steer: steer.clone(),
            mine: self.slot.slot,
            map: None,
        };
        group.rebuild(group.live_slots(), PROBE_ROUNDS);
        drop(self.group);
        let (stop, stopped) = crossbeam::channel::bounded::<()>(0);
        let helper = crate::threads::spawn(format!("uroce-share-{ip}"), move || {
            while let Err(crossbeam::channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(WATCH)
            {
                group.watch();
            }
            group
        })?;
        Ok(Member {
            steer,
            stop: Some(stop),
            helper: Some(helper),
            slot: Some(self.slot),
            leaving: None,
        })
    }
}

/// A process's membership of a device's group: its slot, and the helper
/// thread that keeps the steering right. Dropping it stops the helper
/// (and closes its copy of the socket); the slot is released last, and
/// then the group lock [`Member::leave`] took.
pub struct Member {
    steer: Arc<Steer>,
    stop: Option<crossbeam::channel::Sender<()>>,
    helper: Option<std::thread::JoinHandle<Group>>,
    slot: Option<SlotLock>,
    leaving: Option<File>,
}

impl Member {
    /// What the receive path needs.
    pub fn steer(&self) -> &Arc<Steer> {
        &self.steer
    }

    /// Stops the helper thread and closes its copy of the socket (the
    /// socket leaves the group when the engine closes its own).
    fn stop_helper(&mut self) -> Option<Group> {
        self.stop.take();
        self.helper.take().and_then(|h| h.join().ok())
    }

    /// The first half of leaving, before the engine closes its socket:
    /// stops the helper, takes the group lock (held until the member is
    /// dropped) and steers as the group will be once the socket has
    /// closed: the kernel moves the last socket into this one's place, so
    /// the last member's slot goes to this index from now on (the others'
    /// helpers probe again when this slot is released; this saves them the
    /// datagrams lost meanwhile).
    pub fn leave(&mut self) {
        let Some(group) = self.stop_helper() else {
            return;
        };
        self.leaving = lock_group(&group.dir).ok();
        if self.leaving.is_none() {
            return;
        }
        if let Some(map) = group
            .map
            .as_deref()
            .and_then(|m| after_leaving(m, group.mine))
        {
            let _ = attach(&group.sock, &program(&map));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop_helper();
        self.slot.take();
        self.leaving.take();
    }
}

/// The map of a group whose every socket `map` places, once the socket of
/// slot `mine` has closed: the last index's slot moves into its index.
fn after_leaving(map: &[(u32, u32)], mine: u32) -> Option<Vec<(u32, u32)>> {
    let &(at, _) = map.iter().find(|&&(_, s)| s == mine)?;
    let last = map.len() as u32 - 1;
    Some(
        map.iter()
            .filter(|&&(_, s)| s != mine)
            .map(|&(i, s)| if i == last { (at, s) } else { (i, s) })
            .collect(),
    )
}

/// What the helper thread holds.
struct Group {
    dir: PathBuf,
    ip: IpAddr,
    sock: OwnedFd,
    steer: Arc<Steer>,
    mine: u32,
    /// The last rebuild's (index, slot) map, if it placed every live
    /// slot (then it places every socket of the group).
    map: Option<Vec<(u32, u32)>>,
}

impl Group {
    /// One look at the held slots; a rebuild under the group lock if they
    /// changed, or if the last one did not place them all (a member that
    /// did not answer in time).
    fn watch(&mut self) {
        let same = self.live_slots() == self.steer.live.load(Ordering::Relaxed);
        if same && self.map.is_some() {
            return;
        }
        let Ok(_g) = lock_group(&self.dir) else {
            return;
        };
        // A member that did not answer gets one round a look (a stopped
        // process must not keep the group lock held).
        self.rebuild(self.live_slots(), if same { 1 } else { PROBE_ROUNDS });
    }

    /// The slots held by a live member (bit per slot), this one's among
    /// them.
    fn live_slots(&self) -> u64 {
        let mut live = 1u64 << self.mine;
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return live;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(s) = name
                .to_str()
                .and_then(|n| n.strip_prefix("slot-"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if s < SLOTS && s != self.mine && slot_held(&e.path()) {
                live |= 1 << s;
            }
        }
        live
    }

    /// Probes the group for the slot at each index (see the module docs)
    /// and attaches the program for what it found. A member alone needs no
    /// probe (its socket is the group's only one, index 0): a process on
    /// a device of its own sends nothing more than before sharing.
    fn rebuild(&mut self, mut live: u64, rounds: usize) {
        if live == 1 << self.mine {
            let map = vec![(0, self.mine)];
            let _ = attach(&self.sock, &program(&map));
            self.map = Some(map);
            self.steer.live.store(live, Ordering::Relaxed);
            return;
        }
        let mut found = Vec::new();
        self.map = None;
        for round in 0..rounds {
            if round > 0 {
                std::thread::sleep(Duration::from_millis(10));
                live = self.live_slots();
            }
            match self.probe(live.count_ones()) {
                Ok(map) if covers(&map, live) => {
                    found = map;
                    self.map = Some(found.clone());
                    break;
                }
                Ok(map) if map.len() > found.len() => found = map,
                _ => {}
            }
        }
        // Partial (a member that does not answer): what was found steers,
        // the rest goes by hash and is dropped where it is foreign.
        let prog = program(&found);
        let _ = attach(&self.sock, &prog);
        self.steer.live.store(live, Ordering::Relaxed);
    }

    /// One round: a probe for each index `0..n`; the (index, slot) pairs
    /// answered, each index once.
    fn probe(&self, n: u32) -> io::Result<Vec<(u32, u32)>> {
        let s = UdpSocket::bind(SocketAddr::new(self.ip, 0))?;
        let to = SocketAddr::new(self.ip, uroce_wire::ROCEV2_UDP_PORT);
        let nonce: u64 = rand::random();
        for i in 0..n {
            s.send_to(&probe(i, nonce), to)?;
        }
        let mut map: Vec<(u32, u32)> = Vec::new();
        let until = Instant::now() + PROBE_WAIT;
        let mut buf = [0u8; 64];
        while (map.len() as u32) < n {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            s.set_read_timeout(Some(left))?;
            let Ok((len, _)) = s.recv_from(&mut buf) else {
                break;
            };
            let a = &buf[..len];
            if len < ANSWER_LEN || a[1..4] != ANSWER_MAGIC || a[12..20] != nonce.to_be_bytes() {
                continue;
            }
            let index = u32::from_be_bytes([a[8], a[9], a[10], a[11]]);
            let slot = u32::from_be_bytes([a[20], a[21], a[22], a[23]]);
            if index < n && map.iter().all(|&(i, _)| i != index) {
                map.push((index, slot));
            }
        }
        Ok(map)
    }
}

/// Whether a probe's answers place every live slot at an index of its
/// own.
fn covers(map: &[(u32, u32)], live: u64) -> bool {
    let mut seen = 0u64;
    for &(_, s) in map {
        if s >= SLOTS || seen & (1 << s) != 0 {
            return false;
        }
        seen |= 1 << s;
    }
    seen == live
}

/// A probe for socket index `index`.
fn probe(index: u32, nonce: u64) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[0] = PROBE_OP;
    p[1..4].copy_from_slice(&PROBE_MAGIC);
    p[4..8].copy_from_slice(&PROBE_QPN.to_be_bytes());
    p[8..12].copy_from_slice(&index.to_be_bytes());
    p[12..20].copy_from_slice(&nonce.to_be_bytes());
    p
}

/// Classic BPF, as the kernel reads it (`linux/filter.h`).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_LD_B_ABS: u16 = 0x30;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_ALU_RSH_K: u16 = 0x74;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_RET_K: u16 = 0x06;
const BPF_RET_A: u16 = 0x16;
/// An index no group has: the kernel picks by flow hash.
const NO_INDEX: u32 = u32::MAX;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The steering program for `map` ((socket index, slot) pairs), run on
/// each datagram's UDP payload: a probe goes to the index it names; QP 0
/// and 1 to the lowest slot's socket; any other QPN to its slot's socket;
/// a slot not in the map by flow hash.
fn program(map: &[(u32, u32)]) -> Vec<libc::sock_filter> {
    let cm = map
        .iter()
        .min_by_key(|&&(_, s)| s)
        .map_or(NO_INDEX, |&(i, _)| i);
    let mut p = vec![
        ins(BPF_LD_B_ABS, 0, 0, 0),
        ins(BPF_JEQ_K, 0, 2, PROBE_OP as u32),
        ins(BPF_LD_W_ABS, 0, 0, 8),
        ins(BPF_RET_A, 0, 0, 0),
        ins(BPF_LD_W_ABS, 0, 0, 4),
        ins(BPF_ALU_AND_K, 0, 0, 0xff_ffff),
        ins(BPF_JGT_K, 1, 0, 1),
        ins(BPF_RET_K, 0, 0, cm),
        ins(BPF_ALU_RSH_K, 0, 0, SLOT_SHIFT),
    ];
    for &(index, slot) in map {
        p.push(ins(BPF_JEQ_K, 0, 1, slot));
        p.push(ins(BPF_RET_K, 0, 0, index));
    }
    p.push(ins(BPF_RET_K, 0, 0, NO_INDEX));
    p
}

/// Makes `prog` the steering program of `sock`'s reuseport group.
fn attach(sock: &OwnedFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: passes a pointer to a live sock_fprog and its size; the
    // kernel copies the `len` instructions it points to, which `prog`
    // holds for the call.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

// ------------------------------------------------------------ locks

/// A slot: the exclusive `flock` on its file.
struct SlotLock {
    _file: File,
    slot: u32,
}

fn state_err(path: &Path) -> impl FnOnce(io::Error) -> JoinError + '_ {
    move |err| JoinError::State {
        path: path.to_owned(),
        err,
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The device's state directory: `/run/user/<uid>/uroce/<ip>` if that
/// runtime directory is the user's, else `/tmp/uroce-<uid>/<ip>`; each
/// level private to the user. Made from the user and the address alone,
/// never from the environment (`XDG_RUNTIME_DIR`, `TMPDIR`): two
/// processes of one user in different environments share one reuseport
/// group, so they must find one set of slot locks, or both would take
/// the same slot.
fn state_dir(ip: IpAddr) -> Result<PathBuf, JoinError> {
    let uid = euid();
    let run = PathBuf::from(format!("/run/user/{uid}"));
    let base = if std::fs::metadata(&run).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        run.join("uroce")
    } else {
        PathBuf::from(format!("/tmp/uroce-{uid}"))
    };
    let dir = base.join(ip.to_string());
    for d in [&base, &dir] {
        private_dir(d, uid).map_err(state_err(d))?;
    }
    Ok(dir)
}

/// Makes `d` (mode 0700) unless it exists; it must be a directory (not a
/// link) of `uid` that no one else can write.
fn private_dir(d: &Path, uid: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(d) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let m = std::fs::symlink_metadata(d)?;
    if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("not a private directory of user {uid}"),
        ));
    }
    Ok(())
}

/// `flock(fd, op)`; false where a non-blocking lock is held elsewhere.
fn flock(f: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor `f` owns.
        if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(e),
        }
    }
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The group lock, held while the group's membership or program changes.
fn lock_group(dir: &Path) -> Result<File, JoinError> {
    let path = dir.join("group.lock");
    let f = open_lock_file(&path).map_err(state_err(&path))?;
    flock(&f, libc::LOCK_EX).map_err(state_err(&path))?;
    Ok(f)
}

/// The first free slot (its file records the holder's pid).
fn take_slot(dir: &Path) -> Result<SlotLock, JoinError> {
    for slot in 0..SLOTS {
        let path = dir.join(format!("slot-{slot}"));
        let mut f = open_lock_file(&path).map_err(state_err(&path))?;
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).map_err(state_err(&path))? {
            let _ = f.set_len(0);
            let _ = writeln!(f, "{}", std::process::id());
            return Ok(SlotLock { _file: f, slot });
        }
    }
    Err(JoinError::Full)
}

/// Whether a live process holds the slot whose file is `path`.
fn slot_held(path: &Path) -> bool {
    let Ok(f) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return false;
    };
    // Free if a shared lock is granted at once (dropping the file
    // releases it).
    !flock(&f, libc::LOCK_SH | libc::LOCK_NB).unwrap_or(true)
}

// ------------------------------------------------------------ other users

/// The owner of the socket bound to UDP 4791 on `ip`, as
/// `/proc/net/udp{,6}` lists it. Not one bound to the wildcard address:
/// uroce binds the device's own, and kernel rxe's socket (the wildcard,
/// owned by root) is no other user's device.
pub fn port_holder(ip: IpAddr) -> Option<u32> {
    let (file, want) = match ip {
        IpAddr::V4(a) => (
            "/proc/net/udp",
            format!("{:08X}", u32::from_ne_bytes(a.octets())),
        ),
        IpAddr::V6(a) => (
            "/proc/net/udp6",
            a.octets()
                .chunks(4)
                .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                .collect(),
        ),
    };
    let port = format!("{:04X}", uroce_wire::ROCEV2_UDP_PORT);
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (addr, p) = f.get(1)?.split_once(':')?;
        if p == port && addr == want {
            f.get(7)?.parse().ok()
        } else {
            None
        }
    })
}

/// The user holding UDP 4791 on `ip`, if it is not this one (the reason
/// a bind that joins the group failed).
pub fn other_user(ip: IpAddr) -> Option<u32> {
    port_holder(ip).filter(|&u| u != euid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn reuse_socket(ip: IpAddr) -> UdpSocket {
        let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
        s.set_reuse_port(true).unwrap();
        s.bind(&SocketAddr::new(ip, 4791).into()).unwrap();
        s.set_nonblocking(true).unwrap();
        s.into()
    }

    /// A BTH-like datagram to `qpn`.
    fn to_qp(qpn: u32) -> [u8; 12] {
        let mut p = [0u8; 12];
        p[0] = 0x04; // RC SEND ONLY
        p[4..8].copy_from_slice(&qpn.to_be_bytes());
        p
    }

    /// Which of `socks` got what was sent (one datagram each time).
    fn receiver(socks: &[Option<UdpSocket>], tx: &UdpSocket, to: SocketAddr, pkt: &[u8]) -> usize {
        tx.send_to(pkt, to).unwrap();
        let until = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 64];
        loop {
            for (i, s) in socks.iter().enumerate() {
                if let Some(s) = s {
                    if s.recv(&mut buf).is_ok() {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < until, "nobody received");
            std::thread::yield_now();
        }
    }

    /// The program steers by the destination QP's slot, QP1 to the lowest
    /// slot, probes by the index they name; and the kernel moves the last
    /// socket into a closed one's place (what probing is for).
    #[test]
    fn program_steers_by_slot() {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 133, 0, 1));
        let to = SocketAddr::new(ip, 4791);
        let mut socks: Vec<Option<UdpSocket>> = (0..3).map(|_| Some(reuse_socket(ip))).collect();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Socket i holds slot 5 + 7 * i.
        let map: Vec<(u32, u32)> = (0..3).map(|i| (i, 5 + 7 * i)).collect();
        let fd: OwnedFd = socks[0].as_ref().unwrap().try_clone().unwrap().into();
        attach(&fd, &program(&map)).unwrap();
        for i in 0..3u32 {
            let qpn = (5 + 7 * i) << SLOT_SHIFT | 0x1234;
            assert_eq!(receiver(&socks, &tx, to, &to_qp(qpn)), i as usize);
            assert_eq!(receiver(&socks, &tx, to, &probe(i, 9)), i as usize);
        }
        assert_eq!(receiver(&socks, &tx, to, &to_qp(1)), 0);
        // Socket 0 leaves as `Member::leave` does: the program for the
        // group without it first, then the close.
        let fd1: OwnedFd = socks[1].as_ref().unwrap().try_clone().unwrap().into();
        attach(&fd1, &program(&after_leaving(&map, 5).unwrap())).unwrap();
        drop(fd);
        socks[0] = None;
        // Socket 2 now sits at index 0, probes find it there, and the
        // program sends its slot's datagrams there.
        assert_eq!(receiver(&socks, &tx, to, &probe(0, 9)), 2);
        assert_eq!(receiver(&socks, &tx, to, &probe(1, 9)), 1);
        for (slot, sock) in [(19, 2), (12, 1)] {
            for k in 0..8 {
                // From other source ports: no luck of the flow hash.
                let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
                let qpn = slot << SLOT_SHIFT | k;
                assert_eq!(receiver(&socks, &tx, to, &to_qp(qpn)), sock);
            }
        }
    }

    #[test]
    fn screen_drops_only_live_foreign_slots() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let st = Steer {
            slot: 2,
            ip,
            live: AtomicU64::new(0b1110),
        };
        let from = SocketAddr::new(ip, 5000);
        let remote = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 5000);
        assert_eq!(
            st.screen(&to_qp(2 << SLOT_SHIFT | 7), from),
            Screen::Deliver
        );
        assert_eq!(
            st.screen(&to_qp(3 << SLOT_SHIFT | 7), from),
            Screen::Foreign
        );
        assert_eq!(
            st.screen(&to_qp(9 << SLOT_SHIFT | 7), from),
            Screen::Deliver
        );
        assert_eq!(st.screen(&to_qp(1), from), Screen::Deliver);
        assert_eq!(st.screen(&to_qp(0xff_ffff), from), Screen::Deliver);
        assert_eq!(st.screen(&[1, 2, 3], from), Screen::Deliver);
        assert_eq!(st.screen(&probe(0, 1), from), Screen::Probe);
        assert_eq!(st.screen(&probe(0, 1), remote), Screen::Deliver);
        let a = st.answer(&probe(4, 77));
        assert_eq!(&a[1..4], &ANSWER_MAGIC);
        assert_eq!(a[8..12], 4u32.to_be_bytes());
        assert_eq!(a[12..20], 77u64.to_be_bytes());
        assert_eq!(a[20..24], 2u32.to_be_bytes());
    }

    #[test]
    fn leaving_moves_the_last_socket_into_its_place() {
        let map = [(0, 4), (1, 0), (2, 9)];
        assert_eq!(after_leaving(&map, 4), Some(vec![(1, 0), (0, 9)]));
        assert_eq!(after_leaving(&map, 9), Some(vec![(0, 4), (1, 0)]));
        assert_eq!(after_leaving(&map, 7), None);
        assert_eq!(after_leaving(&[(0, 3)], 3), Some(vec![]));
    }

    #[test]
    fn covers_wants_each_live_slot_once() {
        assert!(covers(&[(0, 3), (1, 0)], 0b1001));
        assert!(!covers(&[(0, 3)], 0b1001));
        assert!(!covers(&[(0, 3), (1, 3)], 0b1000));
        assert!(!covers(&[(0, 3), (1, 4)], 0b1000));
    }

    #[test]
    fn port_holder_names_the_owner() {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 133, 0, 2));
        assert_eq!(port_holder(ip), None);
        let _s = UdpSocket::bind(SocketAddr::new(ip, 4791)).unwrap();
        assert_eq!(port_holder(ip), Some(euid()));
        assert_eq!(other_user(ip), None);
    }

    #[test]
    fn slots_are_exclusive_until_released() {
        let dir = std::env::temp_dir().join(format!("uroce-slot-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = take_slot(&dir).unwrap();
        let b = take_slot(&dir).unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        assert!(slot_held(&dir.join("slot-0")));
        drop(a);
        assert!(!slot_held(&dir.join("slot-0")));
        assert_eq!(take_slot(&dir).unwrap().slot, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
