//! Run-time loading of `libibverbs.so.1` and the verbs that have no symbol.
//!
//! Nothing links libibverbs. [`verbs`] opens [`LIBRARY`] with `dlopen` the first time it is
//! called and resolves every entry point with `dlvsym` at one fixed symbol version into a
//! [`Verbs`] table of typed function pointers, kept for the life of the process.
//!
//! # Symbol versions
//!
//! libibverbs exports most verbs twice: `IBVERBS_1.0` is the 2007 ABI kept for binaries linked
//! against libibverbs 1.0, whose structures differ from today's header, and `IBVERBS_1.1` (the
//! default, `@@`) is the one [`super::sys`] describes. Each entry is bound to the newest version
//! that exports it (see [`Verbs::SYMBOLS`]), never to an older one as a fallback: a 1.0 entry
//! point would read 1.1 structures with the 1.0 layout. `ibv_create_comp_channel` and
//! `ibv_destroy_comp_channel` exist only at `IBVERBS_1.0`, which is also their current ABI.
//! The required entries all date from libibverbs 1.1.6, before rdma-core; later ones
//! (`IBVERBS_1.8`: rdma-core 28, `1.9`: 30, `1.11`: 32) are `Option`s, so an older library still
//! loads.
//!
//! # Verbs that are not symbols
//!
//! Several verbs of `<infiniband/verbs.h>` are `static inline` functions or macros, so the
//! library has nothing to resolve for them:
//!
//! - `ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv`, `ibv_poll_cq` and
//!   `ibv_req_notify_cq` call the provider's function pointers in `context->ops`
//!   ([`post_send`], [`post_recv`], [`post_srq_recv`], [`poll_cq`], [`req_notify_cq`]).
//! - `ibv_post_srq_ops` and `ibv_query_device_ex` call members of `struct verbs_context`, the
//!   extended context that surrounds `struct ibv_context`, found with the header's
//!   `verbs_get_ctx_op` ([`post_srq_ops`], [`Verbs::query_device_ex`]).
//! - `ibv_query_port` is a macro over the inline `___ibv_query_port`, which calls
//!   `verbs_context::query_port` and falls back to the exported compat symbol
//!   ([`Verbs::query_port_attr`]).
//! - `ibv_reg_mr` is a macro that picks `ibv_reg_mr_iova2` whenever the access flags are not a
//!   compile-time constant free of optional flags ([`Verbs::register_mr`]).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::mem::{offset_of, size_of};
use std::sync::OnceLock;

use super::sys;
use crate::verbs::{Errno, Error, Result};

/// The file name `dlopen` looks for: the SONAME of rdma-core's libibverbs.
pub const LIBRARY: &str = "libibverbs.so.1";

const LIBRARY_C: &CStr = c"libibverbs.so.1";

/// `IBV_ACCESS_OPTIONAL_RANGE` of `<infiniband/verbs_api.h>`: access flags a kernel may ignore.
/// A macro over an enum expression that bindgen cannot evaluate; the value is `0x3ff00000`
/// (bits 20 to 29), checked against gcc in this module's tests.
pub const IBV_ACCESS_OPTIONAL_RANGE: c_uint = (((1 << 29) << 1) - 1) & !((1 << 20) - 1);

/// One entry of [`Verbs`]: the symbol and the version it is resolved at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// Symbol name, e.g. `"ibv_create_qp"`.
    pub name: &'static str,
    /// Symbol version, e.g. `"IBVERBS_1.1"`.
    pub version: &'static str,
    /// Whether loading fails without it (otherwise its entry is an `Option`).
    pub required: bool,
}

/// Declares [`Verbs`]: each entry's field, symbol, version and C prototype, once.
///
/// The prototype written here is checked at compile time against the declaration bindgen
/// generated from the header (an `extern "C"` item in [`sys`] that is never linked or called).
macro_rules! verbs_table {
    (
        required: [$(
            $(#[doc = $doc:literal])*
            $field:ident = $sym:ident @ $ver:literal : fn($($arg:ty),*) $(-> $ret:ty)?;
        )*]
        optional: [$(
            $(#[doc = $odoc:literal])*
            $ofield:ident = $osym:ident @ $over:literal : fn($($oarg:ty),*) $(-> $oret:ty)?;
        )*]
    ) => {
        /// The entry points of libibverbs, resolved once by [`verbs`].
        ///
        /// Each field is the C function itself: calling one is `unsafe` with the contract of its
        /// man page (`ibv_create_qp(3)`...), all pointers being ones libibverbs handed out.
        #[derive(Debug, Clone, Copy)]
        pub struct Verbs {
            $(
                $(#[doc = $doc])*
                #[doc = ""]
                #[doc = concat!("`", stringify!($sym), "@", $ver, "`.")]
                pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,
            )*
            $(
                $(#[doc = $odoc])*
                #[doc = ""]
                #[doc = concat!("`", stringify!($osym), "@", $over, "`, `None` in older libraries.")]
                pub $ofield: Option<unsafe extern "C" fn($($oarg),*) $(-> $oret)?>,
            )*
        }

        impl Verbs {
            /// Every entry of the table, in field order.
            pub const SYMBOLS: &'static [Symbol] = &[
                $(Symbol { name: stringify!($sym), version: $ver, required: true },)*
                $(Symbol { name: stringify!($osym), version: $over, required: false },)*
            ];

            fn resolve(lib: &Library) -> Result<Verbs> {
                Ok(Verbs {
                    $($field: {
                        let p = lib.require(
                            concat!(stringify!($sym), "\0"),
                            concat!($ver, "\0"),
                        )?;
                        // SAFETY: `p` is the address of this symbol at this version, whose C
                        // prototype is the one written above (checked against bindgen's below).
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) $(-> $ret)?,
                            >(p)
                        }
                    },)*
                    $($ofield: lib
                        .lookup(concat!(stringify!($osym), "\0"), concat!($over, "\0"))
                        .map(|p| {
                            // SAFETY: as for the required entries.
                            unsafe {
                                std::mem::transmute::<
                                    *mut c_void,
                                    unsafe extern "C" fn($($oarg),*) $(-> $oret)?,
                                >(p)
                            }
                        }),)*
                })
            }

            /// The address of each entry, in [`Verbs::SYMBOLS`] order (`0` for a missing optional one).
            #[cfg(test)]
            fn addresses(&self) -> Vec<usize> {
                vec![
                    $(self.$field as usize,)*
                    $(self.$ofield.map_or(0, |f| f as usize),)*
                ]
            }
        }

        // The prototypes above must be exactly the header's. Evaluated at compile time only: the
        // extern items are never referenced by generated code, so nothing links libibverbs.
        const _: () = {
            $(let _: unsafe extern "C" fn($($arg),*) $(-> $ret)? = sys::$sym;)*
            $(let _: unsafe extern "C" fn($($oarg),*) $(-> $oret)? = sys::$osym;)*
        };
    };
}

verbs_table! {
    required: [
        /// Lists the devices (NULL with errno set on failure, ENOSYS on a kernel without
        /// InfiniBand).
        get_device_list = ibv_get_device_list @ "IBVERBS_1.1":
            fn(*mut c_int) -> *mut *mut sys::ibv_device;
        /// Frees a list from `get_device_list`.
        free_device_list = ibv_free_device_list @ "IBVERBS_1.1": fn(*mut *mut sys::ibv_device);
        /// The device's kernel name, e.g. `mlx5_0`, `rxe0`.
        get_device_name = ibv_get_device_name @ "IBVERBS_1.1":
            fn(*mut sys::ibv_device) -> *const c_char;
        /// The device's node GUID, big-endian.
        get_device_guid = ibv_get_device_guid @ "IBVERBS_1.1":
            fn(*mut sys::ibv_device) -> sys::__be64;
        /// Opens a device context.
        open_device = ibv_open_device @ "IBVERBS_1.1":
            fn(*mut sys::ibv_device) -> *mut sys::ibv_context;
        /// Closes a device context.
        close_device = ibv_close_device @ "IBVERBS_1.1": fn(*mut sys::ibv_context) -> c_int;
        /// Device attributes (see also [`Verbs::query_device_ex`]).
        query_device = ibv_query_device @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, *mut sys::ibv_device_attr) -> c_int;
        /// The exported compat `ibv_query_port`, which fills only the old prefix of
        /// `ibv_port_attr`: use [`Verbs::query_port_attr`], as the header's macro does.
        query_port = ibv_query_port @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, u8, *mut sys::_compat_ibv_port_attr) -> c_int;
        /// A GID table entry.
        query_gid = ibv_query_gid @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, u8, c_int, *mut sys::ibv_gid) -> c_int;
        /// A P_Key table entry.
        query_pkey = ibv_query_pkey @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, u8, c_int, *mut sys::__be16) -> c_int;
        /// Allocates a protection domain.
        alloc_pd = ibv_alloc_pd @ "IBVERBS_1.1": fn(*mut sys::ibv_context) -> *mut sys::ibv_pd;
        /// Deallocates a protection domain.
        dealloc_pd = ibv_dealloc_pd @ "IBVERBS_1.1": fn(*mut sys::ibv_pd) -> c_int;
        /// Registers memory without optional access flags (see [`Verbs::register_mr`]).
        reg_mr = ibv_reg_mr @ "IBVERBS_1.1":
            fn(*mut sys::ibv_pd, *mut c_void, usize, c_int) -> *mut sys::ibv_mr;
        /// Deregisters memory.
        dereg_mr = ibv_dereg_mr @ "IBVERBS_1.1": fn(*mut sys::ibv_mr) -> c_int;
        /// Creates a completion queue.
        create_cq = ibv_create_cq @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, c_int, *mut c_void, *mut sys::ibv_comp_channel, c_int)
                -> *mut sys::ibv_cq;
        /// Destroys a completion queue.
        destroy_cq = ibv_destroy_cq @ "IBVERBS_1.1": fn(*mut sys::ibv_cq) -> c_int;
        /// Creates a queue pair.
        create_qp = ibv_create_qp @ "IBVERBS_1.1":
            fn(*mut sys::ibv_pd, *mut sys::ibv_qp_init_attr) -> *mut sys::ibv_qp;
        /// Modifies a queue pair (state transitions).
        modify_qp = ibv_modify_qp @ "IBVERBS_1.1":
            fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int) -> c_int;
        /// Queries a queue pair.
        query_qp = ibv_query_qp @ "IBVERBS_1.1":
            fn(*mut sys::ibv_qp, *mut sys::ibv_qp_attr, c_int, *mut sys::ibv_qp_init_attr)
                -> c_int;
        /// Destroys a queue pair.
        destroy_qp = ibv_destroy_qp @ "IBVERBS_1.1": fn(*mut sys::ibv_qp) -> c_int;
        /// Attaches a UD QP to a multicast group (MGID, MLID).
        attach_mcast = ibv_attach_mcast @ "IBVERBS_1.1":
            fn(*mut sys::ibv_qp, *const sys::ibv_gid, u16) -> c_int;
        /// Detaches a UD QP from a multicast group.
        detach_mcast = ibv_detach_mcast @ "IBVERBS_1.1":
            fn(*mut sys::ibv_qp, *const sys::ibv_gid, u16) -> c_int;
        /// Creates a shared receive queue.
        create_srq = ibv_create_srq @ "IBVERBS_1.1":
            fn(*mut sys::ibv_pd, *mut sys::ibv_srq_init_attr) -> *mut sys::ibv_srq;
        /// Modifies a shared receive queue (limit, size).
        modify_srq = ibv_modify_srq @ "IBVERBS_1.1":
            fn(*mut sys::ibv_srq, *mut sys::ibv_srq_attr, c_int) -> c_int;
        /// Queries a shared receive queue.
        query_srq = ibv_query_srq @ "IBVERBS_1.1":
            fn(*mut sys::ibv_srq, *mut sys::ibv_srq_attr) -> c_int;
        /// Destroys a shared receive queue.
        destroy_srq = ibv_destroy_srq @ "IBVERBS_1.1": fn(*mut sys::ibv_srq) -> c_int;
        /// Creates an address handle.
        create_ah = ibv_create_ah @ "IBVERBS_1.1":
            fn(*mut sys::ibv_pd, *mut sys::ibv_ah_attr) -> *mut sys::ibv_ah;
        /// Destroys an address handle.
        destroy_ah = ibv_destroy_ah @ "IBVERBS_1.1": fn(*mut sys::ibv_ah) -> c_int;
        /// Waits for (or, on a non-blocking `async_fd`, takes) the next async event.
        get_async_event = ibv_get_async_event @ "IBVERBS_1.1":
            fn(*mut sys::ibv_context, *mut sys::ibv_async_event) -> c_int;
        /// Acknowledges an async event.
        ack_async_event = ibv_ack_async_event @ "IBVERBS_1.1": fn(*mut sys::ibv_async_event);
        /// Creates a completion event channel.
        create_comp_channel = ibv_create_comp_channel @ "IBVERBS_1.0":
            fn(*mut sys::ibv_context) -> *mut sys::ibv_comp_channel;
        /// Destroys a completion event channel.
        destroy_comp_channel = ibv_destroy_comp_channel @ "IBVERBS_1.0":
            fn(*mut sys::ibv_comp_channel) -> c_int;
        /// Waits for a completion event on a channel.
        get_cq_event = ibv_get_cq_event @ "IBVERBS_1.1":
            fn(*mut sys::ibv_comp_channel, *mut *mut sys::ibv_cq, *mut *mut c_void) -> c_int;
        /// Acknowledges completion events.
        ack_cq_events = ibv_ack_cq_events @ "IBVERBS_1.1": fn(*mut sys::ibv_cq, c_uint);
        /// A static string naming a work completion status.
        wc_status_str = ibv_wc_status_str @ "IBVERBS_1.1":
            fn(sys::ibv_wc_status) -> *const c_char;
        /// A static string naming a port state.
        port_state_str = ibv_port_state_str @ "IBVERBS_1.1":
            fn(sys::ibv_port_state) -> *const c_char;
        /// A static string naming an async event type.
        event_type_str = ibv_event_type_str @ "IBVERBS_1.1":
            fn(sys::ibv_event_type) -> *const c_char;
    ]
    optional: [
        /// Registers memory with an I/O virtual address and optional access flags (rdma-core 28).
        reg_mr_iova2 = ibv_reg_mr_iova2 @ "IBVERBS_1.8":
            fn(*mut sys::ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut sys::ibv_mr;
        /// The device's index in the kernel (rdma-core 30).
        get_device_index = ibv_get_device_index @ "IBVERBS_1.9":
            fn(*mut sys::ibv_device) -> c_int;
        /// A GID table entry with its type and netdev (`ibv_query_gid_ex` calls it; rdma-core
        /// 32).
        query_gid_ex = _ibv_query_gid_ex @ "IBVERBS_1.11":
            fn(*mut sys::ibv_context, u32, u32, *mut sys::ibv_gid_entry, u32, usize) -> c_int;
    ]
}

/// The verbs of `libibverbs.so.1`, loaded on first use and kept for the life of the process.
///
/// Fails with `ENOENT` and "libibverbs.so.1 not found: install rdma-core (apt-get install
/// libibverbs1 ibverbs-providers)" when the library is absent; the failure is remembered.
pub fn verbs() -> Result<&'static Verbs> {
    static VERBS: OnceLock<Result<Verbs>> = OnceLock::new();
    VERBS.get_or_init(|| load_library(LIBRARY_C)).as_ref().map_err(Clone::clone)
}

/// Loads a libibverbs from `name` (a file name `dlopen` searches for, or a path) and resolves
/// [`Verbs`] from it. The library stays loaded for the life of the process.
///
/// For tests and unusual installations: everything else uses [`verbs`], which loads
/// [`LIBRARY`] once.
pub fn load_library(name: &CStr) -> Result<Verbs> {
    Verbs::resolve(&Library::open(name)?)
}

/// A `dlopen` handle that is never closed (providers loaded by libibverbs point into it).
struct Library {
    handle: *mut c_void,
    name: String,
}

impl Library {
    fn open(name: &CStr) -> Result<Library> {
        let display = name.to_string_lossy().into_owned();
        // SAFETY: `name` is NUL-terminated; dlopen runs the library's constructors, which
        // rdma-core's libibverbs keeps to initialising its own state.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            return Ok(Library { handle, name: display });
        }
        let why = dlerror();
        // "libibverbs.so.1: cannot open shared object file: ..." names the library itself when
        // it is missing; a missing dependency or a broken file names something else.
        let file = display.rsplit('/').next().unwrap_or(&display);
        if why.is_empty() || why.starts_with(&format!("{display}: cannot open shared object file")) {
            return Err(Error::new(
                Errno::ENOENT,
                format!(
                    "{file} not found: install rdma-core (apt-get install libibverbs1 \
                     ibverbs-providers)"
                ),
            ));
        }
        Err(Error::new(Errno::EIO, format!("{file} was found but cannot be loaded: {why}")))
    }

    /// The symbol at `version`, if the library exports it. Both strings end with NUL.
    fn lookup(&self, symbol: &str, version: &str) -> Option<*mut c_void> {
        debug_assert!(symbol.ends_with('\0') && version.ends_with('\0'));
        // SAFETY: the handle is open and both strings are NUL-terminated.
        let p = unsafe { dlvsym(self.handle, symbol.as_ptr().cast(), version.as_ptr().cast()) };
        (!p.is_null()).then_some(p)
    }

    fn require(&self, symbol: &str, version: &str) -> Result<*mut c_void> {
        self.lookup(symbol, version).ok_or_else(|| {
            let (symbol, version) = (symbol.trim_end_matches('\0'), version.trim_end_matches('\0'));
            Error::new(
                Errno::EOPNOTSUPP,
                format!(
                    "{} has no {symbol}@{version} ({}): it is not an rdma-core libibverbs this \
                     crate can use",
                    self.name,
                    dlerror()
                ),
            )
        })
    }
}

/// `dlvsym` where glibc has it; elsewhere `dlsym`, which returns the default (newest) version.
///
/// # Safety
/// As `dlvsym(3)`: an open handle and NUL-terminated strings.
#[cfg(target_env = "gnu")]
unsafe fn dlvsym(handle: *mut c_void, symbol: *const c_char, version: *const c_char) -> *mut c_void {
    // SAFETY: forwarded to the caller.
    unsafe { libc::dlvsym(handle, symbol, version) }
}

/// `dlvsym` where glibc has it; elsewhere `dlsym`, which returns the default (newest) version.
///
/// # Safety
/// As `dlsym(3)`: an open handle and a NUL-terminated string.
#[cfg(not(target_env = "gnu"))]
unsafe fn dlvsym(handle: *mut c_void, symbol: *const c_char, _version: *const c_char) -> *mut c_void {
    // SAFETY: forwarded to the caller.
    unsafe { libc::dlsym(handle, symbol) }
}

/// The pending `dlerror()` message, or `""`.
fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// The member `$op` of the `verbs_context` around `$ctx`, as verbs.h's `verbs_get_ctx_op`
/// finds it: `None` unless `$ctx` is an extended context, its provider's `verbs_context` is
/// large enough to hold `$op`, and `$op` is set. Must be used inside `unsafe`, with `$ctx` a
/// live context.
macro_rules! verbs_ctx_op {
    ($ctx:expr, $op:ident) => {
        match verbs_ctx_member($ctx, offset_of!(sys::verbs_context, $op)) {
            None => None,
            Some(p) => read_member(p, |v: &sys::verbs_context| v.$op),
        }
    };
}

// The bindings were generated on x86_64-linux-gnu; `pthread_mutex_t` (inside `ibv_context`) is
// the one layout in verbs.h that differs between 64-bit Linux targets.
const _: () = assert!(
    size_of::<sys::pthread_mutex_t>() == size_of::<libc::pthread_mutex_t>(),
    "dataplane/src/rdma/sys.rs was generated for another target: run tools/gen-rdma-bindings.sh"
);
// verbs_get_ctx_op reads `sz`, which verbs.h places immediately before the `ibv_context`.
const _: () = assert!(
    offset_of!(sys::verbs_context, sz) + size_of::<usize>() == offset_of!(sys::verbs_context, context)
        && offset_of!(sys::verbs_context, context) + size_of::<sys::ibv_context>() == size_of::<sys::verbs_context>()
);

impl Verbs {
    /// `ibv_query_port` as the header's inline `___ibv_query_port` does it: through
    /// `verbs_context::query_port` with the full `ibv_port_attr` size, or, for a provider
    /// without it, zeroing `attr` and calling the exported compat symbol.
    ///
    /// Returns 0 or an errno value.
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`] of this library; `attr` is valid for
    /// writes of one `ibv_port_attr`.
    pub unsafe fn query_port_attr(
        &self,
        ctx: *mut sys::ibv_context,
        port_num: u8,
        attr: *mut sys::ibv_port_attr,
    ) -> c_int {
        // SAFETY: `ctx` is live (caller).
        match unsafe { verbs_ctx_op!(ctx, query_port) } {
            // SAFETY: the provider's query_port with the caller's valid pointers.
            Some(f) => unsafe { f(ctx, port_num, attr, size_of::<sys::ibv_port_attr>()) },
            None => {
                // SAFETY: `attr` is writable (caller); the compat struct is a prefix of
                // `ibv_port_attr`, and the rest stays zero, as in the header.
                unsafe {
                    attr.write_bytes(0, 1);
                    (self.query_port)(ctx, port_num, attr.cast())
                }
            }
        }
    }

    /// `ibv_query_device_ex` as the header's inline does it: `EINVAL` for a non-zero
    /// `input.comp_mask`; `verbs_context::query_device_ex` when the provider has it and it does
    /// not answer `EOPNOTSUPP`/`ENOSYS`; otherwise `attr` zeroed with only `orig_attr` filled by
    /// `ibv_query_device`.
    ///
    /// Returns 0 or an errno value.
    ///
    /// # Safety
    /// `ctx` is a live context from [`Verbs::open_device`] of this library; `input` is null or
    /// valid for reads; `attr` is valid for writes of one `ibv_device_attr_ex`.
    pub unsafe fn query_device_ex(
        &self,
        ctx: *mut sys::ibv_context,
        input: *const sys::ibv_query_device_ex_input,
        attr: *mut sys::ibv_device_attr_ex,
    ) -> c_int {
        // SAFETY: `input` is null or readable (caller).
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        // SAFETY: `ctx` is live (caller).
        if let Some(f) = unsafe { verbs_ctx_op!(ctx, query_device_ex) } {
            // SAFETY: the provider's query_device_ex with the caller's valid pointers and the
            // size of the structure this crate was built with.
            let ret = unsafe { f(ctx, input, attr, size_of::<sys::ibv_device_attr_ex>()) };
            if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
                return ret;
            }
        }
        // SAFETY: `attr` is writable (caller); `orig_attr` is inside it.
        unsafe {
            attr.write_bytes(0, 1);
            (self.query_device)(ctx, std::ptr::addr_of_mut!((*attr).orig_attr))
        }
    }

    /// `ibv_reg_mr` for access flags known only at run time, as the header's macro does it:
    /// `ibv_reg_mr_iova2` with `iova = addr`. A library older than `IBVERBS_1.8` gets
    /// `ibv_reg_mr` with the optional flags ([`IBV_ACCESS_OPTIONAL_RANGE`]) cleared, which is
    /// what "optional" means: a kernel may ignore them.
    ///
    /// Returns the MR, or null with errno set.
    ///
    /// # Safety
    /// `pd` is a live protection domain of this library; `addr..addr + length` is memory of
    /// this process that stays mapped until the MR is deregistered.
    pub unsafe fn register_mr(
        &self,
        pd: *mut sys::ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_uint,
    ) -> *mut sys::ibv_mr {
        match self.reg_mr_iova2 {
            // SAFETY: the caller's contract is ibv_reg_mr_iova2's.
            Some(f) => unsafe { f(pd, addr, length, addr as usize as u64, access) },
            // SAFETY: as above; the flags fit in an int once the optional range is cleared.
            None => unsafe { (self.reg_mr)(pd, addr, length, (access & !IBV_ACCESS_OPTIONAL_RANGE) as c_int) },
        }
    }
}

/// `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` of a context that is part of a `verbs_context`.
const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// The address of the `verbs_context` member at `member_offset` around `ctx`, if `ctx` is an
/// extended context whose `verbs_context` is large enough to contain that member.
///
/// `verbs_context` grows towards lower addresses: new members are added at its front, and
/// `sz`, right before the `ibv_context`, says how many bytes of it exist. A library built with
/// an older header has fewer, so a member is present only if `sz` reaches back to it. Unlike
/// a C cast, nothing here forms a pointer to a whole `verbs_context`, which may be smaller than
/// this crate's.
///
/// # Safety
/// `ctx` is a live context opened by libibverbs.
unsafe fn verbs_ctx_member(ctx: *mut sys::ibv_context, member_offset: usize) -> Option<*const u8> {
    // SAFETY: `ctx` is live (caller).
    let abi = unsafe { (*ctx).abi_compat };
    if abi as usize != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let base = ctx.cast::<u8>().cast_const();
    let sz_addr = base.wrapping_sub(size_of::<usize>()).cast::<usize>();
    // SAFETY: an extended context is the last member of a verbs_context, right after `sz`
    // (asserted at compile time above), so this word is in the same allocation and aligned.
    let sz = unsafe { sz_addr.read() };
    let needed = size_of::<sys::verbs_context>() - member_offset;
    if sz < needed {
        return None;
    }
    Some(base.wrapping_sub(offset_of!(sys::verbs_context, context) - member_offset))
}

/// Reads the `verbs_context` member at `p`, typed by the projection `_member` (never called:
/// it only names the type).
///
/// # Safety
/// `p` comes from [`verbs_ctx_member`] for the member that `_member` projects.
unsafe fn read_member<T: Copy>(p: *const u8, _member: fn(&sys::verbs_context) -> T) -> T {
    // SAFETY: `p` is the member's address inside the live verbs_context (caller); members are
    // pointer-sized and pointer-aligned.
    unsafe { p.cast::<T>().read() }
}

/// `ibv_post_send`: posts a chain of send work requests through the provider's
/// `context->ops.post_send`.
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request not posted.
/// `EOPNOTSUPP` if the provider has no `post_send`.
///
/// # Safety
/// `qp` is a live QP of libibverbs; `wr` is a valid NULL-terminated chain whose SGEs (and
/// inline data) are readable for the duration of the call; `bad_wr` is valid for writes.
#[inline]
pub unsafe fn post_send(qp: *mut sys::ibv_qp, wr: *mut sys::ibv_send_wr, bad_wr: *mut *mut sys::ibv_send_wr) -> c_int {
    // SAFETY: `qp` and its context are live (caller).
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's post_send with the caller's valid pointers.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => {
            // SAFETY: `bad_wr` is writable (caller).
            unsafe { *bad_wr = wr };
            libc::EOPNOTSUPP
        }
    }
}

/// `ibv_post_recv`: posts a chain of receive work requests through the provider's
/// `context->ops.post_recv`.
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request not posted.
/// `EOPNOTSUPP` if the provider has no `post_recv`.
///
/// # Safety
/// `qp` is a live QP of libibverbs; `wr` is a valid NULL-terminated chain whose buffers stay
/// registered and unaliased until their completions; `bad_wr` is valid for writes.
#[inline]
pub unsafe fn post_recv(qp: *mut sys::ibv_qp, wr: *mut sys::ibv_recv_wr, bad_wr: *mut *mut sys::ibv_recv_wr) -> c_int {
    // SAFETY: `qp` and its context are live (caller).
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: the provider's post_recv with the caller's valid pointers.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => {
            // SAFETY: `bad_wr` is writable (caller).
            unsafe { *bad_wr = wr };
            libc::EOPNOTSUPP
        }
    }
}

/// `ibv_post_srq_recv`: posts a chain of receive work requests to a shared receive queue
/// through the provider's `context->ops.post_srq_recv`.
///
/// Returns 0, or an errno value with `*bad_wr` set to the first request not posted.
/// `EOPNOTSUPP` if the provider has no `post_srq_recv`.
///
/// # Safety
/// `srq` is a live SRQ of libibverbs; `wr` and `bad_wr` as for [`post_recv`].
#[inline]
pub unsafe fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad_wr: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: `srq` and its context are live (caller).
    match unsafe { (*(*srq).context).ops.post_srq_recv } {
        // SAFETY: the provider's post_srq_recv with the caller's valid pointers.
        Some(f) => unsafe { f(srq, wr, bad_wr) },
        None => {
            // SAFETY: `bad_wr` is writable (caller).
            unsafe { *bad_wr = wr };
            libc::EOPNOTSUPP
        }
    }
}

/// `ibv_poll_cq`: takes up to `num_entries` completions into `wc` through the provider's
/// `context->ops.poll_cq`.
///
/// Returns the number taken (fewer than `num_entries` means the CQ is now empty), or a
/// negative value on error (`-EOPNOTSUPP` if the provider has no `poll_cq`).
///
/// # Safety
/// `cq` is a live CQ of libibverbs; `wc` is valid for writes of `num_entries` `ibv_wc`.
#[inline]
pub unsafe fn poll_cq(cq: *mut sys::ibv_cq, num_entries: c_int, wc: *mut sys::ibv_wc) -> c_int {
    // SAFETY: `cq` and its context are live (caller).
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: the provider's poll_cq with the caller's valid pointers.
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq`: arms the CQ so that its next completion (the next solicited one if
/// `solicited_only` is non-zero) raises an event on its completion channel, through the
/// provider's `context->ops.req_notify_cq`.
///
/// Returns 0 or an errno value (`EOPNOTSUPP` if the provider has no `req_notify_cq`).
///
/// # Safety
/// `cq` is a live CQ of libibverbs.
#[inline]
pub unsafe fn req_notify_cq(cq: *mut sys::ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: `cq` and its context are live (caller).
    match unsafe { (*(*cq).context).ops.req_notify_cq } {
        // SAFETY: the provider's req_notify_cq on a live CQ.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_ops`: posts tag-matching operations (add, delete, sync) to a tag-matching
/// SRQ through `verbs_context::post_srq_ops`.
///
/// Returns 0, or an errno value with `*bad_op` set to the first operation not posted:
/// `EOPNOTSUPP` when the provider has no tag matching (every provider but mlx5).
///
/// # Safety
/// `srq` is a live SRQ of libibverbs; `op` is a valid NULL-terminated chain; `bad_op` is valid
/// for writes.
#[inline]
pub unsafe fn post_srq_ops(
    srq: *mut sys::ibv_srq,
    op: *mut sys::ibv_ops_wr,
    bad_op: *mut *mut sys::ibv_ops_wr,
) -> c_int {
    // SAFETY: `srq` and its context are live (caller).
    match unsafe { verbs_ctx_op!((*srq).context, post_srq_ops) } {
        // SAFETY: the provider's post_srq_ops with the caller's valid pointers.
        Some(f) => unsafe { f(srq, op, bad_op) },
        None => {
            // SAFETY: `bad_op` is writable (caller).
            unsafe { *bad_op = op };
            libc::EOPNOTSUPP
        }
    }
}

/// The errno of the call that just failed (0 read as EIO: a provider that returned NULL
/// without setting errno still failed).
fn last_errno_raw() -> c_int {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

/// `ibv_open_xrcd` as verbs.h's inline does it: `verbs_context::open_xrcd`.
///
/// Returns the domain, or an errno value: `EOPNOTSUPP` when the provider has no such op.
///
/// # Safety
/// `ctx` is a live context of this library; `attr` is valid for reads and writes.
pub unsafe fn open_xrcd(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_xrcd_init_attr,
) -> std::result::Result<std::ptr::NonNull<sys::ibv_xrcd>, c_int> {
    // SAFETY: `ctx` is live (caller).
    match unsafe { verbs_ctx_op!(ctx, open_xrcd) } {
        None => Err(libc::EOPNOTSUPP),
        // SAFETY: the provider's open_xrcd with the caller's valid pointers.
        Some(f) => std::ptr::NonNull::new(unsafe { f(ctx, attr) }).ok_or_else(last_errno_raw),
    }
}

/// `ibv_close_xrcd`: returns 0 or an errno value.
///
/// # Safety
/// `xrcd` is a live domain from [`open_xrcd`], closed once, with no SRQ or QP left in it.
pub unsafe fn close_xrcd(xrcd: *mut sys::ibv_xrcd) -> c_int {
    // SAFETY: `xrcd` and its context are live (caller).
    match unsafe { verbs_ctx_op!((*xrcd).context, close_xrcd) } {
        // SAFETY: the provider's close_xrcd on a live domain.
        Some(f) => unsafe { f(xrcd) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_create_srq_ex` through `verbs_context::create_srq_ex` (the only way to an XRC SRQ).
///
/// Returns the SRQ, or an errno value: `EOPNOTSUPP` when the provider has no such op.
///
/// # Safety
/// `ctx` is a live context; `attr` is valid, with live PD, XRCD and CQ where its mask says.
pub unsafe fn create_srq_ex(
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_srq_init_attr_ex,
) -> std::result::Result<std::ptr::NonNull<sys::ibv_srq>, c_int> {
    // SAFETY: `ctx` is live (caller).
    match unsafe { verbs_ctx_op!(ctx, create_srq_ex) } {
        None => Err(libc::EOPNOTSUPP),
        // SAFETY: the provider's create_srq_ex with the caller's valid pointers.
        Some(f) => std::ptr::NonNull::new(unsafe { f(ctx, attr) }).ok_or_else(last_errno_raw),
    }
}

/// `ibv_create_qp_ex` as verbs.h's inline does it: with only `IBV_QP_INIT_ATTR_PD` in the
/// mask, `ibv_create_qp` on the attribute's prefix; otherwise `verbs_context::create_qp_ex`.
///
/// Returns the QP, or an errno value: `EOPNOTSUPP` when the provider has no such op.
///
/// # Safety
/// `ctx` is a live context of this library (`v`); `attr` is valid, with live PD, XRCD, CQs
/// where its mask and type say.
pub unsafe fn create_qp_ex(
    v: &Verbs,
    ctx: *mut sys::ibv_context,
    attr: *mut sys::ibv_qp_init_attr_ex,
) -> std::result::Result<std::ptr::NonNull<sys::ibv_qp>, c_int> {
    // SAFETY: `attr` is valid (caller).
    let (mask, pd) = unsafe { ((*attr).comp_mask, (*attr).pd) };
    if mask == sys::IBV_QP_INIT_ATTR_PD {
        // SAFETY: `ibv_qp_init_attr` is a prefix of `ibv_qp_init_attr_ex` (verbs.h relies on
        // it in the same way); the PD is live (caller).
        let qp = unsafe { (v.create_qp)(pd, attr.cast()) };
        return std::ptr::NonNull::new(qp).ok_or_else(last_errno_raw);
    }
    // SAFETY: `ctx` is live (caller).
    match unsafe { verbs_ctx_op!(ctx, create_qp_ex) } {
        None => Err(libc::EOPNOTSUPP),
        // SAFETY: the provider's create_qp_ex with the caller's valid pointers.
        Some(f) => std::ptr::NonNull::new(unsafe { f(ctx, attr) }).ok_or_else(last_errno_raw),
    }
}

/// `ibv_get_srq_num`: the number of an XRC SRQ that peers name in `remote_srqn`. Returns 0
/// or an errno value (`EOPNOTSUPP` when the provider has no such op).
///
/// # Safety
/// `srq` is a live SRQ; `out` is valid for writes.
pub unsafe fn get_srq_num(srq: *mut sys::ibv_srq, out: *mut u32) -> c_int {
    // SAFETY: `srq` and its context are live (caller).
    match unsafe { verbs_ctx_op!((*srq).context, get_srq_num) } {
        // SAFETY: the provider's get_srq_num with the caller's valid pointers.
        Some(f) => unsafe { f(srq, out) },
        None => libc::EOPNOTSUPP,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::ptr::{null, null_mut};

    /// Whether the test can `dlopen` the library itself, independently of the loader.
    pub(crate) fn library_present() -> bool {
        // SAFETY: a NUL-terminated name; the handle is deliberately kept open.
        !unsafe { libc::dlopen(LIBRARY_C.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
    }

    pub(crate) const MISSING: &str =
        "libibverbs.so.1 not found: install rdma-core (apt-get install libibverbs1 ibverbs-providers)";

    /// Sizes and offsets from gcc 12.2 on x86_64 Debian bookworm, libibverbs-dev 44.0-2, by a
    /// C file that includes <infiniband/verbs.h> and prints `sizeof(struct X)` and
    /// `offsetof(struct X, m)` for each of these (`gcc sizes.c -libverbs && ./a.out`).
    #[test]
    #[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
    fn struct_layout_matches_gcc() {
        use sys::*;
        // XRC (same gcc, same headers): the attributes and verbs_context members it uses.
        assert_eq!(size_of::<ibv_xrcd_init_attr>(), 12);
        assert_eq!(size_of::<ibv_srq_init_attr_ex>(), 64);
        assert_eq!(
            (
                offset_of!(ibv_srq_init_attr_ex, srq_type),
                offset_of!(ibv_srq_init_attr_ex, pd),
                offset_of!(ibv_srq_init_attr_ex, xrcd),
                offset_of!(ibv_srq_init_attr_ex, cq)
            ),
            (24, 32, 40, 48)
        );
        assert_eq!(size_of::<ibv_qp_init_attr_ex>(), 136);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(
            (
                offset_of!(ibv_qp_init_attr_ex, comp_mask),
                offset_of!(ibv_qp_init_attr_ex, pd),
                offset_of!(ibv_qp_init_attr_ex, xrcd)
            ),
            (60, 64, 72)
        );
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(
            (
                offset_of!(verbs_context, create_qp_ex),
                offset_of!(verbs_context, get_srq_num),
                offset_of!(verbs_context, create_srq_ex),
                offset_of!(verbs_context, open_xrcd),
                offset_of!(verbs_context, close_xrcd)
            ),
            (264, 272, 280, 288, 296)
        );
        assert_eq!(size_of::<ibv_sge>(), 16);
        assert_eq!(size_of::<ibv_send_wr>(), 128);
        assert_eq!(size_of::<ibv_recv_wr>(), 32);
        assert_eq!(size_of::<ibv_wc>(), 48);
        assert_eq!(size_of::<ibv_context_ops>(), 256);
        assert_eq!(size_of::<ibv_context>(), 328);
        assert_eq!(size_of::<verbs_context>(), 648);
        assert_eq!(size_of::<ibv_device_attr>(), 232);
        assert_eq!(size_of::<ibv_device_attr_ex>(), 400);
        assert_eq!(size_of::<ibv_port_attr>(), 52);
        assert_eq!(size_of::<ibv_qp_attr>(), 144);
        assert_eq!(size_of::<ibv_qp_init_attr>(), 64);
        assert_eq!(size_of::<ibv_srq_init_attr>(), 24);
        assert_eq!(size_of::<ibv_srq_attr>(), 12);
        assert_eq!(size_of::<ibv_ah_attr>(), 32);
        assert_eq!(size_of::<ibv_async_event>(), 16);
        assert_eq!(size_of::<ibv_qp>(), 160);
        assert_eq!(size_of::<ibv_cq>(), 128);
        assert_eq!(size_of::<ibv_srq>(), 128);
        assert_eq!(size_of::<ibv_mr>(), 48);
        assert_eq!(size_of::<ibv_ops_wr>(), 72);
        assert_eq!(offset_of!(verbs_context, context), 320);
        assert_eq!(offset_of!(verbs_context, sz), 312);
        assert_eq!(offset_of!(verbs_context, query_device_ex), 216);
        assert_eq!(offset_of!(verbs_context, query_port), 0);
        assert_eq!(offset_of!(verbs_context, post_srq_ops), 144);
        assert_eq!(offset_of!(ibv_context, ops), 8);
        assert_eq!(offset_of!(ibv_context, abi_compat), 320);
        assert_eq!(offset_of!(ibv_context_ops, poll_cq), 88);
        assert_eq!(offset_of!(ibv_context_ops, req_notify_cq), 96);
        assert_eq!(offset_of!(ibv_context_ops, post_srq_recv), 160);
        assert_eq!(offset_of!(ibv_context_ops, post_send), 200);
        assert_eq!(offset_of!(ibv_context_ops, post_recv), 208);
        assert_eq!(offset_of!(ibv_send_wr, wr), 40);
        assert_eq!(offset_of!(ibv_send_wr, qp_type), 72);
        assert_eq!(offset_of!(ibv_wc, __bindgen_anon_1), 24); // union { imm_data, invalidated_rkey }
        assert_eq!(offset_of!(ibv_wc, qp_num), 28);
        assert_eq!(offset_of!(ibv_device_attr_ex, max_dm_size), 376);
        // printf("%#x", IBV_ACCESS_OPTIONAL_RANGE) with the same header.
        assert_eq!(IBV_ACCESS_OPTIONAL_RANGE, 0x3ff0_0000);
    }

    #[test]
    fn a_missing_library_is_named_with_what_to_install() {
        let err = load_library(c"libdataplane-no-such-library.so.1").unwrap_err();
        assert_eq!(
            err,
            Error::new(
                Errno::ENOENT,
                "libdataplane-no-such-library.so.1 not found: install rdma-core (apt-get install \
                 libibverbs1 ibverbs-providers)"
            )
        );
    }

    #[test]
    fn a_library_that_is_not_libibverbs_is_rejected_by_symbol() {
        // libc is always there and exports none of the verbs.
        let err = load_library(c"libc.so.6").unwrap_err();
        assert_eq!(err.errno, Errno::EOPNOTSUPP, "{err}");
        assert!(err.msg.starts_with("libc.so.6 has no ibv_get_device_list@IBVERBS_1.1 ("), "{err}");
    }

    /// Every entry resolves, and at the newest version the library exports: plain `dlsym`
    /// returns the default (`@@`) version, which must be the very function bound.
    #[test]
    fn every_symbol_resolves_at_its_newest_version() {
        if !library_present() {
            assert_eq!(verbs().unwrap_err(), Error::new(Errno::ENOENT, MISSING));
            eprintln!("{LIBRARY} absent: only the ENOENT path was checked");
            return;
        }
        let v = verbs().expect("libibverbs.so.1 loads");
        // SAFETY: a NUL-terminated name; the library is already loaded.
        let handle = unsafe { libc::dlopen(LIBRARY_C.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        assert!(!handle.is_null());
        let addrs = v.addresses();
        assert_eq!(addrs.len(), Verbs::SYMBOLS.len());
        for (sym, addr) in Verbs::SYMBOLS.iter().zip(addrs) {
            let name = std::ffi::CString::new(sym.name).unwrap();
            // SAFETY: an open handle and a NUL-terminated name.
            let default = unsafe { libc::dlsym(handle, name.as_ptr()) } as usize;
            if sym.required {
                assert_ne!(addr, 0, "{}@{}", sym.name, sym.version);
            }
            assert_eq!(addr, default, "{}@{} is not the default version of {}", sym.name, sym.version, sym.name);
        }
        let required = Verbs::SYMBOLS.iter().filter(|s| s.required).count();
        assert!(required >= 33, "{required}");
    }

    /// Calls into the library that need no device: the string tables.
    #[test]
    fn string_verbs_answer_like_the_c_library() {
        if !library_present() {
            return;
        }
        let v = verbs().unwrap();
        // SAFETY: these return pointers to static NUL-terminated strings for any value.
        let s = |p: *const c_char| unsafe { CStr::from_ptr(p) }.to_str().unwrap().to_owned();
        // Values printed by a C program calling the same functions.
        // SAFETY: plain value arguments.
        unsafe {
            assert_eq!(s((v.wc_status_str)(sys::IBV_WC_SUCCESS)), "success");
            assert_eq!(s((v.wc_status_str)(sys::IBV_WC_RNR_RETRY_EXC_ERR)), "RNR retry counter exceeded");
            assert_eq!(s((v.wc_status_str)(999)), "unknown");
            assert_eq!(s((v.port_state_str)(sys::IBV_PORT_ACTIVE)), "active");
            assert_eq!(s((v.event_type_str)(sys::IBV_EVENT_DEVICE_FATAL)), "local catastrophic error");
        }
    }

    // A fake provider: a zeroed verbs_context whose ops record which function ran.

    unsafe extern "C" fn fake_post_send(
        _: *mut sys::ibv_qp,
        _: *mut sys::ibv_send_wr,
        _: *mut *mut sys::ibv_send_wr,
    ) -> c_int {
        1001
    }
    unsafe extern "C" fn fake_poll_cq(_: *mut sys::ibv_cq, n: c_int, _: *mut sys::ibv_wc) -> c_int {
        n + 2000
    }
    unsafe extern "C" fn fake_post_srq_ops(
        _: *mut sys::ibv_srq,
        _: *mut sys::ibv_ops_wr,
        _: *mut *mut sys::ibv_ops_wr,
    ) -> c_int {
        3003
    }
    unsafe extern "C" fn fake_query_device_ex(
        _: *mut sys::ibv_context,
        _: *const sys::ibv_query_device_ex_input,
        attr: *mut sys::ibv_device_attr_ex,
        size: usize,
    ) -> c_int {
        assert_eq!(size, size_of::<sys::ibv_device_attr_ex>());
        // SAFETY: the test passes a valid attr.
        unsafe { (*attr).max_dm_size = 77 };
        0
    }

    fn fake_context() -> Box<sys::verbs_context> {
        // SAFETY: all-zero is valid for this C struct (null pointers, `None` functions).
        let mut v: Box<sys::verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        v.sz = size_of::<sys::verbs_context>();
        v.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
        v.context.ops.post_send = Some(fake_post_send);
        v.context.ops.poll_cq = Some(fake_poll_cq);
        v.post_srq_ops = Some(fake_post_srq_ops);
        v.query_device_ex = Some(fake_query_device_ex);
        v
    }

    #[test]
    fn ops_helpers_call_the_context_function_pointers() {
        let mut v = fake_context();
        let ctx: *mut sys::ibv_context = &mut v.context;
        // SAFETY: zeroed C structs pointing at the fake context.
        let mut qp: sys::ibv_qp = unsafe { std::mem::zeroed() };
        qp.context = ctx;
        // SAFETY: as above.
        let mut cq: sys::ibv_cq = unsafe { std::mem::zeroed() };
        cq.context = ctx;
        // SAFETY: as above.
        let mut srq: sys::ibv_srq = unsafe { std::mem::zeroed() };
        srq.context = ctx;
        let mut bad_wr: *mut sys::ibv_send_wr = null_mut();
        let mut bad_rwr: *mut sys::ibv_recv_wr = null_mut();
        let mut bad_op: *mut sys::ibv_ops_wr = null_mut();
        let mut op: sys::ibv_ops_wr = sys::ibv_ops_wr::default();
        // SAFETY: every pointer is a live local; the fake ops ignore their arguments.
        unsafe {
            assert_eq!(post_send(&mut qp, null_mut(), &mut bad_wr), 1001);
            assert_eq!(poll_cq(&mut cq, 5, null_mut()), 2005);
            assert_eq!(post_srq_ops(&mut srq, &mut op, &mut bad_op), 3003);
            // Missing ops answer EOPNOTSUPP and point bad_wr at the first request.
            let mut wr = sys::ibv_recv_wr::default();
            assert_eq!(post_recv(&mut qp, &mut wr, &mut bad_rwr), libc::EOPNOTSUPP);
            assert_eq!(bad_rwr, &mut wr as *mut _);
            assert_eq!(req_notify_cq(&mut cq, 0), libc::EOPNOTSUPP);
        }
    }

    #[test]
    fn verbs_ctx_op_follows_the_abi_and_size_checks() {
        let mut v = fake_context();
        let ctx: *mut sys::ibv_context = &mut v.context;
        // SAFETY: `ctx` points into the live fake verbs_context, as for a real one.
        let found = |ctx| unsafe { verbs_ctx_op!(ctx, post_srq_ops) }.is_some();
        assert!(found(ctx));
        // A provider whose verbs_context ends just after post_srq_ops still has it...
        v.sz = size_of::<sys::verbs_context>() - offset_of!(sys::verbs_context, post_srq_ops);
        assert!(found(ctx));
        // ...one byte shorter does not, and the member is not even read.
        v.sz -= 1;
        assert!(!found(ctx));
        v.sz = size_of::<sys::verbs_context>();
        v.post_srq_ops = None;
        assert!(!found(ctx));
        v.post_srq_ops = Some(fake_post_srq_ops);
        // A context that is not extended has no verbs_context at all.
        v.context.abi_compat = null_mut();
        assert!(!found(ctx));

        // post_srq_ops without the member: EOPNOTSUPP and bad_op = op, as in verbs.h.
        // SAFETY: zeroed C struct pointing at the fake context.
        let mut srq: sys::ibv_srq = unsafe { std::mem::zeroed() };
        srq.context = ctx;
        let mut op = sys::ibv_ops_wr::default();
        let mut bad_op: *mut sys::ibv_ops_wr = null_mut();
        // SAFETY: live locals.
        let r = unsafe { post_srq_ops(&mut srq, &mut op, &mut bad_op) };
        assert_eq!(r, libc::EOPNOTSUPP);
        assert_eq!(bad_op, &mut op as *mut _);
    }

    #[test]
    fn query_device_ex_uses_the_extended_op_and_rejects_comp_mask() {
        let mut v = fake_context();
        let ctx: *mut sys::ibv_context = &mut v.context;
        // The fallback (`query_device`) is never reached here; any table will do as `self`, so
        // a table is only needed when the library is present.
        let Ok(verbs) = verbs() else { return };
        let mut attr = sys::ibv_device_attr_ex::default();
        let input = sys::ibv_query_device_ex_input { comp_mask: 1 };
        // SAFETY: live locals and the fake context.
        unsafe {
            assert_eq!(verbs.query_device_ex(ctx, &input, &mut attr), libc::EINVAL);
            assert_eq!(verbs.query_device_ex(ctx, null(), &mut attr), 0);
        }
        assert_eq!(attr.max_dm_size, 77);
    }
}
