//! 24-bit packet sequence numbers (IBA 9.7.1).
//!
//! PSNs wrap modulo 2^24. Two PSNs are ordered by their signed 24-bit
//! difference: `b` is after `a` when `(b - a) mod 2^24` lies in `1..2^23`.
//! The responder treats a PSN up to 2^23 behind the expected one as a
//! duplicate (IBA 9.7.5.1.1 C9-76..: "the duplicate region is half the PSN
//! space"), and anything ahead as out of sequence.

use core::cmp::Ordering;
use core::fmt;

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// Size of the duplicate window: half the PSN space.
pub const DUP_WINDOW: u32 = 1 << 23;

/// A 24-bit packet sequence number with wrapping arithmetic.
///
/// `PartialOrd` compares by signed 24-bit difference, which is not a total
/// order over the whole space (it is within any window of 2^23), so `Ord`
/// is deliberately not implemented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

/// Where a received PSN lies relative to the expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PsnClass {
    /// Exactly the expected PSN.
    Expected,
    /// Behind the expected PSN, within the duplicate window.
    Duplicate,
    /// Ahead of the expected PSN (a gap: sequence error).
    Ahead,
}

impl Psn {
    /// The largest PSN.
    pub const MAX: Psn = Psn(PSN_MASK);

    /// Makes a PSN from the low 24 bits of `v`.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }
    /// A random PSN: what a QP should start at (`sq_psn`), so that an
    /// off-path attacker cannot guess the PSNs a connection uses and
    /// inject packets into it (ReDMArk, USENIX Security 2021). rdma-core's
    /// ping-pong tools do the same (`lrand48() & 0xffffff`).
    pub fn random() -> Psn {
        Psn::new(rand::random::<u32>())
    }
    /// The raw 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n` modulo 2^24.
    #[inline]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }
    /// `self - n` modulo 2^24.
    #[inline]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & PSN_MASK)
    }
    /// The next PSN.
    #[inline]
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// Signed distance from `other` to `self`, in -2^23..2^23.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }
    /// Unsigned distance `(self - other) mod 2^24`.
    #[inline]
    pub const fn distance_from(self, other: Psn) -> u32 {
        self.0.wrapping_sub(other.0) & PSN_MASK
    }
    /// Classifies a received PSN `self` against the `expected` one
    /// (IBA 9.7.5.1.1): within 2^23 behind is a duplicate.
    #[inline]
    pub const fn classify(self, expected: Psn) -> PsnClass {
        let d = expected.distance_from(self);
        if d == 0 {
            PsnClass::Expected
        } else if d <= DUP_WINDOW {
            PsnClass::Duplicate
        } else {
            PsnClass::Ahead
        }
    }
    /// True when `self` is after `other`.
    #[inline]
    pub const fn is_after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
    /// True when `self` lies in the half-open window `[start, end)`.
    #[inline]
    pub const fn in_window(self, start: Psn, end: Psn) -> bool {
        self.distance_from(start) < end.distance_from(start)
    }
}

impl PartialOrd for Psn {
    fn partial_cmp(&self, other: &Psn) -> Option<Ordering> {
        Some(self.diff(*other).cmp(&0))
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wraps() {
        assert_eq!(Psn::MAX.next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::MAX);
        assert_eq!(Psn::new(5).diff(Psn::MAX), 6);
        assert_eq!(Psn::MAX.diff(Psn::new(5)), -6);
        assert!(Psn::new(2) > Psn::MAX);
        assert!(Psn::new(0x7f_ffff) > Psn::new(0));
        assert!(Psn::new(0x80_0001) < Psn::new(0));
        assert!(Psn::new(3).in_window(Psn::MAX, Psn::new(4)));
        assert!(!Psn::new(4).in_window(Psn::MAX, Psn::new(4)));
    }

    #[test]
    fn classify_window() {
        let e = Psn::new(10);
        assert_eq!(Psn::new(10).classify(e), PsnClass::Expected);
        assert_eq!(Psn::new(9).classify(e), PsnClass::Duplicate);
        assert_eq!(Psn::new(11).classify(e), PsnClass::Ahead);
        // exactly 2^23 behind is still a duplicate; one more is ahead.
        assert_eq!(e.sub(DUP_WINDOW).classify(e), PsnClass::Duplicate);
        assert_eq!(e.sub(DUP_WINDOW + 1).classify(e), PsnClass::Ahead);
        // across the wrap
        assert_eq!(Psn::MAX.classify(Psn::new(1)), PsnClass::Duplicate);
        assert_eq!(Psn::new(1).classify(Psn::MAX), PsnClass::Ahead);
    }

    proptest! {
        #[test]
        fn add_sub_inverse(a in 0u32..1<<24, n in 0u32..1<<24) {
            let p = Psn::new(a);
            prop_assert_eq!(p.add(n).sub(n), p);
            prop_assert_eq!(p.add(n).distance_from(p), n);
        }
        #[test]
        fn diff_antisymmetric(a in 0u32..1<<24, n in 1u32..(1<<23)) {
            let p = Psn::new(a);
            let q = p.add(n);
            prop_assert_eq!(q.diff(p), n as i32);
            prop_assert_eq!(p.diff(q), -(n as i32));
            prop_assert!(q.is_after(p));
            prop_assert_eq!(p.classify(q), PsnClass::Duplicate);
            prop_assert_eq!(q.classify(p), PsnClass::Ahead);
        }
    }
}
