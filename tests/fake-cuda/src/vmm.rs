//! The virtual memory management API (what PyTorch's expandable segments and NCCL's cuMem paths
//! call): granularity, address reservations, mapping physical handles into them, access, and
//! physical memory on the host. `cuMemCreate` and `cuMemRelease` live beside the other allocators
//! in the crate root; this module keeps the address space and the host handles.

use crate::{state, try_cu, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_int, c_uint};

/// Allocation granularity, minimum and recommended: 2 MiB, what current NVIDIA GPUs report.
pub const GRANULARITY: u64 = 2 << 20;

/// `CU_MEM_LOCATION_TYPE_DEVICE` (cuda.h `CUmemLocationType`): `id` is a device ordinal. The host
/// types (`_HOST` 2, `_HOST_NUMA` 3, `_HOST_NUMA_CURRENT` 4) are memory in the machine's RAM.
pub const LOCATION_DEVICE: c_uint = 1;
const LOCATION_HOST: c_uint = 2;
const LOCATION_HOST_NUMA_CURRENT: c_uint = 4;

/// `CUmemAllocationProp` prefix: type, requested handle types, location {type, id}. The whole
/// struct is 32 bytes: then `win32HandleMetaData` and `allocFlags` (compression, RDMA, usage).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_uint,
    pub handle_types: c_uint,
    pub location_type: c_uint,
    pub location_id: c_int,
}

/// `CUmemAccessDesc`: location {type, id} and `CUmemAccess_flags`.
#[repr(C)]
pub struct MemAccessDesc {
    pub location_type: c_uint,
    pub location_id: c_int,
    pub flags: c_uint,
}

#[derive(Default)]
struct Space {
    /// Next address to reserve from.
    next: u64,
    /// Reservations: start -> size.
    reserved: BTreeMap<u64, u64>,
    /// Mappings: start -> (size, handle).
    mapped: BTreeMap<u64, (u64, u64)>,
    /// Live handles of host memory (`cuMemCreate` at a host location).
    host: HashSet<u64>,
    next_host: u64,
    /// Shareable handles: allocation key -> the descriptors exported for it (fd, inode).
    exports: HashMap<u64, Vec<(c_int, u64)>>,
    /// Released allocations an exported descriptor still keeps alive.
    lingering: Vec<u64>,
    /// Handles from cuMemImportFromShareableHandle: handle -> the allocation's key.
    imported: HashMap<u64, u64>,
    /// References `cuMemRetainAllocationHandle` added to an allocation, beyond its create.
    retained: HashMap<u64, u32>,
    /// Allocations whose every reference was released while mapped: alive until unmapped.
    unreferenced: HashSet<u64>,
    next_import: u64,
    /// The properties each `cuMemCreate` handle was made with, by allocation key.
    props: HashMap<u64, MemAllocationProp>,
}

static SPACE: Mutex<Option<Space>> = Mutex::new(None);

fn space<R>(f: impl FnOnce(&mut Space) -> R) -> R {
    let mut g = SPACE.lock();
    let s = g.get_or_insert_with(|| Space {
        next: 0x6000_0000_0000,
        next_host: 0x4000_0000_0000,
        ..Space::default()
    });
    f(s)
}

/// Whether `prop` names host memory; `Err` for a location type cuda.h does not define.
pub fn is_host(prop: &MemAllocationProp) -> Result<bool, CUresult> {
    match prop.location_type {
        LOCATION_DEVICE => Ok(false),
        LOCATION_HOST..=LOCATION_HOST_NUMA_CURRENT => Ok(true),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// A handle of `size` bytes of host memory ("size must be aligned to the granularity").
pub fn create_host(size: u64) -> Result<u64, CUresult> {
    if size == 0 || !size.is_multiple_of(GRANULARITY) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(space(|s| {
        s.next_host += size.max(GRANULARITY);
        s.host.insert(s.next_host);
        s.next_host
    }))
}

/// Keeps the properties allocation `key` was created with (`cuMemCreate`).
pub fn created(key: u64, prop: &MemAllocationProp) {
    space(|s| s.props.insert(key, *prop));
}

/// Releases a host handle; `false` when `handle` is none.
pub fn release_host(handle: u64) -> bool {
    space(|s| s.host.remove(&handle))
}

fn handle_live(handle: u64) -> bool {
    let (ours, released) = space(|s| {
        (
            s.host.contains(&handle) || s.imported.contains_key(&handle),
            s.unreferenced.contains(&handle) || s.lingering.contains(&handle),
        )
    });
    ours || (!released && state().is_ok_and(|st| st.allocations.contains_key(&handle)))
}

/// Whether allocation `key` is mapped anywhere.
fn is_mapped(s: &Space, key: u64) -> bool {
    s.mapped.values().any(|&(_, h)| h == key)
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (cuda.h `CUmemAllocationHandleType`): the shareable
/// handle is an `int` file descriptor. The only type the fake exports.
const HANDLE_TYPE_POSIX_FD: c_uint = 1;
/// `CUDA_ERROR_NOT_SUPPORTED`.
const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

/// The inode `fd` refers to, `None` when it is not open.
fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: fstat into a zeroed stat buffer; a closed descriptor is an error, not a fault.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// Whether an exported descriptor of allocation `key` is still open.
fn exported_open(s: &Space, key: u64) -> bool {
    s.exports
        .get(&key)
        .is_some_and(|fds| fds.iter().any(|&(fd, ino)| inode(fd) == Some(ino)))
}

/// A `cuMemRelease` of `handle`: `Some(result)` when this module answers it (an imported handle;
/// a reference `cuMemRetainAllocationHandle` added; an allocation still mapped, which lives until
/// unmapped; or one an exported descriptor keeps alive: cuda.h, "Once all shareable handles are
/// closed and the allocation is released, the allocated memory referenced will be released back
/// to the OS"), `None` when the caller frees the allocation now.
pub fn release(handle: u64) -> Option<CUresult> {
    space(|s| {
        if s.imported.remove(&handle).is_some() {
            return Some(CUDA_SUCCESS);
        }
        if s.unreferenced.contains(&handle) || s.lingering.contains(&handle) {
            return Some(CUDA_ERROR_INVALID_VALUE);
        }
        if let Some(n) = s.retained.get_mut(&handle) {
            *n -= 1;
            if *n == 0 {
                s.retained.remove(&handle);
            }
            return Some(CUDA_SUCCESS);
        }
        if is_mapped(s, handle) {
            s.unreferenced.insert(handle);
            return Some(CUDA_SUCCESS);
        }
        unheld(s, handle)
    })
}

/// An allocation with no reference and no mapping left: `Some` when an exported descriptor still
/// keeps it, `None` when it is to be freed now.
fn unheld(s: &mut Space, handle: u64) -> Option<CUresult> {
    if exported_open(s, handle) {
        s.lingering.push(handle);
        return Some(CUDA_SUCCESS);
    }
    s.exports.remove(&handle);
    None
}

/// The released allocations whose exported descriptors are all closed now: the caller frees them.
pub fn closed() -> Vec<u64> {
    space(|s| {
        let (gone, kept): (Vec<u64>, Vec<u64>) = std::mem::take(&mut s.lingering)
            .into_iter()
            .partition(|&k| !exported_open(s, k));
        s.lingering = kept;
        for k in &gone {
            s.exports.remove(k);
        }
        gone
    })
}

/// `cuMemExportToShareableHandle`: "Exports an allocation to a requested shareable handle type";
/// for `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` the shareable handle is a new file descriptor
/// (a memfd holding the allocation's key). Other types: CUDA_ERROR_NOT_SUPPORTED.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut std::ffi::c_void,
    handle: u64,
    handle_type: c_uint,
    flags: u64,
) -> CUresult {
    try_cu!(state().map(drop));
    if shareable.is_null() || flags != 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if handle_type != HANDLE_TYPE_POSIX_FD {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let key = space(|s| s.imported.get(&handle).copied()).unwrap_or(handle);
    if !handle_live(key) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: memfd_create with a constant name; the descriptor is the caller's to close.
    let fd = unsafe { libc::memfd_create(c"fake-cuda-shareable".as_ptr(), 0) };
    if fd < 0 {
        return crate::CUDA_ERROR_OUT_OF_MEMORY;
    }
    let bytes = key.to_le_bytes();
    // SAFETY: writing 8 bytes from a local buffer to the descriptor just made.
    let written = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
    let Some(ino) = inode(fd).filter(|_| written == 8) else {
        // SAFETY: closing the descriptor this call made.
        unsafe { libc::close(fd) };
        return crate::CUDA_ERROR_OUT_OF_MEMORY;
    };
    space(|s| s.exports.entry(key).or_default().push((fd, ino)));
    // SAFETY: checked non-null; a POSIX-descriptor shareable handle is an int.
    unsafe { *shareable.cast::<c_int>() = fd };
    CUDA_SUCCESS
}

/// `cuMemImportFromShareableHandle`: "Imports an allocation from a requested shareable handle
/// type"; the fake reads the allocation's key from the descriptor and hands out a new handle
/// naming it (releasing it releases only this handle).
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut std::ffi::c_void,
    handle_type: c_uint,
) -> CUresult {
    try_cu!(state().map(drop));
    if handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if handle_type != HANDLE_TYPE_POSIX_FD {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    let fd = os_handle as usize as c_int;
    let mut bytes = [0u8; 8];
    // SAFETY: reading 8 bytes into a local buffer from the caller's descriptor.
    if unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) } != 8 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let key = u64::from_le_bytes(bytes);
    let h = space(|s| {
        s.next_import = s.next_import.max(0x5555_0000_0000) + 0x10;
        s.imported.insert(s.next_import, key);
        s.next_import
    });
    // SAFETY: checked non-null.
    unsafe { *handle = h };
    CUDA_SUCCESS
}

/// `cuMemGetAllocationPropertiesFromHandle`: "Retrieve the contents of the property structure
/// defining properties for this handle" (an imported handle has its allocation's).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationPropertiesFromHandle(
    prop: *mut MemAllocationProp,
    handle: u64,
) -> CUresult {
    try_cu!(state().map(drop));
    if prop.is_null() || !handle_live(handle) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let found = space(|s| {
        let key = s.imported.get(&handle).copied().unwrap_or(handle);
        s.props.get(&key).copied()
    });
    let Some(found) = found else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: checked non-null; the caller passes a whole CUmemAllocationProp (32 bytes), whose
    // fields past the prefix the fake reports as zero (no metadata, no flags).
    unsafe {
        std::ptr::write_bytes(prop.cast::<u8>(), 0, 32);
        *prop = found;
    }
    CUDA_SUCCESS
}

/// `cuMemGetAllocationGranularity`: "Calculates either the minimal or recommended granularity"
/// for an allocation with `prop`.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(
    granularity: *mut usize,
    prop: *const MemAllocationProp,
    _option: c_uint,
) -> CUresult {
    let _s = try_cu!(state());
    if granularity.is_null() || prop.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a CUmemAllocationProp.
    try_cu!(is_host(unsafe { &*prop }));
    // SAFETY: checked non-null.
    unsafe { *granularity = GRANULARITY as usize };
    CUDA_SUCCESS
}

/// `cuMemAddressReserve`: "Reserves a virtual address range" of `size` bytes ("size must be a
/// multiple of the host page size" and, to be mapped, of the granularity), aligned to
/// `alignment` (0: the granularity); the requested `addr` is a hint the fake ignores.
#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(
    ptr: *mut u64,
    size: usize,
    alignment: usize,
    _addr: u64,
    _flags: u64,
) -> CUresult {
    let _s = try_cu!(state());
    let size = size as u64;
    if ptr.is_null() || size == 0 || !size.is_multiple_of(GRANULARITY) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let align = (alignment as u64).max(GRANULARITY);
    if !align.is_power_of_two() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let at = space(|s| {
        let at = s.next.div_ceil(align) * align;
        s.next = at + size + GRANULARITY;
        s.reserved.insert(at, size);
        at
    });
    // SAFETY: checked non-null.
    unsafe { *ptr = at };
    CUDA_SUCCESS
}

/// `cuMemAddressFree`: "Frees a virtual address range reserved by cuMemAddressReserve. The size
/// must match what was given to cuMemAddressReserve."
#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> CUresult {
    let _s = try_cu!(state());
    space(|s| match s.reserved.get(&ptr) {
        Some(&n) if n == size as u64 => {
            s.reserved.remove(&ptr);
            CUDA_SUCCESS
        }
        _ => CUDA_ERROR_INVALID_VALUE,
    })
}

/// Whether `[ptr, ptr + size)` lies in one reservation.
fn inside_reservation(s: &Space, ptr: u64, size: u64) -> bool {
    s.reserved
        .range(..=ptr)
        .next_back()
        .is_some_and(|(&at, &n)| ptr + size <= at + n)
}

/// `cuMemMap`: "Maps an allocation handle to a reserved virtual address range"; `offset` "currently
/// unused, must be zero", `flags` "for future use, must be zero"; the range must lie in a
/// reservation and not overlap another mapping.
#[no_mangle]
pub extern "C" fn cuMemMap(
    ptr: u64,
    size: usize,
    offset: usize,
    handle: u64,
    flags: u64,
) -> CUresult {
    try_cu!(state().map(drop));
    let size = size as u64;
    if size == 0
        || !size.is_multiple_of(GRANULARITY)
        || offset != 0
        || flags != 0
        || !handle_live(handle)
    {
        return CUDA_ERROR_INVALID_VALUE;
    }
    space(|s| {
        let overlaps = s
            .mapped
            .range(..ptr + size)
            .next_back()
            .is_some_and(|(&at, &(n, _))| at + n > ptr);
        if overlaps || !inside_reservation(s, ptr, size) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        s.mapped.insert(ptr, (size, handle));
        CUDA_SUCCESS
    })
}

/// The mapping containing `ptr`: its start and size.
pub fn mapping_at(ptr: u64) -> Option<(u64, u64)> {
    space(|s| {
        s.mapped
            .range(..=ptr)
            .next_back()
            .map(|(&at, &(n, _))| (at, n))
            .filter(|&(at, n)| ptr < at + n)
    })
}

/// `cuMemUnmap`: "Unmap the backing memory of a given address range"; the range must be one that
/// was mapped. "Any backing memory allocations will be freed if there are no existing mappings and
/// there are no unreleased memory handles."
#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CUresult {
    try_cu!(state().map(drop));
    let unmapped = space(|s| match s.mapped.get(&ptr) {
        Some(&(n, handle)) if n == size as u64 => {
            s.mapped.remove(&ptr);
            let free = !is_mapped(s, handle)
                && s.unreferenced.remove(&handle)
                && unheld(s, handle).is_none();
            Ok(free.then_some(handle))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    });
    match unmapped {
        Ok(Some(key)) => crate::free_ptr(key),
        Ok(None) => CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// `cuMemRetainAllocationHandle`: "Given an address addr, returns the allocation handle of the
/// backing memory allocation. The handle is guaranteed to be the same handle value used to map the
/// memory. If the address requested is not mapped, the function will fail. The returned handle
/// must be released with corresponding number of calls to cuMemRelease." The address may be any in
/// a mapped range.
#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(
    handle: *mut u64,
    addr: *mut std::ffi::c_void,
) -> CUresult {
    try_cu!(state().map(drop));
    if handle.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let addr = addr as u64;
    let found = space(|s| {
        let (_, &(_, h)) = s
            .mapped
            .range(..=addr)
            .next_back()
            .filter(|(&at, &(n, _))| addr < at + n)?;
        if !s.unreferenced.remove(&h) {
            *s.retained.entry(h).or_default() += 1;
        }
        Some(h)
    });
    let Some(h) = found else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    // SAFETY: checked non-null.
    unsafe { *handle = h };
    CUDA_SUCCESS
}

/// `cuMemSetAccess`: "Set the access flags for each location specified in desc for the given
/// virtual address range"; "The range must be a fully mapped address range containing all
/// allocations created by cuMemMap / cuMemCreate": it may span many mappings (PyTorch's expandable
/// segments set access on a whole segment of 2 MiB mappings at once), with no gap between them.
#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(
    ptr: u64,
    size: usize,
    desc: *const MemAccessDesc,
    count: usize,
) -> CUresult {
    let _s = try_cu!(state());
    if desc.is_null() || count == 0 || size == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let end = ptr.saturating_add(size as u64);
    space(|s| {
        // The mapping holding `ptr`, then each one starting where the previous ended.
        let Some((&first, &(n, _))) = s.mapped.range(..=ptr).next_back() else {
            return CUDA_ERROR_INVALID_VALUE;
        };
        let mut covered = first + n;
        if covered <= ptr {
            return CUDA_ERROR_INVALID_VALUE;
        }
        while covered < end {
            match s.mapped.get(&covered) {
                Some(&(n, _)) => covered += n,
                None => return CUDA_ERROR_INVALID_VALUE,
            }
        }
        CUDA_SUCCESS
    })
}
