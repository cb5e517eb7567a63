#!/usr/bin/env bash
# GPU check for libvgpu.so on a machine with a real NVIDIA GPU, its driver, cargo and python3 with a
# CUDA build of PyTorch. Builds the hook, runs tests/gpu/check.py without it (baseline) and under it
# with a 4 GiB memory limit and gpucores 100, 50, 25; prints what PyTorch saw (mem_get_info, whether a
# 5 GiB allocation raised OOM, matmul throughput and its ratio to the baseline) and PASS/FAIL lines.
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
exit $fail
