#!/usr/bin/env bash
# One H200, one call: DeepGEMM's real SM90 MegaMoE (sgl-deep-gemm 0.1.5.post1) under this project.
#   1. the reference-vs-kernel residue study (tests/gpu/mega_sm90_residue.py)   } in parallel
#   2. the GPU tests (tests/gpu/test_mega_deepgemm_sm90.py, 4 xdist workers)     } (JIT builds are CPU-bound)
#   3. the benchmark (benchmarks/mega_moe.py), alone on the GPU
# Needs the wheels in .whl/ (sgl-deep-gemm 0.1.5.post1, apache-tvm-ffi 0.1.11, cp312). Set GIT_COMMIT (or
# SGLANG_MOE_PLUGINS_COMMIT) to the commit of the copied tree: it is recorded in env.txt and the benchmark
# JSON (a copied tree's .git may be an older base). Writes at most
# 8 files to $OUT: env.txt residue.txt residue.json tests.txt bench.txt mega_moe_sm90.json mega_moe_sm90.md
# summary.txt. Budget: under 9 minutes (timeouts: 330 s for 1, 250 s for 2 (parallel to 1), 150 s for 3).
set -u
OUT=${OUT:-/tmp/mega_sm90_out}
mkdir -p "$OUT"
T0=$(date +%s)
source "$(dirname "$0")/gpu_env.sh"

timeout 330 python3 tests/gpu/mega_sm90_residue.py --out "$OUT/residue.json" > "$OUT/residue.txt" 2>&1 &
RES_PID=$!
XDIST=""
python3 -c "import xdist" 2>/dev/null && XDIST="-n 4"
timeout 250 python3 -m pytest -v -rfE -p no:cacheprovider $XDIST --durations=15 tests/gpu/test_mega_deepgemm_sm90.py > "$OUT/tests.txt" 2>&1
TESTS_RC=$?
wait $RES_PID
RES_RC=$?
T1=$(date +%s)
timeout 150 python3 benchmarks/mega_moe.py --out "$OUT" > "$OUT/bench.txt" 2>&1
BENCH_RC=$?
T2=$(date +%s)
{
  echo "residue rc=$RES_RC tests rc=$TESTS_RC bench rc=$BENCH_RC (124 = timed out)"
  echo "seconds: residue+tests $((T1 - T0)), bench $((T2 - T1)), total $((T2 - T0))"
  tail -3 "$OUT/tests.txt"
  grep -A12 '^| E, H, I' "$OUT/residue.txt"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
