//! The exported NVML entry points: memory and process lists as the container may see them.

use super::*;

/// The container's view of NVML device `device`: (limit, bytes the container uses), or `None` when
/// it has no memory limit (or the hook is not configured). NVML numbers the container's devices in
/// `NVIDIA_VISIBLE_DEVICES` order, as the limits are numbered, and ignores `CUDA_VISIBLE_DEVICES`.
pub(super) fn nvml_view(nv: &NvmlReal, device: *mut c_void) -> Option<(u64, u64)> {
    let h = hook().ok()?;
    h.settle();
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
pub(super) unsafe fn container_processes<T: Process>(
    f: Option<ProcessesFn<T>>,
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut T,
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
    let kept: Vec<T> = match all_processes(f, device) {
        Ok(all) => all
            .into_iter()
            .filter(|p| mine.contains(&p.pid()))
            .collect(),
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

/// `nvmlDeviceGetComputeRunningProcesses` (the first ABI, `nvmlProcessInfo_v1_t`), as `_v3`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfoV1,
) -> c_int {
    boundary(|| {
        let f = nvml().and_then(|nv| nv.nvmlDeviceGetComputeRunningProcesses);
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
