#!/usr/bin/env bash
# One device call (H200): the silu_mul_quant benchmark, a repeat of four shapes, the triton GPU tests and the
# long CUDA fuzz, as behind docs/triton-kernel.md's v8 table (2026-12-02). Needs .whl/ (apache-tvm-ffi,
# sgl-deep-gemm cp312) and .device/ (the sglang wheel's JIT sources under .device/sgl_jit, modules prebuilt
# under .device/sgl_prebuilt: `benchmarks/silu_mul_quant.py --compile-host` and `tests/gpu/run_long_fuzz.py
# --compile-host` on a CPU machine with nvcc) carried. Usage: GIT_COMMIT=<sha> SEED=<n> bash benchmarks/run_smq_h200.sh
# Variant sweeps: `python3 benchmarks/smq_kernel_variants.py --out $OUT [--only ...]` after sourcing gpu_env.sh.
set -u
export OUT=${OUT:-/tmp/o}
T0=$(date +%s)
source tests/gpu/gpu_env.sh
mkdir -p "$OUT/bench" "$OUT/bench2" "$OUT/fuzz"
timeout 200 python3 benchmarks/silu_mul_quant.py --out "$OUT/bench" > "$OUT/bench/stdout.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout 60 python3 benchmarks/silu_mul_quant.py --out "$OUT/bench2" \
  --only "issue E=64 D=4096 limit,Mixtral EP1 prefill,OLMoE EP1 prefill,Qwen3-235B EP4 decode" > "$OUT/bench2/stdout.txt" 2>&1
echo "bench2 rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 6 tests/gpu/test_triton_silu_mul_quant.py \
  tests/gpu/test_cuda_graphs.py tests/gpu/test_bad_inputs_cuda.py > "$OUT/tests_triton.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
SGL_JIT_ROOT=$PWD/.device/sgl_jit/sglang/kernels/jit timeout 150 python3 tests/gpu/run_long_fuzz.py \
  --seed "${SEED:-20261202}" --shards 14 --out "$OUT/fuzz/fuzz.json" > "$OUT/fuzz.log" 2>&1
echo "fuzz rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
# the device tool returns a limited number of files: one archive
cd "$OUT" && tar czf all.tgz bench bench2 tests_triton.txt times.txt env.txt fuzz fuzz.log && rm -rf bench bench2 fuzz
