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
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl > "$OUT/env.txt" 2>&1
# The copied checkout is not installed: publish its entry points (the built-in plugins) the way an
# installed copy would, or the registry finds no plugins (the SGLang hook tests need them).
rm -rf /tmp/di
PYTHONPATH=$PWD python3 benchmarks/checkout_dist_info.py /tmp/di >> "$OUT/env.txt" 2>&1
export PYTHONPATH=/tmp/site:/tmp/di:$PWD:$PWD/tests:$PWD/tests/gpu
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
COMMIT=${SGLANG_MOE_PLUGINS_COMMIT:-${GIT_COMMIT:-}}
[ -n "$COMMIT" ] || COMMIT="unknown (set GIT_COMMIT)"
export GIT_COMMIT="$COMMIT" SGLANG_MOE_PLUGINS_COMMIT="$COMMIT"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, deep_gemm; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('deep_gemm', deep_gemm.__version__, deep_gemm.__file__)"
  python3 -c "import triton; print('triton', triton.__version__)"
  python3 -c "import tvm_ffi; print('tvm_ffi', getattr(tvm_ffi, '__version__', '?'))"
  python3 -c "import importlib.metadata as m; print('entry points', sorted(e.name for e in m.entry_points(group='sglang_moe_plugins.kernels')))"
  echo "commit $GIT_COMMIT"
} >> "$OUT/env.txt" 2>&1

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
