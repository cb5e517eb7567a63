"""One run of the GPU check (see check.sh): prints one JSON line with what the process saw.

Run under LD_PRELOAD=libvgpu.so with CUDA_DEVICE_MEMORY_LIMIT / CUDA_DEVICE_SM_LIMIT set, or without
the hook for the baseline.
"""
import json
import sys
import time

import torch


def matmul_tflops(seconds):
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    # Warm up, and give the core limit's controller time to settle (it converges within 2 s).
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        a @ b
        torch.cuda.synchronize()
    done = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        done += 10
    elapsed = time.monotonic() - start
    return done * 2 * n**3 / elapsed / 1e12


def main():
    out = {}
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info"] = {"free": free, "total": total}
    try:
        x = torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
        out["oom_5g"] = False
        del x
    except torch.cuda.OutOfMemoryError:
        out["oom_5g"] = True
    torch.cuda.empty_cache()
    out["matmul_tflops"] = matmul_tflops(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
