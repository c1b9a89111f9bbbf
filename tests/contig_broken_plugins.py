"""Deliberately broken ``silu_mul_quant_contig`` plugins: the conformance suite must fail each, naming why
on the first line of its first failure. Checked by path (``sglang-moe-plugins check
tests/contig_broken_plugins.py:Class``) in test_conformance_contig.py. Never registered as entry points.

``Bf16ProductDecliningPlugin`` is not broken: it rounds the product to bf16 (SGLang's two-kernel numerics)
and declines keep_fp32 calls, which the op allows; it passes.
"""

from __future__ import annotations

import torch

from sglang_moe_plugins import Support
from sglang_moe_plugins.ops import silu_mul_quant_contig as contig
from sglang_moe_plugins.plugins.reference.silu_mul_quant_contig import (
    ContigReferencePlugin,
    contig_values,
    silu_mul_quant_contig_reference,
)
from sglang_moe_plugins.quant import pack_ue8m0_bytes, quantize_fp8_groups, ue8m0_exponent


def _reference_into_scratch(inputs, shape, config):
    """The reference's results with a contiguous ``[M, ceil(G/4)]`` packed scale (or ``[M, G]`` fp32)."""
    rows = inputs.rows
    width = shape.packed_groups if config.scale_ue8m0 else shape.num_groups
    scratch = contig.ContigOutputs(
        torch.empty((rows, shape.hidden), dtype=torch.float8_e4m3fn, device=inputs.device),
        torch.empty((rows, width), dtype=torch.int32 if config.scale_ue8m0 else torch.float32, device=inputs.device),
    )
    silu_mul_quant_contig_reference(inputs, scratch, shape, config)
    return scratch


class WrongGroupScalePlugin(ContigReferencePlugin):
    """Doubles the scale of the last group of every row (an off-by-one in the group index of its kernel)."""

    name = "broken_contig_group_scale"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        if inputs.rows == 0:
            return
        last = shape.num_groups - 1
        if config.scale_ue8m0:
            outputs.scale[:, last // 4].add_(1 << (8 * (last % 4)))  # exponent + 1: twice the scale
        else:
            outputs.scale[:, last].mul_(2.0)


class LastRowUnwrittenPlugin(ContigReferencePlugin):
    """Off by one: its grid covers M - 1 rows, so the last row is never written."""

    name = "broken_contig_last_row"

    def run(self, inputs, outputs, shape, config):
        rows = inputs.rows
        if rows == 0:
            return
        scratch = _reference_into_scratch(inputs, shape, config)
        outputs.out[: rows - 1].copy_(scratch.out[: rows - 1])
        outputs.scale[: rows - 1].copy_(scratch.scale[: rows - 1])


def _bf16_product_run(inputs, outputs, shape, config):
    if inputs.rows == 0:
        return
    values = contig_values(inputs.gateup, config, bf16_product=True)
    q, scale = quantize_fp8_groups(values, shape.group_size, ue8m0=config.scale_ue8m0)
    outputs.out.copy_(q)
    outputs.scale.copy_(pack_ue8m0_bytes(ue8m0_exponent(scale)) if config.scale_ue8m0 else scale)


class Bf16ProductPlugin(ContigReferencePlugin):
    """Rounds the SiLU * up product to bf16 (as SGLang's two kernels do), and accepts keep_fp32 calls too."""

    name = "broken_contig_bf16_product"

    def run(self, inputs, outputs, shape, config):
        _bf16_product_run(inputs, outputs, shape, config)


class Bf16ProductDecliningPlugin(ContigReferencePlugin):
    """Not broken: rounds the product to bf16 and declines keep_fp32 calls, as the op allows."""

    name = "contig_bf16_product_declines"

    def supports(self, shape, config):
        if config.keep_fp32:
            return Support.no("rounds the product to bf16; the call requires the fp32 product (keep_fp32)")
        return Support.yes("bf16 product, as SGLang's two-kernel sequence")

    def run(self, inputs, outputs, shape, config):
        _bf16_product_run(inputs, outputs, shape, config)


class WritesGateupPlugin(ContigReferencePlugin):
    """Uses the gate half of gateup as scratch after reading it, on every call, and declares that it
    writes no input (``writes_inputs = frozenset()``, inherited): wrong whenever the host did not mark
    gateup writable, and a failure after the write would be retried on damaged input."""

    name = "broken_contig_writes_gateup"

    def run(self, inputs, outputs, shape, config):
        super().run(inputs, outputs, shape, config)
        inputs.gateup[:, : shape.hidden].zero_()


class RowMajorPackedScalePlugin(ContigReferencePlugin):
    """Writes the packed UE8M0 scales into the host's buffer as if it were a contiguous [M, ceil(G/4)]
    tensor (strides (ceil(G/4), 1)), as a kernel that takes the data pointer and ignores the strides does."""

    name = "broken_contig_scale_strides"

    def run(self, inputs, outputs, shape, config):
        if not config.scale_ue8m0:
            return super().run(inputs, outputs, shape, config)
        rows = inputs.rows
        if rows == 0:
            return None
        scratch = _reference_into_scratch(inputs, shape, config)
        outputs.out.copy_(scratch.out)
        outputs.scale.as_strided((rows, shape.packed_groups), (shape.packed_groups, 1)).copy_(scratch.scale)
        return None


class ReturnsContiguousScalePlugin(ContigReferencePlugin):
    """Returns its own contiguous scale tensor instead of writing the host's (strided packed) one."""

    name = "broken_contig_returns_scale"

    def run(self, inputs, outputs, shape, config):
        scratch = _reference_into_scratch(inputs, shape, config)
        outputs.out.copy_(scratch.out)
        return contig.ContigOutputs(outputs.out, scratch.scale)


class FirstRowCountPlugin(ContigReferencePlugin):
    """Its launch keeps the row count of the key's first call (M is the call's, not the key's)."""

    name = "broken_contig_first_rows"

    def prepare(self, shape, config):
        kept = []

        def launch(inputs, outputs):
            if not kept:
                kept.append(inputs.rows)
            rows = min(kept[0], inputs.rows)
            scratch = _reference_into_scratch(inputs, shape, config)
            outputs.out[:rows].copy_(scratch.out[:rows])
            outputs.scale[:rows].copy_(scratch.scale[:rows])

        return launch
