"""Launch configuration of the ``silu_mul_quant`` Triton kernel: :class:`KernelConfig` and
:func:`choose_config`, a pure function of the sizes (never of data), tuned from the H200 sweeps in
``docs/triton-kernel.md``. Imports neither Triton nor CUDA."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..triton_common import next_pow2

__all__ = ["KernelConfig", "choose_block_c", "choose_config"]


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters: ``block_m`` rows x ``block_c`` columns per work item, warps, programs per SM.

    ``ctas_per_sm`` bounds the programs per SM of one wave; the launcher lowers it to what the compiled
    kernel keeps resident, then multiplies by ``waves``. ``max_registers`` caps registers per thread
    (Triton's ``maxnreg``; fewer registers, more resident programs)."""

    block_m: int
    block_c: int
    num_warps: int = 4
    ctas_per_sm: int = 8
    prefetch: bool = False
    max_registers: int | None = None
    waves: int = 1
    early_trigger: bool = False
    idle_exit: bool = False


_DECODE_ROWS = 2048
_TILE_ELEMS = 2048


def choose_block_c(hidden: int, group_size: int, max_block_c: int = 1024) -> int:
    """Columns per work item: the largest power of two in [group_size, max_block_c] whose padding of D
    to a multiple of it wastes at most 1/8 of the lanes (D = 768 -> 256, 1536 -> 512, 2880 -> 1024)."""
    block_c = max(group_size, min(max_block_c, next_pow2(hidden)))
    while block_c > group_size:
        padded = -(-hidden // block_c) * block_c
        if (padded - hidden) * 8 <= hidden:
            break
        block_c //= 2
    return block_c


@functools.lru_cache(maxsize=4096)  # called on every launch; KernelConfig is frozen, so sharing it is safe
def choose_config(num_experts: int, max_rows: int, hidden: int, group_size: int, topk: int = 8) -> KernelConfig:
    """The launch configuration for a shape family: a pure function of the sizes, never of data.

    The compiled part (rows and columns per work item, warps) depends on E, D and the group size
    only, so that one compiled kernel serves every token count N: work items of 2048 output
    elements (``block_c`` columns, see :func:`choose_block_c`, by ``2048 // block_c`` rows) on 4
    warps. Only the grid (programs per SM) follows N: 4 per SM at decode sizes (at most 2048 real
    rows expected from the host's bound ``sum(masked_m) <= N * topk``); for E <= 64 two full waves
    of as many programs as the compiled kernel keeps resident (at most 16 per SM); for more experts
    one wave of at most 8 per SM (every program scans masked_m). The launcher lowers these bounds to
    the kernel's residency, so a wave is never split. From the H200 sweeps recorded in
    docs/triton-kernel.md. The row bound only tunes speed: any masked_m is handled.
    """
    block_c = choose_block_c(hidden, group_size)
    block_m = max(1, _TILE_ELEMS // block_c)
    rows_bound = min(num_experts * max_rows, max_rows * max(1, topk))
    waves = 1
    if rows_bound <= _DECODE_ROWS:
        ctas = 4
    elif num_experts <= 64:
        ctas, waves = 16, 2
    else:
        ctas = 8
    return KernelConfig(block_m=block_m, block_c=block_c, num_warps=4, ctas_per_sm=ctas, prefetch=False, waves=waves)
