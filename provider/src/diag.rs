//! The diagnostic tools' one compile-time switch: the verbs checker
//! ([`crate::check`]), the explanations' recorder ([`crate::explain`]),
//! the timeline ([`crate::trace`]) and what `uroce stat` reads
//! ([`crate::stat`]) are built in unless the crate is compiled with
//! `--cfg uroce_no_diag` (`RUSTFLAGS`). That build exists only as the
//! yardstick of `benches/diag_cost.sh`, which compares what the tools
//! cost, on and off, with the same code without them: nothing else
//! builds it, and with the tools gone it explains no error, keeps no
//! per-QP tally and serves no state.
//!
//! Every hook on a hot path tests [`COMPILED`] before its own flag (the
//! tools' `on()` functions do it for their callers), so in the yardstick
//! each condition is the constant `false` and the hook compiles to
//! nothing; in the normal build `COMPILED` is `true` and the test
//! disappears.

/// False only in the yardstick build (`--cfg uroce_no_diag`).
pub const COMPILED: bool = !cfg!(uroce_no_diag);
