"""``contig_reference``: the pure-torch ``silu_mul_quant_contig``, the numerics oracle. Runs on CPU and GPU.

It computes every row in fp32 (SiLU and product), whatever ``keep_fp32`` says, and reads no tensor data on
the host, so it can run inside CUDA graph capture; it is slow (about a dozen torch kernels per call).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...contract import Plugin, Support
from ...hardware import Platform
from ...lazy import lazy_module
from ...ops.silu_mul_quant import split_gate_up
from ...ops.silu_mul_quant_contig import OP, ContigConfig, ContigInputs, ContigOutputs, ContigShape
from ...quant import pack_ue8m0_bytes, quantize_fp8_groups, round_to_bf16, ue8m0_exponent

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = ["ContigReferencePlugin", "contig_values", "silu_mul_quant_contig_reference"]


def contig_values(gateup: torch.Tensor, config: ContigConfig, *, bf16_product: bool = False) -> torch.Tensor:
    """fp32 ``[M, D]``: ``silu(gate) * up`` after the optional clamp, the op's numerics. ``bf16_product``
    rounds the product to bf16 (what SGLang's two-kernel sequence hands to its quantizer)."""
    gate, up = split_gate_up(gateup, config.swizzle)
    if config.swiglu_limit is not None:
        limit = round_to_bf16(config.swiglu_limit)
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    gate32 = gate.float()
    values = gate32 / (1.0 + torch.exp(-gate32)) * up.float()
    return values.to(torch.bfloat16).float() if bf16_product else values


def silu_mul_quant_contig_reference(
    inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig
) -> None:
    """Write every row of ``outputs`` (fp32 product)."""
    if inputs.rows == 0:
        return
    q, scale = quantize_fp8_groups(contig_values(inputs.gateup, config), shape.group_size, ue8m0=config.scale_ue8m0)
    outputs.out.copy_(q)
    outputs.scale.copy_(pack_ue8m0_bytes(ue8m0_exponent(scale)) if config.scale_ue8m0 else scale)


class ContigReferencePlugin(Plugin):
    name = "contig_reference"
    op = OP
    priority = 0
    description = "pure torch oracle for the contiguous step; every shape, CPU and GPU (slow)"
    #: Reads ``gateup`` only.
    #: On CUDA only when forced or with reference_on_gpu = true (Plugin.oracle).
    oracle = True
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return Support.yes("pure torch, runs anywhere")

    def supports(self, shape: ContigShape, config: ContigConfig) -> Support:
        return Support.yes("pure torch reference supports every valid call")

    def run(self, inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> None:
        silu_mul_quant_contig_reference(inputs, outputs, shape, config)
