"""nvidia-ml-py (NVIDIA's NVML bindings, from PyPI) through libvgpu.so: the calls monitoring tools
make at start, and the memory they report, are the container's slice. Run by tests/it/python.rs
under the hook, over the fake libnvidia-ml and libcuda, and by tests/gpu/check.sh over a real
driver, with a memory limit of CAP_MIB; prints
`ok NAME` per check, raises on the first failure.

usage: nvml_checks.py CAP_MIB
"""
import ctypes
import os

import pynvml as nvml
from cuda.bindings import driver as cu

from checks import CAP, MIB, ok


nvml.nvmlInit()  # nvmlInitWithFlags(0)
assert nvml.nvmlSystemGetDriverVersion()
assert nvml.nvmlDeviceGetCount() >= 1
handle = nvml.nvmlDeviceGetHandleByIndex(0)  # nvmlDeviceGetHandleByIndex_v2
assert nvml.nvmlDeviceGetName(handle)
ok("nvml-init")

# Some of the slice in use, through the driver in this same process.
err, = cu.cuInit(0)[:1]
assert err == cu.CUresult.CUDA_SUCCESS, err
err, dev = cu.cuDeviceGet(0)
err, ctx = cu.cuDevicePrimaryCtxRetain(dev)
cu.cuCtxSetCurrent(ctx)
err, p = cu.cuMemAlloc(256 * MIB)
assert err == cu.CUresult.CUDA_SUCCESS, err

v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
assert (v1.total, v1.used, v1.free) == (CAP, 256 * MIB, CAP - 256 * MIB), (v1.total, v1.used, v1.free)
v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
assert (v2.total, v2.used, v2.free) == (CAP, 256 * MIB, CAP - 256 * MIB), (v2.total, v2.used, v2.free)
ok("nvml-memory")

# Process lists: with another tenant on the GPU (the fake's `otherTenantUtilization`, as
# tests/it/python.rs configures it), only this container's processes are listed.
procs = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]  # _v3
assert procs == [os.getpid()], f"processes listed {procs}, this process is {os.getpid()}"
ok("nvml-processes")

# The first ABI (nvmlProcessInfo_v1_t: pid and memory), still exported by the driver's library and
# looked up by its unversioned name, by PyTorch among others: the same list.
class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


count = ctypes.c_uint(8)
infos = (ProcessInfoV1 * 8)()
ret = nvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses")(
    handle, ctypes.byref(count), infos
)
assert ret == 0, ret
procs = [infos[i].pid for i in range(count.value)]
assert procs == [os.getpid()], f"processes listed {procs}, this process is {os.getpid()}"
ok("nvml-processes-v1")

cu.cuMemFree(p)
nvml.nvmlShutdown()
