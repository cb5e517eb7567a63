"""NVIDIA's cuda-bindings driver module (from PyPI) through libvgpu.so: what a real caller sees of
its slice on every allocation path it takes. Run by tests/it/python.rs under the hook, over the
fake libcuda, and by tests/gpu/check.sh over a real driver, with a memory limit of CAP_MIB; prints `ok NAME` per check, raises on the first
failure (the traceback names it).

usage: driver_checks.py CAP_MIB
"""
import ctypes
import os

from cuda.bindings import driver as cu

from checks import CAP, MIB, call, ok

R = cu.CUresult


def free_bytes():
    free, total = call(cu.cuMemGetInfo())
    assert total == CAP, f"cuMemGetInfo total {total}, the slice is {CAP}"
    return free


call(cu.cuInit(0))
# Over the fake, the version it was told to claim; on a real GPU (tests/gpu/check.sh) the driver's.
version = call(cu.cuDriverGetVersion())
want = os.environ.get("FAKE_CUDA_DRIVER_VERSION")
assert version == int(want) if want else version >= 12000, version
dev = call(cu.cuDeviceGet(0))
ctx = call(cu.cuDevicePrimaryCtxRetain(dev))
call(cu.cuCtxSetCurrent(ctx))
assert int(call(cu.cuCtxGetCurrent())) == int(ctx)
ok("init")

name = call(cu.cuDeviceGetName(64, dev))
assert name.split(b"\0")[0], name
attr = cu.CUdevice_attribute
assert call(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)) >= 7
assert call(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)) == 1
assert call(cu.cuDeviceTotalMem(dev)) == CAP, "cuDeviceTotalMem shows the slice"
assert free_bytes() == CAP
ok("device")

# Linear memory: the slice and not a byte more.
big = call(cu.cuMemAlloc(CAP - 100 * MIB))
call(cu.cuMemAlloc(200 * MIB), R.CUDA_ERROR_OUT_OF_MEMORY)
assert free_bytes() == 100 * MIB
call(cu.cuMemFree(big))
assert free_bytes() == CAP
ok("cuMemAlloc")

# Streams and events.
stream = call(cu.cuStreamCreate(0))
start = call(cu.cuEventCreate(0))
end = call(cu.cuEventCreate(0))
call(cu.cuEventRecord(start, stream))
call(cu.cuEventRecord(end, stream))
call(cu.cuStreamSynchronize(stream))
assert call(cu.cuEventElapsedTime(start, end)) >= 0.0
call(cu.cuEventDestroy(start))
call(cu.cuEventDestroy(end))
ok("streams")

# Stream-ordered allocation: charged when made, credited when freed.
p = call(cu.cuMemAllocAsync(CAP - 24 * MIB, stream))
call(cu.cuMemAllocAsync(100 * MIB, stream), R.CUDA_ERROR_OUT_OF_MEMORY)
assert free_bytes() == 24 * MIB
call(cu.cuMemFreeAsync(p, stream))
call(cu.cuStreamSynchronize(stream))
assert free_bytes() == CAP
call(cu.cuStreamDestroy(stream))
call(cu.cuStreamSynchronize(stream), R.CUDA_ERROR_INVALID_HANDLE)
ok("cuMemAllocAsync")

# Memory pools: allocations from the default pool and from a pool the program makes are charged
# when made and credited when freed.
stream = call(cu.cuStreamCreate(0))
default_pool = call(cu.cuDeviceGetDefaultMemPool(dev))
props = cu.CUmemPoolProps()
props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
props.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
props.location.id = 0
own_pool = call(cu.cuMemPoolCreate(props))
threshold = cu.cuuint64_t(0)
call(cu.cuMemPoolSetAttribute(own_pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, threshold))
a = call(cu.cuMemAllocFromPoolAsync(CAP // 2, default_pool, stream))
b = call(cu.cuMemAllocFromPoolAsync(CAP // 2 - 8 * MIB, own_pool, stream))
call(cu.cuMemAllocFromPoolAsync(16 * MIB, own_pool, stream), R.CUDA_ERROR_OUT_OF_MEMORY)
assert free_bytes() == 8 * MIB
call(cu.cuMemFreeAsync(a, stream))
call(cu.cuMemFreeAsync(b, stream))
call(cu.cuStreamSynchronize(stream))
call(cu.cuMemPoolTrimTo(own_pool, 0))
call(cu.cuMemPoolDestroy(own_pool))
call(cu.cuStreamDestroy(stream))
assert free_bytes() == CAP
ok("pools")

# A pool keeps what is freed into it while its release threshold allows (cuda.h: memory above
# the threshold goes back at a synchronisation, or with cuMemPoolTrimTo). That memory is still the
# device's, so the slice counts it: with 600 MiB held by one pool, 600 MiB more from anywhere else
# is refused, and given back by a trim it is allocatable again. Over the fake, the device's own
# count (fakeCudaGetDeviceUsed) never passes the slice.
def physical_ok():
    if not os.environ.get("FAKE_CUDA_DRIVER_VERSION"):
        return  # a real GPU: the driver's count includes other processes and contexts
    used = ctypes.c_uint64(0)
    assert ctypes.CDLL("libcuda.so.1").fakeCudaGetDeviceUsed(0, ctypes.byref(used)) == 0
    assert used.value <= CAP, f"the device holds {used.value} bytes for a slice of {CAP}"


attr = cu.CUmemPool_attribute
stream = call(cu.cuStreamCreate(0))
keeping = call(cu.cuMemPoolCreate(props))
call(cu.cuMemPoolSetAttribute(keeping, attr.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1)))
big = CAP // 2 + 64 * MIB
p = call(cu.cuMemAllocFromPoolAsync(big, keeping, stream))
call(cu.cuMemFreeAsync(p, stream))
call(cu.cuStreamSynchronize(stream))
assert int(call(cu.cuMemPoolGetAttribute(keeping, attr.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT))) == big
call(cu.cuMemAlloc(big), R.CUDA_ERROR_OUT_OF_MEMORY)
call(cu.cuMemAllocAsync(big, stream), R.CUDA_ERROR_OUT_OF_MEMORY)
physical_ok()
# Reused from the same pool it costs nothing more.
p = call(cu.cuMemAllocFromPoolAsync(big, keeping, stream))
call(cu.cuMemFreeAsync(p, stream))
call(cu.cuMemPoolTrimTo(keeping, 0))
q = call(cu.cuMemAlloc(big))
physical_ok()
call(cu.cuMemFree(q))
# The default pool (threshold 0) gives its memory back at the synchronisation.
d = call(cu.cuMemAllocAsync(big, stream))
call(cu.cuMemFreeAsync(d, stream))
call(cu.cuStreamSynchronize(stream))
q = call(cu.cuMemAlloc(big))
physical_ok()
call(cu.cuMemFree(q))
call(cu.cuMemPoolDestroy(keeping))
call(cu.cuStreamDestroy(stream))
assert free_bytes() == CAP
ok("pool-reserve")

# Virtual memory management on the device: charged by the handle, capped.
prop = cu.CUmemAllocationProp()
prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
gran = call(cu.cuMemGetAllocationGranularity(
    prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
assert gran > 0 and CAP % gran == 0, gran
size = CAP // 2 + gran
handle = call(cu.cuMemCreate(size, prop, 0))
call(cu.cuMemCreate(size, prop, 0), R.CUDA_ERROR_OUT_OF_MEMORY)
va = call(cu.cuMemAddressReserve(2 * size, 0, 0, 0))
call(cu.cuMemMap(va, size, 0, handle, 0))
access = cu.CUmemAccessDesc()
access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
access.location.id = 0
access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
call(cu.cuMemSetAccess(va, size, [access], 1))
assert free_bytes() == CAP - size
call(cu.cuMemUnmap(va, size))
call(cu.cuMemRelease(handle))
call(cu.cuMemAddressFree(va, 2 * size))
assert free_bytes() == CAP
ok("vmm-device")

# cuda.h, cuMemRelease: "The memory allocation will be freed when all outstanding mappings to the
# memory are unmapped and when all outstanding references to the handle ... are also released".
# A handle released while mapped (CUDA's VMM samples release it right after cuMemMap) and one
# retained again (NCCL's free path) keep their memory, so they stay charged until unmapped.
handle = call(cu.cuMemCreate(size, prop, 0))
va = call(cu.cuMemAddressReserve(size, 0, 0, 0))
call(cu.cuMemMap(va, size, 0, handle, 0))
call(cu.cuMemRelease(handle))
assert free_bytes() == CAP - size, "released but mapped: the memory lives"
call(cu.cuMemCreate(size, prop, 0), R.CUDA_ERROR_OUT_OF_MEMORY)
physical_ok()
again = call(cu.cuMemRetainAllocationHandle(int(va) + gran))
assert int(again) == int(handle), (again, handle)
call(cu.cuMemRelease(again))
assert free_bytes() == CAP - size, "the retained reference released, still mapped"
call(cu.cuMemUnmap(va, size))
assert free_bytes() == CAP, "unmapped with no reference left: free"
call(cu.cuMemAddressFree(va, size))
ok("vmm-mapped")

# One access call over a segment of adjacent mappings, as PyTorch's expandable segments make
# (cuda.h, cuMemSetAccess: "The range must be a fully mapped address range containing all
# allocations created by cuMemMap / cuMemCreate").
va = call(cu.cuMemAddressReserve(2 * gran, 0, 0, 0))
pieces = [call(cu.cuMemCreate(gran, prop, 0)) for _ in range(2)]
for k, piece in enumerate(pieces):
    call(cu.cuMemMap(int(va) + k * gran, gran, 0, piece, 0))
call(cu.cuMemSetAccess(va, 2 * gran, [access], 1))
assert free_bytes() == CAP - 2 * gran
for k, piece in enumerate(pieces):
    call(cu.cuMemUnmap(int(va) + k * gran, gran))
    call(cu.cuMemRelease(piece))
call(cu.cuMemAddressFree(va, 2 * gran))
assert free_bytes() == CAP
ok("vmm-segments")

# An allocation exported as a file descriptor (NCCL's cuMem IPC between ranks): cuda.h keeps its
# memory until every descriptor is closed and the allocation is released, so it stays charged
# after cuMemRelease while the descriptor is open; an import (here, into the same process) is the
# exporter's memory, charged once.
POSIX_FD = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
prop.requestedHandleTypes = POSIX_FD
h = call(cu.cuMemCreate(size, prop, 0))
fd = int(call(cu.cuMemExportToShareableHandle(h, POSIX_FD, 0)))
h2 = call(cu.cuMemImportFromShareableHandle(fd, POSIX_FD))
assert free_bytes() == CAP - size
call(cu.cuMemRelease(h2))
assert free_bytes() == CAP - size
call(cu.cuMemRelease(h))
assert free_bytes() == CAP - size, "released, but the exported descriptor keeps the memory"
call(cu.cuMemCreate(size, prop, 0), R.CUDA_ERROR_OUT_OF_MEMORY)
physical_ok()
os.close(fd)
assert free_bytes() == CAP, "every descriptor closed and the allocation released: free"
h = call(cu.cuMemCreate(size, prop, 0))
call(cu.cuMemRelease(h))
ok("vmm-export")

# Host memory through the same API (NCCL's cuMem host path): not the GPU's, never charged.
host = cu.CUmemAllocationProp()
host.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
host.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST_NUMA
host.location.id = 0
h = call(cu.cuMemCreate(2 * CAP, host, 0))
assert free_bytes() == CAP, "host memory was charged to the GPU slice"
call(cu.cuMemRelease(h))
ok("vmm-host")

# Managed memory counts against the slice as well.
m = call(cu.cuMemAllocManaged(CAP - 10 * MIB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
call(cu.cuMemAllocManaged(20 * MIB, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value), R.CUDA_ERROR_OUT_OF_MEMORY)
call(cu.cuMemFree(m))
ok("managed")

# Device code: a module from PTX text, and a library (what the CUDA runtime loads the fat binaries
# linked into a program with), a kernel found by name in each and launched; memory operations
# on an allocation, which they must stay inside.
PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry vgpu_noop()
{
    ret;
}
\0"""
module = call(cu.cuModuleLoadData(PTX))
function = call(cu.cuModuleGetFunction(module, b"vgpu_noop"))
call(cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0))
library = call(cu.cuLibraryLoadData(PTX, None, None, 0, None, None, 0))
kernel = call(cu.cuLibraryGetKernel(library, b"vgpu_noop"))
function = call(cu.cuKernelGetFunction(kernel))
call(cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0))
call(cu.cuCtxSynchronize())
call(cu.cuLibraryUnload(library))
call(cu.cuModuleUnload(module))
buf = call(cu.cuMemAlloc(4 * MIB))
base, length = call(cu.cuMemGetAddressRange(int(buf) + 100))
assert (int(base), length) == (int(buf), 4 * MIB), (base, length)
call(cu.cuMemsetD32(buf, 7, MIB))
call(cu.cuMemsetD8Async(buf, 7, 4 * MIB, 0))
call(cu.cuCtxSynchronize())
call(cu.cuMemFree(buf))
assert free_bytes() == CAP
ok("modules")
