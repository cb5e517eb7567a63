#!/usr/bin/env bash
# GPU check for libvgpu.so on a machine with a real NVIDIA GPU, its driver, cargo and python3 with a
# CUDA build of PyTorch. Builds the hook, runs tests/gpu/check.py without it (baseline) and under it
# with a 4 GiB memory limit and gpucores 100, 50, 25; prints what PyTorch saw (mem_get_info, whether a
# 5 GiB allocation raised OOM, matmul throughput and its ratio to the baseline) and PASS/FAIL lines.
# Then the real callers under a 1024 MiB slice: NVIDIA's cuda-bindings driver checks
# (tests/python/driver_checks.py, also with the per-thread default stream) and nvidia-ml-py
# (tests/python/nvml_checks.py), the CUDA runtime, CuPy, PyTorch with and without expandable
# segments (the suite's scripts), CuPy's compiled kernels and an NCCL all-reduce between two
# processes on the one GPU (tests/gpu/callers.py, what only a GPU runs). A caller whose package is missing is reported and skipped.
# Exit status: 0 all passed, 1 a check failed, 2 the machine cannot run the check.
#
#   tests/gpu/check.sh            # from the repository root; MEASURE_S=5 sets the measured seconds
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
measure=${MEASURE_S:-5}

command -v nvidia-smi >/dev/null || { echo "check.sh: no nvidia-smi: not a GPU machine"; exit 2; }
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "check.sh: python3 cannot import torch with CUDA"; exit 2; }

cargo build --release -p vgpu-runtime-hook --manifest-path "$root/Cargo.toml"
target=${CARGO_TARGET_DIR:-$root/target}
hook=$target/release/libvgpu.so
[ -f "$hook" ] || { echo "check.sh: $hook not built"; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

echo "baseline (no hook):"
base=$(python3 "$root/tests/gpu/check.py" "$measure")
echo "  $base"

fail=0
check() { # name condition-status
  if [ "$2" = 0 ]; then echo "  PASS $1"; else echo "  FAIL $1"; fail=1; fi
}

for sm in 100 50 25; do
  echo "CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_SM_LIMIT=$sm:"
  run=$(LD_PRELOAD=$hook CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_SM_LIMIT=$sm \
        CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/acct-$sm" python3 "$root/tests/gpu/check.py" "$measure")
  echo "  $run"
  verdict=$(python3 - "$base" "$run" "$sm" <<'PY'
import json, sys
base, run, sm = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
ratio = run["matmul_tflops"] / base["matmul_tflops"]
total = run["mem_get_info"]["total"]
print(f"ratio {ratio:.3f}")
print("total", 0 if total == 4 << 30 else 1)
print("oom", 0 if run["oom_5g"] else 1)
# +-10 % of the limit's share of the baseline (100: no slowdown beyond 10 %).
print("throughput", 0 if abs(ratio - sm / 100) <= 0.1 * sm / 100 else 1)
PY
)
  echo "  matmul throughput $(echo "$verdict" | sed -n 1p) of the baseline (want $sm % +-10 %)"
  check "mem_get_info total is 4 GiB" "$(echo "$verdict" | awk '$1=="total"{print $2}')"
  check "5 GiB allocation raised OOM" "$(echo "$verdict" | awk '$1=="oom"{print $2}')"
  check "throughput ratio" "$(echo "$verdict" | awk '$1=="throughput"{print $2}')"
done

cap=1024
caller_env=(LD_PRELOAD="$hook" CUDA_DEVICE_MEMORY_LIMIT=${cap}m)
run_caller() { # name, command...: PASS/FAIL from the command's own lines and its exit status
  local name=$1; shift
  echo "$name:"
  if out=$(env "${caller_env[@]}" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/acct-$name" "$@" 2>&1); then
    echo "$out" | sed 's/^/  /'
    echo "$out" | grep -q '^FAIL' && fail=1
  else
    echo "$out" | tail -20 | sed 's/^/  /'
    echo "  FAIL $name (exit status)"; fail=1
  fi
}
has() { python3 -c "import $1" 2>/dev/null || { echo "$2: SKIPPED (python3 cannot import $1)"; return 1; }; }

if has cuda.bindings.driver cuda-bindings; then
  run_caller driver python3 "$root/tests/python/driver_checks.py" $cap
  caller_env+=(CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1)
  run_caller driver-ptds python3 "$root/tests/python/driver_checks.py" $cap
  unset 'caller_env[2]'
  run_caller runtime python3 "$root/tests/python/runtime_checks.py" $cap
fi
has pynvml nvidia-ml-py && run_caller nvml python3 "$root/tests/python/nvml_checks.py" $cap
if has cupy CuPy; then
  run_caller cupy python3 "$root/tests/python/cupy_checks.py" $cap
  run_caller cupy-kernels python3 "$root/tests/gpu/callers.py" $cap cupy-kernels
fi
run_caller torch python3 "$root/tests/python/torch_checks.py" $cap
caller_env+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
run_caller torch-expandable python3 "$root/tests/python/torch_checks.py" $cap
unset 'caller_env[2]'
# Two ranks on one GPU, each a process under the hook with its own slice; NCCL's cuMem paths
# (device and host) go through the hook's cuMemCreate.
echo "nccl (2 processes):"
port=$((29500 + RANDOM % 1000))
for r in 0 1; do
  env "${caller_env[@]}" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/acct-nccl" MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port timeout 120 python3 "$root/tests/gpu/callers.py" $cap nccl-rank $r 2 \
    >"$work/nccl-$r" 2>&1 &
done
wait || true
for r in 0 1; do
  sed 's/^/  /' "$work/nccl-$r" | tail -5
  grep -q '^PASS' "$work/nccl-$r" || { echo "  FAIL nccl rank $r"; fail=1; }
done
exit $fail
