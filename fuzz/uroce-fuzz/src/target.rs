//! What the fuzzer plays against: a target, reached through packets, and
//! observed (through the target agent, or directly on the simulated
//! network) after every case.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use uroce_provider::types::{QpState, QpType};
use uroce_wire::IpContext;

/// The connection between the fuzzer's (virtual) QP and the target's
/// fuzzed QP, as the target reported it when the QP was set up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conn {
    /// Transport of the fuzzed QP.
    #[serde(with = "crate::serde_qp::QpTypeDef")]
    pub qp_type: QpType,
    /// The target's address.
    pub target: IpAddr,
    /// The fuzzer's address (the fuzzed QP's peer).
    pub fuzzer: IpAddr,
    /// UDP source port of the fuzzer's packets.
    pub src_port: u16,
    /// The fuzzed QP.
    pub qpn: u32,
    /// The fuzzer's QP number (the fuzzed QP's destination QP).
    pub fuzzer_qpn: u32,
    /// The control QP on the target (connected to a peer of its own).
    pub control_qpn: u32,
    /// The PSN the fuzzed QP expects next (its receive PSN).
    pub rq_psn: u32,
    /// The PSN the fuzzed QP sends next.
    pub sq_psn: u32,
    /// The exposed region: address, length, rkey.
    pub va: u64,
    /// Its length.
    pub len: u32,
    /// Its rkey.
    pub rkey: u32,
    /// The rkey of a region without remote access.
    pub private_rkey: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Receive WRs posted on the fuzzed QP at set-up.
    pub recvs_posted: u32,
    /// Further keys the target exposes to the fuzzer beyond `rkey` and
    /// `private_rkey` (regions and windows with other rights, of another
    /// PD, deregistered, invalidated, ...): what the generator aims its
    /// key-confusion mutations at and what the reference model judges
    /// their answers by. Empty on targets that expose none; targets that
    /// expose them list the set [`EXPOSED_KEYS`] names, in its order, so
    /// that a case's [`crate::case::Key::Exposed`] index means the same
    /// key on every target.
    #[serde(default)]
    pub keys: Vec<ExposedKey>,
    /// Bytes each receive WR posted at set-up takes (None: not known;
    /// the reference model then leaves a message longer than the MTU
    /// open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recv_len: Option<u32>,
    /// The fuzzed QP's min_rnr_timer, the 5-bit code its RNR NAKs carry
    /// (IBA 9.7.5.2.8; None: not known, the reference model then takes
    /// any timer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rnr_timer: Option<u8>,
    /// The exposed region's `ibv_access_flags` ([`access`]; None: not
    /// known, taken as the three remote rights and nothing of FLUSH).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<u32>,
    /// The fuzzed QP's `qp_access_flags` ([`access`]; None: not known,
    /// the reference model then leaves open whether the QP takes an
    /// operation at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qp_access: Option<u32>,
    /// Which of IBA 1.5's placement operations the device implements, as
    /// its `device_cap_flags_ex` announce them: [`OPS_FLUSH`] (FLUSH
    /// global, bit 38) and [`OPS_ATOMIC_WRITE`] (bit 40). For a device
    /// without one, its opcode is reserved (IBA 9.6.1: dropped, or an
    /// invalid request). None: not known, taken as implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_1_5: Option<u8>,
}

/// [`Conn::ops_1_5`]: the device implements RDMA FLUSH.
pub const OPS_FLUSH: u8 = 1;
/// [`Conn::ops_1_5`]: the device implements ATOMIC WRITE.
pub const OPS_ATOMIC_WRITE: u8 = 2;

/// What kind of object a key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyKind {
    /// A memory region's R_Key.
    Region,
    /// A type 1 memory window (bound with `ibv_bind_mw`).
    Window1,
    /// A type 2 memory window (bound with a BIND_MW work request to one
    /// QP).
    Window2,
}

/// Whether a key can still be used, as the target set it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyState {
    /// Registered (region) or bound (window).
    Valid,
    /// The region was deregistered after the key was learnt.
    Deregistered,
    /// The window (or region) was invalidated (local or remote invalidate).
    Invalidated,
    /// The window was allocated but never bound (or bound to no memory).
    Unbound,
}

/// The keys a target exposes in [`Conn::keys`], in this order, by name.
/// Every range lies in memory of its own (never the exposed or private
/// region); the bytes no key lets the fuzzer write (the read-only,
/// local-only, other-PD and deregistered regions, the ranges of the
/// windows bound to another QP and invalidated) hold [`PATTERN`] at
/// set-up, and the target folds "they still do" into
/// [`Observation::private_intact`].
///
/// | name | object | rights (`ibv_access_flags`) |
/// |---|---|---|
/// | `read-only` | region | REMOTE_READ |
/// | `write-only` | region | LOCAL_WRITE, REMOTE_WRITE |
/// | `no-atomic` | region | LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ |
/// | `local-only` | region | none (local read) |
/// | `other-pd` | region of another PD | all remote rights |
/// | `deregistered` | region, deregistered after set-up | all remote rights |
/// | `zero-based` | region addressed from 0 | all remote rights |
/// | `window1` | type 1 window | all remote rights |
/// | `window2` | type 2 window bound to the fuzzed QP | all remote rights |
/// | `window2-other-qp` | type 2 window bound to another QP | all remote rights |
/// | `window2-invalidated` | type 2 window, bound then invalidated | all remote rights |
/// | `window-unbound` | type 1 window allocated, never bound | none |
///
/// On UD, where a type 2 window cannot be bound through the fuzzed QP,
/// `window2` and `window2-invalidated` are bound through another QP
/// (`bound_to_qp` false); UD has no RDMA operations to use them anyway.
pub const EXPOSED_KEYS: [&str; 12] = [
    "read-only",
    "write-only",
    "no-atomic",
    "local-only",
    "other-pd",
    "deregistered",
    "zero-based",
    "window1",
    "window2",
    "window2-other-qp",
    "window2-invalidated",
    "window-unbound",
];

/// `ibv_access_flags` bits, as [`ExposedKey::access`] holds them.
pub mod access {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub const LOCAL_WRITE: u32 = 1;
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: u32 = 2;
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: u32 = 4;
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: u32 = 8;
    /// IBV_ACCESS_MW_BIND.
    pub const MW_BIND: u32 = 16;
    /// IBV_ACCESS_ZERO_BASED.
    pub const ZERO_BASED: u32 = 32;
    /// IBV_ACCESS_FLUSH_GLOBAL (an RDMA FLUSH for global visibility).
    pub const FLUSH_GLOBAL: u32 = 1 << 8;
    /// IBV_ACCESS_FLUSH_PERSISTENT (an RDMA FLUSH for persistence).
    pub const FLUSH_PERSISTENT: u32 = 1 << 9;
    /// The three remote rights.
    pub const REMOTE: u32 = REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC;
}

/// One key the target exposes: the object's range and rights as the
/// target registered it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedKey {
    /// Which of [`EXPOSED_KEYS`] it is.
    pub name: String,
    /// The R_Key.
    pub key: u32,
    /// Region or window.
    pub kind: KeyKind,
    /// Start of the range as the key addresses it (0 when zero-based).
    pub va: u64,
    /// Length of the range in bytes.
    pub len: u32,
    /// `ibv_access_flags` bits the key was registered (or bound) with.
    pub access: u32,
    /// Whether the object belongs to the fuzzed QP's protection domain.
    pub same_pd: bool,
    /// Whether a type 2 window is bound to the fuzzed QP (meaningless for
    /// other kinds: true).
    pub bound_to_qp: bool,
    /// Usable, deregistered, invalidated or unbound.
    pub state: KeyState,
}

impl ExposedKey {
    /// Whether a correct responder lets a request on the fuzzed QP use
    /// this key for `need` (`access` bits) over `[va, va + len)`.
    pub fn grants(&self, need: u32, va: u64, len: u64) -> bool {
        let inside = va >= self.va
            && va - self.va <= u64::from(self.len)
            && len <= u64::from(self.len) - (va - self.va);
        self.state == KeyState::Valid
            && self.same_pd
            && self.bound_to_qp
            && self.access & need == need
            && inside
    }
}

impl Conn {
    /// The ICRC context of a packet from the fuzzer to the target.
    pub fn ip_context(&self) -> IpContext {
        IpContext::between(
            self.fuzzer,
            self.target,
            self.src_port,
            uroce_wire::ROCEV2_UDP_PORT,
        )
    }
}

/// One completion the target reported. The details after `recv` are
/// what the target reported of a successful completion (absent in case
/// files written before they were kept, and on targets that do not
/// report them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// Work request ID.
    pub wr_id: u64,
    /// Status (`ibv_wc_status` number).
    pub status: u32,
    /// Whether it came from the receive queue.
    pub recv: bool,
    /// Opcode (`ibv_wc_opcode` number: 128 RECV, 129 RECV_RDMA_WITH_IMM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opcode: Option<u32>,
    /// Bytes received (a receive), or transferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub byte_len: Option<u32>,
    /// Immediate data (when the completion has `IBV_WC_WITH_IMM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imm: Option<u32>,
    /// The R_Key a SEND with Invalidate invalidated (`IBV_WC_WITH_INV`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidated_rkey: Option<u32>,
    /// Source QP (UD receives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_qp: Option<u32>,
}

/// What the target lets the fuzzer see after a case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The target process (or guest) still answers.
    pub alive: bool,
    /// The fuzzed QP's state.
    #[serde(with = "crate::serde_qp::QpStateDef")]
    pub qp_state: QpState,
    /// Completions since the case began.
    pub completions: Vec<Completion>,
    /// Async events since the case began (names).
    pub events: Vec<String>,
    /// The exposed region's bytes.
    pub exposed: Vec<u8>,
    /// Whether the private region still holds its pattern, and so do the
    /// bytes of the exposed keys' memory that no key lets the fuzzer
    /// write (see [`EXPOSED_KEYS`]).
    pub private_intact: bool,
    /// A SEND and an RDMA WRITE on the untouched control QP succeeded.
    pub control_ok: bool,
    /// Problems the target itself reported (kernel log lines, ...).
    pub log: Vec<String>,
    /// The packets the target sent to the fuzzer during the case (UDP
    /// payloads, in order), as the case's run collected them; None where
    /// they were not recorded (the reference model then judges no
    /// answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<Vec<Vec<u8>>>,
}

impl Observation {
    /// What is known of a target that stopped answering (or panicked):
    /// nothing but `why`.
    pub fn dead(why: Vec<String>) -> Observation {
        Observation {
            alive: false,
            qp_state: QpState::Err,
            completions: Vec::new(),
            events: Vec::new(),
            exposed: Vec::new(),
            private_intact: true,
            control_ok: false,
            log: why,
            answers: None,
        }
    }
}

/// Errors talking to a target.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The target (or its agent) did not answer.
    #[error("target: {0}")]
    Io(String),
}

/// A RoCEv2 endpoint the fuzzer plays the peer of.
pub trait Target {
    /// A short name ("sim", "udp 127.0.0.1", ...).
    fn name(&self) -> String;
    /// Sets up a fresh fuzzed QP of `qp_type` (and the control QP), the
    /// exposed region filled with the pattern [`PATTERN`] and `recvs`
    /// receive WRs posted; returns the connection.
    fn setup(&mut self, qp_type: QpType, recvs: u32) -> Result<Conn, TargetError>;
    /// Sends one packet (a UDP payload) from the fuzzer to the target.
    fn send(&mut self, packet: &[u8]);
    /// Lets `us` microseconds pass; returns the packets the target sent to
    /// the fuzzer meanwhile.
    fn wait(&mut self, us: u32) -> Vec<Vec<u8>>;
    /// Observes the target after a case (lets it settle first).
    fn observe(&mut self) -> Result<Observation, TargetError>;
    /// Has the target post `wr` (signaled) on the fuzzed QP's send queue;
    /// its requests go to the fuzzer, which answers as the responder.
    fn post(&mut self, wr: &super::case::Post) -> Result<(), TargetError> {
        let _ = wr;
        Err(TargetError::Io(format!(
            "{}: cannot post work requests",
            self.name()
        )))
    }
    /// Sends one packet from another address than the fuzzer's
    /// (`packet`'s ICRC computed for that source): injection with a
    /// spoofed source.
    fn send_from(&mut self, src: IpAddr, packet: &[u8]) -> Result<(), TargetError> {
        let _ = (src, packet);
        Err(TargetError::Io(format!(
            "{}: cannot send from another address",
            self.name()
        )))
    }
    /// Whether a target that died comes back at the next set-up (the
    /// simulated one does: every case is a fresh network), so that the
    /// run can minimize the case and go on.
    fn revives(&self) -> bool {
        false
    }
    /// Whether every answer to a case is in by the end of its run (the
    /// simulated target: virtual time), so that a finding needs no
    /// confirming run that waits longer for late answers.
    fn answers_at_once(&self) -> bool {
        false
    }
}

/// The byte the exposed region is filled with at set-up.
pub const PATTERN: u8 = 0x5a;
