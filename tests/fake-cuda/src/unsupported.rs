//! Entry points of features the fake device does not have. A driver of the version the fake claims
//! exports them all (PyTorch looks each one up at start, and the CUDA runtime turns a lookup that
//! fails into a sticky error its next caller sees), so the fake exports them too and answers as
//! cuda.h lets a driver answer for a device without the feature: `CUDA_ERROR_NOT_SUPPORTED`.
//! `cuDeviceGetAttribute` agrees (`CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0).
//!
//! The driver's log callbacks (CUDA 12.9) are a feature every driver has: a callback registers and
//! is never called, as on a driver with nothing to log.

use crate::{try_cu, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `CUDA_ERROR_NOT_SUPPORTED`: "the attempted operation is not supported on the current system or
/// device".
const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

fn not_supported() -> CUresult {
    try_cu!(crate::state().map(drop));
    CUDA_ERROR_NOT_SUPPORTED
}

/// `cuMulticastCreate` (CUDA 12.1): "Create a generic allocation handle representing a multicast
/// object"; not supported where `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED` is 0.
#[no_mangle]
pub extern "C" fn cuMulticastCreate(_handle: *mut u64, _prop: *const c_void) -> CUresult {
    not_supported()
}

/// `cuMulticastAddDevice`: "Associate a device to a multicast object".
#[no_mangle]
pub extern "C" fn cuMulticastAddDevice(_handle: u64, _dev: c_int) -> CUresult {
    not_supported()
}

/// `cuMulticastBindMem`: "Bind a memory allocation represented by a handle to a multicast object".
#[no_mangle]
pub extern "C" fn cuMulticastBindMem(
    _mc_handle: u64,
    _mc_offset: usize,
    _mem_handle: u64,
    _mem_offset: usize,
    _size: usize,
    _flags: u64,
) -> CUresult {
    not_supported()
}

/// `cuMulticastUnbind`: "Unbind any memory allocations bound to a multicast object".
#[no_mangle]
pub extern "C" fn cuMulticastUnbind(
    _handle: u64,
    _dev: c_int,
    _offset: usize,
    _size: usize,
) -> CUresult {
    not_supported()
}

/// `cuMulticastGetGranularity`: "Calculates either the minimal or recommended granularity for
/// multicast object".
#[no_mangle]
pub extern "C" fn cuMulticastGetGranularity(
    _granularity: *mut usize,
    _prop: *const c_void,
    _option: c_uint,
) -> CUresult {
    not_supported()
}

/// `cuDeviceGetDevResource` (CUDA 12.4): "Get device resources" for green contexts, which the fake
/// device does not partition; with no resource to split, the other green-context calls cannot be
/// reached with valid arguments and answer the same.
#[no_mangle]
pub extern "C" fn cuDeviceGetDevResource(
    _dev: c_int,
    _resource: *mut c_void,
    _kind: c_int,
) -> CUresult {
    not_supported()
}

/// `cuDevSmResourceSplitByCount`: "Splits CU_DEV_RESOURCE_TYPE_SM resources".
#[no_mangle]
pub extern "C" fn cuDevSmResourceSplitByCount(
    _result: *mut c_void,
    _groups: *mut c_uint,
    _input: *const c_void,
    _remaining: *mut c_void,
    _flags: c_uint,
    _min_count: c_uint,
) -> CUresult {
    not_supported()
}

/// `cuDevResourceGenerateDesc`: "Generate a resource descriptor".
#[no_mangle]
pub extern "C" fn cuDevResourceGenerateDesc(
    _desc: *mut *mut c_void,
    _resources: *mut c_void,
    _count: c_uint,
) -> CUresult {
    not_supported()
}

/// `cuGreenCtxCreate`: "Creates a green context with a specified set of resources".
#[no_mangle]
pub extern "C" fn cuGreenCtxCreate(
    _ctx: *mut *mut c_void,
    _desc: *mut c_void,
    _dev: c_int,
    _flags: c_uint,
) -> CUresult {
    not_supported()
}

/// `cuGreenCtxDestroy`: "Destroys a green context".
#[no_mangle]
pub extern "C" fn cuGreenCtxDestroy(_ctx: *mut c_void) -> CUresult {
    not_supported()
}

/// `cuCtxFromGreenCtx`: "Converts a green context into the primary context".
#[no_mangle]
pub extern "C" fn cuCtxFromGreenCtx(_ctx: *mut *mut c_void, _green: *mut c_void) -> CUresult {
    not_supported()
}

/// `cuGreenCtxStreamCreate`: "Create a stream for use in the green context".
#[no_mangle]
pub extern "C" fn cuGreenCtxStreamCreate(
    _stream: *mut *mut c_void,
    _green: *mut c_void,
    _flags: c_uint,
    _priority: c_int,
) -> CUresult {
    not_supported()
}

static NEXT_LOG_CALLBACK: AtomicUsize = AtomicUsize::new(0x7e00_0000);

/// `cuLogsRegisterCallback` (CUDA 12.9): "Register a callback function to receive error log
/// messages"; the handle goes to `callback_out`.
#[no_mangle]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: *mut c_void,
    _user_data: *mut c_void,
    handle: *mut *mut c_void,
) -> CUresult {
    if callback.is_null() || handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = NEXT_LOG_CALLBACK.fetch_add(0x10, Ordering::Relaxed);
    // SAFETY: checked non-null.
    unsafe { *handle = h as *mut c_void };
    CUDA_SUCCESS
}

/// `cuLogsUnregisterCallback`: "Unregister a log message callback".
#[no_mangle]
pub extern "C" fn cuLogsUnregisterCallback(handle: *mut c_void) -> CUresult {
    if handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    CUDA_SUCCESS
}
