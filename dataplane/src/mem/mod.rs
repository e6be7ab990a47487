//! Memory: hugepage-backed regions that other processes can map, and buffer pools.

mod region;

pub use region::{HugePolicy, PageSize, Region, RegionBacking};
