#!/usr/bin/env bash
# One device call (H200) after the compact-runner work: the GPU tests of the two SGLang-kernel contig plugins
# (tests/gpu/test_contig_sglang_gpu.py) and of contig_triton, then benchmarks/contig_e2e.py on the final tree.
# Carry .whl and .device. Usage: GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/run_contig_final_h200.sh [test_s] [e2e_s]
set -u
export OUT=${OUT:-/tmp/o}
T0=$(date +%s)
source tests/gpu/gpu_env.sh
export PYTHONUNBUFFERED=1 SGL_JIT_ROOT=$PWD/.device/sgl_jit/sglang/kernels/jit
mkdir -p "$OUT/e2e"
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short"
timeout "${1:-170}" $PYTEST tests/gpu/test_contig_sglang_gpu.py > "$OUT/test_contig_sglang.txt" 2>&1 &
timeout "${1:-170}" $PYTEST tests/gpu/test_contig_triton_gpu.py -k "against_reference or cuda_graph" > "$OUT/test_contig_triton.txt" 2>&1 &
wait
echo "tests $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
timeout "${2:-300}" python3 benchmarks/contig_e2e.py --warm-workers 8 --out "$OUT/e2e" > "$OUT/e2e/stdout.txt" 2>&1
echo "contig_e2e rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt"
tail -n 4 "$OUT"/test_*.txt
tail -n 30 "$OUT/e2e/stdout.txt"
cd "$OUT" && tar czf all.tgz e2e times.txt env.txt test_*.txt && rm -rf e2e
