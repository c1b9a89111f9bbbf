"""The tiling of this project's MegaMoE pre-dispatch kernel (:mod:`.pre_dispatch_triton`): how a call's
tokens and columns are cut into programs. Pure Python, no torch, no Triton."""

from __future__ import annotations

from dataclasses import dataclass

from ..triton_common import next_pow2

__all__ = ["PreDispatchTiling", "choose_tiling"]


@dataclass(frozen=True)
class PreDispatchTiling:
    """Tokens x columns per program, warps, and whether ``x`` is read with an evict-first L2 hint (off by
    default: it made T >= 2048 4-6% slower on the H200, and the shared expert may read ``x`` again)."""

    block_tokens: int
    block_cols: int
    num_warps: int
    evict_first: bool = False


def choose_tiling(num_tokens: int, hidden: int, group_size: int, *, packed_fp4: bool = False) -> PreDispatchTiling:
    """Tile sizes from the H200 sweeps in ``benchmarks/results/mega_pre_dispatch_h200*.json``:

    - T >= 1024: 4 tokens x up to 1024 columns (whole groups) on 4 warps (T = 8192, H = 4096: 25.8 us,
      0.94 of the copy ceiling);
    - 256 <= T < 1024: 8 tokens x 512 columns on 4 warps (T = 512, H = 4096, 12 interleaved rounds:
      2.37 us vs 2.43 with 4 x 1024, SGLang's kernel 2.46);
    - FP8 at 32 <= T < 256 with a power-of-two H <= 4096: one token per program over the whole row,
      16 columns per thread (T = 64, H = 4096: 1.42 us vs 1.51 with 2 x 1024; at H = 7168 a split
      4096 + 3072 row was slower, 1.70 us vs 1.55);
    - otherwise 2 rows x 1024 for FP8 and 1 for MXFP4 (T = 64, H = 7168: 1.65 us vs 1.73 with 1 row;
      MXFP4 1.77 us vs 1.93 with 2).

    The T = 512 and T = 64 comparisons were made for W4A8 FP8 (group 32) at H = 4096; the SM90 FP8
    variant (group 128), other hidden sizes and other T in those ranges follow the same rules unmeasured.
    """
    block_cols = max(group_size, min(1024, next_pow2(hidden)))
    if num_tokens >= 1024:
        return PreDispatchTiling(4, block_cols, 4)
    if num_tokens >= 256:
        return PreDispatchTiling(8, max(group_size, min(512, next_pow2(hidden))), 4)
    if not packed_fp4 and num_tokens >= 32 and hidden <= 4096 and hidden == next_pow2(hidden):
        return PreDispatchTiling(1, max(group_size, hidden), max(4, hidden // 512))  # <= 16 columns per thread
    if packed_fp4 or num_tokens <= 1:
        return PreDispatchTiling(1, block_cols, 4)
    return PreDispatchTiling(2, block_cols, 4)
