"""The CUDA runtime (cudart, statically linked into cuda-bindings' runtime module, as into CuPy and
PyTorch) over the fake driver, through libvgpu.so. cudart asks the driver for internal function
tables (`cuGetExportTable`, undocumented) before anything else; the fake cannot provide them, so
the runtime reports cudaErrorSymbolNotFound at its first real call. This check pins that: the
version calls work, the first device call fails in exactly that way. On a real GPU
tests/gpu/check.sh runs the runtime's allocations through the hook instead.

usage: runtime_checks.py CAP_MIB
"""
import os

from cuda.bindings import runtime as rt

E = rt.cudaError_t
err, version = rt.cudaDriverGetVersion()
assert err == E.cudaSuccess and version == int(os.environ["FAKE_CUDA_DRIVER_VERSION"]), (err, version)
err, count = rt.cudaGetDeviceCount()
assert err == E.cudaErrorSymbolNotFound, err
err, *_ = rt.cudaMemGetInfo()
assert err == E.cudaErrorSymbolNotFound, err
print("ok runtime-stops-at-export-tables", flush=True)
