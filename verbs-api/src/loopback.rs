//! Connects RC QP pairs between two local devices (e.g. on two loopback
//! addresses), for tests, benches and examples: [`connect_rc`] brings one
//! side of the pair to RTS with rc_pingpong's parameters ([`RcParams`]).

use crate::{AddressVector, ConnectOptions, Mtu, QueuePair, Result};
use std::net::IpAddr;

/// How [`connect_rc`] sets up the connection.
#[derive(Debug, Clone, Copy)]
pub struct RcParams {
    /// Path MTU.
    pub mtu: Mtu,
    /// max_rd_atomic and max_dest_rd_atomic.
    pub rd_atomic: u8,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
}

impl Default for RcParams {
    /// rc_pingpong's values, with 16 outstanding READs/atomics.
    fn default() -> Self {
        RcParams {
            mtu: Mtu::Mtu1024,
            rd_atomic: 16,
            timeout: 14,
        }
    }
}

impl RcParams {
    /// The same as [`ConnectOptions`] (rc_pingpong's retry 7, rnr_retry 7
    /// and min_rnr_timer 12; remote WRITE, READ and atomics allowed).
    pub fn options(&self) -> ConnectOptions {
        ConnectOptions {
            path_mtu: Some(self.mtu),
            max_rd_atomic: self.rd_atomic,
            max_dest_rd_atomic: self.rd_atomic,
            timeout: self.timeout,
            ..ConnectOptions::default()
        }
    }
}

/// Brings `qp` through INIT and RTR to RTS towards `peer_ip`/`peer_qpn`
/// with [`RcParams::options`], sending from `my_psn`. Errors say which
/// step failed.
pub fn connect_rc(
    qp: &QueuePair,
    peer_ip: IpAddr,
    peer_qpn: u32,
    my_psn: u32,
    peer_psn: u32,
    p: RcParams,
) -> Result<()> {
    let o = p.options();
    qp.init_with(&o)?;
    qp.rtr_rts(
        &AddressVector::to_ip(peer_ip),
        peer_qpn,
        peer_psn,
        my_psn,
        &o,
    )
}
