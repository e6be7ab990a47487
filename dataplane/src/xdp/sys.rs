//! The kernel ABI the `xdp` provider speaks: AF_XDP (`linux/if_xdp.h`) and the few `bpf(2)`
//! commands it needs (`linux/bpf.h`), declared here rather than taken from a bindings crate
//! (the structs are small, stable UAPI, and their layouts are checked by tests below).
//!
//! Every function is a thin, safe wrapper that turns the return value into an
//! [`std::io::Result`]; the `unsafe` is confined to this module.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `AF_XDP` / `PF_XDP`.
pub const AF_XDP: i32 = 44;
/// `SOL_XDP`.
pub const SOL_XDP: i32 = 283;

/// `setsockopt`/`getsockopt` names of `SOL_XDP`.
pub const XDP_MMAP_OFFSETS: i32 = 1;
/// Size of the RX ring.
pub const XDP_RX_RING: i32 = 2;
/// Size of the TX ring.
pub const XDP_TX_RING: i32 = 3;
/// Registers the UMEM.
pub const XDP_UMEM_REG: i32 = 4;
/// Size of the fill ring.
pub const XDP_UMEM_FILL_RING: i32 = 5;
/// Size of the completion ring.
pub const XDP_UMEM_COMPLETION_RING: i32 = 6;
/// Drop counters (`struct xdp_statistics`).
pub const XDP_STATISTICS: i32 = 7;

/// `mmap` offsets of the four rings.
pub const XDP_PGOFF_RX_RING: libc::off_t = 0;
/// TX ring.
pub const XDP_PGOFF_TX_RING: libc::off_t = 0x8000_0000;
/// Fill ring.
pub const XDP_UMEM_PGOFF_FILL_RING: libc::off_t = 0x1_0000_0000;
/// Completion ring.
pub const XDP_UMEM_PGOFF_COMPLETION_RING: libc::off_t = 0x1_8000_0000;

/// `sxdp_flags`: force copy mode.
pub const XDP_COPY: u16 = 1 << 1;
/// `sxdp_flags`: force zero-copy mode (fails where the driver cannot).
pub const XDP_ZEROCOPY: u16 = 1 << 2;
/// `sxdp_flags`: the kernel sets `XDP_RING_NEED_WAKEUP` when it needs a syscall to go on.
pub const XDP_USE_NEED_WAKEUP: u16 = 1 << 3;
/// Ring flag: the kernel waits for a wake-up (`sendto` for TX, `recvfrom` for fill).
pub const XDP_RING_NEED_WAKEUP: u32 = 1;

/// `BPF_MAP_CREATE`.
const BPF_MAP_CREATE: i32 = 0;
/// `BPF_MAP_UPDATE_ELEM`.
const BPF_MAP_UPDATE_ELEM: i32 = 2;
/// `BPF_MAP_DELETE_ELEM`.
const BPF_MAP_DELETE_ELEM: i32 = 3;
/// `BPF_PROG_LOAD`.
const BPF_PROG_LOAD: i32 = 5;
/// `BPF_LINK_CREATE`.
const BPF_LINK_CREATE: i32 = 28;
/// `BPF_MAP_TYPE_XSKMAP`.
pub const BPF_MAP_TYPE_XSKMAP: u32 = 17;
/// `BPF_PROG_TYPE_XDP`.
pub const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP` attach type.
pub const BPF_XDP: u32 = 37;

/// `struct xdp_umem_reg` (with `tx_metadata_len`, 0 here: the kernel takes the longer struct).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct XdpUmemReg {
    /// Start of the UMEM (page aligned).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Frame size (a power of two, 2048..=page size).
    pub chunk_size: u32,
    /// Bytes the kernel leaves free before each received frame.
    pub headroom: u32,
    /// `XDP_UMEM_*` flags.
    pub flags: u32,
    /// Room for TX metadata before each frame (unused).
    pub tx_metadata_len: u32,
}

/// `struct xdp_ring_offset`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct XdpRingOffset {
    /// Offset of the producer index.
    pub producer: u64,
    /// Offset of the consumer index.
    pub consumer: u64,
    /// Offset of the descriptors.
    pub desc: u64,
    /// Offset of the flags word.
    pub flags: u64,
}

/// `struct xdp_mmap_offsets`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct XdpMmapOffsets {
    /// RX ring.
    pub rx: XdpRingOffset,
    /// TX ring.
    pub tx: XdpRingOffset,
    /// Fill ring.
    pub fr: XdpRingOffset,
    /// Completion ring.
    pub cr: XdpRingOffset,
}

/// `struct xdp_desc`: one frame of the RX or TX ring.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct XdpDesc {
    /// Offset of the frame in the UMEM.
    pub addr: u64,
    /// Frame length.
    pub len: u32,
    /// `XDP_PKT_CONTD` etc. (0: a whole frame).
    pub options: u32,
}

/// `struct xdp_statistics`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct XdpStatistics {
    /// Frames dropped for reasons other than an empty fill ring or a full RX ring.
    pub rx_dropped: u64,
    /// Invalid descriptors in the fill ring.
    pub rx_invalid_descs: u64,
    /// Invalid descriptors in the TX ring.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty when a frame arrived.
    pub rx_fill_ring_empty_descs: u64,
    /// Times the TX ring was empty when the kernel looked.
    pub tx_ring_empty_descs: u64,
}

/// `struct sockaddr_xdp`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SockaddrXdp {
    /// `AF_XDP`.
    pub family: u16,
    /// `XDP_COPY`, `XDP_ZEROCOPY`, `XDP_USE_NEED_WAKEUP`.
    pub flags: u16,
    /// Interface index.
    pub ifindex: u32,
    /// Queue of the interface.
    pub queue_id: u32,
    /// Socket whose UMEM to share (`XDP_SHARED_UMEM`).
    pub shared_umem_fd: u32,
}

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BpfInsn {
    /// Opcode.
    pub code: u8,
    /// Destination register (low nibble) and source register (high nibble).
    pub regs: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Opens an AF_XDP socket.
pub fn xsk_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers.
    let fd = cvt(unsafe { libc::socket(AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt(fd, SOL_XDP, name, &value)` for a plain-data `value`.
pub fn set_opt<T: Copy>(fd: &OwnedFd, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` points to `size_of::<T>()` readable bytes for the duration of the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            SOL_XDP,
            name,
            value as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `getsockopt(fd, SOL_XDP, name)` into a plain-data `T` (all-zero is a valid `T`).
pub fn get_opt<T: Copy + Default>(fd: &OwnedFd, name: i32) -> io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `v` has `len` writable bytes; the kernel writes at most `len`.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), SOL_XDP, name, &mut v as *mut T as *mut libc::c_void, &mut len) })?;
    Ok(v)
}

/// Binds an AF_XDP socket to a queue of an interface.
pub fn bind(fd: &OwnedFd, addr: &SockaddrXdp) -> io::Result<()> {
    // SAFETY: `addr` is a valid sockaddr_xdp of the size given.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            addr as *const SockaddrXdp as *const libc::sockaddr,
            std::mem::size_of::<SockaddrXdp>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A shared mapping of one of the socket's rings; unmapped on drop.
pub struct RingMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with the kernel; access to it goes through the
// ring types, whose owners serialise use.
unsafe impl Send for RingMap {}
// SAFETY: as above; `RingMap` itself exposes only the base pointer.
unsafe impl Sync for RingMap {}

impl RingMap {
    /// Maps `len` bytes of ring `pgoff` of socket `fd`.
    pub fn map(fd: &OwnedFd, len: usize, pgoff: libc::off_t) -> io::Result<RingMap> {
        // SAFETY: a fresh shared mapping of the socket's ring; the kernel checks the offset and
        // length against the ring it created.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(RingMap { ptr: p as *mut u8, len })
    }

    /// Base of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never, for a mapped ring).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` created; no reference into it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// `sendto(fd, NULL, 0, MSG_DONTWAIT)`: the TX doorbell. `EAGAIN`, `EBUSY` and `ENOBUFS`
/// mean "the kernel is busy, kick again later" and are not errors.
pub fn kick_tx(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: a zero-length send with no buffer and no address.
    let r = unsafe { libc::sendto(fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS | libc::ENETDOWN)) {
            return Err(e);
        }
    }
    Ok(())
}

/// `recvfrom(fd, NULL, 0, MSG_DONTWAIT)`: wakes the kernel to refill from the fill ring.
pub fn kick_rx(fd: &OwnedFd) {
    // SAFETY: a zero-length receive with no buffer and no address.
    unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
}

/// The index of interface `name` (`if_nametoindex`).
pub fn if_index(name: &str) -> io::Result<u32> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(i)
    }
}

/// `struct ifreq` with its union as raw bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReq {
    name: [u8; 16],
    data: [u8; 24],
}

/// `ioctl(sock, req, &ifreq)` on interface `name`, in the calling thread's network namespace
/// (sysfs shows the namespace it was mounted in, so it is not used).
fn if_ioctl(name: &str, req: libc::c_ulong) -> io::Result<[u8; 24]> {
    if name.is_empty() || name.len() >= 16 || name.contains('\0') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut r = IfReq { name: [0; 16], data: [0; 24] };
    r.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: socket(2) takes no pointers.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `r` is a valid, writable ifreq for the interface requests used here.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req as _, &mut r as *mut IfReq) })?;
    Ok(r.data)
}

/// The Ethernet address of interface `name` (`SIOCGIFHWADDR`); `EINVAL` if not Ethernet.
pub fn if_hwaddr(name: &str) -> io::Result<[u8; 6]> {
    let d = if_ioctl(name, libc::SIOCGIFHWADDR)?;
    // struct sockaddr: sa_family (2 bytes), then the address.
    if u16::from_ne_bytes([d[0], d[1]]) != 1 {
        // ARPHRD_ETHER
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut m = [0u8; 6];
    m.copy_from_slice(&d[2..8]);
    Ok(m)
}

/// The MTU of interface `name` (`SIOCGIFMTU`).
pub fn if_mtu(name: &str) -> io::Result<u32> {
    let d = if_ioctl(name, libc::SIOCGIFMTU)?;
    Ok(i32::from_ne_bytes([d[0], d[1], d[2], d[3]]) as u32)
}

/// Whether interface `name` is up and running (`SIOCGIFFLAGS`: `IFF_UP | IFF_RUNNING`).
pub fn if_running(name: &str) -> bool {
    if_ioctl(name, libc::SIOCGIFFLAGS).is_ok_and(|d| {
        let f = i16::from_ne_bytes([d[0], d[1]]) as i32;
        f & libc::IFF_UP != 0 && f & libc::IFF_RUNNING != 0
    })
}

/// `bpf(cmd, attr, size_of(attr))`, `attr` zero-padded plain data.
fn bpf<T: Copy>(cmd: i32, attr: &T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` points to `size_of::<T>()` readable bytes; every `T` used here is a
    // prefix of `union bpf_attr` for `cmd`, with unused fields zero.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, std::mem::size_of::<T>() as u32) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_of(r: libc::c_long) -> OwnedFd {
    // SAFETY: `r` is a descriptor the kernel just created for us.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// `BPF_MAP_CREATE` of an XSKMAP with `entries` queues.
pub fn xskmap_create(entries: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Attr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
        pad: [u32; 11],
    }
    let a = Attr {
        map_type: BPF_MAP_TYPE_XSKMAP,
        key_size: 4,
        value_size: 4,
        max_entries: entries,
        map_flags: 0,
        pad: [0; 11],
    };
    bpf(BPF_MAP_CREATE, &a).map(fd_of)
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `BPF_MAP_UPDATE_ELEM`: XSKMAP entry `queue` is socket `xsk`.
pub fn xskmap_set(map: &OwnedFd, queue: u32, xsk: &OwnedFd) -> io::Result<()> {
    let (k, v) = (queue, xsk.as_raw_fd() as u32);
    let a = ElemAttr {
        map_fd: map.as_raw_fd() as u32,
        pad: 0,
        key: &k as *const u32 as u64,
        value: &v as *const u32 as u64,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &a).map(drop)
}

/// `BPF_MAP_DELETE_ELEM` of XSKMAP entry `queue`.
pub fn xskmap_clear(map: &OwnedFd, queue: u32) -> io::Result<()> {
    let k = queue;
    let a = ElemAttr { map_fd: map.as_raw_fd() as u32, pad: 0, key: &k as *const u32 as u64, value: 0, flags: 0 };
    bpf(BPF_MAP_DELETE_ELEM, &a).map(drop)
}

/// `BPF_PROG_LOAD` of an XDP program; on failure the verifier's log is in the error.
pub fn prog_load_xdp(insns: &[BpfInsn], expected_attach_type: u32) -> Result<OwnedFd, (io::Error, String)> {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Attr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
        pad: [u64; 8],
    }
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 4096];
    let mut name = [0u8; 16];
    name[..11].copy_from_slice(b"dp_xsk_redi");
    let a = Attr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
        prog_ifindex: 0,
        expected_attach_type,
        pad: [0; 8],
    };
    bpf(BPF_PROG_LOAD, &a).map(fd_of).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        (e, String::from_utf8_lossy(&log[..end]).trim().to_owned())
    })
}

/// `BPF_LINK_CREATE`: attaches XDP program `prog` to interface `ifindex` (`flags` 0: the
/// driver's native XDP where it has one, generic otherwise). Closing the link detaches it.
pub fn xdp_link_create(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Attr {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
        pad: [u64; 6],
    }
    let a =
        Attr { prog_fd: prog.as_raw_fd() as u32, target_ifindex: ifindex, attach_type: BPF_XDP, flags, pad: [0; 6] };
    bpf(BPF_LINK_CREATE, &a).map(fd_of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The UAPI layouts (`linux/if_xdp.h`, `linux/bpf.h`).
    #[test]
    fn layouts_match_the_kernel_headers() {
        assert_eq!(size_of::<XdpUmemReg>(), 32);
        assert_eq!(offset_of!(XdpUmemReg, chunk_size), 16);
        assert_eq!(size_of::<XdpMmapOffsets>(), 128);
        assert_eq!(offset_of!(XdpMmapOffsets, cr), 96);
        assert_eq!(size_of::<XdpDesc>(), 16);
        assert_eq!(size_of::<XdpStatistics>(), 48);
        assert_eq!(size_of::<SockaddrXdp>(), 16);
        assert_eq!(offset_of!(SockaddrXdp, queue_id), 8);
        assert_eq!(size_of::<BpfInsn>(), 8);
    }
}
