"""PyTorch (torch from PyPI, its CUDA 13 wheels) through libvgpu.so: the caching allocator sees the
slice and runs out at it, with cudaMalloc segments or, under
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, segments grown by the virtual memory management
API (cuMemCreate and cuMemMap into one reservation). Run by tests/it/python.rs over the fake libcuda
and by tests/gpu/check.sh over a real driver, with a memory limit of CAP_MIB; prints `ok NAME` per
check, raises on the first failure.

usage: torch_checks.py CAP_MIB
"""

import os

import torch

from checks import CAP, MIB, ok

EXPANDABLE = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
NAME = "torch-expandable" if EXPANDABLE else "torch"


def used():
    free, total = torch.cuda.mem_get_info()
    assert total == CAP, f"mem_get_info total {total}, the slice is {CAP}"
    return CAP - free


assert torch.cuda.is_available()
assert used() == 0, used()
ok(f"{NAME}-init")

# The caching allocator keeps freed blocks; past the slice it frees its cache, retries, and raises
# OutOfMemoryError; empty_cache gives every block back to the slice.
a = torch.empty(CAP - 100 * MIB, dtype=torch.uint8, device="cuda")
assert used() >= CAP - 100 * MIB, used()
try:
    torch.empty(200 * MIB, dtype=torch.uint8, device="cuda")
except torch.cuda.OutOfMemoryError:
    pass
else:
    raise AssertionError(f"{200 * MIB} bytes past the slice were allocated")
del a
torch.cuda.empty_cache()
assert used() == 0, used()
ok(f"{NAME}-allocator")

# Kernels: PyTorch's own, linked into libtorch_cuda as fat binaries, load through the library API
# (cuLibraryLoadData, cuLibraryGetKernel) and launch through the hook's cuLaunchKernel.
x = torch.ones(1 << 20, device="cuda")
y = x * 2 + 1
torch.cuda.synchronize()
if not os.environ.get("FAKE_CUDA_DRIVER_VERSION"):
    # A real GPU ran them (the fake's kernels do no work).
    assert float(y.sum()) == 3 * x.numel(), float(y.sum())
del x, y
torch.cuda.empty_cache()
assert used() == 0, used()
ok(f"{NAME}-kernels")
