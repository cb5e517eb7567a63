//! How callers find the exports: `cuGetProcAddress` (with the driver's version rules) and `dlsym`
//! hand out the hook's interposers for the names it meters.

use super::cuda_exports::*;
use super::nvml_exports::*;
use super::*;
use std::ffi::CStr;

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
    cuMemMap,
    cuMemUnmap,
    cuMemRetainAllocationHandle,
    cuMemPoolTrimTo,
    cuMemPoolDestroy,
    cuMemExportToShareableHandle,
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
    nvmlDeviceGetComputeRunningProcesses,
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
}
