//! UD multicast on the shm fabric: `attach_mcast`/`detach_mcast` (`ibv_attach_mcast(3)`).
//!
//! The arguments are checked as rdma-core and the kernel check them (UD QPs only, a GID in
//! `ff00::/8`). The group table itself belongs in the shared fabric so that QPs of every
//! process on the host can join one group, and the UD send path must fan a send to
//! QPN `0xFFFFFF` out to its members; neither exists yet, so a valid request fails with
//! `EOPNOTSUPP` rather than pretending to join a group that would never deliver.

use crate::verbs::{Errno, Error, QpType, Result};

/// `ibv_attach_mcast` on a shm QP.
pub(super) fn attach(qpn: u32, qp_type: QpType, gid: &[u8; 16], _lid: u16) -> Result<()> {
    crate::provider::check_mcast_attach("attach_mcast", qpn, qp_type, gid)?;
    Err(not_yet("attach_mcast"))
}

/// `ibv_detach_mcast` on a shm QP.
pub(super) fn detach(qpn: u32, qp_type: QpType, gid: &[u8; 16], _lid: u16) -> Result<()> {
    crate::provider::check_mcast_attach("detach_mcast", qpn, qp_type, gid)?;
    Err(not_yet("detach_mcast"))
}

fn not_yet(verb: &str) -> Error {
    Error::new(Errno::EOPNOTSUPP, format!("{verb}: the shm provider has no multicast groups yet"))
}
