"""Shared builders for the mega_moe tests: random problems in the host's weight layouts."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from dataclasses import dataclass
from typing import Any

import torch

from sglang_moe_plugins.deep_gemm_api import DeepGemmApi, MEGA_FUNCTIONS
from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops import mega_moe_numerics as nm

CATALOG = pathlib.Path(__file__).resolve().parents[1] / "sglang_moe_plugins" / "data" / "moe_models.json"

#: sgl-deep-gemm 0.2.x as documented (mma_type API, refuses DG_USE_*), independent of what is installed.
API_MMA_TYPE = DeepGemmApi("mma_type", "0.2.3.post2", frozenset(MEGA_FUNCTIONS), True, ())
#: An older fork: FP4 activations by DG_USE_FP4_ACTS / DG_USE_MXF4_KIND, no mma_type, no pre-dispatch.
API_LEGACY = DeepGemmApi("legacy_env", "0.1.0", frozenset({"get_symm_buffer_for_mega_moe", "fp8_fp4_mega_moe"}), False, ())
API_ABSENT = DeepGemmApi("absent")


def catalog_model(model_id: str) -> dict[str, Any]:
    models = json.loads(CATALOG.read_text())["models"]
    return next(m for m in models if m["id"] == model_id)


@dataclass
class Problem:
    inputs: mm.MegaMoEInputs
    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig
    w1: torch.Tensor  # dequantized [E, 2I, H], rows [gate; up]
    w2: torch.Tensor  # dequantized [E, H, I]
    s1: torch.Tensor | None = None  # shared expert, dequantized [2Is, H]
    s2: torch.Tensor | None = None


def make_problem(
    variant: str,
    *,
    experts: int = 4,
    hidden: int = 512,
    inter: int = 512,
    tokens: int = 12,
    top_k: int = 3,
    clamp: float | None = 10.0,
    rsf: float = 1.0,
    shared: bool = False,
    device: str = "cpu",
    seed: int = 0,
    api: DeepGemmApi = API_MMA_TYPE,
) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=gen) * 2.0).to(torch.bfloat16)
    w1f = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.08
    w2f = torch.randn(experts, hidden, inter, generator=gen) * 0.08
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen, dtype=torch.int64)
    if tokens > 2:
        ids[1, 0] = -1  # a masked slot
    weights = torch.rand(tokens, top_k, generator=gen)
    if variant == "sm90_fp8":
        d1, sf1, w1 = nm.encode_fp8_block_weights(w1f, "gran8")
        d2, sf2, w2 = nm.encode_fp8_block_weights(w2f, None)
    else:
        mode = "gran16_packed" if variant == "mxf4xmxf4" else "gran8"
        d1, sf1, w1 = nm.encode_fp4_weights(w1f, mode)
        d2, sf2, w2 = nm.encode_fp4_weights(w2f, None)
    s1 = s2 = None
    shared_l1 = shared_l2 = None
    if shared:
        s1f = torch.randn(2 * inter, hidden, generator=gen) * 0.08
        s2f = torch.randn(hidden, inter, generator=gen) * 0.08
        sd1, ssf1, s1 = nm.encode_fp8_shared_weights(s1f, "gran8")
        sd2, ssf2, s2 = nm.encode_fp8_shared_weights(s2f, None)
        shared_l1, shared_l2 = (sd1.to(device), ssf1.to(device)), (sd2.to(device), ssf2.to(device))
    to = lambda t: t.to(device)  # noqa: E731
    shape, config = mm.describe(
        to(x), to(ids), to(weights),
        l1_weights=(to(d1), to(sf1)), l2_weights=(to(d2), to(sf2)),
        variant=variant, num_experts=experts, hidden_size=hidden, intermediate_size=inter, top_k=top_k,
        activation_clamp=clamp, routed_scaling_factor=rsf,
        num_shared_experts=1 if shared else 0, shared_l1_weights=shared_l1, shared_l2_weights=shared_l2,
        max_tokens_per_rank=64, deep_gemm_api=api,
    )
    inputs = mm.MegaMoEInputs(
        hidden_states=to(x), topk_ids=to(ids), topk_weights=to(weights),
        l1_weights=(to(d1), to(sf1)), l2_weights=(to(d2), to(sf2)),
        shared_l1_weights=shared_l1, shared_l2_weights=shared_l2,
    )
    return Problem(inputs, shape, config, w1, w2, s1, s2)


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
