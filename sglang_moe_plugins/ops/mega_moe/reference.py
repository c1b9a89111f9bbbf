"""The reference forward of op ``mega_moe`` (torch, CPU and GPU): the oracle the kernels are tested against.

:func:`mega_moe_reference` is public (in ``__all__``, covered by the plugin contract version
``sglang_moe_plugins.CONTRACT_VERSION``, 2); docs/authoring.md ("Writing a mega_moe plugin") shows its use.
"""

from __future__ import annotations

from typing import cast

import torch

from ...quant import FP8_E4M3_MAX, dequantize_e2m1, quantize_e2m1, ue8m0_exponent, ue8m0_from_exponent
from . import MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape
from .activation import swiglu
from .formats import decode_expert_weights, decode_fp8_shared_weights, dequantize_activations, quantize_activations
from .sm90 import Sm90Numerics, sm90_numerics_for, sm90_reference_slots

__all__ = ["mega_moe_reference"]


def _matmul(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``a @ b_t.T`` with fp64 accumulation (the products of these formats are exact), rounded to fp32."""
    return (a.double() @ b_t.double().T).float()


def _requantize(act: torch.Tensor, config: MegaMoEConfig) -> torch.Tensor:
    """Quantize the L2 input as the SM100 DeepGEMM epilogues do and return its dequantized value."""
    rows, cols = act.shape
    grouped = act.reshape(rows, cols // 32, 32)
    finfo = 6.0 if config.variant == "mxf4xmxf4" else FP8_E4M3_MAX
    scaled = grouped.abs().amax(-1) * torch.tensor(1.0 / finfo, dtype=torch.float32, device=act.device)
    exponent = ue8m0_exponent(scaled)  # fast_log2_ceil + 127; 0 for an all-zero group
    sf = ue8m0_from_exponent(exponent)
    inv = ue8m0_from_exponent((254 - exponent).clamp(min=0))
    values = grouped * inv.unsqueeze(-1)
    if config.variant == "mxf4xmxf4":
        deq = dequantize_e2m1(quantize_e2m1(values))
    else:
        deq = values.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).float()
    return (deq * sf.unsqueeze(-1)).reshape(rows, cols)


def mega_moe_reference(
    inputs: MegaMoEInputs,
    outputs: MegaMoEOutputs,
    shape: MegaMoEShape,
    config: MegaMoEConfig,
    *,
    sm90: Sm90Numerics | None = None,
) -> None:
    """Emulate the chosen variant end to end; writes ``outputs.y[:T]`` (needs all experts' weights).

    Steps: quantize x as the pre-dispatch does; per (token, slot) with a valid expert: L1, SwiGLU
    with clamp (bf16 on SM100, fp32 on SM90) times the top-k weight (times routed_scaling_factor,
    fp32); requantize as the kernel's L1 epilogue (SM100: per 32, UE8M0; SM90: per 64, fp32
    scales); L2; round each slot's row to bf16; sum the slots in slot order in fp32 (then the fused
    shared expert, weight 1) -> bf16, as the kernels' combine does.

    SM100: exact GEMMs (fp64 sums of the dequantized operands). SM90: the GEMMs as the kernel
    accumulates them (:mod:`.sm90`); ``sm90`` overrides the configuration that
    DeepGEMM's heuristic picks for this call (:func:`~.sm90.sm90_numerics_for` with ``shape.ep_size`` ranks
    and this call's tokens; pass it explicitly for a whole-problem reference under EP).
    """
    num_tokens = inputs.num_tokens
    if num_tokens == 0:
        return
    x = inputs.hidden_states
    weights = cast("torch.Tensor", inputs.topk_weights).to(torch.float32)  # present when num_tokens > 0
    if config.routed_scaling_factor != 1.0:
        weights = weights * config.routed_scaling_factor
    if config.variant == "sm90_fp8":
        numerics = (
            sm90 if sm90 is not None else sm90_numerics_for(num_tokens, shape.ep_size, shape.top_k, shape.num_experts)
        )
        slots = sm90_reference_slots(inputs, shape, config, weights, numerics)
        acc = torch.zeros((num_tokens, shape.hidden), dtype=torch.float32, device=x.device)
        for slot in range(shape.top_k):
            acc += slots[:, slot]
        outputs.y[:num_tokens] = acc.to(torch.bfloat16)
        return
    q, scales = quantize_activations(x, config.variant)
    xq = dequantize_activations(q, scales, config.variant)
    w1, w2 = decode_expert_weights(inputs, config)
    ids = cast("torch.Tensor", inputs.topk_ids).to(torch.int64)
    slots = torch.zeros((num_tokens, shape.top_k, shape.hidden), dtype=torch.float32, device=x.device)
    for expert in torch.unique(ids).tolist():
        if expert < 0 or expert >= w1.shape[0]:
            continue
        tok, slot = (ids == expert).nonzero(as_tuple=True)
        h = _matmul(xq[tok], w1[expert])
        act = _requantize(swiglu(h, config, weights[tok, slot]), config)
        slots[tok, slot] = _matmul(act, w2[expert]).to(torch.bfloat16).float()
    acc = torch.zeros((num_tokens, shape.hidden), dtype=torch.float32, device=x.device)
    for slot in range(shape.top_k):
        acc += slots[:, slot]
    if inputs.shared_l1_weights is not None:
        s1 = decode_fp8_shared_weights(*inputs.shared_l1_weights, interleave="gran8")
        s2 = decode_fp8_shared_weights(
            *cast("tuple[torch.Tensor, torch.Tensor]", inputs.shared_l2_weights), interleave=None
        )
        ones = torch.ones(num_tokens, dtype=torch.float32, device=x.device)
        act = _requantize(swiglu(_matmul(xq, s1), config, ones), config)
        acc += _matmul(act, s2).to(torch.bfloat16).float()
    outputs.y[:num_tokens] = acc.to(torch.bfloat16)
