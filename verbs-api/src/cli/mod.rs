//! The `uroce` command's subcommands that live in the library, so that
//! tests can call them: `decode` and `sample-pcap`. `src/bin/uroce.rs` only
//! parses the command line and dispatches here.

pub mod decode;
pub mod libdir;
pub mod sample;
