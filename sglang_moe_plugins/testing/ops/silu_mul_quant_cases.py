"""Conformance cases and inputs of op ``silu_mul_quant`` (the adapter and tolerance: :mod:`.silu_mul_quant`).

Cases come from three sources, each case labelled with where it came from:

- **catalog**: every model of the embedded catalog (gpt-oss excepted: its activation is a separate
  host path) at EP 1/2/4/8, with a decode-size and a prefill-size N (``SuiteOptions.rows``), fp32 and
  packed UE8M0 scales, the model's own swiglu_limit and the scale layout the host uses on that branch.
  ``supports()`` is asked about each at its real size; a case larger than the size budget
  (``max_elements`` input elements, small on CPU) is also run at a reduced N, labelled so.
- **edge**: a curated list, each with the reason it is there (N not a multiple of 4, G not a multiple
  of 4, every group size, swizzle, swiglu_limit, keep_fp32, empty experts, one hot expert, zero rows,
  E = 0, N = 0).
- **random**: property-based draws (``SuiteOptions.random_cases``) of E, N, D, group size, topk,
  swiglu_limit (also limits that are not exact in bf16), swizzle, scale layout, keep_fp32 and the
  masked_m pattern, seeded from the printed suite seed.

masked_m patterns keep the host's guarantee ``sum(masked_m) <= N * topk``. Real rows span many
binades (per-row magnitude ``2**k``, k in [-8, 5]) so that swiglu_limit clamps and groups differ;
padding rows of the input hold NaN (the host leaves them as the GEMM wrote them: anything), which a
plugin must not let leak into real rows.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch

from ...catalog import SiluMulQuantCase, load_catalog, silu_mul_quant_cases
from ...errors import InvalidArgumentError
from ...hardware import Platform
from ...ops import silu_mul_quant as smq
from ..case import SuiteCase, SuiteOptions, catalog_models

__all__ = [
    "MASKED_PATTERNS",
    "masked_pattern",
    "make_gateup",
    "case_elements",
    "draw_cases",
    "make_inputs",
    "make_fresh_inputs",
    "repad",
]

#: How the real rows of a case are distributed over the experts.
MASKED_PATTERNS = ("ragged", "uniform", "empty", "skewed", "full")


def case_elements(shape: smq.SiluMulQuantShape) -> int:
    """Input elements of a call (E * N * 2D): the measure of the size budget."""
    return shape.num_experts * shape.max_rows * 2 * shape.hidden


def masked_pattern(pattern: str, num_experts: int, max_rows: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """int32 ``[E]`` real-row counts following ``pattern``, with ``sum <= N * topk`` as the host guarantees."""
    e, n = num_experts, max_rows
    if pattern not in MASKED_PATTERNS:
        raise InvalidArgumentError("conformance", "masked_m pattern", pattern, f"one of {MASKED_PATTERNS}")
    if e == 0:
        return torch.zeros(0, dtype=torch.int32)
    cap = n * topk
    m = torch.zeros(e, dtype=torch.int64)
    if pattern == "uniform":
        m = torch.randint(0, n + 1, (e,), generator=gen)
    elif pattern == "ragged":
        m = torch.randint(0, n + 1, (e,), generator=gen)
        m[0] = n
        if e > 1:
            m[1] = 0
    elif pattern == "skewed":
        m = torch.randint(0, 2, (e,), generator=gen).clamp(max=n)
        m[e // 2] = n
    elif pattern == "full":
        m[: min(e, topk)] = n
    total = int(m.sum())
    if total > cap:
        keep = int(m[0]) if pattern == "ragged" else 0
        rest = m.clone()
        if pattern == "ragged":
            rest[0] = 0
        budget = cap - keep
        rest = rest * budget // max(1, int(rest.sum()))
        if pattern == "ragged":
            rest[0] = keep
        m = rest
    return m.to(torch.int32)


def make_gateup(
    shape: smq.SiluMulQuantShape, masked_m: torch.Tensor, gen: torch.Generator, *, zero_rows: bool = False
) -> torch.Tensor:
    """bf16 ``[E, N, 2D]``: real rows random over many binades, padding rows NaN."""
    e, n, d = shape.num_experts, shape.max_rows, shape.hidden
    gateup = torch.full((e, n, 2 * d), float("nan"), dtype=torch.bfloat16)
    if e == 0 or n == 0:
        return gateup
    real = smq.real_rows(masked_m, n)
    rows = int(real.sum())
    if rows == 0:
        return gateup
    magnitude = torch.exp2(torch.randint(-8, 6, (rows, 1), generator=gen).float())
    values = torch.randn(rows, 2 * d, generator=gen) * magnitude
    if zero_rows:
        values[0] = 0.0  # absmax floor 1e-10
        if rows > 1 and shape.num_groups > 1:
            values[1, : shape.group_size] = 0.0  # one zero group in a live row
            values[1, d : d + shape.group_size] = 0.0
    gateup[real] = values.to(torch.bfloat16)
    return gateup


def _cfg(platform: Platform, **kwargs: Any) -> smq.SiluMulQuantConfig:
    return smq.SiluMulQuantConfig(platform=platform, **kwargs)


def _edge_cases(platform: Platform) -> list[tuple[str, smq.SiluMulQuantShape, smq.SiluMulQuantConfig, str, str]]:
    """(label, shape, config, masked_m pattern, why) of the curated cases."""
    S = smq.SiluMulQuantShape
    p = platform
    cases = [
        (
            "N=6 column-major",
            S(3, 6, 256, 128, 2),
            _cfg(p),
            "ragged",
            "N not a multiple of 4: column-major scales pad the row stride to 8",
        ),
        (
            "N=6 packed UE8M0, G=5",
            S(2, 6, 640, 128, 2),
            _cfg(p, scale_layout="ue8m0_packed"),
            "ragged",
            "G not a multiple of 4: the last int32 of packed UE8M0 scales is partial",
        ),
        (
            "G=12 packed UE8M0",
            S(3, 4, 1536, 128, 4),
            _cfg(p, scale_layout="ue8m0_packed"),
            "uniform",
            "three int32 of packed exponents per row",
        ),
        (
            "G=5 row-major",
            S(2, 5, 640, 128, 2),
            _cfg(p, scale_layout="row_major"),
            "ragged",
            "contiguous fp32 scales with an odd group count",
        ),
        (
            "swiglu_limit=10",
            S(4, 8, 512, 128, 2),
            _cfg(p, swiglu_limit=10.0, scale_layout="row_major"),
            "ragged",
            "DeepSeek-V4's clamped SwiGLU; inputs reach 100, past the limit",
        ),
        (
            "swiglu_limit=7.3 (not exact in bf16)",
            S(2, 8, 256, 128, 2),
            _cfg(p, swiglu_limit=7.3),
            "uniform",
            "the limit is rounded to bf16 (7.3125) before clamping, as the host's kernels do",
        ),
        (
            "swizzle + swiglu_limit",
            S(4, 8, 512, 128, 2),
            _cfg(p, swiglu_limit=10.0, swizzle=True, scale_layout="row_major"),
            "ragged",
            "gran-8 interleaved gate/up (DSV4 path)",
        ),
        ("swizzle, group 32", S(2, 9, 96, 32, 2), _cfg(p, swizzle=True), "uniform", "swizzle with small groups"),
        (
            "keep_fp32",
            S(2, 8, 256, 128, 2),
            _cfg(p, keep_fp32=True),
            "uniform",
            "the caller requires fp32 intermediates: the strict tolerance applies",
        ),
        ("group 16", S(2, 5, 64, 16, 2), _cfg(p), "ragged", "smallest group size"),
        (
            "group 32 UE8M0",
            S(2, 4, 256, 32, 2),
            _cfg(p, scale_layout="ue8m0_packed"),
            "uniform",
            "group 32, packed scales",
        ),
        ("group 64 row-major", S(2, 7, 192, 64, 2), _cfg(p, scale_layout="row_major"), "ragged", "group 64"),
        ("group 256", S(2, 4, 512, 256, 2), _cfg(p), "uniform", "largest group size"),
        ("every expert empty", S(4, 8, 256, 128, 2), _cfg(p), "empty", "masked_m all zero: nothing to write"),
        (
            "one hot expert",
            S(8, 16, 256, 128, 1),
            _cfg(p),
            "skewed",
            "one expert holds every row, the rest hold 0 or 1",
        ),
        (
            "experts full",
            S(4, 8, 256, 128, 4),
            _cfg(p, scale_layout="ue8m0_packed"),
            "full",
            "every row of every expert is real",
        ),
        ("E=1 N=1", S(1, 1, 128, 128, 1), _cfg(p), "full", "a single row"),
        ("zero rows", S(3, 8, 384, 128, 2), _cfg(p), "ragged", "all-zero rows and groups: absmax floored at 1e-10"),
        (
            "tall expert N=320",
            S(2, 320, 256, 128, 2),
            _cfg(p),
            "ragged",
            "masked_m[0] = 320: more real rows than a 64-, 128- or 256-row tile",
        ),
        (
            "tall expert N=300 UE8M0",
            S(3, 300, 128, 128, 4),
            _cfg(p, scale_layout="ue8m0_packed"),
            "full",
            "every row of 3 experts real, 300 rows each: past a 256-row tile, with a partial last tile",
        ),
        ("E=0", S(0, 4, 256, 128, 2), _cfg(p), "empty", "no local experts"),
        ("N=0", S(2, 0, 256, 128, 2), _cfg(p), "empty", "no rows"),
    ]
    return cases


def _random_case(
    rng: random.Random, platform: Platform, max_elements: int
) -> tuple[smq.SiluMulQuantShape, smq.SiluMulQuantConfig, str]:
    e = rng.choice((1, 2, 3, 4, 8, 16, 32, rng.randint(1, 64)))
    n = rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 31, 64, rng.randint(1, 96)))
    group = rng.choice(smq.GROUP_SIZES)
    groups = rng.randint(1, max(1, min(16, 4096 // group)))
    d = groups * group
    while e * n * 2 * d > max_elements and n > 1:
        n = max(1, n // 2)
    while e * n * 2 * d > max_elements and e > 1:
        e = max(1, e // 2)
    topk = rng.choice((1, 2, 4, 6, 8, 10))
    limit = rng.choice((None, None, 10.0, 7.0, round(rng.uniform(0.5, 20.0), 3)))
    config = _cfg(
        platform,
        swiglu_limit=limit,
        swizzle=rng.random() < 0.25,
        scale_layout=rng.choice(smq.SCALE_LAYOUTS),
        keep_fp32=rng.random() < 0.2,
    )
    return smq.SiluMulQuantShape(e, n, d, group, topk), config, rng.choice(MASKED_PATTERNS)


def draw_cases(options: SuiteOptions, platform: Platform, seed: int) -> list[SuiteCase]:
    """Every case of ``silu_mul_quant`` for ``platform`` (see the module docstring), seeded by ``seed``."""
    budget = options.resolved_max_elements(platform)
    drawn: list[SuiteCase] = []
    seen: set[tuple[Any, ...]] = set()
    counter = iter(range(1, 1 << 30))

    def add(
        label: str,
        origin: str,
        shape: Any,
        config: Any,
        pattern: str,
        *,
        execute: bool = True,
        note: str = "",
        writable: bool = False,
        group: str = "",
        dedupe: str | None = None,
    ) -> None:
        key = (shape, config, pattern if dedupe is None else dedupe, execute)
        if key in seen:
            return
        seen.add(key)
        case_seed = (seed * 1_000_003 + next(counter)) % (1 << 31)
        drawn.append(SuiteCase(label, origin, shape, config, pattern, case_seed, execute, note, writable, group))

    if options.catalog:
        for model in catalog_models(options, load_catalog()):
            if model.gpt_oss_activation:
                continue
            for ep in options.eps:
                if model.experts % ep:
                    continue
                for ue8m0 in (False, True):
                    try:
                        calls: list[SiluMulQuantCase] = silu_mul_quant_cases(
                            model, ep=ep, rows=options.rows, platform=platform, ue8m0=ue8m0
                        )
                    except InvalidArgumentError:
                        continue
                    for index, call in enumerate(calls):
                        pattern = "ragged" if index == 0 else "uniform"
                        label = call.label + (" UE8M0" if ue8m0 else "")
                        size = case_elements(call.shape)
                        group = model.short_name
                        if size <= budget:
                            add(label, "catalog", call.shape, call.config, pattern, group=group)
                            continue
                        rows = max(1, budget // max(1, size // call.shape.max_rows))
                        add(
                            label,
                            "catalog",
                            call.shape,
                            call.config,
                            pattern,
                            execute=False,
                            group=group,
                            note=f"over the size budget ({size} > {budget} input elements): supports() only",
                        )
                        small = dataclasses.replace(call.shape, max_rows=rows)
                        add(
                            f"{label} (run at N={rows}: size budget)",
                            "catalog",
                            small,
                            call.config,
                            pattern,
                            group=group,
                            dedupe="scaled",
                        )
    if options.edge_cases:
        for label, shape, config, pattern, why in _edge_cases(platform):
            add(label, "edge", shape, config, pattern, note=why)
        add(
            "gateup writable",
            "edge",
            smq.SiluMulQuantShape(3, 8, 256, 128, 2),
            _cfg(platform, swiglu_limit=10.0),
            "ragged",
            note="the caller lets the plugin overwrite gateup (the host's GEMM workspace)",
            writable=True,
        )
    rng = random.Random(seed)
    for index in range(options.random_cases):
        shape, config, pattern = _random_case(rng, platform, budget)
        add(f"random #{index} (seed {seed})", "random", shape, config, pattern, writable=rng.random() < 0.2)
    return drawn


def make_inputs(case: SuiteCase, device: torch.device) -> smq.SiluMulQuantInputs:
    """Fresh inputs of ``case`` on ``device`` (seeded by ``case.seed``)."""
    shape = case.shape
    gen = torch.Generator().manual_seed(case.seed)
    masked = masked_pattern(case.masked_m or "ragged", shape.num_experts, shape.max_rows, shape.topk, gen)
    gateup = make_gateup(shape, masked, gen, zero_rows=case.label.startswith("zero rows") or (case.seed % 7 == 0))
    total = int(masked.sum())
    hint = None if case.seed % 3 == 0 else -(-total // shape.topk)
    return smq.SiluMulQuantInputs(gateup.to(device), masked.to(device), hint, case.inputs_writable)


def make_fresh_inputs(case: SuiteCase, fresh: SuiteCase, device: torch.device) -> smq.SiluMulQuantInputs:
    """Inputs of ``case``'s key with new values (drawn from ``fresh.seed``) and ``case``'s own masked_m:
    a second call of the key that only a plugin keeping state across calls gets wrong."""
    base = make_inputs(case, device)
    gen = torch.Generator().manual_seed(fresh.seed)
    gateup = make_gateup(case.shape, base.masked_m.cpu(), gen)
    return dataclasses.replace(base, gateup=gateup.to(device))


def repad(inputs: smq.SiluMulQuantInputs, case: SuiteCase) -> smq.SiluMulQuantInputs | None:
    """``inputs`` with the padding rows (row >= masked_m[e]) of gateup set to large finite values
    (NaN before): the real rows of a plugin's outputs must not change. None when nothing is padding."""
    shape = case.shape
    if shape.num_experts == 0 or shape.max_rows == 0:
        return None
    pad = ~smq.real_rows(inputs.masked_m.cpu(), shape.max_rows).to(inputs.gateup.device)
    if not bool(pad.any()):
        return None
    gen = torch.Generator().manual_seed(case.seed + 17)
    gateup = inputs.gateup.clone()
    values = torch.randn(int(pad.sum()), gateup.shape[-1], generator=gen) * 4096.0
    gateup[pad] = values.to(torch.bfloat16).to(gateup.device)
    return dataclasses.replace(inputs, gateup=gateup, masked_m=inputs.masked_m.clone())
