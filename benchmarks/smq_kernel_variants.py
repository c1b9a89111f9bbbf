#!/usr/bin/env python3
"""Kernel variants of the ``triton`` silu_mul_quant kernel, side by side with SGLang's DSV4 JIT kernel and a
same-bytes device copy, on every shape of ``benchmarks/silu_mul_quant.py`` (one GPU, one run).

Each variant is a :class:`~sglang_moe_plugins.plugins.triton_smq.tuning.KernelConfig` derived from the
default one (``choose_config``); see ``VARIANTS``. The JIT kernel and the variants are timed in SGLang's
layout where SGLang's kernel takes the shape (the case's layout elsewhere), with the method of
``silu_mul_quant.py`` (CUDA-graph replays of back-to-back calls over input sets larger than the L2), in
``--rounds`` rounds whose order alternates; each cell is the median over the rounds. Every variant's
output is first compared bit for bit with the default kernel's on fresh inputs. ``pdl_floor`` is an
empty kernel (``gdc_wait`` and ``gdc_launch_dependents`` only) on the default grid: what a PDL launch
chain costs by itself. Nothing is asserted; the result is ``smq_kernel_variants_<date>_<device>.json``.

Run on the GPU machine from the repository root (SGLang's JIT sources as for ``silu_mul_quant.py``)::

    PYTHONPATH=$PWD python3 benchmarks/smq_kernel_variants.py --out $OUT [--only NAME,...] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import statistics

import torch
import triton
import triton.language as tl

from sglang_moe_plugins.bench.provenance import write_result
from sglang_moe_plugins.bench.smq_cases import CASES, Case, copy_bytes, floor_us, input_sets, masked_counts, warm_job
from sglang_moe_plugins.bench.smq_measure import bit_identical, parallel_warm
from sglang_moe_plugins.bench.smq_paths import Paths
from sglang_moe_plugins.bench.smq_run import burn_in, load_host_kernels
from sglang_moe_plugins.bench.timing import copy_bandwidth, graph_time_us, l2_bytes, round_orders
from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs
from sglang_moe_plugins.plugins.triton_smq.tuning import KernelConfig, choose_config, item_bound, row_bound
from sglang_moe_plugins.testing.case import poison

ROOT = pathlib.Path(__file__).resolve().parents[1]
JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"


def variants(case: Case) -> dict[str, KernelConfig]:
    """The configurations timed on ``case`` (run H, 2026-12-02; earlier runs' variants are in their results'
    ``configs``): at E <= 64 decode sizes, the default against two-warp programs (``nw2``: the same items,
    up to 32 per SM) and, where the items are 512 columns wide, one-row items of 1024 columns
    (``bm1_bc1024``) and 2048-element items on 8 warps (``nw8_bm4``); elsewhere the default only."""
    base = choose_config(case.E, case.N, case.D, case.gs, case.topk)
    r = dataclasses.replace
    out = {"default": base}
    if case.E > 64 or row_bound(case.E, case.N, case.topk) > 2048:
        return out
    out["nw2"] = r(base, num_warps=2, ctas_per_sm=32)
    if base.block_c == 512:
        out["bm1_bc1024"] = r(
            base, block_m=1, block_c=1024, max_programs=item_bound(case.E, case.N, case.D, 1, 1024, case.topk)
        )
        out["nw8_bm4"] = r(
            base, block_m=4, num_warps=8, max_programs=item_bound(case.E, case.N, case.D, 4, 512, case.topk)
        )
    return out


#: The cases ``--full-bound`` adds at their row bound: one per shape key whose benchmark rows are below it.
FULL_BOUND = {
    "DSV4-Flash EP8 prefill full",
    "DSV3 EP8 decode full",
    "DSV4-Pro EP8 decode ue8m0 full",
    "Qwen3-235B EP4 decode full",
}


def full_bound(case: Case) -> Case | None:
    """``case`` at the row bound of its shape key (``min(E * N, N * topk)`` rows), or None if it is there."""
    rows = row_bound(case.E, case.N, case.topk)
    return None if rows == case.rows else dataclasses.replace(case, name=f"{case.name} full", rows=rows)


@triton.jit
def _pdl_floor_kernel(x_ptr):
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--full-bound", action="store_true", help="also time each case at its shape key's row bound")
    ap.add_argument(
        "--case-layout", action="store_true", help="time in the case's layout (default: SGLang's where it runs)"
    )
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    if args.full_bound:
        cases += [f for f in map(full_bound, cases) if f is not None and f.name in FULL_BOUND]
    host, _ = load_host_kernels(JIT_ROOT, PREBUILT, cases, print) if JIT_ROOT.is_dir() else (None, None)
    jobs = [warm_job(c, dataclasses.asdict(k)) for c in cases for k in variants(c).values()]
    print(f"warm-up of {len(set(jobs))} specialisations: {parallel_warm(jobs):.1f}s", flush=True)
    from sglang_moe_plugins.bench.smq_measure import compare
    from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels
    from sglang_moe_plugins.plugins.triton_smq.launch import occupancy_records, plan_launch

    burn_in()
    bw, l2 = copy_bandwidth(), l2_bytes()
    paths = Paths(host)
    results = []
    for case in cases:
        m = masked_counts(case).cuda()
        rows = int(m.sum())
        fl = floor_us(case, rows, bw)
        layout = paths.jit_layout(case) if paths.jit_via(case) == "raw" and not args.case_layout else case.layout
        nsets = input_sets(case, fl, bw, l2)
        sets = [torch.randn(case.E, case.N, 2 * case.D, device="cuda").mul_(3).to(torch.bfloat16) for _ in range(nsets)]
        shape, config = paths.shape_config(sets[0], m, case, layout)
        outs = [allocate_outputs(shape, config, sets[0].device) for _ in sets]
        cfgs = variants(case)
        checks = {}
        ref = allocate_outputs(shape, config, sets[0].device)
        poison(ref)
        paths.run_triton(sets[0], m, ref, case, layout, kcfg=cfgs["default"])
        for name, k in cfgs.items():
            got = allocate_outputs(shape, config, sets[0].device)
            poison(got)
            paths.run_triton(sets[0], m, got, case, layout, kcfg=k)
            torch.cuda.synchronize()
            c = compare(ref, got, m, case.N, case.ue8m0)
            checks[name] = bit_identical(c)
        timed = {
            name: (lambda xs, o, k=k: paths.run_triton(xs, m, o, case, layout, kcfg=k)) for name, k in cfgs.items()
        }
        if paths.jit_via(case) == "raw":
            timed["sglang_jit"] = lambda xs, o: paths.run_jit(xs, m, o, case, "raw")
        plan = plan_launch(
            case.E,
            case.N,
            case.D,
            group_size=case.gs,
            scale_strides=outs[0].scale.stride(),
            swiglu_limit=case.limit,
            swizzle=case.swizzle,
            ue8m0=case.ue8m0,
            config=cfgs["default"],
            device_index=0,
            pointers=(sets[0], m, outs[0].out, outs[0].scale),
        )
        timed["pdl_floor"] = lambda xs, o: _pdl_floor_kernel[plan.grid](xs, launch_pdl=True)
        half = copy_bytes(case, rows)
        src = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        dst = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        times: dict[str, list[float]] = {n: [] for n in timed}
        times["copy_same_bytes"] = []
        with use_host_kernels(host) if host is not None else contextlib.nullcontext():
            for order in round_orders(list(timed), args.rounds):
                for name in order:
                    calls = [(lambda xs=xs, o=o, f=timed[name]: f(xs, o)) for xs, o in zip(sets, outs)]
                    times[name].append(graph_time_us(calls, target_ms=20.0))
                times["copy_same_bytes"].append(
                    graph_time_us([(lambda a=a, b=b: b.copy_(a)) for a, b in zip(src, dst)], target_ms=20.0)
                )
        med = {n: statistics.median(v) for n, v in times.items()}
        res = {
            "case": dataclasses.asdict(case),
            "rows": rows,
            "layout": layout,
            "floor_us": fl,
            "us": med,
            "rounds": times,
            "identical_to_default": checks,
            "grid": plan.grid[0],
            "configs": {n: dataclasses.asdict(k) for n, k in cfgs.items()},
            "occupancy": [list(v) for k, v in occupancy_records().items() if ("D", case.D) in k[-1]],
        }
        results.append(res)
        jit = med.get("sglang_jit")
        line = " ".join(f"{n}={v:.2f}" + (f"({jit / v:.3f}x)" if jit and n in cfgs else "") for n, v in med.items())
        print(f"{case.name}: {line} same={all(checks.values())}", flush=True)
        del sets, outs, src, dst
        torch.cuda.empty_cache()
    write_result(out, "smq_kernel_variants", results, copy_TBps=bw / 1e12)


if __name__ == "__main__":
    main()
