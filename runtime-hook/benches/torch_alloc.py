"""PyTorch's allocation rate with and without libvgpu.so, the same fake or real driver underneath:
run once under the hook and once without, and compare (docs/BENCHMARKS.md, "Runtime hook: real
callers"). Prints one JSON line: tensors per second through the caching allocator's cache (no
driver call) and with `empty_cache()` after each (a cudaMalloc and cudaFree each, or with
expandable segments a cuMemCreate/cuMemMap and cuMemUnmap/cuMemRelease per 2 MiB).

usage: torch_alloc.py SECONDS [MIB]
"""
import json
import sys
import time

import torch

seconds = float(sys.argv[1])
nbytes = int(sys.argv[2] if len(sys.argv) > 2 else 64) << 20


def rate(trim):
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        del x
        if trim:
            torch.cuda.empty_cache()
        n += 1
    return n / (time.perf_counter() - start)


torch.cuda.init()
rate(True)  # warm up: cudart's and the hook's first calls
print(json.dumps({"cached_per_s": round(rate(False)), "uncached_per_s": round(rate(True))}))
