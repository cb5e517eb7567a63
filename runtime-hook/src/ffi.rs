//! The C ABI side: the real driver's functions, the mapped accounting file, and the exported
//! interposers. Every exported function is a one-liner into [`boundary`], which catches panics.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
// Test builds do not export the symbols (`cfg_attr(not(test), no_mangle)`), so most of this is unused there.
#![cfg_attr(test, allow(dead_code))]
// The exported names are the CUDA driver API's.
#![allow(non_snake_case)]

use crate::board::Board;
use crate::config::Config;
use crate::ledger::Ledger;
use crate::meter::{Meters, ThreadMeter};
use crate::throttle::{self, Bucket, Controller, Pool};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use vgpu_core::accounting::{FILE_WORDS, MAX_DEVICES};
use vgpu_core::env::CorePolicy;

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
    ($(#[$m:meta])* struct $table:ident; $($name:ident : fn($($arg:ty),*);)*) => {
        $(#[$m])*
        #[allow(non_snake_case)]
        struct $table { $($name: Option<unsafe extern "C" fn($($arg),*) -> CUresult>,)* }
        impl $table {
            fn load(handle: *mut c_void, dlsym: DlsymFn) -> $table {
                $table { $($name: {
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
    /// The real driver's entry points (absent ones are `None`).
    struct Real;
    cuInit: fn(c_uint);
    cuCtxGetDevice: fn(*mut c_int);
    cuDeviceGetCount: fn(*mut c_int);
    cuMemAlloc_v2: fn(*mut CUdeviceptr, usize);
    cuMemAlloc: fn(*mut u32, c_uint);
    cuMemAllocManaged: fn(*mut CUdeviceptr, usize, c_uint);
    cuMemAllocPitch_v2: fn(*mut CUdeviceptr, *mut usize, usize, usize, c_uint);
    cuMemAllocAsync: fn(*mut CUdeviceptr, usize, *mut c_void);
    cuMemAllocAsync_ptsz: fn(*mut CUdeviceptr, usize, *mut c_void);
    cuMemAllocFromPoolAsync: fn(*mut CUdeviceptr, usize, *mut c_void, *mut c_void);
    cuMemAllocFromPoolAsync_ptsz: fn(*mut CUdeviceptr, usize, *mut c_void, *mut c_void);
    cuMemFreeAsync: fn(CUdeviceptr, *mut c_void);
    cuMemFreeAsync_ptsz: fn(CUdeviceptr, *mut c_void);
    cuMemFree_v2: fn(CUdeviceptr);
    cuMemFree: fn(u32);
    cuMemCreate: fn(*mut u64, usize, *const c_void, u64);
    cuMemRelease: fn(u64);
    cuArrayCreate_v2: fn(*mut *mut c_void, *const ArrayDescriptor);
    cuArray3DCreate_v2: fn(*mut *mut c_void, *const Array3dDescriptor);
    cuArrayDestroy: fn(*mut c_void);
    cuMipmappedArrayCreate: fn(*mut *mut c_void, *const Array3dDescriptor, c_uint);
    cuMipmappedArrayDestroy: fn(*mut c_void);
    cuMemGetInfo_v2: fn(*mut usize, *mut usize);
    cuMemGetInfo: fn(*mut c_uint, *mut c_uint);
    cuDeviceTotalMem_v2: fn(*mut usize, c_int);
    cuLaunchKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void);
    cuLaunchKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void);
    cuLaunchCooperativeKernel: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void);
    cuLaunchCooperativeKernel_ptsz: fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, *mut c_void, *mut *mut c_void);
    cuLaunchKernelEx: fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void);
    cuLaunchKernelEx_ptsz: fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void);
    cuGraphLaunch: fn(*mut c_void, *mut c_void);
    cuGraphLaunch_ptsz: fn(*mut c_void, *mut c_void);
    cuGetProcAddress: fn(*const c_char, *mut *mut c_void, c_int, u64);
    cuGetProcAddress_v2: fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int);
}

/// `CUDA_ARRAY_DESCRIPTOR` (cuda.h).
#[repr(C)]
pub struct ArrayDescriptor {
    width: usize,
    height: usize,
    format: c_uint,
    channels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (cuda.h).
#[repr(C)]
pub struct Array3dDescriptor {
    width: usize,
    height: usize,
    depth: usize,
    format: c_uint,
    channels: c_uint,
    flags: c_uint,
}

/// `CUlaunchConfig` (cuda.h, CUDA 12.0): grid and block dimensions first.
#[repr(C)]
pub struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared: c_uint,
    stream: *mut c_void,
    attrs: *mut c_void,
    num_attrs: c_uint,
}

/// `CUmemAllocationProp` prefix (cuda.h): type, requested handle types, location {type, id}.
#[repr(C)]
struct MemAllocationProp {
    kind: c_uint,
    handle_types: c_uint,
    location_type: c_uint,
    location_id: c_int,
}

/// Bytes of one element channel of a `CUarray_format`: 8-, 16- and 32-bit integer formats, half and
/// float (cuda.h `CU_AD_FORMAT_*`); formats added later (block-compressed, NV12, ...) are charged as
/// 32-bit, the widest channel, so an array is never under-charged for them.
fn format_bytes(format: c_uint) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

fn array_bytes(w: usize, h: usize, d: usize, format: c_uint, channels: c_uint) -> u64 {
    (w.max(1) as u64)
        .saturating_mul(h.max(1) as u64)
        .saturating_mul(d.max(1) as u64)
        .saturating_mul(format_bytes(format))
        .saturating_mul(u64::from(channels.max(1)))
}

/// `CUDA_ARRAY3D_LAYERED` and `CUDA_ARRAY3D_CUBEMAP` (cuda.h): the depth counts layers (or the 6
/// faces), which mipmap levels do not shrink.
const ARRAY3D_LAYERED: c_uint = 0x01;
const ARRAY3D_CUBEMAP: c_uint = 0x04;

/// Bytes of a mipmapped array: the sum over its levels, level `l` with width, height and depth
/// halved `l` times (at least 1 each; a layered or cubemap array keeps its depth). A level count
/// of 0 is charged as 1 (the driver refuses it).
fn mipmapped_bytes(d: &Array3dDescriptor, levels: c_uint) -> u64 {
    let keep_depth = d.flags & (ARRAY3D_LAYERED | ARRAY3D_CUBEMAP) != 0;
    let per_element = format_bytes(d.format).saturating_mul(u64::from(d.channels.max(1)));
    (0..levels.max(1))
        .map(|l| {
            let shrink = |x: usize| (x.max(1) as u64 >> l.min(63)).max(1);
            let depth = if keep_depth {
                d.depth.max(1) as u64
            } else {
                shrink(d.depth)
            };
            shrink(d.width)
                .saturating_mul(shrink(d.height))
                .saturating_mul(depth)
                .saturating_mul(per_element)
        })
        .fold(0u64, u64::saturating_add)
}

/// Row pitch the hook reserves for before `cuMemAllocPitch` returns the real one: the width rounded
/// up to 512 bytes, the largest texture pitch alignment of current GPUs. The reservation is
/// corrected to the driver's pitch afterwards.
const PITCH_ALIGN: usize = 512;

/// What an allocation's key names: the driver's pointers, VMM handles and arrays are different
/// namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Ptr,
    Handle,
    Array,
}

/// Hasher of the live-allocation table's keys (a kind and a driver pointer or handle): one
/// multiply-fold per word instead of SipHash. The keys come from the driver, not from input a
/// hostile party chooses, so flooding resistance buys nothing here; the fold keeps the low bits,
/// which pick the bucket, well mixed even for aligned pointers.
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl KeyHasher {
    #[inline]
    fn mix(&mut self, n: u64) {
        let m = u128::from(self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
    #[inline]
    fn write_isize(&mut self, n: isize) {
        self.mix(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type KeyMap = HashMap<(Kind, u64), (usize, u64), std::hash::BuildHasherDefault<KeyHasher>>;

fn cu(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

real_table! {
    /// The real NVML's entry points the hook uses or intercepts (`nvmlReturn_t` is an int like
    /// CUresult; 0 = NVML_SUCCESS).
    struct NvmlReal;
    nvmlInit_v2: fn();
    nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut *mut c_void);
    nvmlDeviceGetIndex: fn(*mut c_void, *mut c_uint);
    nvmlDeviceGetUtilizationRates: fn(*mut c_void, *mut [c_uint; 2]);
    nvmlDeviceGetProcessUtilization: fn(*mut c_void, *mut ProcessSample, *mut c_uint, u64);
    nvmlDeviceGetComputeRunningProcesses_v3: fn(*mut c_void, *mut c_uint, *mut ProcessInfo);
    nvmlDeviceGetComputeRunningProcesses_v2: fn(*mut c_void, *mut c_uint, *mut ProcessInfo);
    nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut NvmlMemory);
    nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut NvmlMemoryV2);
}

/// `nvmlProcessUtilizationSample_t` (nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlProcessInfo_t` (nvml.h; the `_v2` and `_v3` of nvmlDeviceGetComputeRunningProcesses).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlMemory_t` (nvml.h).
#[repr(C)]
pub struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t` (nvml.h).
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

const NVML_ERROR_INSUFFICIENT_SIZE: CUresult = 7;
const NVML_ERROR_UNINITIALIZED: CUresult = 1;
const NVML_ERROR_FUNCTION_NOT_FOUND: CUresult = 13;

/// The real NVML, loaded on first use (the watcher, or an intercepted NVML call); `None` when
/// `libnvidia-ml.so.1` cannot be loaded.
fn nvml() -> Option<&'static NvmlReal> {
    static NVML: OnceLock<Option<NvmlReal>> = OnceLock::new();
    NVML.get_or_init(|| {
        let dlsym = real_dlsym()?;
        // SAFETY: dlopen with a constant name.
        let handle = unsafe {
            libc::dlopen(
                c"libnvidia-ml.so.1".as_ptr(),
                libc::RTLD_NOW | libc::RTLD_GLOBAL,
            )
        };
        (!handle.is_null()).then(|| NvmlReal::load(handle, dlsym))
    })
    .as_ref()
}

/// NVML (initialised) and its handle of device `d` (NVML numbers the container's devices as the
/// limits are numbered); `None` without NVML.
fn nvml_device(d: usize) -> Option<(&'static NvmlReal, *mut c_void)> {
    let nv = nvml()?;
    // SAFETY: nvmlInit_v2 takes no arguments (NVML reference-counts init/shutdown).
    if nv
        .nvmlInit_v2
        .is_none_or(|f| unsafe { f() } != CUDA_SUCCESS)
    {
        return None;
    }
    let get = nv.nvmlDeviceGetHandleByIndex_v2?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    (unsafe { get(d as c_uint, &mut handle) } == CUDA_SUCCESS).then_some((nv, handle))
}

/// An `nvmlDeviceGetComputeRunningProcesses_v3`/`_v2` entry point.
type ProcessesFn = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut ProcessInfo) -> c_int;

/// Every process NVML lists through `f` for a device, or NVML's error.
fn all_processes(f: ProcessesFn, handle: *mut c_void) -> Result<Vec<ProcessInfo>, c_int> {
    // Processes may start between the two calls: ask for room to spare, and again once if short.
    let mut cap: c_uint = 0;
    // SAFETY: a zero count with a null buffer asks for the count, as NVML documents.
    let r = unsafe { f(handle, &mut cap, std::ptr::null_mut()) };
    if r == CUDA_SUCCESS {
        return Ok(Vec::new());
    }
    let mut last = r;
    for _ in 0..2 {
        if last != NVML_ERROR_INSUFFICIENT_SIZE {
            return Err(last);
        }
        let mut n = cap.saturating_add(16);
        let mut buf = vec![ProcessInfo::default(); n as usize];
        // SAFETY: a buffer of `n` entries and its size.
        last = unsafe { f(handle, &mut n, buf.as_mut_ptr()) };
        match last {
            CUDA_SUCCESS => {
                buf.truncate(n as usize);
                return Ok(buf);
            }
            NVML_ERROR_INSUFFICIENT_SIZE => cap = n,
            _ => {}
        }
    }
    Err(last)
}

/// Pids NVML lists as compute processes of a device (host pids), `None` when it cannot say.
fn compute_pids(nv: &NvmlReal, handle: *mut c_void) -> Option<Vec<u32>> {
    let f = nv
        .nvmlDeviceGetComputeRunningProcesses_v3
        .or(nv.nvmlDeviceGetComputeRunningProcesses_v2)?;
    all_processes(f, handle)
        .ok()
        .map(|v| v.iter().map(|p| p.pid).collect())
}

/// Learns this process's pid as NVML reports it, HAMi-core's way: NVML reports host pids, which
/// in a container's pid namespace are not the container's numbers. The compute processes NVML lists
/// on a device now, less those it listed when the hook started (before this process had a
/// context) and less the container's known pids, are this process when exactly one remains; it is
/// recorded in the slot, and the utilization samples of that pid count as the container's.
/// Returns whether the search is over: found, not needed (NVML lists this process under its own
/// pid: no pid namespace), or ambiguous (other new processes on the GPU; the device-utilization
/// fallback stays).
fn find_host_pid(
    h: &Hook,
    before: &[u32],
    nv: &NvmlReal,
    handle: *mut c_void,
    slot: usize,
) -> bool {
    let Some(now) = compute_pids(nv, handle) else {
        return false;
    };
    if now.contains(&std::process::id()) {
        return true;
    }
    let known = h.ledger.pids();
    let new: Vec<u32> = now
        .into_iter()
        .filter(|p| !before.contains(p) && !known.contains(p))
        .collect();
    match new.as_slice() {
        [] => false,
        [pid] => {
            h.ledger.set_host_pid(slot, *pid);
            true
        }
        _ => true,
    }
}

/// Core-limit state: one bucket per device, the limits, and whether this process's watcher runs.
struct Throttle {
    limits: [u32; MAX_DEVICES],
    buckets: [Bucket; MAX_DEVICES],
    /// Per limited device, the pids NVML listed as its compute processes when the hook started
    /// (before this process had a context); `None` where NVML could not say.
    before: Vec<Option<Vec<u32>>>,
}

const SINGLE_UNKNOWN: u8 = 0;
const SINGLE_YES: u8 = 1;
const SINGLE_NO: u8 = 2;

impl Throttle {
    /// `None` when no device has a limit below 100 %, or the core policy is `disable` (the launch
    /// path then does nothing more).
    fn new(sm_limit: &[u32; MAX_DEVICES], policy: CorePolicy) -> Option<Throttle> {
        if policy == CorePolicy::Disable {
            return None;
        }
        let limits = sm_limit.map(|l| if l >= 100 { 0 } else { l });
        limits.iter().any(|&l| l > 0).then(|| Throttle {
            limits,
            buckets: std::array::from_fn(|_| Bucket::default()),
            before: (0..MAX_DEVICES)
                .map(|d| {
                    (limits[d] > 0)
                        .then(|| nvml_device(d).and_then(|(nv, h)| compute_pids(nv, h)))
                        .flatten()
                })
                .collect(),
        })
    }
}

/// Monotonic nanoseconds since the first call (vDSO clock read, no syscall).
fn now_ns() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Milliseconds of `CLOCK_MONOTONIC`: the clock every container of the kernel shares, which the
/// GPU activity files are written in (vDSO, no syscall).
fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

/// Limit indexes (bit `i`) of the devices where a busy high-priority container pauses this
/// low-priority process's launches; set by the watcher every period.
static PAUSED: AtomicU64 = AtomicU64::new(0);
/// When the watcher last set [`PAUSED`] (`monotonic_ms`): a pause older than [`PAUSE_STALE_MS`]
/// is ignored, so a watcher that stopped (stuck in NVML, say) never holds launches back.
static PAUSED_AT: AtomicU64 = AtomicU64::new(0);
/// See [`PAUSED_AT`].
const PAUSE_STALE_MS: u64 = 1000;
/// Limit indexes (bit `i`) of the devices with an activity file this process launched on since
/// the watcher's last period.
static LAUNCHED: AtomicU64 = AtomicU64::new(0);

/// How often a paused launch looks whether it may go.
const PAUSE_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The GPU activity files of this process's devices (`<library dir>/gpus/<limit index>`, mounted
/// by the device plugin), with its slot in each and the token it claims them with.
struct Boards {
    /// (limit index, board).
    boards: Vec<(usize, Board<'static>)>,
    /// The limit index of the only board, when there is exactly one (launches then need not ask
    /// the driver for their device).
    only: Option<usize>,
    /// This process's slot in each board, [`SLOT_UNCLAIMED`] = none.
    slots: Vec<AtomicUsize>,
    /// Non-zero, fresh in every process (a forked child draws its own).
    token: AtomicU32,
    /// The container's key: the identity of its accounting file.
    key: u64,
}

impl Boards {
    /// Maps the activity files that exist; one line on stderr for one that cannot be used (the
    /// device then has no priority, and the `default` core policy throttles as `force`).
    fn open(dir: Option<std::path::PathBuf>, cache: &std::path::Path) -> Boards {
        let mut boards = Vec::new();
        for i in 0..MAX_DEVICES {
            let Some(path) = dir.as_ref().map(|d| d.join("gpus").join(i.to_string())) else {
                break;
            };
            // The device plugin mounts one per device, 0.. in order: the first missing ends the
            // list (a process outside Kubernetes looks once, not 16 times).
            if std::fs::symlink_metadata(&path).is_err() {
                break;
            }
            let words = map_existing(&path, vgpu_core::activity::FILE_WORDS);
            match words.map(|w| Board::new(w).ok_or("it has another layout".to_string())) {
                Ok(Ok(b)) => boards.push((i, b)),
                Ok(Err(e)) | Err(e) => eprintln!(
                    "vgpu: GPU activity file {}: {e}; task priority is off on device {i}",
                    path.display()
                ),
            }
        }
        use std::os::unix::fs::MetadataExt;
        let key = std::fs::metadata(cache)
            .map(|m| m.dev().wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ m.ino())
            .unwrap_or(1)
            .max(1);
        Boards {
            slots: boards
                .iter()
                .map(|_| AtomicUsize::new(SLOT_UNCLAIMED))
                .collect(),
            only: match boards.as_slice() {
                [(d, _)] => Some(*d),
                _ => None,
            },
            boards,
            token: AtomicU32::new(random_token()),
            key,
        }
    }

    /// One watcher period: beats (claiming a slot where it has none), recording a launch on the
    /// devices of `launched` (bit per limit index), and returns the limit indexes where a
    /// high-priority container is busy and where another container launches.
    fn tick(&self, priority: u8, now_ms: u64, launched: u64) -> (u64, u64) {
        let token = self.token.load(Ordering::Relaxed);
        let (mut paused, mut shared) = (0u64, 0u64);
        for ((i, b), slot) in self.boards.iter().zip(&self.slots) {
            let launched = launched & (1 << i) != 0;
            let mut s = slot.load(Ordering::Relaxed);
            if s == SLOT_UNCLAIMED || !b.beat(s, token, now_ms, launched) {
                s = b
                    .claim(token, self.key, priority, now_ms)
                    .unwrap_or(SLOT_UNCLAIMED);
                if s != SLOT_UNCLAIMED {
                    b.beat(s, token, now_ms, launched);
                }
                slot.store(s, Ordering::Relaxed);
            }
            let me = (s != SLOT_UNCLAIMED).then_some(s);
            if priority > 0 && b.high_priority_busy(me, now_ms) {
                paused |= 1 << i;
            }
            if b.shared(self.key, now_ms) {
                shared |= 1 << i;
            }
        }
        (paused, shared)
    }

    /// Whether device `d` has an activity file (without one, it counts as shared).
    fn has(&self, d: usize) -> bool {
        self.boards.iter().any(|(i, _)| *i == d)
    }

    /// Gives the slots back (a normal exit), so the others need not wait for them to expire.
    fn release(&self) {
        let token = self.token.load(Ordering::Relaxed);
        for ((_, b), slot) in self.boards.iter().zip(&self.slots) {
            let s = slot.swap(SLOT_UNCLAIMED, Ordering::Relaxed);
            if s != SLOT_UNCLAIMED {
                b.release(s, token);
            }
        }
    }

    /// A forked child: no slots, its own token.
    fn forget(&self) {
        for slot in &self.slots {
            slot.store(SLOT_UNCLAIMED, Ordering::Relaxed);
        }
        self.token.store(random_token(), Ordering::Relaxed);
    }
}

/// A random non-zero claim token.
fn random_token() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills at most the 4 bytes of the buffer it is given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    let t = if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::process::id() ^ (monotonic_ms() as u32).rotate_left(16)
    };
    t.max(1)
}

/// How often the watcher reclaims the slots of dead processes (their memory returns to the
/// container within this time, their counters move to the retired totals).
const RECLAIM_EVERY: u32 = 10; // periods of 50 ms: 500 ms

/// The watcher thread, one per process (started when the process claims its slot): every
/// [`throttle::PERIOD`] it reads each limited device's utilization from NVML and steers its bucket
/// (control law in [`crate::throttle`]) and copies the threads' launch meters into the slot; every
/// [`RECLAIM_EVERY`] periods it reclaims dead slots.
fn watch(h: &'static Hook) {
    let mut devices = Vec::new();
    if let Some(t) = &h.throttle {
        let found: Vec<_> = (0..MAX_DEVICES)
            .filter(|&d| t.limits[d] > 0)
            .filter_map(|d| nvml_device(d).map(|(nv, handle)| (d, nv, handle)))
            .collect();
        if found.is_empty() {
            eprintln!(
                "vgpu: NVML (libnvidia-ml.so.1) is not available; CUDA_DEVICE_SM_LIMIT is not enforced"
            );
        }
        for (d, nv, handle) in found {
            let c = Controller::new(t.limits[d], METERS.blocks_on(d), now_ns());
            devices.push((nv, d, handle, c, 0u64));
        }
    }
    let me = std::process::id();
    // Whether this process still looks for its host pid (see find_host_pid).
    let mut searching = true;
    for tick in 1u32.. {
        std::thread::sleep(throttle::PERIOD);
        let now_ms = monotonic_ms();
        let launched = LAUNCHED.swap(0, Ordering::Relaxed);
        let (paused, shared) = h.boards.tick(h.config.priority, now_ms, launched);
        PAUSED.store(paused, Ordering::Relaxed);
        PAUSED_AT.store(now_ms, Ordering::Relaxed);
        if let Some(t) = &h.throttle {
            if let Some(slot) = h.claimed_slot().filter(|_| searching) {
                searching = h.ledger.host_pid(slot) == 0
                    && !devices.iter().any(|(nv, d, handle, _, _)| {
                        t.before[*d]
                            .as_deref()
                            .is_some_and(|b| find_host_pid(h, b, nv, *handle, slot))
                    });
            }
            let pids = h.ledger.pids();
            for (nv, d, handle, c, last_seen) in &mut devices {
                let u = utilization(nv, *handle, &pids, last_seen);
                // `default`: throttled only while another container launches on the GPU (a
                // device without an activity file counts as shared).
                let alone = h.config.core_policy == CorePolicy::Default
                    && h.boards.has(*d)
                    && shared & (1 << *d) == 0;
                if alone {
                    t.buckets[*d].unthrottle();
                    c.step(&t.buckets[*d], METERS.blocks_on(*d), now_ns(), None);
                } else {
                    c.step(&t.buckets[*d], METERS.blocks_on(*d), now_ns(), u);
                }
            }
        }
        flush_launches(h);
        if tick % RECLAIM_EVERY == 0 {
            h.ledger.reclaim_dead(me, &alive);
        }
    }
}

/// Utilization of the device for this container, percent: the sum of the container's processes'
/// samples from nvmlDeviceGetProcessUtilization, or, where that is unsupported or names none of
/// them (pids of another namespace), the device's utilization.
fn utilization(
    nv: &NvmlReal,
    handle: *mut c_void,
    pids: &[u32],
    last_seen: &mut u64,
) -> Option<f64> {
    if let Some(pu) = nv.nvmlDeviceGetProcessUtilization {
        let mut n: c_uint = 0;
        // SAFETY: asking for the sample count with a null buffer, as NVML documents.
        let r = unsafe { pu(handle, std::ptr::null_mut(), &mut n, *last_seen) };
        if (r == NVML_ERROR_INSUFFICIENT_SIZE || r == CUDA_SUCCESS) && n > 0 {
            let mut buf = vec![ProcessSample::default(); n as usize];
            // SAFETY: a buffer of `n` samples and its length.
            if unsafe { pu(handle, buf.as_mut_ptr(), &mut n, *last_seen) } == CUDA_SUCCESS {
                let mut sum = None;
                for s in buf.iter().take(n as usize) {
                    *last_seen = (*last_seen).max(s.time_stamp);
                    if pids.contains(&s.pid) {
                        *sum.get_or_insert(0u32) += s.sm_util;
                    }
                }
                if let Some(sum) = sum {
                    return Some(mid_percent(sum));
                }
            }
        }
    }
    let f = nv.nvmlDeviceGetUtilizationRates?;
    let mut u = [0 as c_uint; 2];
    // SAFETY: valid out pointer to an nvmlUtilization_t {gpu, memory}.
    (unsafe { f(handle, &mut u) } == CUDA_SUCCESS).then(|| mid_percent(u[0]))
}

/// NVML reports whole percents; reading `p` as the middle of `[p, p+1)` keeps the controller from
/// settling anywhere in the 1 %-wide band above the limit.
fn mid_percent(p: c_uint) -> f64 {
    if p >= 100 {
        100.0
    } else {
        f64::from(p) + 0.5
    }
}

/// Everything the hook holds for this process.
struct Hook {
    config: Config,
    real: Real,
    ledger: Ledger<'static>,
    /// Core limit; `None` when no device is limited.
    throttle: Option<Throttle>,
    /// The GPU activity files (task priority, the `default` core policy).
    boards: Boards,
    /// Whether the driver shows this process a single device: [`SINGLE_UNKNOWN`] until a launch or
    /// an allocation asks, then [`SINGLE_YES`] (they skip `cuCtxGetDevice`) or [`SINGLE_NO`].
    single: AtomicU8,
    /// Limit index of CUDA ordinal 0 (the only device when `single` says so).
    single_index: usize,
    /// Whether this process's watcher thread runs.
    watcher: AtomicBool,
    /// When a refused allocation last reclaimed dead slots (`now_ns`, 0 = never).
    last_reclaim: AtomicU64,
    /// This process's slot; [`SLOT_UNCLAIMED`] until claimed (and again in a forked child),
    /// [`SLOT_CLAIMING`] while one thread claims it.
    slot: AtomicUsize,
    /// Live allocations: (kind, pointer or handle) -> (limit index, bytes). parking_lot's Mutex
    /// hands the lock to a thread that has waited 0.5 ms; std's lets a busy thread barge ahead,
    /// and with 16 threads allocating one of them could wait for seconds.
    allocations: parking_lot::Mutex<KeyMap>,
}

static HOOK: OnceLock<Result<Hook, CUresult>> = OnceLock::new();

/// [`Hook::slot`] before the process has a slot.
const SLOT_UNCLAIMED: usize = usize::MAX;
/// [`Hook::slot`] while one thread claims the process's slot.
const SLOT_CLAIMING: usize = usize::MAX - 1;

thread_local! {
    static INITIALIZING: Cell<bool> = const { Cell::new(false) };
    /// The thread's launch meter (with its prepaid tokens): taken at its first launch, given
    /// back when it exits.
    static METER: Cell<Option<&'static ThreadMeter>> = const { Cell::new(None) };
}

/// Every launching thread's meters (see [`crate::meter`]).
static METERS: Meters = Meters::new();

/// The key whose destructor gives an exiting thread's meter back; `None` if it cannot be created
/// (the meters of exited threads are then not reused).
fn meter_key() -> Option<libc::pthread_key_t> {
    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a valid out pointer and a destructor with the C signature pthread expects.
        (unsafe { libc::pthread_key_create(&mut key, Some(release_meter)) } == 0).then_some(key)
    })
}

/// pthread key destructor, run as a thread that launched exits: its meter goes back to the table
/// (the counts stay in it), and a launch after this (another destructor's) acquires a new one.
extern "C" fn release_meter(_: *mut c_void) {
    if let Ok(Some(m)) = METER.try_with(Cell::take) {
        METERS.release(m);
    }
}

/// Copies the process's launch count (its threads' meters, summed) into its slot.
fn flush_launches(h: &Hook) {
    if let Some(s) = h.claimed_slot() {
        h.ledger.record_launches(s, METERS.launches());
    }
}

/// At a normal exit: the last launches reach the file, so a reader sees the exact count.
extern "C" fn flush_at_exit() {
    if let Some(Ok(h)) = HOOK.get() {
        flush_launches(h);
        h.boards.release();
    }
}

/// The process's hook, initialised by the first call.
#[inline]
fn hook() -> Result<&'static Hook, CUresult> {
    match HOOK.get() {
        Some(h) => h.as_ref().map_err(|e| *e),
        None => hook_init(),
    }
}

/// First call: reads the configuration and maps the file; a call the initialisation itself makes
/// (the driver's or the C library's calls back into our exports) is refused instead of recursing.
#[cold]
fn hook_init() -> Result<&'static Hook, CUresult> {
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
    let limits = library_dir().map(|d| d.join(vgpu_core::limits_file::FILE_NAME));
    let (config, source) = crate::config::load(|k| std::env::var(k).ok(), limits.as_deref())
        .map_err(|e| {
            eprintln!("{e}");
            CUDA_ERROR_INVALID_VALUE
        })?;
    if let crate::config::Source::LimitsFile { overridden } = &source {
        if !overridden.is_empty() {
            eprintln!(
                "vgpu: ignoring {} from the environment: the device plugin's limits file decides",
                overridden.join(" ")
            );
        }
    }
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
    // SAFETY: registering plain function pointers that only touch atomics and this thread's state.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_child));
        libc::atexit(flush_at_exit);
    }
    Ok(Hook {
        throttle: Throttle::new(&config.sm_limit, config.core_policy),
        boards: Boards::open(library_dir(), &config.cache_path),
        single: AtomicU8::new(SINGLE_UNKNOWN),
        single_index: config.limit_index(0),
        watcher: AtomicBool::new(false),
        last_reclaim: AtomicU64::new(0),
        config,
        real,
        ledger,
        slot: AtomicUsize::new(SLOT_UNCLAIMED),
        allocations: parking_lot::Mutex::new(KeyMap::default()),
    })
}

/// The directory this library was loaded from (`/usr/local/vgpu` in a container), where the device
/// plugin mounts the limits file. Found with dladdr on one of our own functions, so no variable the
/// tenant controls can point it elsewhere.
fn library_dir() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only writes `info`; the address is a function of this library.
    let found = unsafe { libc::dladdr(library_dir as *const libc::c_void, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(std::path::Path::to_path_buf)
}

/// The child of fork() starts with clean per-process state: its own slot, claimed on first use.
/// Allocations the parent made are the parent's (CUDA state does not survive fork).
extern "C" fn after_fork_child() {
    if let Some(Ok(h)) = HOOK.get() {
        h.slot.store(SLOT_UNCLAIMED, Ordering::SeqCst);
        // The watcher thread does not exist in the child; claiming the slot starts one.
        h.watcher.store(false, Ordering::SeqCst);
        // The parent's launches are the parent's; the forking thread takes a new meter (and so
        // claims the child's slot) at its next launch.
        METERS.reset();
        let _ = METER.try_with(|m| m.set(None));
        h.boards.forget();
        PAUSED.store(0, Ordering::SeqCst);
        LAUNCHED.store(0, Ordering::SeqCst);
        FORKED.fetch_add(1, Ordering::SeqCst);
    }
}

static FORKED: AtomicU64 = AtomicU64::new(0);

/// Why the accounting file cannot be used: the step that failed and the OS error (its errno).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
struct MapError {
    step: &'static str,
    #[source]
    source: std::io::Error,
}

fn step<T>(step: &'static str, r: std::io::Result<T>) -> Result<T, MapError> {
    r.map_err(|source| MapError { step, source })
}

/// Opens (creating it and its directory, mode 0666, when missing) and maps the accounting file.
/// Fails closed rather than run unmetered: a directory that cannot be created or written (read-only
/// file system, a path through a regular file), a path that is not a regular file (a device such as
/// `/dev/zero` would map as memory no other process shares), a file-size limit (`RLIMIT_FSIZE`)
/// below the file's size (growing past it would raise SIGXFSZ), and a full file system: the file's
/// blocks are allocated with `fallocate` before it is mapped, so "no space" is an error here and
/// not a SIGBUS at the first store into the mapping.
fn map_file(path: &std::path::Path) -> Result<&'static [AtomicU64], MapError> {
    use std::io::Error;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        step("cannot create its directory", std::fs::create_dir_all(dir))?;
    }
    // The directory is writable by every user of the container: the path is not followed if it is
    // a symlink (another user could point it at a file of ours), and only the process that creates
    // the file opens it to all (0666 whatever its umask), so processes of every uid share it.
    let open = |create_new: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create_new)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let (file, created) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            (step("cannot open it for writing", open(false))?, false)
        }
        Err(source) => {
            return Err(MapError {
                step: "cannot open it for writing",
                source,
            })
        }
    };
    let meta = step("cannot stat it", file.metadata())?;
    if !meta.is_file() {
        return Err(MapError {
            step: "not a regular file",
            source: Error::from_raw_os_error(libc::EINVAL),
        });
    }
    if created {
        use std::os::unix::fs::PermissionsExt;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    }
    let len = (FILE_WORDS * 8) as u64;
    if meta.len() < len {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0
            && lim.rlim_cur != libc::RLIM_INFINITY
            && lim.rlim_cur < len
        {
            return Err(MapError {
                step: "the file-size limit (RLIMIT_FSIZE) is below its size",
                source: Error::from_raw_os_error(libc::EFBIG),
            });
        }
        // SAFETY: fallocate on our own open descriptor; mode 0 allocates and extends.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
            let e = Error::last_os_error();
            match e.raw_os_error() {
                // File systems without fallocate: a sparse file (blocks allocated on first store).
                Some(libc::EOPNOTSUPP) => step("cannot size it", file.set_len(len))?,
                _ => {
                    return Err(MapError {
                        step: "cannot allocate its blocks",
                        source: e,
                    })
                }
            }
        }
    }
    map_words(&file, FILE_WORDS)
}

/// Maps the first `words` words of `file` (at least that long) shared, read-write, for the life
/// of the process.
fn map_words(file: &std::fs::File, words: usize) -> Result<&'static [AtomicU64], MapError> {
    use std::os::fd::AsRawFd;
    // SAFETY: a shared read-write mapping of `words` words of a file at least that long; never
    // unmapped, so the 'static slice stays valid for the life of the process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            words * 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(MapError {
            step: "cannot map it",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: page-aligned mapping of `words` u64s; AtomicU64 has the layout of u64, and every
    // process accesses the words only atomically.
    Ok(unsafe { std::slice::from_raw_parts(p as *const AtomicU64, words) })
}

/// Maps an activity file the device plugin made (never created or grown here): a regular file,
/// not followed if a symlink, at least `words` words long.
fn map_existing(path: &std::path::Path, words: usize) -> Result<&'static [AtomicU64], String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open it for writing: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() || meta.len() < (words * 8) as u64 {
        return Err(format!("not a regular file of {} bytes or more", words * 8));
    }
    map_words(&file, words).map_err(|e| e.to_string())
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_or(true, |status| !released(&status))
}

/// Whether the process `/proc/<pid>/status` describes has let go of its GPU memory: the driver
/// frees it when the last thread closes the process's device files at exit. That is true of a
/// zombie with no other thread left; a SIGKILLed multi-threaded process first shows a zombie
/// leader (`State: Z`) while its other threads are still exiting (`Threads:` above 1) and its
/// files still open, and reclaiming then would hand out memory the card still holds.
fn released(status: &str) -> bool {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim_start)
    };
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    let threads = field("Threads:").and_then(|n| n.trim().parse::<u32>().ok());
    zombie && threads.is_none_or(|n| n <= 1)
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

impl Hook {
    /// The process's slot, claimed by its first caller. Exactly one thread claims: threads that
    /// launch for the first time together would otherwise each claim a slot for the same pid (a
    /// race seen in CI: 3 slots for one process, its launches split among them), or the second
    /// would find the first's slot by pid and clear it as a reused pid's.
    fn slot(&'static self) -> Result<usize, CUresult> {
        // The common case reads only: a compare-exchange would take the cache line exclusively
        // on every allocation of every thread.
        if let Some(s) = self.claimed_slot() {
            return Ok(s);
        }
        loop {
            match self.slot.compare_exchange(
                SLOT_UNCLAIMED,
                SLOT_CLAIMING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return self.claim_slot(),
                // Another thread claims: a scan of the slot table (and at worst one liveness
                // check of each dead owner), so yielding until it is done waits microseconds.
                // A fork meanwhile resets the child's state to unclaimed (after_fork_child).
                Err(SLOT_CLAIMING) => std::thread::yield_now(),
                Err(s) => return Ok(s),
            }
        }
    }

    /// The claim itself, by the one thread that moved the state to [`SLOT_CLAIMING`].
    #[cold]
    fn claim_slot(&'static self) -> Result<usize, CUresult> {
        /// Should the claim unwind (the entry point catches it), waiters must not yield forever.
        struct Unclaimed<'a>(&'a AtomicUsize);
        impl Drop for Unclaimed<'_> {
            fn drop(&mut self) {
                let _ = self.0.compare_exchange(
                    SLOT_CLAIMING,
                    SLOT_UNCLAIMED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
        let _unclaimed = Unclaimed(&self.slot);
        match self.ledger.claim(std::process::id(), &alive) {
            Some(s) => {
                self.slot.store(s, Ordering::SeqCst);
                if !self.watcher.swap(true, Ordering::SeqCst) {
                    let spawned = std::thread::Builder::new()
                        .name("vgpu-watcher".into())
                        .spawn(move || watch(self));
                    if spawned.is_err() {
                        eprintln!("vgpu: cannot start the watcher thread; CUDA_DEVICE_SM_LIMIT is not enforced and dead processes are reclaimed only when memory runs out");
                    }
                }
                Ok(s)
            }
            None => {
                // Unclaimed again (by the guard): a later call tries again, as a dead process
                // may free a slot.
                eprintln!("vgpu: no free process slot in the accounting file; refusing allocation");
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    /// The process's slot when it has one (not while it is being claimed).
    fn claimed_slot(&self) -> Option<usize> {
        let s = self.slot.load(Ordering::SeqCst);
        (s < SLOT_CLAIMING).then_some(s)
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

    /// Reserves `bytes` on `dev`, refusing over the limit; dead processes' memory is reclaimed once
    /// before a refusal.
    fn reserve(&'static self, dev: usize, bytes: u64) -> Result<usize, CUresult> {
        let slot = self.slot()?;
        let limit = self.config.memory_limit.get(dev).copied().flatten();
        if !self.ledger.reserve(slot, dev, bytes, limit)
            && (!self.reclaim_now() || !self.ledger.reserve(slot, dev, bytes, limit))
        {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(slot)
    }

    /// On a refusal: reclaims dead processes' slots, at most once per 10 ms per process (a program
    /// probing the limit in a loop would otherwise check every slot owner's liveness per refusal;
    /// the watcher reclaims every 500 ms anyway). Whether something was reclaimed.
    fn reclaim_now(&self) -> bool {
        const EVERY_NS: u64 = 10_000_000;
        let now = now_ns().max(1);
        let last = self.last_reclaim.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EVERY_NS {
            return false;
        }
        self.last_reclaim
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.ledger.reclaim_dead(std::process::id(), &alive) > 0
    }

    fn remember(&self, kind: Kind, key: u64, dev: usize, bytes: u64) {
        self.allocations.lock().insert((kind, key), (dev, bytes));
    }

    /// Reserves `bytes` on `dev`, runs the driver allocation `call` (which returns the new pointer or
    /// handle), and commits or rolls back.
    fn allocate(
        &'static self,
        dev: Result<usize, CUresult>,
        bytes: u64,
        kind: Kind,
        call: impl FnOnce() -> Result<u64, CUresult>,
    ) -> CUresult {
        let dev = try_cu!(dev);
        let slot = try_cu!(self.reserve(dev, bytes));
        match call() {
            Ok(key) => {
                self.remember(kind, key, dev, bytes);
                CUDA_SUCCESS
            }
            Err(r) => {
                self.ledger.release(slot, dev, bytes);
                r
            }
        }
    }

    fn free(&'static self, kind: Kind, key: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS {
            let entry = self.allocations.lock().remove(&(kind, key));
            if let (Some((dev, bytes)), Ok(slot)) = (entry, self.slot()) {
                self.ledger.release(slot, dev, bytes);
            }
        }
        r
    }

    /// Limit index of CUDA device ordinal `ordinal`.
    fn device_of(&self, ordinal: c_int) -> Result<usize, CUresult> {
        if ordinal < 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(self.config.limit_index(ordinal as usize))
    }

    /// Meters a kernel launch of `blocks` thread blocks, first waiting for the core limit's tokens.
    /// No atomic read-modify-write and no syscall while the thread's prepaid tokens last: the
    /// counts go to the thread's own meter, the tokens come from its own pool.
    #[inline]
    fn launch(&'static self, blocks: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let m = match METER.with(Cell::get) {
            Some(m) => m,
            None => self.register(),
        };
        if !self.boards.boards.is_empty() {
            self.mark_launched();
        }
        if PAUSED.load(Ordering::Relaxed) != 0 {
            self.wait_while_paused();
        }
        if let Some(t) = &self.throttle {
            self.throttle_launch(t, m, blocks);
        }
        let r = call();
        if r == CUDA_SUCCESS {
            m.launched();
        }
        r
    }

    /// Notes a launch on the calling thread's device for the watcher's next beat (one load when
    /// the bit is already set, as it is for all but the first launch of a period).
    #[inline]
    fn mark_launched(&self) {
        let d = match self.boards.only {
            Some(d) => d,
            None => match self.current_device() {
                Ok(d) => d,
                Err(_) => return,
            },
        };
        let bit = 1u64.checked_shl(d as u32).unwrap_or(0);
        if LAUNCHED.load(Ordering::Relaxed) & bit != bit {
            LAUNCHED.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// A low-priority launch on a device where a high-priority container is busy: waits until
    /// the watcher sees that container idle (or gone), or stops refreshing the pause, and meters
    /// the wait as throttled time.
    #[cold]
    fn wait_while_paused(&'static self) {
        let Ok(d) = self.current_device() else {
            return;
        };
        let started = now_ns();
        let mut waited = false;
        while d < 64
            && PAUSED.load(Ordering::Relaxed) & (1 << d) != 0
            && monotonic_ms().saturating_sub(PAUSED_AT.load(Ordering::Relaxed)) <= PAUSE_STALE_MS
        {
            std::thread::sleep(PAUSE_POLL);
            waited = true;
        }
        // Only a launch that waited is metered (another device's pause brings every launch here).
        if waited {
            if let Ok(s) = self.slot() {
                self.ledger.throttled(s, now_ns().saturating_sub(started));
            }
        }
    }

    /// A thread's first launch: takes a meter and claims the process's slot, which starts the
    /// watcher that copies the meters into the file.
    #[cold]
    fn register(&'static self) -> &'static ThreadMeter {
        let m = METERS.acquire();
        METER.with(|c| c.set(Some(m)));
        if let Some(key) = meter_key() {
            // SAFETY: any non-null value makes the key's destructor run at thread exit; it is never
            // dereferenced.
            unsafe {
                libc::pthread_setspecific(key, std::ptr::NonNull::<c_void>::dangling().as_ptr())
            };
        }
        let _ = self.slot();
        m
    }

    /// Counts the launch's blocks and takes its tokens from the thread's pool for its device,
    /// sleeping (bounded) when the bucket has none. The fast path, while prepaid tokens last, is
    /// plain thread-local arithmetic (and, in a process that sees more than one device, the
    /// driver's `cuCtxGetDevice`); only the launch that finds the pool empty reads the clock, buys
    /// the next batch and may sleep.
    #[inline(always)]
    fn throttle_launch(&'static self, t: &'static Throttle, m: &ThreadMeter, blocks: u64) {
        let Some(d) = self.launch_device(t) else {
            return;
        };
        let (Some(bucket), Some(pool)) = (t.buckets.get(d), m.pool(d)) else {
            return;
        };
        m.blocks(d, blocks);
        if !pool.try_take(bucket, blocks, m.shared()) {
            self.refill(pool, bucket, blocks, m.shared());
        }
    }

    /// The slow path of [`Hook::throttle_launch`]: buys a batch of tokens, waits what the bucket
    /// says and meters the wait.
    #[cold]
    fn refill(&'static self, pool: &Pool, bucket: &Bucket, blocks: u64, shared: bool) {
        let wait = pool.refill(bucket, now_ns(), blocks, shared);
        if wait > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(wait));
            if let Ok(s) = self.slot() {
                self.ledger.throttled(s, wait);
            }
        }
    }

    /// Limit index of the launching thread's device when it has a core limit.
    #[inline]
    fn launch_device(&self, t: &Throttle) -> Option<usize> {
        let d = self.current_device().ok()?;
        (d < MAX_DEVICES && t.limits[d] > 0).then_some(d)
    }

    /// Limit index of the calling thread's current device. A process whose driver shows a single
    /// device (the usual vGPU container) learns it once from `cuDeviceGetCount`; otherwise every
    /// call asks the driver for the current device (`cuCtxGetDevice`). With no current context the
    /// single-device answer still names the device: the driver call that follows fails, and an
    /// allocation's reservation is rolled back.
    #[inline]
    fn current_device(&self) -> Result<usize, CUresult> {
        if self.single.load(Ordering::Relaxed) == SINGLE_YES {
            Ok(self.single_index)
        } else {
            self.current_device_asked()
        }
    }

    /// [`Hook::current_device`] when the process is not known to see a single device.
    #[cold]
    fn current_device_asked(&self) -> Result<usize, CUresult> {
        if self.single.load(Ordering::Relaxed) != SINGLE_NO {
            match self.device_count() {
                Some(1) => {
                    self.single.store(SINGLE_YES, Ordering::Relaxed);
                    return Ok(self.single_index);
                }
                Some(_) => self.single.store(SINGLE_NO, Ordering::Relaxed),
                None => {}
            }
        }
        self.device()
    }

    /// Devices the driver shows this process (`cuDeviceGetCount`), `None` when it cannot say.
    fn device_count(&self) -> Option<c_int> {
        let f = self.real.cuDeviceGetCount?;
        let mut n: c_int = 0;
        // SAFETY: a valid out pointer.
        (unsafe { f(&mut n) } == CUDA_SUCCESS).then_some(n)
    }

    /// `free`/`total` as the container sees them on limit index `dev`: total = limit,
    /// free = limit - container usage, never above the driver's free.
    fn clamp_info(&self, dev: usize, free: u64, total: u64) -> (u64, u64) {
        match self.config.memory_limit.get(dev).copied().flatten() {
            Some(limit) => {
                let used = if dev < MAX_DEVICES {
                    self.ledger.container_used(dev)
                } else {
                    0
                };
                (free.min(limit.saturating_sub(used)), total.min(limit))
            }
            None => (free, total),
        }
    }
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

/// An allocator that writes its result through its first argument: capped against the device `dev`
/// (an expression over the arguments, evaluated inside the hook), charging `bytes`.
macro_rules! alloc_export {
    ($(#[$m:meta])* fn $name:ident($out:ident: *mut $ot:ty $(, $a:ident: $t:ty)*) -> kind $kind:ident, device $dev:expr, bytes $bytes:expr;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($out: *mut $ot $(, $a: $t)*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                if $out.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                let bytes: u64 = $bytes;
                #[allow(clippy::redundant_closure_call)]
                let dev = ($dev)(h);
                // SAFETY: forwarding the caller's arguments; `out` is non-null and the driver wrote
                // it when it returned success.
                h.allocate(dev, bytes, Kind::$kind, || unsafe {
                    cu(f($out $(, $a)*)).map(|()| *$out as u64)
                })
            })
        }
    };
}

/// A free of the allocation named by its first argument.
macro_rules! free_export {
    ($(#[$m:meta])* fn $name:ident($key:ident: $kt:ty $(, $a:ident: $t:ty)*) -> kind $kind:ident;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        pub extern "C" fn $name($key: $kt $(, $a: $t)*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                // SAFETY: forwarding the caller's arguments.
                h.free(Kind::$kind, $key as u64, || unsafe { f($key $(, $a)*) })
            })
        }
    };
}

/// A kernel launch: metered, and throttled by the core limit by `blocks` (an expression over the
/// arguments).
macro_rules! launch_export {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) -> blocks $blocks:expr;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                let blocks: u64 = $blocks;
                // SAFETY: forwarding the caller's arguments.
                h.launch(blocks, || unsafe { f($($a),*) })
            })
        }
    };
}

fn current(h: &Hook) -> Result<usize, CUresult> {
    h.current_device()
}

alloc_export! {
    /// `cuMemAlloc_v2`, capped.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAlloc` (the CUDA 3.1 ABI: 32-bit pointer and size), capped.
    fn cuMemAlloc(dptr: *mut u32, bytes: c_uint) -> kind Ptr, device current, bytes u64::from(bytes);
}
alloc_export! {
    /// `cuMemAllocManaged`, capped against the current device.
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAllocAsync`, capped like cuMemAlloc (the pool's device is the current context's).
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: *mut c_void) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAllocAsync_ptsz` (per-thread default stream).
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: *mut c_void) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAllocFromPoolAsync`, capped against the current device.
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: *mut c_void) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAllocFromPoolAsync_ptsz`.
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: *mut c_void) -> kind Ptr, device current, bytes bytes as u64;
}
/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h `CUmemLocationType`): the location's id is a device
/// ordinal. The other types (`_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`) are the machine's RAM.
const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// `cuMemCreate` (virtual memory management): physical memory at `prop->location`. On a device it
/// is charged to that device by the handle's size (mappings of it, cuMemMap, cost nothing more);
/// in host memory (NCCL's cuMem host buffers, HAMi-core#169) it is not the GPU's and passes through
/// uncharged, so it neither fills the slice nor fails.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemCreate);
        if handle.is_null() || prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; a CUmemAllocationProp starts with these fields.
        let location = unsafe { &*prop.cast::<MemAllocationProp>() };
        if location.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { f(handle, size, prop, flags) };
        }
        let dev = h.device_of(location.location_id);
        // SAFETY: forwarding the caller's arguments; `handle` is non-null and the driver wrote
        // it when it returned success.
        h.allocate(dev, size as u64, Kind::Handle, || unsafe {
            cu(f(handle, size, prop, flags)).map(|()| *handle)
        })
    })
}
alloc_export! {
    /// `cuArrayCreate_v2`: charged width x height x channels x element size from the descriptor.
    fn cuArrayCreate_v2(array: *mut *mut c_void, desc: *const ArrayDescriptor) -> kind Array, device current,
        // SAFETY: a null descriptor is charged nothing here and refused by the driver.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| array_bytes(d.width, d.height, 1, d.format, d.channels));
}
alloc_export! {
    /// `cuArray3DCreate_v2`: charged width x height x depth x channels x element size.
    fn cuArray3DCreate_v2(array: *mut *mut c_void, desc: *const Array3dDescriptor) -> kind Array, device current,
        // SAFETY: as cuArrayCreate_v2.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| array_bytes(d.width, d.height, d.depth, d.format, d.channels));
}

alloc_export! {
    /// `cuMipmappedArrayCreate`: charged the sum of its levels' sizes.
    fn cuMipmappedArrayCreate(array: *mut *mut c_void, desc: *const Array3dDescriptor, levels: c_uint) -> kind Array, device current,
        // SAFETY: as cuArrayCreate_v2.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| mipmapped_bytes(d, levels));
}

/// `cuMemAllocPitch_v2`: reserves for the width rounded up to [`PITCH_ALIGN`], then corrects the
/// reservation to the pitch the driver chose (freeing the allocation if a larger pitch no longer fits).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAllocPitch_v2);
        if dptr.is_null() || pitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = try_cu!(h.device());
        let guess = (width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN) as u64;
        let reserved = guess.saturating_mul(height as u64);
        let slot = try_cu!(h.reserve(dev, reserved));
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(dptr, pitch, width, height, element) };
        if r != CUDA_SUCCESS {
            h.ledger.release(slot, dev, reserved);
            return r;
        }
        // SAFETY: checked non-null; the driver wrote both on success.
        let (p, real) = unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
        if real < reserved {
            h.ledger.release(slot, dev, reserved - real);
        } else if real > reserved && h.reserve(dev, real - reserved).is_err() {
            h.ledger.release(slot, dev, reserved);
            if let Some(free) = h.real.cuMemFree_v2 {
                // SAFETY: freeing the allocation the driver just made.
                unsafe { free(p) };
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        h.remember(Kind::Ptr, p, dev, real);
        CUDA_SUCCESS
    })
}

free_export! {
    /// `cuMemFree_v2`.
    fn cuMemFree_v2(p: CUdeviceptr) -> kind Ptr;
}
free_export! {
    /// `cuMemFree` (CUDA 3.1 ABI).
    fn cuMemFree(p: u32) -> kind Ptr;
}
free_export! {
    /// `cuMemFreeAsync`.
    fn cuMemFreeAsync(p: CUdeviceptr, stream: *mut c_void) -> kind Ptr;
}
free_export! {
    /// `cuMemFreeAsync_ptsz`.
    fn cuMemFreeAsync_ptsz(p: CUdeviceptr, stream: *mut c_void) -> kind Ptr;
}
free_export! {
    /// `cuMemRelease`: the handle's memory is returned once the handle is released (the driver keeps
    /// it while mapped; the hook charges until the release, which is never later than the driver).
    fn cuMemRelease(handle: u64) -> kind Handle;
}
free_export! {
    /// `cuArrayDestroy`.
    fn cuArrayDestroy(array: *mut c_void) -> kind Array;
}
free_export! {
    /// `cuMipmappedArrayDestroy`.
    fn cuMipmappedArrayDestroy(array: *mut c_void) -> kind Array;
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
        // SAFETY: checked non-null; the driver just wrote both.
        unsafe {
            let (fr, t) = h.clamp_info(dev, *free as u64, *total as u64);
            (*free, *total) = (fr as usize, t as usize);
        }
        CUDA_SUCCESS
    })
}

/// `cuMemGetInfo` (CUDA 3.1 ABI, 32-bit sizes), as cuMemGetInfo_v2.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemGetInfo);
        // SAFETY: forwarding the caller's pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        let dev = try_cu!(h.device());
        // SAFETY: checked non-null; the driver just wrote both.
        unsafe {
            let (fr, t) = h.clamp_info(dev, u64::from(*free), u64::from(*total));
            (*free, *total) = (fr as c_uint, t as c_uint);
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
            let idx = try_cu!(h.device_of(dev));
            if let Some(limit) = h.config.memory_limit.get(idx).copied().flatten() {
                // SAFETY: checked non-null; the driver just wrote it.
                unsafe { *bytes = (*bytes).min(limit as usize) };
            }
        }
        r
    })
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

launch_export! {
    /// `cuLaunchKernel`: metered and throttled.
    fn cuLaunchKernel(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchKernel_ptsz`.
    fn cuLaunchKernel_ptsz(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchCooperativeKernel`.
    fn cuLaunchCooperativeKernel(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchCooperativeKernel_ptsz`.
    fn cuLaunchCooperativeKernel_ptsz(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchKernelEx` (CUDA 12.0): the grid comes from the launch configuration.
    fn cuLaunchKernelEx(config: *const LaunchConfig, func: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
        // SAFETY: a null configuration is charged one block here and refused by the driver.
        -> blocks unsafe { config.as_ref() }.map_or(1, |c| grid(c.grid[0], c.grid[1], c.grid[2]));
}
launch_export! {
    /// `cuLaunchKernelEx_ptsz`.
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, func: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
        // SAFETY: as cuLaunchKernelEx.
        -> blocks unsafe { config.as_ref() }.map_or(1, |c| grid(c.grid[0], c.grid[1], c.grid[2]));
}
launch_export! {
    /// `cuGraphLaunch`: one metered launch; its kernels' grids are not visible here, so it is charged
    /// [`GRAPH_BLOCKS`] for the core limit.
    fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> blocks GRAPH_BLOCKS;
}
launch_export! {
    /// `cuGraphLaunch_ptsz`.
    fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: *mut c_void) -> blocks GRAPH_BLOCKS;
}

/// Blocks a graph launch is charged: the graph's kernels are not enumerated (that would cost a walk
/// of the graph per launch), so it counts as one small grid.
const GRAPH_BLOCKS: u64 = 1;

/// The container's view of NVML device `device`: (limit, bytes the container uses), or `None` when
/// it has no memory limit (or the hook is not configured). NVML numbers the container's devices in
/// `NVIDIA_VISIBLE_DEVICES` order, as the limits are numbered, and ignores `CUDA_VISIBLE_DEVICES`.
fn nvml_view(nv: &NvmlReal, device: *mut c_void) -> Option<(u64, u64)> {
    let h = hook().ok()?;
    let get_index = nv.nvmlDeviceGetIndex?;
    let mut idx: c_uint = 0;
    // SAFETY: the caller's device handle and a valid out pointer.
    if unsafe { get_index(device, &mut idx) } != CUDA_SUCCESS {
        return None;
    }
    let idx = idx as usize;
    let limit = h.config.memory_limit.get(idx).copied().flatten()?;
    let used = if idx < MAX_DEVICES {
        h.ledger.container_used(idx)
    } else {
        0
    };
    Some((limit, used))
}

/// The compute processes of a vGPU device as its container may see them: NVML lists every process
/// with a context on the GPU, other tenants' too (their host pids and memory); on a device with a
/// limit the list keeps only the pids the accounting file knows as the container's (its processes'
/// own pids, and the host pids learnt for them), so `nvidia-smi` and monitoring tools in the pod
/// show its own processes. Elsewhere NVML's answer passes through. The count follows NVML's
/// contract: `*count` in, the buffer's size; out, the number of processes;
/// `NVML_ERROR_INSUFFICIENT_SIZE` with the count when the buffer is too small.
unsafe fn container_processes(
    f: Option<ProcessesFn>,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_int {
    let Some(nv) = nvml() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    let Some(f) = f else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    let mine = match (count.is_null(), nvml_view(nv, device), hook()) {
        (false, Some(_), Ok(h)) => h.ledger.pids(),
        // SAFETY: forwarding the caller's arguments.
        _ => return unsafe { f(device, count, infos) },
    };
    let kept: Vec<ProcessInfo> = match all_processes(f, device) {
        Ok(all) => all.into_iter().filter(|p| mine.contains(&p.pid)).collect(),
        Err(e) => return e,
    };
    // SAFETY: `count` checked non-null; `infos` holds `*count` entries when non-null (NVML's
    // contract with the caller).
    unsafe {
        if (*count as usize) < kept.len() || (infos.is_null() && !kept.is_empty()) {
            *count = kept.len() as c_uint;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        if !kept.is_empty() {
            std::ptr::copy_nonoverlapping(kept.as_ptr(), infos, kept.len());
        }
        *count = kept.len() as c_uint;
    }
    CUDA_SUCCESS
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: the container's processes only
/// ([`container_processes`]).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_int {
    boundary(|| {
        let f = nvml().and_then(|nv| nv.nvmlDeviceGetComputeRunningProcesses_v3);
        // SAFETY: forwarding the caller's arguments.
        unsafe { container_processes(f, device, count, infos) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (the same `nvmlProcessInfo_t` layout), as `_v3`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_int {
    boundary(|| {
        let f = nvml().and_then(|nv| nv.nvmlDeviceGetComputeRunningProcesses_v2);
        // SAFETY: forwarding the caller's arguments.
        unsafe { container_processes(f, device, count, infos) }
    })
}

/// `nvmlDeviceGetMemoryInfo`: with a memory limit, total = limit, used = the container's usage,
/// free = limit - usage (never above the real free), so nvidia-smi in the pod shows the slice.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: *mut c_void,
    mem: *mut NvmlMemory,
) -> c_int {
    boundary(|| {
        let Some(nv) = nvml() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        let Some(f) = nv.nvmlDeviceGetMemoryInfo else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(device, mem) };
        if r != CUDA_SUCCESS || mem.is_null() {
            return r;
        }
        if let Some((limit, used)) = nvml_view(nv, device) {
            // SAFETY: checked non-null; NVML just filled it.
            let m = unsafe { &mut *mem };
            m.total = m.total.min(limit);
            m.free = m.free.min(limit.saturating_sub(used));
            m.used = used;
        }
        r
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`, as [`nvmlDeviceGetMemoryInfo`] (reserved memory passes through).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    mem: *mut NvmlMemoryV2,
) -> c_int {
    boundary(|| {
        let Some(nv) = nvml() else {
            return NVML_ERROR_UNINITIALIZED;
        };
        let Some(f) = nv.nvmlDeviceGetMemoryInfo_v2 else {
            return NVML_ERROR_FUNCTION_NOT_FOUND;
        };
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(device, mem) };
        if r != CUDA_SUCCESS || mem.is_null() {
            return r;
        }
        if let Some((limit, used)) = nvml_view(nv, device) {
            // SAFETY: checked non-null; NVML just filled it.
            let m = unsafe { &mut *mem };
            m.total = m.total.min(limit);
            m.free = m.free.min(limit.saturating_sub(used));
            m.used = used;
        }
        r
    })
}

macro_rules! wrappers {
    ($($name:ident),* $(,)?) => {
        /// Our interposer for a driver symbol name, if we have one.
        fn wrapper(name: &[u8]) -> Option<*mut c_void> {
            Some(match name {
                $(n if n == stringify!($name).as_bytes() => $name as *mut c_void,)*
                _ => return None,
            })
        }
    };
}

wrappers![
    cuInit,
    cuMemAlloc_v2,
    cuMemAlloc,
    cuMemAllocManaged,
    cuMemAllocPitch_v2,
    cuMemAllocAsync,
    cuMemAllocAsync_ptsz,
    cuMemAllocFromPoolAsync,
    cuMemAllocFromPoolAsync_ptsz,
    cuMemFree_v2,
    cuMemFree,
    cuMemFreeAsync,
    cuMemFreeAsync_ptsz,
    cuMemCreate,
    cuMemRelease,
    cuArrayCreate_v2,
    cuArray3DCreate_v2,
    cuArrayDestroy,
    cuMipmappedArrayCreate,
    cuMipmappedArrayDestroy,
    cuMemGetInfo_v2,
    cuMemGetInfo,
    cuDeviceTotalMem_v2,
    cuLaunchKernel,
    cuLaunchKernel_ptsz,
    cuLaunchCooperativeKernel,
    cuLaunchCooperativeKernel_ptsz,
    cuLaunchKernelEx,
    cuLaunchKernelEx_ptsz,
    cuGraphLaunch,
    cuGraphLaunch_ptsz,
    cuGetProcAddress,
    cuGetProcAddress_v2,
    nvmlDeviceGetMemoryInfo,
    nvmlDeviceGetMemoryInfo_v2,
    nvmlDeviceGetComputeRunningProcesses_v3,
    nvmlDeviceGetComputeRunningProcesses_v2,
];

/// The name `cuGetProcAddress` resolves `base` to for `version`: the `_v2` ABI of the memory and
/// array calls since CUDA 3.2 (the 3.1 ABI below), `cuGetProcAddress_v2` since 12.0, and the
/// `_ptsz` entry of stream calls for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (flag 2).
fn versioned(base: &[u8], version: c_int, flags: u64) -> Vec<u8> {
    const PTSZ: &[&[u8]] = &[
        b"cuMemAllocAsync",
        b"cuMemFreeAsync",
        b"cuMemAllocFromPoolAsync",
        b"cuLaunchKernel",
        b"cuLaunchKernelEx",
        b"cuLaunchCooperativeKernel",
        b"cuGraphLaunch",
    ];
    const V2: &[&[u8]] = &[
        b"cuMemAlloc",
        b"cuMemAllocPitch",
        b"cuMemFree",
        b"cuMemGetInfo",
        b"cuDeviceTotalMem",
        b"cuArrayCreate",
        b"cuArray3DCreate",
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
    if name.starts_with(b"cu") || name.starts_with(b"nvml") {
        catch_unwind(|| wrapper(name)).ok().flatten().unwrap_or(p)
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_released_only_when_the_last_thread_is_gone() {
        let status = |state: &str, threads: u32| {
            format!("Name:\tprobe\nState:\t{state}\nTgid:\t7\nThreads:\t{threads}\n")
        };
        assert!(!released(&status("R (running)", 16)));
        assert!(!released(&status("S (sleeping)", 1)));
        // A SIGKILLed leader is a zombie while its other threads still exit.
        assert!(!released(&status("Z (zombie)", 5)));
        assert!(released(&status("Z (zombie)", 1)));
        assert!(released(&status("X (dead)", 1)));
        // This process is alive.
        assert!(alive(std::process::id()));
    }

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
        assert_eq!(
            versioned(b"cuLaunchKernel", 12040, 2),
            b"cuLaunchKernel_ptsz"
        );
        assert_eq!(versioned(b"cuGraphLaunch", 12040, 2), b"cuGraphLaunch_ptsz");
        assert_eq!(
            versioned(b"cuMemAllocPitch", 12040, 2),
            b"cuMemAllocPitch_v2"
        );
        assert_eq!(versioned(b"cuMemGetInfo", 3010, 0), b"cuMemGetInfo");
        for name in [
            "cuMemAlloc_v2",
            "cuMemAlloc",
            "cuMemCreate",
            "cuArray3DCreate_v2",
            "cuLaunchKernelEx_ptsz",
            "cuGraphLaunch",
        ] {
            assert!(wrapper(name.as_bytes()).is_some(), "{name}");
        }
        assert!(wrapper(b"cuMemcpy").is_none());
    }

    /// 2 MiB-aligned pointers (the driver's large-allocation granularity) spread over the low bits
    /// that pick a hash bucket, and the kinds keep equal keys apart.
    #[test]
    fn allocation_keys_hash_apart() {
        use std::hash::BuildHasher;
        let b = std::hash::BuildHasherDefault::<KeyHasher>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u64)
            .map(|i| b.hash_one((Kind::Ptr, 0x7f00_0000_0000 + (i << 21))) & 1023)
            .collect();
        assert!(buckets.len() > 550, "{}", buckets.len());
        assert_ne!(
            b.hash_one((Kind::Ptr, 1u64)),
            b.hash_one((Kind::Array, 1u64))
        );
        let mut m = KeyMap::default();
        m.insert((Kind::Handle, 7), (0, 10));
        assert_eq!(m.remove(&(Kind::Handle, 7)), Some((0, 10)));
    }

    #[test]
    fn array_sizes_follow_the_descriptor() {
        // CU_AD_FORMAT_FLOAT x 4 channels = 16 bytes per element; height/depth 0 means 1.
        assert_eq!(array_bytes(1024, 1024, 0, 0x20, 4), 16 << 20);
        assert_eq!(array_bytes(10, 0, 0, 0x01, 1), 10);
        assert_eq!(array_bytes(10, 2, 3, 0x10, 2), 240);
        // Unknown formats are charged as 32-bit channels.
        assert_eq!(array_bytes(1, 1, 1, 0xb0, 1), 4);
        assert_eq!(array_bytes(usize::MAX, usize::MAX, 1, 0x20, 4), u64::MAX);
        // Mipmaps: 1024^2 float4 with all 11 levels is 16 MiB x (1 + 1/4 + ...) = 22369616 bytes;
        // a layered array keeps its 6 layers at every level; 0 levels is charged as 1.
        let d = |w, h, depth, flags| Array3dDescriptor {
            width: w,
            height: h,
            depth,
            format: 0x20,
            channels: 4,
            flags,
        };
        assert_eq!(mipmapped_bytes(&d(1024, 1024, 0, 0), 11), 22_369_616);
        assert_eq!(mipmapped_bytes(&d(4, 4, 6, 0x01), 3), (16 + 4 + 1) * 6 * 16);
        assert_eq!(mipmapped_bytes(&d(4, 4, 4, 0), 3), (64 + 8 + 1) * 16);
        assert_eq!(mipmapped_bytes(&d(8, 0, 0, 0), 0), 8 * 16);
    }
}
