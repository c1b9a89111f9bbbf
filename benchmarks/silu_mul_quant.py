#!/usr/bin/env python3
"""Side-by-side benchmark of the ``silu_mul_quant`` paths on one GPU, in one run.

Times, per shape drawn from ``sglang_moe_plugins/data/moe_models.json`` (EP 1/2/4/8, prefill and
decode row counts, uniform and skewed routing, with and without swiglu_limit, fp32 and UE8M0):

- ``triton``: this project's Triton plugin (``sglang_moe_plugins.plugins.triton``);
- ``jit_ep``: SGLang 0.5.23's DSV4 JIT kernel ``silu_and_mul_masked_post_quant`` (through the
  ``jit_ep`` plugin when it exists in the tree, else the raw kernel), built from the wheel's sources;
- ``fp8_fallback``: SGLang's masked fused ``per_token_group_quant`` (through the ``fp8_fallback``
  plugin when it exists, else the raw kernel, on shapes without swiglu_limit);
- ``reference``: the torch oracle (a few shapes; it syncs on masked_m).

Each time is the median over CUDA-graph replays of back-to-back calls that rotate over enough input
sets to exceed the L2 cache (decode shapes also report a warm, single-set time). The floor is the
bytes of real rows only (2D bf16 read + D fp8 + scales written) over the measured device copy
bandwidth; ``frac`` = floor / time. Every timed kernel's output is first checked against the
reference on fresh random inputs (poisoned outputs, every real row written).

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
import math
import multiprocessing as mp
import os
import pathlib
import statistics
import sys
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Optional

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "benchmarks")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from sglang_moe_plugins.ops.silu_mul_quant import (  # noqa: E402
    SiluMulQuantInputs,
    SiluMulQuantOutputs,
    allocate_outputs,
    describe,
    real_rows,
)
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference  # noqa: E402

JIT_ROOT = ROOT / ".device/sgl_jit/sglang/kernels/jit"
PREBUILT = ROOT / ".device/sgl_prebuilt"


# --------------------------------------------------------------------------------------- cases
@dataclass(frozen=True)
class Case:
    name: str
    E: int
    N: int
    D: int
    rows: int
    routing: str = "uniform"  # uniform | skew (one expert holds half the rows)
    limit: Optional[float] = None
    layout: str = "column_major"  # column_major | ue8m0_packed | row_major
    gs: int = 128
    swizzle: bool = False
    topk: int = 8
    phase: str = "prefill"
    model: str = ""
    ep: int = 1

    @property
    def ue8m0(self) -> bool:
        return self.layout == "ue8m0_packed"

    def jit_reason(self) -> Optional[str]:
        """Why SGLang's DSV4 JIT kernel (or its host-side assert) rejects this case, or None."""
        G = self.D // self.gs
        if self.gs not in (32, 128):
            return f"group_size {self.gs} not in (32, 128)"
        if self.D % 256 or self.D > 8192:
            return f"D={self.D}: needs D % 256 == 0 and D <= 8192 (one thread per 8 columns)"
        if self.D // 8 < self.E:
            return f"D // 8 = {self.D // 8} < E = {self.E}"
        if self.E > 256:
            return f"E = {self.E} > 256"
        if self.N % 4 or G % 4:
            return f"N % 4 = {self.N % 4}, G % 4 = {G % 4} (host assert)"
        if self.N * self.topk < self.rows:
            return "rows > N * topk would be left unwritten"
        if self.layout == "column_major":
            return None  # compared in its native row-major fp32 layout
        return None


def _model(mid: str) -> dict:
    data = json.loads((ROOT / "sglang_moe_plugins/data/moe_models.json").read_text())
    return next(m for m in data["models"] if m["id"] == mid)


def _case(name: str, mid: str, ep: int, N: int, rows: int, **kw) -> Case:
    m = _model(mid)
    return Case(name=name, E=m["experts"] // ep, N=N, D=m["inter"], rows=rows, topk=m["topk"], model=mid, ep=ep, **kw)


L10 = 10.0
CASES: list[Case] = [
    # prefill, D >= 2048
    _case("DSV4-Flash EP8 prefill", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10),
    _case("DSV4-Flash EP8 prefill skew", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10, routing="skew"),
    _case("DSV4-Flash EP8 prefill ue8m0", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10, layout="ue8m0_packed"),
    _case("DSV4-Flash EP8 prefill ue8m0 swz", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10,
          layout="ue8m0_packed", swizzle=True),
    _case("DSV4-Flash EP8 prefill g32 ue8m0", "deepseek-ai/DeepSeek-V4-Flash", 8, 2048, 8192, limit=L10,
          layout="ue8m0_packed", gs=32),
    _case("DSV4-Flash EP8 prefill 6k", "deepseek-ai/DeepSeek-V4-Flash", 8, 1024, 6144),
    Case("issue E=64 D=4096 limit", E=64, N=2048, D=4096, rows=16384, limit=L10, topk=8, model="(issue 4)", ep=0),
    _case("DSV3 EP8 prefill", "deepseek-ai/DeepSeek-V3", 8, 2048, 16384),
    _case("DSV3 EP8 prefill skew", "deepseek-ai/DeepSeek-V3", 8, 2048, 16384, routing="skew"),
    _case("DSV4-Pro EP8 prefill ue8m0", "deepseek-ai/DeepSeek-V4-Pro", 8, 2048, 12288, limit=L10, layout="ue8m0_packed"),
    _case("Kimi-K2 EP8 prefill", "moonshotai/Kimi-K2-Instruct", 8, 2048, 16384),
    _case("Mixtral EP1 prefill", "mistralai/Mixtral-8x7B-v0.1", 1, 4096, 8192),
    # prefill, D < 2048
    _case("Qwen3-235B EP4 prefill", "Qwen/Qwen3-235B-A22B", 4, 2048, 16384),
    _case("GLM-4.5 EP8 prefill", "zai-org/GLM-4.5", 8, 2048, 16384),
    _case("Qwen3.5-122B EP4 prefill", "Qwen/Qwen3.5-122B-A10B-FP8", 4, 2048, 16384),
    _case("OLMoE EP1 prefill", "allenai/OLMoE-1B-7B-0924", 1, 1024, 8192),
    _case("Qwen3-30B EP1 prefill", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192),
    _case("Qwen3-30B EP1 prefill skew", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192, routing="skew"),
    _case("Qwen3-30B EP1 prefill ue8m0", "Qwen/Qwen3-30B-A3B", 1, 1024, 8192, layout="ue8m0_packed"),
    _case("Qwen3.5-35B EP2 prefill", "Qwen/Qwen3.5-35B-A3B", 2, 1024, 8192),
    _case("Qwen3-Next EP1 prefill", "Qwen/Qwen3-Next-80B-A3B", 1, 1024, 8192),
    _case("Qwen3-Next EP1 prefill 16k", "Qwen/Qwen3-Next-80B-A3B", 1, 2048, 16384),
    # decode
    _case("DSV4-Flash EP8 decode", "deepseek-ai/DeepSeek-V4-Flash", 8, 128, 384, limit=L10, phase="decode"),
    _case("DSV4-Flash EP8 decode ue8m0", "deepseek-ai/DeepSeek-V4-Flash", 8, 128, 512, limit=L10,
          layout="ue8m0_packed", phase="decode"),
    _case("DSV4-Flash EP8 decode 768", "deepseek-ai/DeepSeek-V4-Flash", 8, 128, 768, phase="decode"),
    _case("DSV3 EP8 decode", "deepseek-ai/DeepSeek-V3", 8, 128, 512, phase="decode"),
    _case("DSV4-Pro EP8 decode ue8m0", "deepseek-ai/DeepSeek-V4-Pro", 8, 64, 256, limit=L10, layout="ue8m0_packed",
          phase="decode"),
    _case("Qwen3-235B EP4 decode", "Qwen/Qwen3-235B-A22B", 4, 128, 512, phase="decode"),
    _case("Qwen3-30B EP1 decode", "Qwen/Qwen3-30B-A3B", 1, 64, 512, phase="decode"),
    _case("Qwen3-Next EP1 decode", "Qwen/Qwen3-Next-80B-A3B", 1, 32, 320, phase="decode"),
]
REFERENCE_TIMED = {"DSV4-Flash EP8 prefill", "DSV3 EP8 prefill", "Qwen3-30B EP1 prefill", "DSV4-Flash EP8 decode"}


def masked_counts(case: Case) -> torch.Tensor:
    E, N, R = case.E, case.N, case.rows
    m = torch.zeros(E, dtype=torch.int64)
    if case.routing == "skew":
        hot = min(N, R // 2)
        m[0] = hot
        rest = R - hot
        m[1:] = rest // (E - 1)
        m[1 : 1 + rest % (E - 1)] += 1
    else:
        m[:] = R // E
        m[: R % E] += 1
    if int(m.max()) > N:
        raise ValueError(f"{case.name}: {R} rows do not fit E={E} x N={N}")
    return m.to(torch.int32)


def _needed_host_specs(cases: list[Case]) -> tuple[list, list]:
    from sglang_jit import plugin_specs

    from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape

    dsv4, ptgq = set(), set()
    for c in cases:
        want_dsv4, want_ptgq = plugin_specs(SiluMulQuantShape(c.E, c.N, c.D, c.gs, c.topk),
                                            SiluMulQuantConfig(swiglu_limit=c.limit, swizzle=c.swizzle,
                                                               scale_layout=c.layout))
        if c.jit_reason() is None:
            dsv4.add(want_dsv4)
        if not c.swizzle:
            ptgq.add(want_ptgq)
    return sorted(dsv4), sorted(ptgq, key=str)


# ------------------------------------------------------------------------------ measurements
from sglang_moe_plugins.bench.timing import copy_bandwidth, graph_time_us  # noqa: E402  (shared with `bench`)


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


# ------------------------------------------------------------------------------- correctness
def poison(outputs: SiluMulQuantOutputs) -> None:
    outputs.out.view(torch.uint8).fill_(0xFF)
    if outputs.scale.dtype == torch.int32:
        outputs.scale.fill_(-1)
    else:
        outputs.scale.fill_(float("nan"))


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
        unwritten_s = int((sb == -1).sum())
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
        "unwritten_values": int((qb == 0xFF).sum()),
        "unwritten_scales": unwritten_s,
        "real_elements": int(qa.numel()),
    }
    res["pass"] = (res["q_identical"] >= 0.999 and res["q_within_one_step"] and scale_ok
                   and res["unwritten_values"] == 0 and res["unwritten_scales"] == 0)
    return res


def rel_error(ref_deq: torch.Tensor, deq: torch.Tensor) -> float:
    return float((deq - ref_deq).norm() / ref_deq.norm().clamp_min(1e-30))


from sglang_moe_plugins.bench.timing import random_gateup  # noqa: E402


# ---------------------------------------------------------------------------- the kernels
class Paths:
    """Callables for each path: ``fn(gateup, masked_m, outputs, case)``; None when unavailable."""

    def __init__(self, host, host_nopdl=None) -> None:
        from sglang_moe_plugins.plugins.triton import TritonPlugin

        self.host = host
        self.host_nopdl = host_nopdl
        self.triton = TritonPlugin()
        self.jit_plugin = self._try_plugin("sglang_moe_plugins.plugins.jit_ep", "JitEpPlugin")
        self.fb_plugin = self._try_plugin("sglang_moe_plugins.plugins.fp8_fallback", "Fp8FallbackPlugin")

    @staticmethod
    def _try_plugin(module: str, cls: str):
        try:
            mod = __import__(module, fromlist=[cls])
            return getattr(mod, cls)()
        except Exception:
            return None

    @staticmethod
    def shape_config(gateup, masked_m, case: Case, layout: Optional[str] = None):
        return describe(gateup, masked_m, group_size=case.gs, topk=case.topk, swiglu_limit=case.limit,
                        swizzle=case.swizzle, scale_layout=layout or case.layout)

    def run_triton(self, gateup, masked_m, outputs, case, layout=None, kcfg=None, pdl=True):
        shape, config = self.shape_config(gateup, masked_m, case, layout)
        if kcfg is None and pdl:
            self.triton.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
        else:
            from sglang_moe_plugins.plugins import _triton_silu_mul_quant as K
            from sglang_moe_plugins.quant import round_to_bf16

            K.launch(gateup, masked_m, outputs.out, outputs.scale, group_size=case.gs,
                     swiglu_limit=None if case.limit is None else round_to_bf16(case.limit),
                     swizzle=case.swizzle, ue8m0=case.ue8m0, config=kcfg, pdl=pdl)

    def jit_layout(self, case: Case) -> str:
        return "ue8m0_packed" if case.ue8m0 else "row_major"

    def jit_via(self, case: Case) -> Optional[str]:
        # SGLang's kernel as SGLang calls it ("raw"); the jit_ep plugin adds a masked_m clamp kernel in
        # front (the op's defined result for masked_m outside [0, N]), timed separately as jit_ep_plugin
        if self.host is not None and case.jit_reason() is None:
            return "raw"
        if self.jit_plugin is not None:
            shape, config = self._meta(case, self.jit_layout(case))
            try:
                if self.jit_plugin.supports(shape, config):
                    return "plugin"
            except Exception:
                pass
        if self.host is None or case.jit_reason() is not None:
            return None
        return "raw"

    def _meta(self, case: Case, layout: str):
        from sglang_moe_plugins.hardware import local_platform
        from sglang_moe_plugins.ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape

        return (SiluMulQuantShape(case.E, case.N, case.D, case.gs, case.topk),
                SiluMulQuantConfig(local_platform(), case.limit, case.swizzle, layout, False))

    def run_jit(self, gateup, masked_m, outputs, case, via):
        if via == "plugin":
            shape, config = self.shape_config(gateup, masked_m, case, self.jit_layout(case))
            from sglang_moe_plugins.host_kernels import use_host_kernels

            with use_host_kernels(self.host):
                self.jit_plugin.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
            return
        scale = outputs.scale.transpose(1, 2) if case.ue8m0 else outputs.scale
        self.host.silu_and_mul_masked_post_quant(gateup, outputs.out, scale, case.gs, masked_m,
                                                 scale_ue8m0=case.ue8m0, topk=case.topk, transposed=case.ue8m0,
                                                 swiglu_limit=case.limit, swizzle=case.swizzle)

    def run_jit_nopdl(self, gateup, masked_m, outputs, case):
        scale = outputs.scale.transpose(1, 2) if case.ue8m0 else outputs.scale
        self.host_nopdl.silu_and_mul_masked_post_quant(gateup, outputs.out, scale, case.gs, masked_m,
                                                       scale_ue8m0=case.ue8m0, topk=case.topk,
                                                       transposed=case.ue8m0, swiglu_limit=case.limit,
                                                       swizzle=case.swizzle)

    def fb_layout(self, case: Case) -> str:
        return case.layout

    def fb_via(self, case: Case) -> Optional[str]:
        if self.host is not None and not case.swizzle and case.limit is None:
            return "raw"  # SGLang's default path as SGLang calls it (the plugin adds a masked_m clamp)
        if self.fb_plugin is not None:
            shape, config = self._meta(case, self.fb_layout(case))
            try:
                if self.fb_plugin.supports(shape, config):
                    return "plugin"
            except Exception:
                pass
        if self.host is None or case.swizzle or case.limit is not None:
            return None
        return "raw"

    def run_fb(self, gateup, masked_m, outputs, case, via):
        if via == "plugin":
            shape, config = self.shape_config(gateup, masked_m, case, self.fb_layout(case))
            from sglang_moe_plugins.host_kernels import use_host_kernels

            with use_host_kernels(self.host):
                self.fb_plugin.run(SiluMulQuantInputs(gateup, masked_m), outputs, shape, config)
            return
        self.host.per_token_group_quant(gateup, outputs.out, outputs.scale, case.gs, scale_ue8m0=case.ue8m0,
                                        fuse_silu_and_mul=True, masked_m=masked_m)


# ---------------------------------------------------------------------------------- runner
def floor_us(case: Case, rows: int, bw: float) -> float:
    G = case.D // case.gs
    scale_bytes = G if case.ue8m0 else 4 * G
    return rows * (4 * case.D + case.D + scale_bytes) / bw * 1e6


def bench_case(case: Case, paths: Paths, bw: float, l2_bytes: int, log) -> dict:
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
    todo = [("triton", case.layout, lambda o: paths.run_triton(x, masked_m, o, case))]
    if case.layout == "column_major":
        todo.append(("triton_rm", "row_major", lambda o: paths.run_triton(x, masked_m, o, case, "row_major")))
    if jit_via:
        todo.append(("jit_ep", paths.jit_layout(case), lambda o: paths.run_jit(x, masked_m, o, case, jit_via)))
    if fb_via:
        todo.append(("fp8_fallback", paths.fb_layout(case), lambda o: paths.run_fb(x, masked_m, o, case, fb_via)))
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
    real_bytes = max(1.0, fl * 1e-6 * bw)
    padded = case.E * case.N * case.D * 5
    nsets = int(min(32, max(1, math.ceil(3 * l2_bytes / real_bytes)), max(1, (24 << 30) // max(1, padded))))
    sets = []
    for _ in range(nsets):
        xs = torch.randn(case.E, case.N, 2 * case.D, device="cuda", generator=gen).mul_(3).to(torch.bfloat16)
        sets.append(xs)
    res["input_sets"] = nsets

    def outs_for(layout: str):
        shape, config = paths.shape_config(sets[0], masked_m, case, layout)
        return [allocate_outputs(shape, config, sets[0].device) for _ in sets]

    timed = [("triton", case.layout, lambda xs, o: paths.run_triton(xs, masked_m, o, case))]
    if case.layout == "column_major":
        timed.append(("triton_rm", "row_major", lambda xs, o: paths.run_triton(xs, masked_m, o, case, "row_major")))
    if jit_via:
        timed.append(("jit_ep", paths.jit_layout(case), lambda xs, o: paths.run_jit(xs, masked_m, o, case, jit_via)))
    if fb_via:
        timed.append(("fp8_fallback", paths.fb_layout(case),
                      lambda xs, o: paths.run_fb(xs, masked_m, o, case, fb_via)))
    if jit_via == "raw" and paths.jit_plugin is not None:
        timed.append(("jit_ep_plugin", paths.jit_layout(case),
                      lambda xs, o: paths.run_jit(xs, masked_m, o, case, "plugin")))
    timed.append(("triton_nopdl", case.layout, lambda xs, o: paths.run_triton(xs, masked_m, o, case, pdl=False)))
    if jit_via and paths.host_nopdl is not None:
        timed.append(("jit_ep_nopdl", paths.jit_layout(case), lambda xs, o: paths.run_jit_nopdl(xs, masked_m, o, case)))
    for name, layout, fn in timed:
        try:
            outs = outs_for(layout)
            calls = [(lambda xs=xs, o=o: fn(xs, o)) for xs, o in zip(sets, outs)]
            us = graph_time_us(calls)
            entry = {"us": us, "frac": fl / us, "layout": layout}
            if name == "jit_ep":
                entry["via"] = jit_via
            if name == "fp8_fallback":
                entry["via"] = fb_via
            if case.phase == "decode":
                entry["warm_us"] = graph_time_us(calls[:1])
            res["paths"][name] = entry
            del outs
        except Exception as exc:
            res["paths"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            log(traceback.format_exc())
    # a plain device copy moving the same bytes (half read, half written), rotated the same way: what
    # the copy engine reaches at this size (launch and ramp-up included), next to the 1 GiB ceiling
    try:
        # exact bytes, rounded down to 4 KiB: a copy of an odd byte count (the float floor loses a byte)
        # ran at 0.55-0.62 of the ceiling in the 2026-11-30 run, aligned ones at 0.71-1.00
        G = case.D // case.gs
        exact = rows * (5 * case.D + (G if case.ue8m0 else 4 * G))
        half = max(4096, exact // 2 // 4096 * 4096)
        srcs = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        dsts = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(nsets)]
        us = graph_time_us([(lambda a=a, b=b: b.copy_(a)) for a, b in zip(srcs, dsts)])
        res["paths"]["copy_same_bytes"] = {"us": us, "frac": fl / us}
        del srcs, dsts
    except Exception as exc:
        res["paths"]["copy_same_bytes"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    from sglang_moe_plugins.plugins._triton_silu_mul_quant import occupancy_records

    res["triton_occupancy"] = [list(v) for k, v in occupancy_records().items() if ("D", case.D) in k[-1]]
    if case.name in REFERENCE_TIMED:
        shape, config = paths.shape_config(sets[0], masked_m, case)
        o = allocate_outputs(shape, config, sets[0].device)
        us = eager_time_us(lambda: silu_mul_quant_reference(SiluMulQuantInputs(sets[0], masked_m), o, shape, config))
        res["paths"]["reference"] = {"us": us, "frac": fl / us, "layout": case.layout, "timing": "eager"}
    if not jit_via:
        res["jit_rejected"] = case.jit_reason() or "no host kernels"
    del sets
    torch.cuda.empty_cache()
    return res


# ---------------------------------------------------------------------- parallel Triton warm-up
def _warm_worker(jobs: list) -> int:
    sys.path.insert(0, str(ROOT))
    from sglang_moe_plugins.plugins import _triton_silu_mul_quant as K

    for E, D, gs, limit, swizzle, ue8m0, kcfg, pdl in jobs:
        x = torch.zeros(E, 1, 2 * D, dtype=torch.bfloat16, device="cuda")
        m = torch.zeros(E, dtype=torch.int32, device="cuda")
        out = torch.empty(E, 1, D, dtype=torch.float8_e4m3fn, device="cuda")
        G = D // gs
        sc = torch.empty(E, 1, (G + 3) // 4 if ue8m0 else G, dtype=torch.int32 if ue8m0 else torch.float32,
                         device="cuda")
        cfg = K.KernelConfig(**dict(kcfg)) if kcfg else None
        K.launch(x, m, out, sc, group_size=gs, swiglu_limit=limit, swizzle=swizzle, ue8m0=ue8m0, config=cfg, pdl=pdl)
    torch.cuda.synchronize()
    return len(jobs)


def parallel_warm(jobs: list, workers: int = 14) -> float:
    """Compile Triton specialisations in worker processes (fills the on-disk cache)."""
    t = time.time()
    jobs = sorted(set(jobs), key=str)
    if not jobs:
        return 0.0
    chunks = [jobs[i::workers] for i in range(workers) if jobs[i::workers]]
    ctx = mp.get_context("spawn")
    with ctx.Pool(len(chunks)) as pool:
        pool.map(_warm_worker, chunks)
    return time.time() - t


def warm_job(case: Case, kcfg: Optional[dict] = None, pdl: bool = True) -> tuple:
    from sglang_moe_plugins.quant import round_to_bf16

    from sglang_moe_plugins.plugins._triton_silu_mul_quant import choose_config

    limit = None if case.limit is None else round_to_bf16(case.limit)
    if kcfg is None:  # the configuration the plugin will pick for this case (it depends on N)
        kcfg = asdict(choose_config(case.E, case.N, case.D, case.gs, case.topk))
    return (case.E, case.D, case.gs, limit, case.swizzle, case.ue8m0, tuple(sorted(kcfg.items())), pdl)


# ------------------------------------------------------------------------------------- sweep
#: Shapes of the configuration sweeps behind choose_config (docs/triton-kernel.md): the v2 sweep used
#: the first seven, the v3 sweep the last four.
SWEEP_CASES = ["DSV3 EP8 prefill", "DSV4-Pro EP8 prefill ue8m0", "Qwen3-235B EP4 prefill", "Qwen3-30B EP1 prefill",
               "Qwen3-Next EP1 prefill", "DSV4-Flash EP8 decode", "Qwen3.5-35B EP2 prefill",
               "Qwen3-Next EP1 decode", "Qwen3-30B EP1 decode", "issue E=64 D=4096 limit",
               "Kimi-K2 EP8 prefill", "Mixtral EP1 prefill", "DSV4-Flash EP8 decode 768"]


def sweep_variants(case: Case, sweep_set: str = "1") -> list[dict]:
    from sglang_moe_plugins.plugins._triton_silu_mul_quant import choose_config

    base = choose_config(case.E, case.N, case.D, case.gs, case.topk)
    out = []
    if sweep_set == "3":  # session 3: the shapes where triton trailed SGLang's kernel; prefetch, tiles, waves
        cfgs = [asdict(base), dict(asdict(base), prefetch=True)]
        for bc in sorted({base.block_c, max(case.gs, base.block_c // 2), min(1024, base.block_c * 2)}):
            for elems, warps in ((2048, 4), (4096, 8)):
                for prefetch in (False, True):
                    for waves in (1, 2):
                        cfg = dict(block_m=max(1, elems // bc), block_c=bc, num_warps=warps, ctas_per_sm=16,
                                   prefetch=prefetch, max_registers=None, waves=waves)
                        if cfg not in cfgs:
                            cfgs.append(cfg)
        return cfgs
    if sweep_set == "2":  # register caps and waves (session 2, after the occupancy-capped grid)
        bc = base.block_c
        for elems, warps in ((2048, 4), (4096, 8)):
            bm = max(1, elems // bc)
            for prefetch in (False, True):
                for regs in (None, 32, 40):
                    for waves in (1, 2):
                        if prefetch and waves == 2:
                            continue
                        out.append(dict(block_m=bm, block_c=bc, num_warps=warps, ctas_per_sm=16, prefetch=prefetch,
                                        max_registers=regs, waves=waves))
        return out
    for elems, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8)):
        for prefetch in (False, True):
            bc = base.block_c
            bm = max(1, min(elems // bc, 1 << max(0, case.N - 1).bit_length()))
            for ctas in (2, 4, 8, 16):
                out.append(dict(block_m=bm, block_c=bc, num_warps=warps, ctas_per_sm=ctas, prefetch=prefetch))
    return out


def run_sweep(paths: Paths, bw: float, l2: int, log, names: list[str], sweep_set: str = "1") -> list[dict]:
    from sglang_moe_plugins.plugins._triton_silu_mul_quant import occupancy_records

    results = []
    by_name = {c.name: c for c in CASES}
    for name in names:
        case = by_name[name]
        m_cpu = masked_counts(case)
        rows = int(m_cpu.sum())
        masked_m = m_cpu.cuda()
        fl = floor_us(case, rows, bw)
        real_bytes = fl * 1e-6 * bw
        nsets = int(min(32, max(1, math.ceil(3 * l2 / real_bytes)),
                        max(1, (24 << 30) // max(1, case.E * case.N * case.D * 5))))
        sets = [torch.randn(case.E, case.N, 2 * case.D, device="cuda").to(torch.bfloat16) for _ in range(nsets)]
        # set 3 compares with SGLang's kernel: both in its layout
        layout = paths.jit_layout(case) if sweep_set == "3" else None
        shape, config = paths.shape_config(sets[0], masked_m, case, layout)
        outs = [allocate_outputs(shape, config, sets[0].device) for _ in sets]
        from sglang_moe_plugins.plugins._triton_silu_mul_quant import KernelConfig

        if sweep_set == "3" and paths.jit_via(case) == "raw":
            calls = [(lambda xs=xs, o=o: paths.run_jit(xs, masked_m, o, case, "raw")) for xs, o in zip(sets, outs)]
            us = graph_time_us(calls, target_ms=20.0)
            results.append({"case": name, "cfg": "sglang_jit", "us": us, "frac": fl / us})
        for var in sweep_variants(case, sweep_set):
            kcfg = KernelConfig(**var)
            try:
                calls = [(lambda xs=xs, o=o: paths.run_triton(xs, masked_m, o, case, layout=layout, kcfg=kcfg))
                         for xs, o in zip(sets, outs)]
                known = set(occupancy_records())
                us = graph_time_us(calls, target_ms=20.0)
                new = [v for k, v in occupancy_records().items() if k not in known]
                results.append({"case": name, "cfg": var, "us": us, "frac": fl / us,
                                "regs_shared_resident": new[0] if new else None})
            except Exception as exc:
                results.append({"case": name, "cfg": var, "error": str(exc)[:200]})
        best = min((r for r in results if r["case"] == name and "us" in r and r["cfg"] != "sglang_jit"),
                   key=lambda r: r["us"], default=None)
        log(f"sweep {name}: best {best}")
        del sets, outs
        torch.cuda.empty_cache()
    return results


# ------------------------------------------------------------------------------------ report
def fmt_table(results: list[dict], bw: float, device: str, date: str) -> str:
    lines = [f"# silu_mul_quant on {device}, {date}", "",
             f"Copy ceiling (device-to-device, read + write): {bw / 1e12:.2f} TB/s. Times: median per call over "
             "CUDA-graph replays, inputs rotated beyond L2. frac = floor / time. x_jit = jit_ep time / triton time "
             "(triton in jit_ep's layout). same-bytes copy: a plain device copy moving the case's floor bytes, timed "
             "the same way (what a copy reaches at this size).", "",
             "| case | E | N | D | rows | scales | limit | floor us | triton us (frac) | jit_ep us (frac) | x_jit "
             "| fp8_fallback us (frac) | same-bytes copy us (frac) | reference us | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["case"]
        p = r["paths"]

        def cell(k):
            v = p.get(k)
            if v is None:
                return "-"
            if "error" in v:
                return "ERR"
            return f"{v['us']:.2f} ({v['frac']:.2f})"

        ratio = "-"
        if "jit_ep" in p and "us" in p["jit_ep"]:
            tri = p.get("triton_rm" if c["layout"] == "column_major" else "triton")
            if tri and "us" in tri:
                ratio = f"{p['jit_ep']['us'] / tri['us']:.2f}"
        jit_cell = cell("jit_ep") if "jit_ep" in p else ("rejected" if r.get("jit_rejected") else "-")
        checks = r.get("checks", {})
        ok = "ok" if all(v.get("pass") for k, v in checks.items() if k.startswith("triton")) else "FAIL"
        scales = "ue8m0" if c["layout"] == "ue8m0_packed" else "fp32"
        if c["gs"] != 128:
            scales += f" g{c['gs']}"
        if c["swizzle"]:
            scales += " swz"
        ref = f"{p['reference']['us']:.0f}" if "us" in p.get("reference", {}) else "-"
        lines.append(f"| {c['name']} | {c['E']} | {c['N']} | {c['D']} | {r['rows']} | {scales} | {c['limit'] or '-'} "
                     f"| {r['floor_us']:.2f} | {cell('triton')} | {jit_cell} | {ratio} | {cell('fp8_fallback')} "
                     f"| {cell('copy_same_bytes')} | {ref} | {ok} |")
    return "\n".join(lines)


def summarize(results: list[dict]) -> dict:
    ratios, decode, big, rejected, skew, plugin_ratios = [], [], [], [], {}, []
    for r in results:
        c, p = r["case"], r["paths"]
        tri = p.get("triton", {})
        if "jit_ep" in p and "us" in p["jit_ep"]:
            t = p.get("triton_rm" if c["layout"] == "column_major" else "triton", {})
            if "us" in t:
                ratios.append((c["name"], p["jit_ep"]["us"] / t["us"]))
                if "us" in p.get("jit_ep_plugin", {}):
                    plugin_ratios.append((c["name"], p["jit_ep_plugin"]["us"] / t["us"]))
        if "us" not in tri:
            continue
        if r["rows"] <= 512:
            decode.append((c["name"], tri["us"]))
        if r["rows"] >= 8192 and c["D"] >= 2048:
            big.append((c["name"], tri["frac"]))
        if r.get("jit_rejected") and r["rows"] >= 8192:
            rejected.append((c["name"], tri["frac"]))
        base = c["name"].replace(" skew", "")
        skew.setdefault(base, {})["skew" if c["routing"] == "skew" else "uniform"] = tri["us"]
    geo = math.exp(sum(math.log(x) for _, x in ratios) / len(ratios)) if ratios else float("nan")
    skews = {k: v["skew"] / v["uniform"] for k, v in skew.items() if "skew" in v and "uniform" in v}
    return {
        "vs_jit": {"per_case": ratios, "min": min((x for _, x in ratios), default=None), "geomean": geo,
                   "target": "every >= 1.0, geomean >= 1.2"},
        "vs_jit_ep_plugin": {"per_case": plugin_ratios, "min": min((x for _, x in plugin_ratios), default=None),
                             "geomean": math.exp(sum(math.log(x) for _, x in plugin_ratios) / len(plugin_ratios))
                             if plugin_ratios else float("nan"), "use": "default priorities (what selection compares)"},
        "decode_us": {"per_case": decode, "max": max((x for _, x in decode), default=None), "target": "<= 6 us"},
        "big_frac": {"per_case": big, "min": min((x for _, x in big), default=None), "target": ">= 0.90"},
        "jit_rejected_frac": {"per_case": rejected, "min": min((x for _, x in rejected), default=None),
                              "target": ">= 0.80"},
        "skew_ratio": {"per_case": skews, "max": max(skews.values(), default=None), "target": "<= 1.10"},
    }


def plot(results: list[dict], path: pathlib.Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["case"]["name"] for r in results]
    fig, ax = plt.subplots(figsize=(max(10, len(names) * 0.55), 6))
    width = 0.27
    for i, (key, label) in enumerate((("triton", "triton"), ("jit_ep", "jit_ep (SGLang DSV4 JIT)"),
                                      ("fp8_fallback", "fp8_fallback (SGLang per_token_group_quant)"))):
        vals = [r["paths"].get(key, {}).get("frac", 0.0) for r in results]
        ax.bar([j + (i - 1) * width for j in range(len(names))], vals, width, label=label)
    ax.axhline(0.9, color="k", ls="--", lw=0.8)
    ax.axhline(0.8, color="gray", ls=":", lw=0.8)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("fraction of copy ceiling (real-row bytes)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--sweep", action="store_true", help="also time kernel configuration variants")
    ap.add_argument("--sweep-only", action="store_true", help="only the sweep (no table)")
    ap.add_argument("--sweep-cases", default="", help="comma-separated sweep case names (default: SWEEP_CASES)")
    ap.add_argument("--sweep-set", default="1", choices=["1", "2", "3"],
                    help="1: tiles x CTAs x prefetch; 2: register caps x waves; 3: prefetch x tiles x waves, "
                         "with SGLang's kernel timed alongside")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--no-host", action="store_true", help="skip SGLang's kernels")
    ap.add_argument("--compile-host", default="", help="only compile SGLang's modules into this directory")
    ap.add_argument("--workers", type=int, default=14)
    args = ap.parse_args()

    if args.compile_host:
        from sglang_jit import SglangJit

        dsv4, ptgq = _needed_host_specs(CASES)
        jit = SglangJit(JIT_ROOT, args.compile_host)
        for lib in jit.compile_only(dsv4, ptgq, workers=args.workers):
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
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    l2 = int(getattr(props, "L2_cache_size", 50 << 20))
    import triton

    log(f"device {device}, torch {torch.__version__}, triton {triton.__version__}, date {date}")
    cases = [c for c in CASES if not args.only or c.name in args.only.split(",")]

    host = host_nopdl = None
    t0 = time.time()
    if not args.no_host and JIT_ROOT.is_dir():
        try:
            from sglang_jit import SglangJit

            jit = SglangJit(JIT_ROOT, "/tmp/sgl_jit_build", prebuilt_root=PREBUILT)
            dsv4, ptgq = _needed_host_specs(cases)
            jit.prebuild(dsv4, ptgq, workers=16)
            host = jit.host_kernels()
            jit_nopdl = SglangJit(JIT_ROOT, "/tmp/sgl_jit_build", prebuilt_root=PREBUILT, use_pdl=False)
            jit_nopdl.prebuild([(g, u, sw, False, lim) for (g, u, sw, _, lim) in dsv4], [], workers=16)
            host_nopdl = jit_nopdl.host_kernels()
            log(f"host kernels ready in {time.time() - t0:.1f}s: " + "; ".join(jit.log + jit_nopdl.log))
        except Exception:
            log("host kernels unavailable:\n" + traceback.format_exc())
    # Triton warm-up (compilation) in parallel processes
    sweep_names = [n for n in args.sweep_cases.split(",") if n] or SWEEP_CASES
    if args.sweep_only:
        args.sweep, cases = True, []
    jobs = [warm_job(c) for c in cases] + [warm_job(c, pdl=False) for c in cases]
    if args.sweep:
        by_name = {c.name: c for c in CASES}
        for name in sweep_names:
            jobs += [warm_job(by_name[name], v) for v in sweep_variants(by_name[name], args.sweep_set)
                     if v["ctas_per_sm"] == 4 or args.sweep_set != "1"]
    log(f"triton warm-up of {len(jobs)} specialisations: {parallel_warm(jobs, args.workers):.1f}s")

    if host is not None:  # the jit_ep / fp8_fallback plugins find SGLang's kernels through this override
        from sglang_moe_plugins.host_kernels import use_host_kernels

        host_context = contextlib.ExitStack()
        host_context.enter_context(use_host_kernels(host))
    burn = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_burn = time.time()
    while time.time() - t_burn < 2.0:  # bring the clocks up before measuring anything
        burn @ burn
        torch.cuda.synchronize()
    del burn
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s, L2 {l2 >> 20} MiB")
    paths = Paths(host, host_nopdl)
    log("jit_ep / fp8_fallback columns: SGLang's kernels called as SGLang calls them (raw); the plugins where "
        f"the raw call cannot run the case (jit_ep plugin {'present' if paths.jit_plugin else 'absent'}, "
        f"fp8_fallback plugin {'present' if paths.fb_plugin else 'absent'}); jit_ep_plugin: through the jit_ep plugin")

    sweep = run_sweep(paths, bw, l2, log, sweep_names, args.sweep_set) if args.sweep else []
    if args.sweep_only:
        (out / "sweep.json").write_text(json.dumps({"device": device, "date": date, "copy_TBps": bw / 1e12,
                                                    "sweep": sweep}, indent=1, default=str))
        return
    (out / "partial.json").write_text(json.dumps({"copy_TBps": bw / 1e12, "sweep": sweep}, default=str))
    results = []
    for case in cases:
        try:
            r = bench_case(case, paths, bw, l2, log)
        except Exception:
            log(f"{case.name}: FAILED\n{traceback.format_exc()}")
            continue
        results.append(r)
        brief = {k: (round(v["us"], 2), round(v["frac"], 3)) for k, v in r["paths"].items() if "us" in v}
        bad = {k: v for k, v in r["checks"].items() if not v.get("pass")}
        log(f"{case.name}: rows={r['rows']} floor={r['floor_us']:.2f}us {brief} checks_failed={list(bad)}")
        for k, v in bad.items():
            log(f"   {k}: {v}")
        (out / "partial.json").write_text(json.dumps({"copy_TBps": bw / 1e12, "sweep": sweep, "results": results},
                                                     default=str))
    # host-side launch overhead of the plugin (eager; not in CUDA graphs)
    try:
        case = cases[0]
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
    summary = summarize(results)
    stamp = f"{date}_{props.name.replace(' ', '-')}"
    from sglang_moe_plugins.bench.provenance import run_info

    payload = {"device": device, "date": date, "torch": torch.__version__, "triton": triton.__version__, "run": run_info(),
               "copy_TBps": bw / 1e12, "l2_MiB": l2 >> 20, "host_kernels": None if host is None else host.source,
               "triton_eager_host_us": host_us, "summary": summary, "results": results, "sweep": sweep}
    (out / f"silu_mul_quant_{stamp}.json").write_text(json.dumps(payload, indent=1, default=str))
    table = fmt_table(results, bw, device, date)
    (out / f"silu_mul_quant_{stamp}.md").write_text(table + "\n\n## Summary\n\n```\n"
                                                    + json.dumps(summary, indent=1, default=str) + "\n```\n")
    try:
        plot(results, out / f"silu_mul_quant_{stamp}.png", f"silu_mul_quant, {device}, {date}")
    except Exception:
        log("plot failed:\n" + traceback.format_exc())
    (out / "log.txt").write_text("\n".join(log_lines))
    (out / "partial.json").unlink(missing_ok=True)
    print(table)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
