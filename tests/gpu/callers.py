"""The frameworks' allocation paths under libvgpu.so on a real GPU (run by check.sh with
CUDA_DEVICE_MEMORY_LIMIT=CAP_MIB m): each subcommand prints one `PASS name` or `FAIL name: why` line
per check. These are what the suite cannot run over the fake driver (CuPy's kernels, which need
NVRTC and the CUDA headers; NCCL: docs/runtime-hook.md, Real callers); the CUDA runtime's, CuPy's
and PyTorch's paths are tests/python's, run here too.

usage: callers.py CAP_MIB cupy-kernels|nccl-rank RANK WORLD
"""
import sys

MIB = 1 << 20
CAP = int(sys.argv[1]) * MIB


def report(name, ok, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)


def cupy_kernels():
    # The allocation paths are tests/python/cupy_checks.py's; a real GPU adds the kernels.
    import cupy as cp
    y = cp.ones(CAP // 2, dtype=cp.uint8)
    report("CuPy kernels run within the slice", int(y.sum()) == CAP // 2)


def nccl_rank(rank, world):
    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl", rank=rank, world_size=world)
    t = torch.full((1 << 20,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    report(f"NCCL all-reduce rank {rank} of {world}", float(t[0]) == want, float(t[0]))
    dist.destroy_process_group()


if __name__ == "__main__":
    what = sys.argv[2]
    if what == "cupy-kernels":
        cupy_kernels()
    elif what == "nccl-rank":
        nccl_rank(int(sys.argv[3]), int(sys.argv[4]))
