//! # uroce-cli: the `uroce` command
//!
//! The programs behind the `uroce` command's subcommands, built on the
//! verbs library ([`uroce_verbs`]) and the wire format ([`uroce_wire`]).
//! They live in this library so that tests can call them; the command
//! line itself is [`args`] (so that man pages can be made from it), and
//! `src/bin/uroce.rs` only parses it and dispatches here.
//!
//! | subcommand | module |
//! |---|---|
//! | `demo` | [`demo`] |
//! | `rc-pingpong`, `uc-pingpong`, `ud-pingpong`, `srq-pingpong` | [`pingpong`] |
//! | `rc-stress` | [`stress`] |
//! | `cm-echo` | [`cm_echo`] |
//! | `fuzz`, `fuzz replay` | [`fuzz`] (the engine: [`uroce_fuzz`]) |
//! | `decode` | [`decode`] |
//! | `sample-pcap` | [`sample`] |
//! | `trace-merge` | [`trace_merge`] |
//! | `stat` | [`stat`] (the source: [`uroce_provider::stat`]) |
//! | `libdir`, `exec` | [`libdir`], [`sysfs_tree`] (the tree of sysfs files `exec` gives) |
#![warn(missing_docs)]

pub mod args;
pub mod cm_echo;
pub mod decode;
pub mod demo;
pub mod fuzz;
pub mod libdir;
pub mod pingpong;
pub mod sample;
pub mod stat;
pub mod stress;
pub mod sysfs_tree;
pub mod trace_merge;

#[cfg(test)]
mod docgen;
