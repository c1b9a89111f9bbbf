"""Measure every enabled ``silu_mul_quant`` plugin on a model's calls (one GPU, one run, side by side).

Each call is timed on input/output sets rotated past three times the L2 cache, every expert holding
``N`` real rows (the padded count: the heaviest load of that shape). ``frac`` is the copy ceiling's
time for the call's real bytes (2D bf16 read, D fp8 and the scales written) over the measured time.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import torch

from ..catalog import ModelSpec, platform_uses_ue8m0, silu_mul_quant_cases
from ..contract import as_support as _as_support
from ..hardware import Platform
from ..ops import silu_mul_quant as smq
from .timing import Timer, random_gateup, rotation_sets

__all__ = ["BenchCase", "Measurement", "bench_cases", "measure", "call_bytes", "DECODE_MAX_ROWS"]

#: N at or below this is reported as a decode-size call, above as prefill.
DECODE_MAX_ROWS = 256
#: Rotated input sets stay under this many bytes.
_MAX_ROTATION_BYTES = 8 * 2**30


@dataclass(frozen=True)
class BenchCase:
    label: str
    model: str
    phase: str  # decode | prefill
    shape: smq.SiluMulQuantShape
    config: smq.SiluMulQuantConfig


@dataclass(frozen=True)
class Measurement:
    """One plugin on one call: ``status`` is timed, disabled, unavailable, unsupported or error."""

    case: str
    plugin: str
    priority: int
    status: str
    us: float | None
    frac: float | None
    reason: str


def bench_cases(
    models: tuple[ModelSpec, ...], *, ep: int, tp: int, rows: tuple[int, ...], platform: Platform
) -> list[BenchCase]:
    out = []
    for model in models:
        if model.gpt_oss_activation:
            continue  # handed to SGLang's own path (not modelled)
        for case in silu_mul_quant_cases(
            model, ep=ep, tp=tp, rows=rows, platform=platform, ue8m0=platform_uses_ue8m0(platform)
        ):
            phase = "decode" if case.shape.max_rows <= DECODE_MAX_ROWS else "prefill"
            out.append(BenchCase(case.label, model.short_name, phase, case.shape, case.config))
    return out


def call_bytes(shape: smq.SiluMulQuantShape, config: smq.SiluMulQuantConfig, real_rows: int) -> int:
    """Bytes a call must move for ``real_rows`` rows: 2D bf16 in, D fp8 out, the scales out."""
    scale_bytes = shape.packed_groups * 4 if config.scale_ue8m0 else shape.num_groups * 4
    return real_rows * (2 * shape.hidden * 2 + shape.hidden + scale_bytes)


def _launcher(plugin: Any, shape: Any, config: Any) -> Callable[[Any, Any], Any]:
    prepare = getattr(plugin, "prepare", None)
    closure = prepare(shape, config) if callable(prepare) else None
    if closure is not None:
        return closure
    return lambda inputs, outputs: plugin.run(inputs, outputs, shape, config)


def _time_plugin(record: Any, case: BenchCase, sets: list[tuple[Any, Any]], timer: Timer) -> tuple[float | None, str]:
    launch = _launcher(record.plugin, case.shape, case.config)
    inputs, outputs = sets[0]
    returned = launch(inputs, outputs)
    smq.validate_outputs(outputs if returned is None else returned, case.shape, case.config, record.name)
    calls = [lambda i=i, o=o: launch(i, o) for i, o in sets]
    return timer.time_us(calls), f"{len(sets)} rotated input sets"


def measure(
    registry: Any,
    cases: list[BenchCase],
    timer: Timer,
    device: torch.device,
    progress: TextIO | None = sys.stderr,
    seed: int = 0,
) -> tuple[float, list[Measurement]]:
    """``(copy bandwidth in bytes/s, one Measurement per case and plugin)``."""
    here = cases[0].config.platform if cases else Platform.cpu()
    bandwidth = timer.copy_bandwidth()
    records = registry.records(smq.OP)
    results: list[Measurement] = []
    gen = torch.Generator(device=device).manual_seed(seed)
    total = len(cases) * len(records)
    step = 0
    for case in cases:
        shape = case.shape
        real = shape.num_experts * shape.max_rows
        floor_us = call_bytes(shape, case.config, real) / bandwidth * 1e6
        per_set = 2 * real * (2 * shape.hidden * 2 + shape.hidden)
        nsets = (
            rotation_sets(per_set, max_sets=max(1, _MAX_ROTATION_BYTES // max(1, per_set)))
            if device.type == "cuda"
            else 1
        )
        sets: list[tuple[Any, Any]] | None = None
        for record in records:
            step += 1
            status, us, reason = "timed", None, ""
            avail = None
            try:
                avail = record.plugin.available(here) if hasattr(record.plugin, "available") else None
                support = (
                    _as_support(record.plugin.supports(shape, case.config), record.name) if record.enabled else None
                )
            except Exception as exc:  # noqa: BLE001 - report it, measure the others
                status, reason = "error", f"{type(exc).__name__}: {exc}"
            else:
                if not record.enabled:
                    status, reason = "disabled", record.status
                elif avail is not None and not avail:
                    status, reason = "unavailable", avail.reason
                elif not support:
                    status, reason = "unsupported", support.reason  # type: ignore[union-attr]  # set whenever avail is
            if status == "timed":
                if sets is None:
                    masked = torch.full((shape.num_experts,), shape.max_rows, dtype=torch.int32, device=device)
                    sets = [
                        (
                            smq.SiluMulQuantInputs(
                                random_gateup(shape.num_experts, shape.max_rows, shape.hidden, gen, device=device.type),
                                masked,
                            ),
                            smq.allocate_outputs(shape, case.config, device),
                        )
                        for _ in range(nsets)
                    ]
                try:
                    us, reason = _time_plugin(record, case, sets, timer)
                except Exception as exc:  # noqa: BLE001 - e.g. a plugin that cannot be captured in a CUDA graph
                    first = (str(exc).strip().splitlines() or [""])[0]
                    status, reason = "error", f"{type(exc).__name__}: {first[:200]}"
            frac = floor_us / us if us else None
            results.append(Measurement(case.label, record.name, record.priority, status, us, frac, reason))
            if progress is not None:
                shown = f"{us:.1f} us ({frac:.2f} of copy)" if us else f"{status}: {reason}"
                print(f"[{step}/{total}] {case.label}: {record.name}: {shown}", file=progress, flush=True)
        del sets
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return bandwidth, results


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
