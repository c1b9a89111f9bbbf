"""The measurements of ``benchmarks/contig_e2e.py`` for one configuration: the activation steps (stock and package,
compact and masked), the timing (CUDA-graph replays for decode, events around eager calls for prefill, input sets
rotated), the activation's share and the numerics against the fp32 reference.

Paths (per configuration and token count):

- ``stock_compact``: 0.5.23's compact layout with its two-kernel activation (``silu_and_mul_clamp`` or
  ``silu_and_mul`` into bf16, then ``sglang_per_token_group_quant_fp8``): what runs today for guard-refused configs
  and DeepEP normal;
- ``package_compact``: the same layer with the activation served by the ``silu_mul_quant_contig`` op, plugin
  ``contig_triton`` forced, bound and called through the selector on SGLang-layout outputs (what the hook does);
- ``masked_package``: the masked layout with the ``silu_mul_quant`` op's ``triton`` plugin (what lifting the guard
  gives);
- ``masked_stock``: the masked layout with 0.5.23's own masked activation (DSV4 JIT kernel with the limit, else the
  fused masked ``per_token_group_quant``), where the guard permits it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .contig_e2e_cases import E2ECase, masked_padded_m
from .contig_e2e_layers import (
    Inputs,
    Layer,
    Weights,
    make_deepep_inputs,
    make_inputs,
    make_weights,
    reference_moe,
    rel_l2,
)
from .timing import graph_time_us

__all__ = ["Env", "run_case", "warm_case", "DECODE_MAX", "PATHS", "WARM_MASKED_BYTES"]

DECODE_MAX = 256  # token counts up to this are decode: timed as CUDA-graph replays
PATHS = ("stock_compact", "package_compact", "masked_package", "masked_stock")
_POISON_BYTES = 1 << 31
#: Warm-up workers run side by side: they skip masked calls larger than this (the main process compiles those).
WARM_MASKED_BYTES = 12 << 30


class Env:
    """What every case uses: DeepGEMM, SGLang's permute kernels, SGLang's activation/quant kernels, the selector."""

    def __init__(self, dg: Any, kernels: Any, contig: Any, jit: Any, selector: Any, contig_plugin: str | None) -> None:
        self.dg, self.k, self.contig, self.jit, self.selector = dg, kernels, contig, jit, selector
        self.contig_plugin = contig_plugin  # None: the package compact column is missing

    def ptgq(self, x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``sglang_per_token_group_quant_fp8(x, group)`` with Hopper's flags (row-major fp32 scales)."""
        q = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
        s = torch.empty((*x.shape[:-1], x.shape[-1] // group), device=x.device, dtype=torch.float32)
        self.contig.per_token_group_quant_fp8(
            x, group, column_major_scales=False, scale_tma_aligned=False, scale_ue8m0=False, output_q=q, output_s=s
        )
        return q, s

    # -- activations: act(gateup, masked_m) -> (fp8, scales)
    def stock_contig_act(self, limit: float | None) -> Callable:
        def act(gateup: torch.Tensor, _: Any) -> tuple[torch.Tensor, torch.Tensor]:
            n = gateup.shape[1]
            down = torch.empty((gateup.shape[0], n // 2), device=gateup.device, dtype=torch.bfloat16)
            if limit is not None:
                self.contig.silu_and_mul_clamp(gateup.view(-1, n), down, limit)
            else:
                self.contig.silu_and_mul(gateup.view(-1, n), down)
            return self.ptgq(down, 128)

        return act

    def package_contig_act(self, d: int, limit: float | None) -> Callable:
        from ..ops import silu_mul_quant_contig as op

        probe = torch.empty((0, 2 * d), dtype=torch.bfloat16, device="cuda")
        shape, config = op.describe(
            probe, group_size=128, swiglu_limit=limit, scale_layout="row_major", keep_fp32=False
        )
        bound = self.selector.bind(op.OP, shape, config)
        if self.contig_plugin is not None and bound.record.name != self.contig_plugin:
            raise RuntimeError(f"selector bound {bound.record.name}, not {self.contig_plugin}")

        def act(gateup: torch.Tensor, _: Any) -> tuple[torch.Tensor, torch.Tensor]:
            rows = gateup.shape[0]
            out = torch.empty((rows, d), device=gateup.device, dtype=torch.float8_e4m3fn)
            scale = torch.empty((rows, d // 128), device=gateup.device, dtype=torch.float32)
            self.selector.call(bound, op.ContigInputs(gateup, True), op.ContigOutputs(out, scale), device=gateup.device)
            return out, scale

        return act

    def package_masked_act(self, topk: int, limit: float | None, tokens: int) -> Callable:
        from ..ops import silu_mul_quant as op

        layout: op.ScaleLayout = "row_major" if limit is not None else "column_major"

        def act(gateup: torch.Tensor, masked_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            shape, config = op.describe(
                gateup, masked_m, group_size=128, topk=topk, swiglu_limit=limit, scale_layout=layout
            )
            bound = self.selector.bind(op.OP, shape, config)
            outputs = self.selector.call(bound, op.SiluMulQuantInputs(gateup, masked_m, tokens, True))
            return outputs.out, outputs.scale

        return act

    def stock_masked_act(self, topk: int, limit: float | None) -> Callable:
        def act(gateup: torch.Tensor, masked_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            e, n, d2 = gateup.shape
            if limit is None:
                return self.jit.per_token_group_quant(
                    gateup,
                    group_size=128,
                    scale_ue8m0=False,
                    fuse_silu_and_mul=True,
                    masked_m=masked_m,
                    expected_m=None,
                    column_major_scales=True,
                )
            out = torch.empty((e, n, d2 // 2), device=gateup.device, dtype=torch.float8_e4m3fn)
            scale = torch.empty((e, n, d2 // 256), device=gateup.device, dtype=torch.float32)
            self.jit.silu_and_mul_masked_post_quant(
                gateup,
                out,
                scale,
                128,
                masked_m,
                scale_ue8m0=False,
                topk=topk,
                transposed=False,
                swiglu_limit=limit,
                swizzle=False,
            )
            return out, scale

        return act


def _eager_us(calls: list[Callable[[], object]], rounds: int = 10) -> float:
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(rounds):
        start.record()
        for fn in calls:
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)


def _time(calls: list[Callable[[], object]], decode: bool) -> float:
    return graph_time_us(calls, min_calls=len(calls), target_ms=30.0) if decode else _eager_us(calls)


def _poison() -> None:
    """Fill freed allocator memory with NaN bytes, so an output row nobody writes shows up in the error."""
    try:
        torch.empty(_POISON_BYTES, dtype=torch.uint8, device="cuda").fill_(0xFF)
    except torch.OutOfMemoryError:
        pass


def _inputs(env: Env, case: E2ECase, t: int, gen: torch.Generator) -> Inputs:
    if case.mode == "deepep_normal":
        return make_deepep_inputs(t, case.hidden, case.experts, case.local_experts, case.topk, case.ep, env.ptgq, gen)
    return make_inputs(t, case.hidden, case.experts, case.topk, gen)


def run_case(env: Env, case: E2ECase, seed: int, log: Callable[[str], None], num_tokens: int = 128) -> list[dict]:
    """Every token count of ``case``: one record each."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t0 = time.time()
    w = make_weights(case.local_experts, case.inter, case.hidden, gen)
    layer = Layer(env.dg, env.k, env.ptgq, w, case.topk, case.experts)
    limit = case.swiglu_limit
    compact = layer.deepep if case.mode == "deepep_normal" else layer.compact
    acts: dict[str, tuple[Callable, Callable]] = {"stock_compact": (compact, env.stock_contig_act(limit))}
    notes: dict[str, str] = {}
    if env.contig_plugin is not None:
        try:
            acts["package_compact"] = (compact, env.package_contig_act(case.inter, limit))
        except Exception as exc:  # recorded, the other columns still run
            notes["package_compact"] = f"{type(exc).__name__}: {exc}"
    else:
        notes["package_compact"] = "contig_triton plugin not available"
    masked_ok = case.mode == "standard"
    if not masked_ok:
        notes["masked"] = "DeepEP normal dispatch is contiguous only"
    records = []
    for t in case.tokens:
        paths = dict(acts)
        if masked_ok:
            paths["masked_package"] = (layer.masked, env.package_masked_act(case.topk, limit, t))
            if case.stock_layout == "masked":
                paths["masked_stock"] = (layer.masked, env.stock_masked_act(case.topk, limit))
        rec = _run_tokens(env, case, layer, paths, t, gen, dict(notes), log)
        records.append(rec)
    log(f"{case.label}: {time.time() - t0:.1f} s")
    # numerics on fresh inputs, once per configuration
    errors = _numerics(env, case, layer, acts, masked_ok, num_tokens, seed + 1)
    for rec in records:
        rec["rel_l2"] = errors
    del layer, w
    torch.cuda.empty_cache()
    return records


def warm_case(env: Env, case: E2ECase, seed: int, log: Callable[[str], None]) -> None:
    """Run every path of ``case`` once per token count on uninitialized weights, no timing: DeepGEMM's and Triton's
    JIT compile their kernels into the on-disk caches the timing process then reads (several of these run in
    parallel worker processes, so that the compilers use several CPU cores)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t0 = time.time()
    e, d, k = case.local_experts, case.inter, case.hidden
    f8, f32 = torch.float8_e4m3fn, torch.float32
    w = Weights(
        torch.zeros((e, 2 * d, k), dtype=f8, device="cuda"),
        torch.ones((e, 2 * d // 128, k // 128), dtype=f32, device="cuda"),
        torch.zeros((e, k, d), dtype=f8, device="cuda"),
        torch.ones((e, k // 128, d // 128), dtype=f32, device="cuda"),
    )
    layer = Layer(env.dg, env.k, env.ptgq, w, case.topk, case.experts)
    compact = layer.deepep if case.mode == "deepep_normal" else layer.compact
    acts = [env.stock_contig_act(case.swiglu_limit)]
    if env.contig_plugin is not None:
        acts.append(env.package_contig_act(case.inter, case.swiglu_limit))
    for t in case.tokens:
        inp = _inputs(env, case, t, gen)
        for act in acts:
            compact(inp, act)
        if case.mode == "standard" and case.masked_bytes(t) <= WARM_MASKED_BYTES:
            layer.masked(inp, env.package_masked_act(case.topk, case.swiglu_limit, t))
            if case.stock_layout == "masked":
                layer.masked(inp, env.stock_masked_act(case.topk, case.swiglu_limit))
        layer.keep.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    log(f"warm {case.label}: {time.time() - t0:.1f} s")


def _run_tokens(
    env: Env,
    case: E2ECase,
    layer: Layer,
    paths: dict,
    t: int,
    gen: torch.Generator,
    notes: dict,
    log: Callable[[str], None],
) -> dict:
    decode = t <= DECODE_MAX
    n_sets = 8 if decode else 2
    sets = [_inputs(env, case, t, gen) for _ in range(n_sets)]
    rec: dict[str, Any] = {
        "case": case.label,
        "tokens": t,
        "decode": decode,
        "input_sets": n_sets,
        "layer_us": {},
        "act_us": {},
        "notes": notes,
    }
    if case.mode == "standard":
        rec["masked_m_max"] = masked_padded_m(t)
        rec["masked_extra_bytes"] = case.masked_bytes(t)
    for name, (fn, act) in paths.items():
        torch.cuda.empty_cache()
        if name.startswith("masked"):
            free = torch.cuda.mem_get_info()[0]
            need = case.masked_bytes(t) * 5 // 4  # SGLang's estimate plus the scale transforms' copies
            if need > 0.9 * free:
                notes[name] = f"skipped: masked layout needs ~{need / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"
                continue
        try:
            us = _time([lambda s=s: fn(s, act) for s in sets], decode)  # type: ignore[misc]  # mypy infers no lambda with a default
            fn(sets[0], act)  # eager, so that layer.keep holds this path's activation input
            keep = dict(layer.keep)
            g, mm = keep["gateup"], keep["masked_m"]
            act_us = graph_time_us([lambda g=g, mm=mm: act(g, mm)], min_calls=8, target_ms=20.0)
            layer.keep.clear()
        except torch.OutOfMemoryError as exc:
            notes[name] = f"out of memory: {str(exc).splitlines()[0]}"
            layer.keep.clear()
            torch.cuda.empty_cache()
            continue
        rec["layer_us"][name] = us
        rec["act_us"][name] = act_us
        if name == "stock_compact":
            rec["compact_rows"], rec["block_e"] = keep["all_tokens"], keep["block_e"]
        log(f"  {case.label} T={t} {name}: layer {us:.1f} us, activation {act_us:.1f} us")
    return rec


def _numerics(env: Env, case: E2ECase, layer: Layer, acts: dict, masked_ok: bool, t: int, seed: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inp = _inputs(env, case, t, gen)
    torch.backends.cuda.matmul.allow_tf32 = False
    ref = reference_moe(inp, layer.w, case.swiglu_limit)
    paths = dict(acts)
    if masked_ok:
        paths["masked_package"] = (layer.masked, env.package_masked_act(case.topk, case.swiglu_limit, t))
        if case.stock_layout == "masked":
            paths["masked_stock"] = (layer.masked, env.stock_masked_act(case.topk, case.swiglu_limit))
    errors: dict[str, Any] = {"tokens": t}
    for name, (fn, act) in paths.items():
        try:
            layer.keep.clear()
            torch.cuda.empty_cache()
            _poison()
            out = fn(inp, act)
            torch.cuda.synchronize()
            errors[name] = rel_l2(out, ref)
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    layer.keep.clear()
    return errors
