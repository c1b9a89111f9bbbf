#!/usr/bin/env bash
# The device calls behind run I (docs/triton-kernel.md, "Run I"; 2026-12-02, H200): the experimental kernel's
# variants on every benchmark shape (three rounds), the decode shapes again in nine rounds (run I2), and Nsight
# Compute counters of the prefill launches of the production kernel and of SGLang's kernel where it takes the
# shape (results/smq_ncu_2026-12-02_NVIDIA-H200.csv). The steps' time limits add up to more than one 600 s device
# call: run I was `all` minus the others, run I2 `decode` and `ncu` in one call. `ncu-decode`: the counters of the decode
# launches, kernel v7's configuration beside the default (results/smq_ncu_decode_2026-12-02_NVIDIA-H200.csv).
# Needs .whl/ (apache-tvm-ffi, sgl-deep-gemm cp312) and .device/ (the sglang wheel's JIT sources under .device/sgl_jit,
# modules prebuilt under .device/sgl_prebuilt: `benchmarks/silu_mul_quant.py --compile-host` on a CPU machine with
# nvcc) carried. Usage: GIT_COMMIT=<sha> bash benchmarks/run_smq_experiment_h200.sh [all|decode|ncu|ncu-decode]
set -u
export OUT=${OUT:-/tmp/o}
T0=$(date +%s)
source tests/gpu/gpu_env.sh
mkdir -p "$OUT/x" "$OUT/d" "$OUT/n"
DEC="DSV4-Flash EP8 decode,DSV4-Flash EP8 decode ue8m0,DSV4-Flash EP8 decode 768,DSV3 EP8 decode,DSV4-Pro EP8 decode ue8m0"
DEC="$DEC,Qwen3-235B EP4 decode,Qwen3-30B EP1 decode,Qwen3-30B EP1 decode 16,Qwen3-Next EP1 decode"
PRE="DSV4-Flash EP8 prefill,DSV3 EP8 prefill,DSV4-Pro EP8 prefill ue8m0,GLM-4.5 EP8 prefill,OLMoE EP1 prefill"
PRE="$PRE,Qwen3-30B EP1 prefill,Qwen3.5-35B EP2 prefill,Qwen3-Next EP1 prefill 16k,Kimi-K2 EP8 prefill,Mixtral EP1 prefill"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers
M=$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active
M=$M,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__inst_executed.sum
M=$M,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,lts__t_sectors_op_write.sum
M=$M,smsp__cycles_active.avg.pct_of_peak_sustained_elapsed,dram__cycles_active.avg.pct_of_peak_sustained_elapsed
# the counters' CSV starts with one line of provenance (commit, device, driver, versions)
run_line() { python3 -c "import json; from sglang_moe_plugins.bench.provenance import run_info; print('# run:', json.dumps(run_info()))"; }
case "${1:-all}" in all)
  timeout 420 python3 benchmarks/smq_experiment.py --out "$OUT/x" > "$OUT/x/log.txt" 2>&1
  echo "run I rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt" ;;
esac
case "${1:-all}" in all|decode)
  timeout 200 python3 benchmarks/smq_experiment.py --out "$OUT/d" --rounds 9 --only "$DEC" > "$OUT/d/log.txt" 2>&1
  echo "run I2 rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt" ;;
esac
case "${1:-all}" in all|ncu)
  run_line > "$OUT/n/ncu.csv"
  timeout 300 ncu --clock-control none -k regex:silu --metrics "$M" --csv python3 benchmarks/smq_ncu_probe.py \
    --only "$PRE" >> "$OUT/n/ncu.csv" 2> "$OUT/n/ncu.err"
  echo "ncu rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt" ;;
esac
case "${1:-all}" in ncu-decode)
  NDEC="Qwen3-235B EP4 decode,DSV4-Pro EP8 decode ue8m0,DSV3 EP8 decode,DSV4-Flash EP8 decode"
  run_line > "$OUT/n/ncu_decode.csv"
  timeout 300 ncu --clock-control none -k regex:silu --metrics "$M" --csv python3 benchmarks/smq_ncu_probe.py --v7 \
    --only "$NDEC,Qwen3-30B EP1 decode 16,Qwen3-Next EP1 decode" >> "$OUT/n/ncu_decode.csv" 2> "$OUT/n/ncu_decode.err"
  echo "ncu-decode rc=$? $(( $(date +%s) - T0 )) s" >> "$OUT/times.txt" ;;
esac
cp "$OUT/env.txt" "$OUT/times.txt" "$OUT/x/"
# the device tool returns a limited number of files: one archive
cd "$OUT" && tar czf all.tgz x d n && rm -rf x d n
