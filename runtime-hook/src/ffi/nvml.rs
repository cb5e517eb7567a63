//! The real NVML: loaded on first use, its devices, and the compute processes it lists (host pids,
//! from which a process learns its own).

use super::*;

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
    nvmlDeviceGetComputeRunningProcesses: fn(*mut c_void, *mut c_uint, *mut ProcessInfoV1);
    nvmlDeviceGetMemoryInfo: fn(*mut c_void, *mut NvmlMemory);
    nvmlDeviceGetMemoryInfo_v2: fn(*mut c_void, *mut NvmlMemoryV2);
}

/// `nvmlProcessUtilizationSample_t` (nvml.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessSample {
    pub(super) pid: c_uint,
    pub(super) time_stamp: u64,
    pub(super) sm_util: c_uint,
    pub(super) mem_util: c_uint,
    pub(super) enc_util: c_uint,
    pub(super) dec_util: c_uint,
}

/// `nvmlProcessInfo_t` (nvml.h; the `_v2` and `_v3` of nvmlDeviceGetComputeRunningProcesses).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfo {
    pub(super) pid: c_uint,
    pub(super) used_gpu_memory: u64,
    pub(super) gpu_instance_id: c_uint,
    pub(super) compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t` (nvml.h): the entry of the unversioned, first
/// `nvmlDeviceGetComputeRunningProcesses`, which the driver's library still exports and PyTorch
/// looks up by that name.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfoV1 {
    pub(super) pid: c_uint,
    pub(super) used_gpu_memory: u64,
}

/// An entry of a compute-process list, in either layout.
pub(super) trait Process: Copy + Default {
    fn pid(&self) -> u32;
}

impl Process for ProcessInfo {
    fn pid(&self) -> u32 {
        self.pid
    }
}

impl Process for ProcessInfoV1 {
    fn pid(&self) -> u32 {
        self.pid
    }
}

/// `nvmlMemory_t` (nvml.h).
#[repr(C)]
pub struct NvmlMemory {
    pub(super) total: u64,
    pub(super) free: u64,
    pub(super) used: u64,
}

/// `nvmlMemory_v2_t` (nvml.h).
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub(super) version: c_uint,
    pub(super) total: u64,
    pub(super) reserved: u64,
    pub(super) free: u64,
    pub(super) used: u64,
}

pub(super) const NVML_ERROR_INSUFFICIENT_SIZE: CUresult = 7;
pub(super) const NVML_ERROR_UNINITIALIZED: CUresult = 1;
pub(super) const NVML_ERROR_FUNCTION_NOT_FOUND: CUresult = 13;

/// The real NVML, loaded on first use (the watcher, or an intercepted NVML call); `None` when
/// `libnvidia-ml.so.1` cannot be loaded.
pub(super) fn nvml() -> Option<&'static NvmlReal> {
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
pub(super) fn nvml_device(d: usize) -> Option<(&'static NvmlReal, *mut c_void)> {
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

/// An `nvmlDeviceGetComputeRunningProcesses` entry point (`_v3`, `_v2` or the first, by `T`).
pub(super) type ProcessesFn<T = ProcessInfo> =
    unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut T) -> c_int;

/// Every process NVML lists through `f` for a device, or NVML's error.
pub(super) fn all_processes<T: Process>(
    f: ProcessesFn<T>,
    handle: *mut c_void,
) -> Result<Vec<T>, c_int> {
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
        let mut buf = vec![T::default(); n as usize];
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
pub(super) fn compute_pids(nv: &NvmlReal, handle: *mut c_void) -> Option<Vec<u32>> {
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
pub(super) fn find_host_pid(
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

/// Utilization of the device for this container, percent: the sum of the container's processes'
/// samples from nvmlDeviceGetProcessUtilization, or, where that is unsupported or names none of
/// them (pids of another namespace), the device's utilization.
pub(super) fn utilization(
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
pub(super) fn mid_percent(p: c_uint) -> f64 {
    if p >= 100 {
        100.0
    } else {
        f64::from(p) + 0.5
    }
}
