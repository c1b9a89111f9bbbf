#!/usr/bin/env bash
# One H200, one call: every single-GPU test file of tests/gpu (no SGLang on the machine; DeepGEMM's SM90
# MegaMoE from sgl-deep-gemm 0.1.5.post1) plus the CPU interpreter/specialisation tests, under xdist.
# Needs the wheels in .whl/ (sgl-deep-gemm 0.1.5.post1, apache-tvm-ffi 0.1.11, cp312; carry .whl). Set
# GIT_COMMIT to the commit of the copied tree (recorded in env.txt). Writes $OUT/env.txt, $OUT/tests.txt,
# $OUT/summary.txt. Budget: TESTS_TIMEOUT seconds (default 420) for the tests.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
T0=$(date +%s)
source "$(dirname "$0")/gpu_env.sh"
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n ${XDIST_WORKERS:-6}"
timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -rfE -p no:cacheprovider $XDIST --durations=10 \
  tests/gpu/test_triton_silu_mul_quant.py tests/gpu/test_cuda_graphs.py tests/gpu/test_mega_gpu.py \
  tests/gpu/test_mega_deepgemm_sm90.py tests/gpu/test_bad_inputs_cuda.py tests/gpu/test_fuzz_cuda.py \
  tests/test_mega_pre_dispatch_interpreter.py tests/test_triton_specialisation.py \
  > "$OUT/tests.txt" 2>&1
RC=$?
T1=$(date +%s)
{ echo "tests rc=$RC (124 = timed out), $((T1 - T0)) s"; tail -4 "$OUT/tests.txt"; } > "$OUT/summary.txt"
cat "$OUT/summary.txt"
