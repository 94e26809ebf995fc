//! The diagnostic tools, each a consumer of the observation seam
//! ([`crate::observe`]): the verbs checker ([`check`]), the explanations
//! ([`explain`]), the timeline ([`trace`]) and what `uroce stat` reads
//! ([`stat`]).
//!
//! [`open`] installs the tools' observer and reads their environment
//! (`UROCE_CHECK`, `UROCE_TRACE`) when a device opens; each tool then
//! sets the seam's topics it wants, the one switch every hook tests.
//! The core calls no tool: it tells the observer typed facts, and
//! [`Tools`] hands each to the tool that wants it.
//!
//! The tools are built in unless the crate is compiled with
//! `--cfg uroce_no_diag` (`RUSTFLAGS`): that build exists only as the
//! yardstick of `benches/diag_cost.sh`, which compares what the tools
//! cost, on and off, with the same code without them. There every
//! hook's condition is the constant `false` ([`COMPILED`]) and compiles
//! to nothing; it explains no error, keeps no per-QP tally and serves
//! no state.

pub mod check;
pub mod explain;
pub mod stat;
pub mod trace;

use crate::observe::{self, Event, Observe, QpCall, Topic};

pub use crate::observe::COMPILED;

/// The tools' observer: each event goes to the tool that wants its topic.
pub struct Tools;

impl Observe for Tools {
    fn observe(&self, e: &Event<'_>) {
        match *e {
            Event::DeviceOpened => trace::init(),
            Event::DeviceClosed => {
                if observe::wants(Topic::TIMELINE) {
                    trace::flush();
                }
            }
            Event::NicWrote { mr, offset, len } => {
                if observe::wants(Topic::CHECK_BUFFER) {
                    check::nic_wrote(mr, offset, len);
                }
            }
            Event::CqNotPolled {
                cq,
                waiting,
                at_destroy,
            } => {
                if observe::wants(Topic::CHECK_EVENT) {
                    check::cq_not_polled(cq, waiting, at_destroy);
                }
            }
            Event::CqDestroyUnacked { cq, unacked } => {
                if observe::wants(Topic::CHECK_EVENT) {
                    check::cq_destroyed_unacked(cq, unacked);
                }
            }
            Event::QpCall {
                call: QpCall::Modify(_),
                ..
            }
            | Event::Polled { .. }
            | Event::Deregistering { .. } => {
                if observe::wants(Topic::CHECK) {
                    check::device_event(e);
                }
            }
            Event::QpCall { .. } | Event::RecvPosting { .. } => {
                if observe::wants(Topic::CHECK_POST) {
                    check::device_event(e);
                }
            }
            Event::Explained { e } => {
                if observe::wants(Topic::EXPLAIN) {
                    explain::emit(e);
                }
            }
            Event::EntersErr { qpn, after } => {
                if observe::wants(Topic::EXPLAIN) {
                    explain::emit_entered_err(qpn, after);
                }
            }
            Event::Fact(f) => {
                if observe::wants(Topic::TIMELINE) {
                    trace::record(f);
                }
            }
            Event::Cm { what, conn, detail } => {
                if observe::wants(Topic::TIMELINE) {
                    trace::cm(what, conn, detail);
                }
            }
        }
    }
}

static TOOLS: Tools = Tools;

/// A device opens: the tools are installed ([`install`]) and the
/// checker reads `UROCE_CHECK` (once per process). The timeline opens
/// its file at [`Event::DeviceOpened`], which the engine sends.
pub fn open() {
    install();
    check::init_from_env();
}

/// The tools' observer becomes the process's, and the explanations read
/// `UROCE_EXPLAIN` (once per process): what a device's opening does, and
/// what QPs made without a device (the simulated pairs, the fuzzer's)
/// need for their errors to be printed.
pub fn install() {
    observe::install(&TOOLS);
    explain::init_from_env();
}
