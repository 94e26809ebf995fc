//! # uroce-provider
//!
//! The transport as sans-IO state machines, memory (PDs, MRs, keys),
//! completion queues, and the engine that drives them over UDP.
#![warn(missing_docs)]

/// A rule with a planted mistake beside it: `planted!(RIGHT, Mistake =>
/// WRONG)`, where `Mistake` is a variant of `planted::Mistake` (whose
/// docs state the rule and the mistake).
///
/// Without the cargo feature `planted` (the default, and the device
/// library's build) this is `RIGHT` alone: `WRONG` is not compiled, and
/// neither is the `planted` module. With the feature it is `WRONG` while
/// the mistake is planted on the current thread (`planted::with`), and
/// `RIGHT` otherwise. Defined here, ahead of the modules, so that every
/// module of the crate can use it.
#[cfg(not(feature = "planted"))]
macro_rules! planted {
    ($right:expr, $mistake:ident => $wrong:expr) => {
        $right
    };
}

/// A rule with a planted mistake beside it (see the version without the
/// feature `planted`, above): `WRONG` while `Mistake` is planted on this
/// thread, `RIGHT` otherwise.
#[cfg(feature = "planted")]
macro_rules! planted {
    ($right:expr, $mistake:ident => $wrong:expr) => {
        if $crate::planted::active($crate::planted::Mistake::$mistake) {
            $wrong
        } else {
            $right
        }
    };
}

/// An enum of numbered values stated once, with the tables drawn from
/// that one list: each variant is `Name = value` (and `=> "words"` where
/// the enum has a table of names), and after the enum each wanted table is
/// `VIS NAME: KIND;` with its docs, where `KIND` is `names` (a `const fn
/// NAME(self) -> &'static str`), `values` (a `const fn NAME(v: REPR) ->
/// Option<Self>`, `None` for a value with no variant) or `all` (a `const
/// NAME: [Self; N]` of every variant in the order stated). Defined here,
/// ahead of the modules, so that every module of the crate can use it.
macro_rules! value_enum {
    (
        $(#[$m:meta])*
        $vis:vis enum $E:ident: $repr:ident $body:tt
        $( $(#[$a:meta])* $fvis:vis $f:ident: $kind:ident; )*
    ) => {
        value_enum!(@enum [$(#[$m])*] $vis $E $repr $body);
        impl $E {
            $( value_enum!(@$kind [$(#[$a])*] $fvis $f $E $repr $body); )*
        }
    };
    (@enum [$($m:tt)*] $vis:vis $E:ident $repr:ident
        { $( $(#[$vm:meta])* $V:ident = $val:literal $(=> $s:literal)?, )+ }) => {
        $($m)*
        #[repr($repr)]
        $vis enum $E { $( $(#[$vm])* $V = $val, )+ }
    };
    (@names [$($a:tt)*] $fvis:vis $f:ident $E:ident $repr:ident
        { $( $(#[$vm:meta])* $V:ident = $val:literal => $s:literal, )+ }) => {
        $($a)*
        $fvis const fn $f(self) -> &'static str {
            match self { $( $E::$V => $s, )+ }
        }
    };
    (@values [$($a:tt)*] $fvis:vis $f:ident $E:ident $repr:ident
        { $( $(#[$vm:meta])* $V:ident = $val:literal $(=> $s:literal)?, )+ }) => {
        $($a)*
        $fvis const fn $f(v: $repr) -> Option<$E> {
            match v { $( $val => Some($E::$V), )+ _ => None }
        }
    };
    (@all [$($a:tt)*] $fvis:vis $f:ident $E:ident $repr:ident
        { $( $(#[$vm:meta])* $V:ident = $val:literal $(=> $s:literal)?, )+ }) => {
        $($a)*
        $fvis const $f: [$E; [$(stringify!($V)),+].len()] = [$($E::$V),+];
    };
}

// The face (the device and its handles) and the value types are public;
// everything else is the provider's own (see `layering.rs`, which keeps
// this list). The sans-IO transport, the simulated network and the
// memory model reach the fuzzer and the tests through `sans_io`, behind
// the feature `testing`.
mod cm;
pub mod counters;
mod cq;
pub mod device;
pub mod diag;
pub use diag::{check, explain, stat, trace};
mod endpoint;
mod engine;
pub mod env;
mod events;
mod memory;
mod net;
pub mod observe;
#[cfg(feature = "planted")]
pub mod planted;
pub mod qp_attr;
mod quota;
#[cfg(any(test, feature = "testing"))]
pub mod sans_io;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod threads;
mod transport;
pub mod types;
mod userdir;

#[cfg(test)]
mod layering;

pub use uroce_wire as wire;

/// Without the feature `planted` a site is its right expression alone.
#[cfg(all(test, not(feature = "planted")))]
mod planted_sites {
    #[test]
    fn the_wrong_twin_and_the_catalogue_are_not_compiled() {
        // Neither the wrong expression nor the mistake's name is looked
        // at: compiling either would fail.
        let right = planted!(1, NoSuchMistake => compile_error!("compiled the wrong twin"));
        assert_eq!(right, 1);
    }
}
