"""``example_torch_contig``: a vectorised pure-torch ``silu_mul_quant_contig`` plugin.

The activation step of SGLang's DeepGEMM contiguous (compact) runner: SwiGLU over ``gateup`` bf16
``[M, 2D]`` (optional swiglu_limit clamp), then per-token-group FP8 e4m3 quantization into the host's
preallocated ``out`` fp8 ``[M, D]`` and ``scale`` (fp32 ``[M, G]`` row-major, or packed UE8M0 int32
``[M, ceil(G/4)]`` with strides ``(1, Ma)``). M is the call's row count (``inputs.rows``), not part of
the shape key.

Correct for what it claims and deliberately narrow, to show how ``supports`` declines with a reason: it
reads the natural ``[gate | up]`` layout only, not the gran-8 swizzled one. Everything else the op allows
it handles: any M (0 included), every group size, ``swiglu_limit``, both scale layouts, and ``keep_fp32``
calls (it computes SiLU and the product in fp32). It reads no tensor data on the host, so it is CUDA-graph
safe, and it never writes ``gateup``.

Priority 25: above ``contig_reference`` (0). On a CPU-only host it is therefore the plugin selected for
the calls it supports.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_moe_plugins import Platform, Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant_contig import ContigConfig, ContigInputs, ContigOutputs, ContigShape

__all__ = ["ExampleTorchContigPlugin"]

_FP8_MAX = 448.0
_ABSMAX_FLOOR = 1e-10


def _bf16(value: float) -> float:
    """``value`` rounded to bf16: the host's kernels clamp with a bf16 limit."""
    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).float())


def _ceil_pow2_exponent(scale: torch.Tensor) -> torch.Tensor:
    """Biased fp32 exponent of the smallest power of two >= ``scale`` (UE8M0)."""
    bits = scale.contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


class ExampleTorchContigPlugin(Plugin):
    name = "example_torch_contig"
    op = "silu_mul_quant_contig"
    priority = 25
    #: The plugin contract this code was written for (adding the op did not change it).
    contract_version = 2
    description = "example third-party plugin: vectorised pure torch, contiguous rows, natural gate/up layout"
    #: It reads ``gateup`` only, so a failure lets the host run the next plugin on the same input (SGLang's
    #: hook marks ``gateup`` writable: undeclared, a failure would not be retried).
    writes_inputs = frozenset()

    def available(self, platform: Platform) -> Support:
        return Support.yes(f"pure torch: runs on CPU and CUDA (here {platform.describe()})")

    def supports(self, shape: ContigShape, config: ContigConfig) -> Support:
        # Cheap and pure: only the shape and config (no row count: M is the call's), never a tensor.
        if config.swizzle:
            return Support.no("reads the natural [gate | up] layout only, not gran-8 swizzled input")
        if config.platform.device_type not in ("cpu", "cuda"):
            return Support.no(f"runs on CPU and CUDA, not on {config.platform.describe()}")
        return Support.yes(f"vectorised torch, fp32 product, group {shape.group_size}, scales {config.scale_layout}")

    def prepare(self, shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
        """Optional: the launch for one shape key, worked out once from the shape and config (here only the
        bf16 limit). It must not keep anything of a call: M and the values are each call's own."""
        d, group, groups = shape.hidden, shape.group_size, shape.num_groups
        limit = _bf16(config.swiglu_limit) if config.swiglu_limit is not None else None
        ue8m0 = config.scale_ue8m0

        def launch(inputs: ContigInputs, outputs: ContigOutputs) -> None:
            rows = inputs.rows
            if rows == 0:
                return
            gate, up = inputs.gateup[:, :d], inputs.gateup[:, d:]
            if limit is not None:
                gate = gate.clamp(max=limit)  # in bf16, as the host's kernels do
                up = up.clamp(min=-limit, max=limit)
            values = torch.nn.functional.silu(gate.float()).mul_(up.float())  # SiLU and product in fp32
            grouped = values.view(rows, groups, group)
            scale = grouped.abs().amax(dim=-1).clamp_min_(_ABSMAX_FLOOR).div_(_FP8_MAX)
            if ue8m0:
                exponent = _ceil_pow2_exponent(scale)
                scale = (exponent << 23).view(torch.float32)  # the power of two itself
            q = grouped.mul_(scale.reciprocal().unsqueeze(-1)).clamp_(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
            outputs.out.copy_(q.view(rows, d))
            if ue8m0:
                # Four group exponents per int32, group 4k+j in byte j (little-endian), pad bytes 0; copy_
                # writes through the host's strides (1, Ma).
                packed = torch.zeros((rows, shape.packed_groups * 4), dtype=torch.uint8, device=values.device)
                packed[:, :groups] = exponent.to(torch.uint8)
                outputs.scale.copy_(packed.view(torch.int32))
            else:
                outputs.scale.copy_(scale)

        return launch

    def run(self, inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> None:
        self.prepare(shape, config)(inputs, outputs)
