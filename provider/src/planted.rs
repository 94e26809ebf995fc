//! Planted mistakes: the fuzzer's own test set (issue #25, item 4).
//!
//! Each [`Mistake`] is a one-line error in the transports' (or the memory
//! keys') checks, of a kind real RoCE stacks have shipped, that a peer can
//! observe. Its docs are the catalogue: the rule (with its IBA section)
//! and the mistake. At its site the rule reads first, and alone but for
//! its mistake's name:
//!
//! ```text
//! // IBA 11.4.2.1: a UD receive's byte_len counts the 40-byte GRH area.
//! let byte_len = planted!(len, UdByteLenWithoutGrh => pkt.payload.len()) as u32;
//! ```
//!
//! This module exists only with the cargo feature `planted` (off by
//! default; no default feature anywhere enables it, and the device
//! library never has it). Without it the `planted!` macro (in the crate
//! root) is the right expression alone and the wrong one is not compiled.
//! With the feature, a mistake is planted for the current thread only
//! ([`with`]): the fuzzer's simulated target runs a case on one thread and
//! plants the mistake around its fuzzed QP's calls alone, while tests run
//! in parallel threads, each with its own selection.
//!
//! `uroce-fuzz`'s battery (`fuzz/uroce-fuzz/tests/battery.rs`) fuzzes the
//! simulated target with each mistake planted in turn and measures how
//! many the fuzzer's oracles find.

/// A planted mistake: what the correct rule is (with its IBA section) and
/// what the mistake does instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mistake {
    // --- RC responder -------------------------------------------------
    /// Rule (IBA 9.7.5.1.2, duplicate requests): a duplicate SEND or
    /// WRITE is acknowledged again and not executed a second time.
    /// Mistake: the PSN check classes a duplicate SEND or WRITE as the
    /// expected request and executes it again (the expected PSN moves
    /// back to it).
    DuplicateExecuted,
    /// Rule (IBA 9.7.5.1.2, 9.4.5): a duplicate atomic is answered with
    /// the original value saved when it executed, never executed again.
    /// Mistake: the duplicate is executed again on memory and answered
    /// with the new original value.
    DuplicateAtomicExecuted,
    /// Rule (IBA 9.7.5.1.1, C9-97): one PSN sequence error NAK per gap;
    /// further out-of-sequence requests are dropped silently until the
    /// expected PSN arrives. Mistake: a NAK for every one.
    SeqNakEveryPacket,
    /// Rule (IBA 9.7.5.1.6, MSN): the MSN counts every completed message,
    /// RDMA READ requests too. Mistake: a READ does not advance it.
    MsnNotAdvancedOnRead,
    /// Rule (IBA 9.7.6 / 11.4.2.1): the receive completion of an RDMA
    /// WRITE with immediate reports the whole message's length. Mistake:
    /// it reports the last packet's payload length.
    WriteImmWrongByteLen,
    /// Rule (IBA 9.7.5.1.1, 9.7.4.1.1): the last READ response carries
    /// the rest of the requested bytes (1 to PMTU). Mistake: it carries a
    /// full PMTU (bytes beyond the requested range).
    ReadLastFullMtu,
    /// Rule (IBA 9.7.5.2.8, RNR NAK): the RNR NAK's timer field is the
    /// responder QP's minimum RNR timer. Mistake: the field holds the
    /// QP's ACK timeout exponent instead.
    RnrNakWrongTimer,
    /// Rule (IBA 9.9.3.1, class C: remote access error): the responder
    /// NAKs and its QP goes to the Error state. Mistake: it NAKs and
    /// stays in RTS (and goes on executing later requests).
    NoErrorOnAccessError,
    /// Rule (IBA 9.7.5.1.6, C9-101): an ACK names the PSN of the last
    /// request executed. Mistake: it names the next one (a PSN not yet
    /// received), acknowledging a request the responder never executed.
    AckUnexecutedPsn,
    // --- RC requester (completer) ------------------------------------
    /// Rule (IBA 9.7.5.2.4, implied NAK): an ACK past an unanswered READ
    /// or atomic means its response was lost; the request is resent, not
    /// completed. Mistake: the ACK completes the READ or atomic.
    ImpliedNakIgnored,
    /// Rule (IBA 9.7.5.2.2/3, NAKs): a NAK acknowledges the requests
    /// before its PSN, not the request at its PSN. Mistake: the NAK is
    /// taken as acknowledging its own PSN too (the NAKed WR completes
    /// successfully).
    NakAcknowledgesItsPsn,
    /// Rule (IBA 9.7.5.2.6, atomic acknowledge): an atomic completes only
    /// on an ATOMIC ACKNOWLEDGE for its own PSN. Mistake: one for any PSN
    /// in the window completes it.
    AtomicAckAnyPsn,
    // --- UC -----------------------------------------------------------
    /// Rule (IBA 9.8.3, UC op sequence): with no message in progress only
    /// a FIRST or ONLY packet is accepted; a MIDDLE or LAST is dropped.
    /// Mistake: a SEND MIDDLE or LAST with no FIRST opens a message (and
    /// a LAST completes a receive WR).
    UcMiddleWithoutFirst,
    /// Rule (IBA 9.8.3, UC PSN check): a PSN gap inside a message drops
    /// the message (lost packets). Mistake: the message goes on across
    /// the gap and completes short of its lost packets.
    UcGapContinues,
    // --- UD -----------------------------------------------------------
    /// Rule (IBA 10.2.4, C10-15): a datagram whose Q_Key differs from the
    /// QP's is dropped. Mistake: the Q_Key is not checked.
    UdQkeyUnchecked,
    /// Rule (IBA 11.4.2.1, work completion; verbs: UD receives count the
    /// 40-byte GRH area): a UD receive's byte_len is the payload plus 40.
    /// Mistake: the payload alone.
    UdByteLenWithoutGrh,
    // --- memory keys --------------------------------------------------
    /// Rule (IBA 10.6.3.3, C10-?; R_Key checks): the R_Key must grant the
    /// operation's access (an RDMA WRITE needs remote write). Mistake: a
    /// WRITE is accepted on a key without remote write.
    WriteWithoutRemoteWrite,
    /// Rule (IBA 10.6.3.3, protection domains): an R_Key of a region or
    /// window of another PD is a remote access error. Mistake: the PD is
    /// not compared.
    OtherPdKeyAccepted,
    /// Rule (IBA 10.6.3.3, R_Key bounds): the whole range `[va, va+len)`
    /// lies inside the region (or window). Mistake: the check is off by
    /// one and lets an access end one byte past it.
    RkeyBoundsOffByOne,
}

impl Mistake {
    /// Every mistake, in the order the battery runs them.
    pub const ALL: &'static [Mistake] = &[
        Mistake::DuplicateExecuted,
        Mistake::DuplicateAtomicExecuted,
        Mistake::SeqNakEveryPacket,
        Mistake::MsnNotAdvancedOnRead,
        Mistake::WriteImmWrongByteLen,
        Mistake::ReadLastFullMtu,
        Mistake::RnrNakWrongTimer,
        Mistake::NoErrorOnAccessError,
        Mistake::AckUnexecutedPsn,
        Mistake::ImpliedNakIgnored,
        Mistake::NakAcknowledgesItsPsn,
        Mistake::AtomicAckAnyPsn,
        Mistake::UcMiddleWithoutFirst,
        Mistake::UcGapContinues,
        Mistake::UdQkeyUnchecked,
        Mistake::UdByteLenWithoutGrh,
        Mistake::WriteWithoutRemoteWrite,
        Mistake::OtherPdKeyAccepted,
        Mistake::RkeyBoundsOffByOne,
    ];

    /// The name `--target sim:<name>` takes.
    pub fn name(self) -> &'static str {
        match self {
            Mistake::DuplicateExecuted => "dup-executed",
            Mistake::DuplicateAtomicExecuted => "dup-atomic-executed",
            Mistake::SeqNakEveryPacket => "seq-nak-every-packet",
            Mistake::MsnNotAdvancedOnRead => "msn-not-advanced-on-read",
            Mistake::WriteImmWrongByteLen => "write-imm-wrong-byte-len",
            Mistake::ReadLastFullMtu => "read-last-full-mtu",
            Mistake::RnrNakWrongTimer => "rnr-nak-wrong-timer",
            Mistake::NoErrorOnAccessError => "no-error-on-access-error",
            Mistake::AckUnexecutedPsn => "ack-unexecuted-psn",
            Mistake::ImpliedNakIgnored => "implied-nak-ignored",
            Mistake::NakAcknowledgesItsPsn => "nak-acknowledges-its-psn",
            Mistake::AtomicAckAnyPsn => "atomic-ack-any-psn",
            Mistake::UcMiddleWithoutFirst => "uc-middle-without-first",
            Mistake::UcGapContinues => "uc-gap-continues",
            Mistake::UdQkeyUnchecked => "ud-qkey-unchecked",
            Mistake::UdByteLenWithoutGrh => "ud-byte-len-without-grh",
            Mistake::WriteWithoutRemoteWrite => "write-without-remote-write",
            Mistake::OtherPdKeyAccepted => "other-pd-key-accepted",
            Mistake::RkeyBoundsOffByOne => "rkey-bounds-off-by-one",
        }
    }

    /// The mistake named `name` ([`Mistake::name`]).
    pub fn from_name(name: &str) -> Option<Mistake> {
        Mistake::ALL.iter().copied().find(|m| m.name() == name)
    }
}

impl std::fmt::Display for Mistake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

thread_local! {
    static PLANTED: std::cell::Cell<Option<Mistake>> = const { std::cell::Cell::new(None) };
}

/// Whether mistake `m` is planted on this thread (what `planted!` asks).
pub fn active(m: Mistake) -> bool {
    PLANTED.with(|p| p.get() == Some(m))
}

/// Runs `f` with `m` planted on this thread (`None`: none), and restores
/// the thread's previous selection afterwards, also when `f` panics.
pub fn with<R>(m: Option<Mistake>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Mistake>);
    impl Drop for Restore {
        fn drop(&mut self) {
            PLANTED.with(|p| p.set(self.0));
        }
    }
    let _restore = Restore(PLANTED.with(|p| p.replace(m)));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_distinct() {
        for &m in Mistake::ALL {
            assert_eq!(Mistake::from_name(m.name()), Some(m));
        }
        let names: std::collections::BTreeSet<_> = Mistake::ALL.iter().map(|m| m.name()).collect();
        assert_eq!(names.len(), Mistake::ALL.len());
    }

    #[test]
    fn a_mistake_is_planted_for_this_thread_only() {
        with(Some(Mistake::UdQkeyUnchecked), || {
            assert!(active(Mistake::UdQkeyUnchecked));
            assert!(!active(Mistake::UcGapContinues));
            let other = std::thread::spawn(|| active(Mistake::UdQkeyUnchecked));
            assert!(!other.join().unwrap());
            with(None, || assert!(!active(Mistake::UdQkeyUnchecked)));
            assert!(active(Mistake::UdQkeyUnchecked));
        });
        assert!(!active(Mistake::UdQkeyUnchecked));
    }

    #[test]
    fn a_site_is_wrong_only_while_its_mistake_is_planted() {
        assert_eq!(planted!(1, UdQkeyUnchecked => 2), 1);
        with(Some(Mistake::UdQkeyUnchecked), || {
            assert_eq!(planted!(1, UdQkeyUnchecked => 2), 2);
            assert_eq!(planted!(1, UcGapContinues => 2), 1);
        });
    }
}
