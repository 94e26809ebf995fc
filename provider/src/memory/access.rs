//! Access flags (`ibv_access_flags`): what a region, a window or a QP
//! lets the local and remote sides do.

use bitflags::bitflags;

bitflags! {
    /// Memory region and QP access flags (`ibv_access_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// Local write (required for remote write and remote atomic, and
        /// for receive buffers and READ/atomic result buffers).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE.
        const REMOTE_WRITE = 2;
        /// Remote peers may RDMA READ.
        const REMOTE_READ = 4;
        /// Remote peers may perform atomics.
        const REMOTE_ATOMIC = 8;
        /// Memory windows may be bound to the region.
        const MW_BIND = 16;
        /// Zero-based addressing: the region's keys (or a type 2 window's
        /// R_Key, in a bind's access) address it by the byte offset from
        /// its start instead of by virtual address (the region's iova is
        /// 0, IBA 10.6.3.1 "zero based virtual address").
        const ZERO_BASED = 32;
        /// Remote peers may RDMA FLUSH for global visibility (IBA 1.5).
        const FLUSH_GLOBAL = 1 << 8;
        /// Remote peers may RDMA FLUSH for persistence (IBA 1.5; uroce
        /// has no persistent memory and refuses it).
        const FLUSH_PERSISTENT = 1 << 9;
    }
}
