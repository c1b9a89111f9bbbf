"""``fp8_fallback``: SGLang's masked fused ``per_token_group_quant(fuse_silu_and_mul=True)``.

The host's default path for plain-SiLU models. It has no swiglu_limit: this plugin applies the clamp
itself, in bf16 (gate <= L, -L <= up <= L) before the fused quant, in place when the caller marks
``gateup`` writable (the host's GEMM workspace, as the host's own ``_apply_swiglu_limit`` does) and on
a copy otherwise. It rounds SiLU to bf16 before the product ("legacy" mode), so it declines calls that
require fp32 intermediates (``keep_fp32``), and it cannot read gran-8 swizzled input.
"""

from __future__ import annotations

from ...contract import Plugin, Support
from ...hardware import Platform
from ...ops.silu_mul_quant import GROUP_SIZES, OP, SiluMulQuantConfig, SiluMulQuantShape, split_gate_up
from ...quant import round_to_bf16
from .host import cuda_host_kernels, get_host_kernels

__all__ = ["Fp8FallbackPlugin", "GROUP_SIZES"]  # GROUP_SIZES: the op's (re-exported)

_GATEUP = frozenset({"gateup"})
_NOTHING: frozenset[str] = frozenset()


class Fp8FallbackPlugin(Plugin):
    name = "fp8_fallback"
    op = OP
    priority = 50
    description = "SGLang's masked fused per_token_group_quant; swiglu_limit applied by the plugin"

    def writes_inputs(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> frozenset[str]:
        """``gateup`` when the call has a ``swiglu_limit``: the clamp is applied in place when the host
        marks ``gateup`` writable. SGLang's fused quant itself reads its input only (``const T*``)."""
        return _GATEUP if config.swiglu_limit is not None else _NOTHING

    def available(self, platform: Platform) -> Support:
        return cuda_host_kernels(platform)

    def supports(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> Support:
        platform = self.available(config.platform)
        if not platform:
            return platform
        if config.swizzle:
            return Support.no("cannot read gran-8 swizzled gate/up input")
        if config.keep_fp32:
            return Support.no(
                "rounds SiLU to bf16 before the product; the call requires fp32 intermediates (keep_fp32)"
            )
        if shape.group_size not in GROUP_SIZES:
            return Support.no(f"group_size ({shape.group_size}) must be one of {GROUP_SIZES}")
        if shape.num_experts == 0 or shape.max_rows == 0:
            return Support.no(f"needs E >= 1 and N >= 1 (got E={shape.num_experts}, N={shape.max_rows})")
        limit = "" if config.swiglu_limit is None else f" (swiglu_limit {config.swiglu_limit:g} clamped by the plugin)"
        return Support.yes("SGLang's fused per_token_group_quant" + limit)

    def run(self, inputs, outputs, shape, config) -> None:
        gateup = inputs.gateup
        if config.swiglu_limit is not None:
            if not inputs.gateup_writable:
                gateup = gateup.clone()
            limit = round_to_bf16(config.swiglu_limit)
            gate, up = split_gate_up(gateup, swizzle=False)
            gate.clamp_(max=limit)
            up.clamp_(min=-limit, max=limit)
        expected_m = None
        if inputs.num_real_tokens:
            expected_m = -(-inputs.num_real_tokens * shape.topk // shape.num_experts)
        get_host_kernels().per_token_group_quant(
            gateup,
            outputs.out,
            outputs.scale,
            group_size=shape.group_size,
            scale_ue8m0=config.scale_ue8m0,
            fuse_silu_and_mul=True,
            masked_m=inputs.masked_m.clamp(0, shape.max_rows),  # the op's defined result outside [0, N]
            expected_m=expected_m,
        )
