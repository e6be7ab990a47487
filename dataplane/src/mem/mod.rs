//! Memory: hugepage-backed regions that other processes can map, and buffer pools.

pub mod pool;
mod prefetch;
mod region;

pub use pool::{Buf, BufferPool, PoolCache, CACHE_LINE};
pub(crate) use prefetch::prefetch_for_write;
pub use region::{HugePolicy, PageSize, Region, RegionBacking};
