//! The exported CUDA driver entry points: every allocator, free, memory report and launch the
//! hook meters.

use super::*;

/// `cuInit`: fails closed (CUDA_ERROR_INVALID_VALUE) when a limit cannot be read.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuInit);
        // SAFETY: forwarding the caller's arguments.
        unsafe { f(flags) }
    })
}

/// An allocator that writes its result through its first argument: capped against the device `dev`
/// (an expression over the arguments, evaluated inside the hook), charging `bytes`.
macro_rules! alloc_export {
    ($(#[$m:meta])* fn $name:ident($out:ident: *mut $ot:ty $(, $a:ident: $t:ty)*) -> kind $kind:ident, device $dev:expr, bytes $bytes:expr;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($out: *mut $ot $(, $a: $t)*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                if $out.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                let bytes: u64 = $bytes;
                #[allow(clippy::redundant_closure_call)]
                let dev = ($dev)(h);
                // SAFETY: forwarding the caller's arguments; `out` is non-null and the driver wrote
                // it when it returned success.
                h.allocate(dev, bytes, Kind::$kind, || unsafe {
                    cu(f($out $(, $a)*)).map(|()| *$out as u64)
                })
            })
        }
    };
}

/// A free of the allocation named by its first argument.
macro_rules! free_export {
    ($(#[$m:meta])* fn $name:ident($key:ident: $kt:ty $(, $a:ident: $t:ty)*) -> kind $kind:ident;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        pub extern "C" fn $name($key: $kt $(, $a: $t)*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                // SAFETY: forwarding the caller's arguments.
                h.free(Kind::$kind, $key as u64, || unsafe { f($key $(, $a)*) })
            })
        }
    };
}

/// A kernel launch: metered, and throttled by the core limit by `blocks` (an expression over the
/// arguments).
macro_rules! launch_export {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) -> blocks $blocks:expr;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                let blocks: u64 = $blocks;
                // SAFETY: forwarding the caller's arguments.
                h.launch(blocks, || unsafe { f($($a),*) })
            })
        }
    };
}

fn current(h: &Hook) -> Result<usize, CUresult> {
    h.current_device()
}

alloc_export! {
    /// `cuMemAlloc_v2`, capped.
    fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> kind Ptr, device current, bytes bytes as u64;
}
alloc_export! {
    /// `cuMemAlloc` (the CUDA 3.1 ABI: 32-bit pointer and size), capped.
    fn cuMemAlloc(dptr: *mut u32, bytes: c_uint) -> kind Ptr, device current, bytes u64::from(bytes);
}
alloc_export! {
    /// `cuMemAllocManaged`, capped against the current device.
    fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> kind Ptr, device current, bytes bytes as u64;
}
/// A stream-ordered allocation from a memory pool (`pool`: an expression over the hook giving the
/// pool's handle), charged by the growth of the pool's reserve ([`crate::pools`]) on the current
/// device.
macro_rules! pool_alloc_export {
    ($(#[$m:meta])* fn $name:ident($out:ident: *mut CUdeviceptr, $bytes:ident: usize $(, $a:ident: $t:ty)*) -> pool $pool:expr;) => {
        $(#[$m])*
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name($out: *mut CUdeviceptr, $bytes: usize $(, $a: $t)*) -> CUresult {
            boundary(|| {
                let h = try_cu!(hook());
                let f = real_or!(h, $name);
                if $out.is_null() {
                    return CUDA_ERROR_INVALID_VALUE;
                }
                #[allow(clippy::redundant_closure_call)]
                let pool: u64 = ($pool)(h);
                // SAFETY: forwarding the caller's arguments; `out` is non-null and the driver wrote
                // it when it returned success.
                h.allocate_pooled(h.current_device(), pool, $bytes as u64, || unsafe {
                    cu(f($out, $bytes $(, $a)*)).map(|()| *$out)
                })
            })
        }
    };
}

pool_alloc_export! {
    /// `cuMemAllocAsync`: from the current device's current pool.
    fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: *mut c_void) -> pool |h: &Hook| h.current_pool();
}
pool_alloc_export! {
    /// `cuMemAllocAsync_ptsz` (per-thread default stream).
    fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, stream: *mut c_void) -> pool |h: &Hook| h.current_pool();
}
pool_alloc_export! {
    /// `cuMemAllocFromPoolAsync`: from `pool`.
    fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: *mut c_void) -> pool |_: &Hook| pool as u64;
}
pool_alloc_export! {
    /// `cuMemAllocFromPoolAsync_ptsz`.
    fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytes: usize, pool: *mut c_void, stream: *mut c_void) -> pool |_: &Hook| pool as u64;
}

/// `cuMemPoolTrimTo`: the pool gives memory back to the device, so the pools are settled after it.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, keep: usize) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemPoolTrimTo);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(pool, keep) };
        if r == CUDA_SUCCESS {
            h.settle();
        }
        r
    })
}

/// `cuMemPoolDestroy`: the pool's memory no allocation uses goes back to the device.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemPoolDestroy(pool: *mut c_void) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemPoolDestroy);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(pool) };
        if r == CUDA_SUCCESS {
            let back = h.pools.lock().destroyed(pool as u64);
            if let (Some((dev, credit)), Ok(slot)) = (back, h.slot()) {
                h.ledger.release(slot, dev, credit);
            }
        }
        r
    })
}

/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h `CUmemLocationType`): the location's id is a device
/// ordinal. The other types (`_HOST`, `_HOST_NUMA`, `_HOST_NUMA_CURRENT`) are the machine's RAM.
const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;

/// `cuMemCreate` (virtual memory management): physical memory at `prop->location`. On a device it
/// is charged to that device by the handle's size (mappings of it, cuMemMap, cost nothing more);
/// in host memory (NCCL's cuMem host buffers, HAMi-core#169) it is not the GPU's and passes through
/// uncharged, so it neither fills the slice nor fails.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    flags: u64,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemCreate);
        if handle.is_null() || prop.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: checked non-null; a CUmemAllocationProp starts with these fields.
        let location = unsafe { &*prop.cast::<MemAllocationProp>() };
        if location.location_type != CU_MEM_LOCATION_TYPE_DEVICE {
            // SAFETY: forwarding the caller's arguments.
            return unsafe { f(handle, size, prop, flags) };
        }
        let dev = h.device_of(location.location_id);
        // Held across the driver call: see crate::handles.
        let mut handles = h.handles.lock();
        // The handle is read once, as the driver wrote it: the caller's memory may change after.
        let mut made = 0;
        // SAFETY: forwarding the caller's arguments; `handle` is non-null and the driver wrote
        // it when it returned success.
        let r = h.allocate(dev, size as u64, Kind::Handle, || unsafe {
            cu(f(handle, size, prop, flags)).map(|()| {
                made = *handle;
                made
            })
        });
        if r == CUDA_SUCCESS {
            handles.created(made);
        }
        r
    })
}
alloc_export! {
    /// `cuArrayCreate_v2`: charged width x height x channels x element size from the descriptor.
    fn cuArrayCreate_v2(array: *mut *mut c_void, desc: *const ArrayDescriptor) -> kind Array, device current,
        // SAFETY: a null descriptor is charged nothing here and refused by the driver.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| array_bytes(d.width, d.height, 1, d.format, d.channels));
}
alloc_export! {
    /// `cuArray3DCreate_v2`: charged width x height x depth x channels x element size.
    fn cuArray3DCreate_v2(array: *mut *mut c_void, desc: *const Array3dDescriptor) -> kind Array, device current,
        // SAFETY: as cuArrayCreate_v2.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| array_bytes(d.width, d.height, d.depth, d.format, d.channels));
}

alloc_export! {
    /// `cuMipmappedArrayCreate`: charged the sum of its levels' sizes.
    fn cuMipmappedArrayCreate(array: *mut *mut c_void, desc: *const Array3dDescriptor, levels: c_uint) -> kind Array, device current,
        // SAFETY: as cuArrayCreate_v2.
        bytes unsafe { desc.as_ref() }.map_or(0, |d| mipmapped_bytes(d, levels));
}

/// `cuMemAllocPitch_v2`: reserves for the width rounded up to [`PITCH_ALIGN`], then corrects the
/// reservation to the pitch the driver chose (freeing the allocation if a larger pitch no longer fits).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: c_uint,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemAllocPitch_v2);
        if dptr.is_null() || pitch.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        let dev = try_cu!(h.device());
        let guess = (width.div_ceil(PITCH_ALIGN) * PITCH_ALIGN) as u64;
        let reserved = guess.saturating_mul(height as u64);
        let slot = try_cu!(h.reserve(dev, reserved));
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(dptr, pitch, width, height, element) };
        if r != CUDA_SUCCESS {
            h.ledger.release(slot, dev, reserved);
            return r;
        }
        // SAFETY: checked non-null; the driver wrote both on success.
        let (p, real) = unsafe { (*dptr, (*pitch as u64).saturating_mul(height as u64)) };
        if real < reserved {
            h.ledger.release(slot, dev, reserved - real);
        } else if real > reserved && h.reserve(dev, real - reserved).is_err() {
            h.ledger.release(slot, dev, reserved);
            if let Some(free) = h.real.cuMemFree_v2 {
                // SAFETY: freeing the allocation the driver just made.
                unsafe { free(p) };
            }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        h.remember(Kind::Ptr, p, dev, real);
        CUDA_SUCCESS
    })
}

free_export! {
    /// `cuMemFree_v2`.
    fn cuMemFree_v2(p: CUdeviceptr) -> kind Ptr;
}
free_export! {
    /// `cuMemFree` (CUDA 3.1 ABI).
    fn cuMemFree(p: u32) -> kind Ptr;
}
free_export! {
    /// `cuMemFreeAsync`.
    fn cuMemFreeAsync(p: CUdeviceptr, stream: *mut c_void) -> kind Ptr;
}
free_export! {
    /// `cuMemFreeAsync_ptsz`.
    fn cuMemFreeAsync_ptsz(p: CUdeviceptr, stream: *mut c_void) -> kind Ptr;
}
/// `cuMemRelease`: the handle's charge ends with its last reference, once it is no longer mapped
/// ([`crate::handles`]) and no descriptor exported for it is open ([`crate::shareable`]).
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemRelease(handle: u64) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemRelease);
        let mut handles = h.handles.lock();
        // SAFETY: forwarding the caller's argument.
        let r = unsafe { f(handle) };
        let free = r == CUDA_SUCCESS && handles.released(handle);
        drop(handles);
        if free {
            h.release_handle(handle);
        }
        r
    })
}

/// `cuMemMap`: a mapping holds its allocation's memory ([`crate::handles`]).
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemMap(
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemMap);
        let mut handles = h.handles.lock();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(ptr, size, offset, handle, flags) };
        let replaced = if r == CUDA_SUCCESS {
            handles.mapped(ptr, size as u64, handle)
        } else {
            None
        };
        drop(handles);
        if let Some(freed) = replaced {
            h.release_handle(freed);
        }
        r
    })
}

/// `cuMemUnmap`: the allocations whose handles were released and whose last mapping this was are
/// freed by the driver now, and their charge ends.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemUnmap);
        let mut handles = h.handles.lock();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(ptr, size) };
        let free = if r == CUDA_SUCCESS {
            handles.unmapped(ptr, size as u64)
        } else {
            Vec::new()
        };
        drop(handles);
        for handle in free {
            h.release_handle(handle);
        }
        r
    })
}

/// `cuMemRetainAllocationHandle`: the handle it hands out is one more reference, released by one
/// more `cuMemRelease` (NCCL frees its buffers this way).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut c_void,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemRetainAllocationHandle);
        let mut handles = h.handles.lock();
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(handle, addr) };
        if r == CUDA_SUCCESS && !handle.is_null() {
            // SAFETY: checked non-null; the driver wrote it.
            handles.retained(unsafe { *handle });
        }
        r
    })
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (cuda.h `CUmemAllocationHandleType`): the shareable
/// handle is an `int` file descriptor.
const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 1;

/// `cuMemExportToShareableHandle`: a descriptor exported for an allocation keeps its memory alive
/// after its release, so the hook notes it ([`crate::shareable`]).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    handle: u64,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemExportToShareableHandle);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(shareable, handle, handle_type, flags) };
        if r == CUDA_SUCCESS
            && handle_type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            && !shareable.is_null()
        {
            // SAFETY: checked non-null; for this type the driver wrote an int descriptor.
            let fd = unsafe { *shareable.cast::<c_int>() };
            if let Some(ino) = inode(fd) {
                h.shareable.lock().exported(handle, fd, ino);
            }
        }
        r
    })
}
free_export! {
    /// `cuArrayDestroy`.
    fn cuArrayDestroy(array: *mut c_void) -> kind Array;
}
free_export! {
    /// `cuMipmappedArrayDestroy`.
    fn cuMipmappedArrayDestroy(array: *mut c_void) -> kind Array;
}

/// `cuMemGetInfo_v2`: total = limit, free = limit - container usage, never above the real free.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemGetInfo_v2);
        // SAFETY: forwarding the caller's pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        let dev = try_cu!(h.device());
        // SAFETY: checked non-null; the driver just wrote both.
        unsafe {
            let (fr, t) = h.clamp_info(dev, *free as u64, *total as u64);
            (*free, *total) = (fr as usize, t as usize);
        }
        CUDA_SUCCESS
    })
}

/// `cuMemGetInfo` (CUDA 3.1 ABI, 32-bit sizes), as cuMemGetInfo_v2.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuMemGetInfo);
        // SAFETY: forwarding the caller's pointers.
        let r = unsafe { f(free, total) };
        if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
            return r;
        }
        let dev = try_cu!(h.device());
        // SAFETY: checked non-null; the driver just wrote both.
        unsafe {
            let (fr, t) = h.clamp_info(dev, u64::from(*free), u64::from(*total));
            (*free, *total) = (fr as c_uint, t as c_uint);
        }
        CUDA_SUCCESS
    })
}

/// `cuDeviceTotalMem_v2`: the limit when there is one.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    boundary(|| {
        let h = try_cu!(hook());
        let f = real_or!(h, cuDeviceTotalMem_v2);
        // SAFETY: forwarding the caller's arguments.
        let r = unsafe { f(bytes, dev) };
        if r == CUDA_SUCCESS && !bytes.is_null() {
            let idx = try_cu!(h.device_of(dev));
            if let Some(limit) = h.config.memory_limit.get(idx).copied().flatten() {
                // SAFETY: checked non-null; the driver just wrote it.
                unsafe { *bytes = (*bytes).min(limit as usize) };
            }
        }
        r
    })
}

fn grid(x: c_uint, y: c_uint, z: c_uint) -> u64 {
    u64::from(x) * u64::from(y) * u64::from(z)
}

launch_export! {
    /// `cuLaunchKernel`: metered and throttled.
    fn cuLaunchKernel(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchKernel_ptsz`.
    fn cuLaunchKernel_ptsz(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchCooperativeKernel`.
    fn cuLaunchCooperativeKernel(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchCooperativeKernel_ptsz`.
    fn cuLaunchCooperativeKernel_ptsz(func: *mut c_void, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint,
        shared: c_uint, stream: *mut c_void, params: *mut *mut c_void) -> blocks grid(gx, gy, gz);
}
launch_export! {
    /// `cuLaunchKernelEx` (CUDA 12.0): the grid comes from the launch configuration.
    fn cuLaunchKernelEx(config: *const LaunchConfig, func: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
        // SAFETY: a null configuration is charged one block here and refused by the driver.
        -> blocks unsafe { config.as_ref() }.map_or(1, |c| grid(c.grid[0], c.grid[1], c.grid[2]));
}
launch_export! {
    /// `cuLaunchKernelEx_ptsz`.
    fn cuLaunchKernelEx_ptsz(config: *const LaunchConfig, func: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void)
        // SAFETY: as cuLaunchKernelEx.
        -> blocks unsafe { config.as_ref() }.map_or(1, |c| grid(c.grid[0], c.grid[1], c.grid[2]));
}
launch_export! {
    /// `cuGraphLaunch`: one metered launch; its kernels' grids are not visible here, so it is charged
    /// [`GRAPH_BLOCKS`] for the core limit.
    fn cuGraphLaunch(exec: *mut c_void, stream: *mut c_void) -> blocks GRAPH_BLOCKS;
}
launch_export! {
    /// `cuGraphLaunch_ptsz`.
    fn cuGraphLaunch_ptsz(exec: *mut c_void, stream: *mut c_void) -> blocks GRAPH_BLOCKS;
}

/// Blocks a graph launch is charged: the graph's kernels are not enumerated (that would cost a walk
/// of the graph per launch), so it counts as one small grid.
const GRAPH_BLOCKS: u64 = 1;
