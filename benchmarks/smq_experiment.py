#!/usr/bin/env python3
"""Run I (issue 22): how work reaches the programs, timed side by side with the production kernel, SGLang's DSV4
JIT kernel and a same-bytes device copy, on every shape of ``benchmarks/silu_mul_quant.py`` (one GPU, one run).

The variants are launches of the experimental kernel in ``benchmarks/smq_exp_kernel.py`` (see its docstring):
``exp_default`` (the production assignment, the control), ``pack`` (decode: items on the first programs),
``act<ipp>m<min>`` (E <= 64 prefill: a grid for the row bound, whole waves of ``ipp`` items per program active
per call), ``dyn<k>`` (prefill: one resident wave, chunks of ``k`` items from an atomic counter), ``ev``
(gate/up loads ``evict_first``). Each is compared bit for bit with the production kernel's output (and the
counter must be back at zero after the run); times are medians of ``--rounds`` rounds of alternating order.
Nothing is asserted; the result is ``smq_experiment_<date>_<device>.json``.

Run on the GPU machine from the repository root (SGLang's JIT sources as for ``silu_mul_quant.py``)::

    PYTHONPATH=$PWD python3 benchmarks/smq_experiment.py --out $OUT [--only NAME,...] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import statistics

import torch

from benchmarks.smq_exp_kernel import smq_exp_kernel
from benchmarks.smq_kernel_variants import FULL_BOUND, full_bound
from sglang_moe_plugins.bench.provenance import write_result
from sglang_moe_plugins.bench.smq_cases import CASES, copy_bytes, floor_us, input_sets, masked_counts, warm_job
from sglang_moe_plugins.bench.smq_measure import bit_identical, compare, parallel_warm
from sglang_moe_plugins.bench.smq_paths import Paths
from sglang_moe_plugins.bench.smq_run import burn_in, load_host_kernels
from sglang_moe_plugins.bench.timing import copy_bandwidth, graph_time_us, l2_bytes, round_orders
from sglang_moe_plugins.ops.silu_mul_quant import allocate_outputs
from sglang_moe_plugins.plugins.triton_common import compile_specialisation
from sglang_moe_plugins.plugins.triton_smq.tuning import choose_config, item_bound, row_bound
from sglang_moe_plugins.quant import round_to_bf16
from sglang_moe_plugins.testing.case import poison

ROOT = pathlib.Path(__file__).resolve().parents[1]
JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"
_SHARED = (
    "D",
    "GS",
    "G",
    "GP",
    "BM",
    "BC",
    "NC",
    "BLOCK_E",
    "HAS_LIMIT",
    "SWIZZLE",
    "UE8M0",
    "EVEN_D",
    "USE_PDL",
    "IDLE_EXIT",
    "FRONT_LOAD",
    "num_warps",
    "num_stages",
    "launch_pdl",
)


def variants(case) -> dict[str, dict]:
    decode = row_bound(case.E, case.N, case.topk) <= 2048
    out: dict[str, dict] = {"exp_default": {}}
    if decode:
        out["pack"] = {"pack": True}
        return out
    out["ev"] = {"evict": True}
    out["dyn1"] = {"dynamic": 1}
    out["dyn2"] = {"dynamic": 2}
    if case.E <= 64:
        out["act17m3"] = {"active": (1.7, 3)}
        out["act25m3"] = {"active": (2.5, 3)}
    else:  # meant to cap dyn1 at 8 per SM; the DYNAMIC kernel holds 7-8, so run I launched dyn1's grid here
        out["dyn1_c8"] = {"dynamic": 1, "cap": 8}
    return out


#: act_div, act_min, wave where ACTIVE is off (not specialised, so any values compile the same kernel)
_IDLE_RUNTIME = (1, 0, 1)


def _dtypes(case):
    """The production kernel's four pointer dtypes, then the counter's."""
    from sglang_moe_plugins.plugins.triton_smq.launch import pointer_dtypes

    return (*pointer_dtypes(case.ue8m0), torch.int32)


def base_plan(case, strides):
    from sglang_moe_plugins.plugins.triton_smq.launch import plan_launch

    limit = None if case.limit is None else round_to_bf16(case.limit)
    return plan_launch(
        case.E,
        case.N,
        case.D,
        group_size=case.gs,
        scale_strides=strides,
        swiglu_limit=limit,
        swizzle=case.swizzle,
        ue8m0=case.ue8m0,
        config=choose_config(case.E, case.N, case.D, case.gs, case.topk),
        device_index=0,
        pointers=_dtypes(case)[:4],
    )


def exp_kwargs(plan, spec: dict) -> dict:
    kw = plan.kwargs_dict
    ek = {k: kw[k] for k in _SHARED if k in kw}
    ek.update(
        PACK_FIRST=bool(spec.get("pack")),
        ACTIVE=spec.get("active") is not None,
        DYNAMIC=int(spec.get("dynamic", 0)),
        EVICT=bool(spec.get("evict")),
    )
    if ek["DYNAMIC"]:
        ek["IDLE_EXIT"] = False
        ek["FRONT_LOAD"] = False
    return ek


def _compile_worker(jobs: list) -> int:
    for args, ek in jobs:
        compile_specialisation(smq_exp_kernel, args, dict(ek), 0)
    return len(jobs)


def exp_launch(case, spec: dict, plan, sms: int):
    """(grid, runtime, kwargs) of one experimental launch."""
    from sglang_moe_plugins.plugins.triton_smq.launch import resident_programs_per_sm

    ek = exp_kwargs(plan, spec)
    runtime = plan.runtime + _IDLE_RUNTIME
    compiled = compile_specialisation(smq_exp_kernel, _dtypes(case) + runtime, ek, 0)
    resident = resident_programs_per_sm(compiled, ek["num_warps"], 0)
    base = choose_config(case.E, case.N, case.D, case.gs, case.topk)
    if spec.get("dynamic"):
        wave = sms * min(spec.get("cap", 16), resident)
        return wave, runtime, ek, resident
    if spec.get("active") is not None:
        ipp, amin = spec["active"]
        wave = sms * min(base.ctas_per_sm, resident)
        items = item_bound(case.E, case.N, case.D, base.block_m, base.block_c, case.topk)
        waves = min(max(amin, round(items / ipp / wave)), 16)
        return waves * wave, (*plan.runtime, max(1, round(ipp * wave)), amin, wave), ek, resident
    return plan.grid[0], runtime, ek, resident


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    cases += [f for f in map(full_bound, cases) if f is not None and f.name in FULL_BOUND]
    host, _ = load_host_kernels(JIT_ROOT, PREBUILT, cases, print) if JIT_ROOT.is_dir() else (None, None)
    print(f"production warm-up: {parallel_warm([warm_job(c) for c in cases]):.1f}s", flush=True)
    paths = Paths(host)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layouts, plans, jobs = {}, {}, []
    for case in cases:
        layout = paths.jit_layout(case) if paths.jit_via(case) == "raw" else case.layout
        m = masked_counts(case).cuda()
        x = torch.empty(case.E, case.N, 2 * case.D, dtype=torch.bfloat16, device="cuda")
        shape, config = paths.shape_config(x, m, case, layout)
        strides = allocate_outputs(shape, config, x.device).scale.stride()
        plans[case.name] = base_plan(case, strides)
        layouts[case.name] = layout
        for spec in variants(case).values():
            jobs.append(
                (
                    _dtypes(case) + plans[case.name].runtime + _IDLE_RUNTIME,
                    tuple(exp_kwargs(plans[case.name], spec).items()),
                )
            )
        del x
    print(
        f"experimental warm-up of {len(jobs)} launches: {parallel_warm(jobs, worker=_compile_worker):.1f}s", flush=True
    )
    from sglang_moe_plugins.plugins.sglang_kernels.host import use_host_kernels

    burn_in()
    bw, l2 = copy_bandwidth(), l2_bytes()
    ctr = torch.zeros(2, dtype=torch.int32, device="cuda")
    results = []
    for case in cases:
        m = masked_counts(case).cuda()
        rows = int(m.sum())
        fl = floor_us(case, rows, bw)
        layout = layouts[case.name]
        nsets = input_sets(case, fl, bw, l2)
        sets = [torch.randn(case.E, case.N, 2 * case.D, device="cuda").mul_(3).to(torch.bfloat16) for _ in range(nsets)]
        shape, config = paths.shape_config(sets[0], m, case, layout)
        outs = [allocate_outputs(shape, config, sets[0].device) for _ in sets]
        specs = variants(case)
        launches = {n: exp_launch(case, s, plans[case.name], sms) for n, s in specs.items()}

        def run_exp(xs, o, n):
            grid, runtime, ek, _ = launches[n]
            smq_exp_kernel[(grid,)](xs, m, o.out, o.scale, ctr, *runtime, **ek)

        ref = allocate_outputs(shape, config, sets[0].device)
        poison(ref)
        paths.run_triton(sets[0], m, ref, case, layout)
        checks = {}
        for name in specs:
            got = allocate_outputs(shape, config, sets[0].device)
            poison(got)
            run_exp(sets[0], got, name)
            torch.cuda.synchronize()
            c = compare(ref, got, m, case.N, case.ue8m0)
            checks[name] = bit_identical(c) and ctr.tolist() == [0, 0]
        timed = {"production": lambda xs, o: paths.run_triton(xs, m, o, case, layout)}
        timed.update({n: (lambda xs, o, n=n: run_exp(xs, o, n)) for n in specs})
        if paths.jit_via(case) == "raw":
            timed["sglang_jit"] = lambda xs, o: paths.run_jit(xs, m, o, case, "raw")
        half = copy_bytes(case, rows)
        src = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        dst = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        timed["copy_same_bytes"] = None
        times: dict[str, list[float]] = {n: [] for n in timed}
        with use_host_kernels(host) if host is not None else contextlib.nullcontext():
            for order in round_orders(list(timed), args.rounds):
                for name in order:
                    if name == "copy_same_bytes":
                        calls = [(lambda a=a, b=b: b.copy_(a)) for a, b in zip(src, dst)]
                    else:
                        calls = [(lambda xs=xs, o=o, f=timed[name]: f(xs, o)) for xs, o in zip(sets, outs)]
                    times[name].append(graph_time_us(calls, target_ms=20.0))
        checks["counter_zero_after_timing"] = ctr.tolist() == [0, 0]
        med = {n: statistics.median(v) for n, v in times.items()}
        res = {
            "case": dataclasses.asdict(case),
            "rows": rows,
            "layout": layout,
            "floor_us": fl,
            "us": med,
            "rounds": times,
            "identical_to_production": checks,
            "launch": {
                n: {"grid": g, "runtime_tail": list(r[-3:]), "resident": res_}
                for n, (g, r, _, res_) in launches.items()
            },
        }
        results.append(res)
        cp, jit = med["copy_same_bytes"], med.get("sglang_jit")
        line = " ".join(
            f"{n}={v:.2f}"
            + (
                f"[c{cp / v:.3f}" + (f" j{jit / v:.3f}]" if jit else "]")
                if n not in ("copy_same_bytes", "sglang_jit")
                else ""
            )
            for n, v in med.items()
        )
        print(f"{case.name}: {line} ok={all(checks.values())}", flush=True)
        del sets, outs, src, dst
        torch.cuda.empty_cache()
    write_result(out, "smq_experiment", results, copy_TBps=bw / 1e12)


if __name__ == "__main__":
    main()
