//! Memory and QP access flags (`enum ibv_access_flags`).

bitflags::bitflags! {
    /// What local and remote operations may do to a memory region or through a QP.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The local HCA may write (required for receive buffers and RDMA READ targets).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA WRITE (requires LOCAL_WRITE).
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA READ.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform atomics (requires LOCAL_WRITE).
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to this region.
        const MW_BIND = 1 << 4;
        /// Addresses are offsets from the start of the region.
        const ZERO_BASED = 1 << 5;
    }
}
