"""CuPy (cupy-cuda12x from PyPI; its CUDA runtime statically linked) through libvgpu.so: its
memory pools see the slice and run out at it. Run by tests/it/python.rs over the fake libcuda and
by tests/gpu/check.sh over a real driver, with a memory limit of CAP_MIB; prints `ok NAME` per
check, raises on the first failure.

usage: cupy_checks.py CAP_MIB
"""

import cupy

from checks import CAP, MIB, ok


def used():
    free, total = cupy.cuda.runtime.memGetInfo()
    assert total == CAP, f"memGetInfo total {total}, the slice is {CAP}"
    return CAP - free


def past_the_slice(nbytes):
    try:
        cupy.empty(nbytes, dtype=cupy.uint8)
    except cupy.cuda.memory.OutOfMemoryError:
        return
    raise AssertionError(f"{nbytes} bytes past the slice were allocated")


assert cupy.cuda.runtime.getDeviceCount() >= 1
assert used() == 0
ok("cupy-init")

# The default pool (cudaMalloc underneath): the slice, then OutOfMemoryError; freeing the pool's
# blocks gives the memory back to the slice.
pool = cupy.get_default_memory_pool()
a = cupy.empty(CAP - 100 * MIB, dtype=cupy.uint8)
assert used() >= CAP - 100 * MIB
past_the_slice(200 * MIB)
del a
pool.free_all_blocks()
assert used() == 0, used()
ok("cupy-pool")

# The stream-ordered pool (cudaMallocAsync from the device's current pool, which CuPy sets and
# whose release threshold it raises so freed memory stays in the pool, as its own pool does).
async_pool = cupy.cuda.MemoryAsyncPool()
cupy.cuda.set_allocator(async_pool.malloc)
b = cupy.empty(CAP - 100 * MIB, dtype=cupy.uint8)
past_the_slice(200 * MIB)
del b
cupy.cuda.Device().synchronize()
# The pool still holds the memory on the device (a new allocation from the pool reuses it), so
# the slice counts it until the pool gives it back.
async_pool.free_all_blocks()
assert used() == 0, used()
ok("cupy-async-pool")
