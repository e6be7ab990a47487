//! rdma-core's libibverbs, owned and loaded at run time.
//!
//! - [`sys`]: the raw types of `<infiniband/verbs.h>`, generated with bindgen by
//!   `tools/gen-rdma-bindings.sh` and committed, so building needs neither libclang nor
//!   libibverbs-dev.
//! - [`loader`]: opens `libibverbs.so.1` with `dlopen` the first time it is needed and resolves
//!   each entry point with `dlvsym` at a fixed symbol version into [`Verbs`], a table of typed
//!   function pointers. It also holds the static inline verbs of the header (`ibv_post_send`,
//!   `ibv_poll_cq`, `ibv_query_device_ex`...), which call through the context's function
//!   pointers and so have no symbol to resolve.
//! - [`device`]: listing and opening devices, with one clear sentence for each reason there is
//!   none (library missing, kernel without InfiniBand, no device, unknown name).
//!
//! A binary built with this module runs on machines with no RDMA stack at all: nothing links
//! libibverbs, and the library is only looked for when a device is asked for. See
//! docs/rdma-bindings.md for why the bindings are owned and how to regenerate them.

#![warn(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

pub mod device;
pub mod loader;
mod provider;
#[allow(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]
pub mod sys;

pub use device::{list_devices, open_device_by_name, DeviceContext, DeviceInfo};
pub use loader::{verbs, Verbs, LIBRARY};
pub use provider::{Rdma, RdmaAh, RdmaConfig, RdmaContext, RdmaCq, RdmaMr, RdmaPd, RdmaQp, RdmaRegion, RdmaSrq};
