"""``jit_ep``: SGLang's DSV4 JIT kernel ``silu_and_mul_masked_post_quant``.

Limits, read from ``kernels/jit/csrc/deepseek_v4/silu_and_mul_masked_post_quant.cuh`` (0.5.23): one
thread per 8 output columns in whole warps (D % 256 == 0, D <= 8192); the block scans masked_m with
one thread per expert (D // 8 >= E, E <= 256); group 32 or 128; scales row-major fp32, or packed
UE8M0 written as ``[E, G//4, N]`` (needs N % 4 == 0 and G % 4 == 0 to be the host's layout). It
writes at most ``N * topk`` real rows in total (the host guarantees ``sum(masked_m) <= N * topk``) and
silently skips the rest, so the plugin passes ``topk = max(topk, E)``: every row below
``clamp(masked_m, 0, N)`` is written, as the op defines (the kernel's grid cap rises with it, by at most
``N * E`` programs that scan ``masked_m`` and exit).
"""

from __future__ import annotations

from ...contract import Plugin, Support
from ...hardware import Platform
from ...ops.silu_mul_quant import OP, SiluMulQuantConfig, SiluMulQuantShape
from .host import cuda_host_kernels, get_host_kernels

__all__ = ["JitEpPlugin", "MAX_EXPERTS", "MAX_HIDDEN"]

MAX_EXPERTS = 256
MAX_HIDDEN = 8192


class JitEpPlugin(Plugin):
    name = "jit_ep"
    op = OP
    priority = 100
    description = "SGLang's DSV4 JIT silu_and_mul_masked_post_quant (CUDA sm90+, narrow shape limits)"
    #: The kernel reads ``gateup`` through a ``const bf16_t*`` (its .cuh); it writes out and scale only.
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return cuda_host_kernels(platform, min_sm=90)

    def supports(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> Support:
        e, n, d, g = shape.num_experts, shape.max_rows, shape.hidden, shape.num_groups
        platform = self.available(config.platform)
        if not platform:
            return platform
        checks = (
            (e >= 1 and n >= 1, f"needs E >= 1 and N >= 1 (got E={e}, N={n})"),
            (d % 256 == 0, f"D ({d}) must be a multiple of 256 (one thread per 8 columns, whole warps)"),
            (d <= MAX_HIDDEN, f"D ({d}) must be <= {MAX_HIDDEN} (D / 8 threads per block, at most 1024)"),
            (e <= MAX_EXPERTS, f"E ({e}) must be <= {MAX_EXPERTS} (masked_m is scanned in shared memory)"),
            (d // 8 >= e, f"D // 8 ({d // 8}) must be >= E ({e}) (one thread per expert scans masked_m)"),
            (shape.group_size in (32, 128), f"group_size ({shape.group_size}) must be 32 or 128"),
            (
                config.scale_layout != "column_major",
                "writes row-major fp32 or packed UE8M0 scales; this call needs column-major fp32 scales",
            ),
            (not config.scale_ue8m0 or n % 4 == 0, f"packed UE8M0 scales need N % 4 == 0 (N={n})"),
            (not config.scale_ue8m0 or g % 4 == 0, f"packed UE8M0 scales need G % 4 == 0 (G={g})"),
        )
        for ok, reason in checks:
            if not ok:
                return Support.no(reason)
        return Support.yes("within the DSV4 JIT kernel's limits")

    def run(self, inputs, outputs, shape, config) -> None:
        kernels = get_host_kernels()
        packed = config.scale_ue8m0
        kernels.silu_and_mul_masked_post_quant(
            inputs.gateup,
            outputs.out,
            outputs.scale.transpose(-1, -2) if packed else outputs.scale,
            shape.group_size,
            # the op's defined result for counts outside [0, N]; SGLang's kernel would write past row N
            inputs.masked_m.clamp(0, shape.max_rows),
            scale_ue8m0=packed,
            # SGLang's kernel writes at most N * topk rows in total (the host's guarantee), and silently
            # leaves the rest unwritten; with topk >= E it covers every row a masked_m in [0, N] can hold
            topk=max(shape.topk, shape.num_experts),
            transposed=packed,
            swiglu_limit=config.swiglu_limit,
            swizzle=config.swizzle,
        )
