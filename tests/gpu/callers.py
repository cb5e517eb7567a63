"""The frameworks' allocation paths under libvgpu.so on a real GPU (run by check.sh with
CUDA_DEVICE_MEMORY_LIMIT=CAP_MIB m): each subcommand prints one `PASS name` or `FAIL name: why` line
per check. Over the fake driver these cannot run (the CUDA runtime needs the driver's undocumented
export tables: tests/it/python.rs), so a real GPU is their only proof.

usage: callers.py CAP_MIB runtime|cupy|torch|nccl-rank RANK WORLD
"""
import os
import sys

MIB = 1 << 20
CAP = int(sys.argv[1]) * MIB


def report(name, ok, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)


def runtime():
    from cuda.bindings import runtime as rt
    err, free, total = rt.cudaMemGetInfo()
    report("cudart cudaMemGetInfo total is the slice", total == CAP, f"{err} {total}")
    err, p = rt.cudaMalloc(CAP - 64 * MIB)
    report("cudart cudaMalloc within the slice", err == rt.cudaError_t.cudaSuccess, err)
    err2, _ = rt.cudaMalloc(128 * MIB)
    report("cudart cudaMalloc past the slice fails", err2 == rt.cudaError_t.cudaErrorMemoryAllocation, err2)
    rt.cudaFree(p)
    err, stream = rt.cudaStreamCreate()
    err, q = rt.cudaMallocAsync(CAP - 64 * MIB, stream)
    err2, _ = rt.cudaMallocAsync(128 * MIB, stream)
    report("cudart cudaMallocAsync past the slice fails", err == rt.cudaError_t.cudaSuccess
           and err2 == rt.cudaError_t.cudaErrorMemoryAllocation, f"{err} {err2}")
    rt.cudaFreeAsync(q, stream)
    rt.cudaStreamSynchronize(stream)


def cupy():
    import cupy as cp
    free, total = cp.cuda.runtime.memGetInfo()
    report("CuPy memGetInfo total is the slice", total == CAP, total)
    try:
        x = cp.empty(CAP + 64 * MIB, dtype=cp.uint8)
        report("CuPy allocation past the slice raises OutOfMemoryError", False, "it allocated")
        del x
    except cp.cuda.memory.OutOfMemoryError:
        report("CuPy allocation past the slice raises OutOfMemoryError", True)
    y = cp.ones(CAP // 2, dtype=cp.uint8)
    report("CuPy allocation within the slice", int(y.sum()) == CAP // 2)


def torch_allocator():
    import torch
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")
    free, total = torch.cuda.mem_get_info()
    report(f"PyTorch ({conf}) mem_get_info total is the slice", total == CAP, total)
    try:
        x = torch.empty(CAP + 64 * MIB, dtype=torch.uint8, device="cuda")
        report(f"PyTorch ({conf}) past the slice raises OutOfMemoryError", False, "it allocated")
        del x
    except torch.cuda.OutOfMemoryError:
        report(f"PyTorch ({conf}) past the slice raises OutOfMemoryError", True)
    xs = [torch.ones(64 * MIB, dtype=torch.uint8, device="cuda") for _ in range(CAP // (128 * MIB))]
    report(f"PyTorch ({conf}) half the slice in 64 MiB tensors", len(xs) > 0)


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
    if what == "runtime":
        runtime()
    elif what == "cupy":
        cupy()
    elif what == "torch":
        torch_allocator()
    elif what == "nccl-rank":
        nccl_rank(int(sys.argv[3]), int(sys.argv[4]))
