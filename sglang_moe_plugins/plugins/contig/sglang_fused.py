"""``contig_sglang_fused``: SGLang's fused JIT ``silu_and_mul_contig_post_quant`` (what the compact runner
runs with swizzle or ``silu_mul_keep_fp32``).

Limits, read from ``kernels/jit/csrc/deepseek_v4/silu_and_mul_masked_post_quant.cuh`` (0.5.23 line numbers;
``SiluAndMulContigPostQuantKernel`` and ``silu_mul_quant_contig_kernel``):

- group 32 or 128: ``static_assert(kGroupSize == 32 || kGroupSize == 128)`` (lines 436, 515); 0.5.20's
  template is ``static_assert(kGroupSize == 128)``, so 128 only there;
- D % 256 == 0: one block of ``D / 8`` threads per row, each thread 8 columns, and
  ``RuntimeCheck(num_threads % kWarpThreads == 0)`` (lines 583-584);
- D <= 8192: ``D / 8`` threads in one block, and a block holds at most 1024 threads (``__launch_bounds__(1024,
  2)``, line 429; the launcher does not check it, line 586: the launch itself would fail);
- packed UE8M0 scales need G % 4 == 0: ``RuntimeCheck(num_groups % 4 == 0, "transposed layout requires
  num_groups % 4 == 0")`` (line 559); the op's ``ue8m0_packed`` layout is the kernel's ``transposed=True``
  with ``scale_ue8m0=True`` (``transposed`` requires UE8M0, line 558), ``row_major`` is both False (the
  kernel's third combination, UE8M0 values as fp32 row-major, is not a layout of the op);
- M >= 1: the grid is one block per row (line 586), and a grid of 0 blocks is an invalid launch: a
  0-row call writes nothing and launches nothing here.

Numerics: the gate/up clamp in bf16, SiLU and the product in fp32 (``silu_and_mul<kApplySwigluLimit>``
with ``kPrecise = true``, lines 39-61): ``keep_fp32`` is satisfied. It is built with ``-use_fast_math``
(``__expf``, approximate division): scales and values may differ from the reference by an ulp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...contract import Plugin, Support
from ...hardware import Platform
from ...ops.silu_mul_quant_contig import (
    OP,
    ContigConfig,
    ContigInputs,
    ContigOutputs,
    ContigShape,
    expected_scale_strides,
)
from .sglang_host import (
    aligned,
    canonical_view,
    contig_kernels_source,
    cuda_contig_kernels,
    get_contig_kernels,
    kernel_input,
)

__all__ = ["ContigSglangFusedPlugin", "MAX_HIDDEN", "HIDDEN_MULTIPLE"]

#: D / 8 threads per block, at most 1024.
MAX_HIDDEN = 8192
#: D / 8 threads in whole warps of 32.
HIDDEN_MULTIPLE = 256


def _launch(shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
    group, ue8m0, limit, swizzle = shape.group_size, config.scale_ue8m0, config.swiglu_limit, config.swizzle

    def launch(inputs: ContigInputs, outputs: ContigOutputs) -> None:
        rows = inputs.rows
        if rows == 0:
            return
        out = outputs.out
        target = out if aligned(out) else out.new_empty(out.shape)
        scale = canonical_view(outputs.scale, expected_scale_strides(shape, config, rows)[1])
        get_contig_kernels().silu_and_mul_contig_post_quant(
            kernel_input(inputs.gateup),
            canonical_view(target, (shape.hidden, 1)),
            scale,
            group,
            scale_ue8m0=ue8m0,
            transposed=ue8m0,
            swiglu_limit=limit,
            swizzle=swizzle,
        )
        if target is not out:
            out.copy_(target)

    return launch


class ContigSglangFusedPlugin(Plugin):
    name = "contig_sglang_fused"
    op = OP
    priority = 100
    description = "SGLang's fused JIT silu_and_mul_contig_post_quant (CUDA; group 32/128, D % 256 == 0, D <= 8192)"
    #: The kernel reads ``gateup`` through a ``const bf16_t*`` (its .cuh); it writes out and scale only.
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return cuda_contig_kernels(platform)

    def supports(self, shape: ContigShape, config: ContigConfig) -> Support:
        platform = self.available(config.platform)
        if not platform:
            return platform
        found = contig_kernels_source()
        groups = found[1] if found is not None else (32, 128)
        d, g = shape.hidden, shape.num_groups
        checks = (
            (
                shape.group_size in groups,
                f"group_size ({shape.group_size}) must be one of {groups} (the kernel's static_assert on kGroupSize)",
            ),
            (
                d % HIDDEN_MULTIPLE == 0,
                f"D ({d}) must be a multiple of {HIDDEN_MULTIPLE} (one thread per 8 columns, D / 8 threads in whole warps)",
            ),
            (d <= MAX_HIDDEN, f"D ({d}) must be <= {MAX_HIDDEN} (one block of D / 8 threads per row, at most 1024)"),
            (
                not config.scale_ue8m0 or g % 4 == 0,
                f"packed UE8M0 scales need G % 4 == 0 (G={g}): the kernel's transposed layout writes whole int32 words",
            ),
        )
        for ok, reason in checks:
            if not ok:
                return Support.no(reason)
        return Support.yes("within SGLang's fused contiguous kernel's limits (fp32 product)")

    def prepare(self, shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
        return _launch(shape, config)

    def run(self, inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> Any:
        _launch(shape, config)(inputs, outputs)
