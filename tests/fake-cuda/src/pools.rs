//! Memory pools (stream-ordered allocation), with the reserve a real pool keeps: each device's
//! default pool and pools the program creates, their device, the memory they hold and the
//! attributes callers read and set.
//!
//! As the driver documents them: an allocation takes memory from the pool's reserve, growing it
//! from the device when short; a free returns the memory to the pool, not to the device; at a
//! synchronisation (stream, event or context) a pool gives back what it holds above its release
//! threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, default 0), and `cuMemPoolTrimTo` gives back
//! down to what the caller keeps. So a pool with a raised threshold holds device memory no live
//! allocation uses: what the device's used memory (`fakeCudaGetDeviceUsed`) counts and the hook
//! must charge.

use crate::streams::CUDA_ERROR_INVALID_HANDLE;
use crate::{
    device_index, give_device_memory, next_address, state, take_device_memory, try_cu, CUdevice,
    CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS,
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

#[derive(Default)]
struct Pool {
    device: usize,
    release_threshold: u64,
    /// Device memory the pool holds.
    reserved: u64,
    /// Of it, what live allocations use.
    used: u64,
    reserved_high: u64,
    used_high: u64,
}

impl Pool {
    /// Gives back what the pool holds above `keep` (and above what allocations use).
    fn release_above(&mut self, keep: u64) {
        let keep = keep.max(self.used);
        if self.reserved > keep {
            give_device_memory(self.device, self.reserved - keep);
            self.reserved = keep;
        }
    }
}

#[derive(Default)]
struct Pools {
    next: usize,
    pools: HashMap<usize, Pool>,
    /// Live pool allocations: pointer -> (pool, bytes).
    allocations: HashMap<u64, (usize, u64)>,
    /// A device's current pool where the program set one other than its default.
    current: HashMap<usize, usize>,
}

static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

/// A device's default pool has handle `DEFAULT_BASE + ordinal * 0x10`; created pools count from
/// `CREATED_BASE`.
const DEFAULT_BASE: usize = 0x7000_0000;
const CREATED_BASE: usize = 0x7100_0000;

fn pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    let mut g = POOLS.lock();
    f(g.get_or_insert_with(|| Pools {
        next: CREATED_BASE,
        ..Pools::default()
    }))
}

/// The default pool of visible device `d` (made on first use).
pub fn default_pool(d: usize) -> usize {
    let handle = DEFAULT_BASE + d * 0x10;
    pools(|p| {
        p.pools.entry(handle).or_insert(Pool {
            device: d,
            ..Pool::default()
        });
    });
    handle
}

/// Allocates `bytes` from `pool`: from its reserve, which grows from the pool's device when short;
/// CUDA_ERROR_INVALID_HANDLE for an unknown pool.
pub fn alloc(pool: usize, bytes: u64) -> Result<u64, CUresult> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    pools(|p| {
        let entry = p.pools.get_mut(&pool).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let growth = (entry.used + bytes).saturating_sub(entry.reserved);
        if growth > 0 {
            take_device_memory(entry.device, growth)?;
            entry.reserved += growth;
            entry.reserved_high = entry.reserved_high.max(entry.reserved);
        }
        entry.used += bytes;
        entry.used_high = entry.used_high.max(entry.used);
        let ptr = next_address(bytes)?;
        p.allocations.insert(ptr, (pool, bytes));
        Ok(ptr)
    })
}

/// Frees a pool allocation back into its pool; `false` when `ptr` is none.
pub fn free(ptr: u64) -> bool {
    pools(|p| {
        let Some((pool, bytes)) = p.allocations.remove(&ptr) else {
            return false;
        };
        if let Some(entry) = p.pools.get_mut(&pool) {
            entry.used -= bytes.min(entry.used);
        }
        true
    })
}

/// The pool allocation containing `ptr`: its start and size.
pub fn allocation_at(ptr: u64) -> Option<(u64, u64)> {
    pools(|p| crate::containing(p.allocations.iter().map(|(&at, &(_, n))| (at, n)), ptr))
}

/// A synchronisation: every pool gives back what it holds above its release threshold.
pub fn synchronized() {
    pools(|p| {
        for entry in p.pools.values_mut() {
            let keep = entry.release_threshold;
            entry.release_above(keep);
        }
    });
}

/// `cuDeviceGetDefaultMemPool`: "Returns the default mempool of a device".
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool: *mut *mut c_void,
    dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { write_pool(pool, dev, default_pool) }
}

/// Writes the pool `which` names for device `dev` to `pool`.
unsafe fn write_pool(pool: *mut *mut c_void, dev: CUdevice, which: fn(usize) -> usize) -> CUresult {
    let d = {
        let s = try_cu!(state());
        try_cu!(device_index(&s, dev))
    };
    if pool.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *pool = which(d) as *mut c_void };
    CUDA_SUCCESS
}

/// The pool `cuMemAllocAsync` allocates from on visible device `d`.
pub fn current_pool(d: usize) -> usize {
    pools(|p| p.current.get(&d).copied()).unwrap_or_else(|| default_pool(d))
}

/// `cuDeviceGetMemPool`: "Gets the current mempool for a device. Returns the last pool provided
/// to cuDeviceSetMemPool for this device or the device's default memory pool if
/// cuDeviceSetMemPool has never been called."
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { write_pool(pool, dev, current_pool) }
}

/// `cuDeviceSetMemPool`: "Sets the current memory pool of a device. The memory pool must be local
/// to the specified device. cuMemAllocAsync allocates from the current mempool of the provided
/// stream's device."
#[no_mangle]
pub extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: *mut c_void) -> CUresult {
    let d = {
        let s = try_cu!(state());
        try_cu!(device_index(&s, dev))
    };
    let h = pool as usize;
    // Every device's default pool exists from here on, so a pool is known or not a pool.
    let _ = default_pool(d);
    pools(|p| match p.pools.get(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(entry) if entry.device != d => CUDA_ERROR_INVALID_VALUE,
        Some(_) => {
            p.current.insert(d, h);
            CUDA_SUCCESS
        }
    })
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
    let handle = pools(|p| {
        p.next += 0x10;
        p.pools.insert(
            p.next,
            Pool {
                device: d,
                ..Pool::default()
            },
        );
        p.next
    });
    // SAFETY: checked non-null.
    unsafe { *pool = handle as *mut c_void };
    CUDA_SUCCESS
}

/// `cuMemPoolDestroy`: "Destroys the specified memory pool"; its memory goes back to the device
/// (the fake does not defer it for allocations still live); a device's default pool cannot be.
#[no_mangle]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    try_cu!(state().map(drop));
    let h = pool as usize;
    if (DEFAULT_BASE..CREATED_BASE).contains(&h) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // "Destroying the current mempool of a device sets the default mempool of that device as the
    // current mempool for that device."
    let removed = pools(|p| {
        p.current.retain(|_, current| *current != h);
        p.pools.remove(&h)
    });
    match removed {
        Some(entry) => {
            give_device_memory(entry.device, entry.reserved);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_HANDLE,
    }
}

/// `CUmemPool_attribute` (cuda.h): the reuse flags 1-3 (int), `_RELEASE_THRESHOLD` 4,
/// `_RESERVED_MEM_CURRENT` 5, `_RESERVED_MEM_HIGH` 6, `_USED_MEM_CURRENT` 7, `_USED_MEM_HIGH` 8
/// (cuuint64_t).
const ATTR_RELEASE_THRESHOLD: c_int = 4;

/// `cuMemPoolSetAttribute`: the release threshold is kept; the reuse flags are accepted; the
/// current counters are read-only, their high-water marks may be reset ("must be zero").
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    try_cu!(state().map(drop));
    if value.is_null() || !(1..=8).contains(&attr) || matches!(attr, 5 | 7) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = pool as usize;
    pools(|p| match p.pools.get_mut(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(entry) => {
            // SAFETY: checked non-null; attributes 4-8 are cuuint64_t.
            let v = || unsafe { *value.cast::<u64>() };
            match attr {
                ATTR_RELEASE_THRESHOLD => entry.release_threshold = v(),
                6 if v() == 0 => entry.reserved_high = entry.reserved,
                8 if v() == 0 => entry.used_high = entry.used,
                6 | 8 => return CUDA_ERROR_INVALID_VALUE,
                _ => {}
            }
            CUDA_SUCCESS
        }
    })
}

/// `cuMemPoolGetAttribute`: the release threshold as set, the pool's reserve and use and their
/// high-water marks; the reuse flags 1 (on, the driver's default).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: *mut c_void,
    attr: c_int,
    value: *mut c_void,
) -> CUresult {
    try_cu!(state().map(drop));
    if value.is_null() || !(1..=8).contains(&attr) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let h = pool as usize;
    pools(|p| match p.pools.get(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(entry) => {
            let v = match attr {
                ATTR_RELEASE_THRESHOLD => entry.release_threshold,
                5 => entry.reserved,
                6 => entry.reserved_high,
                7 => entry.used,
                8 => entry.used_high,
                _ => {
                    // SAFETY: checked non-null; attributes 1-3 are ints.
                    unsafe { *value.cast::<c_int>() = 1 };
                    return CUDA_SUCCESS;
                }
            };
            // SAFETY: checked non-null; attributes 4-8 are cuuint64_t.
            unsafe { *value.cast::<u64>() = v };
            CUDA_SUCCESS
        }
    })
}

/// `cuMemPoolTrimTo`: "Releases memory back to the OS until the pool contains fewer than
/// minBytesToKeep reserved bytes, or there is no more memory that the allocator can safely
/// release" (memory live allocations use stays).
#[no_mangle]
pub extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, keep: usize) -> CUresult {
    try_cu!(state().map(drop));
    let h = pool as usize;
    pools(|p| match p.pools.get_mut(&h) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(entry) => {
            entry.release_above(keep as u64);
            CUDA_SUCCESS
        }
    })
}
