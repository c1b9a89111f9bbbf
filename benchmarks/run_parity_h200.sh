#!/usr/bin/env bash
# One device call (H200): the parity mode against SGLang 0.5.23's kernels (tests/gpu/test_parity_gpu.py), every
# catalog shape at N = 8 and 256. Carry .whl and .device. Writes $OUT/env.txt, $OUT/parity_tests.txt and
# $OUT/parity_numerics.txt. Usage: GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/run_parity_h200.sh [timeout_s]
set -u
export OUT=${OUT:-/tmp/o}
mkdir -p "$OUT"
T0=$(date +%s)
source tests/gpu/gpu_env.sh
export PYTHONUNBUFFERED=1 SGL_JIT_ROOT=$PWD/.device/sgl_jit/sglang/kernels/jit
timeout "${1:-400}" python3 -m pytest -q -p no:cacheprovider -rfE --tb=short -s tests/gpu/test_parity_gpu.py \
  > "$OUT/parity_tests.txt" 2>&1
echo "parity tests rc=$? $(( $(date +%s) - T0 )) s" | tee -a "$OUT/parity_tests.txt"
tail -n 5 "$OUT/parity_tests.txt"
grep -c "^PARITY" "$OUT/parity_numerics.txt" 2>/dev/null
