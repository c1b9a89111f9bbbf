"""Shared builders for the mega_moe tests: random problems in the host's weight layouts."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.plugins.deep_gemm.api import DeepGemmApi
from sglang_moe_plugins.testing.ops.mega_moe_cases import MegaProblem, make_problem as _make_problem

CATALOG = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_plugins" / "data" / "moe_models.json"

_BUFFER = ("group", "num_experts", "num_max_tokens_per_rank", "num_topk", "hidden", "intermediate_hidden")
_PRE = (
    "x",
    "topk_idx",
    "topk_weights",
    "buf_x",
    "buf_x_sf",
    "buf_topk_idx",
    "buf_topk_weights",
    "num_tokens",
    "group_size",
)
_KERNEL = ("y", "l1_weights", "l2_weights", "sym_buffer")
_TAIL = ("cumulative_local_expert_recv_stats", "recipe", "activation", "activation_clamp", "fast_math")
#: sgl-deep-gemm 0.2.3.post2 (SGLang 0.5.23's pin), as its wheel's sources read; tests/test_deep_gemm_releases.py
#: checks these two records against the real wheels.
API_MMA_TYPE = DeepGemmApi(
    "mma_type",
    "0.2.3.post2",
    (
        (
            "get_symm_buffer_for_mega_moe",
            (*_BUFFER, "num_shared_experts", "use_fp8_dispatch", "mma_type", "activation"),
        ),
        (
            "fp8_fp4_mega_moe",
            (
                *_KERNEL,
                "shared_l1_weights",
                "shared_l2_weights",
                *_TAIL,
                "use_x_scales",
                "l1_alphas",
                "l2_alphas",
                "l2_act_scales",
                "weight_layout",
                "global_num_tokens",
                "post_expert_norm",
                "post_expert_norm_weight",
                "post_expert_norm_eps",
                "post_expert_norm_weight_first",
            ),
        ),
        ("fp8_mega_moe", _KERNEL + _TAIL),
        ("mega_moe_pre_dispatch", (*_PRE, "mma_type", "buf_x_scales", "expert_scales")),
        ("mega_moe_pre_dispatch_sm90", (*_PRE, "routed_scaling_factor")),
        (
            "get_block_m_for_mega_moe",
            (
                "num_ranks",
                "num_experts",
                "num_max_tokens_per_rank",
                "num_tokens",
                "num_topk",
                "mma_type",
                "global_num_tokens",
            ),
        ),
        ("transform_weights_for_mega_moe", ("l1_weights", "l2_weights", "activation", "mma_type")),
        ("transform_weights_for_mega_moe_sm90", ("l1_weights", "l2_weights")),
    ),
    True,
    (),
    e2m1_ties="even",
)
#: sgl-deep-gemm 0.1.5.post1 (SGLang 0.5.17's pin, the release that loads on the GPU machine): no shared
#: experts, FP4 activations only through the DG_USE_* variables (mma_type takes 'fp8xfp4' only).
API_LEGACY = DeepGemmApi(
    "legacy_env",
    "0.1.5.post1",
    (
        ("get_symm_buffer_for_mega_moe", (*_BUFFER, "use_fp8_dispatch", "mma_type", "activation")),
        ("fp8_fp4_mega_moe", _KERNEL + _TAIL),
        ("fp8_mega_moe", _KERNEL + _TAIL),
        ("mega_moe_pre_dispatch", (*_PRE, "use_fp4_acts")),
        ("mega_moe_pre_dispatch_sm90", (*_PRE, "routed_scaling_factor")),
        ("transform_weights_for_mega_moe", ("l1_weights", "l2_weights", "activation")),
        ("transform_weights_for_mega_moe_sm90", ("l1_weights", "l2_weights")),
    ),
    False,
    (),
    e2m1_ties="toward_zero",
)
API_ABSENT = DeepGemmApi("absent")


def catalog_model(model_id: str) -> dict[str, Any]:
    models = json.loads(CATALOG.read_text())["models"]
    return next(m for m in models if m["id"] == model_id)


#: The builder lives in the package (the conformance suite builds its mega_moe cases with it).
Problem = MegaProblem


def make_problem(variant: str, **kwargs: Any) -> Problem:
    """:func:`sglang_moe_plugins.testing.ops.mega_moe_cases.make_problem`."""
    return _make_problem(variant, **kwargs)


def model_key(
    model_id: str, variant: str, platform: Platform, *, ep_size: int = 1, fused_shared: bool | None = None
) -> tuple[mm.MegaMoEShape, mm.MegaMoEConfig]:
    """Shape and config of a catalog model's MegaMoE layer (no tensors: what describe() would build)."""
    m = catalog_model(model_id)
    if fused_shared is None:
        fused_shared = variant == "fp8xfp4"  # SGLang fuses FP8 shared experts for fp8xfp4 only
    shape = mm.MegaMoEShape(
        num_experts=m["experts"],
        hidden=m["hidden"],
        intermediate=m["inter"],
        top_k=m["topk"],
        num_shared_experts=m["shared"] if fused_shared else 0,
        ep_size=ep_size,
        max_tokens_per_rank=mm.DEFAULT_MAX_TOKENS_PER_RANK,
    )
    fmt = "fp8_e4m3_block128" if variant == "sm90_fp8" else "fp4_e2m1_ue8m0_g32"
    config = mm.MegaMoEConfig(platform=platform, variant=variant, weight_format=fmt, activation_clamp=10.0)
    return shape, config


def with_platform(config: mm.MegaMoEConfig, platform: Platform) -> mm.MegaMoEConfig:
    return dataclasses.replace(config, platform=platform)
