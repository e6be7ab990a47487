//! Listing and opening RDMA devices, with one clear sentence for each reason there is none.

use std::ffi::{c_int, CStr};
use std::ptr::NonNull;

use super::loader::{verbs, Verbs};
use super::sys;
use crate::verbs::{Errno, Error, Result};

/// An RDMA device as `ibv_get_device_list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `mlx5_0` or `rxe0`.
    pub name: String,
    /// Node GUID as a number (converted from the wire's big-endian order); `ibv_devinfo` prints
    /// it as four groups of four hex digits.
    pub guid: u64,
}

/// The RDMA devices of this machine.
///
/// Fails, each time with one sentence saying what to do:
/// - `ENOENT`: libibverbs.so.1 is not installed;
/// - `ENOSYS`: the kernel has no RDMA support (no InfiniBand subsystem);
/// - `ENODEV`: the kernel has RDMA support but no device is present;
/// - otherwise the errno of `ibv_get_device_list`.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let v = verbs()?;
    let list = DeviceList::get(v)?;
    Ok(list
        .iter()
        .map(|dev| {
            // SAFETY: `dev` comes from a list that is still held; the name is a NUL-terminated
            // string owned by the device.
            let name = unsafe { CStr::from_ptr((v.get_device_name)(dev)) };
            // SAFETY: as above.
            let guid = unsafe { (v.get_device_guid)(dev) };
            DeviceInfo { name: name.to_string_lossy().into_owned(), guid: u64::from_be(guid) }
        })
        .collect())
}

/// Opens the device called `name` (as [`list_devices`] names it).
///
/// Fails as [`list_devices`] does; with `ENODEV` and "RDMA device "X" not found; available:
/// a, b" for an unknown name; or with the errno of `ibv_open_device`.
pub fn open_device_by_name(name: &str) -> Result<DeviceContext> {
    let v = verbs()?;
    let list = DeviceList::get(v)?;
    let mut names = Vec::new();
    for dev in list.iter() {
        // SAFETY: `dev` comes from the held list; the name is NUL-terminated.
        let dev_name = unsafe { CStr::from_ptr((v.get_device_name)(dev)) }.to_string_lossy();
        if dev_name != name {
            names.push(dev_name.into_owned());
            continue;
        }
        // SAFETY: `dev` comes from the held list; the context outlives the list, as
        // ibv_free_device_list(3) allows for opened devices.
        let ctx = unsafe { (v.open_device)(dev) };
        return match NonNull::new(ctx) {
            Some(ctx) => Ok(DeviceContext { ctx, verbs: v, name: name.to_owned() }),
            None => {
                let errno = std::io::Error::last_os_error();
                Err(Error::new(
                    Errno::from_raw(errno.raw_os_error().unwrap_or(libc::EIO)),
                    format!("ibv_open_device(\"{name}\") failed: {errno}"),
                ))
            }
        };
    }
    Err(unknown_device(name, &names))
}

/// An open device context (`struct ibv_context`), closed on drop.
#[derive(Debug)]
pub struct DeviceContext {
    ctx: NonNull<sys::ibv_context>,
    verbs: &'static Verbs,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread and from several at once
// (ibv_open_device(3); rdma-core serialises what needs it inside).
unsafe impl Send for DeviceContext {}
// SAFETY: as above.
unsafe impl Sync for DeviceContext {}

impl DeviceContext {
    /// The raw context, valid as long as `self` lives.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ctx.as_ptr()
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library the context belongs to.
    pub fn verbs(&self) -> &'static Verbs {
        self.verbs
    }
}

impl Drop for DeviceContext {
    fn drop(&mut self) {
        // SAFETY: the context was opened by this library and is closed exactly once. Objects
        // created on it must be gone by now; their owners borrow the context.
        let rc = unsafe { (self.verbs.close_device)(self.ctx.as_ptr()) };
        if rc != 0 {
            tracing::warn!(device = %self.name, rc, "ibv_close_device failed");
        }
    }
}

/// A list from `ibv_get_device_list`, freed on drop.
struct DeviceList {
    verbs: &'static Verbs,
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn get(verbs: &'static Verbs) -> Result<DeviceList> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-parameter.
        let list = unsafe { (verbs.get_device_list)(&mut n) };
        let Some(list) = NonNull::new(list) else {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(list_failure(errno));
        };
        let list = DeviceList { verbs, list, len: usize::try_from(n).unwrap_or(0) };
        if list.len == 0 {
            return Err(Error::new(Errno::ENODEV, NO_DEVICE));
        }
        Ok(list)
    }

    fn iter(&self) -> impl Iterator<Item = *mut sys::ibv_device> + '_ {
        // SAFETY: the list holds `len` device pointers (then a NULL) until it is freed on drop.
        (0..self.len).map(|i| unsafe { *self.list.as_ptr().add(i) })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { (self.verbs.free_device_list)(self.list.as_ptr()) }
    }
}

const NO_RDMA_KERNEL: &str = "this kernel has no RDMA support (ibv_get_device_list: ENOSYS); use \
     the shm provider, or load rdma_rxe on a kernel built with InfiniBand";

const NO_DEVICE: &str = "no RDMA device found: load a NIC driver or create a Soft-RoCE device \
     (rdma link add rxe0 type rxe netdev eth0)";

/// The error for `ibv_get_device_list` returning NULL with `errno`.
fn list_failure(errno: i32) -> Error {
    match errno {
        libc::ENOSYS => return Error::new(Errno::ENOSYS, NO_RDMA_KERNEL),
        0 => return Error::new(Errno::EIO, "ibv_get_device_list failed without setting errno"),
        _ => {}
    }
    Error::new(
        Errno::from_raw(errno),
        format!("ibv_get_device_list failed: {}", std::io::Error::from_raw_os_error(errno)),
    )
}

/// The error for a device name that is not among `available`.
fn unknown_device(name: &str, available: &[String]) -> Error {
    Error::new(Errno::ENODEV, format!("RDMA device \"{name}\" not found; available: {}", available.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::loader::tests::{library_present, MISSING};
    use std::path::Path;

    /// On a machine without the library, without InfiniBand in the kernel, or without a
    /// device, the failure is exactly the sentence for that cause; with devices, they list.
    #[test]
    fn list_devices_says_exactly_why_there_is_none() {
        let result = list_devices();
        if !library_present() {
            assert_eq!(result, Err(Error::new(Errno::ENOENT, MISSING)));
            return;
        }
        // libibverbs reports ENOSYS when the kernel has no uverbs ABI to talk to.
        if !Path::new("/sys/class/infiniband_verbs/abi_version").exists() {
            assert_eq!(result, Err(Error::new(Errno::ENOSYS, NO_RDMA_KERNEL)));
            return;
        }
        let has_devices = std::fs::read_dir("/sys/class/infiniband").map(|d| d.count() > 0).unwrap_or(false);
        if has_devices {
            let devices = result.expect("devices are listed");
            assert!(!devices.is_empty() && devices.iter().all(|d| !d.name.is_empty()));
            let err = open_device_by_name("dataplane-no-such-device").unwrap_err();
            let names: Vec<String> = devices.into_iter().map(|d| d.name).collect();
            assert_eq!(err, unknown_device("dataplane-no-such-device", &names));
        } else {
            assert_eq!(result, Err(Error::new(Errno::ENODEV, NO_DEVICE)));
        }
    }

    #[test]
    fn open_device_by_name_fails_like_list_devices_without_devices() {
        let listed = list_devices();
        if let Err(e) = listed {
            assert_eq!(open_device_by_name("rxe0").unwrap_err(), e);
        }
    }

    #[test]
    fn failure_sentences() {
        assert_eq!(
            list_failure(libc::ENOSYS).to_string(),
            "ENOSYS: this kernel has no RDMA support (ibv_get_device_list: ENOSYS); use the shm \
             provider, or load rdma_rxe on a kernel built with InfiniBand"
        );
        let e = list_failure(libc::ENOMEM);
        assert_eq!(e.errno, Errno::ENOMEM);
        assert!(e.msg.starts_with("ibv_get_device_list failed: "), "{e}");
        assert_eq!(
            Error::new(Errno::ENODEV, NO_DEVICE).to_string(),
            "ENODEV: no RDMA device found: load a NIC driver or create a Soft-RoCE device (rdma \
             link add rxe0 type rxe netdev eth0)"
        );
        assert_eq!(
            unknown_device("X", &["a".into(), "b".into()]),
            Error::new(Errno::ENODEV, "RDMA device \"X\" not found; available: a, b")
        );
    }
}
