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
//!   recovers it once the program is rebuilt. A forwarded MAD (below)
//!   steered so is kept and sent again as soon as the member's helper has
//!   rebuilt the program ([`Steer::misrouted_forward`]). A datagram of a dead slot
//!   reaches no QP either (its QPNs are nobody's until the slot is taken
//!   again), as a kernel device drops one for a destroyed QP.
//! - **QP1.** Datagrams to QP 0 and 1 go to the member with the lowest
//!   slot. Its CM agent reads each MAD and *forwards* the ones another
//!   member owns (see `cm`): a communication ID carries its process's
//!   slot in its top bits as a QPN does, and a REQ belongs to the member
//!   that holds the device-wide listen lock of its service ID. A forward
//!   is a datagram to the device's own address with a header of its own
//!   ([`forward_header`]) that the program steers by the owner's slot, so
//!   it needs no socket of its own: the engine that receives it hands the
//!   packet inside to its endpoint as if it had come from the original
//!   sender. A MAD whose owner has exited is answered as the kernel's CM
//!   answers one from time-wait (a DREQ with a DREP).
//!
//! `UROCE_SHARE=0` turns sharing off: the socket binds alone (a second
//! process gets EADDRINUSE) and QPNs use all 24 bits, as before.

use crate::userdir::{euid, private_dir};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uroce_wire::bth::Bth;

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
/// asked for (8..12, the word the program returns), a nonce (12..20), the
/// slots the prober found held (20..28).
const PROBE_LEN: usize = 28;
/// An answer: the probe with [`ANSWER_MAGIC`], then the slot (28..32).
const ANSWER_LEN: usize = 32;
/// The destination QP of a forward (in the reserved slot).
const FORWARD_QPN: u32 = 0xff_fffd;
/// A forward's first byte (beside the probe's).
const FORWARD_OP: u8 = 0xfd;
const FORWARD_MAGIC: [u8; 3] = *b"uRF";
/// A forward's header: opcode, magic, destination QP (bytes 5-7), the
/// owner's slot (8, what the program steers by), the packet's TOS (9),
/// its UDP source port (10..12) and source address (12..28, IPv6 or
/// IPv4-mapped); the packet as it came follows.
pub const FORWARD_LEN: usize = 28;
/// How often a member's helper looks at the set of held slots.
pub const WATCH: Duration = Duration::from_millis(100);
/// How long one round of probes waits for its answers.
const PROBE_WAIT: Duration = Duration::from_millis(100);
/// Rounds of probes before a rebuild settles for what it found.
const PROBE_ROUNDS: usize = 20;

/// Whether devices are shared (`UROCE_SHARE=0` turns it off).
pub fn enabled() -> bool {
    !crate::env::turned_off("UROCE_SHARE")
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
    /// A packet another member forwarded to this one (see
    /// [`forward_header`]): the packet follows the header.
    Forward(Forwarded),
}

/// What a forward's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    /// The slot it is for.
    pub slot: u32,
    /// The packet's sender.
    pub from: SocketAddr,
    /// The packet's TOS as received.
    pub tclass: u8,
}

/// The header of a forward of a packet from `from` (received with TOS
/// `tclass`) to the member of `slot`; the packet follows it.
pub fn forward_header(slot: u32, from: SocketAddr, tclass: u8) -> [u8; FORWARD_LEN] {
    let mut h = [0u8; FORWARD_LEN];
    h[0] = FORWARD_OP;
    h[1..4].copy_from_slice(&FORWARD_MAGIC);
    h[4..8].copy_from_slice(&FORWARD_QPN.to_be_bytes());
    h[8] = slot as u8;
    h[9] = tclass;
    h[10..12].copy_from_slice(&from.port().to_be_bytes());
    let ip = match from.ip() {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    h[12..28].copy_from_slice(&ip.octets());
    h
}

fn parse_forward(h: &[u8]) -> Option<Forwarded> {
    let h = h.get(..FORWARD_LEN)?;
    if h[0] != FORWARD_OP || h[1..4] != FORWARD_MAGIC {
        return None;
    }
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&h[12..28]);
    let ip = IpAddr::V6(std::net::Ipv6Addr::from(ip)).to_canonical();
    Some(Forwarded {
        slot: u32::from(h[8]),
        from: SocketAddr::new(ip, u16::from_be_bytes([h[10], h[11]])),
        tclass: h[9],
    })
}

/// What the engine's receive path knows of the group: its own slot and
/// the slots held (updated by the helper).
#[derive(Debug)]
pub struct Steer {
    slot: u32,
    ip: IpAddr,
    /// Bit `s`: slot `s` is held by a live member.
    live: AtomicU64,
    /// The helper thread, woken when a probe shows that the group changed
    /// (a member alone sleeps until then).
    helper: std::sync::OnceLock<std::thread::Thread>,
    /// A probe changed `live`: the helper's map is out of date.
    stale: AtomicBool,
    /// Forwards that reached this member while the group changed, for the
    /// helper to send again once it has rebuilt the program (see
    /// [`Steer::misrouted_forward`]).
    retry: parking_lot::Mutex<Vec<Vec<u8>>>,
}

/// Most misrouted forwards a member keeps to send again.
const RETRY_MAX: usize = 16;

impl Steer {
    fn new(slot: u32, ip: IpAddr, live: u64) -> Steer {
        Steer {
            slot,
            ip,
            live: AtomicU64::new(live),
            helper: std::sync::OnceLock::new(),
            stale: AtomicBool::new(false),
            retry: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// A forward `pkt` (a MAD for another live member) that the program
    /// steered here: the group changed (a member exited, and the kernel
    /// moved another socket into its place) and the program is not rebuilt
    /// yet. Kept for the helper, which rebuilds at once and sends it again
    /// (once: byte 4, which no QPN uses, marks a forward sent again; one
    /// that comes back is dropped). Dropped, it cost the connection a
    /// resent MAD: 4.3 s (a librpma server's DREQ to its second client,
    /// forwarded just after the first client exited). Returns whether it
    /// was kept.
    pub fn misrouted_forward(&self, pkt: &[u8]) -> bool {
        let mut q = self.retry.lock();
        if pkt.len() < FORWARD_LEN || pkt[4] != 0 || q.len() >= RETRY_MAX {
            return false;
        }
        let mut again = pkt.to_vec();
        again[4] = 1;
        q.push(again);
        drop(q);
        self.stale.store(true, Ordering::Relaxed);
        if let Some(t) = self.helper.get() {
            t.unpark();
        }
        true
    }
    /// The process's slot.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Where a received datagram goes: a datagram of this member's slot
    /// (the steady state) costs a load and a compare.
    #[inline]
    pub fn screen(&self, pkt: &[u8], from: SocketAddr) -> Screen {
        let Ok(bth) = Bth::new_checked(pkt) else {
            return Screen::Deliver;
        };
        let dqp = bth.dest_qp();
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
        // A forward comes from another member's socket: the device's own
        // address and port, which only this user's sockets can bind (the
        // reuseport group is the user's). What it carries is a MAD for
        // QP1, nothing else.
        if dqp == FORWARD_QPN
            && from == SocketAddr::new(self.ip, uroce_wire::ROCEV2_UDP_PORT)
            && pkt
                .get(FORWARD_LEN..)
                .and_then(|p| Bth::new_checked(p).ok())
                .is_some_and(|b| b.dest_qp() == uroce_wire::mad::GSI_QPN)
        {
            if let Some(f) = parse_forward(pkt) {
                return Screen::Forward(f);
            }
        }
        // QP0/QP1 (slot 0's numbers, every process's CM) and numbers of
        // no live member go to the endpoint, as without sharing.
        if dqp > 1 && s < SLOTS && self.live.load(Ordering::Relaxed) & (1 << s) != 0 {
            Screen::Foreign
        } else {
            Screen::Deliver
        }
    }

    /// The answer to probe `pkt` ([`Screen::Probe`]). The probe says
    /// which slots the prober found held: they are this member's view
    /// from now on, and its helper looks again (a member that was alone
    /// sleeps until a probe comes).
    pub fn answer(&self, pkt: &[u8]) -> [u8; ANSWER_LEN] {
        let mut a = [0u8; ANSWER_LEN];
        a[..PROBE_LEN].copy_from_slice(&pkt[..PROBE_LEN]);
        a[1..4].copy_from_slice(&ANSWER_MAGIC);
        a[PROBE_LEN..].copy_from_slice(&self.slot.to_be_bytes());
        let mut held = [0u8; 8];
        held.copy_from_slice(&pkt[20..28]);
        let held = u64::from_be_bytes(held) & ((1 << SLOTS) - 1);
        let held = held | 1 << self.slot;
        if self.live.swap(held, Ordering::Relaxed) != held {
            self.stale.store(true, Ordering::Relaxed);
            if let Some(t) = self.helper.get() {
                t.unpark();
            }
        }
        a
    }

    /// Whether a live member holds `slot` (as far as this one knows: a
    /// member killed in the last [`WATCH`] may still count).
    pub fn is_live(&self, slot: u32) -> bool {
        slot < SLOTS && self.live.load(Ordering::Relaxed) & (1 << slot) != 0
    }

    /// Whether this member is the group's only one.
    pub fn alone(&self) -> bool {
        self.live.load(Ordering::Relaxed) == 1 << self.slot
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
    group: Held,
    slot: SlotLock,
    steer: Arc<Steer>,
}

impl Joining {
    /// Takes the device's group lock, then a free slot.
    pub fn begin(ip: IpAddr) -> Result<Joining, JoinError> {
        let dir = state_dir(ip)?;
        let group = lock_group(&dir)?;
        let slot = take_slot(&dir)?;
        let steer = Arc::new(Steer::new(slot.slot, ip, 1 << slot.slot));
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
        let dir = self.dir.clone();
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
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        // Looks at the held slots every WATCH while the member has
        // company; alone, it sleeps (no system call) until a joining
        // member's probe wakes it (`Steer::answer`).
        let helper = crate::threads::spawn(format!("uroce-share-{ip}"), move || {
            while !stopped.load(Ordering::Acquire) {
                if group.steer.alone() && group.map.is_some() {
                    std::thread::park();
                } else {
                    std::thread::park_timeout(WATCH);
                }
                if stopped.load(Ordering::Acquire) {
                    break;
                }
                group.watch();
            }
            group
        })?;
        let _ = steer.helper.set(helper.thread().clone());
        Ok(Member {
            cm: Arc::new(CmShare {
                steer: steer.clone(),
                dir,
            }),
            steer,
            stop,
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
    cm: Arc<CmShare>,
    stop: Arc<AtomicBool>,
    helper: Option<std::thread::JoinHandle<Group>>,
    slot: Option<SlotLock>,
    leaving: Option<Held>,
}

impl Member {
    /// What the receive path needs.
    pub fn steer(&self) -> &Arc<Steer> {
        &self.steer
    }

    /// What the device's CM agent asks of the group.
    pub fn cm(&self) -> Arc<CmShare> {
        self.cm.clone()
    }

    /// Stops the helper thread and closes its copy of the socket (the
    /// socket leaves the group when the engine closes its own).
    fn stop_helper(&mut self) -> Option<Group> {
        self.stop.store(true, Ordering::Release);
        let h = self.helper.take()?;
        h.thread().unpark();
        h.join().ok()
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
    /// did not answer in time), or a probe showed that the group changed.
    fn watch(&mut self) {
        let stale = self.steer.stale.swap(false, Ordering::Relaxed);
        let same = !stale && self.live_slots() == self.steer.live.load(Ordering::Relaxed);
        if same && self.map.is_some() {
            return;
        }
        let Ok(_g) = lock_group(&self.dir) else {
            return;
        };
        // A member that did not answer gets one round a look (a stopped
        // process must not keep the group lock held).
        self.rebuild(self.live_slots(), if same { 1 } else { PROBE_ROUNDS });
        // Forwards steered here meanwhile, to their owners now.
        let again = std::mem::take(&mut *self.steer.retry.lock());
        let to = SocketAddr::new(self.ip, uroce_wire::ROCEV2_UDP_PORT);
        let sock = socket2::SockRef::from(&self.sock);
        for p in again {
            let _ = sock.send_to(&p, &to.into());
        }
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
            match self.probe(live.count_ones(), live) {
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
    fn probe(&self, n: u32, held: u64) -> io::Result<Vec<(u32, u32)>> {
        let s = UdpSocket::bind(SocketAddr::new(self.ip, 0))?;
        let to = SocketAddr::new(self.ip, uroce_wire::ROCEV2_UDP_PORT);
        let nonce: u64 = rand::random();
        for i in 0..n {
            s.send_to(&probe(i, nonce, held), to)?;
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
            let slot = u32::from_be_bytes([a[28], a[29], a[30], a[31]]);
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

/// A probe for socket index `index` from a member that found the slots
/// `held` held.
fn probe(index: u32, nonce: u64, held: u64) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[0] = PROBE_OP;
    p[1..4].copy_from_slice(&PROBE_MAGIC);
    p[4..8].copy_from_slice(&PROBE_QPN.to_be_bytes());
    p[8..12].copy_from_slice(&index.to_be_bytes());
    p[12..20].copy_from_slice(&nonce.to_be_bytes());
    p[20..28].copy_from_slice(&held.to_be_bytes());
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
const BPF_JA: u16 = 0x05;
/// An index no group has: the kernel picks by flow hash.
const NO_INDEX: u32 = u32::MAX;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The steering program for `map` ((socket index, slot) pairs), run on
/// each datagram's UDP payload: a probe goes to the index it names; a
/// forward to its slot's socket; QP 0 and 1 to the lowest slot's socket;
/// any other QPN to its slot's socket; a slot not in the map by flow
/// hash.
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
        ins(BPF_JEQ_K, 0, 2, FORWARD_OP as u32),
        // A forward: its slot byte, to the slot table (past the shift).
        ins(BPF_LD_B_ABS, 0, 0, 8),
        ins(BPF_JA, 0, 0, 5),
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

// ------------------------------------------------------------ the CM

/// What the device's CM agent asks of the group (see
/// [`crate::cm::CmGroup`]): whose communication IDs are live, who
/// listens on a service ID, and the device-wide listen locks.
#[derive(Debug)]
pub struct CmShare {
    steer: Arc<Steer>,
    dir: PathBuf,
}

/// Byte of a listen lock file that the listener holds (an OFD lock: one
/// listener a service); the byte at its slot tells who it is.
const LISTEN_BYTE: i64 = SLOTS as i64 + 1;

/// A device-wide listen: the OFD locks on its file's bytes, released
/// with the file (by the kernel when the process dies).
#[derive(Debug)]
struct ListenLock(#[allow(dead_code)] Held);

impl CmShare {
    fn listen_path(&self, service_id: u64) -> PathBuf {
        self.dir.join(format!("listen-{service_id:016x}"))
    }
}

impl crate::cm::CmGroup for CmShare {
    fn slot(&self) -> u32 {
        self.steer.slot
    }

    fn is_live(&self, slot: u32) -> bool {
        self.steer.is_live(slot)
    }

    fn alone(&self) -> bool {
        self.steer.alone()
    }

    fn claim(&self, service_id: u64) -> Option<Box<dyn std::fmt::Debug + Send>> {
        let f = open_lock_file(&self.listen_path(service_id)).ok()?;
        // The listener's byte first (a second listener fails there), then
        // the byte that names its slot.
        if !ofd_lock(&f, LISTEN_BYTE).ok()? || !ofd_lock(&f, i64::from(self.steer.slot)).ok()? {
            return None;
        }
        Some(Box::new(ListenLock(Held(f))))
    }

    fn listener(&self, service_id: u64) -> Option<u32> {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(self.listen_path(service_id))
            .ok()?;
        ofd_holder(&f, 0, SLOTS as i64)
    }

    fn write_forward_header(
        &self,
        slot: u32,
        from: SocketAddr,
        tclass: u8,
        buf: &mut [u8],
    ) -> usize {
        buf[..FORWARD_LEN].copy_from_slice(&forward_header(slot, from, tclass));
        FORWARD_LEN
    }
}

/// An open file description lock (`F_OFD_SETLK`) on byte `at` of `f`,
/// exclusive; false where another description holds it.
fn ofd_lock(f: &File, at: i64) -> io::Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of the C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = at;
    l.l_len = 1;
    // SAFETY: fcntl on a descriptor `f` owns, with a pointer to a live
    // `flock` the call reads.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLK, &l) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// The first byte of `start..start + len` in `f` another open file
/// description holds a lock on (`F_OFD_GETLK`), as an offset from
/// `start`.
fn ofd_holder(f: &File, start: i64, len: i64) -> Option<u32> {
    // SAFETY: an all-zero `flock` is a valid value of the C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = start;
    l.l_len = len;
    // SAFETY: fcntl on a descriptor `f` owns, with a pointer to a live
    // `flock` the call fills in.
    if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut l) } != 0 {
        return None;
    }
    (l.l_type != libc::F_UNLCK as libc::c_short).then(|| (l.l_start - start) as u32)
}

// ------------------------------------------------------------ locks

/// A slot: the exclusive `flock` on its file.
struct SlotLock {
    _file: Held,
    slot: u32,
}

/// A lock file this process holds a lock on (`flock`, or OFD locks on its
/// bytes), unlocked when dropped, then closed. Both kinds of lock belong
/// to the open file description, which a child of `fork()` shares: closing
/// our descriptor alone would leave the lock held for as long as the child
/// lives, and a child that then takes the same lock (opening the device
/// itself) would wait for ever on its own inherited copy. (A process that
/// dies holding one still leaves it to its children: they hold the
/// description until they exit.)
#[derive(Debug)]
struct Held(File);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = flock(&self.0, libc::LOCK_UN);
        // SAFETY: an all-zero `flock` is a valid value of the C struct.
        let mut l: libc::flock = unsafe { std::mem::zeroed() };
        l.l_type = libc::F_UNLCK as libc::c_short;
        l.l_whence = libc::SEEK_SET as libc::c_short;
        // l_start 0, l_len 0: every byte.
        // SAFETY: fcntl on a descriptor `self.0` owns, with a pointer to
        // a live `flock` the call reads.
        unsafe { libc::fcntl(self.0.as_raw_fd(), libc::F_OFD_SETLK, &l) };
    }
}

fn state_err(path: &Path) -> impl FnOnce(io::Error) -> JoinError + '_ {
    move |err| JoinError::State {
        path: path.to_owned(),
        err,
    }
}

/// The device's state directory: `/run/user/<uid>/uroce/<ip>` if that
/// runtime directory is the user's, else `/tmp/uroce-<uid>/<ip>`; each
/// level private to the user. Made from the user and the address alone,
/// never from the environment (`XDG_RUNTIME_DIR`, `TMPDIR`): two
/// processes of one user in different environments share one reuseport
/// group, so they must find one set of slot locks, or both would take
/// the same slot.
fn state_dir(ip: IpAddr) -> Result<PathBuf, JoinError> {
    let base = user_base();
    let dir = base.join(ip.to_string());
    for d in [&base, &dir] {
        private_dir(d).map_err(state_err(d))?;
    }
    Ok(dir)
}

/// The user's directory of device states (see [`state_dir`]).
fn user_base() -> PathBuf {
    let uid = euid();
    let run = PathBuf::from(format!("/run/user/{uid}"));
    if std::fs::metadata(&run).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
        run.join("uroce")
    } else {
        PathBuf::from(format!("/tmp/uroce-{uid}"))
    }
}

// ------------------------------------------------------------ ports

/// What an rdma_cm port is bound to, for [`claim_port`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortAddr {
    /// A device's address.
    Ip(IpAddr),
    /// Every address of a family (`v6`), restricted to it or not
    /// (`afonly`: an IPv6 wildcard without it takes IPv4 too).
    Any {
        /// IPv6.
        v6: bool,
        /// Restricted to its family.
        afonly: bool,
    },
}

/// A port of rdma_cm's port space held by this process for the host's
/// processes of the user, as the kernel's port space is the host's: the
/// OFD locks on the port's byte in its address's file under `ports/`,
/// which the kernel releases with the process.
#[derive(Debug)]
pub struct PortClaim(#[allow(dead_code)] Vec<Held>);

/// Claims `port` of port space `ps` on `addr` unless another process
/// holds it where it clashes (the kernel CMA's `cma_check_port`): the
/// same address, or a wildcard of the family on either side. `Ok(None)`:
/// taken.
pub fn claim_port(ps: u16, addr: PortAddr, port: u16) -> io::Result<Option<PortClaim>> {
    let base = user_base();
    let dir = base.join("ports");
    private_dir(&base)?;
    private_dir(&dir)?;
    let name = |a: &PortAddr| match a {
        PortAddr::Ip(ip) => format!("{ps}-{}", ip.to_canonical()),
        PortAddr::Any { v6: false, .. } => format!("{ps}-any4"),
        PortAddr::Any { v6: true, .. } => format!("{ps}-any6"),
    };
    let is_v6 = |n: &str| n.ends_with("any6") || n.contains(':');
    // The files whose holders clash with this bind.
    let check: Vec<String> = match addr {
        PortAddr::Ip(ip) => {
            let any = PortAddr::Any {
                v6: !ip.to_canonical().is_ipv4(),
                afonly: true,
            };
            vec![name(&addr), name(&any)]
        }
        PortAddr::Any { v6, afonly } => std::fs::read_dir(&dir)?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("{ps}-")))
            .filter(|n| (v6 && !afonly) || is_v6(n) == v6)
            .collect(),
    };
    let mut take = vec![name(&addr)];
    if let PortAddr::Any {
        v6: true,
        afonly: false,
    } = addr
    {
        take.push(name(&PortAddr::Any {
            v6: false,
            afonly: true,
        }));
    }
    // One bind at a time on the host: a look and a lock in one step.
    let _g = {
        let f = open_lock_file(&dir.join("ports.lock"))?;
        flock(&f, libc::LOCK_EX)?;
        Held(f)
    };
    for n in &check {
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(n))
        else {
            continue;
        };
        if ofd_holder(&f, i64::from(port), 1).is_some() {
            return Ok(None);
        }
    }
    let mut held = Vec::new();
    for n in &take {
        let f = open_lock_file(&dir.join(n))?;
        if !ofd_lock(&f, i64::from(port))? {
            return Ok(None);
        }
        held.push(Held(f));
    }
    Ok(Some(PortClaim(held)))
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
fn lock_group(dir: &Path) -> Result<Held, JoinError> {
    let path = dir.join("group.lock");
    let f = open_lock_file(&path).map_err(state_err(&path))?;
    flock(&f, libc::LOCK_EX).map_err(state_err(&path))?;
    Ok(Held(f))
}

/// The first free slot (its file records the holder's pid).
fn take_slot(dir: &Path) -> Result<SlotLock, JoinError> {
    for slot in 0..SLOTS {
        let path = dir.join(format!("slot-{slot}"));
        let mut f = open_lock_file(&path).map_err(state_err(&path))?;
        if flock(&f, libc::LOCK_EX | libc::LOCK_NB).map_err(state_err(&path))? {
            let _ = f.set_len(0);
            let _ = writeln!(f, "{}", std::process::id());
            return Ok(SlotLock {
                _file: Held(f),
                slot,
            });
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
    // Free if a shared lock is granted at once (released at once, see
    // `Held`).
    let free = flock(&f, libc::LOCK_SH | libc::LOCK_NB).unwrap_or(true);
    drop(Held(f));
    !free
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
            assert_eq!(receiver(&socks, &tx, to, &probe(i, 9, 0)), i as usize);
            // A forward goes to its slot's socket, whatever QP it names.
            let from = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 49152);
            let mut fwd = forward_header(5 + 7 * i, from, 0).to_vec();
            fwd.extend_from_slice(&to_qp(1));
            assert_eq!(receiver(&socks, &tx, to, &fwd), i as usize);
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
        assert_eq!(receiver(&socks, &tx, to, &probe(0, 9, 0)), 2);
        assert_eq!(receiver(&socks, &tx, to, &probe(1, 9, 0)), 1);
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
    fn a_misrouted_forward_is_kept_once() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let st = Steer::new(2, ip, 0b1110);
        let mut fwd = forward_header(3, SocketAddr::new(ip, 4791), 0).to_vec();
        fwd.extend_from_slice(&[0u8; 64]);
        assert!(st.misrouted_forward(&fwd));
        assert!(
            st.stale.load(Ordering::Relaxed),
            "the helper rebuilds at once"
        );
        let again = st.retry.lock()[0].clone();
        assert_eq!((again[4], &again[5..]), (1, &fwd[5..]));
        // Sent again and misrouted again: dropped, no loop.
        assert!(!st.misrouted_forward(&again));
        for _ in 1..RETRY_MAX {
            assert!(st.misrouted_forward(&fwd));
        }
        assert!(!st.misrouted_forward(&fwd), "bounded");
    }

    #[test]
    fn screen_drops_only_live_foreign_slots() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let st = Steer::new(2, ip, 0b1110);
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
        assert_eq!(st.screen(&probe(0, 1, 0), from), Screen::Probe);
        assert_eq!(st.screen(&probe(0, 1, 0), remote), Screen::Deliver);
        let mut fwd = forward_header(3, remote, 0x48).to_vec();
        fwd.extend_from_slice(&to_qp(1));
        let want = Forwarded {
            slot: 3,
            from: remote,
            tclass: 0x48,
        };
        let member = SocketAddr::new(ip, 4791);
        assert_eq!(st.screen(&fwd, member), Screen::Forward(want));
        // Only from a member's socket (the device's own address and
        // port), and only a packet for QP1.
        assert_eq!(st.screen(&fwd, from), Screen::Deliver);
        assert_eq!(st.screen(&fwd, remote), Screen::Deliver);
        fwd[FORWARD_LEN + 7] = 2;
        assert_eq!(st.screen(&fwd, member), Screen::Deliver);
        // The prober's view of the held slots becomes this member's.
        let a = st.answer(&probe(4, 77, 0b1_0000_0001));
        assert_eq!(&a[1..4], &ANSWER_MAGIC);
        assert_eq!(a[8..12], 4u32.to_be_bytes());
        assert_eq!(a[12..20], 77u64.to_be_bytes());
        assert_eq!(a[28..32], 2u32.to_be_bytes());
        assert!(st.is_live(8) && st.is_live(2) && !st.is_live(3));
        assert!(!st.alone());
    }

    #[test]
    fn a_forward_names_its_sender() {
        let v6: IpAddr = "fd00::7".parse().unwrap();
        for from in [
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9)), 4791),
            SocketAddr::new(v6, 50000),
        ] {
            let f = parse_forward(&forward_header(62, from, 3)).unwrap();
            assert_eq!((f.slot, f.from, f.tclass), (62, from, 3));
        }
        assert!(parse_forward(&[FORWARD_OP; 10]).is_none());
    }

    /// A listen is one process's: a second description of the lock file
    /// (another process, or another agent) is refused while the first
    /// holds it, and finds its slot.
    #[test]
    fn a_listen_claim_is_exclusive_and_names_its_slot() {
        use crate::cm::CmGroup;
        let dir = std::env::temp_dir().join(format!("uroce-listen-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let share = |slot| CmShare {
            steer: Arc::new(Steer::new(slot, IpAddr::V4(Ipv4Addr::LOCALHOST), 1 << slot)),
            dir: dir.clone(),
        };
        let (a, b) = (share(5), share(9));
        assert_eq!(b.listener(77), None);
        let claim = a.claim(77).expect("free");
        assert!(b.claim(77).is_none());
        assert_eq!(b.listener(77), Some(5));
        drop(claim);
        assert_eq!(b.listener(77), None);
        let _c = b.claim(77).expect("free again");
        assert_eq!(a.listener(77), Some(9));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// rdma_cm's ports, host-wide: the same address twice, or a wildcard
    /// against an address of its family, clash; other addresses do not.
    #[test]
    fn ports_clash_as_the_kernels_port_space() {
        let ps = 0x7e57; // no real port space
        let a = PortAddr::Ip("127.134.9.1".parse().unwrap());
        let b = PortAddr::Ip("127.134.9.2".parse().unwrap());
        let any4 = PortAddr::Any {
            v6: false,
            afonly: true,
        };
        let any6 = PortAddr::Any {
            v6: true,
            afonly: true,
        };
        let port = 40000 + (std::process::id() % 20000) as u16;
        let ca = claim_port(ps, a, port).unwrap().expect("free");
        assert!(claim_port(ps, a, port).unwrap().is_none());
        let cb = claim_port(ps, b, port).unwrap().expect("another address");
        assert!(claim_port(ps, any4, port).unwrap().is_none());
        let c6 = claim_port(ps, any6, port).unwrap().expect("IPv6 only");
        drop((ca, cb));
        let c4 = claim_port(ps, any4, port).unwrap().expect("free now");
        assert!(claim_port(ps, a, port).unwrap().is_none());
        drop((c4, c6));
        assert!(claim_port(ps, a, port).unwrap().is_some());
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
