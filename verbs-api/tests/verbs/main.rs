//! The verbs API's loopback tests, one binary (one link, not fourteen,
//! on a 2-core machine), one module a subject, each over real UDP
//! between devices on loopback addresses of its own (no two modules bind
//! the same address): RC operations (`rc_loopback`), UD and UC
//! (`ud_uc_loopback`), events, completion channels and SRQs
//! (`events_srq`), memory windows and re-registration (`mw_rereg`),
//! zero-based memory (`zero_based`), ATOMIC WRITE and FLUSH
//! (`atomic_write_flush`), multicast (`multicast`), the IP TTL and TOS
//! (`hop_limit`, `traffic_class`), timestamps (`timestamps`), ACK
//! coalescing (`ack_hold`), many QPs (`many_qps`), the explanations
//! (`explain`), opening a device (`device_open`, whose capture test
//! re-runs this binary as a child with `--exact device_open::pcap_child`)
//! and processes sharing one device (`share`, whose members are this
//! binary run again as children).
//!
//! Three tests keep binaries of their own, because each turns on
//! something process-wide that would see every other module's traffic:
//! `tests/check.rs` (the checker, and its process-wide report count),
//! `tests/trace.rs` (`UROCE_TRACE`, set in the environment, one sink for
//! the process) and `tests/stat.rs` (the state socket, which answers for
//! every device of the process).

#[path = "../common/mod.rs"]
mod common;

mod ack_hold;
mod atomic_write_flush;
mod device_open;
mod events_srq;
mod explain;
mod hop_limit;
mod many_qps;
mod multicast;
mod mw_rereg;
mod rc_loopback;
mod share;
mod timestamps;
mod traffic_class;
mod ud_uc_loopback;
mod zero_based;
