//! The provider's integration tests, one binary (one link, not twelve,
//! on a 2-core machine), one module a subject: the RC, UC and UD
//! transports end to end on the simulated network (`rc_sim`, `uc_sim`,
//! `ud_sim`), scripted and random loss (`rc_scenarios`, `rc_lossy`),
//! events and SRQs (`rc_events`), multicast (`mcast_sim`), many QPs on
//! one device (`many_qps`), a hostile peer (`hostile`), deregistration
//! under traffic (`dereg`), the explanations (`explain`) and the engine's
//! callbacks (`engine_reentry`, the one module on a real socket:
//! 127.77.0.1).
//!
//! Nothing here sets process-wide state (no environment variable, no
//! checker, no trace): every module's QPs live on a simulated network of
//! their own, so the modules share a process safely.

mod dereg;
mod engine_reentry;
mod explain;
mod hostile;
mod many_qps;
mod mcast_sim;
mod rc_events;
mod rc_lossy;
mod rc_scenarios;
mod rc_sim;
mod uc_sim;
mod ud_sim;
