"""Conformance cases and inputs of op ``mega_moe`` (MegaMoE routed experts, ``y [T, hidden]`` out).

Cases, each labelled with where it came from, for every variant (``fp8xfp4``, ``mxf4xmxf4``,
``sm90_fp8``):

- **catalog**: every model of the embedded catalog the op can express for the variant
  (:func:`megamoe_capable`: not gpt-oss, whose activation the op does not model; hidden and
  intermediate multiples of 128, the row tile of DeepGEMM's weight-scale layouts), at EP 1/2/4/8, at
  its real size (experts, hidden, intermediate, top-k, fused shared expert for ``fp8xfp4`` as SGLang
  fuses it): ``supports()`` is asked about each. The token count is not part of the shape, so those
  cases run nothing. For EP 1 the suite also runs the model's hidden/intermediate at a decode-like
  and a prefill-like token count (:data:`DECODE_TOKENS`, :data:`PREFILL_TOKENS`), with the experts
  scaled down to the weight-size budget (:func:`weight_budget`; labelled ``run at E=..``). Under
  expert parallelism the kernel is collective over ranks: a plugin that accepts ``ep_size > 1`` is run
  over gloo ranks by :mod:`sglang_moe_plugins.testing.expert_parallel`. On CPU only
  :data:`MAX_CPU_CATALOG_RUNS` of them run.
- **edge**: zero tokens (``y`` keeps one row; nothing to write), one token, unused experts, one hot
  expert, every slot masked (``-1``: the row must still be written, with zeros), top-k 1, no clamp
  with a routed scaling factor, a fused shared expert (``fp8xfp4``), :data:`MANY_TOKENS` tokens (past
  every common row tile).
- **random**: property-based draws (``SuiteOptions.random_cases``) of variant, experts, hidden,
  intermediate, top-k, tokens (0 included), clamp, routed scaling factor, shared expert and routing
  pattern (:data:`ROUTINGS`), seeded from the printed suite seed.

Inputs and weights are built as the tests build them (:func:`make_problem`: random bf16 tokens, fp32
weights encoded into the host's DeepGEMM layouts).
"""

from __future__ import annotations

import dataclasses
import random

import torch

from ...catalog import ModelSpec, load_catalog
from ...errors import InvalidArgumentError
from ...hardware import Platform
from ...ops import mega_moe as mm
from ..case import SuiteCase, SuiteOptions, catalog_models
from .mega_moe_problem import _SMALL_TOKENS_CAP, ROUTINGS, MegaProblem, make_problem, route

__all__ = [
    "MegaProblem",
    "make_problem",
    "route",
    "ROUTINGS",
    "DECODE_TOKENS",
    "PREFILL_TOKENS",
    "MANY_TOKENS",
    "DEFAULT_CPU_WEIGHT_BUDGET",
    "DEFAULT_CUDA_WEIGHT_BUDGET",
    "MAX_CPU_CATALOG_RUNS",
    "megamoe_capable",
    "weight_budget",
    "parse_batch",
    "draw_cases",
    "make_inputs",
]

#: Token counts of the decode-like and prefill-like catalog runs.
DECODE_TOKENS = 3
PREFILL_TOKENS = 32
#: Tokens of the edge case past every common row tile (64, 128, 256).
MANY_TOKENS = 272
#: Weight elements (local experts x 3 x intermediate x hidden) a run case may hold, CPU / CUDA.
DEFAULT_CPU_WEIGHT_BUDGET = 1 << 23
DEFAULT_CUDA_WEIGHT_BUDGET = 1 << 25  # inputs are built on the CPU, then moved
_CATALOG_TOKENS_CAP = mm.DEFAULT_MAX_TOKENS_PER_RANK
#: Catalog cases run on CPU when ``SuiteOptions.max_catalog_runs`` is None (each runs real
#: hidden/intermediate sizes through a pure-torch reference: seconds each).
MAX_CPU_CATALOG_RUNS = 3


# -- inputs ---------------------------------------------------------------------------------------


# -- cases ----------------------------------------------------------------------------------------


def _weight_format(variant: str) -> mm.WeightFormat:
    return "fp8_e4m3_block128" if variant == "sm90_fp8" else "fp4_e2m1_ue8m0_g32"


def megamoe_capable(model: ModelSpec, variant: str) -> bool:
    """The op can express the model's layer in ``variant`` (what a plugin then supports is its call)."""
    if model.gpt_oss_activation or variant not in mm.VARIANTS:
        return False
    return model.hidden % 128 == 0 and model.inter % 128 == 0


def weight_budget(options: SuiteOptions, platform: Platform) -> int:
    """Weight elements a run case may hold: ``options.max_elements`` when given, else 2**23 (CPU) / 2**25 (CUDA)."""
    if options.max_elements is not None:
        return options.max_elements
    return DEFAULT_CUDA_WEIGHT_BUDGET if platform.is_cuda else DEFAULT_CPU_WEIGHT_BUDGET


def _batch(tokens: int, routing: str) -> str:
    return f"T={tokens} {routing}"


def parse_batch(text: str) -> tuple[int, str]:
    """(tokens, routing) of a case's batch label (``SuiteCase.masked_m``, e.g. ``"T=4 random"``)."""
    tokens, _, routing = (text or "T=4 random").partition(" ")
    return int(tokens.removeprefix("T=")), routing or "random"


def _random_case(rng: random.Random, platform: Platform, budget: int) -> tuple[mm.MegaMoEShape, mm.MegaMoEConfig, str]:
    variant = rng.choice(mm.VARIANTS)
    hidden = 128 * rng.randint(1, 8) if rng.random() < 0.5 else 512
    inter = 128 * rng.randint(1, 6) if rng.random() < 0.5 else rng.choice((256, 512))
    experts = rng.choice((1, 2, 3, 4, 8))
    while experts > 1 and experts * 3 * hidden * inter > budget:
        experts //= 2
    top_k = rng.randint(1, min(8, max(1, experts)))
    tokens = rng.choice((0, 1, 2, 3, 5, 8, 16, rng.randint(1, 32)))
    shared = variant == "fp8xfp4" and rng.random() < 0.3
    clamp = rng.choice((None, 10.0, 7.0, round(rng.uniform(0.5, 20.0), 3)))
    rsf = rng.choice((1.0, 1.0, 2.5, round(rng.uniform(0.1, 4.0), 3)))
    shape = mm.MegaMoEShape(experts, hidden, inter, top_k, 1 if shared else 0, 1, _SMALL_TOKENS_CAP)
    config = mm.MegaMoEConfig(
        platform,
        variant,  # type: ignore[arg-type]  # one of mm.VARIANTS
        _weight_format(variant),
        activation_clamp=clamp,
        routed_scaling_factor=rsf,
    )
    return shape, config, _batch(tokens, rng.choice(ROUTINGS))


def draw_cases(options: SuiteOptions, platform: Platform, seed: int) -> list[SuiteCase]:
    """Every case of ``mega_moe`` for ``platform`` (see the module docstring), seeded by ``seed``."""
    budget = weight_budget(options, platform)
    drawn: list[SuiteCase] = []
    counter = iter(range(1, 1 << 30))

    def add(
        label: str,
        origin: str,
        shape: mm.MegaMoEShape,
        config: mm.MegaMoEConfig,
        batch: str = "",
        *,
        execute: bool = True,
        note: str = "",
        group: str = "",
    ) -> None:
        case_seed = (seed * 1_000_003 + next(counter)) % (1 << 31)
        drawn.append(SuiteCase(label, origin, shape, config, batch, case_seed, execute, note, False, group))

    def config_for(variant: str, clamp: float | None = 10.0, rsf: float = 1.0) -> mm.MegaMoEConfig:
        return mm.MegaMoEConfig(
            platform,
            variant,  # type: ignore[arg-type]  # one of mm.VARIANTS
            _weight_format(variant),
            activation_clamp=clamp,
            routed_scaling_factor=rsf,
        )

    if options.catalog:
        for model in catalog_models(options, load_catalog()):
            for variant in mm.VARIANTS:
                if not megamoe_capable(model, variant):
                    continue
                shared = model.shared if variant == "fp8xfp4" else 0  # SGLang fuses shared experts for fp8xfp4 only
                config = config_for(variant, model.swiglu_limit)
                name = f"{model.short_name} {variant}"
                for ep in options.eps:
                    if model.experts % ep:
                        continue
                    shape = mm.MegaMoEShape(
                        model.experts, model.hidden, model.inter, model.topk, shared, ep, _CATALOG_TOKENS_CAP
                    )
                    add(
                        f"{name} EP{ep}",
                        "catalog",
                        shape,
                        config,
                        execute=False,
                        group=model.short_name,
                        note="real size; the token count is not part of the shape: supports() only"
                        + ("" if ep == 1 else " (EP > 1: the kernel is collective over ranks)"),
                    )
                per_expert = 3 * model.hidden * model.inter
                run_experts = min(model.experts, 16, budget // per_expert)
                if run_experts < 1:
                    continue
                top_k = min(model.topk, run_experts)
                small = mm.MegaMoEShape(
                    run_experts, model.hidden, model.inter, top_k, min(shared, 1), 1, _CATALOG_TOKENS_CAP
                )
                for kind, tokens, routing in (
                    ("decode", DECODE_TOKENS, "distinct"),
                    ("prefill", PREFILL_TOKENS, "random"),
                ):
                    add(
                        f"{name} EP1 {kind} T={tokens} (run at E={run_experts} top_k={top_k}: size budget)",
                        "catalog",
                        small,
                        config,
                        _batch(tokens, routing),
                        group=model.short_name,
                    )
    if options.edge_cases:
        for variant in mm.VARIANTS:
            inter = 512 if variant == "mxf4xmxf4" else 128  # small, but sizes the variant's kernels take

            def S(experts: int, top_k: int, shared: int = 0) -> mm.MegaMoEShape:
                return mm.MegaMoEShape(experts, 512, inter, top_k, shared, 1, _SMALL_TOKENS_CAP)  # noqa: B023 - called in this iteration only

            edges = [
                (
                    "zero tokens",
                    S(2, 2),
                    config_for(variant),
                    _batch(0, "random"),
                    "T=0: y keeps one row (DeepGEMM rejects a null pointer); nothing to write",
                ),
                ("one token", S(2, 2), config_for(variant), _batch(1, "distinct"), "decode of a single sequence"),
                (
                    "unused experts",
                    S(4, 2),
                    config_for(variant),
                    _batch(8, "unused"),
                    "half of the experts receive no token",
                ),
                (
                    "one hot expert",
                    S(2, 2),
                    config_for(variant),
                    _batch(6, "hot"),
                    "every token to expert 0, other slots masked",
                ),
                (
                    "every slot masked",
                    S(2, 2),
                    config_for(variant),
                    _batch(4, "masked"),
                    "topk_ids all -1: each row must still be written (zeros)",
                ),
                ("top_k=1", S(2, 1), config_for(variant), _batch(5, "random"), "one expert per token"),
                (
                    "no clamp, rsf=2.5",
                    S(2, 2),
                    config_for(variant, None, 2.5),
                    _batch(6, "distinct"),
                    "activation_clamp None, routed_scaling_factor applied to the top-k weights",
                ),
            ]
            edges.append(
                (
                    f"many tokens T={MANY_TOKENS}",
                    dataclasses.replace(S(2, 2), max_tokens_per_rank=512),
                    config_for(variant),
                    _batch(MANY_TOKENS, "random"),
                    "more token rows than a 64-, 128- or 256-row tile",
                )
            )
            if variant == "fp8xfp4":
                edges.append(
                    (
                        "fused shared expert",
                        S(2, 2, 1),
                        config_for(variant, 10.0, 1.5),
                        _batch(5, "random"),
                        "SGLang fuses the FP8 shared expert into the fp8xfp4 call",
                    )
                )
            for label, shape, config, batch, why in edges:
                add(f"{label} {variant}", "edge", shape, config, batch, note=why)
    rng = random.Random(seed)
    for index in range(options.random_cases):
        shape, config, batch = _random_case(rng, platform, budget)
        add(f"random #{index} (seed {seed})", "random", shape, config, batch)
    return drawn


def make_inputs(case: SuiteCase, device: torch.device) -> mm.MegaMoEInputs:
    """Fresh inputs of ``case`` on ``device`` (seeded by ``case.seed``); the problem must match the drawn shape and config."""
    shape, config = case.shape, case.config
    if shape.ep_size != 1 or shape.num_shared_experts > 1:
        raise InvalidArgumentError(
            "conformance", "case.shape", shape.describe(), "ep_size 1 and at most one shared expert (suite bug)"
        )
    tokens, routing = parse_batch(case.masked_m)
    problem = make_problem(
        config.variant,
        experts=shape.num_experts,
        hidden=shape.hidden,
        inter=shape.intermediate,
        tokens=tokens,
        top_k=shape.top_k,
        clamp=config.activation_clamp,
        rsf=config.routed_scaling_factor,
        shared=shape.num_shared_experts == 1,
        device=device,
        seed=case.seed,
        routing=routing,
        max_tokens_per_rank=shape.max_tokens_per_rank,
    )
    if problem.shape != shape or problem.config != config:
        raise InvalidArgumentError(
            "conformance",
            "case",
            f"{shape.describe()} [{config.describe()}]",
            f"what describe() builds from its inputs: {problem.shape.describe()} [{problem.config.describe()}]",
        )
    return problem.inputs
