//! Minimal test double of `libnvidia-ml.so.1` for the runtime hook's tests: the NVML calls the hook
//! makes or intercepts (init, device handles and index, memory info, device and process utilization).
//! Tests copy `libfake_nvml_util.so` next to the fake driver as `libnvidia-ml.so.1`.
//!
//! It describes the GPUs of the fake driver (`tests/fake-cuda`), as NVML describes the GPUs the
//! kernel driver runs: device count and memory totals from `FAKE_CUDA_DEVICE_MEMORY`, memory in use
//! and busy time from the fake driver's test hooks `fakeCudaGetDeviceUsed` / `fakeCudaGetBusyNs`
//! (found with `dlsym(RTLD_DEFAULT)` in the same process; without the fake driver: nothing used,
//! idle). Utilization is therefore proportional to the rate at which the process launches work.
//!
//! `FAKE_NVML_NO_PROCESS_UTILIZATION=1` makes `nvmlDeviceGetProcessUtilization` return
//! NVML_ERROR_NOT_SUPPORTED, as on GPUs without per-process accounting.
//!
//! `FAKE_NVML_PID_OFFSET=K`: the calling process is reported as pid `getpid() + K`. NVML reports
//! the pids of the host's pid namespace, so inside a container its own process has another number
//! (nvidia-smi in a container shows host pids, or none).
//!
//! `FAKE_NVML_OTHER_UTILIZATION=N`: another tenant's process ([`OTHER_PID`]) keeps the GPU `N` %
//! busy: it is one of the device's compute processes, has its own process-utilization sample, and
//! adds `N` to the device's utilization (capped at 100), as a shared GPU shows everyone's kernels.
//!
//! (The device plugin's shared NVML double is `tests/fake-nvml`; this one is separate until the two
//! are merged.)
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
#![allow(missing_docs)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// Host pid of the other tenant's process (`FAKE_NVML_OTHER_UTILIZATION`).
pub const OTHER_PID: c_uint = 4_194_000;

fn env_u32(name: &str) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The pid NVML reports for the calling process.
fn reported_pid() -> c_uint {
    std::process::id().wrapping_add(env_u32("FAKE_NVML_PID_OFFSET"))
}

/// Shortest sample period: NVML's utilization is "percent of time over the past sample period", a
/// period between 1/6 s and 1 s on real GPUs; the fake uses the time since the previous sample, but
/// at least this long (a query sooner returns the previous value).
const MIN_SAMPLE_NS: u64 = 40_000_000;

struct Sample {
    at: u64,
    busy: u64,
    percent: u32,
}

struct State {
    totals: Vec<u64>,
    samples: Vec<Sample>,
}

static STATE: OnceLock<Result<Mutex<State>, NvmlReturn>> = OnceLock::new();

fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn state() -> Result<std::sync::MutexGuard<'static, State>, NvmlReturn> {
    match STATE.get() {
        Some(Ok(m)) => Ok(m.lock().unwrap_or_else(|p| p.into_inner())),
        Some(Err(e)) => Err(*e),
        None => Err(NVML_ERROR_UNINITIALIZED),
    }
}

fn init() -> NvmlReturn {
    let r = STATE.get_or_init(|| {
        let spec = std::env::var("FAKE_CUDA_DEVICE_MEMORY").unwrap_or_else(|_| "16g".into());
        let totals = spec
            .split(',')
            .map(vgpu_core::env::parse_memory_bytes)
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| NVML_ERROR_UNKNOWN)?;
        let now = now_ns();
        let samples = totals
            .iter()
            .map(|_| Sample {
                at: now,
                busy: 0,
                percent: 0,
            })
            .collect();
        Ok(Mutex::new(State { totals, samples }))
    });
    match r {
        Ok(_) => NVML_SUCCESS,
        Err(e) => *e,
    }
}

/// `nvmlInit_v2`: initialises NVML.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    init()
}

/// `nvmlInit` (the older name).
#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    init()
}

/// `nvmlShutdown`: the fake keeps its state (NVML reference-counts init/shutdown).
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    NVML_SUCCESS
}

/// `nvmlDeviceGetCount_v2`: all GPUs of the machine (NVML ignores CUDA_VISIBLE_DEVICES).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    let s = match state() {
        Ok(s) => s,
        Err(e) => return e,
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { *count = s.totals.len() as c_uint };
    NVML_SUCCESS
}

fn handle_index(s: &State, device: NvmlDevice) -> Result<usize, NvmlReturn> {
    let i = (device as usize).wrapping_sub(1);
    if i < s.totals.len() {
        Ok(i)
    } else {
        Err(NVML_ERROR_INVALID_ARGUMENT)
    }
}

/// `nvmlDeviceGetHandleByIndex_v2`: the handle of device `index` (opaque: here index + 1).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let s = match state() {
        Ok(s) => s,
        Err(e) => return e,
    };
    if device.is_null() || index as usize >= s.totals.len() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    unsafe { *device = (index as usize + 1) as NvmlDevice };
    NVML_SUCCESS
}

/// `nvmlDeviceGetIndex`: the NVML index of a handle.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    let s = match state() {
        Ok(s) => s,
        Err(e) => return e,
    };
    if index.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match handle_index(&s, device) {
        // SAFETY: checked non-null.
        Ok(i) => unsafe { *index = i as c_uint },
        Err(e) => return e,
    }
    NVML_SUCCESS
}

type FakeCudaQuery = unsafe extern "C" fn(c_int, *mut u64) -> c_int;

fn fake_cuda(name: &std::ffi::CStr, dev: usize) -> u64 {
    // SAFETY: looking up a constant name in the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return 0;
    }
    // SAFETY: the fake driver's test hooks have this signature.
    let f = unsafe { std::mem::transmute::<*mut c_void, FakeCudaQuery>(p) };
    let mut v = 0u64;
    // SAFETY: valid out pointer.
    if unsafe { f(dev as c_int, &mut v) } == 0 {
        v
    } else {
        0
    }
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`; `version` must be `nvmlMemory_v2` (size | 2 << 24).
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2`.
pub const MEMORY_V2: c_uint = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);

fn memory(device: NvmlDevice) -> Result<(u64, u64), NvmlReturn> {
    let s = state()?;
    let i = handle_index(&s, device)?;
    let total = s.totals[i];
    drop(s);
    Ok((total, fake_cuda(c"fakeCudaGetDeviceUsed", i).min(total)))
}

/// `nvmlDeviceGetMemoryInfo`: total, free and used bytes of the device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    mem: *mut Memory,
) -> NvmlReturn {
    if mem.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match memory(device) {
        Ok((total, used)) => {
            // SAFETY: checked non-null.
            unsafe {
                *mem = Memory {
                    total,
                    free: total - used,
                    used,
                }
            };
            NVML_SUCCESS
        }
        Err(e) => e,
    }
}

/// `nvmlDeviceGetMemoryInfo_v2`: as above plus reserved memory (0 here); checks the struct version
/// (NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25 otherwise).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    mem: *mut MemoryV2,
) -> NvmlReturn {
    if mem.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: checked non-null.
    if unsafe { (*mem).version } != MEMORY_V2 {
        return 25;
    }
    match memory(device) {
        Ok((total, used)) => {
            // SAFETY: checked non-null.
            unsafe {
                *mem = MemoryV2 {
                    version: MEMORY_V2,
                    total,
                    reserved: 0,
                    free: total - used,
                    used,
                }
            };
            NVML_SUCCESS
        }
        Err(e) => e,
    }
}

/// Percent of the last sample period the device was busy.
fn utilization(device: NvmlDevice) -> Result<u32, NvmlReturn> {
    let s = state()?;
    let i = handle_index(&s, device)?;
    let now = now_ns();
    if now - s.samples[i].at >= MIN_SAMPLE_NS {
        drop(s);
        let busy = fake_cuda(c"fakeCudaGetBusyNs", i);
        let mut s = state()?;
        let prev = &mut s.samples[i];
        let dt = now - prev.at;
        prev.percent =
            (busy.saturating_sub(prev.busy).saturating_mul(100) / dt.max(1)).min(100) as u32;
        prev.at = now;
        prev.busy = busy;
        return Ok(prev.percent);
    }
    Ok(s.samples[i].percent)
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlDeviceGetUtilizationRates`: "percent of time over the past sample period during which one or
/// more kernels was executing on the GPU".
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    util: *mut Utilization,
) -> NvmlReturn {
    if util.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    match utilization(device) {
        Ok(p) => {
            let gpu = (p + env_u32("FAKE_NVML_OTHER_UTILIZATION")).min(100);
            // SAFETY: checked non-null.
            unsafe { *util = Utilization { gpu, memory: 0 } };
            NVML_SUCCESS
        }
        Err(e) => e,
    }
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessSample {
    pid: c_uint,
    time_stamp: u64,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process that used the device since
/// `lastSeenTimeStamp` (µs). With a NULL buffer it returns NVML_ERROR_INSUFFICIENT_SIZE and the
/// count; NVML_ERROR_NOT_FOUND when no process has a newer sample. The fake reports the calling
/// process (its GPU work is the only work the fake driver sees), under its host pid
/// (`FAKE_NVML_PID_OFFSET`), and the other tenant's process when there is one.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    samples: *mut ProcessSample,
    count: *mut c_uint,
    last_seen: u64,
) -> NvmlReturn {
    if std::env::var_os("FAKE_NVML_NO_PROCESS_UTILIZATION").is_some() {
        return NVML_ERROR_NOT_SUPPORTED;
    }
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let p = match utilization(device) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let now_us = now_ns() / 1000;
    if now_us <= last_seen {
        return NVML_ERROR_NOT_FOUND;
    }
    let other = env_u32("FAKE_NVML_OTHER_UTILIZATION");
    let mine = ProcessSample {
        pid: reported_pid(),
        time_stamp: now_us,
        sm_util: p,
        mem_util: 0,
        enc_util: 0,
        dec_util: 0,
    };
    let theirs = ProcessSample {
        pid: OTHER_PID,
        sm_util: other,
        ..mine
    };
    let all: Vec<ProcessSample> = if other > 0 {
        vec![mine, theirs]
    } else {
        vec![mine]
    };
    // SAFETY: checked non-null; `samples` holds `*count` entries when non-null.
    unsafe {
        if samples.is_null() || (*count as usize) < all.len() {
            *count = all.len() as c_uint;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (i, x) in all.iter().enumerate() {
            *samples.add(i) = *x;
        }
        *count = all.len() as c_uint;
    }
    NVML_SUCCESS
}

/// `nvmlProcessInfo_t` (`_v2` and `_v3` of nvmlDeviceGetComputeRunningProcesses).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`: "information about processes with a compute context
/// on a device"; `*count` in: the buffer's size, out: the number of processes;
/// NVML_ERROR_INSUFFICIENT_SIZE (with the count) when the buffer is too small or NULL with a
/// non-zero size needed. The fake lists the calling process once it has a context on the device
/// (the fake driver's count), and the other tenant's process when there is one.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    let s = match state() {
        Ok(s) => s,
        Err(e) => return e,
    };
    let i = match handle_index(&s, device) {
        Ok(i) => i,
        Err(e) => return e,
    };
    drop(s);
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let info = |pid| ProcessInfo {
        pid,
        used_gpu_memory: 0,
        gpu_instance_id: u32::MAX,
        compute_instance_id: u32::MAX,
    };
    let mut all = Vec::new();
    if env_u32("FAKE_NVML_OTHER_UTILIZATION") > 0 {
        all.push(info(OTHER_PID));
    }
    if fake_cuda(c"fakeCudaGetContextCount", i) > 0 {
        all.push(ProcessInfo {
            used_gpu_memory: fake_cuda(c"fakeCudaGetDeviceUsed", i),
            ..info(reported_pid())
        });
    }
    // SAFETY: checked non-null; `infos` holds `*count` entries when non-null.
    unsafe {
        if (*count as usize) < all.len() || (infos.is_null() && !all.is_empty()) {
            *count = all.len() as c_uint;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (k, x) in all.iter().enumerate() {
            *infos.add(k) = *x;
        }
        *count = all.len() as c_uint;
    }
    NVML_SUCCESS
}
