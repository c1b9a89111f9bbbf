#!/usr/bin/env python3
"""Side-by-side benchmark of the ``silu_mul_quant`` paths on one GPU, in one run.

Times, per shape drawn from the model catalog (``sglang_moe_plugins.catalog``; EP 1/2/4/8, prefill and
decode row counts, uniform and skewed routing, with and without swiglu_limit, fp32 and UE8M0):

- ``triton``: this project's Triton plugin (``sglang_moe_plugins.plugins.triton_smq``);
- ``jit_ep``: SGLang 0.5.23's DSV4 JIT kernel ``silu_and_mul_masked_post_quant`` (through the
  ``jit_ep`` plugin when it exists in the tree, else the raw kernel), built from the wheel's sources;
- ``fp8_fallback``: SGLang's masked fused ``per_token_group_quant`` (through the ``fp8_fallback``
  plugin when it exists, else the raw kernel, on shapes without swiglu_limit);
- ``reference``: the torch oracle (a few shapes; it syncs on masked_m).

Each time is the median over CUDA-graph replays of back-to-back calls that rotate over enough input
sets to exceed the L2 cache, then over ``--rounds`` (3) rounds of alternating path order (decode shapes
also report a warm, single-set time). The floor is the bytes of real rows only (2D bf16 read + D fp8
+ scales written) over the measured device copy bandwidth; ``frac`` = floor / time. Every timed
kernel's output is first checked against the reference on fresh random inputs (poisoned outputs, every
real row written). The cases, paths, measurements and report live in ``sglang_moe_plugins.bench``
(``smq_cases``, ``smq_paths``, ``smq_measure``, ``smq_run``, ``report``).

Run on the GPU machine from the repository root::

    PYTHONPATH=.:/tmp/site python3 benchmarks/silu_mul_quant.py --out $OUT

``--sweep`` also times kernel configuration variants on key shapes (used to set the defaults);
``--compile-host DIR`` only compiles SGLang's modules (no GPU needed) into DIR to carry them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import traceback

import torch

from sglang_moe_plugins.bench.provenance import run_info
from sglang_moe_plugins.bench.smq_cases import CASES, SWEEP_CASES, needed_host_specs
from sglang_moe_plugins.bench.smq_measure import bench_case, parallel_warm, run_sweep
from sglang_moe_plugins.bench.smq_paths import Paths
from sglang_moe_plugins.bench.smq_run import burn_in, load_host_kernels, triton_eager_host_us, warm_jobs, write_results
from sglang_moe_plugins.bench.timing import copy_bandwidth

ROOT = pathlib.Path(__file__).resolve().parents[1]
JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--sweep", action="store_true", help="also time kernel configuration variants")
    ap.add_argument("--sweep-only", action="store_true", help="only the sweep (no table)")
    ap.add_argument("--sweep-cases", default="", help="comma-separated sweep case names (default: SWEEP_CASES)")
    ap.add_argument(
        "--sweep-set",
        default="1",
        choices=["1", "2", "3"],
        help="1: tiles x CTAs x prefetch; 2: register caps x waves; 3: prefetch x tiles x waves, "
        "with SGLang's kernel timed alongside",
    )
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--no-host", action="store_true", help="skip SGLang's kernels")
    ap.add_argument("--compile-host", default="", help="only compile SGLang's modules into this directory")
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per case, order alternating; median")
    args = ap.parse_args()

    if args.compile_host:
        from sglang_moe_plugins.bench.sglang_kernels import SglangJit

        dsv4, ptgq = needed_host_specs(CASES)
        for lib in SglangJit(JIT_ROOT, args.compile_host).compile_only(dsv4, ptgq, workers=args.workers):
            print(lib)
        return

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_lines.append(msg)

    props = torch.cuda.get_device_properties(0)
    device = f"{props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB)"
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    import triton

    log(f"device {device}, torch {torch.__version__}, triton {triton.__version__}, date {date}")
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    host = host_nopdl = None
    if not args.no_host and JIT_ROOT.is_dir():
        host, host_nopdl = load_host_kernels(JIT_ROOT, PREBUILT, cases, log)
    sweep_names = [n for n in args.sweep_cases.split(",") if n] or SWEEP_CASES
    if args.sweep_only:
        args.sweep, cases = True, []
    jobs = warm_jobs(cases, args.sweep, sweep_names, args.sweep_set)  # Triton compiles, in parallel processes
    log(f"triton warm-up of {len(jobs)} specialisations: {parallel_warm(jobs, args.workers):.1f}s")
    host_context = contextlib.ExitStack()
    if host is not None:  # the jit_ep / fp8_fallback plugins find SGLang's kernels through this override
        from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels

        host_context.enter_context(use_host_kernels(host))
    burn_in()
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s, L2 {l2 >> 20} MiB")
    paths = Paths(host, host_nopdl)
    log(
        "jit_ep / fp8_fallback columns: SGLang's kernels called as SGLang calls them (raw); the plugins where "
        f"the raw call cannot run the case (jit_ep plugin {'present' if paths.jit_plugin else 'absent'}, "
        f"fp8_fallback plugin {'present' if paths.fb_plugin else 'absent'}); jit_ep_plugin: through the jit_ep plugin"
    )

    sweep = run_sweep(paths, bw, l2, log, sweep_names, args.sweep_set) if args.sweep else []
    if args.sweep_only:
        (out / "sweep.json").write_text(
            json.dumps({"device": device, "date": date, "copy_TBps": bw / 1e12, "sweep": sweep}, indent=1, default=str)
        )
        return
    (out / "partial.json").write_text(json.dumps({"copy_TBps": bw / 1e12, "sweep": sweep}, default=str))
    results = []
    for case in cases:
        try:
            r = bench_case(case, paths, bw, l2, log, args.rounds)
        except Exception:
            log(f"{case.name}: FAILED\n{traceback.format_exc()}")
            continue
        results.append(r)
        brief = {k: (round(v["us"], 2), round(v["frac"], 3)) for k, v in r["paths"].items() if "us" in v}
        bad = {k: v for k, v in r["checks"].items() if not v.get("pass")}
        log(f"{case.name}: rows={r['rows']} floor={r['floor_us']:.2f}us {brief} checks_failed={list(bad)}")
        for k, v in bad.items():
            log(f"   {k}: {v}")
        (out / "partial.json").write_text(
            json.dumps({"copy_TBps": bw / 1e12, "sweep": sweep, "results": results}, default=str)
        )
    host_us = triton_eager_host_us(cases[0], paths, log) if cases else None
    meta = {
        "device": device,
        "date": date,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "run": run_info(),
        "copy_TBps": bw / 1e12,
        "l2_MiB": l2 >> 20,
        "host_kernels": None if host is None else host.source,
        "triton_eager_host_us": host_us,
    }
    stamp = f"{date}_{props.name.replace(' ', '-')}"
    table, summary = write_results(out, stamp, meta, bw, device, date, results, sweep, log)
    (out / "log.txt").write_text("\n".join(log_lines))
    (out / "partial.json").unlink(missing_ok=True)
    print(table)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
