"""The steps of a ``benchmarks/silu_mul_quant.py`` run around the measurements: SGLang's kernels built,
the Triton warm-up jobs, the clocks brought up, the eager host time of the plugin, the files written."""

from __future__ import annotations

import json
import pathlib
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from ..ops.silu_mul_quant import allocate_outputs
from .report import smq_plot, smq_summary, smq_table
from .smq_cases import CASES, Case, masked_counts, needed_host_specs, sweep_variants, v7_config, warm_job
from .smq_paths import Paths

__all__ = ["load_host_kernels", "warm_jobs", "burn_in", "triton_eager_host_us", "write_results"]


def load_host_kernels(
    jit_root: pathlib.Path, prebuilt: pathlib.Path, cases: list[Case], log: Callable[[str], None]
) -> tuple[Any, Any]:
    """``(host, host_nopdl)``: SGLang's kernels for ``cases`` built from the wheel's JIT sources under
    ``jit_root`` (modules found under ``prebuilt`` loaded from there), with PDL and without; ``(None, None)``
    with the reason logged when they cannot be built."""
    host = host_nopdl = None
    t0 = time.time()
    try:
        from .sglang_kernels import SglangJit

        jit = SglangJit(jit_root, "/tmp/sgl_jit_build", prebuilt_root=prebuilt)
        dsv4, ptgq = needed_host_specs(cases)
        jit.prebuild(dsv4, ptgq, workers=16)
        host = jit.host_kernels()
        jit_nopdl = SglangJit(jit_root, "/tmp/sgl_jit_build", prebuilt_root=prebuilt, use_pdl=False)
        jit_nopdl.prebuild([(g, u, sw, False, lim) for (g, u, sw, _, lim) in dsv4], [], workers=16)
        host_nopdl = jit_nopdl.host_kernels()
        log(f"host kernels ready in {time.time() - t0:.1f}s: " + "; ".join(jit.log + jit_nopdl.log))
    except Exception:
        log("host kernels unavailable:\n" + traceback.format_exc())
    return host, host_nopdl


def warm_jobs(cases: list[Case], sweep: bool, sweep_names: list[str], sweep_set: str) -> list[tuple]:
    """The Triton specialisations the run launches: every case with and without PDL, the sweep's variants."""
    jobs = (
        [warm_job(c) for c in cases]
        + [warm_job(c, pdl=False) for c in cases]
        + [warm_job(c, v7_config(c)) for c in cases]
    )
    if sweep:
        by_name = {c.name: c for c in CASES}
        for name in sweep_names:
            jobs += [
                warm_job(by_name[name], v)
                for v in sweep_variants(by_name[name], sweep_set)
                if v["ctas_per_sm"] == 4 or sweep_set != "1"
            ]
    return jobs


def burn_in(seconds: float = 2.0) -> None:
    """Bring the GPU clocks up before measuring anything."""
    burn = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_burn = time.time()
    while time.time() - t_burn < seconds:
        burn @ burn
        torch.cuda.synchronize()
    del burn


def triton_eager_host_us(case: Case, paths: Paths, log: Callable[[str], None]) -> float | None:
    """Host time per eager call of the Triton plugin on ``case`` (launch included; not in CUDA graphs)."""
    try:
        m = masked_counts(case).cuda()
        x = torch.randn(case.E, case.N, 2 * case.D, device="cuda").to(torch.bfloat16)
        shape, config = paths.shape_config(x, m, case)
        o = allocate_outputs(shape, config, x.device)
        paths.run_triton(x, m, o, case)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            paths.run_triton(x, m, o, case)
        host_us = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        log(f"triton plugin host time per eager call (launch included): {host_us:.1f} us")
    except Exception:
        host_us = None
    return host_us


def write_results(
    out: pathlib.Path,
    stamp: str,
    meta: dict[str, Any],
    bw: float,
    device: str,
    date: str,
    results: list[dict],
    sweep: list[dict],
    log: Callable[[str], None],
) -> tuple[str, dict]:
    """``silu_mul_quant_<stamp>.{json,md,png}`` under ``out``: ``meta`` (device, date, versions, run, copy
    ceiling, ...) then the summary, the results and the sweep; returns ``(table, summary)``."""
    summary = smq_summary(results)
    payload = {**meta, "summary": summary, "results": results, "sweep": sweep}
    (out / f"silu_mul_quant_{stamp}.json").write_text(json.dumps(payload, indent=1, default=str))
    table = smq_table(results, bw, device, date)
    (out / f"silu_mul_quant_{stamp}.md").write_text(
        table + "\n\n## Summary\n\n```\n" + json.dumps(summary, indent=1, default=str) + "\n```\n"
    )
    try:
        smq_plot(results, out / f"silu_mul_quant_{stamp}.png", f"silu_mul_quant, {device}, {date}")
    except Exception:
        log("plot failed:\n" + traceback.format_exc())
    return table, summary
