//! Device queries, the context stack and error strings: what the CUDA runtime, CuPy and the
//! cuda-bindings driver module ask at start. Values of enums are cuda.h's (12.9, as the
//! cuda-bindings 12.9 enums carry them).

use crate::{
    current, device_index, state, try_cu, CUcontext, CUdevice, CUresult, CUDA_ERROR_INVALID_VALUE,
    CUDA_SUCCESS, CURRENT,
};
use std::ffi::{c_char, c_int, c_uint};

/// The name `cuDeviceGetName` reports.
pub const DEVICE_NAME: &str = "vgpu fake GPU";

/// `CUdevice_attribute` values the fake answers (cuda.h), with an Ampere-like device's numbers;
/// every other attribute reads 0 ("not supported"), as a driver answers for a feature the device
/// lacks.
fn attribute(attr: c_int, ordinal: usize, sms: c_int) -> c_int {
    match attr {
        1 => 1024,                  // MAX_THREADS_PER_BLOCK
        2 | 3 => 1024,              // MAX_BLOCK_DIM_X, _Y
        4 => 64,                    // MAX_BLOCK_DIM_Z
        5 => i32::MAX,              // MAX_GRID_DIM_X
        6 | 7 => 65535,             // MAX_GRID_DIM_Y, _Z
        8 => 48 << 10,              // MAX_SHARED_MEMORY_PER_BLOCK
        9 => 64 << 10,              // TOTAL_CONSTANT_MEMORY
        10 => 32,                   // WARP_SIZE
        11 => i32::MAX,             // MAX_PITCH
        12 => 65536,                // MAX_REGISTERS_PER_BLOCK
        13 => 1_695_000,            // CLOCK_RATE (kHz)
        14 => 512,                  // TEXTURE_ALIGNMENT
        16 => sms,                  // MULTIPROCESSOR_COUNT
        19 => 1,                    // CAN_MAP_HOST_MEMORY
        20 => 0,                    // COMPUTE_MODE: default
        33 => ordinal as c_int + 1, // PCI_BUS_ID
        36 => 6_251_000,            // MEMORY_CLOCK_RATE (kHz)
        37 => 384,                  // GLOBAL_MEMORY_BUS_WIDTH
        38 => 6 << 20,              // L2_CACHE_SIZE
        39 => 1536,                 // MAX_THREADS_PER_MULTIPROCESSOR
        40 => 2,                    // ASYNC_ENGINE_COUNT
        41 => 1,                    // UNIFIED_ADDRESSING
        75 => 8,                    // COMPUTE_CAPABILITY_MAJOR
        76 => 6,                    // COMPUTE_CAPABILITY_MINOR
        81 => 100 << 10,            // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        83 => 1,                    // MANAGED_MEMORY
        89 => 1,                    // CONCURRENT_MANAGED_ACCESS
        95 => 1,                    // COOPERATIVE_LAUNCH
        97 => 99 << 10,             // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        102 => 1,                   // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        103 => 1,                   // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        115 => 1,                   // MEMORY_POOLS_SUPPORTED
        119 => 1,                   // MEMPOOL_SUPPORTED_HANDLE_TYPES: POSIX file descriptor
        _ => 0,
    }
}

/// `cuDeviceGetAttribute`: "Returns in *pi the integer value of the attribute attrib on device
/// dev"; CUDA_ERROR_INVALID_DEVICE for a bad device.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attr: c_int,
    dev: CUdevice,
) -> CUresult {
    let s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if pi.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *pi = attribute(attr, d, 84) };
    CUDA_SUCCESS
}

/// `cuDeviceGetName`: "Returns an ASCII string identifying the device dev in the NULL-terminated
/// string pointed to by name. len specifies the maximum length of the string that may be
/// returned."
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    let s = try_cu!(state());
    let _ = try_cu!(device_index(&s, dev));
    if name.is_null() || len <= 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let bytes = DEVICE_NAME.as_bytes();
    let n = bytes.len().min(len as usize - 1);
    // SAFETY: checked non-null; the caller's buffer holds `len` bytes, we write at most that.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), name, n);
        *name.add(n) = 0;
    }
    CUDA_SUCCESS
}

/// `CUuuid`: 16 bytes.
#[repr(C)]
pub struct CuUuid {
    pub(crate) bytes: [u8; 16],
}

unsafe fn write_uuid(uuid: *mut CuUuid, dev: CUdevice) -> CUresult {
    let s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if uuid.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let mut bytes = [0u8; 16];
    bytes[0] = 0xfa;
    bytes[15] = s.physical[d] as u8;
    // SAFETY: checked non-null.
    unsafe { (*uuid).bytes = bytes };
    CUDA_SUCCESS
}

/// `cuDeviceGetUuid`: "Returns 16-octets identifying the device dev in the structure pointed by
/// the uuid" (the physical device's, whatever `CUDA_VISIBLE_DEVICES` says).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CuUuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { write_uuid(uuid, dev) }
}

/// `cuDeviceGetUuid_v2` (CUDA 11.4): the same for the fake (no MIG instances).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CuUuid, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { write_uuid(uuid, dev) }
}

/// `cuCtxGetCurrent`: "Returns in *pctx the CUDA context bound to the calling CPU thread. If no
/// context is bound to the calling CPU thread then *pctx is set to NULL and CUDA_SUCCESS is
/// returned."
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    let _s = try_cu!(state());
    if pctx.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let ctx = CURRENT
        .with(|c| c.get())
        .map_or(std::ptr::null_mut(), |d| (d + 1) as CUcontext);
    // SAFETY: checked non-null.
    unsafe { *pctx = ctx };
    CUDA_SUCCESS
}

/// `cuCtxSynchronize`: "Blocks until the device has completed all preceding requested tasks";
/// the fake's work is done when it is queued, and memory pools give back what they hold above
/// their release thresholds.
#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CUresult {
    let _ = try_cu!(current());
    crate::pools::synchronized();
    CUDA_SUCCESS
}

/// `cuCtxPushCurrent_v2`: "Pushes the given context ctx onto the CPU thread's stack of current
/// contexts"; the fake keeps only the top, which is what the calls below read.
#[no_mangle]
pub extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    let s = try_cu!(state());
    let v = ctx as usize;
    if v == 0 || v > s.devices.len() {
        return crate::CUDA_ERROR_INVALID_CONTEXT;
    }
    CURRENT.with(|c| c.set(Some(v - 1)));
    CUDA_SUCCESS
}

/// `cuCtxPopCurrent_v2`: "Pops the current CUDA context from the CPU thread and passes back the
/// old context handle in *pctx".
#[no_mangle]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    let _s = try_cu!(state());
    let Some(d) = CURRENT.with(|c| c.take()) else {
        return crate::CUDA_ERROR_INVALID_CONTEXT;
    };
    if !pctx.is_null() {
        // SAFETY: checked non-null.
        unsafe { *pctx = (d + 1) as CUcontext };
    }
    CUDA_SUCCESS
}

/// `cuDevicePrimaryCtxRelease_v2`: "Releases the primary context interop on the device".
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    let s = try_cu!(state());
    let _ = try_cu!(device_index(&s, dev));
    CUDA_SUCCESS
}

/// `cuDevicePrimaryCtxGetState`: "Returns in *flags the flags for the primary context of dev, and
/// in *active whether it is active".
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> CUresult {
    let s = try_cu!(state());
    let d = try_cu!(device_index(&s, dev));
    if flags.is_null() || active.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: both checked non-null.
    unsafe {
        *flags = 0;
        *active = c_int::from(s.devices[d].contexts > 0);
    }
    CUDA_SUCCESS
}

/// `cuDevicePrimaryCtxSetFlags_v2`: accepted (the fake schedules nothing).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, _flags: c_uint) -> CUresult {
    let s = try_cu!(state());
    let _ = try_cu!(device_index(&s, dev));
    CUDA_SUCCESS
}

/// `(code, name, description)` of the results the fake returns, as cuda.h names and documents
/// them.
const ERRORS: &[(CUresult, &str, &str)] = &[
    (0, "CUDA_SUCCESS\0", "no error\0"),
    (1, "CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
    (2, "CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
    (3, "CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
    (
        101,
        "CUDA_ERROR_INVALID_DEVICE\0",
        "invalid device ordinal\0",
    ),
    (
        201,
        "CUDA_ERROR_INVALID_CONTEXT\0",
        "invalid device context\0",
    ),
    (
        400,
        "CUDA_ERROR_INVALID_HANDLE\0",
        "invalid resource handle\0",
    ),
    (500, "CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
    (999, "CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
];

unsafe fn error_text(
    error: CUresult,
    out: *mut *const c_char,
    pick: fn(&(CUresult, &'static str, &'static str)) -> &'static str,
) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match ERRORS.iter().find(|e| e.0 == error) {
        Some(e) => {
            // SAFETY: checked non-null; the strings are static and NUL-terminated.
            unsafe { *out = pick(e).as_ptr().cast::<c_char>() };
            CUDA_SUCCESS
        }
        None => {
            // "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will be returned and
            // *pStr will be set to the NULL value."
            // SAFETY: checked non-null.
            unsafe { *out = std::ptr::null() };
            CUDA_ERROR_INVALID_VALUE
        }
    }
}

/// `cuGetErrorName`: "Sets *pStr to the address of a NULL-terminated string containing the string
/// representation of the error code error."
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: same contract.
    unsafe { error_text(error, out, |e| e.1) }
}

/// `cuGetErrorString`: "Sets *pStr to the address of a NULL-terminated string containing a
/// description of the error code error."
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, out: *mut *const c_char) -> CUresult {
    // SAFETY: same contract.
    unsafe { error_text(error, out, |e| e.2) }
}
