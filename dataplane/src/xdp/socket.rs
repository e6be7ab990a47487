//! One AF_XDP socket: its UMEM (frames in the project's hugepage-backed memory), its four
//! rings, and the bind to one queue of an interface, zero-copy where the driver can and copy
//! mode otherwise.
//!
//! The UMEM is split in two: the first half of the frames circulates through the fill and RX
//! rings (receive), the second half through the TX and completion rings (send), so neither
//! direction can starve the other.

use super::ring::Ring;
use super::sys::{self, SockaddrXdp, XdpDesc, XdpMmapOffsets, XdpUmemReg};
use crate::mem::{HugePolicy, Region};
use std::os::fd::OwnedFd;

/// How the socket moves frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum XdpMode {
    /// Zero-copy if the driver supports it, copy mode otherwise (the default).
    #[default]
    Auto,
    /// Copy mode only (`XDP_COPY`): works on every interface, veth included.
    Copy,
    /// Zero-copy only (`XDP_ZEROCOPY`): fails where the driver cannot.
    ZeroCopy,
}

/// Sizes of a socket.
#[derive(Debug, Clone, Copy)]
pub struct XskSizes {
    /// Frames in the UMEM (a power of two, at least 64); half receive, half send.
    pub frames: u32,
    /// Bytes per frame (2048 or 4096): the largest frame sent or received.
    pub frame_size: u32,
}

/// An AF_XDP socket bound to one queue.
pub struct Xsk {
    /// The socket (the doorbell target and the XSKMAP value).
    pub fd: OwnedFd,
    /// Fill ring: UMEM frames the kernel may receive into.
    pub fill: Ring<u64>,
    /// Completion ring: UMEM frames the kernel has sent.
    pub comp: Ring<u64>,
    /// RX ring: received frames.
    pub rx: Ring<XdpDesc>,
    /// TX ring: frames to send.
    pub tx: Ring<XdpDesc>,
    /// The UMEM.
    pub umem: Region,
    /// Frame size.
    pub frame_size: u32,
    /// Frames in the UMEM.
    pub frames: u32,
    /// Whether the bind is zero-copy.
    pub zero_copy: bool,
}

impl Xsk {
    /// Opens a socket on queue `queue` of interface `ifindex` (`ifname` for messages) with
    /// `sizes` and `mode`, and stocks the fill ring with the receive half of the UMEM.
    pub fn open(ifname: &str, ifindex: u32, queue: u32, sizes: XskSizes, mode: XdpMode) -> Result<Xsk, String> {
        match mode {
            XdpMode::Copy => Self::open_with(ifname, ifindex, queue, sizes, sys::XDP_COPY),
            XdpMode::ZeroCopy => Self::open_with(ifname, ifindex, queue, sizes, sys::XDP_ZEROCOPY),
            XdpMode::Auto => Self::open_with(ifname, ifindex, queue, sizes, sys::XDP_ZEROCOPY)
                .or_else(|_| Self::open_with(ifname, ifindex, queue, sizes, sys::XDP_COPY)),
        }
    }

    fn open_with(ifname: &str, ifindex: u32, queue: u32, sizes: XskSizes, mode_flag: u16) -> Result<Xsk, String> {
        let XskSizes { frames, frame_size } = sizes;
        if !frames.is_power_of_two() || frames < 64 || !matches!(frame_size, 2048 | 4096) {
            return Err(format!(
                "frames = {frames} must be a power of two >= 64 and frame_size = {frame_size} 2048 or 4096"
            ));
        }
        let ctx = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| format!("{ifname} queue {queue}: {what}: {e}")
        };
        let fd = sys::xsk_socket().map_err(ctx("socket(AF_XDP)"))?;
        let len = frames as usize * frame_size as usize;
        let umem = Region::anonymous(len, HugePolicy::default())
            .map_err(|e| format!("{ifname} queue {queue}: UMEM of {len} bytes: {e}"))?;
        let reg =
            XdpUmemReg { addr: umem.as_ptr() as u64, len: len as u64, chunk_size: frame_size, ..Default::default() };
        sys::set_opt(&fd, sys::XDP_UMEM_REG, &reg).map_err(ctx("XDP_UMEM_REG"))?;
        let half = frames / 2;
        for (opt, what) in [
            (sys::XDP_UMEM_FILL_RING, "XDP_UMEM_FILL_RING"),
            (sys::XDP_UMEM_COMPLETION_RING, "XDP_UMEM_COMPLETION_RING"),
            (sys::XDP_RX_RING, "XDP_RX_RING"),
            (sys::XDP_TX_RING, "XDP_TX_RING"),
        ] {
            sys::set_opt(&fd, opt, &(half as i32)).map_err(ctx(what))?;
        }
        let off: XdpMmapOffsets = sys::get_opt(&fd, sys::XDP_MMAP_OFFSETS).map_err(ctx("XDP_MMAP_OFFSETS"))?;
        let n = half as usize;
        let map = |o: u64, each: usize, pgoff| sys::RingMap::map(&fd, o as usize + n * each, pgoff);
        let fill = Ring::producer(
            map(off.fr.desc, 8, sys::XDP_UMEM_PGOFF_FILL_RING).map_err(ctx("mmap fill ring"))?,
            &off.fr,
            half,
        );
        let comp = Ring::consumer(
            map(off.cr.desc, 8, sys::XDP_UMEM_PGOFF_COMPLETION_RING).map_err(ctx("mmap completion ring"))?,
            &off.cr,
            half,
        );
        let rx =
            Ring::consumer(map(off.rx.desc, 16, sys::XDP_PGOFF_RX_RING).map_err(ctx("mmap RX ring"))?, &off.rx, half);
        let tx =
            Ring::producer(map(off.tx.desc, 16, sys::XDP_PGOFF_TX_RING).map_err(ctx("mmap TX ring"))?, &off.tx, half);
        let addr = SockaddrXdp {
            family: sys::AF_XDP as u16,
            flags: mode_flag | sys::XDP_USE_NEED_WAKEUP,
            ifindex,
            queue_id: queue,
            shared_umem_fd: 0,
        };
        sys::bind(&fd, &addr).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EBUSY) => " (another AF_XDP socket is bound to this queue: another dataplane context?)",
                Some(libc::EINVAL) => " (no such queue on the interface?)",
                Some(libc::EOPNOTSUPP) if mode_flag == sys::XDP_ZEROCOPY => " (the driver has no zero-copy AF_XDP)",
                _ => "",
            };
            format!("{ifname} queue {queue}: bind: {e}{hint}")
        })?;
        let mut x = Xsk { fd, fill, comp, rx, tx, umem, frame_size, frames, zero_copy: mode_flag == sys::XDP_ZEROCOPY };
        let got = x.fill.free(half);
        for k in 0..got.min(half) {
            x.fill.push(u64::from(k) * u64::from(frame_size));
        }
        x.fill.publish();
        Ok(x)
    }

    /// UMEM address of the first send frame (frames from here on are the send half).
    pub fn tx_base(&self) -> u64 {
        u64::from(self.frames / 2) * u64::from(self.frame_size)
    }

    /// Pointer to `len` bytes of the UMEM at `addr`, or `None` if outside it (a descriptor
    /// from the kernel is checked before use).
    pub fn frame_ptr(&self, addr: u64, len: usize) -> Option<*mut u8> {
        let end = (addr as usize).checked_add(len)?;
        if end > self.umem.len() {
            return None;
        }
        // SAFETY: `addr + len` is inside the UMEM mapping (checked above).
        Some(unsafe { self.umem.as_ptr().add(addr as usize) })
    }

    /// The kernel's drop counters for this socket.
    pub fn statistics(&self) -> std::io::Result<sys::XdpStatistics> {
        sys::get_opt(&self.fd, sys::XDP_STATISTICS)
    }
}
