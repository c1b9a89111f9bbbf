"""Shared builders for the mega_moe tests: random problems in the host's weight layouts."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any


from sglang_moe_plugins.deep_gemm_api import DeepGemmApi, MEGA_FUNCTIONS
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.testing.mega_moe import MegaProblem
from sglang_moe_plugins.testing.mega_moe import make_problem as _make_problem

CATALOG = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_plugins" / "data" / "moe_models.json"

#: sgl-deep-gemm 0.2.x as documented (mma_type API, refuses DG_USE_*), independent of what is installed.
API_MMA_TYPE = DeepGemmApi("mma_type", "0.2.3.post2", frozenset(MEGA_FUNCTIONS), True, ())
#: An older fork: FP4 activations by DG_USE_FP4_ACTS / DG_USE_MXF4_KIND, no mma_type, no pre-dispatch.
API_LEGACY = DeepGemmApi("legacy_env", "0.1.0", frozenset({"get_symm_buffer_for_mega_moe", "fp8_fp4_mega_moe"}), False, ())
API_ABSENT = DeepGemmApi("absent")


def catalog_model(model_id: str) -> dict[str, Any]:
    models = json.loads(CATALOG.read_text())["models"]
    return next(m for m in models if m["id"] == model_id)


#: The builder lives in the package (the conformance suite builds its mega_moe cases with it).
Problem = MegaProblem


def make_problem(variant: str, *, api: DeepGemmApi = API_MMA_TYPE, **kwargs: Any) -> Problem:
    """:func:`sglang_moe_plugins.testing.mega_moe.make_problem`, with the documented 0.2.x API by default."""
    return _make_problem(variant, api=api, **kwargs)


def model_key(model_id: str, variant: str, platform: Platform, *, ep_size: int = 1,
              api: DeepGemmApi = API_MMA_TYPE, fused_shared: bool | None = None) -> tuple[mm.MegaMoEShape, mm.MegaMoEConfig]:
    """Shape and config of a catalog model's MegaMoE layer (no tensors: what describe() would build)."""
    m = catalog_model(model_id)
    if fused_shared is None:
        fused_shared = variant == "fp8xfp4"  # SGLang fuses FP8 shared experts for fp8xfp4 only
    shape = mm.MegaMoEShape(
        num_experts=m["experts"], hidden=m["hidden"], intermediate=m["inter"], top_k=m["topk"],
        num_shared_experts=m["shared"] if fused_shared else 0, ep_size=ep_size, max_tokens_per_rank=8192,
    )
    fmt = "fp8_e4m3_block128" if variant == "sm90_fp8" else "fp4_e2m1_ue8m0_g32"
    config = mm.MegaMoEConfig(platform=platform, variant=variant, weight_format=fmt, activation_clamp=10.0, deep_gemm=api)
    return shape, config


def with_platform(config: mm.MegaMoEConfig, platform: Platform) -> mm.MegaMoEConfig:
    return dataclasses.replace(config, platform=platform)
