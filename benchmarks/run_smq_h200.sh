#!/usr/bin/env bash
# One device call (H200): the silu_mul_quant benchmark, a repeat of five shapes, the kernel-variant run, the
# MegaMoE pre-dispatch benchmark, the triton GPU tests and the long CUDA fuzz, as behind docs/triton-kernel.md's
# v9 table (2026-12-02). Needs .whl/ (apache-tvm-ffi,
# sgl-deep-gemm cp312) and .device/ (the sglang wheel's JIT sources under .device/sgl_jit, modules prebuilt
# under .device/sgl_prebuilt: `benchmarks/silu_mul_quant.py --compile-host` and `tests/gpu/run_long_fuzz.py
# --compile-host` on a CPU machine with nvcc) carried. Usage: GIT_COMMIT=<sha> SEED=<n> bash benchmarks/run_smq_h200.sh
# Variant sweeps: `python3 benchmarks/smq_kernel_variants.py --out $OUT [--only ...]` after sourcing gpu_env.sh.
set -u
export OUT=${OUT:-/tmp/o}
T0=$(date +%s)
source tests/gpu/gpu_env.sh
mkdir -p "$OUT/bench" "$OUT/bench2" "$OUT/var" "$OUT/fuzz"
timeout 300 python3 benchmarks/silu_mul_quant.py --out "$OUT/bench" > "$OUT/bench/stdout.txt" 2>&1
echo "bench rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout 150 python3 benchmarks/silu_mul_quant.py --out "$OUT/bench2" \
  --only "Mixtral EP1 prefill,DSV4-Pro EP8 prefill ue8m0,Qwen3-235B EP4 decode,DSV4-Pro EP8 decode ue8m0,Qwen3-Next EP1 decode" \
  > "$OUT/bench2/stdout.txt" 2>&1
echo "bench2 rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout 150 python3 benchmarks/smq_kernel_variants.py --out "$OUT/var" --full-bound > "$OUT/var/stdout.txt" 2>&1
echo "variants rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
mkdir -p "$OUT/mega"
timeout 150 python3 benchmarks/mega_pre_dispatch.py --no-sweep --jit-root .device/sgl_jit/sglang/kernels/jit \
  --out "$OUT/mega" > "$OUT/mega/stdout.txt" 2>&1
echo "mega_pre_dispatch rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider -n 6 tests/gpu/test_triton_silu_mul_quant.py \
  tests/gpu/test_cuda_graphs.py tests/gpu/test_bad_inputs_cuda.py > "$OUT/tests_triton.txt" 2>&1
echo "tests rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
SGL_JIT_ROOT=$PWD/.device/sgl_jit/sglang/kernels/jit timeout 150 python3 tests/gpu/run_long_fuzz.py \
  --seed "${SEED:-20261203}" --shards 14 --out "$OUT/fuzz/fuzz.json" > "$OUT/fuzz.log" 2>&1
echo "fuzz rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
# the device tool returns a limited number of files: one archive
cd "$OUT" && tar czf all.tgz bench bench2 var mega tests_triton.txt times.txt env.txt fuzz fuzz.log && rm -rf bench bench2 var mega fuzz
