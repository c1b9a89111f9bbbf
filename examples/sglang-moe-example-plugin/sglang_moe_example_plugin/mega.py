"""``example_torch_mega``: a pure-torch ``mega_moe`` plugin (the SM100 variants), written from docs/authoring.md.

Correct for what it claims and deliberately narrow:

- variants ``fp8xfp4`` (W4A8) and ``mxf4xmxf4`` (W4A4), not ``sm90_fp8`` (whose kernel accumulates its
  FP8 GEMMs in a way only ``mega_reference``'s emulation reproduces);
- ``ep_size == 1``: it computes every token from the weights it holds, so it needs every expert on the
  rank (under expert parallelism a rank holds only its experts and the kernel is collective).

It decodes the experts' weights with the public helpers of ``sglang_moe_plugins.ops.mega_moe_numerics``
on every call (every layer of a model has the same shape key but its own weights: never cache them per
key), and follows the kernels' numerics step by step (docs/authoring.md, "Writing a mega_moe plugin").
"""

from __future__ import annotations

import torch

from sglang_moe_plugins import Platform, Plugin, Support
from sglang_moe_plugins.ops.mega_moe import MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape
from sglang_moe_plugins.ops.mega_moe_numerics import (
    decode_expert_weights,
    decode_fp8_shared_weights,
    dequantize_activations,
    quantize_activations,
)
from sglang_moe_plugins.quant import (
    FP8_E4M3_MAX,
    dequantize_e2m1,
    quantize_e2m1,
    round_to_bf16,
    ue8m0_exponent,
    ue8m0_from_exponent,
)

__all__ = ["ExampleTorchMegaPlugin"]

_VARIANTS = ("fp8xfp4", "mxf4xmxf4")


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` summed in fp64 (the products of these formats are exact), rounded to fp32."""
    return (a.double() @ b.double().T).float()


def _swiglu(h: torch.Tensor, clamp: float | None, weight: torch.Tensor) -> torch.Tensor:
    """SM100 kernels: gate and up rounded to bf16, clamped against bf16(clamp), widened, SiLU(gate) * up * weight."""
    half = h.shape[-1] // 2
    gate, up = h[:, :half].to(torch.bfloat16), h[:, half:].to(torch.bfloat16)
    if clamp is not None:
        bound = round_to_bf16(clamp)
        gate, up = gate.clamp(max=bound), up.clamp(min=-bound, max=bound)
    gate, up = gate.float(), up.float()
    return gate * (1.0 / (1.0 + torch.exp(-gate))) * up * weight.unsqueeze(-1)


def _requantize(act: torch.Tensor, variant: str) -> torch.Tensor:
    """The L1 epilogue's requantization of the L2 input, returned dequantized: per 32 columns, a UE8M0
    scale ``2**ceil(log2(absmax * fp32(1/max)))`` with max 448 (FP8 e4m3, fp8xfp4) or 6 (E2M1, mxf4xmxf4),
    no absmax floor (an all-zero group gets exponent byte 0: scale 0, values 0)."""
    rows, cols = act.shape
    grouped = act.reshape(rows, cols // 32, 32)
    finfo = 6.0 if variant == "mxf4xmxf4" else FP8_E4M3_MAX
    scaled = grouped.abs().amax(-1) * torch.tensor(1.0 / finfo, dtype=torch.float32, device=act.device)
    exponent = ue8m0_exponent(scaled)
    inverse = ue8m0_from_exponent((254 - exponent).clamp(min=0))  # 2**(127 - e), the kernel's reciprocal
    values = grouped * inverse.unsqueeze(-1)
    if variant == "mxf4xmxf4":
        q = dequantize_e2m1(quantize_e2m1(values))  # nearest E2M1, saturating at 6
    else:
        q = values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
    return (q * ue8m0_from_exponent(exponent).unsqueeze(-1)).reshape(rows, cols)


class ExampleTorchMegaPlugin(Plugin):
    name = "example_torch_mega"
    op = "mega_moe"
    priority = 5  # above mega_reference (0), below every DeepGEMM plugin
    contract_version = 2
    description = "example third-party mega_moe plugin: pure torch, fp8xfp4 and mxf4xmxf4, all experts local"

    def available(self, platform: Platform) -> Support:
        return Support.yes(f"pure torch: runs on CPU and CUDA (here {platform.describe()})")

    def supports(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if config.variant not in _VARIANTS:
            return Support.no(f"variants {', '.join(_VARIANTS)} only (this call is {config.variant})")
        if shape.ep_size != 1:
            return Support.no(f"needs every expert on this rank (ep_size=1); ep_size={shape.ep_size}")
        if config.activation != "swiglu":
            return Support.no(f"activation swiglu only, not {config.activation}")
        return Support.yes(f"pure torch {config.variant}, all {shape.num_experts} experts local")

    def run(self, inputs: MegaMoEInputs, outputs: MegaMoEOutputs, shape: MegaMoEShape, config: MegaMoEConfig) -> None:
        tokens = inputs.num_tokens
        if tokens == 0:
            return  # y keeps one row; nothing to write
        variant, clamp = config.variant, config.activation_clamp
        # 1. activations as the pre-dispatch quantizes them
        x = dequantize_activations(*quantize_activations(inputs.hidden_states, variant), variant)
        # 2. this call's weights (never cached: every layer shares the shape key)
        w1, w2 = decode_expert_weights(inputs, config)  # [E, 2I, H] rows [gate; up], [E, H, I]
        weights = inputs.topk_weights.float()
        if config.routed_scaling_factor != 1.0:
            weights = weights * config.routed_scaling_factor  # fp32
        ids = inputs.topk_ids.long()
        slots = torch.zeros((tokens, shape.top_k, shape.hidden), dtype=torch.float32, device=x.device)
        for expert in range(w1.shape[0]):
            token, slot = (ids == expert).nonzero(as_tuple=True)  # -1 (and out-of-range) slots match no expert
            if token.numel() == 0:
                continue
            act = _requantize(_swiglu(_matmul(x[token], w1[expert]), clamp, weights[token, slot]), variant)
            slots[token, slot] = _matmul(act, w2[expert]).to(torch.bfloat16).float()  # each slot's row in bf16
        y = torch.zeros((tokens, shape.hidden), dtype=torch.float32, device=x.device)
        for slot in range(shape.top_k):  # the combine: slot order, fp32
            y += slots[:, slot]
        if inputs.shared_l1_weights is not None:  # the fused shared expert, weight 1, added last
            s1 = decode_fp8_shared_weights(*inputs.shared_l1_weights, interleave="gran8")
            s2 = decode_fp8_shared_weights(*inputs.shared_l2_weights, interleave=None)
            ones = torch.ones(tokens, dtype=torch.float32, device=x.device)
            act = _requantize(_swiglu(_matmul(x, s1), clamp, ones), variant)
            y += _matmul(act, s2).to(torch.bfloat16).float()
        outputs.y[:tokens].copy_(y.to(torch.bfloat16))
