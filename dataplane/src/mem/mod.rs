//! Memory: hugepage-backed regions that other processes can map, and buffer pools.

pub mod pool;
mod region;

pub use pool::{Buf, BufferPool, PoolCache, CACHE_LINE};
pub use region::{HugePolicy, PageSize, Region, RegionBacking};
