#!/bin/bash
# contig_triton on the GPU machine, one device call: the GPU tests (three shards in parallel) then the activation
# benchmark (benchmarks/contig_activation.py). Usage, from the repository root, carrying .whl and .device:
#   OUT=... GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/run_contig_triton_h200.sh [test_timeout_s] [bench_timeout_s]
set -u
source tests/gpu/gpu_env.sh
T_TEST=${1:-150}
T_BENCH=${2:-230}
start=$(date +%s)
# SGLang modules the benchmark needs that are not prebuilt compile meanwhile (same build directory as the benchmark)
python3 benchmarks/contig_activation.py --prebuild-only --out /tmp/contig_prebuild_out > "$OUT/prebuild.log" 2>&1 &
PYTEST="python3 -m pytest -q -p no:cacheprovider -rfE --tb=short tests/gpu/test_contig_triton_gpu.py"
timeout "$T_TEST" $PYTEST -k "against_reference" > "$OUT/test_reference.txt" 2>&1 &
timeout "$T_TEST" $PYTEST -k "large_m or zero_rows or prepared or cuda_graph" > "$OUT/test_misc.txt" 2>&1 &
timeout "$T_TEST" $PYTEST -k "sglang" > "$OUT/test_sglang.txt" 2>&1 &
wait
echo "tests done after $(( $(date +%s) - start )) s" >> "$OUT/env.txt"
timeout "$T_BENCH" python3 benchmarks/contig_activation.py --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc $? after $(( $(date +%s) - start )) s" >> "$OUT/env.txt"
tail -n 12 "$OUT"/test_*.txt
tail -n 5 "$OUT/bench.log"

# at most 8 files come back: one archive, plus the markdown table
(cd "$OUT" && tar czf /tmp/contig_run.tgz . && find . -type f ! -name '*.md' -delete && mv /tmp/contig_run.tgz run.tgz)
