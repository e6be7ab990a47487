//! UD multicast on the shm fabric: the group table behind `attach_mcast`/`detach_mcast`
//! (`ibv_attach_mcast(3)`) and the member lists the UD send path fans a message out to.
//!
//! The table lives in the fabric ([`McastSlot`], [`MAX_MCAST_GRP`] groups of up to
//! [`MAX_MCAST_QP_ATTACH`] QPs), so QPs of every process attached to the fabric can join one
//! group and one send reaches them all, as a NIC's multicast does on one port. Changes happen
//! under the control-path lock; senders read the member list without it and cache it per send
//! queue until the group's `gen` moves (`exec::exec_mcast`).
//!
//! Choices, following what rdma-core providers and the kernel do:
//! - A group is named by its GID; the MLID given at attach is recorded but not matched (RoCE
//!   ignores it; on IB it is the subnet manager's mapping of the same group).
//! - Attaching a QP already in the group succeeds and it still gets one copy per message
//!   (`ibv_attach_mcast(3)`); detaching a group the QP is not in is `EINVAL` (rxe, the kernel
//!   core's `ib_detach_mcast`).
//! - A full table or a full group is `ENOMEM`.
//! - A destroyed QP leaves its groups ([`detach_all`]); a dead process's QPs are dropped from a
//!   group at the next attach to it and are skipped by senders meanwhile (their QPN no longer
//!   names a live slot).
//! - A group slot, once created (by an attach or by an address handle naming the group), is
//!   kept for the fabric's lifetime: address handles name it by index, so reusing the slot for
//!   another GID would redirect them.

use super::fabric::Fabric;
use super::layout::{key_index, McastSlot, MAX_MCAST_GRP, MAX_MCAST_QP_ATTACH, MAX_QP, QP_IDX_BITS};
use crate::verbs::{Errno, Error, QpType, Result};
use std::net::Ipv6Addr;
use std::sync::atomic::Ordering;

/// The two big-endian halves a GID is stored as.
fn halves(gid: &[u8; 16]) -> (u64, u64) {
    let hi = u64::from_be_bytes(gid[..8].try_into().expect("8 bytes"));
    let lo = u64::from_be_bytes(gid[8..].try_into().expect("8 bytes"));
    (hi, lo)
}

/// The GID of group slot `g` (all zeros for a free slot).
pub(crate) fn group_gid(g: &McastSlot) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[..8].copy_from_slice(&g.gid_hi.load(Ordering::Acquire).to_be_bytes());
    gid[8..].copy_from_slice(&g.gid_lo.load(Ordering::Relaxed).to_be_bytes());
    gid
}

/// The index of the group named `gid`, if it exists.
fn find(f: &Fabric, gid: &[u8; 16]) -> Option<usize> {
    let (hi, lo) = halves(gid);
    (0..MAX_MCAST_GRP).find(|&i| {
        let g = f.mcast_slot(i);
        g.gid_hi.load(Ordering::Acquire) == hi && g.gid_lo.load(Ordering::Relaxed) == lo
    })
}

/// The group named `gid`, created empty if it does not exist. Call with the lock held.
fn find_or_create(f: &Fabric, gid: &[u8; 16], lid: u16) -> Result<usize> {
    if let Some(i) = find(f, gid) {
        return Ok(i);
    }
    let Some(i) = (0..MAX_MCAST_GRP).find(|&i| f.mcast_slot(i).gid_hi.load(Ordering::Relaxed) == 0) else {
        return Err(Error::new(
            Errno::ENOMEM,
            format!(
                "multicast group {}: all {MAX_MCAST_GRP} groups of the shm fabric are in use (max_mcast_grp)",
                Ipv6Addr::from(*gid)
            ),
        ));
    };
    let g = f.mcast_slot(i);
    let (hi, lo) = halves(gid);
    for m in &g.members {
        m.store(0, Ordering::Relaxed);
    }
    g.mlid.store(u32::from(lid), Ordering::Relaxed);
    g.gid_lo.store(lo, Ordering::Relaxed);
    g.gen.fetch_add(1, Ordering::Release);
    // Published last: a reader that sees the GID sees the rest.
    g.gid_hi.store(hi, Ordering::Release);
    Ok(i)
}

/// Whether `qpn` names a live QP slot of the fabric.
fn qp_alive(f: &Fabric, qpn: u32) -> bool {
    let idx = key_index(qpn, QP_IDX_BITS);
    idx < MAX_QP && f.qp_slot(idx).qpn.load(Ordering::Acquire) == qpn
}

/// `ibv_attach_mcast` on a shm QP.
///
/// Errors: `EINVAL` for a QP that is not UD or a GID outside `ff00::/8`; `ENOMEM` when the
/// fabric's group table or the group is full; `ETIMEDOUT` when the control-path lock is wedged.
pub(super) fn attach(f: &Fabric, qpn: u32, qp_type: QpType, gid: &[u8; 16], lid: u16) -> Result<()> {
    crate::provider::check_mcast_attach("attach_mcast", qpn, qp_type, gid)?;
    let _l = f.lock()?;
    let i = find_or_create(f, gid, lid)?;
    let g = f.mcast_slot(i);
    let mut changed = false;
    // Members whose QP is gone (destroyed by a process that died) free their cell here.
    for m in &g.members {
        let q = m.load(Ordering::Relaxed);
        if q != 0 && q != qpn && !qp_alive(f, q) {
            m.store(0, Ordering::Relaxed);
            changed = true;
        }
    }
    let result = if g.members.iter().any(|m| m.load(Ordering::Relaxed) == qpn) {
        Ok(())
    } else if let Some(cell) = g.members.iter().find(|m| m.load(Ordering::Relaxed) == 0) {
        cell.store(qpn, Ordering::Relaxed);
        changed = true;
        Ok(())
    } else {
        Err(Error::new(
            Errno::ENOMEM,
            format!(
                "attach_mcast: group {} already has {MAX_MCAST_QP_ATTACH} QPs attached (max_mcast_qp_attach)",
                Ipv6Addr::from(*gid)
            ),
        ))
    };
    if changed {
        g.gen.fetch_add(1, Ordering::Release);
    }
    result
}

/// `ibv_detach_mcast` on a shm QP.
///
/// Errors: `EINVAL` as for [`attach`], and for a group this QP is not attached to.
pub(super) fn detach(f: &Fabric, qpn: u32, qp_type: QpType, gid: &[u8; 16], _lid: u16) -> Result<()> {
    crate::provider::check_mcast_attach("detach_mcast", qpn, qp_type, gid)?;
    let _l = f.lock()?;
    let cell = find(f, gid).and_then(|i| {
        let g = f.mcast_slot(i);
        g.members.iter().find(|m| m.load(Ordering::Relaxed) == qpn).map(|m| (g, m))
    });
    let Some((g, m)) = cell else {
        return Err(Error::new(
            Errno::EINVAL,
            format!("detach_mcast: QP {qpn:#x} is not attached to group {}", Ipv6Addr::from(*gid)),
        ));
    };
    m.store(0, Ordering::Relaxed);
    g.gen.fetch_add(1, Ordering::Release);
    Ok(())
}

/// Removes `qpn` from every group (the QP is being destroyed). Call with the lock held.
pub(super) fn detach_all(f: &Fabric, qpn: u32) {
    for i in 0..MAX_MCAST_GRP {
        let g = f.mcast_slot(i);
        if g.gid_hi.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let mut changed = false;
        for m in &g.members {
            if m.load(Ordering::Relaxed) == qpn {
                m.store(0, Ordering::Relaxed);
                changed = true;
            }
        }
        if changed {
            g.gen.fetch_add(1, Ordering::Release);
        }
    }
}

/// The group slot an address handle to multicast GID `gid` names (created empty if needed, so
/// an AH may be made before anyone joins).
///
/// Errors: `ENOMEM` when the group table is full; `ETIMEDOUT` for a wedged lock.
pub(super) fn group_for_ah(f: &Fabric, gid: &[u8; 16], lid: u16) -> Result<usize> {
    if let Some(i) = find(f, gid) {
        return Ok(i);
    }
    let _l = f.lock()?;
    find_or_create(f, gid, lid)
}

/// A consistent copy of group `grp`'s member list and the `gen` it was read at: `gen` is
/// read before and after the members, and the read is retried while a change was under way
/// (bounded: a peer rewriting the table forever gets an empty list, i.e. no delivery).
pub(super) fn snapshot(f: &Fabric, grp: usize, out: &mut Vec<u32>) -> u32 {
    let g = f.mcast_slot(grp);
    for _ in 0..16 {
        let gen = g.gen.load(Ordering::Acquire);
        out.clear();
        out.extend(g.members.iter().map(|m| m.load(Ordering::Acquire)).filter(|&q| q != 0));
        if g.gen.load(Ordering::Acquire) == gen {
            return gen;
        }
    }
    out.clear();
    g.gen.load(Ordering::Acquire)
}

/// The group's current `gen`, to validate a cached member list.
#[inline]
pub(super) fn gen(f: &Fabric, grp: usize) -> u32 {
    f.mcast_slot(grp).gen.load(Ordering::Acquire)
}
