"""PyTorch (torch from PyPI, with NVIDIA's CUDA runtime wheels) through libvgpu.so: its caching
allocator sees the slice and raises OutOfMemoryError at it, with and without expandable segments
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True maps memory with the driver's VMM API). Run by
tests/it/python.rs over the fake libcuda and by tests/gpu/check.sh over a real driver, with a
memory limit of CAP_MIB; prints `ok NAME` per check, raises on the first failure.

usage: torch_checks.py CAP_MIB
"""
import sys

import torch

MIB = 1 << 20
CAP = int(sys.argv[1]) * MIB


def ok(name):
    print("ok", name, flush=True)


def used():
    free, total = torch.cuda.mem_get_info()
    assert total == CAP, f"mem_get_info total {total}, the slice is {CAP}"
    return CAP - free


assert torch.cuda.is_available()
assert torch.cuda.device_count() >= 1
assert torch.cuda.get_device_properties(0).total_memory == CAP
assert used() == 0, used()
ok("torch-init")

a = torch.empty(CAP - 100 * MIB, dtype=torch.uint8, device="cuda")
assert used() >= CAP - 100 * MIB
try:
    torch.empty(200 * MIB, dtype=torch.uint8, device="cuda")
    raise AssertionError("200 MiB past the slice were allocated")
except torch.cuda.OutOfMemoryError:
    pass
del a
torch.cuda.empty_cache()
assert used() == 0, used()
ok("torch-allocator")
