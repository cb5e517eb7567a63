//! Operations on device memory, which the fake keeps no bytes for: address range queries, memsets
//! and a stream's memory writes. Each checks what cuda.h asks of its arguments (alignment, a range
//! inside one allocation, a valid stream) and writes nothing, so a caller that writes outside
//! what it allocated gets the driver's error here too.

use crate::streams::stream_ok;
use crate::{
    allocation_at, current, try_cu, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND,
    CUDA_SUCCESS,
};
use std::ffi::{c_uint, c_void};

type CUstream = *mut c_void;

/// `cuMemGetAddressRange_v2`: "Returns the base address in *pbase and size in *psize of the
/// allocation ... that contains the input pointer dptr. Both parameters pbase and psize are
/// optional"; CUDA_ERROR_NOT_FOUND for an address in no allocation.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    ptr: u64,
) -> CUresult {
    try_cu!(current());
    let Some((at, n)) = allocation_at(ptr) else {
        return CUDA_ERROR_NOT_FOUND;
    };
    // SAFETY: each written only when non-null.
    unsafe {
        if !base.is_null() {
            *base = at;
        }
        if !size.is_null() {
            *size = n as usize;
        }
    }
    CUDA_SUCCESS
}

/// `count` elements of `width` bytes at `ptr`: aligned to the element ("dstDevice must be 4 byte
/// aligned" for 32-bit values, 2 for 16-bit) and inside one allocation.
fn check_range(ptr: u64, count: usize, width: u64) -> CUresult {
    try_cu!(current());
    let Some(bytes) = (count as u64).checked_mul(width) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    match allocation_at(ptr) {
        Some((at, n)) if ptr.is_multiple_of(width) && ptr + bytes <= at + n => CUDA_SUCCESS,
        _ => CUDA_ERROR_INVALID_VALUE,
    }
}

fn check_async(ptr: u64, count: usize, width: u64, stream: CUstream) -> CUresult {
    match stream_ok(stream) {
        CUDA_SUCCESS => check_range(ptr, count, width),
        e => e,
    }
}

/// `cuMemsetD8_v2`: "Sets the memory range of N 8-bit values to the specified value uc".
#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(ptr: u64, _value: u8, count: usize) -> CUresult {
    check_range(ptr, count, 1)
}

/// `cuMemsetD16_v2`: "Sets the memory range of N 16-bit values"; dstDevice 2-byte aligned.
#[no_mangle]
pub extern "C" fn cuMemsetD16_v2(ptr: u64, _value: u16, count: usize) -> CUresult {
    check_range(ptr, count, 2)
}

/// `cuMemsetD32_v2`: "Sets the memory range of N 32-bit values"; dstDevice 4-byte aligned.
#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(ptr: u64, _value: c_uint, count: usize) -> CUresult {
    check_range(ptr, count, 4)
}

/// `cuMemsetD8Async`: as cuMemsetD8 on `stream`.
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(
    ptr: u64,
    _value: u8,
    count: usize,
    stream: CUstream,
) -> CUresult {
    check_async(ptr, count, 1, stream)
}

/// `cuMemsetD16Async`: as cuMemsetD16 on `stream`.
#[no_mangle]
pub extern "C" fn cuMemsetD16Async(
    ptr: u64,
    _value: u16,
    count: usize,
    stream: CUstream,
) -> CUresult {
    check_async(ptr, count, 2, stream)
}

/// `cuMemsetD32Async`: as cuMemsetD32 on `stream`.
#[no_mangle]
pub extern "C" fn cuMemsetD32Async(
    ptr: u64,
    _value: c_uint,
    count: usize,
    stream: CUstream,
) -> CUresult {
    check_async(ptr, count, 4, stream)
}

/// `cuMemsetD32Async_ptsz`: the per-thread-default-stream entry of cuMemsetD32Async.
#[no_mangle]
pub extern "C" fn cuMemsetD32Async_ptsz(
    ptr: u64,
    _value: c_uint,
    count: usize,
    stream: CUstream,
) -> CUresult {
    check_async(ptr, count, 4, stream)
}

/// `cuStreamWriteValue32_v2`: "Write a value to memory" in stream order; the address must be
/// 4-byte aligned device memory.
#[no_mangle]
pub extern "C" fn cuStreamWriteValue32_v2(
    stream: CUstream,
    ptr: u64,
    _value: u32,
    _flags: c_uint,
) -> CUresult {
    check_async(ptr, 1, 4, stream)
}
