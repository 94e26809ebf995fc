//! Per-device counters, like kernel rxe's `hw_counters`.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// Counters of one device; every drop, duplicate, NAK and retry
        /// is counted.
        #[derive(Debug, Default)]
        pub struct Counters {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        /// A copy of the counters at one moment.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct CounterSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Reads every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }

        impl CounterSnapshot {
            /// (name, value) pairs in declaration order.
            pub fn entries(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

counters! {
    /// Packets sent.
    sent_pkts,
    /// Packets received and accepted for processing.
    rcvd_pkts,
    /// Request packets sent again (go-back-N).
    retransmits,
    /// Retransmission timer expiries.
    retry_timeouts,
    /// RNR NAKs sent.
    rnr_naks_sent,
    /// RNR NAKs received.
    rnr_naks_rcvd,
    /// PSN sequence error NAKs sent.
    seq_naks_sent,
    /// PSN sequence error NAKs received.
    seq_naks_rcvd,
    /// Other NAKs sent (invalid request, remote access, remote operational).
    err_naks_sent,
    /// Duplicate requests received.
    duplicate_requests,
    /// Packets that failed the ICRC check.
    icrc_errors,
    /// Packets that failed to parse.
    malformed_pkts,
    /// Packets dropped: unknown QP, wrong state, wrong P_Key, wrong peer,
    /// ghost or stale responses.
    dropped_pkts,
    /// Congestion notification packets received.
    cnp_rcvd,
    /// Completions lost to a full CQ.
    cq_overflows,
    /// UD datagrams dropped for a Q_Key mismatch.
    qkey_violations,
    /// UD datagrams dropped because no receive WR was posted.
    ud_no_recv_drops,
    /// UC messages dropped (a PSN gap, an out-of-sequence packet, a bad
    /// R_Key): reception resumes at the next FIRST/ONLY packet.
    uc_dropped_msgs,
}

impl Counters {
    /// Adds one.
    #[inline]
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
