"""The measurements of ``benchmarks/silu_mul_quant.py``: each path checked against the reference on poisoned
outputs, then timed under CUDA graphs over rotated input sets; the configuration sweeps; the parallel Triton
warm-up that fills the compile cache first."""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import asdict

import torch

from ..ops.silu_mul_quant import SiluMulQuantInputs, SiluMulQuantOutputs, allocate_outputs, real_rows
from ..plugins.reference import silu_mul_quant_reference
from ..plugins.triton_smq.tuning import KernelConfig
from ..testing.case import POISON_FP8, POISON_SCALE_INT, poison
from .smq_cases import (
    CASES,
    REFERENCE_TIMED,
    Case,
    copy_bytes,
    floor_us,
    input_sets,
    masked_counts,
    sweep_variants,
    v7_config,
)
from .smq_paths import Paths
from .timing import graph_time_us, random_gateup, round_orders

__all__ = ["eager_time_us", "compare", "bit_identical", "bench_case", "parallel_warm", "run_sweep"]


def eager_time_us(fn: Callable[[], None], n: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def compare(ref: SiluMulQuantOutputs, got: SiluMulQuantOutputs, masked_m: torch.Tensor, N: int, ue8m0: bool) -> dict:
    """Bit-level comparison over real rows (reads only; both in the same layout)."""
    mask = real_rows(masked_m, N)
    qa = ref.out.view(torch.uint8)[mask].int()
    qb = got.out.view(torch.uint8)[mask].int()
    same = qa == qb
    mag_a, mag_b = qa & 0x7F, qb & 0x7F
    one_step = same | (((qa ^ qb) & 0x80 == 0) & ((mag_a - mag_b).abs() <= 1)) | ((mag_a == 0) & (mag_b == 0))
    sa, sb = ref.scale[mask], got.scale[mask]
    if ue8m0:
        scale_ok = bool(torch.equal(sa, sb))
        scale_err = float((sa != sb).float().mean()) if sa.numel() else 0.0
        unwritten_s = int((sb == POISON_SCALE_INT).sum())
    else:
        rel = ((sa - sb).abs() / sa.abs().clamp_min(1e-30)) if sa.numel() else sa
        scale_err = float(rel.max()) if sa.numel() else 0.0
        scale_ok = bool(scale_err <= 1e-6) and not bool(torch.isnan(sb).any())
        unwritten_s = int(torch.isnan(sb).sum())
    n = max(1, qa.numel())
    res = {
        "q_identical": float(same.sum()) / n,
        "q_within_one_step": bool(one_step.all()),
        "scale_ok": scale_ok,
        "scale_err": scale_err,
        "unwritten_values": int((qb == POISON_FP8).sum()),
        "unwritten_scales": unwritten_s,
        "real_elements": int(qa.numel()),
    }
    res["pass"] = (
        res["q_identical"] >= 0.999
        and res["q_within_one_step"]
        and scale_ok
        and res["unwritten_values"] == 0
        and res["unwritten_scales"] == 0
    )
    return res


def bit_identical(result: dict) -> bool:
    """Whether a :func:`compare` result shows the same bytes on every real row: every fp8 value and every
    scale equal, nothing left unwritten (the check of the variant benchmarks against their reference kernel)."""
    return (
        result["q_identical"] == 1.0
        and result["scale_err"] == 0.0
        and result["unwritten_values"] == 0
        and result["unwritten_scales"] == 0
    )


def bench_case(case: Case, paths: Paths, bw: float, l2_bytes: int, log, rounds: int = 3) -> dict:
    """Check every path of ``case`` against the reference, then time each one in ``rounds`` rounds whose
    order alternates (forward, reversed, ...): a path's time is its median over the rounds (the first path
    after a case's allocations ran up to 8% slow in single-round runs on the H200)."""
    gen = torch.Generator(device="cuda").manual_seed(zlib.crc32(case.name.encode()))
    m_cpu = masked_counts(case)
    rows = int(m_cpu.sum())
    masked_m = m_cpu.cuda()
    res: dict = {"case": asdict(case), "rows": rows, "floor_us": floor_us(case, rows, bw), "paths": {}}
    fl = res["floor_us"]

    # -- correctness on fresh inputs (all paths in their layout vs the reference in the same layout)
    x = random_gateup(case.E, case.N, case.D, gen)
    checks: dict = {}
    jit_via, fb_via = paths.jit_via(case), paths.fb_via(case)
    v7 = KernelConfig(**v7_config(case))
    todo = [
        ("triton", case.layout, lambda o: paths.run_triton(x, masked_m, o, case)),  # noqa: F821 - a closure's name, del'd later
        ("triton_v7", case.layout, lambda o: paths.run_triton(x, masked_m, o, case, kcfg=v7)),  # noqa: F821 - a closure's name, del'd later
    ]
    if case.layout == "column_major":
        todo.append(("triton_rm", "row_major", lambda o: paths.run_triton(x, masked_m, o, case, "row_major")))  # noqa: F821 - a closure's name, del'd later
    if jit_via:
        todo.append(("jit_ep", paths.jit_layout(case), lambda o: paths.run_jit(x, masked_m, o, case, jit_via)))  # noqa: F821 - a closure's name, del'd later
    if fb_via:
        todo.append(("fp8_fallback", paths.fb_layout(case), lambda o: paths.run_fb(x, masked_m, o, case, fb_via)))  # noqa: F821 - a closure's name, del'd later
    refs: dict = {}
    for name, layout, fn in todo:
        shape, config = paths.shape_config(x, masked_m, case, layout)
        if layout not in refs:
            ref = allocate_outputs(shape, config, x.device)
            poison(ref)
            silu_mul_quant_reference(SiluMulQuantInputs(x, masked_m), ref, shape, config)
            refs[layout] = ref
        got = allocate_outputs(shape, config, x.device)
        poison(got)
        try:
            fn(got)
            torch.cuda.synchronize()
            checks[name] = compare(refs[layout], got, masked_m, case.N, config.scale_ue8m0)
        except Exception as exc:
            checks[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "pass": False}
    res["checks"] = checks
    del x, refs
    # -- timing: rotate input sets so that the real bytes per round exceed the L2 several times
    nsets = input_sets(case, fl, bw, l2_bytes)
    sets = []
    for _ in range(nsets):
        xs = torch.randn(case.E, case.N, 2 * case.D, device="cuda", generator=gen).mul_(3).to(torch.bfloat16)
        sets.append(xs)
    res["input_sets"] = nsets

    def outs_for(layout: str):
        shape, config = paths.shape_config(sets[0], masked_m, case, layout)  # noqa: F821 - a closure's name, del'd later
        return [allocate_outputs(shape, config, sets[0].device) for _ in sets]  # noqa: F821 - a closure's name, del'd later

    timed = [
        ("triton", case.layout, lambda xs, o: paths.run_triton(xs, masked_m, o, case)),
        ("triton_v7", case.layout, lambda xs, o: paths.run_triton(xs, masked_m, o, case, kcfg=v7)),
    ]
    if case.layout == "column_major":
        timed.append(("triton_rm", "row_major", lambda xs, o: paths.run_triton(xs, masked_m, o, case, "row_major")))
        timed.append(
            ("triton_v7_rm", "row_major", lambda xs, o: paths.run_triton(xs, masked_m, o, case, "row_major", kcfg=v7))
        )
    if jit_via:
        timed.append(("jit_ep", paths.jit_layout(case), lambda xs, o: paths.run_jit(xs, masked_m, o, case, jit_via)))
    if fb_via:
        timed.append(("fp8_fallback", paths.fb_layout(case), lambda xs, o: paths.run_fb(xs, masked_m, o, case, fb_via)))
    if jit_via == "raw" and paths.jit_plugin is not None:
        timed.append(
            ("jit_ep_plugin", paths.jit_layout(case), lambda xs, o: paths.run_jit(xs, masked_m, o, case, "plugin"))
        )
    timed.append(("triton_nopdl", case.layout, lambda xs, o: paths.run_triton(xs, masked_m, o, case, pdl=False)))
    if jit_via and paths.host_nopdl is not None:
        timed.append(("jit_ep_nopdl", paths.jit_layout(case), lambda xs, o: paths.run_jit_nopdl(xs, masked_m, o, case)))
    samples: dict[str, list[tuple[float, float | None]]] = {}
    for order in round_orders(timed, rounds):
        for name, layout, fn in order:
            if name in res["paths"]:  # failed in an earlier round
                continue
            try:
                outs = outs_for(layout)
                calls = [(lambda xs=xs, o=o, fn=fn: fn(xs, o)) for xs, o in zip(sets, outs)]
                warm = graph_time_us(calls[:1]) if case.phase == "decode" else None
                samples.setdefault(name, []).append((graph_time_us(calls), warm))
                del outs, calls
            except Exception as exc:  # the rounds timed before stay in the entry, beside the error
                res["paths"][name] = {
                    "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "rounds_us": [u for u, _ in samples.get(name, [])],
                }
                log(traceback.format_exc())
    for name, layout, _ in timed:
        if name in res["paths"] or name not in samples:
            continue
        us = statistics.median(u for u, _ in samples[name])
        entry = {"us": us, "frac": fl / us, "layout": layout, "rounds_us": [u for u, _ in samples[name]]}
        if name == "jit_ep":
            entry["via"] = jit_via
        if name == "fp8_fallback":
            entry["via"] = fb_via
        if case.phase == "decode":
            entry["warm_us"] = statistics.median(w for _, w in samples[name])  # type: ignore[type-var]  # decode: set
        res["paths"][name] = entry
    # a plain device copy moving the same bytes (half read, half written), rotated the same way: what
    # the copy engine reaches at this size (launch and ramp-up included), next to the 1 GiB ceiling
    try:
        half = copy_bytes(case, rows)
        srcs = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        dsts = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        us = graph_time_us([(lambda a=a, b=b: b.copy_(a)) for a, b in zip(srcs, dsts)])
        res["paths"]["copy_same_bytes"] = {"us": us, "frac": fl / us}
        del srcs, dsts
    except Exception as exc:
        res["paths"]["copy_same_bytes"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    from ..plugins.triton_smq.launch import occupancy_records

    res["triton_occupancy"] = [list(v) for k, v in occupancy_records().items() if ("D", case.D) in k[-1]]
    if case.name in REFERENCE_TIMED:
        shape, config = paths.shape_config(sets[0], masked_m, case)
        o = allocate_outputs(shape, config, sets[0].device)
        us = eager_time_us(lambda: silu_mul_quant_reference(SiluMulQuantInputs(sets[0], masked_m), o, shape, config))  # noqa: F821 - a closure's name, del'd later
        res["paths"]["reference"] = {"us": us, "frac": fl / us, "layout": case.layout, "timing": "eager"}
    if not jit_via:
        res["jit_rejected"] = case.jit_reason() or "no host kernels"
    del sets
    torch.cuda.empty_cache()
    return res


def _warm_worker(jobs: list) -> int:
    from ..plugins.triton_smq import launch as K
    from ..plugins.triton_smq.tuning import KernelConfig

    for E, D, gs, limit, swizzle, ue8m0, kcfg, pdl in jobs:
        x = torch.zeros(E, 1, 2 * D, dtype=torch.bfloat16, device="cuda")
        m = torch.zeros(E, dtype=torch.int32, device="cuda")
        out = torch.empty(E, 1, D, dtype=torch.float8_e4m3fn, device="cuda")
        G = D // gs
        sc = torch.empty(
            E, 1, (G + 3) // 4 if ue8m0 else G, dtype=torch.int32 if ue8m0 else torch.float32, device="cuda"
        )
        cfg = KernelConfig(**dict(kcfg)) if kcfg else None
        K.launch(x, m, out, sc, group_size=gs, swiglu_limit=limit, swizzle=swizzle, ue8m0=ue8m0, config=cfg, pdl=pdl)
    torch.cuda.synchronize()
    return len(jobs)


def parallel_warm(jobs: list, workers: int = 14, worker: Callable[[list], int] | None = None) -> float:
    """Compile Triton specialisations in worker processes (fills the on-disk cache): ``worker`` (default: this
    module's, for :func:`~.smq_cases.warm_job` tuples) is called in each process with its share of the
    distinct ``jobs``; it must be importable by a spawned process."""
    t = time.time()
    jobs = sorted(set(jobs), key=str)
    if not jobs:
        return 0.0
    chunks = [jobs[i::workers] for i in range(workers) if jobs[i::workers]]
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(chunks)) as pool:
        pool.map(worker or _warm_worker, chunks)
    return time.time() - t


def run_sweep(paths: Paths, bw: float, l2: int, log, names: list[str], sweep_set: str = "1") -> list[dict]:
    from ..plugins.triton_smq.launch import occupancy_records

    results = []
    by_name = {c.name: c for c in CASES}
    for name in names:
        case = by_name[name]
        m_cpu = masked_counts(case)
        rows = int(m_cpu.sum())
        masked_m = m_cpu.cuda()
        fl = floor_us(case, rows, bw)
        nsets = input_sets(case, fl, bw, l2)
        sets = [torch.randn(case.E, case.N, 2 * case.D, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
        # set 3 compares with SGLang's kernel: both in its layout
        layout = paths.jit_layout(case) if sweep_set == "3" else None
        shape, config = paths.shape_config(sets[0], masked_m, case, layout)
        outs = [allocate_outputs(shape, config, sets[0].device) for _ in sets]
        if sweep_set == "3" and paths.jit_via(case) == "raw":
            calls = [(lambda xs=xs, o=o: paths.run_jit(xs, masked_m, o, case, "raw")) for xs, o in zip(sets, outs)]
            us = graph_time_us(calls, target_ms=20.0)
            results.append({"case": name, "cfg": "sglang_jit", "us": us, "frac": fl / us})
        for var in sweep_variants(case, sweep_set):
            kcfg = KernelConfig(**var)
            try:
                calls = [
                    (lambda xs=xs, o=o: paths.run_triton(xs, masked_m, o, case, layout=layout, kcfg=kcfg))
                    for xs, o in zip(sets, outs)
                ]
                known = set(occupancy_records())
                us = graph_time_us(calls, target_ms=20.0)
                new = [v for k, v in occupancy_records().items() if k not in known]
                results.append(
                    {
                        "case": name,
                        "cfg": var,
                        "us": us,
                        "frac": fl / us,
                        "regs_shared_resident": new[0] if new else None,
                    }
                )
            except Exception as exc:
                results.append({"case": name, "cfg": var, "error": str(exc)[:200]})
        best = min(
            (r for r in results if r["case"] == name and "us" in r and r["cfg"] != "sglang_jit"),
            key=lambda r: r["us"],  # type: ignore[arg-type,return-value]  # a float
            default=None,
        )
        log(f"sweep {name}: best {best}")
        del sets, outs
        torch.cuda.empty_cache()
    return results
