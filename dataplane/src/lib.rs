//! # dataplane
//!
//! A kernel-bypass dataplane on RDMA verbs. Pinned workers own queue pairs and completion
//! queues on hugepage-backed memory and busy-poll them; the same verbs semantics run on two
//! providers:
//!
//! - [`shm`]: a software NIC over shared memory, across threads and processes of one host.
//!   The poster's CPU is the DMA engine. The embedded default; needs no setup.
//! - [`rdma`]: rdma-core's libibverbs, for real NICs and Soft-RoCE, loaded at run time.
//!
//! Start with [`verbs`] (the model) and [`provider`] (the traits), then the programs in
//! `apps/src/bin/`: `shm-pingpong.rs` (the verbs by hand, smallest), `dp-pingpong.rs` (generic
//! over the provider) and `dataplane.rs` (the pipeline runner over [`worker`] and
//! [`pipeline`]); docs/ describes each provider and the runtime.

#![warn(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

pub mod conn;
pub mod mem;
pub mod net;
pub mod pipeline;
pub mod provider;
#[cfg(target_os = "linux")]
pub mod rdma;
pub mod shm;
pub mod verbs;
pub mod worker;
#[cfg(target_os = "linux")]
pub mod xdp;

pub use provider::{Ah, Context, Cq, MemRegion, Mr, Pd, Provider, Qp, QpInitAttr, Srq, Xrcd};
