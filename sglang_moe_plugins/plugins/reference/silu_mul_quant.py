"""``reference``: the pure-torch silu_mul_quant, the numerics oracle. Runs on CPU and GPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...contract import Plugin, Support
from ...errors import KernelNotAvailableError
from ...hardware import Platform
from ...lazy import lazy_module
from ...ops.silu_mul_quant import (
    OP,
    SiluMulQuantConfig,
    SiluMulQuantInputs,
    SiluMulQuantOutputs,
    SiluMulQuantShape,
    real_rows,
    split_gate_up,
)
from ...quant import pack_ue8m0_bytes, quantize_fp8_groups, round_to_bf16, ue8m0_exponent

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = ["ReferencePlugin", "silu_mul_quant_reference"]


def silu_mul_quant_reference(
    inputs: SiluMulQuantInputs, outputs: SiluMulQuantOutputs, shape: SiluMulQuantShape, config: SiluMulQuantConfig
) -> None:
    """Write the real rows of ``outputs``; padding rows are left as they were.

    ``masked_m`` is clamped to ``[0, N]`` and non-finite values follow the op's documented policy
    (see :mod:`sglang_moe_plugins.ops.silu_mul_quant`). Reads ``masked_m`` on the host, so it cannot
    run inside CUDA graph capture: it raises KernelNotAvailableError before touching the device.
    """
    if shape.num_experts == 0 or shape.max_rows == 0:
        return
    if inputs.gateup.is_cuda and torch.cuda.is_current_stream_capturing():
        raise KernelNotAvailableError(
            "plugin 'reference' cannot run inside CUDA graph capture: it reads masked_m on the host "
            "(a device-to-host sync, which capture forbids); select a capturable plugin (e.g. 'triton') "
            "for captured calls, or run this call eagerly"
        )
    mask = real_rows(inputs.masked_m, shape.max_rows)  # [E, N]; reads masked_m (a host sync)
    rows = inputs.gateup[mask]  # [R, 2D] bf16
    if rows.shape[0] == 0:
        return
    gate, up = split_gate_up(rows, config.swizzle)
    if config.swiglu_limit is not None:
        limit = round_to_bf16(config.swiglu_limit)
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    gate32 = gate.float()
    values = gate32 / (1.0 + torch.exp(-gate32)) * up.float()
    q, scale = quantize_fp8_groups(values, shape.group_size, ue8m0=config.scale_ue8m0)
    outputs.out[mask] = q
    if config.scale_ue8m0:
        outputs.scale[mask] = pack_ue8m0_bytes(ue8m0_exponent(scale))
    else:
        outputs.scale[mask] = scale


class ReferencePlugin(Plugin):
    name = "reference"
    op = OP
    priority = 0
    description = "pure torch oracle; every shape, CPU and GPU (slow: host sync on masked_m)"
    #: Reads ``gateup`` only (it indexes the real rows into a copy).
    #: On CUDA only when forced or with reference_on_gpu = true (Plugin.oracle).
    oracle = True
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return Support.yes("pure torch, runs anywhere")

    def supports(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> Support:
        return Support.yes("pure torch reference supports every valid call")

    def run(self, inputs, outputs, shape, config) -> None:
        silu_mul_quant_reference(inputs, outputs, shape, config)
