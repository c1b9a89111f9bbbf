"""Narrow silu_mul_quant plugins (group 128 only, D a multiple of 512, no swizzle) that a blind case draw
barely exercises: the conformance kit must draw its cases inside their support.

- :class:`NarrowPlugin`: legal; its report lists per dimension what ran and what it declined.
- :class:`NarrowWrongForTallExperts`: wrong only for N > 256 (a 256-row tile that drops the rest).
- :class:`NarrowRoundsToBf16`: accepts ``keep_fp32`` calls yet rounds the SiLU product to bf16.

Checked by path (``tests/kit_narrow_plugins.py:Class``); never registered as entry points.
"""

from __future__ import annotations

import dataclasses

import torch

from sglang_moe_plugins import Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant import OP, SiluMulQuantInputs, real_rows, split_gate_up
from sglang_moe_plugins.plugins.reference import silu_mul_quant_reference
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, round_to_bf16, ue8m0_exponent


class NarrowPlugin(Plugin):
    """Group 128 only, D a multiple of 512, no swizzle; the reference's numerics."""

    name = "kit_narrow"
    op = OP
    priority = 1
    description = "narrow: group 128, D % 512 == 0, no swizzle"

    def available(self, platform):
        return Support.yes("pure torch")

    def supports(self, shape, config):
        if shape.group_size != 128:
            return Support.no(f"group size {shape.group_size}: only 128")
        if shape.hidden % 512:
            return Support.no(f"D = {shape.hidden}: only multiples of 512")
        if config.swizzle:
            return Support.no("swizzled gate/up is not supported")
        return Support.yes("group 128, D a multiple of 512")

    def run(self, inputs, outputs, shape, config):
        silu_mul_quant_reference(inputs, outputs, shape, config)


class NarrowWrongForTallExperts(NarrowPlugin):
    """Right up to 256 rows per expert; rows past 256 are computed from the first tile's rows again."""

    name = "kit_narrow_tall"

    def run(self, inputs, outputs, shape, config):
        if shape.max_rows <= 256 or shape.num_experts == 0:
            return silu_mul_quant_reference(inputs, outputs, shape, config)
        gateup = inputs.gateup.clone()
        gateup[:, 256:] = gateup[:, : shape.max_rows - 256].clone()
        silu_mul_quant_reference(dataclasses.replace(inputs, gateup=gateup), outputs, shape, config)
        return None


class NarrowRoundsToBf16(NarrowPlugin):
    """Rounds the SiLU product to bf16 before quantizing, even when the caller asks for fp32 intermediates."""

    name = "kit_narrow_bf16"

    def run(self, inputs: SiluMulQuantInputs, outputs, shape, config):
        if shape.num_experts == 0 or shape.max_rows == 0:
            return
        mask = real_rows(inputs.masked_m, shape.max_rows)
        rows = inputs.gateup[mask]
        if rows.shape[0] == 0:
            return
        gate, up = split_gate_up(rows, config.swizzle)
        if config.swiglu_limit is not None:
            limit = round_to_bf16(config.swiglu_limit)
            gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
        gate32 = gate.float()
        values = (gate32 / (1.0 + torch.exp(-gate32)) * up.float()).to(torch.bfloat16).float()
        q, scale = quantize_fp8_groups(values, shape.group_size, ue8m0=config.scale_ue8m0)
        outputs.out[mask] = q
        outputs.scale[mask] = pack_ue8m0_bytes(ue8m0_exponent(scale)) if config.scale_ue8m0 else scale
