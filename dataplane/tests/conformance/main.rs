//! The conformance suite: the verbs semantics of rdma-core's man pages (`ibv_post_send(3)`,
//! `ibv_post_recv(3)`, `ibv_post_srq_recv(3)` and its notes), one case per rule, generic over
//! the provider. docs/conformance.md lists each seed sentence and the case that checks it.
//!
//! Every case runs on `shm` here; the `rdma` provider instantiates the same cases inside the
//! Soft-RoCE VM.

mod atomics_two_process;
mod cases;
mod harness;
mod shm_only;
mod two_process;

use harness::Harness;

/// Runs the suite on the `shm` provider; each test gets its own fabric.
pub struct ShmHarness;

impl Harness for ShmHarness {
    type P = dataplane::shm::Shm;
    fn config(test: &str, _node: usize) -> dataplane::shm::ShmConfig {
        dataplane::shm::ShmConfig {
            fabric: format!("conf-{test}-{}", std::process::id()),
            size: 16 << 20,
            huge: dataplane::mem::HugePolicy::Never,
        }
    }
}

/// Instantiates every case for one harness.
macro_rules! suite {
    ($h:ty; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                if let Some(why) = <$h as Harness>::unsupported(stringify!($case)) {
                    println!("conformance case {} NOT RUN on this provider: {why}", stringify!($case));
                    return;
                }
                crate::cases::$case::<$h>(stringify!($case));
            }
        )*
    };
}

mod shm {
    use super::*;
    include!("case_list.rs");
}
