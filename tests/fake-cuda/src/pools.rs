//! Memory pools (stream-ordered allocation): each device's default pool and pools the program
//! creates, their device, and the attributes callers read and set. Allocation from a pool is
//! `cuMemAllocFromPoolAsync` in the crate root, on the pool's device; freed memory goes back at
//! once (the fake keeps no reserve, as a pool with the default release threshold 0 after a
//! synchronisation).

use crate::streams::CUDA_ERROR_INVALID_HANDLE;
use crate::{
    device_index, state, try_cu, CUdevice, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};

/// `CUmemPoolProps` prefix: allocation type, handle types, location {type, id}.
#[repr(C)]
pub struct MemPoolProps {
    pub alloc_type: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

struct Pool {
    device: usize,
    release_threshold: u64,
}

/// Pools by handle; a device's default pool has handle `0x7000_0000 + ordinal * 0x10`.
static POOLS: Mutex<Option<(usize, HashMap<usize, Pool>)>> = Mutex::new(None);

const DEFAULT_BASE: usize = 0x7000_0000;

fn pools<R>(f: impl FnOnce(&mut usize, &mut HashMap<usize, Pool>) -> R) -> R {
    let mut g = POOLS.lock();
    let (next, map) = g.get_or_insert_with(|| (0x7100_0000, HashMap::new()));
    f(next, map)
}

fn default_pool(d: usize) -> usize {
    let handle = DEFAULT_BASE + d * 0x10;
    pools(|_, map| {
        map.entry(handle).or_insert(Pool {
            device: d,
            release_threshold: 0,
        });
    });
    handle
}

/// The device of pool `pool`; `CUDA_ERROR_INVALID_HANDLE` for none.
pub fn device_of(pool: *mut c_void) -> Result<usize, CUresult> {
    pools(|_, map| map.get(&(pool as usize)).map(|p| p.device)).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// `cuDeviceGetDefaultMemPool`: "Returns the default mempool of a device".
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut *mut c_void,
    dev: CUdevice,
) -> CUresult {
    let d = {
        let s = try_cu!(state());
        try_cu!(device_index(&s, dev))
    };
    if pool.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *pool = default_pool(d) as *mut c_void };
    CUDA_SUCCESS
}

/// `cuDeviceGetMemPool`: "Gets the current mempool for a device"; the fake never changes it from
/// the default.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetDefaultMemPool(pool, dev) }
}

/// `cuMemPoolCreate`: "Creates a memory pool" for `props->location`, which must be a device
/// (`CU_MEM_LOCATION_TYPE_DEVICE`) for device memory.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut *mut c_void,
    props: *const MemPoolProps,
) -> CUresult {
    if pool.is_null() || props.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a CUmemPoolProps.
    let props = unsafe { &*props };
    if props.location_type != crate::vmm::LOCATION_DEVICE {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let d = {
        let s = try_cu!(state());
        try_cu!(device_index(&s, props.location_id))
    };
    let handle = pools(|next, map| {
        *next += 0x10;
        map.insert(
            *next,
            Pool {
                device: d,
                release_threshold: 0,
            },
        );
        *next
    });
    // SAFETY: checked non-null.
    unsafe { *pool = handle as *mut c_void };
    CUDA_SUCCESS
}

/// `cuMemPoolDestroy`: "Destroys the specified memory pool"; a device's default pool cannot be.
#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    let _s = try_cu!(state());
    let h = pool as usize;
    if (DEFAULT_BASE..0x7100_0000).contains(&h) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    match pools(|_, map| map.remove(&h)) {
        Some(_) => CUDA_SUCCESS,
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

/// `CUmemPool_attribute` (cuda.h): `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` 4 (cuuint64_t), the reserve
/// and usage counters 5-8 (cuuint64_t), the reuse flags 1-3 (int).
const ATTR_RELEASE_THRESHOLD: c_int = 4;

/// `cuMemPoolSetAttribute`: the release threshold is kept; the reuse flags are accepted; the
/// counters are read-only except their high-water marks, which may be reset to 0.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    let _s = try_cu!(state());
    if value.is_null() || !(1..=8).contains(&attr) || matches!(attr, 5 | 7) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = pool as usize;
    pools(|_, map| match map.get_mut(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(p) => {
            if attr == ATTR_RELEASE_THRESHOLD {
                // SAFETY: checked non-null; this attribute is a cuuint64_t.
                p.release_threshold = unsafe { *value.cast::<u64>() };
            }
            CUDA_SUCCESS
        }
    })
}

/// `cuMemPoolGetAttribute`: the release threshold as set; the reserve and usage counters 0 (the
/// fake keeps nothing in a pool); the reuse flags 1 (on, the driver's default).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    let _s = try_cu!(state());
    if value.is_null() || !(1..=8).contains(&attr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = pool as usize;
    pools(|_, map| match map.get(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(p) => {
            // SAFETY: checked non-null; attributes 1-3 are ints, 4-8 cuuint64_t.
            unsafe {
                match attr {
                    1..=3 => *value.cast::<c_int>() = 1,
                    ATTR_RELEASE_THRESHOLD => *value.cast::<u64>() = p.release_threshold,
                    _ => *value.cast::<u64>() = 0,
                }
            }
            CUDA_SUCCESS
        }
    })
}

/// `cuMemPoolTrimTo`: "Tries to release memory back to the OS"; the fake holds none.
#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, _keep: usize) -> CUresult {
    let _s = try_cu!(state());
    device_of(pool).map_or_else(|e| e, |_| CUDA_SUCCESS)
}
