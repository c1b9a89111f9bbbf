#!/usr/bin/env bash
# One device call (H200): benchmarks/contig_e2e.py, SGLang 0.5.23's MoE layer end to end, compact vs masked, stock vs
# package activation. Carry .whl/ (apache-tvm-ffi, sgl-deep-gemm cp312) and .device/ (the sglang wheel's JIT sources
# under .device/sgl_jit, its permute kernels' Python sources under .device/sgl_py (sglang_moe_host.copy_sources), and
# SGLang's JIT modules prebuilt under .device/sgl_prebuilt: `python3 benchmarks/contig_e2e.py --compile-host
# .device/sgl_prebuilt` on a CPU machine with nvcc).
# Usage: GIT_COMMIT=<sha> [ARGS="--quick --only 'V4-Flash TP4,V3'"] [LIMIT_S=420] bash benchmarks/run_contig_e2e_h200.sh
set -u
export OUT=${OUT:-/tmp/o}
T0=$(date +%s)
source tests/gpu/gpu_env.sh
mkdir -p "$OUT/e2e"
export PYTHONUNBUFFERED=1
eval "set -- ${ARGS:-}"
timeout "${LIMIT_S:-420}" python3 benchmarks/contig_e2e.py --out "$OUT/e2e" "$@" > "$OUT/e2e/stdout.txt" 2>&1
echo "contig_e2e rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
tail -n 60 "$OUT/e2e/stdout.txt"
cd "$OUT" && tar czf all.tgz e2e times.txt env.txt && rm -rf e2e
