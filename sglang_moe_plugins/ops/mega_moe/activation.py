"""The SwiGLU of the MegaMoE kernels, shared by the reference forward and the SM90 emulation."""

from __future__ import annotations

import torch

from ...quant import round_to_bf16
from . import MegaMoEConfig

__all__ = ["swiglu"]


def swiglu(h: torch.Tensor, config: MegaMoEConfig, weight: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up * weight`` of the L1 output ``h [M, 2I]`` (rows ``[gate | up]``), clamped by
    ``config.activation_clamp`` as the variant's kernel does: SM90 in fp32, SM100 in bf16 (rounding
    ``h`` and the limit to bf16, then widening back)."""
    half = h.shape[-1] // 2
    gate, up = h[:, :half], h[:, half:]
    limit = config.activation_clamp
    if config.variant == "sm90_fp8":  # the SM90 kernel clamps the fp32 accumulators
        if limit is not None:
            gate = gate.clamp(max=limit)
            up = up.clamp(min=-limit, max=limit)
    else:  # the SM100 kernels round to bf16, clamp against bf16(limit), widen back
        gate = gate.to(torch.bfloat16)
        up = up.to(torch.bfloat16)
        if limit is not None:
            bound = round_to_bf16(limit)
            gate = gate.clamp(max=bound)
            up = up.clamp(min=-bound, max=bound)
        gate, up = gate.float(), up.float()
    act = gate * (1.0 / (1.0 + torch.exp(-gate)))
    return act * up * weight.unsqueeze(-1)
