//! Test double of `libcuda.so.1`: the subset of the CUDA driver C ABI that the runtime hook
//! intercepts or needs, with device-memory bookkeeping per device, a fixed total per device and a
//! launch counter. Tests copy the built `libfake_cuda.so` to a directory as `libcuda.so.1` and point
//! `LD_LIBRARY_PATH` at it, so programs load it exactly as they load the real driver.
//!
//! Configuration (environment, read at `cuInit`):
//! - `FAKE_CUDA_DEVICE_MEMORY`: comma-separated total memory per physical device (`16g,8g`), units as
//!   the vgpu environment contract; default one 16 GiB device.
//! - `CUDA_VISIBLE_DEVICES`: honoured as the driver does (integer indexes, in the given order, up to the
//!   first invalid entry).
//! - `FAKE_CUDA_BLOCK_NS`: GPU time per thread block of a launch (default 0); kernels of a device run
//!   one after another and a launch blocks while more than 2 ms of work is queued, so a program that
//!   launches as fast as it can keeps the device 100 % busy. `fakeCudaGetBusyNs` reports the busy time
//!   (the fake NVML turns it into utilization).
//! - `FAKE_CUDA_DRIVER_VERSION`: what `cuDriverGetVersion` reports (`12090`, `13000`; default
//!   12090, CUDA 12.9): the CUDA runtime refuses to start on a driver older than itself.
//! - `FAKE_CUDA_TRACE`: set, every `cuGetProcAddress` lookup and `cuGetExportTable` request is
//!   printed to stderr with what it found (how to see what a real caller asks of the driver).
//! - `FAKE_CUDA_SHARED`: path of a file through which all processes using the fake keep a device-wide
//!   total, and its peak, the way a real GPU's memory is shared by every process on it. Memory of a
//!   process that died is released (the driver frees a process's allocations when it exits).
//!
//! Each function's comment names the documented CUDA behaviour it copies. Unimplemented parts of an
//! API (flags, streams) are accepted and ignored.
//!
//! Unsafe code: this crate *is* a C ABI, so it dereferences the caller's pointers after null checks
//! and maps the shared file; every such spot carries a `SAFETY` comment.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
#![allow(missing_docs)]

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
// parking_lot's Mutex hands the lock to a waiter that has waited 0.5 ms ("eventual fairness"):
// under the stress tests' 16 threads per process, std's barging Mutex let one thread starve for
// seconds, which the tests read as the hook blocking.
use parking_lot::{Mutex, MutexGuard};
use std::sync::OnceLock;

mod device;
mod export_tables;
mod memory_ops;
mod modules;
mod pools;
mod streams;
mod unsupported;
mod vmm;

pub(crate) type CUresult = c_int;
pub(crate) type CUdevice = c_int;
type CUdeviceptr = u64;
pub(crate) type CUcontext = *mut c_void;

pub(crate) const CUDA_SUCCESS: CUresult = 0;
pub(crate) const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub(crate) const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub(crate) const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub(crate) const CUDA_ERROR_NOT_FOUND: CUresult = 500;

/// Version `cuDriverGetVersion` reports without `FAKE_CUDA_DRIVER_VERSION` (CUDA 12.9).
const DRIVER_VERSION: c_int = 12090;

/// The version this driver claims: `FAKE_CUDA_DRIVER_VERSION`, else [`DRIVER_VERSION`].
fn driver_version() -> c_int {
    static VERSION: OnceLock<c_int> = OnceLock::new();
    *VERSION.get_or_init(|| {
        std::env::var("FAKE_CUDA_DRIVER_VERSION")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DRIVER_VERSION)
    })
}

struct Device {
    total: u64,
    used: u64,
    /// Monotonic ns at which the last queued kernel ends.
    busy_until: u64,
    /// GPU ns of all kernels queued so far.
    scheduled: u64,
    /// Contexts this process created or retained on the device (NVML lists a process among the
    /// device's compute processes once it has one).
    contexts: u64,
}

pub(crate) struct State {
    devices: Vec<Device>,
    /// Physical index of each visible ordinal (for the shared file).
    physical: Vec<usize>,
    allocations: HashMap<u64, (usize, u64)>,
    next_ptr: u64,
    next_low_ptr: u64,
    launches: u64,
}

static STATE: OnceLock<Result<Mutex<State>, CUresult>> = OnceLock::new();
static LAUNCHES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The calling thread's current context: the visible ordinal it was created for.
    pub(crate) static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

fn parse_state() -> Result<Mutex<State>, CUresult> {
    let spec = std::env::var("FAKE_CUDA_DEVICE_MEMORY").unwrap_or_else(|_| "16g".into());
    let mut physical_totals = Vec::new();
    for part in spec.split(',') {
        match vgpu_core::env::parse_memory_bytes(part) {
            Ok(b) => physical_totals.push(b),
            Err(e) => {
                eprintln!("fake-cuda: FAKE_CUDA_DEVICE_MEMORY: {e}");
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
    }
    // CUDA_VISIBLE_DEVICES: "only the devices whose index is present in the sequence are visible to
    // CUDA applications and they are enumerated in the order of the sequence"; an invalid index hides
    // it and every one after it (CUDA C Programming Guide, CUDA Environment Variables).
    let physical: Vec<usize> = match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) => list
            .split(',')
            .map(|s| s.trim().parse::<usize>().ok())
            .take_while(|i| i.is_some_and(|i| i < physical_totals.len()))
            .flatten()
            .collect(),
        Err(_) => (0..physical_totals.len()).collect(),
    };
    let devices = physical
        .iter()
        .map(|&p| Device {
            total: physical_totals[p],
            used: 0,
            busy_until: 0,
            scheduled: 0,
            contexts: 0,
        })
        .collect();
    Ok(Mutex::new(State {
        devices,
        physical,
        allocations: HashMap::new(),
        next_ptr: 0x7f00_0000_0000,
        next_low_ptr: 0x1000_0000,
        launches: 0,
    }))
}

pub(crate) fn state() -> Result<MutexGuard<'static, State>, CUresult> {
    match STATE.get() {
        Some(Ok(m)) => Ok(m.lock()),
        Some(Err(e)) => Err(*e),
        None => Err(CUDA_ERROR_NOT_INITIALIZED),
    }
}

macro_rules! try_cu {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}
pub(crate) use try_cu;

/// `cuInit`: "Initializes the driver API and must be called before any other function from the driver
/// API"; flags must be 0 (CUDA_ERROR_INVALID_VALUE otherwise).
#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match STATE.get_or_init(parse_state) {
        Ok(_) => CUDA_SUCCESS,
        Err(e) => *e,
    }
}

/// `cuDriverGetVersion`: works before cuInit.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CUresult {
    if version.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { *version = driver_version() };
    CUDA_SUCCESS
}

/// `cuDeviceGetCount`: number of visible devices.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    let s = try_cu!(state());
    if count.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *count = s.devices.len() as c_int };
    CUDA_SUCCESS
}

/// `cuDeviceGet`: the handle of ordinal `ordinal` is the ordinal itself (as in the real driver);
/// CUDA_ERROR_INVALID_DEVICE outside `0..count`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    let s = try_cu!(state());
    if device.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ordinal < 0 || ordinal as usize >= s.devices.len() {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    // SAFETY: checked non-null.
    unsafe { *device = ordinal };
    CUDA_SUCCESS
}

pub(crate) fn device_index(s: &State, dev: CUdevice) -> Result<usize, CUresult> {
    if dev < 0 || dev as usize >= s.devices.len() {
        Err(CUDA_ERROR_INVALID_DEVICE)
    } else {
        Ok(dev as usize)
    }
}

/// `cuDeviceTotalMem_v2`: "Returns the total amount of memory on the device" in bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if bytes.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *bytes = s.devices[d].total as usize };
    CUDA_SUCCESS
}

fn make_current(ordinal: usize) -> CUcontext {
    CURRENT.with(|c| c.set(Some(ordinal)));
    (ordinal + 1) as CUcontext
}

/// `cuCtxCreate_v2`: creates a context on `dev` and makes it current to the calling thread.
#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    let mut s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    s.devices[d].contexts += 1;
    // SAFETY: checked non-null.
    unsafe { *pctx = make_current(d) };
    CUDA_SUCCESS
}

/// `cuDevicePrimaryCtxRetain`: returns the device's primary context (not made current).
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    let mut s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    s.devices[d].contexts += 1;
    // SAFETY: checked non-null.
    unsafe { *pctx = (d + 1) as CUcontext };
    CUDA_SUCCESS
}

/// `cuCtxSetCurrent`: binds `ctx` to the calling thread; NULL unbinds.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    let s = try_cu!(state());
    let v = ctx as usize;
    if v == 0 {
        CURRENT.with(|c| c.set(None));
        return CUDA_SUCCESS;
    }
    if v > s.devices.len() {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    make_current(v - 1);
    CUDA_SUCCESS
}

/// `cuCtxDestroy_v2`: unbinds it if current (allocations stay: the fake frees nothing implicitly).
#[no_mangle]
pub extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    let _s = try_cu!(state());
    let v = ctx as usize;
    if CURRENT.with(|c| c.get()) == v.checked_sub(1) {
        CURRENT.with(|c| c.set(None));
    }
    CUDA_SUCCESS
}

/// `cuCtxGetDevice`: the current context's device; CUDA_ERROR_INVALID_CONTEXT without one.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    let _s = try_cu!(state());
    if device.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match CURRENT.with(|c| c.get()) {
        // SAFETY: checked non-null.
        Some(d) => unsafe { *device = d as CUdevice },
        None => return CUDA_ERROR_INVALID_CONTEXT,
    }
    CUDA_SUCCESS
}

pub(crate) fn current() -> Result<usize, CUresult> {
    CURRENT.with(|c| c.get()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// Allocation common to every allocator: "If bytesize is 0, cuMemAlloc() returns
/// CUDA_ERROR_INVALID_VALUE"; CUDA_ERROR_OUT_OF_MEMORY when the device has not that much free.
fn alloc_on(d: usize, bytes: u64) -> Result<u64, CUresult> {
    alloc_on_at(d, bytes, false)
}

/// As [`alloc_on`]; `low` picks a pointer below 4 GiB (for the 32-bit legacy ABI).
fn alloc_on_at(d: usize, bytes: u64, low: bool) -> Result<u64, CUresult> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    free_closed_exports();
    let mut s = state()?;
    let dev = &s.devices[d];
    if dev.used.saturating_add(bytes) > dev.total {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    // Allocations are "suitably aligned for any kind of variable"; keep 512-byte alignment and a gap.
    let step = bytes.div_ceil(512) * 512 + 512;
    if low && s.next_low_ptr.saturating_add(step) > u64::from(u32::MAX) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let phys = s.physical[d];
    if !shared::alloc(phys, bytes, s.devices[d].total) {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    s.devices[d].used += bytes;
    let ptr = if low {
        let p = s.next_low_ptr;
        s.next_low_ptr += step;
        p
    } else {
        let p = s.next_ptr;
        s.next_ptr += step;
        p
    };
    s.allocations.insert(ptr, (d, bytes));
    Ok(ptr)
}

/// Of `(start, size)` ranges, the one containing `ptr`.
pub(crate) fn containing(ranges: impl Iterator<Item = (u64, u64)>, ptr: u64) -> Option<(u64, u64)> {
    ranges
        .into_iter()
        .find(|&(at, n)| (at..at + n).contains(&ptr))
}

/// The allocation (`cuMemAlloc`, pitched, managed, stream-ordered, mapped, or a module's global)
/// containing `ptr`: its start and size.
pub(crate) fn allocation_at(ptr: u64) -> Option<(u64, u64)> {
    let plain = {
        let s = state().ok()?;
        containing(s.allocations.iter().map(|(&at, &(_, n))| (at, n)), ptr)
    };
    plain
        .or_else(|| pools::allocation_at(ptr))
        .or_else(|| vmm::mapping_at(ptr))
        .or_else(|| modules::global_at(ptr))
}

/// Takes `bytes` of device `d`'s memory without a pointer of its own (a memory pool's reserve
/// grows); CUDA_ERROR_OUT_OF_MEMORY when the device has not that much free.
pub(crate) fn take_device_memory(d: usize, bytes: u64) -> Result<(), CUresult> {
    let mut s = state()?;
    if s.devices[d].used.saturating_add(bytes) > s.devices[d].total
        || !shared::alloc(s.physical[d], bytes, s.devices[d].total)
    {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    s.devices[d].used += bytes;
    Ok(())
}

/// Gives back memory [`take_device_memory`] took.
pub(crate) fn give_device_memory(d: usize, bytes: u64) {
    if let Ok(mut s) = state() {
        s.devices[d].used -= bytes.min(s.devices[d].used);
        shared::free(s.physical[d], bytes);
    }
}

/// A fresh device address for `bytes` (pool allocations take their memory from the pool).
pub(crate) fn next_address(bytes: u64) -> Result<u64, CUresult> {
    let mut s = state()?;
    let p = s.next_ptr;
    s.next_ptr += bytes.div_ceil(512) * 512 + 512;
    Ok(p)
}

pub(crate) fn free_ptr(ptr: u64) -> CUresult {
    if pools::free(ptr) {
        return CUDA_SUCCESS;
    }
    let mut s = try_cu!(state());
    match s.allocations.remove(&ptr) {
        Some((d, bytes)) => {
            s.devices[d].used -= bytes;
            shared::free(s.physical[d], bytes);
            CUDA_SUCCESS
        }
        // Freeing an unknown pointer: CUDA_ERROR_INVALID_VALUE.
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

unsafe fn write_ptr(out: *mut CUdeviceptr, r: Result<u64, CUresult>) -> CUresult {
    match r {
        Ok(p) => {
            // SAFETY: the callers check `out` for null first.
            unsafe { *out = p };
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// `cuMemAlloc_v2`: allocates `bytesize` bytes of linear memory on the current context's device.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    // SAFETY: same contract.
    unsafe { alloc_current(dptr, bytesize) }
}

// Exported functions never call each other: in a process with the hook preloaded such a call would
// go through the hook again (symbol interposition) and be counted twice; the real driver does not.
unsafe fn alloc_current(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    // SAFETY: checked non-null.
    unsafe { write_ptr(dptr, alloc_on(d, bytesize as u64)) }
}

/// `cuMemAlloc` (the CUDA 3.1 ABI, kept by the driver for old binaries): 32-bit size and device
/// pointer. The fake hands these out from a separate low range so that they fit in 32 bits.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc(dptr: *mut u32, bytesize: c_uint) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    match alloc_on_at(d, u64::from(bytesize), true) {
        Ok(p) => {
            // SAFETY: checked non-null; low-range pointers fit in 32 bits.
            unsafe { *dptr = p as u32 };
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// `cuMemFree` (CUDA 3.1 ABI).
#[no_mangle]
pub extern "C" fn cuMemFree(dptr: u32) -> CUresult {
    free_ptr(u64::from(dptr))
}

/// `cuMemGetInfo` (CUDA 3.1 ABI): 32-bit sizes, saturated at 4 GiB - 1 as the driver does.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    let s = try_cu!(state());
    let dev = &s.devices[d];
    let used = shared::used(s.physical[d]).unwrap_or(dev.used);
    // SAFETY: both checked non-null.
    unsafe {
        *free = dev.total.saturating_sub(used).min(u64::from(c_uint::MAX)) as c_uint;
        *total = dev.total.min(u64::from(c_uint::MAX)) as c_uint;
    }
    CUDA_SUCCESS
}

/// `cuMemAllocManaged`: managed memory, counted against the current device as the hook counts it.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    _flags: c_uint,
) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    // SAFETY: checked non-null.
    unsafe { write_ptr(dptr, alloc_on(d, bytesize as u64)) }
}

/// Pitch the fake picks: the width rounded up to 512 bytes (real devices align rows to their
/// texture pitch alignment, at most 512 bytes on current GPUs).
pub const PITCH_ALIGN: usize = 512;

/// `cuMemAllocPitch_v2`: "Allocates at least WidthInBytes * Height bytes"; the row pitch is returned in
/// `*pPitch`; ElementSizeBytes must be 4, 8 or 16.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CUresult {
    if dptr.is_null() || pitch.is_null() || !matches!(element, 4 | 8 | 16) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    let p = width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN;
    match alloc_on(d, (p as u64).saturating_mul(height as u64)) {
        Ok(ptr) => {
            // SAFETY: both checked non-null.
            unsafe {
                *dptr = ptr;
                *pitch = p;
            }
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// `cuMemAllocAsync`: "Allocates memory with stream ordered semantics ... from the current memory
/// pool of the current context's device" (the fake's current pool is the default one); completed
/// at once.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { alloc_current_pool(dptr, bytesize) }
}

unsafe fn alloc_current_pool(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    // SAFETY: checked non-null.
    unsafe { write_ptr(dptr, pools::alloc(pools::current_pool(d), bytesize as u64)) }
}

/// `cuMemAllocAsync_ptsz`: per-thread default stream variant.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { alloc_current_pool(dptr, bytesize) }
}

/// `cuMemAllocFromPoolAsync`: "Allocates memory from a specified pool with stream ordered
/// semantics", on the pool's device; CUDA_ERROR_INVALID_HANDLE for an unknown pool.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: *mut c_void,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { alloc_from_pool(dptr, bytesize, pool) }
}

/// `cuMemAllocFromPoolAsync_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: *mut c_void,
    _stream: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { alloc_from_pool(dptr, bytesize, pool) }
}

unsafe fn alloc_from_pool(dptr: *mut CUdeviceptr, bytesize: usize, pool: *mut c_void) -> CUresult {
    if dptr.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { write_ptr(dptr, pools::alloc(pool as usize, bytesize as u64)) }
}

/// `cuMemFree_v2`: frees memory from any of the allocators above.
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    free_ptr(dptr)
}

/// `cuMemFreeAsync`: stream-ordered free, completed at once.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    free_ptr(dptr)
}

/// `cuMemFreeAsync_ptsz`.
#[no_mangle]
pub extern "C" fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, _stream: *mut c_void) -> CUresult {
    free_ptr(dptr)
}

/// `cuMemCreate` (virtual memory management): "Create a CUmemGenericAllocationHandle representing
/// a memory allocation of a given size described by the given properties"; physical memory on the
/// device `prop->location.id` (counted there), or in host memory for the host location types
/// (counted nowhere: NCCL's cuMem host buffers); the handle is the fake's allocation key.
#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const vmm::MemAllocationProp,
    _flags: u64,
) -> CUresult {
    if handle.is_null() || prop.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a CUmemAllocationProp.
    let prop = unsafe { &*prop };
    try_cu!(state().map(drop));
    let created = |key: u64| {
        vmm::created(key, prop);
        key
    };
    if try_cu!(vmm::is_host(prop)) {
        // SAFETY: checked non-null.
        return unsafe { write_ptr(handle, vmm::create_host(size as u64).map(created)) };
    }
    // "The size of the allocation must be a multiple of the granularity" (cuMemGetAllocationGranularity).
    if !(size as u64).is_multiple_of(vmm::GRANULARITY) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = {
        let s = try_cu!(state());
        try_cu!(device_index(&s, prop.location_id))
    };
    // SAFETY: checked non-null.
    unsafe { write_ptr(handle, alloc_on(d, size as u64).map(created)) }
}

/// `cuMemRelease`: "Release a memory handle representing a memory allocation which was previously
/// allocated through cuMemCreate. The memory allocation will be freed when all outstanding
/// mappings to the memory are unmapped and when all outstanding references to the handle
/// (including it's shareable counterparts) are also released."
#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    if vmm::release_host(handle) {
        return CUDA_SUCCESS;
    }
    if let Some(r) = vmm::release(handle) {
        return r;
    }
    free_ptr(handle)
}

/// Frees the released allocations whose exported descriptors have all been closed since (the
/// driver's kernel side learns it at the close; the fake, at the next call that looks at memory).
fn free_closed_exports() {
    for key in vmm::closed() {
        free_ptr(key);
    }
}

/// `CUDA_ARRAY_DESCRIPTOR`.
#[repr(C)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: c_uint,
    pub channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub channels: c_uint,
    pub flags: c_uint,
}

/// Bytes per element of a `CUarray_format` (0x01/0x08 8-bit, 0x02/0x09/0x10 16-bit, 0x03/0x0a/0x20 32-bit).
pub fn format_bytes(format: c_uint) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),
        0x02 | 0x09 | 0x10 => Some(2),
        0x03 | 0x0a | 0x20 => Some(4),
        _ => None,
    }
}

fn array_alloc(
    out: *mut *mut c_void,
    w: usize,
    h: usize,
    dep: usize,
    format: c_uint,
    ch: c_uint,
) -> CUresult {
    let Some(fb) = format_bytes(format) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    if out.is_null() || !matches!(ch, 1 | 2 | 4) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = try_cu!(current());
    let bytes = (w.max(1) as u64) * (h.max(1) as u64) * (dep.max(1) as u64) * fb * u64::from(ch);
    match alloc_on(d, bytes) {
        Ok(p) => {
            // SAFETY: checked non-null.
            unsafe { *out = p as *mut c_void };
            CUDA_SUCCESS
        }
        Err(e) => e,
    }
}

/// `cuArrayCreate_v2`: a 1D/2D CUDA array of width x height elements of `NumChannels` x format size.
#[no_mangle]
pub unsafe extern "C" fn cuArrayCreate_v2(
    array: *mut *mut c_void,
    desc: *const ArrayDescriptor,
) -> CUresult {
    if desc.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    let d = unsafe { &*desc };
    array_alloc(array, d.width, d.height, 1, d.format, d.channels)
}

/// `cuArray3DCreate_v2`: a 3D CUDA array.
#[no_mangle]
pub unsafe extern "C" fn cuArray3DCreate_v2(
    array: *mut *mut c_void,
    desc: *const Array3dDescriptor,
) -> CUresult {
    if desc.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    let d = unsafe { &*desc };
    array_alloc(array, d.width, d.height, d.depth, d.format, d.channels)
}

/// `cuArrayDestroy`.
#[no_mangle]
pub extern "C" fn cuArrayDestroy(array: *mut c_void) -> CUresult {
    free_ptr(array as u64)
}

/// `CUDA_ARRAY3D_LAYERED` and `CUDA_ARRAY3D_CUBEMAP` (cuda.h): the depth counts layers (or the 6
/// faces), which mipmap levels do not shrink.
const ARRAY3D_LAYERED: c_uint = 0x01;
const ARRAY3D_CUBEMAP: c_uint = 0x04;

/// Elements of a mipmapped array: level `l` has each dimension halved `l` times (at least 1);
/// "numMipmapLevels ... Number of mipmap levels" (cuMipmappedArrayCreate), height 0 = 1D, depth 0 =
/// 2D, layered and cubemap depths are not halved.
pub fn mipmapped_elements(w: usize, h: usize, d: usize, flags: c_uint, levels: c_uint) -> u64 {
    let keep_depth = flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    (0..levels.max(1))
        .map(|l| {
            let shrink = |x: usize| (x.max(1) as u64 >> l.min(63)).max(1);
            let depth = if keep_depth {
                d.max(1) as u64
            } else {
                shrink(d)
            };
            shrink(w) * shrink(h) * depth
        })
        .fold(0u64, u64::saturating_add)
}

/// `cuMipmappedArrayCreate`: a mipmapped CUDA array of `levels` levels described by a 3D
/// descriptor; CUDA_ERROR_INVALID_VALUE for a zero level count.
#[no_mangle]
pub unsafe extern "C" fn cuMipmappedArrayCreate(
    array: *mut *mut c_void,
    desc: *const Array3dDescriptor,
    levels: c_uint,
) -> CUresult {
    if desc.is_null() || levels == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    let d = unsafe { &*desc };
    let elements = mipmapped_elements(d.width, d.height, d.depth, d.flags, levels);
    array_alloc(array, elements as usize, 1, 1, d.format, d.channels)
}

/// `cuMipmappedArrayDestroy`.
#[no_mangle]
pub extern "C" fn cuMipmappedArrayDestroy(array: *mut c_void) -> CUresult {
    free_ptr(array as u64)
}

/// `cuMemGetInfo_v2`: free and total memory of the current context's device. With `FAKE_CUDA_SHARED`
/// free is what all processes left, as on a real GPU.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    if free.is_null() || total.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    free_closed_exports();
    let d = try_cu!(current());
    let s = try_cu!(state());
    let dev = &s.devices[d];
    let used = shared::used(s.physical[d]).unwrap_or(dev.used);
    // SAFETY: both checked non-null.
    unsafe {
        *free = dev.total.saturating_sub(used) as usize;
        *total = dev.total as usize;
    }
    CUDA_SUCCESS
}

/// GPU time one thread block takes (`FAKE_CUDA_BLOCK_NS`, default 0: kernels take no time).
fn block_ns() -> u64 {
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::env::var("FAKE_CUDA_BLOCK_NS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
}

/// Work a device may have queued before a launch blocks: launches are asynchronous, and "the launch
/// queue has a finite depth; when it is full, the launching thread blocks" (CUDA C Programming
/// Guide, asynchronous concurrent execution). Modelled as 2 ms of queued GPU time.
const QUEUE_NS: u64 = 2_000_000;

fn now_ns() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Counts a launch of `blocks` thread blocks on the current device and queues its GPU time: the
/// device runs one kernel after another, so it is busy until the last queued kernel ends.
fn launch(blocks: u64) -> CUresult {
    let mut s = try_cu!(state());
    let Some(d) = CURRENT.with(|c| c.get()) else {
        return CUDA_ERROR_INVALID_CONTEXT;
    };
    s.launches += 1;
    LAUNCHES.fetch_add(1, Ordering::Relaxed);
    let work = blocks.saturating_mul(block_ns());
    if work == 0 {
        return CUDA_SUCCESS;
    }
    let now = now_ns();
    let dev = &mut s.devices[d];
    dev.busy_until = dev.busy_until.max(now) + work;
    dev.scheduled += work;
    let ahead = dev.busy_until - now;
    drop(s);
    if ahead > QUEUE_NS {
        std::thread::sleep(std::time::Duration::from_nanos(ahead - QUEUE_NS));
    }
    CUDA_SUCCESS
}

/// Test hook (not CUDA; read by the fake NVML as NVML reads the GPU): GPU time in ns that kernels
/// launched by this process have run on physical device `dev` so far.
#[no_mangle]
pub unsafe extern "C" fn fakeCudaGetBusyNs(dev: c_int, busy: *mut u64) -> CUresult {
    if busy.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let s = try_cu!(state());
    let Some(d) = s.physical.iter().position(|&p| p as c_int == dev) else {
        return CUDA_ERROR_INVALID_DEVICE;
    };
    let dev = &s.devices[d];
    let queued = dev.busy_until.saturating_sub(now_ns());
    // SAFETY: checked non-null.
    unsafe { *busy = dev.scheduled.saturating_sub(queued) };
    CUDA_SUCCESS
}

/// Test hook (not CUDA; read by the fake NVML as NVML lists compute processes): contexts this
/// process has created or retained on physical device `dev`.
#[no_mangle]
pub unsafe extern "C" fn fakeCudaGetContextCount(dev: c_int, count: *mut u64) -> CUresult {
    if count.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let s = try_cu!(state());
    let Some(d) = s.physical.iter().position(|&p| p as c_int == dev) else {
        return CUDA_ERROR_INVALID_DEVICE;
    };
    // SAFETY: checked non-null.
    unsafe { *count = s.devices[d].contexts };
    CUDA_SUCCESS
}

/// Test hook (not CUDA; read by the fake NVML): bytes allocated on physical device `dev`, by every
/// process when `FAKE_CUDA_SHARED` is set, else by this one.
#[no_mangle]
pub unsafe extern "C" fn fakeCudaGetDeviceUsed(dev: c_int, used: *mut u64) -> CUresult {
    if used.is_null() || dev < 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    free_closed_exports();
    let s = try_cu!(state());
    let own = s
        .physical
        .iter()
        .position(|&p| p as c_int == dev)
        .map_or(0, |d| s.devices[d].used);
    // SAFETY: checked non-null.
    unsafe { *used = shared::used(dev as usize).unwrap_or(own) };
    CUDA_SUCCESS
}

/// `cuLaunchKernel`: counted; grid and block must be non-zero (CUDA_ERROR_INVALID_VALUE).
#[no_mangle]
pub extern "C" fn cuLaunchKernel(
    _f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    _stream: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    launch_grid([gx, gy, gz], [bx, by, bz])
}

fn launch_grid(grid: [c_uint; 3], block: [c_uint; 3]) -> CUresult {
    if grid.contains(&0) || block.contains(&0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    launch(grid.iter().map(|&g| u64::from(g)).product())
}

/// `cuLaunchKernel_ptsz`.
#[no_mangle]
pub extern "C" fn cuLaunchKernel_ptsz(
    f: *mut c_void,
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
    let _ = (f, shared, stream, params, extra);
    launch_grid([gx, gy, gz], [bx, by, bz])
}

/// `cuLaunchCooperativeKernel`: as cuLaunchKernel without `extra`.
#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> CUresult {
    let _ = (f, shared, stream, params);
    launch_grid([gx, gy, gz], [bx, by, bz])
}

/// `cuLaunchCooperativeKernel_ptsz`.
#[no_mangle]
pub extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> CUresult {
    let _ = (f, shared, stream, params);
    launch_grid([gx, gy, gz], [bx, by, bz])
}

/// `CUlaunchConfig` prefix: grid, block, shared memory.
#[repr(C)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// `cuLaunchKernelEx`: the launch shape comes from `config`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const LaunchConfig,
    _f: *mut c_void,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    let c = unsafe { &*config };
    launch_grid(c.grid, c.block)
}

/// `cuLaunchKernelEx_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const LaunchConfig,
    f: *mut c_void,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    if config.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let _ = (f, params, extra);
    // SAFETY: checked non-null.
    let c = unsafe { &*config };
    launch_grid(c.grid, c.block)
}

/// `cuGraphLaunch`: one counted launch per graph.
#[no_mangle]
pub extern "C" fn cuGraphLaunch(_exec: *mut c_void, _stream: *mut c_void) -> CUresult {
    launch(1)
}

/// `cuGraphLaunch_ptsz`.
#[no_mangle]
pub extern "C" fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: *mut c_void) -> CUresult {
    let _ = (exec, stream);
    launch(1)
}

/// Test hook (not CUDA): launches this process made, for tests to compare with the hook's meter.
#[no_mangle]
pub unsafe extern "C" fn fakeCudaGetLaunchCount(count: *mut u64) -> CUresult {
    if count.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *count = LAUNCHES.load(Ordering::Relaxed) };
    CUDA_SUCCESS
}

/// Test hook (not CUDA): peak device-wide total of physical device `dev` seen through the shared file.
#[no_mangle]
pub unsafe extern "C" fn fakeCudaGetSharedPeak(dev: c_int, peak: *mut u64) -> CUresult {
    if peak.is_null() || dev < 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match shared::peak(dev as usize) {
        // SAFETY: checked non-null.
        Some(p) => unsafe { *peak = p },
        None => return CUDA_ERROR_NOT_FOUND,
    }
    CUDA_SUCCESS
}

/// The symbols `cuGetProcAddress` knows, with the name each base name and version resolves to.
fn proc_symbol(name: &str, version: c_int, flags: u64) -> Option<*mut c_void> {
    // Names with a _v2 ABI since CUDA 3.2 (the driver returns the _v2 entry for cudaVersion >= 3020).
    const V2: &[&str] = &[
        "cuMemAlloc",
        "cuMemAllocPitch",
        "cuMemFree",
        "cuMemGetInfo",
        "cuDeviceTotalMem",
        "cuCtxCreate",
        "cuCtxDestroy",
        "cuArrayCreate",
        "cuArray3DCreate",
    ];
    // Names with a per-thread-default-stream entry (flag CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2).
    const PTSZ: &[&str] = &[
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
        "cuMemAllocAsync",
        "cuMemAllocFromPoolAsync",
        "cuMemFreeAsync",
    ];
    // Later ABIs of a name, by the CUDA version that brought them (cuda.h's `#define`s of the
    // versioned names): asked at that version or later, the driver hands out that entry, so an
    // older one would be called with the wrong arguments. The fake exports none of these; asked
    // for one, it answers "not found" rather than an entry of another ABI.
    const LATER_ABI: &[(&str, c_int, &str)] = &[
        ("cuCtxCreate", 11040, "_v3"),
        ("cuCtxCreate", 12050, "_v4"),
        ("cuStreamGetCaptureInfo", 11030, "_v2"),
        ("cuStreamGetCaptureInfo", 12030, "_v3"),
        ("cuGraphAddNode", 12030, "_v2"),
        ("cuGraphGetEdges", 12030, "_v2"),
        ("cuMemAdvise", 12020, "_v2"),
        ("cuMemPrefetchAsync", 12020, "_v2"),
    ];
    if let Some((_, _, suffix)) = LATER_ABI
        .iter()
        .filter(|(n, since, _)| *n == name && version >= *since)
        .max_by_key(|(_, since, _)| *since)
    {
        return own_symbol(&format!("{name}{suffix}"));
    }
    let mut full = name.to_string();
    if V2.contains(&name) {
        if version >= 3020 {
            full.push_str("_v2");
        }
    } else if PTSZ.contains(&name) && flags & 2 != 0 {
        full.push_str("_ptsz");
    } else if name == "cuGetProcAddress" && version >= 12000 {
        full.push_str("_v2");
    }
    let p = match full.as_str() {
        "cuInit" => cuInit as *mut c_void,
        "cuDriverGetVersion" => cuDriverGetVersion as *mut c_void,
        "cuDeviceGetCount" => cuDeviceGetCount as *mut c_void,
        "cuDeviceGet" => cuDeviceGet as *mut c_void,
        "cuDeviceTotalMem_v2" => cuDeviceTotalMem_v2 as *mut c_void,
        "cuCtxCreate_v2" => cuCtxCreate_v2 as *mut c_void,
        "cuCtxDestroy_v2" => cuCtxDestroy_v2 as *mut c_void,
        "cuCtxSetCurrent" => cuCtxSetCurrent as *mut c_void,
        "cuCtxGetDevice" => cuCtxGetDevice as *mut c_void,
        "cuDevicePrimaryCtxRetain" => cuDevicePrimaryCtxRetain as *mut c_void,
        "cuMemAlloc_v2" => cuMemAlloc_v2 as *mut c_void,
        "cuMemAlloc" => cuMemAlloc as *mut c_void,
        "cuMemFree" => cuMemFree as *mut c_void,
        "cuMemGetInfo" => cuMemGetInfo as *mut c_void,
        "cuMemAllocManaged" => cuMemAllocManaged as *mut c_void,
        "cuMemAllocPitch_v2" => cuMemAllocPitch_v2 as *mut c_void,
        "cuMemAllocAsync" => cuMemAllocAsync as *mut c_void,
        "cuMemAllocAsync_ptsz" => cuMemAllocAsync_ptsz as *mut c_void,
        "cuMemAllocFromPoolAsync" => cuMemAllocFromPoolAsync as *mut c_void,
        "cuMemAllocFromPoolAsync_ptsz" => cuMemAllocFromPoolAsync_ptsz as *mut c_void,
        "cuMemFree_v2" => cuMemFree_v2 as *mut c_void,
        "cuMemFreeAsync" => cuMemFreeAsync as *mut c_void,
        "cuMemFreeAsync_ptsz" => cuMemFreeAsync_ptsz as *mut c_void,
        "cuMemCreate" => cuMemCreate as *mut c_void,
        "cuMemRelease" => cuMemRelease as *mut c_void,
        "cuArrayCreate_v2" => cuArrayCreate_v2 as *mut c_void,
        "cuArray3DCreate_v2" => cuArray3DCreate_v2 as *mut c_void,
        "cuArrayDestroy" => cuArrayDestroy as *mut c_void,
        "cuMipmappedArrayCreate" => cuMipmappedArrayCreate as *mut c_void,
        "cuMipmappedArrayDestroy" => cuMipmappedArrayDestroy as *mut c_void,
        "cuMemGetInfo_v2" => cuMemGetInfo_v2 as *mut c_void,
        "cuLaunchKernel" => cuLaunchKernel as *mut c_void,
        "cuLaunchKernel_ptsz" => cuLaunchKernel_ptsz as *mut c_void,
        "cuLaunchKernelEx" => cuLaunchKernelEx as *mut c_void,
        "cuLaunchKernelEx_ptsz" => cuLaunchKernelEx_ptsz as *mut c_void,
        "cuLaunchCooperativeKernel" => cuLaunchCooperativeKernel as *mut c_void,
        "cuLaunchCooperativeKernel_ptsz" => cuLaunchCooperativeKernel_ptsz as *mut c_void,
        "cuGraphLaunch" => cuGraphLaunch as *mut c_void,
        "cuGraphLaunch_ptsz" => cuGraphLaunch_ptsz as *mut c_void,
        "cuGetProcAddress" => cuGetProcAddress as *mut c_void,
        "cuGetProcAddress_v2" => cuGetProcAddress_v2 as *mut c_void,
        _ => return exported(name, version, flags),
    };
    Some(p)
}

/// Every other symbol: the entry this library exports under the name the driver would resolve
/// `name` to: the per-thread-default-stream entry (`_ptsz`, or `_ptds` for copies and memsets)
/// when `flags` asks for it, else the `_v2` ABI when there is one (all of the fake's `_v2` entries
/// date from before CUDA 12.0), else the name itself.
fn exported(name: &str, version: c_int, flags: u64) -> Option<*mut c_void> {
    let mut candidates = Vec::new();
    if flags & 2 != 0 {
        for suffix in ["_v2_ptds", "_ptds", "_v2_ptsz", "_ptsz"] {
            candidates.push(format!("{name}{suffix}"));
        }
    }
    if version >= 3020 {
        candidates.push(format!("{name}_v2"));
    }
    candidates.push(name.to_string());
    candidates.into_iter().find_map(|c| own_symbol(&c))
}

/// `dlsym` in this library itself (not the process's first definition, which may be a preloaded
/// hook's: the driver hands out its own entry points).
fn own_symbol(name: &str) -> Option<*mut c_void> {
    static SELF: OnceLock<usize> = OnceLock::new();
    let handle = *SELF.get_or_init(|| {
        // SAFETY: dladdr on one of our own functions (a private one: an exported name such as
        // cuInit may resolve to a preloaded hook's); the name it returns lives while we are
        // loaded, and dlopen with RTLD_NOLOAD only returns a handle to an object already loaded.
        unsafe {
            let mut info: libc::Dl_info = std::mem::zeroed();
            let anchor = own_symbol as fn(&str) -> Option<*mut c_void>;
            if libc::dladdr(anchor as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
                return 0;
            }
            libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) as usize
        }
    });
    if handle == 0 || !name.starts_with("cu") {
        return None;
    }
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle as *mut c_void, c.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// `cuGetProcAddress` (CUDA 11.3): "Returns the requested driver API function pointer" for `symbol`
/// as of `cudaVersion`, choosing the per-thread-default-stream entry when `flags` asks;
/// CUDA_ERROR_NOT_FOUND for an unknown symbol.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    // SAFETY: same contract, no status pointer.
    unsafe { proc_address(symbol, pfn, version, flags, std::ptr::null_mut()) }
}

/// `cuGetProcAddress_v2` (CUDA 12.0): as cuGetProcAddress, also writing a
/// `CUdriverProcAddressQueryResult` (0 success, 1 symbol not found, 2 version not sufficient).
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { proc_address(symbol, pfn, version, flags, status) }
}

unsafe fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_string_lossy();
    let found = proc_symbol(&name, version, flags);
    if std::env::var_os("FAKE_CUDA_TRACE").is_some() {
        let what = if found.is_some() {
            "found"
        } else {
            "NOT FOUND"
        };
        eprintln!("fake-cuda: cuGetProcAddress {name} version {version} flags {flags}: {what}");
    }
    // SAFETY: checked non-null (`status` only when non-null).
    unsafe {
        *pfn = found.unwrap_or(std::ptr::null_mut());
        if !status.is_null() {
            *status = if found.is_some() { 0 } else { 1 };
        }
    }
    if found.is_some() {
        CUDA_SUCCESS
    } else {
        CUDA_ERROR_NOT_FOUND
    }
}

/// The device-wide totals shared by all processes using the fake (`FAKE_CUDA_SHARED`).
///
/// Layout: 16 words of total per physical device, 16 words of peak, then 256 process slots of
/// 17 words (pid, bytes per device).
mod shared {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::OnceLock;

    const DEVS: usize = 16;
    const SLOTS: usize = 256;
    const SLOT: usize = 1 + DEVS;
    const WORDS: usize = 2 * DEVS + SLOTS * SLOT;

    struct Shared {
        words: &'static [AtomicU64],
        slot: usize,
        file: std::fs::File,
    }

    static SHARED: OnceLock<Option<Shared>> = OnceLock::new();

    fn open() -> Option<Shared> {
        let path = std::env::var_os("FAKE_CUDA_SHARED")?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .ok()?;
        let len = (WORDS * 8) as u64;
        if file.metadata().ok()?.len() < len {
            file.set_len(len).ok()?;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: mapping a file we just sized to WORDS words, shared, read-write; it stays mapped for
        // the life of the process (never unmapped), so the 'static slice stays valid.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                WORDS * 8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        // SAFETY: page-aligned mapping of WORDS u64 words; AtomicU64 has u64's layout.
        let words = unsafe { std::slice::from_raw_parts(p as *const AtomicU64, WORDS) };
        let pid = u64::from(std::process::id());
        // Lock the slot's byte first, then claim the slot: a reaper never sees a claimed slot
        // unlocked while its owner lives.
        let slot = (0..SLOTS).find(|&s| {
            if !slot_lock(&file, s, libc::F_OFD_SETLK, libc::F_WRLCK) {
                return false;
            }
            let claimed = words[2 * DEVS + s * SLOT]
                .compare_exchange(0, pid, SeqCst, SeqCst)
                .is_ok();
            if !claimed {
                slot_lock(&file, s, libc::F_OFD_SETLK, libc::F_UNLCK);
            }
            claimed
        })?;
        Some(Shared { words, slot, file })
    }

    /// An open-file-description lock on slot `s`'s byte of the file (past the words, never
    /// written). The owner holds it for its whole life; the kernel drops it when the process exits,
    /// before it is a zombie, as the real driver frees a process's memory when its device files
    /// close at exit. `F_OFD_GETLK` asks whether another description holds it (true = held).
    fn slot_lock(file: &std::fs::File, s: usize, cmd: libc::c_int, kind: libc::c_int) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: a zeroed flock is valid; OFD locks require l_pid = 0.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = (WORDS * 8 + s) as libc::off_t;
        fl.l_len = 1;
        // SAFETY: fcntl on our own descriptor with a valid flock.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) };
        if cmd == libc::F_OFD_GETLK {
            return r == 0 && fl.l_type != libc::F_UNLCK as libc::c_short;
        }
        r == 0
    }

    fn get() -> Option<&'static Shared> {
        SHARED.get_or_init(open).as_ref()
    }

    /// Whether slot `s`'s owner still runs: its lock is held (see [`slot_lock`]). Dead and
    /// zombie processes hold none, so their memory is gone before they are reaped. One fcntl per
    /// slot, where reading /proc/<pid>/stat under the lock made every allocation slow enough to
    /// queue the stress tests' threads behind it.
    fn alive(sh: &Shared, s: usize) -> bool {
        slot_lock(&sh.file, s, libc::F_OFD_GETLK, libc::F_WRLCK)
    }

    /// Runs `f` under an exclusive `flock` of the file: the kernel drops it when a holder dies, so a
    /// killed process never leaves the others waiting.
    fn locked<T>(sh: &Shared, f: impl FnOnce() -> T) -> T {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on our own open descriptor.
        unsafe { libc::flock(sh.file.as_raw_fd(), libc::LOCK_EX) };
        let r = f();
        // SAFETY: as above.
        unsafe { libc::flock(sh.file.as_raw_fd(), libc::LOCK_UN) };
        r
    }

    fn slot_used(sh: &Shared, s: usize, dev: usize) -> &AtomicU64 {
        &sh.words[2 * DEVS + s * SLOT + 1 + dev]
    }

    /// Releases the memory of dead processes (the driver frees it at process exit) and returns the
    /// device total of the live ones. Called under the lock.
    fn reap_and_sum(sh: &Shared, dev: usize) -> u64 {
        let mut total = 0u64;
        for s in 0..SLOTS {
            let owner = &sh.words[2 * DEVS + s * SLOT];
            let pid = owner.load(SeqCst);
            if pid == 0 {
                continue;
            }
            if s != sh.slot && !alive(sh, s) {
                for d in 0..DEVS {
                    slot_used(sh, s, d).store(0, SeqCst);
                }
                owner.store(0, SeqCst);
                continue;
            }
            total += slot_used(sh, s, dev).load(SeqCst);
        }
        sh.words[dev].store(total, SeqCst);
        total
    }

    /// Adds `bytes` to the device total unless that passes `total`; records the peak.
    pub fn alloc(dev: usize, bytes: u64, total: u64) -> bool {
        let Some(sh) = get() else { return true };
        if dev >= DEVS {
            return true;
        }
        locked(sh, || {
            let now = reap_and_sum(sh, dev) + bytes;
            if now > total {
                return false;
            }
            slot_used(sh, sh.slot, dev).fetch_add(bytes, SeqCst);
            sh.words[dev].store(now, SeqCst);
            sh.words[DEVS + dev].fetch_max(now, SeqCst);
            true
        })
    }

    pub fn free(dev: usize, bytes: u64) {
        if let Some(sh) = get() {
            if dev < DEVS {
                locked(sh, || {
                    slot_used(sh, sh.slot, dev).fetch_sub(bytes, SeqCst);
                    sh.words[dev].fetch_sub(bytes, SeqCst);
                });
            }
        }
    }

    pub fn used(dev: usize) -> Option<u64> {
        let sh = get()?;
        (dev < DEVS).then(|| sh.words[dev].load(SeqCst))
    }

    pub fn peak(dev: usize) -> Option<u64> {
        let sh = get()?;
        (dev < DEVS).then(|| sh.words[DEVS + dev].load(SeqCst))
    }
}
