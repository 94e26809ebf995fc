//! The `uroce` command's integration tests, one binary (one link, not
//! seven, on a 2-core machine), one module a subject: `decode` and
//! `sample-pcap` (`decode`), the demo as a library call (`demo`), what a
//! capture on `lo` shows of GSO sends (`gso_capture`), RC across two
//! network namespaces with loss (`netns_lossy`), the pingpong and stress
//! commands (`pingpong`), `uroce stat` (`stat`) and `UROCE_TRACE` with
//! `trace-merge` (`trace`).
//!
//! Every module runs the built `uroce` as child processes (or, `demo`, on
//! devices of its own) on loopback addresses and TCP ports no other
//! module uses, and none sets process-wide state, so they share a process
//! safely.

mod common;
mod decode;
mod demo;
mod gso_capture;
mod netns_lossy;
mod pingpong;
mod stat;
mod trace;
