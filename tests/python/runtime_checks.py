"""The CUDA runtime (cudart, statically linked into cuda-bindings' runtime module, as into CuPy and
PyTorch) through libvgpu.so: what a caller of the runtime sees of its slice on the paths it takes.
cudart reaches the driver through cuGetProcAddress and the driver's internal export tables; run by
tests/it/python.rs over the fake libcuda (which provides those tables) and by tests/gpu/check.sh
over a real driver, with a memory limit of CAP_MIB; prints `ok NAME` per check, raises on the
first failure.

usage: runtime_checks.py CAP_MIB
"""
import os

from cuda.bindings import runtime as rt

from checks import CAP, MIB, call, ok

E = rt.cudaError_t


def free_bytes():
    free, total = call(rt.cudaMemGetInfo())
    assert total == CAP, f"cudaMemGetInfo total {total}, the slice is {CAP}"
    return free


version = call(rt.cudaDriverGetVersion())
want = os.environ.get("FAKE_CUDA_DRIVER_VERSION")
assert version == int(want) if want else version >= 12000, version
assert call(rt.cudaGetDeviceCount()) >= 1
call(rt.cudaSetDevice(0))
props = call(rt.cudaGetDeviceProperties(0))
assert props.totalGlobalMem == CAP, f"cudaGetDeviceProperties totalGlobalMem {props.totalGlobalMem}"
assert free_bytes() == CAP
ok("runtime-init")

# cudaMalloc: the slice and not a byte more; cudaFree gives it back.
big = call(rt.cudaMalloc(CAP - 100 * MIB))
call(rt.cudaMalloc(200 * MIB), E.cudaErrorMemoryAllocation)
# cudart keeps the error for cudaGetLastError; clear it as a caller would.
rt.cudaGetLastError()
assert free_bytes() <= 100 * MIB
call(rt.cudaFree(big))
assert free_bytes() == CAP
ok("runtime-malloc")

# Stream-ordered allocation on a stream of the caller's: charged when made, credited once freed
# and the stream is synchronised.
stream = call(rt.cudaStreamCreate())
a = call(rt.cudaMallocAsync(CAP - 100 * MIB, stream))
call(rt.cudaMallocAsync(200 * MIB, stream), E.cudaErrorMemoryAllocation)
rt.cudaGetLastError()
call(rt.cudaFreeAsync(a, stream))
call(rt.cudaStreamSynchronize(stream))
assert free_bytes() == CAP
call(rt.cudaStreamDestroy(stream))
ok("runtime-malloc-async")

# Managed memory counts against the slice like device memory.
m = call(rt.cudaMallocManaged(CAP - 100 * MIB, rt.cudaMemAttachGlobal))
call(rt.cudaMalloc(200 * MIB), E.cudaErrorMemoryAllocation)
rt.cudaGetLastError()
call(rt.cudaFree(m))
assert free_bytes() == CAP
ok("runtime-managed")
