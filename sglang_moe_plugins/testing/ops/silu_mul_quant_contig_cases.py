"""Conformance cases and inputs of op ``silu_mul_quant_contig`` (the adapter and tolerance: :mod:`.silu_mul_quant_contig`).

The op's shape key holds no row count: M is the call's (``inputs.gateup.shape[0]``). A case carries its M
in ``SuiteCase.masked_m`` as ``"M=<rows>"`` (the field that describes a case's rows; the ``mega_moe``
adapter keeps its token count there the same way): :func:`case_rows` reads it back.

Cases come from three sources, each case labelled with where it came from:

- **catalog**: every model of the embedded catalog (gpt-oss excepted: its activation is a separate host
  path) at MoE-TP 1/2/4/8 (D = intermediate size / TP, where that leaves D a multiple of the group), fp32
  and packed UE8M0 scales, the model's own swiglu_limit and group size (128 when the catalog gives none).
  M is the compact row count SGLang's runner computes for T tokens (``SuiteOptions.rows``, 128 and 1024
  by default) routed to top-k of all the model's experts, each expert padded to DeepGEMM's contiguous
  alignment (:func:`compact_rows`, block 128). ``supports()`` is asked about each; a case larger than
  the size budget (``max_elements`` input elements, small on CPU) also runs at a reduced M, labelled so.
- **edge**: a curated list, each with the reason it is there: M = 0, 1, 3, 4, 5, 127 and 4097 (the
  packed scales' row stride Ma = M rounded up to 4), G not a multiple of 4, every group size, swizzle,
  swiglu_limit, keep_fp32, gateup writable, all-zero rows, catalog D values.
- **random**: property-based draws (``SuiteOptions.random_cases``) of M, D (from the catalog or
  random), group size (32/64/128 mostly), swiglu_limit, swizzle, scale layout, keep_fp32 and
  gateup_writable, seeded from the printed suite seed.

Every row of the input is computed and checked (the op has no mask): rows span many binades (per-row
magnitude ``2**k``, k in [-8, 5]) so that swiglu_limit clamps and groups differ.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from ...catalog import load_catalog
from ...errors import InvalidArgumentError
from ...hardware import Platform
from ...ops import silu_mul_quant as smq, silu_mul_quant_contig as contig
from ..case import SuiteCase, SuiteOptions, catalog_models
from .silu_mul_quant_cases import make_gateup

__all__ = [
    "CONTIG_BLOCK",
    "TPS",
    "EDGE_ROWS",
    "FRESH_EXTRA_ROWS",
    "compact_rows",
    "rows_label",
    "case_rows",
    "case_elements",
    "catalog_hiddens",
    "draw_cases",
    "make_gateup_rows",
    "make_inputs",
    "make_fresh_inputs",
]

#: DeepGEMM's contiguous-layout alignment (sgl-deep-gemm 0.1.5.post1): every non-empty expert is padded to it.
CONTIG_BLOCK = 128
#: MoE tensor-parallel sizes of the catalog cases (D = intermediate size / TP).
TPS = (1, 2, 4, 8)
#: The row counts every edge list covers (0, a single row, around the 4-row packing, a tile, past 4096).
EDGE_ROWS = (0, 1, 3, 4, 5, 127, 4097)
#: The second call of a key (``second_call``) has this many more rows: M is the call's, not the key's.
FRESH_EXTRA_ROWS = 3


def compact_rows(tokens: int, topk: int, experts: int, block: int = CONTIG_BLOCK) -> int:
    """SGLang's compact row count for ``tokens`` tokens routed to ``topk`` of ``experts`` experts:
    ``block * (min(a, E) + (a - min(a, E)) // block)`` with ``a = tokens * topk`` (HOST-FACTS, "The compact row count")."""
    assignments = tokens * topk
    first = min(assignments, experts)
    return block * (first + (assignments - first) // block)


def rows_label(rows: int) -> str:
    """The ``SuiteCase.masked_m`` text of a case of ``rows`` rows."""
    return f"M={rows}"


def case_rows(case: SuiteCase) -> int:
    """M of a case (from ``case.masked_m``, ``"M=<rows>"``)."""
    text = case.masked_m or ""
    if not text.startswith("M=") or not text[2:].isdigit():
        raise InvalidArgumentError("conformance", "case.masked_m", text, '"M=<rows>" (a silu_mul_quant_contig case)')
    return int(text[2:])


def case_elements(shape: contig.ContigShape, rows: int) -> int:
    """Input elements of a call (M * 2D): the measure of the size budget."""
    return rows * 2 * shape.hidden


def catalog_hiddens() -> tuple[int, ...]:
    """Every D = intermediate size / TP (TP in :data:`TPS`) of the catalog's models (gpt-oss excepted), sorted."""
    return tuple(
        sorted({m.inter // tp for m in load_catalog() if not m.gpt_oss_activation for tp in TPS if m.inter % tp == 0})
    )


def _cfg(platform: Platform, **kwargs: Any) -> contig.ContigConfig:
    return contig.ContigConfig(platform=platform, **kwargs)


_UE = {"scale_layout": "ue8m0_packed"}
_LIMIT = {"swiglu_limit": 10.0}


def _edge_cases(platform: Platform) -> list[tuple[str, contig.ContigShape, contig.ContigConfig, int, str, bool]]:
    """(label, shape, config, M, why, gateup_writable) of the curated cases."""
    S = contig.ContigShape
    p = platform

    def c(**kwargs: Any) -> contig.ContigConfig:
        return _cfg(p, **kwargs)

    return [
        ("M=0", S(256, 128), c(), 0, "no rows: nothing to write", False),
        ("M=0 UE8M0", S(256, 128), c(**_UE), 0, "no rows, packed scales: a [ceil(G/4), 0] buffer", False),
        ("M=1", S(128, 128), c(), 1, "a single row of a single group", False),
        ("M=1 UE8M0 G=5", S(640, 128), c(**_UE), 1, "one row; G not a multiple of 4: the last int32 is partial", False),
        (
            "M=3 UE8M0 group 32",
            S(256, 32),
            c(**_UE),
            3,
            "M not a multiple of 4: the packed row stride is Ma = 4",
            False,
        ),
        ("M=4 UE8M0", S(512, 128), c(**_UE), 4, "Ma = M: the packed buffer has no spare column", False),
        ("M=5 UE8M0 G=12", S(1536, 128), c(**_UE), 5, "Ma = 8; three int32 of exponents per row", False),
        ("M=5 group 64", S(384, 64), c(), 5, "contiguous fp32 scales, odd M", False),
        (
            "M=127 swiglu_limit=10 (DeepSeek-V4-Flash TP4)",
            S(512, 128),
            c(**_LIMIT),
            127,
            "one row short of a 128-row tile; DeepSeek-V4's clamped SwiGLU, inputs past the limit",
            False,
        ),
        ("M=127 UE8M0 swiglu_limit=10", S(512, 128), c(**_LIMIT, **_UE), 127, "Ma = 128 with 127 rows", False),
        (
            "M=4097 UE8M0 group 32",
            S(64, 32),
            c(**_UE),
            4097,
            "one row past 4096: a partial last tile; Ma = 4100",
            False,
        ),
        ("M=4097 group 64", S(64, 64), c(), 4097, "one row past 4096, fp32 scales", False),
        (
            "group 16, D=176 (GLM-4.5-Air TP8) UE8M0",
            S(176, 16),
            c(**_UE),
            6,
            "smallest group; a catalog D that is no multiple of 128: G = 11",
            False,
        ),
        ("group 32", S(256, 32), c(), 9, "SGLang's fused contig kernel's small group", False),
        ("group 64 UE8M0", S(384, 64), c(**_UE), 7, "group 64, packed scales", False),
        ("group 256", S(512, 256), c(), 4, "largest group size", False),
        ("swizzle", S(256, 128), c(swizzle=True), 8, "gran-8 interleaved gate/up", False),
        (
            "swizzle + swiglu_limit UE8M0",
            S(512, 128),
            c(swizzle=True, **_LIMIT, **_UE),
            9,
            "the DSV4 path: swizzled input, clamp, packed scales",
            False,
        ),
        ("swizzle, group 32", S(96, 32), c(swizzle=True), 9, "swizzle with small groups", False),
        (
            "swiglu_limit=7.3 (not exact in bf16)",
            S(256, 128),
            c(swiglu_limit=7.3),
            8,
            "the limit is rounded to bf16 (7.3125) before clamping, as the host's kernels do",
            False,
        ),
        (
            "keep_fp32",
            S(256, 128),
            c(keep_fp32=True),
            8,
            "the caller requires the fp32 product: the strict tolerance applies",
            False,
        ),
        ("keep_fp32 UE8M0 group 32", S(256, 32), c(keep_fp32=True, **_UE), 8, "strict tolerance, packed scales", False),
        (
            "keep_fp32 + swizzle + swiglu_limit",
            S(512, 128),
            c(keep_fp32=True, swizzle=True, **_LIMIT),
            6,
            "SGLang's fused contig kernel's call (silu_mul_keep_fp32)",
            False,
        ),
        ("zero rows", S(384, 128), c(), 5, "all-zero rows and groups: absmax floored at 1e-10", False),
        ("zero rows UE8M0", S(384, 128), c(**_UE), 5, "the floored scale rounded up to a power of two", False),
        (
            "gateup writable",
            S(256, 128),
            c(**_LIMIT),
            8,
            "the caller lets the plugin overwrite gateup (the host's GEMM output), as SGLang's hook does",
            True,
        ),
        (
            "gateup writable UE8M0 keep_fp32",
            S(512, 128),
            c(keep_fp32=True, **_UE),
            5,
            "writable input, strict call",
            True,
        ),
    ]


def _random_case(
    rng: random.Random, platform: Platform, max_elements: int, hiddens: tuple[int, ...]
) -> tuple[contig.ContigShape, contig.ContigConfig, int]:
    group = rng.choice((32, 64, 128, 128, rng.choice(contig.GROUP_SIZES)))
    fitting = [d for d in hiddens if d % group == 0 and d <= 4096]
    if fitting and rng.random() < 0.6:
        hidden = rng.choice(fitting)
    else:
        hidden = group * rng.randint(1, max(1, min(16, 4096 // group)))
    rows = rng.choice((0, 1, 2, 3, 4, 5, 7, 8, 31, 64, 127, 128, 129, rng.randint(1, 600)))
    while rows * 2 * hidden > max_elements and rows > 1:
        rows = max(1, rows // 2)
    config = _cfg(
        platform,
        swiglu_limit=rng.choice((None, None, 10.0, 7.0, round(rng.uniform(0.5, 20.0), 3))),
        swizzle=rng.random() < 0.25,
        scale_layout=rng.choice(contig.SCALE_LAYOUTS),
        keep_fp32=rng.random() < 0.25,
    )
    return contig.ContigShape(hidden, group), config, rows


def draw_cases(options: SuiteOptions, platform: Platform, seed: int) -> list[SuiteCase]:
    """Every case of ``silu_mul_quant_contig`` for ``platform`` (see the module docstring), seeded by ``seed``."""
    budget = options.resolved_max_elements(platform)
    drawn: list[SuiteCase] = []
    seen: set[tuple[Any, ...]] = set()
    counter = iter(range(1, 1 << 30))

    def add(
        label: str,
        origin: str,
        shape: contig.ContigShape,
        config: contig.ContigConfig,
        rows: int,
        *,
        execute: bool = True,
        note: str = "",
        writable: bool = False,
        group: str = "",
    ) -> None:
        key = (shape, config, rows, execute, writable)
        if key in seen:
            return
        seen.add(key)
        case_seed = (seed * 1_000_003 + next(counter)) % (1 << 31)
        drawn.append(
            SuiteCase(label, origin, shape, config, rows_label(rows), case_seed, execute, note, writable, group)
        )

    if options.catalog:
        for model in catalog_models(options, load_catalog()):
            if model.gpt_oss_activation:
                continue
            group_size = model.group_size or 128
            for tp in TPS:
                if model.inter % tp or (model.inter // tp) % group_size:
                    continue
                shape = contig.ContigShape(model.inter // tp, group_size)
                limit = model.swiglu_limit
                for layout in contig.SCALE_LAYOUTS:
                    config = _cfg(platform, swiglu_limit=limit, scale_layout=layout)
                    for tokens in options.rows:
                        rows = compact_rows(tokens, model.topk, model.experts)
                        label = (
                            f"{model.short_name} TP{tp} T={tokens} (M={rows})"
                            + (f" limit={limit:g}" if limit is not None else "")
                            + (" UE8M0" if layout == "ue8m0_packed" else "")
                        )
                        size = case_elements(shape, rows)
                        if size <= budget:
                            add(label, "catalog", shape, config, rows, group=model.short_name)
                            continue
                        add(
                            label,
                            "catalog",
                            shape,
                            config,
                            rows,
                            execute=False,
                            group=model.short_name,
                            note=f"over the size budget ({size} > {budget} input elements): supports() only",
                        )
                        small = max(1, budget // (2 * shape.hidden))
                        add(
                            f"{label} (run at M={small}: size budget)",
                            "catalog",
                            shape,
                            config,
                            small,
                            group=model.short_name,
                        )
    if options.edge_cases:
        for label, shape, config, rows, why, writable in _edge_cases(platform):
            add(label, "edge", shape, config, rows, note=why, writable=writable)
    rng = random.Random(seed)
    hiddens = catalog_hiddens()
    for index in range(options.random_cases):
        shape, config, rows = _random_case(rng, platform, budget, hiddens)
        add(f"random #{index} M={rows} (seed {seed})", "random", shape, config, rows, writable=rng.random() < 0.25)
    return drawn


def make_gateup_rows(
    shape: contig.ContigShape, rows: int, gen: torch.Generator, *, zero_rows: bool = False
) -> torch.Tensor:
    """bf16 ``[M, 2D]`` contiguous on the CPU: every row random over many binades (the masked op's
    :func:`.silu_mul_quant_cases.make_gateup` for one expert whose rows are all real)."""
    one = smq.SiluMulQuantShape(1, rows, shape.hidden, shape.group_size, 1)
    return make_gateup(one, torch.tensor([rows], dtype=torch.int32), gen, zero_rows=zero_rows)[0]


def _inputs(case: SuiteCase, rows: int, seed: int, device: torch.device, zero_rows: bool) -> contig.ContigInputs:
    gen = torch.Generator().manual_seed(seed)
    gateup = make_gateup_rows(case.shape, rows, gen, zero_rows=zero_rows)
    return contig.ContigInputs(gateup.to(device), case.inputs_writable)


def make_inputs(case: SuiteCase, device: torch.device) -> contig.ContigInputs:
    """Fresh inputs of ``case`` on ``device`` (seeded by ``case.seed``)."""
    zero = case.label.startswith("zero rows") or case.seed % 7 == 0
    return _inputs(case, case_rows(case), case.seed, device, zero)


def make_fresh_inputs(case: SuiteCase, fresh: SuiteCase, device: torch.device) -> contig.ContigInputs:
    """The second call of ``case``'s key: new values (from ``fresh.seed``) and :data:`FRESH_EXTRA_ROWS` more
    rows, since M is the call's, not the key's. Only a plugin that keeps state across the calls of a key
    (results, or a row count from the first call) gets it wrong."""
    return _inputs(case, case_rows(case) + FRESH_EXTRA_ROWS, fresh.seed, device, False)
