//! # uroce-wire: the RoCEv2 codec
//!
//! Zero-copy header views over byte buffers and plain `Repr` structs with
//! `parse`/`emit`, for every header a RoCEv2 packet can carry (IBA vol. 1
//! ch. 9.2-9.5, Annex A17): [`Bth`](bth), [`Reth`](reth), [`Aeth`](aeth),
//! [`AtomicEth`](atomic), [`AtomicAckEth`](atomic), [`Deth`](deth),
//! [`ImmDt`](immdt), [`Ieth`](ieth); the opcode table as data
//! ([`opcode`]); whole packets from the BTH to the ICRC ([`packet`]); the
//! ICRC ([`icrc`]); Ethernet/IPv4/IPv6/UDP framing ([`frame`]); pcap
//! capture files ([`pcap`]); 24-bit PSN arithmetic ([`psn`]); the
//! management datagrams of connection management: the MAD header
//! ([`mad`]), the CM messages ([`cm`]) and rdma_cm's IP addressing
//! ([`cma`]).
//!
//! ## The contract (after smoltcp's `wire`)
//!
//! * Untrusted bytes always go through a checked constructor
//!   (`Header::new_checked`, [`packet::parse`], [`frame::parse_frame`]).
//!   After it returns `Ok`, **no accessor of that view can panic**.
//! * `Repr::emit` never panics when given a buffer of at least
//!   `Repr::buffer_len()` bytes; the whole-packet builder checks the buffer
//!   itself and returns [`Error::BufferTooSmall`].
//! * Nothing in this crate allocates on the parse/build/ICRC path, performs
//!   I/O, or panics on any input. (The pcap reader/writer in [`pcap`] does
//!   I/O by nature and is kept apart from the hot path.)
//! * Under `cfg(fuzzing)` ICRC verification always succeeds so that a
//!   fuzzer reaches the code behind it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod deth;
pub mod error;
pub mod feth;
pub mod fields;
pub mod frame;
#[cfg(feature = "harness")]
#[doc(hidden)]
pub mod harness;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod pcap;
pub mod psn;
pub mod reth;

pub use aeth::{Aeth, AethRepr, AethSyndrome, NakCode};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use deth::{Deth, DethRepr};
pub use error::{Error, Result};
pub use feth::{Feth, FethRepr};
pub use icrc::IpContext;
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{Ext, Opcode, OpcodeInfo, Operation, Position, RequestExtra, Transport};
pub use packet::{Headers, ParsedPacket};
pub use psn::Psn;
pub use reth::{Reth, RethRepr};

/// The IANA-assigned UDP destination port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of the invariant CRC trailer.
pub const ICRC_LEN: usize = 4;
