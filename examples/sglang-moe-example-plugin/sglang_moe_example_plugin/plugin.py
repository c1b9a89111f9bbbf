"""``example_torch``: a vectorised pure-torch ``silu_mul_quant`` plugin.

Correct for what it claims and deliberately narrow, to show how ``supports`` declines with a reason:

- group_size 128 only (the example keeps one code path; the op allows 16 to 256),
- natural ``[gate | up]`` input only, not the gran-8 swizzled layout.

Everything else the op allows it handles: any E and N, ragged and empty ``masked_m``, ``swiglu_limit``,
fp32 intermediates (so ``keep_fp32`` calls too), all three scale layouts, CPU and CUDA. It reads no
tensor data on the host (no ``.item()``, no ``masked_m`` sync): it computes every row, padding
included, and writes them all (padding contents are unspecified by the op), so it is CUDA-graph safe.

Priority 25: above ``reference`` (0), below SGLang's ``fp8_fallback`` (50) and the CUDA kernels. On a
CPU-only host it is therefore the plugin selected for the calls it supports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch

from sglang_moe_plugins import Platform, Plugin, Support
from sglang_moe_plugins.ops.silu_mul_quant import (
    SiluMulQuantConfig,
    SiluMulQuantInputs,
    SiluMulQuantOutputs,
    SiluMulQuantShape,
)

__all__ = ["ExampleTorchPlugin"]

_FP8_MAX = 448.0
_ABSMAX_FLOOR = 1e-10
_GROUP_SIZE = 128


def _bf16(value: float) -> float:
    """``value`` rounded to bf16: the host's kernels clamp with a bf16 limit."""
    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).float())


def _nothing(inputs: SiluMulQuantInputs, outputs: SiluMulQuantOutputs) -> None:
    """The launch of an empty call (E = 0 or N = 0): nothing to write."""


def _ceil_pow2_exponent(scale: torch.Tensor) -> torch.Tensor:
    """Biased fp32 exponent of the smallest power of two >= ``scale`` (UE8M0)."""
    bits = scale.contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


class ExampleTorchPlugin(Plugin):
    name = "example_torch"
    op = "silu_mul_quant"
    priority = 25
    #: The plugin contract this code was written for. Do not write ``CONTRACT_VERSION`` here to silence
    #: a mismatch: the number says what the code was checked against.
    contract_version = 2
    description = "example third-party plugin: vectorised pure torch, group 128, natural gate/up layout"
    #: ``chunk_experts``: process this many experts at a time to bound temporary memory (0: all at once).
    #: Users set it in the config file: ``[options.example_torch] chunk_experts = 8``.
    options = MappingProxyType({"chunk_experts": 0})

    #: It reads ``gateup`` only (the clamp and SiLU make new tensors): when it fails, the host may run
    #: the next plugin on the same input. Undeclared, a failure on a writable input is not retried.
    writes_inputs = frozenset()

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Option values, checked once when the registry is built (their types were checked against the
        defaults before): a ValueError becomes a ConfigError naming this plugin, the value and where it
        was set. (``sglang_moe_plugins.OptionValueError``, a ValueError, gives the same with the option
        as a field; plain ValueError keeps the example importable with sglang-moe-plugins 0.3.0.)"""
        chunk = options["chunk_experts"]
        if chunk < 0:
            raise ValueError(
                f"chunk_experts={chunk!r}; allowed: 0 (all experts at once) or an int >= 1 (experts per chunk)"
            )

    def available(self, platform: Platform) -> Support:
        return Support.yes(f"pure torch: runs on CPU and CUDA (here {platform.describe()})")

    def supports(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> Support:
        # Cheap and pure: only the shape and config, never a tensor. The first failing reason is returned.
        if shape.group_size != _GROUP_SIZE:
            return Support.no(f"only group_size {_GROUP_SIZE} (this call has group_size {shape.group_size})")
        if config.swizzle:
            return Support.no("reads the natural [gate | up] layout only, not gran-8 swizzled input")
        if config.platform.device_type not in ("cpu", "cuda"):
            return Support.no(f"runs on CPU and CUDA, not on {config.platform.describe()}")
        return Support.yes(f"vectorised torch, group {_GROUP_SIZE}, scales {config.scale_layout}")

    def prepare(
        self, shape: SiluMulQuantShape, config: SiluMulQuantConfig
    ) -> Callable[[SiluMulQuantInputs, SiluMulQuantOutputs], None]:
        """Optional: the launch for one shape key, worked out once (here the expert chunks from the
        ``chunk_experts`` option). Called once per key before its first call, possibly again (it must not
        mind); it sees only the shape and config, never a tensor. Without ``prepare`` the host calls
        ``run`` on every call, which works too."""
        return self._launch(shape, config)

    def run(
        self,
        inputs: SiluMulQuantInputs,
        outputs: SiluMulQuantOutputs,
        shape: SiluMulQuantShape,
        config: SiluMulQuantConfig,
    ) -> None:
        self._launch(shape, config)(inputs, outputs)

    def _launch(
        self, shape: SiluMulQuantShape, config: SiluMulQuantConfig
    ) -> Callable[[SiluMulQuantInputs, SiluMulQuantOutputs], None]:
        e = shape.num_experts
        if e == 0 or shape.max_rows == 0:
            return _nothing
        chunk = int(self.options.get("chunk_experts", 0)) or e
        spans = tuple((start, min(e, start + chunk)) for start in range(0, e, chunk))
        run_experts = self._run_experts

        def launch(inputs: SiluMulQuantInputs, outputs: SiluMulQuantOutputs) -> None:
            for start, stop in spans:
                run_experts(inputs.gateup[start:stop], outputs, start, stop, shape, config)

        return launch

    def _run_experts(
        self,
        gateup: torch.Tensor,
        outputs: SiluMulQuantOutputs,
        start: int,
        stop: int,
        shape: SiluMulQuantShape,
        config: SiluMulQuantConfig,
    ) -> None:
        e, n, d, groups = stop - start, shape.max_rows, shape.hidden, shape.num_groups
        gate, up = gateup[..., :d], gateup[..., d:]
        if config.swiglu_limit is not None:
            limit = _bf16(config.swiglu_limit)
            gate = gate.clamp(max=limit)  # in bf16, as the host's kernels do
            up = up.clamp(min=-limit, max=limit)
        values = torch.nn.functional.silu(gate.float()).mul_(up.float())  # SiLU and product in fp32
        grouped = values.view(e, n, groups, _GROUP_SIZE)
        scale = grouped.abs().amax(dim=-1).clamp_min_(_ABSMAX_FLOOR).div_(_FP8_MAX)
        exponent: Any = None
        if config.scale_ue8m0:
            exponent = _ceil_pow2_exponent(scale)
            scale = (exponent << 23).view(torch.float32)  # the power of two itself
        q = grouped.mul_(scale.reciprocal().unsqueeze(-1)).clamp_(-_FP8_MAX, _FP8_MAX).to(torch.float8_e4m3fn)
        outputs.out[start:stop].copy_(q.view(e, n, d))
        if config.scale_ue8m0:
            # Four group exponents per int32, group 4k+j in byte j (little-endian), pad bytes 0.
            packed = torch.zeros((e, n, shape.packed_groups * 4), dtype=torch.uint8, device=gateup.device)
            packed[..., :groups] = exponent.to(torch.uint8)
            outputs.scale[start:stop].copy_(packed.view(torch.int32))
        else:
            outputs.scale[start:stop].copy_(scale)  # copy_ honours the column-major strides of the host
