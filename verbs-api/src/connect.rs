//! Connecting QPs without writing the INIT/RTR/RTS attribute lists by
//! hand, and builders with defaults for QPs and CQs.
//!
//! Two programs that exchange [`Endpoint`]s (over TCP, a file, a channel:
//! 24 bytes each way, [`Endpoint::to_bytes`]) connect their RC or UC QPs
//! with [`QueuePair::connect`]; a UD QP needs no peer and becomes ready
//! with [`QueuePair::activate`]. The defaults ([`ConnectOptions`]) are the
//! usual ones of rdma-core's example programs; override any of them with
//! [`QueuePair::connect_with`].
//!
//! ```
//! use uroce_verbs::{Device, Endpoint};
//! # fn main() -> uroce_verbs::Result<()> {
//! let ctx = Device::new("doc0", "127.70.0.1".parse().unwrap()).open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.cq_builder().cqe(64).build()?;
//! let a = pd.qp_builder(&cq).build()?; // RC, 128 WRs each way
//! let b = pd.qp_builder(&cq).build()?;
//! // The peers swap endpoints (here: in one process) and connect.
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let eb = Endpoint::from_bytes(&eb.to_bytes())?;
//! a.connect(&eb)?;
//! b.connect(&ea)?;
//! assert_eq!(a.state(), uroce_verbs::QpState::Rts);
//! # Ok(())
//! # }
//! ```

use crate::cq::CompletionQueue;
use crate::device::Context;
use crate::error::{Error, Result};
use crate::events::CompChannel;
use crate::pd::ProtectionDomain;
use crate::qp::{QpInitAttr, QueuePair};
use crate::srq::SharedReceiveQueue;
use std::net::{IpAddr, Ipv6Addr};
use uroce_provider::qp_attr::{AddressVector, AttrMask, QpAttr, QpCap};
use uroce_provider::types::{Access, Mtu, QpState, QpType};

/// What the peer needs to connect a QP to this one: its number, the PSN
/// its first packet will carry, and the device's GID (its address). Like
/// rust-ibverbs' `QueuePairEndpoint`, with the PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// QP number (24 bits).
    pub qpn: u32,
    /// Starting packet sequence number (24 bits).
    pub psn: u32,
    /// The device's RoCEv2 GID: its IP address as IPv6.
    pub gid: [u8; 16],
}

impl Endpoint {
    /// Bytes in [`Endpoint::to_bytes`].
    pub const LEN: usize = 24;

    /// QPN and PSN (big-endian) and the GID: a fixed 24-byte form for
    /// sending to the peer.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&self.qpn.to_be_bytes());
        b[4..8].copy_from_slice(&self.psn.to_be_bytes());
        b[8..24].copy_from_slice(&self.gid);
        b
    }

    /// Reads [`Endpoint::to_bytes`]'s form; refuses a wrong length and
    /// QPNs or PSNs beyond 24 bits.
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint> {
        if b.len() != Self::LEN {
            return Err(Error::Invalid(format!(
                "an endpoint is {} bytes, not {}",
                Self::LEN,
                b.len()
            )));
        }
        let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qpn, psn) = (word(0), word(4));
        if qpn > 0xff_ffff || psn > 0xff_ffff {
            return Err(Error::Invalid(format!(
                "endpoint QPN {qpn:#x} / PSN {psn:#x} beyond 24 bits"
            )));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        Ok(Endpoint { qpn, psn, gid })
    }

    /// The GID as an IP address (IPv4 for an IPv4-mapped GID).
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.gid);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QPN {:#08x}, PSN {:#08x}, GID {}",
            self.qpn,
            self.psn,
            Ipv6Addr::from(self.gid)
        )
    }
}

/// The attributes [`QueuePair::connect_with`] and
/// [`QueuePair::activate_with`] use for INIT, RTR and RTS. `Default` gives
/// what rdma-core's example programs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// What the peer may do to this QP's memory (RC, UC): local write,
    /// remote write, read and atomics by default.
    pub access: Access,
    /// Path MTU; `None`: the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// Source GID index (0 or 1: both hold the device's GID).
    pub sgid_index: u8,
    /// Hop limit (IP TTL): 64.
    pub hop_limit: u8,
    /// Traffic class (DSCP/ECN): 0.
    pub traffic_class: u8,
    /// RDMA READs and atomics this QP may have outstanding (RC): 16.
    pub max_rd_atomic: u8,
    /// RDMA READs and atomics the peer may have outstanding here (RC): 16.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (RC): 12 (0.64 ms).
    pub min_rnr_timer: u8,
    /// Local ACK timeout code (RC): 14 (67 ms).
    pub timeout: u8,
    /// Transport retries (RC): 7.
    pub retry_cnt: u8,
    /// RNR retries (RC): 7, for ever.
    pub rnr_retry: u8,
    /// Q_Key (UD): 0x11111111.
    pub qkey: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            path_mtu: None,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            min_rnr_timer: 12,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            qkey: 0x1111_1111,
        }
    }
}

impl QueuePair {
    /// This QP's [`Endpoint`], for the peer's [`QueuePair::connect`]: its
    /// number, its starting PSN (random, chosen at creation) and the
    /// device's GID.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp_num(),
            psn: self.start_psn(),
            gid: uroce_provider::qp_attr::gid_of(self.context().device().ip()),
        }
    }

    /// Connects an RC or UC QP in RESET to `remote` with
    /// [`ConnectOptions::default`]: INIT, RTR, RTS.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        self.connect_with(remote, &ConnectOptions::default())
    }

    /// [`QueuePair::connect`] with the attributes in `o`. On an error the
    /// QP stays in the last state it reached; the error names the step.
    pub fn connect_with(&self, remote: &Endpoint, o: &ConnectOptions) -> Result<()> {
        let t = self.qp_type();
        if !matches!(t, QpType::Rc | QpType::Uc) {
            return Err(Error::Invalid(format!(
                "connect: a {t:?} QP has no peer (UD: activate)"
            )));
        }
        let av = AddressVector {
            dgid: remote.gid,
            sgid_index: o.sgid_index,
            hop_limit: o.hop_limit,
            traffic_class: o.traffic_class,
            ..AddressVector::default()
        };
        self.init_with(o)?;
        self.rtr_rts(&av, remote.qpn, remote.psn, self.start_psn(), o)
    }

    /// Brings a UD QP in RESET to RTS with [`ConnectOptions::default`]'s
    /// Q_Key (0x11111111).
    pub fn activate(&self) -> Result<()> {
        self.activate_with(&ConnectOptions::default())
    }

    /// [`QueuePair::activate`] with `o.qkey`.
    pub fn activate_with(&self, o: &ConnectOptions) -> Result<()> {
        if self.qp_type() != QpType::Ud {
            return Err(Error::Invalid(format!(
                "activate: a {:?} QP needs its peer (connect)",
                self.qp_type()
            )));
        }
        self.init_with(o)?;
        self.rtr_rts(&AddressVector::default(), 0, 0, self.start_psn(), o)
    }

    /// RESET -> INIT: RC with `o.access`, UC with its write bits (UC has
    /// no READ or atomics; the spec refuses those bits), UD with `o.qkey`.
    ///
    /// The first half of [`QueuePair::connect_with`], for programs that
    /// exchange their own addresses and PSNs (rdma-core's tools' way);
    /// [`QueuePair::rtr_rts`] is the second. The error names the step.
    pub fn init_with(&self, o: &ConnectOptions) -> Result<()> {
        let t = self.qp_type();
        let access = if t == QpType::Uc {
            o.access & (Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        } else {
            o.access
        };
        let (a, mask) = ConnectOptions { access, ..*o }.init_attr(t);
        self.step("INIT", &a, mask)
    }

    /// INIT -> RTR -> RTS, sending from `sq_psn`. RC and UC are addressed
    /// to the peer at `av`, QP `dest_qpn`, whose packets start at
    /// `rq_psn`, with `o`'s path MTU (none: the port's) and, for RC, its
    /// READ/atomic depths, RNR timer, ACK timeout and retries; UD takes
    /// none of those.
    ///
    /// The second half of [`QueuePair::connect_with`] (after
    /// [`QueuePair::init_with`]), with the address vector and both PSNs
    /// given rather than taken from an [`Endpoint`]. The error names the
    /// step that failed (RTR or RTS).
    pub fn rtr_rts(
        &self,
        av: &AddressVector,
        dest_qpn: u32,
        rq_psn: u32,
        sq_psn: u32,
        o: &ConnectOptions,
    ) -> Result<()> {
        let t = self.qp_type();
        let (rtr_mask, rts_mask) = match t {
            QpType::Ud => (AttrMask::STATE, AttrMask::STATE | AttrMask::SQ_PSN),
            t => (
                AttrMask::to_rtr(t == QpType::Rc),
                AttrMask::to_rts(t == QpType::Rc),
            ),
        };
        let path_mtu = match o.path_mtu {
            Some(m) => m,
            None => self.context().query_port(1)?.active_mtu,
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu,
            dest_qp_num: dest_qpn,
            rq_psn,
            max_dest_rd_atomic: o.max_dest_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ah_attr: *av,
            ..QpAttr::default()
        };
        self.step("RTR", &rtr, rtr_mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..QpAttr::default()
        };
        self.step("RTS", &rts, rts_mask)
    }

    /// A modify, its error naming the state it was for (rdma-core's
    /// programs' words).
    fn step(&self, name: &str, attr: &QpAttr, mask: AttrMask) -> Result<()> {
        self.modify(attr, mask).map_err(|e| match e {
            Error::Invalid(m) => Error::Invalid(format!("Failed to modify QP to {name}: {m}")),
            other => other,
        })
    }
}

impl ConnectOptions {
    /// The RESET -> INIT attributes (and mask) these options give a QP of
    /// type `t`: port 1, P_Key index 0; RC and UC with `access` as it is
    /// (unlike [`QueuePair::init_with`], which keeps only UC's write
    /// bits), UD with `qkey`. For programs that modify the QP themselves
    /// (rdma_cm's `rdma_init_qp_attr`).
    pub fn init_attr(&self, t: QpType) -> (QpAttr, AttrMask) {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let mut m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT;
        if t == QpType::Ud {
            a.qkey = self.qkey;
            m |= AttrMask::QKEY;
        } else {
            a.qp_access_flags = self.access;
            m |= AttrMask::ACCESS_FLAGS;
        }
        (a, m)
    }
}

/// Builds a QP with defaults: RC, 128 send and receive WRs, 4 SGEs each
/// way, 64 bytes inline, one CQ for both queues, selective signaling.
/// From [`ProtectionDomain::qp_builder`].
#[derive(Debug, Clone, Copy)]
pub struct QpBuilder<'a> {
    pd: &'a ProtectionDomain,
    init: QpInitAttr<'a>,
}

impl ProtectionDomain {
    /// A [`QpBuilder`] whose QP reports to `cq` (both queues).
    pub fn qp_builder<'a>(&'a self, cq: &'a CompletionQueue) -> QpBuilder<'a> {
        QpBuilder {
            pd: self,
            init: QpInitAttr {
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 128,
                    max_recv_wr: 128,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
                srq: None,
            },
        }
    }
}

impl<'a> QpBuilder<'a> {
    /// The transport (RC by default).
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.init.qp_type = t;
        self
    }
    /// Send completions go to `cq`.
    pub fn send_cq(mut self, cq: &'a CompletionQueue) -> Self {
        self.init.send_cq = cq;
        self
    }
    /// Receive completions go to `cq`.
    pub fn recv_cq(mut self, cq: &'a CompletionQueue) -> Self {
        self.init.recv_cq = cq;
        self
    }
    /// Send queue depth.
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.init.cap.max_send_wr = n;
        self
    }
    /// Receive queue depth.
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.init.cap.max_recv_wr = n;
        self
    }
    /// SGEs per send WR.
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.init.cap.max_send_sge = n;
        self
    }
    /// SGEs per receive WR.
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.init.cap.max_recv_sge = n;
        self
    }
    /// Inline data bytes per send WR.
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.init.cap.max_inline_data = n;
        self
    }
    /// Every send WR completes with a work completion (`sq_sig_all`).
    pub fn signal_all(mut self, yes: bool) -> Self {
        self.init.sq_sig_all = yes;
        self
    }
    /// Receives come from `srq`.
    pub fn srq(mut self, srq: &'a SharedReceiveQueue) -> Self {
        self.init.srq = Some(srq);
        self
    }
    /// `ibv_create_qp`.
    pub fn build(&self) -> Result<QueuePair> {
        self.pd.create_qp(&self.init)
    }
}

/// Builds a CQ: 256 entries by default, `cq_context` 0, no completion
/// channel. From [`Context::cq_builder`].
#[derive(Debug, Clone, Copy)]
pub struct CqBuilder<'a> {
    ctx: &'a Context,
    cqe: u32,
    context: u64,
    channel: Option<&'a CompChannel>,
}

impl Context {
    /// A [`CqBuilder`].
    pub fn cq_builder(&self) -> CqBuilder<'_> {
        CqBuilder {
            ctx: self,
            cqe: 256,
            context: 0,
            channel: None,
        }
    }
}

impl<'a> CqBuilder<'a> {
    /// At least `n` entries.
    pub fn cqe(mut self, n: u32) -> Self {
        self.cqe = n;
        self
    }
    /// The value completion events carry ([`crate::CqEvent::cq_context`]).
    pub fn context(mut self, v: u64) -> Self {
        self.context = v;
        self
    }
    /// Completion events go to `ch` once the CQ is armed
    /// ([`CompletionQueue::req_notify`]).
    pub fn channel(mut self, ch: &'a CompChannel) -> Self {
        self.channel = Some(ch);
        self
    }
    /// `ibv_create_cq`.
    pub fn build(&self) -> Result<CompletionQueue> {
        self.ctx
            .create_cq_with(self.cqe, self.context, self.channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Device;

    #[test]
    fn connect_and_activate_refuse_the_wrong_transport_and_honour_options() {
        let ctx = Device::new("ct", "127.70.9.1".parse().unwrap())
            .open()
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.cq_builder().cqe(8).build().unwrap();
        let ud = pd.qp_builder(&cq).qp_type(QpType::Ud).build().unwrap();
        let rc = pd.qp_builder(&cq).build().unwrap();
        assert!(matches!(ud.connect(&rc.endpoint()), Err(Error::Invalid(_))));
        assert!(matches!(rc.activate(), Err(Error::Invalid(_))));
        assert_eq!((ud.state(), rc.state()), (QpState::Reset, QpState::Reset));
        ud.activate_with(&ConnectOptions {
            qkey: 0x1234,
            ..ConnectOptions::default()
        })
        .unwrap();
        assert_eq!(ud.query().unwrap().qkey, 0x1234);

        // UC: READ and atomics are not UC's, so connect leaves them out.
        let uc1 = pd.qp_builder(&cq).qp_type(QpType::Uc).build().unwrap();
        let uc2 = pd.qp_builder(&cq).qp_type(QpType::Uc).build().unwrap();
        let o = ConnectOptions {
            path_mtu: Some(Mtu::Mtu512),
            ..ConnectOptions::default()
        };
        uc1.connect_with(&uc2.endpoint(), &o).unwrap();
        let a = uc1.query().unwrap();
        assert_eq!((a.qp_state, a.path_mtu), (QpState::Rts, Mtu::Mtu512));
        assert_eq!(
            a.qp_access_flags,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        );
        assert_eq!((a.dest_qp_num, a.rq_psn), (uc2.qp_num(), uc2.start_psn()));
        assert_eq!(a.sq_psn, uc1.start_psn());

        // Address handles take the GID table's indices too (1: rxe's).
        let av = |sgid_index| AddressVector {
            dgid: rc.endpoint().gid,
            sgid_index,
            ..AddressVector::default()
        };
        assert!(pd.create_ah(&av(1)).is_ok());
        assert!(matches!(pd.create_ah(&av(2)), Err(Error::Invalid(_))));

        // A bad option names the step it failed at; the QP stays there.
        let bad = ConnectOptions {
            sgid_index: 7,
            ..ConnectOptions::default()
        };
        let e = rc.connect_with(&uc1.endpoint(), &bad).unwrap_err();
        assert!(e.to_string().contains("to RTR"), "{e}");
        assert_eq!(rc.state(), QpState::Init);
    }

    #[test]
    fn endpoint_bytes_round_trip_and_refuse_bad_input() {
        let e = Endpoint {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            gid: uroce_provider::qp_attr::gid_of("127.0.0.9".parse().unwrap()),
        };
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
        assert_eq!(e.ip(), "127.0.0.9".parse::<IpAddr>().unwrap());
        assert!(Endpoint::from_bytes(&e.to_bytes()[..23]).is_err());
        let mut b = e.to_bytes();
        b[0] = 1; // QPN 0x1123456: 25 bits
        assert!(Endpoint::from_bytes(&b).is_err());
        let v6: IpAddr = "fd00::7".parse().unwrap();
        let e6 = Endpoint {
            gid: uroce_provider::qp_attr::gid_of(v6),
            ..e
        };
        assert_eq!(e6.ip(), v6);
        assert!(e.to_string().contains("::ffff:127.0.0.9"));
    }
}
