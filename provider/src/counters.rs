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
    /// Times an RC requester halved its congestion window (at a
    /// retransmission timeout).
    window_cuts,
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
    /// Packets dropped, for any reason: unknown QP, wrong state, wrong
    /// P_Key, wrong peer, ghost or stale responses, unmatched duplicates.
    /// The `drop_*` counters below break most of these down.
    dropped_pkts,
    /// Dropped: from an address (or, with strict source ports, a UDP
    /// port) other than the connected peer's.
    drop_wrong_source,
    /// Dropped: a P_Key other than the QP's partition.
    drop_bad_pkey,
    /// Dropped: the QP's state does not take this packet (not yet RTR, in
    /// ERR, a response in RTR), or the transport does not match the QP.
    drop_bad_state,
    /// Dropped: a duplicate RDMA READ or atomic request that matches none
    /// of the QP's responder resources (not executed, not answered).
    drop_unmatched_duplicate,
    /// Dropped: a request that arrived while the QP's deferred-request
    /// queue was full (the requester resends it).
    drop_deferred_full,
    /// Not sent: an ACK or RNR NAK while the QP's response queue was full
    /// (the requester's timer recovers).
    drop_response_queue_full,
    /// Request packets out of opcode sequence (a MIDDLE or LAST with no
    /// message open, another operation's packet inside a message, a FIRST
    /// while one is open): RC answers with an invalid request NAK, UC
    /// drops the message.
    bad_opcode_sequence,
    /// RC/UC request packets whose PSN lies further than 2^14 from the
    /// expected PSN, ahead or behind: beyond any real requester's window,
    /// so a PSN sweep (an off-path attacker guessing the connection's
    /// PSNs) or a badly broken peer.
    psn_out_of_window,
    /// Times a QP reported `PsnSweep` (more than 64 out-of-window packets
    /// within one second).
    psn_sweeps,
    /// Congestion notification packets received.
    cnp_rcvd,
    /// Completions lost to a full CQ.
    cq_overflows,
    /// UD datagrams dropped for a Q_Key mismatch.
    qkey_violations,
    /// UD datagrams dropped because no receive WR was posted.
    ud_no_recv_drops,
    /// UD datagrams dropped because the receive WR at the head of the
    /// queue is too small for GRH + payload (IBA class D, rxe since 6.10:
    /// the WR stays for the next datagram).
    ud_too_long_drops,
    /// UC messages dropped (a PSN gap, an out-of-sequence packet, a bad
    /// R_Key): reception resumes at the next FIRST/ONLY packet.
    uc_dropped_msgs,
    /// CM MADs sent on QP1 (first sends and resends).
    cm_mads_sent,
    /// CM MADs received that parsed.
    cm_mads_rcvd,
    /// QP1 packets that are not a well-formed CM MAD (bad MAD header,
    /// unknown attribute, truncated): dropped.
    cm_malformed_mads,
    /// CM MADs dropped: no connection they name, a state that does not
    /// take them, LAP/APR, not a UD SEND.
    cm_dropped_mads,
    /// CM messages resent after their response timeout.
    cm_retries,
    /// Duplicate CM messages received (answered as the state says).
    cm_duplicates,
    /// CM MADs this process's QP1 passed to the process sharing the
    /// device that owns them (see `engine::share`).
    cm_forwarded,
    /// CM MADs for a connection whose process has exited: a DREQ answered
    /// with a DREP, a REP with a REJ, the rest dropped, as the kernel's CM
    /// does from time-wait.
    cm_orphans,
    /// Send system calls the engine made (sendmmsg or sendto).
    tx_syscalls,
    /// Packets handed to the kernel inside UDP GSO messages (each message
    /// a run of whole RoCEv2 packets the kernel splits at their size).
    tx_gso_msgs,
    /// Receive system calls that returned datagrams (recvmmsg).
    rx_syscalls,
    /// Datagrams received as UDP GRO aggregates (split at the segment
    /// size the kernel reports).
    rx_gro_msgs,
    /// Datagrams the kernel dropped because the engine's socket receive
    /// buffer was full (SO_RXQ_OVFL).
    rx_socket_drops,
    /// Datagrams for a QP of another process sharing the device, steered
    /// here while the group changed: dropped, never handed to a QP (see
    /// `engine::share`).
    rx_foreign,
    /// Datagrams the kernel refused to send (a full send buffer, an
    /// unreachable address): dropped, as a full NIC queue would.
    tx_socket_drops,
}

impl Counters {
    /// Adds one.
    #[inline]
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
