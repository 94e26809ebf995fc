//! Set-up the loopback tests share.
#![allow(dead_code)] // each test binary uses its own part

use std::time::Duration;
use uroce_verbs::*;

/// How long a test waits for completions or events.
pub const T: Duration = Duration::from_secs(20);

/// Opens a device on a loopback address.
pub fn open(ip: &str) -> Context {
    Device::new("t", ip.parse().unwrap())
        .open()
        .expect("open device")
}

/// Small queues: 64 WRs, 2 SGEs, 64 bytes inline.
pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

/// A QP of type `t` with one CQ for both queues, optionally on an SRQ.
pub fn qp(
    pd: &ProtectionDomain,
    cq: &CompletionQueue,
    t: QpType,
    srq: Option<&SharedReceiveQueue>,
) -> QueuePair {
    pd.create_qp(&QpInitAttr {
        send_cq: cq,
        recv_cq: cq,
        cap: cap(),
        qp_type: t,
        sq_sig_all: false,
        srq,
    })
    .unwrap()
}

/// A receive WR over `len` bytes at `off` of `mr`.
pub fn recv(id: u64, mr: &MemoryRegion, off: usize, len: u32) -> RecvWr {
    RecvWr {
        wr_id: id,
        sg_list: [mr.sge(off, len)].into_iter().collect(),
    }
}
