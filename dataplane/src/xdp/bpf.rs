//! The XDP program that hands received frames to the provider's AF_XDP sockets, loaded with
//! the `bpf(2)` syscall (no libbpf, libxdp or clang needed; docs/dependencies.md says why).
//!
//! It is six instructions, the C equivalent of
//!
//! ```c
//! return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
//! ```
//!
//! A frame that arrives on a queue with a socket in the XSKMAP goes to that socket; on any
//! other queue (or before the socket is in the map) it goes on to the kernel's stack. The
//! program is attached through a BPF link: it is detached when the link's descriptor closes,
//! so a crashed process never leaves it behind.

use super::sys::{self, BpfInsn};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// `offsetof(struct xdp_md, rx_queue_index)`.
const XDP_MD_RX_QUEUE_INDEX: i16 = 16;
/// `XDP_PASS`: the redirect's fallback action when the map has no socket for the queue.
const XDP_PASS: i32 = 2;
/// `BPF_FUNC_redirect_map`.
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `BPF_PSEUDO_MAP_FD`: the immediate of a 64-bit load is a map descriptor.
const BPF_PSEUDO_MAP_FD: u8 = 1;

/// The program for XSKMAP `map`.
fn program(map: &OwnedFd) -> [BpfInsn; 6] {
    let insn = |code: u8, dst: u8, src: u8, off: i16, imm: i32| BpfInsn { code, regs: dst | src << 4, off, imm };
    [
        // r2 = *(u32 *)(r1 + rx_queue_index)     BPF_LDX | BPF_MEM | BPF_W
        insn(0x61, 2, 1, XDP_MD_RX_QUEUE_INDEX, 0),
        // r1 = map (two-slot 64-bit immediate)  BPF_LD | BPF_DW | BPF_IMM
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map.as_raw_fd()),
        insn(0, 0, 0, 0, 0),
        // r3 = XDP_PASS                          BPF_ALU64 | BPF_MOV | BPF_K
        insn(0xb7, 3, 0, 0, XDP_PASS),
        // r0 = bpf_redirect_map(r1, r2, r3)      BPF_JMP | BPF_CALL
        insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        // return r0                              BPF_JMP | BPF_EXIT
        insn(0x95, 0, 0, 0, 0),
    ]
}

/// The redirect program attached to one interface, with its XSKMAP.
pub struct Redirect {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl Redirect {
    /// Loads the program with an XSKMAP of `queues` entries and attaches it to `ifindex`.
    /// Errors name the step: the map, the load (with the verifier's log) or the attach
    /// (`EBUSY`: another XDP program is on the interface).
    pub fn attach(ifindex: u32, queues: u32) -> Result<Redirect, String> {
        let map = sys::xskmap_create(queues).map_err(|e| format!("creating the XSKMAP (bpf BPF_MAP_CREATE): {e}"))?;
        let insns = program(&map);
        // Kernels that check it want BPF_XDP as the expected attach type of a program
        // attached through a link; older ones refuse any value but 0.
        let prog = match sys::prog_load_xdp(&insns, sys::BPF_XDP) {
            Ok(p) => p,
            Err(_) => sys::prog_load_xdp(&insns, 0).map_err(|(e, log)| {
                format!("loading the XDP redirect program (bpf BPF_PROG_LOAD): {e}; verifier: {log}")
            })?,
        };
        let link = sys::xdp_link_create(&prog, ifindex, 0).map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EBUSY) {
                " (another XDP program is attached to the interface: `ip link set dev IF xdp off`)"
            } else {
                ""
            };
            format!("attaching the XDP program (bpf BPF_LINK_CREATE): {e}{hint}")
        })?;
        Ok(Redirect { map, _prog: prog, _link: link })
    }

    /// Frames of queue `queue` go to socket `xsk` from now on.
    pub fn set(&self, queue: u32, xsk: &OwnedFd) -> io::Result<()> {
        sys::xskmap_set(&self.map, queue, xsk)
    }

    /// Frames of queue `queue` go to the kernel again.
    pub fn clear(&self, queue: u32) -> io::Result<()> {
        sys::xskmap_clear(&self.map, queue)
    }
}
