"""One MegaMoE problem built as the tests build it (:func:`make_problem`: random bf16 tokens, fp32 weights
encoded into the host's DeepGEMM layouts) and the routing patterns of :data:`ROUTINGS` (:func:`route`).
Public through :mod:`.mega_moe_cases`, which draws the conformance cases."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import InvalidArgumentError
from ...ops import mega_moe as mm
from ...ops.mega_moe import formats as nm
from ...ops.mega_moe.weights import Interleave

__all__ = ["ROUTINGS", "MegaProblem", "make_problem", "route"]

#: Tokens per rank of a small case's buffers (the default of :func:`make_problem`).
_SMALL_TOKENS_CAP = 64


#: How tokens are routed: ``random`` (the tests' default: any expert, repeats allowed, one masked
#: slot), ``distinct`` (distinct experts per token, some slots masked), ``unused`` (only the first
#: half of the experts receive tokens), ``hot`` (every token to expert 0, other slots masked),
#: ``masked`` (every slot -1: rows of zeros).
ROUTINGS = ("random", "distinct", "unused", "hot", "masked")


@dataclass(frozen=True, eq=False)
class MegaProblem:
    """A random MegaMoE call in the host's weight layouts, with the dequantized weights (fp32)."""

    inputs: mm.MegaMoEInputs
    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig
    w1: torch.Tensor  # dequantized [E, 2I, H], rows [gate; up]
    w2: torch.Tensor  # dequantized [E, H, I]
    s1: torch.Tensor | None = None  # shared expert, dequantized [2Is, H]
    s2: torch.Tensor | None = None


def route(routing: str, ids: torch.Tensor, experts: int, seed: int) -> torch.Tensor:
    """``ids`` re-drawn for ``routing`` (``random`` keeps them), from a generator of its own."""
    if routing not in ROUTINGS:
        raise InvalidArgumentError("conformance", "routing", routing, f"one of {ROUTINGS}")
    if routing == "random" or ids.numel() == 0:
        return ids
    tokens, top_k = ids.shape
    gen = torch.Generator().manual_seed((seed * 2_654_435_761 + 97) % (1 << 62))
    out = torch.full_like(ids, -1)
    if routing == "masked":
        return out
    if routing == "hot":
        out[:, 0] = 0
        return out
    pool = experts if routing == "distinct" else max(1, experts // 2)
    for t in range(tokens):
        chosen = torch.randperm(pool, generator=gen)[: min(top_k, pool)]
        out[t, : chosen.numel()] = chosen
    if routing == "distinct" and tokens > 1 and top_k > 1:
        drop = torch.rand(tokens, top_k, generator=gen) < 0.1
        out[drop] = -1
    return out


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
    device: str | torch.device = "cpu",
    seed: int = 0,
    routing: str = "random",
    max_tokens_per_rank: int = _SMALL_TOKENS_CAP,
) -> MegaProblem:
    """A seeded random call: bf16 tokens, fp32 weights encoded as the host builds them (CPU, then moved)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=gen) * 2.0).to(torch.bfloat16)
    w1f = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.08
    w2f = torch.randn(experts, hidden, inter, generator=gen) * 0.08
    ids = torch.randint(0, experts, (tokens, top_k), generator=gen, dtype=torch.int64)
    if tokens > 2:
        ids[1, 0] = -1  # a masked slot
    weights = torch.rand(tokens, top_k, generator=gen)
    ids = route(routing, ids, experts, seed)
    if variant == "sm90_fp8":
        d1, sf1, w1 = nm.encode_fp8_block_weights(w1f, "gran8")
        d2, sf2, w2 = nm.encode_fp8_block_weights(w2f, None)
    else:
        mode: Interleave = "gran16_packed" if variant == "mxf4xmxf4" else "gran8"
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

    def to(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    shape, config = mm.describe(
        to(x),
        to(ids),
        to(weights),
        l1_weights=(to(d1), to(sf1)),
        l2_weights=(to(d2), to(sf2)),
        variant=variant,
        num_experts=experts,
        hidden_size=hidden,
        intermediate_size=inter,
        top_k=top_k,
        activation_clamp=clamp,
        routed_scaling_factor=rsf,
        num_shared_experts=1 if shared else 0,
        shared_l1_weights=shared_l1,
        shared_l2_weights=shared_l2,
        max_tokens_per_rank=max_tokens_per_rank,
    )
    inputs = mm.MegaMoEInputs(
        hidden_states=to(x),
        topk_ids=to(ids),
        topk_weights=to(weights),
        l1_weights=(to(d1), to(sf1)),
        l2_weights=(to(d2), to(sf2)),
        shared_l1_weights=shared_l1,
        shared_l2_weights=shared_l2,
    )
    return MegaProblem(inputs, shape, config, w1, w2, s1, s2)
