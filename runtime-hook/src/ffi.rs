//! The C ABI side: the real driver's functions, the mapped accounting file, and the exported
//! interposers. Every exported function is a one-liner into [`boundary`], which catches panics.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
// Test builds do not export the symbols (`cfg_attr(not(test), no_mangle)`), so most of this is unused there.
#![cfg_attr(test, allow(dead_code))]
// The exported names are the CUDA driver API's.
#![allow(non_snake_case)]

use crate::config::Config;
use crate::ledger::Ledger;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use vgpu_core::accounting::{FILE_WORDS, MAX_DEVICES};

type CUresult = c_int;
type CUdeviceptr = u64;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// Runs an exported function's body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
fn boundary(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The C library's `dlsym`, found with `dlvsym` because this library exports its own `dlsym`.
fn real_dlsym() -> Option<DlsymFn> {
    static REAL: OnceLock<Option<DlsymFn>> = OnceLock::new();
    *REAL.get_or_init(|| {
        for v in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with constant NUL-terminated strings; RTLD_NEXT finds the libc definition.
            let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
            if !p.is_null() {
                // SAFETY: the symbol is glibc's dlsym, whose signature DlsymFn is.
                return Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) });
            }
        }
        None
    })
}

macro_rules! real_table {
    ($($name:ident : fn($($arg:ty),*);)*) => {
        /// The real driver's entry points (absent ones are `None`).
        #[allow(non_snake_case)]
        struct Real { $($name: Option<unsafe extern "C" fn($($arg),*) -> CUresult>,)* }
        impl Real {
            fn load(handle: *mut c_void, dlsym: DlsymFn) -> Real {
                Real { $($name: {
                    // SAFETY: looking up a constant name in the driver handle.
                    let p = unsafe { dlsym(handle, concat!(stringify!($name), "\0").as_ptr().cast()) };
                    // SAFETY: the driver's symbol of this name has this C signature (cuda.h).
                    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(p) })
                },)* }
            }
        }
    };
}

real_table! {
    cuInit: fn(c_uint);
    cuCtxGetDevice: fn(*mut c_int);
    cuMemAlloc_v2: fn(*mut CUdeviceptr, usize);
    cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint);
    cuMemAllocAsync: fn(*mut CUdeviceptr, usize, *mut c_void);
    cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, *mut c_void);
    cuMemFreeAsync: fn(CUdeviceptr, *mut c_void);
    cuMemFreeAsync_ptsz: fn(CUdeviceptr, *mut c_void);
    cuMemFree_v2: fn(CUdeviceptr);
    cuMemGetInfo_v2: fn(*mut usize, *mut usize);
    cuDeviceTotalMem_v2: fn(*mut usize, c_int);
    cuLaunchKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void);
    cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64);
    cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int);
}

/// Everything the hook holds for this process.
struct Hook {
    config: Config,
    real: Real,
    ledger: Ledger<'static>,
    /// This process's slot; `usize::MAX` until claimed (and again in a forked child).
    slot: AtomicUsize,
    /// Live allocations: pointer -> (limit index, bytes).
    allocations: Mutex<HashMap<u64, (usize, u64)>>,
}

static HOOK: OnceLock<Result<Hook, CUresult>> = OnceLock::new();

thread_local! {
    static INITIALIZING: Cell<bool> = const { Cell::new(false) };
}

fn hook() -> Result<&'static Hook, CUresult> {
    if INITIALIZING.with(Cell::get) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let h = HOOK.get_or_init(|| {
        INITIALIZING.with(|c| c.set(true));
        let r = init();
        INITIALIZING.with(|c| c.set(false));
        r
    });
    h.as_ref().map_err(|e| *e)
}

fn init() -> Result<Hook, CUresult> {
    let config = Config::from_vars(|k| std::env::var(k).ok()).map_err(|e| {
        eprintln!("{e}");
        CUDA_ERROR_INVALID_VALUE
    })?;
    let Some(dlsym) = real_dlsym() else {
        eprintln!("vgpu: cannot find the C library's dlsym; refusing CUDA");
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    };
    // SAFETY: dlopen with a constant name.
    let handle =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        eprintln!("vgpu: libcuda.so.1 (the NVIDIA driver) cannot be loaded; CUDA is not available");
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let real = Real::load(handle, dlsym);
    let words = map_file(&config.cache_path).map_err(|e| {
        eprintln!(
            "vgpu: accounting file {}: {e}; refusing CUDA",
            config.cache_path.display()
        );
        CUDA_ERROR_NOT_INITIALIZED
    })?;
    let ledger = Ledger::init(words, &config.memory_limit, &config.sm_limit).map_err(|e| {
        eprintln!("{e}");
        CUDA_ERROR_NOT_INITIALIZED
    })?;
    // SAFETY: registering a plain function pointer that only stores to atomics.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_child)) };
    Ok(Hook {
        config,
        real,
        ledger,
        slot: AtomicUsize::new(usize::MAX),
        allocations: Mutex::new(HashMap::new()),
    })
}

/// The child of fork() starts with clean per-process state: its own slot, claimed on first use.
/// Allocations the parent made are the parent's (CUDA state does not survive fork).
extern "C" fn after_fork_child() {
    if let Some(Ok(h)) = HOOK.get() {
        h.slot.store(usize::MAX, Ordering::SeqCst);
        FORKED.fetch_add(1, Ordering::SeqCst);
    }
}

static FORKED: AtomicU64 = AtomicU64::new(0);

fn map_file(path: &std::path::Path) -> std::io::Result<&'static [AtomicU64]> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(path)?;
    let len = (FILE_WORDS * 8) as u64;
    if file.metadata()?.len() < len {
        file.set_len(len)?;
    }
    // SAFETY: a shared read-write mapping of the FILE_WORDS words just sized; never unmapped, so the
    // 'static slice stays valid for the life of the process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE_WORDS * 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: page-aligned mapping of FILE_WORDS u64s; AtomicU64 has the layout of u64, and every
    // process accesses the words only atomically.
    Ok(unsafe { std::slice::from_raw_parts(p as *const AtomicU64, FILE_WORDS) })
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    // A zombie has already lost its GPU memory.
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit_once(')')
                .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
}

impl Hook {
    fn slot(&self) -> Result<usize, CUresult> {
        let s = self.slot.load(Ordering::SeqCst);
        if s != usize::MAX {
            return Ok(s);
        }
        match self.ledger.claim(std::process::id(), &alive) {
            Some(s) => {
                self.slot.store(s, Ordering::SeqCst);
                Ok(s)
            }
            None => {
                eprintln!("vgpu: no free process slot in the accounting file; refusing allocation");
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    /// Limit index of the calling thread's current device.
    fn device(&self) -> Result<usize, CUresult> {
        let f = self.real.cuCtxGetDevice.ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut d: c_int = 0;
        // SAFETY: passing a valid out pointer to the driver.
        let r = unsafe { f(&mut d) };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        Ok(self.config.limit_index(d.max(0) as usize))
    }

    /// Reserves, calls the driver allocation `call`, and commits or rolls back.
    fn allocate(
        &self,
        dptr: *mut CUdeviceptr,
        bytes: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        if dptr.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let (dev, slot) = match (self.device(), self.slot()) {
            (Ok(d), Ok(s)) => (d, s),
            (Err(e), _) | (_, Err(e)) => return e,
        };
        let limit = self.config.memory_limit.get(dev).copied().flatten();
        if !self.ledger.reserve(slot, dev, bytes, limit) {
            // Dead processes may hold the rest: reclaim and try once more.
            if self.ledger.reclaim_dead(std::process::id(), &alive) == 0
                || !self.ledger.reserve(slot, dev, bytes, limit)
            {
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        let r = call();
        if r == CUDA_SUCCESS {
            // SAFETY: checked non-null; the driver wrote the pointer.
            let p = unsafe { *dptr };
            self.allocations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(p, (dev, bytes));
        } else {
            self.ledger.release(slot, dev, bytes);
        }
        r
    }

    fn free(&self, p: CUdeviceptr, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS {
            let entry = self
                .allocations
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&p);
            if let (Some((dev, bytes)), Ok(slot)) = (entry, self.slot()) {
                self.ledger.release(slot, dev, bytes);
            }
        }
        r
    }
}

macro_rules! real_or {
    ($h:expr, $name:ident) => {
        match $h.real.$name {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_FOUND,
        }
    };
}

macro_rules! try_cu {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

/// `cuInit`: fails closed (CUDA_ERROR_INVALID_VALUE) when a limit cannot be read.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuInit);
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(flags) }
    })
}

/// `cuMemAlloc_v2`, capped.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAlloc_v2);
        // SAFETY: forwarding the caller's arguments.
        h.allocate(dptr, bytes as u64, || unsafe { f(dptr, bytes) })
    })
}

/// `cuMemAllocManaged`, capped against the current device.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAllocManaged);
        // SAFETY: forwarding the caller's arguments.
        h.allocate(dptr, bytes as u64, || unsafe { f(dptr, bytes, flags) })
    })
}

/// `cuMemAllocAsync`, capped like cuMemAlloc (the pool's device is the current context's).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAllocAsync);
        // SAFETY: forwarding the caller's arguments.
        h.allocate(dptr, bytes as u64, || unsafe { f(dptr, bytes, stream) })
    })
}

/// `cuMemAllocAsync_ptsz` (per-thread default stream).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    stream: *mut c_void,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAllocAsync_ptsz);
        // SAFETY: forwarding the caller's arguments.
        h.allocate(dptr, bytes as u64, || unsafe { f(dptr, bytes, stream) })
    })
}

/// `cuMemFreeAsync`.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemFreeAsync(p: CUdeviceptr, stream: *mut c_void) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemFreeAsync);
        // SAFETY: forwarding the caller's arguments.
        h.free(p, || unsafe { f(p, stream) })
    })
}

/// `cuMemFreeAsync_ptsz`.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemFreeAsync_ptsz(p: CUdeviceptr, stream: *mut c_void) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemFreeAsync_ptsz);
        // SAFETY: forwarding the caller's arguments.
        h.free(p, || unsafe { f(p, stream) })
    })
}

/// `cuMemFree_v2`.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemFree_v2(p: CUdeviceptr) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemFree_v2);
        // SAFETY: forwarding the caller's argument.
        h.free(p, || unsafe { f(p) })
    })
}

/// `cuMemGetInfo_v2`: total = limit, free = limit - container usage, never above the real free.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemGetInfo_v2);
        // SAFETY: forwarding the caller's pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        let dev = try_cu!(h.device());
        if let Some(limit) = h.config.memory_limit.get(dev).copied().flatten() {
            let used = if dev < MAX_DEVICES {
                h.ledger.container_used(dev)
            } else {
                0
            };
            // SAFETY: checked non-null; the driver just wrote both.
            unsafe {
                *free = (*free).min(limit.saturating_sub(used) as usize);
                *total = (*total).min(limit as usize);
            }
        }
        CUDA_SUCCESS
    })
}

/// `cuDeviceTotalMem_v2`: the limit when there is one.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuDeviceTotalMem_v2);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(bytes, dev) };
        if r == CUDA_SUCCESS && !bytes.is_null() {
            let idx = h.config.limit_index(dev.max(0) as usize);
            if let Some(limit) = h.config.memory_limit.get(idx).copied().flatten() {
                // SAFETY: checked non-null; the driver just wrote it.
                unsafe { *bytes = (*bytes).min(limit as usize) };
            }
        }
        r
    })
}

/// `cuLaunchKernel`: metered.
#[cfg_attr(not(test), no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    func: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuLaunchKernel);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(func, gx, gy, gz, bx, by, bz, shared, stream, params, extra) };
        if r == CUDA_SUCCESS {
            if let Ok(s) = h.slot() {
                h.ledger.launched(s);
            }
        }
        r
    })
}

/// Our interposer for a driver symbol name, if we have one.
fn wrapper(name: &[u8]) -> Option<*mut c_void> {
    Some(match name {
        b"cuInit" => cuInit as *mut c_void,
        b"cuMemAlloc_v2" => cuMemAlloc_v2 as *mut c_void,
        b"cuMemAllocManaged" => cuMemAllocManaged as *mut c_void,
        b"cuMemFree_v2" => cuMemFree_v2 as *mut c_void,
        b"cuMemAllocAsync" => cuMemAllocAsync as *mut c_void,
        b"cuMemAllocAsync_ptsz" => cuMemAllocAsync_ptsz as *mut c_void,
        b"cuMemFreeAsync" => cuMemFreeAsync as *mut c_void,
        b"cuMemFreeAsync_ptsz" => cuMemFreeAsync_ptsz as *mut c_void,
        b"cuMemGetInfo_v2" => cuMemGetInfo_v2 as *mut c_void,
        b"cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2 as *mut c_void,
        b"cuLaunchKernel" => cuLaunchKernel as *mut c_void,
        b"cuGetProcAddress" => cuGetProcAddress as *mut c_void,
        b"cuGetProcAddress_v2" => cuGetProcAddress_v2 as *mut c_void,
        _ => return None,
    })
}

/// The name `cuGetProcAddress` resolves `base` to for `version`: the `_v2` ABI of the memory calls
/// since CUDA 3.2, `cuGetProcAddress_v2` since 12.0.
fn versioned(base: &[u8], version: c_int, flags: u64) -> Vec<u8> {
    // CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 selects the `_ptsz` entry of stream calls.
    const PTSZ: &[&[u8]] = &[b"cuMemAllocAsync", b"cuMemFreeAsync"];
    const V2: &[&[u8]] = &[
        b"cuMemAlloc",
        b"cuMemFree",
        b"cuMemGetInfo",
        b"cuDeviceTotalMem",
    ];
    let mut n = base.to_vec();
    if (V2.contains(&base) && version >= 3020) || (base == b"cuGetProcAddress" && version >= 12000)
    {
        n.extend_from_slice(b"_v2");
    } else if PTSZ.contains(&base) && flags & 2 != 0 {
        n.extend_from_slice(b"_ptsz");
    }
    n
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    r: CUresult,
) -> CUresult {
    if r != CUDA_SUCCESS || symbol.is_null() || pfn.is_null() {
        return r;
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated name.
    let base = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if let Some(w) = wrapper(&versioned(base, version, flags)) {
        // SAFETY: checked non-null.
        unsafe { *pfn = w };
    }
    r
}

/// `cuGetProcAddress` (CUDA 11.3+): the runtime fetches every driver entry point through it, so the
/// intercepted ones are answered with our wrappers.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuGetProcAddress);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(symbol, pfn, version, flags) };
        proc_address(symbol, pfn, version, flags, r)
    })
}

/// `cuGetProcAddress_v2` (CUDA 12.0+), as [`cuGetProcAddress`].
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuGetProcAddress_v2);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(symbol, pfn, version, flags, status) };
        proc_address(symbol, pfn, version, flags, r)
    })
}

/// `dlsym`, interposed so a program that dlopens libcuda and looks symbols up gets the wrappers.
/// It never initialises the hook (the driver's own loading may call dlsym).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarding the caller's arguments to the C library.
    let p = unsafe { real(handle, symbol) };
    if p.is_null() || symbol.is_null() {
        return p;
    }
    // SAFETY: checked non-null; dlsym names are NUL-terminated.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if name.starts_with(b"cu") {
        catch_unwind(|| wrapper(name)).ok().flatten().unwrap_or(p)
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_cuda_error() {
        assert_eq!(boundary(|| panic!("boom")), CUDA_ERROR_UNKNOWN);
        assert_eq!(boundary(|| CUDA_SUCCESS), CUDA_SUCCESS);
    }

    #[test]
    fn proc_address_names_follow_the_cuda_version() {
        assert_eq!(versioned(b"cuMemAlloc", 12040, 0), b"cuMemAlloc_v2");
        assert_eq!(versioned(b"cuMemAlloc", 3000, 0), b"cuMemAlloc");
        assert_eq!(
            versioned(b"cuGetProcAddress", 12000, 0),
            b"cuGetProcAddress_v2"
        );
        assert_eq!(
            versioned(b"cuGetProcAddress", 11030, 0),
            b"cuGetProcAddress"
        );
        assert_eq!(versioned(b"cuLaunchKernel", 12040, 0), b"cuLaunchKernel");
        assert_eq!(
            versioned(b"cuMemAllocAsync", 12040, 2),
            b"cuMemAllocAsync_ptsz"
        );
        assert_eq!(versioned(b"cuMemAllocAsync", 12040, 1), b"cuMemAllocAsync");
        assert!(wrapper(b"cuMemAlloc_v2").is_some());
        assert!(wrapper(b"cuMemcpy").is_none());
    }
}
