"""Launch configuration of the ``silu_mul_quant`` Triton kernel: :class:`KernelConfig` and
:func:`choose_config`, a pure function of the sizes (never of data), tuned from the H200 sweeps in
``docs/triton-kernel.md``. Imports neither Triton nor CUDA."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..triton_common import next_pow2

__all__ = ["KernelConfig", "choose_block_c", "choose_config", "item_bound", "row_bound", "waves_for"]


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters: ``block_m`` rows x ``block_c`` columns per work item, warps, programs per SM.

    ``ctas_per_sm`` bounds the programs per SM of one wave; the launcher lowers it to what the compiled
    kernel keeps resident, then multiplies by ``waves``, and caps the grid at ``max_programs``. With
    ``target_programs`` set, ``waves`` is a floor: the launcher takes the whole number of waves nearest
    to the target (:func:`waves_for`), at least ``waves`` and at most ``max(waves, max_waves)``.
    ``max_registers`` caps registers per thread (Triton's ``maxnreg``; fewer registers, more resident
    programs). ``idle_exit``: a program without work items leaves before waiting for the previous
    kernel (programmatic dependent launch). ``front_load``: where a call has at least as many items as
    programs, the first programs (started first) take the longer shares instead of spreading them.
    ``early_trigger``: the next kernel may launch when this one starts instead of after its wait
    (measured slower at decode; kept for the variant benchmark)."""

    block_m: int
    block_c: int
    num_warps: int = 4
    ctas_per_sm: int = 8
    prefetch: bool = False
    max_registers: int | None = None
    waves: int = 1
    early_trigger: bool = False
    idle_exit: bool = False
    max_programs: int | None = None
    target_programs: int | None = None
    max_waves: int = 16
    front_load: bool = False


_DECODE_ROWS = 2048
_TILE_ELEMS = 2048
_DECODE_TILE_ELEMS = 1024
_FEW_EXPERTS = 64
_ITEMS_PER_PROGRAM = 2.5  # E <= 64 prefill: programs = items at the row bound / 2.5 (docs/triton-kernel.md)


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
    """The launch configuration for a shape key: a pure function of the sizes, never of data.

    The row bound ``min(E * N, N * topk)`` (the host's ``sum(masked_m) <= N * topk``) picks the regime:

    - E > 64: work items of 2048 output elements (``block_c`` columns, see :func:`choose_block_c`, by
      ``2048 // block_c`` rows) on 4 warps; 4 programs per SM at decode sizes (row bound <= 2048), else
      one wave of at most 8 per SM (every program scans masked_m). Where the row bound is at most E
      (most experts hold no row or one), one-row items instead, and exactly as many programs as the
      row bound gives items (:func:`item_bound`, exact for one-row items): a row block of several rows
      would be mostly empty, and a program without items still scans all of masked_m.
    - E <= 64, decode sizes: items of 1024 elements, one wave of up to 16 programs per SM, but never
      more programs than :func:`item_bound` (programs without items still cost a launch slot; the
      measurements are in docs/triton-kernel.md); programs without items leave at once. Where the
      items outnumber the resident programs (DSV3 EP8 at its 1024-row bound), the programs with two
      items are the first ones (``front_load``).
    - E <= 64, prefill sizes: items of 2048 elements; about one program per 2.5 items of the row bound,
      in whole waves of as many programs as the compiled kernel keeps resident (at most 16 per SM),
      between 4 and 16 waves; idle programs leave at once. At two thirds of the row bound a program
      still gets about 1.7 items, the best share measured at the prefill shapes with D <= 3072; the
      longest shapes (E = 64, D = 4096; Mixtral) run best on 2-3 items per program, which the 16-wave
      cap and the rule give them, and four waves are the floor where a bound has few items (OLMoE).

    So E <= 64 has two compiled kernels per shape family (decode and prefill tiles), each compiled once;
    E > 64 one, or two where small token counts bring the row bound down to E. The launcher lowers
    ``ctas_per_sm`` to the kernel's residency, so a wave is never split. From the H200 sweeps and
    ``benchmarks/smq_kernel_variants.py`` (docs/triton-kernel.md). The row bound only tunes speed: any
    masked_m is handled.
    """
    block_c = choose_block_c(hidden, group_size)
    rows_bound = row_bound(num_experts, max_rows, topk)
    decode = rows_bound <= _DECODE_ROWS
    if num_experts > _FEW_EXPERTS:
        if rows_bound <= num_experts:
            return KernelConfig(
                block_m=1,
                block_c=block_c,
                num_warps=4,
                ctas_per_sm=16,
                max_programs=max(1, item_bound(num_experts, max_rows, hidden, 1, block_c, topk)),
            )
        block_m = max(1, _TILE_ELEMS // block_c)
        return KernelConfig(block_m=block_m, block_c=block_c, num_warps=4, ctas_per_sm=4 if decode else 8)
    if not decode:
        block_m = max(1, _TILE_ELEMS // block_c)
        items = item_bound(num_experts, max_rows, hidden, block_m, block_c, topk)
        return KernelConfig(
            block_m=block_m,
            block_c=block_c,
            num_warps=4,
            ctas_per_sm=16,
            waves=4,
            idle_exit=True,
            target_programs=max(1, round(items / _ITEMS_PER_PROGRAM)),
            max_waves=16,
        )
    block_m = max(1, _DECODE_TILE_ELEMS // block_c)
    return KernelConfig(
        block_m=block_m,
        block_c=block_c,
        num_warps=4,
        ctas_per_sm=16,
        idle_exit=True,
        max_programs=max(1, item_bound(num_experts, max_rows, hidden, block_m, block_c, topk)),
        front_load=True,
    )


def row_bound(num_experts: int, max_rows: int, topk: int = 8) -> int:
    """The most real rows a shape key's calls can have: ``min(E * N, N * topk)`` (each of the N token slots
    routes to at most ``topk`` experts; the host's ``sum(masked_m) <= N * topk``)."""
    return min(num_experts * max_rows, max_rows * max(1, topk))


def item_bound(num_experts: int, max_rows: int, hidden: int, block_m: int, block_c: int, topk: int = 8) -> int:
    """An upper bound of the work items (``block_m`` rows x ``block_c`` columns) any masked_m within the host's
    row bound ``R = min(E * N, N * topk)`` gives: ``sum(ceil(m_e / BM)) <= (R + E * (BM - 1)) // BM`` row tiles
    (each expert's last tile may be partial), at most ``E * ceil(N / BM)``, times the column chunks. Exact
    for ``block_m = 1``; above the true maximum where fewer than E experts can hold rows (R < E)."""
    rows_bound = row_bound(num_experts, max_rows, topk)
    row_tiles = min(num_experts * -(-max_rows // block_m), (rows_bound + num_experts * (block_m - 1)) // block_m)
    return row_tiles * -(-hidden // block_c)


def waves_for(config: KernelConfig, wave: int) -> int:
    """Waves of ``wave`` programs (one wave: the resident programs of all SMs) the grid holds:
    ``config.waves``, or with ``config.target_programs`` the whole number of waves nearest to it (ties to
    even), at least ``config.waves`` and at most ``max(config.waves, config.max_waves)``."""
    waves = max(1, config.waves)
    if config.target_programs is None:
        return waves
    return min(max(waves, round(config.target_programs / max(1, wave))), max(waves, config.max_waves))
