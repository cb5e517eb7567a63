//! The real driver's and NVML's entry points: the C library's `dlsym` (this library exports its
//! own) and the tables of function pointers looked up with it.

use super::*;

pub(super) type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The C library's `dlsym`, found with `dlvsym` because this library exports its own `dlsym`.
pub(super) fn real_dlsym() -> Option<DlsymFn> {
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
    cuDeviceGetMemPool: fn(*mut *mut c_void, c_int);
    cuMemPoolGetAttribute: fn(*mut c_void, c_int, *mut c_void);
    cuMemPoolTrimTo: fn(*mut c_void, usize);
    cuMemPoolDestroy: fn(*mut c_void);
    cuMemExportToShareableHandle: fn(*mut c_void, u64, c_uint, u64);
    cuMemCreate: fn(*mut u64, usize, *const c_void, u64);
    cuMemRelease: fn(u64);
    cuMemMap: fn(CUdeviceptr, usize, usize, u64, u64);
    cuMemUnmap: fn(CUdeviceptr, usize);
    cuMemRetainAllocationHandle: fn(*mut u64, *mut c_void);
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
