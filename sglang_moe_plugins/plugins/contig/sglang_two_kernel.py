"""``contig_sglang_two_kernel``: SGLang's two-kernel sequence, exactly as ``_run_contiguous_gemm`` runs it in
its last (``else:``) branch, the compact runner's default:

1. ``silu_and_mul_clamp(gateup, down_input, swiglu_limit)`` with a limit, else ``silu_and_mul(gateup,
   down_input)`` (the runner's ``_legacy_silu_and_mul``), into a bf16 ``[M, D]`` buffer;
2. ``sglang_per_token_group_quant_fp8(down_input, group, column_major_scales=ue8m0, scale_tma_aligned=ue8m0,
   scale_ue8m0=ue8m0)``, here with ``output_q``/``output_s`` = the call's outputs (0.5.22+ take them; on
   0.5.20/0.5.21 the host indirection runs the function's body on them), so the kernels write the outputs
   in place: the same kernels with the same arguments as stock, bit for bit.

The bf16 buffer is this plugin's (stock allocates it too); the outputs are never reallocated.

Limits (0.5.23 line numbers):

- ``keep_fp32`` declined: the first kernel writes the product as bf16 (``cast<DType2>`` of the fp32
  product in ``silu_mul_clamp_kernel``, ``silu_and_mul_masked_post_quant.cuh:257``;
  ``act_and_mul_kernel``, ``elementwise/activation.cuh:116``), so the quantizer sees a bf16-rounded product;
- no swizzle: both first kernels read gate ``[:, :D]`` and up ``[:, D:]`` (``.cuh:251-252``,
  ``activation.cuh:99-100``); the runner's two-kernel branch never has a swizzled input;
- D % 8 == 0 (``silu_and_mul_clamp``: ``out_dim % kVecSize``, 8 bf16 per 16 B, ``.cuh:401``) and D % 16 == 0
  on Blackwell (``silu_and_mul``: ``hidden_size % kVecSize`` with 32 B vectors, ``activation.cuh:219``): the
  op's D is a multiple of its group size (>= 16), so both always hold; group 16-256 (the quantizer's
  ``static_assert(16 <= kGroupSize && kGroupSize <= 256)``, ``gemm/per_token_group_quant.cuh:258``): the op's
  own group sizes;
- M >= 1: ``silu_and_mul_clamp`` launches ``M * blocks_per_row`` blocks (``.cuh:413``), an invalid launch at 0;
  a 0-row call writes nothing here (the runner returns before this step when it has no rows).

With fp32 row-major scales and group == D, ``sglang_per_token_group_quant_fp8`` routes to the whole-row
per-token kernel (``sglang_per_token_quant_fp8``): so does this plugin. That kernel has no 1e-10 absmax floor:
an all-zero row gets scale 0 (the op's reference: 1e-10 / 448); its values are 0 either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...contract import Plugin, Support
from ...hardware import Platform
from ...lazy import lazy_module
from ...ops.silu_mul_quant_contig import (
    OP,
    ContigConfig,
    ContigInputs,
    ContigOutputs,
    ContigShape,
    expected_scale_strides,
)
from .sglang_host import aligned, canonical_view, cuda_contig_kernels, get_contig_kernels, kernel_input

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = ["ContigSglangTwoKernelPlugin"]


def _launch(shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
    group, hidden, ue8m0, limit = shape.group_size, shape.hidden, config.scale_ue8m0, config.swiglu_limit

    def launch(inputs: ContigInputs, outputs: ContigOutputs) -> None:
        rows = inputs.rows
        if rows == 0:
            return
        kernels = get_contig_kernels()
        gateup = kernel_input(inputs.gateup)
        down_input = torch.empty((rows, hidden), device=gateup.device, dtype=torch.bfloat16)
        if limit is not None:
            kernels.silu_and_mul_clamp(gateup, down_input, limit)
        else:
            kernels.silu_and_mul(gateup, down_input)
        out = outputs.out
        target = out if aligned(out) else out.new_empty(out.shape)
        kernels.per_token_group_quant_fp8(
            down_input,
            group,
            column_major_scales=ue8m0,
            scale_tma_aligned=ue8m0,
            scale_ue8m0=ue8m0,
            output_q=canonical_view(target, (hidden, 1)),
            output_s=canonical_view(outputs.scale, expected_scale_strides(shape, config, rows)[1]),
        )
        if target is not out:
            out.copy_(target)

    return launch


class ContigSglangTwoKernelPlugin(Plugin):
    name = "contig_sglang_two_kernel"
    op = OP
    priority = 10
    description = (
        "SGLang's two-kernel sequence (silu_and_mul[_clamp] to bf16, then per_token_group_quant_fp8): stock's numerics"
    )
    #: Reads ``gateup`` only (both first kernels read it through const pointers).
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return cuda_contig_kernels(platform)

    def supports(self, shape: ContigShape, config: ContigConfig) -> Support:
        platform = self.available(config.platform)
        if not platform:
            return platform
        if config.keep_fp32:
            return Support.no(
                "rounds the SiLU * up product to bf16 (its first kernel writes a bf16 buffer); "
                "the call requires the fp32 product (keep_fp32)"
            )
        if config.swizzle:
            return Support.no(
                "reads gate [:, :D] and up [:, D:]; cannot read gran-8 swizzled input "
                "(SGLang's two-kernel branch never has it)"
            )
        if shape.hidden % 16:
            return Support.no(
                f"D ({shape.hidden}) must be a multiple of 16 (the activation kernels' 16/32-byte vectors)"
            )
        if not 16 <= shape.group_size <= 256:
            return Support.no(f"group_size ({shape.group_size}) must be 16..256 (the quantizer's template)")
        limit = "silu_and_mul_clamp" if config.swiglu_limit is not None else "silu_and_mul"
        return Support.yes(f"SGLang's {limit} to bf16, then sglang_per_token_group_quant_fp8 (stock's numerics)")

    def prepare(self, shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
        return _launch(shape, config)

    def run(self, inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> Any:
        _launch(shape, config)(inputs, outputs)
