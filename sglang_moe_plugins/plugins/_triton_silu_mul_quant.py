"""Triton kernel and launcher for ``silu_mul_quant`` (masked SwiGLU + per-token-group FP8 quantization).

This module imports Triton at its top level. Nothing imports it at package import time: the
``triton`` plugin imports it on its first ``run``. Importing it defines the ``@triton.jit`` function
only; compilation happens on the first launch of a given specialisation.

Design (see ``docs/triton-kernel.md`` for the measurements behind it):

- Persistent grid sized to the device in whole waves: ``ctas_per_sm`` programs per SM, capped at
  the number the compiled kernel keeps resident per SM (so no wave is split), times ``waves``;
  independent of the data.
- Work items are ``(expert, block of BM real rows, chunk of BC columns)``. Every program reads
  ``masked_m`` itself (no host sync, no second launch), counts the items of the real rows only,
  takes one contiguous range of items (equal counts per program, so routing skew does not matter)
  and, when it has work, locates its first item with one vectorised prefix sum; it then walks its
  range in order, stepping to the next non-empty expert with one scalar read when a block of rows
  is done (never past its last item).
- Programmatic dependent launch on sm90+: ``masked_m`` is read before ``griddepcontrol.wait``,
  ``gateup`` and the outputs after it (SGLang's kernel makes the same assumption).
- A tile is loaded as ``[BM, BC // GS, GS]`` so that the per-group absmax is a reduction over the
  last axis. Gate and up are read with 16-byte loads in both the natural and the gran-8 swizzled
  layouts. Scales are written through explicit strides (row-major, column-major), or for UE8M0 as
  single bytes into the packed int32 words (group ``4k+j`` in byte ``j``), pad bytes zeroed; on the
  GPU with predicated inline-PTX stores that keep the reduction's register layout (no shared memory).
- Integer arguments that vary with the token count (``N`` and the scale strides) are not
  specialised and the compiled configuration depends on E, D and the group size only, so one
  compiled kernel serves every token count and every ``masked_m``.

Numerics follow the ``reference`` plugin: clamp (limit pre-rounded to bf16) on bf16 values, SiLU
and product in fp32 (``ex2.approx`` and ``rcp.approx``, as SGLang's kernel; plain ``tl.exp`` and
division under Triton's CPU interpreter), absmax floored at 1e-10,
``scale = absmax / 448`` (IEEE division), rounded up to a power of two for UE8M0, values
multiplied by ``1 / scale`` and converted with round-to-nearest-even and saturation.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch
import triton
import triton.language as tl

from ._triton_launch import LowLevelLaunch, compile_specialisation, next_pow2, ordered_arguments, pdl_supported

__all__ = ["KernelConfig", "LaunchPlan", "choose_block_c", "choose_config", "launch", "plan_launch", "prepare_launch",
           "pointer_dtypes", "sm_count", "pdl_supported", "resident_programs_per_sm", "occupancy_records"]

logger = logging.getLogger(__name__)


@triton.jit
def _exp2_approx(x):
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _rcp_approx(x):
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _store_b32(ptrs, value, mask):
    # A predicated 4-byte store in the value's own layout: tl.store would first convert the per-group
    # scales to a store layout through shared memory (two barriers per work item). Threads that hold
    # the same group store the same value to the same address.
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptrs.to(tl.int64), value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _store_b8(ptrs, value, mask):
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b8 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptrs.to(tl.int64), value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_tile(x_ptr, e_cur, rb, c, m_cur, num_rows, D: tl.constexpr, GS: tl.constexpr, BM: tl.constexpr,
               BC: tl.constexpr, SWIZZLE: tl.constexpr, EVEN_D: tl.constexpr):
    """Gate and up (bf16) of one work item as ``[BM, BC // GS, GS]``; rows >= ``m_cur`` masked off."""
    NGC: tl.constexpr = BC // GS
    rows = rb * BM + tl.arange(0, BM)
    grow = e_cur.to(tl.int64) * num_rows + rows
    col = (c * NGC + tl.arange(0, NGC))[:, None] * GS + tl.arange(0, GS)[None, :]
    if SWIZZLE:  # gran-8 interleave: every 16 input columns are gate[8] up[8]
        gcol = (col // 8) * 16 + (col % 8)
        ucol = gcol + 8
    else:
        gcol = col
        ucol = col + D
    if EVEN_D:
        mask = (rows < m_cur)[:, None, None]
    else:
        mask = (rows < m_cur)[:, None, None] & (col < D)[None, :, :]
    xrow = x_ptr + grow[:, None, None] * (2 * D)
    gate = tl.load(xrow + gcol[None, :, :], mask=mask, other=0.0)
    up = tl.load(xrow + ucol[None, :, :], mask=mask, other=0.0)
    return gate, up


@triton.jit
def _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit,
                 D: tl.constexpr, GS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BM: tl.constexpr,
                 BC: tl.constexpr, NC: tl.constexpr, HAS_LIMIT: tl.constexpr, UE8M0: tl.constexpr,
                 EVEN_D: tl.constexpr, FAST: tl.constexpr):
    """SwiGLU, per-group scale, FP8 values and scales of one work item, stored."""
    NGC: tl.constexpr = BC // GS
    rows = rb * BM + tl.arange(0, BM)
    rmask = rows < m_cur
    grow = e_cur.to(tl.int64) * num_rows + rows
    gidx = c * NGC + tl.arange(0, NGC)
    col = gidx[:, None] * GS + tl.arange(0, GS)[None, :]
    if EVEN_D:
        mask = rmask[:, None, None]
    else:
        mask = rmask[:, None, None] & (col < D)[None, :, :]
    g = gate.to(tl.float32)
    u = up.to(tl.float32)
    if HAS_LIMIT:  # the limit is a bf16 value, so clamping in fp32 equals clamping in bf16
        g = tl.minimum(g, limit, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as torch.clamp
        u = tl.minimum(tl.maximum(u, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                       propagate_nan=tl.PropagateNan.ALL)
    if FAST:  # as SGLang's kernel (__expf, fast division): one MUFU.EX2 and one MUFU.RCP per element
        v = g * _rcp_approx(1.0 + _exp2_approx(g * -1.4426950408889634)) * u
    else:  # Triton's CPU interpreter has no inline PTX
        v = g / (1.0 + tl.exp(-g)) * u
    # Non-finite policy of the op: NaN is left out of the absmax (max.f32 drops NaN operands) and
    # quantizes to NaN; +-Inf (and fp32 overflow) counts as FLT_MAX and saturates to +-448 below.
    amax = tl.max(tl.abs(v), axis=2)  # [BM, NGC]; NaN only for a group of NaN only
    if not FAST:  # Triton 3.6's interpreter evaluates the NaN-dropping maximum below with np.maximum
        amax = tl.where(amax == amax, amax, 0.0)
    amax = tl.minimum(tl.maximum(amax, 1e-10), 3.4028234663852886e38)
    scale = tl.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        expo = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (expo << 23).to(tl.float32, bitcast=True)
    inv = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    # The conversion saturates to +-448 (cvt.rn.satfinite) and keeps NaN, as the reference's clamp does.
    q = (v * inv[:, :, None]).to(tl.float8e4nv)
    tl.store(out_ptr + grow[:, None, None] * D + col[None, :, :], q, mask=mask)

    smask = rmask[:, None] & (gidx < G)[None, :]
    sbase = e_cur.to(tl.int64) * s_e + rows.to(tl.int64) * s_r  # [BM]
    if UE8M0:
        sb = s_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        boff = (sbase[:, None] + (gidx // 4)[None, :].to(tl.int64) * s_g) * 4 + (gidx % 4)[None, :]
        if FAST:
            _store_b8(sb + boff, expo, smask)
        else:
            tl.store(sb + boff, expo.to(tl.uint8), mask=smask)
        if G % 4 != 0:
            # Zero the pad bytes of the partial last word (done by the last column chunk).
            j = tl.arange(0, 4)
            poff = (sbase[:, None] + (GP - 1) * s_g) * 4 + j[None, :]
            pmask = rmask[:, None] & (j >= G % 4)[None, :] & (c == NC - 1)
            tl.store(sb + poff, tl.zeros([BM, 4], tl.uint8), mask=pmask)
    else:
        soff = sbase[:, None] + gidx[None, :].to(tl.int64) * s_g
        if FAST:
            _store_b32(s_ptr + soff, scale.to(tl.int32, bitcast=True), smask)
        else:
            tl.store(s_ptr + soff, scale, mask=smask)


@triton.jit
def _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts, num_rows, BM: tl.constexpr, NC: tl.constexpr):
    """The work item after ``(e_cur, rb, c)``: next column chunk, row block, or non-empty expert."""
    c += 1
    if c == NC:
        c = 0
        rb += 1
    while (rb >= tiles_cur) & (e_cur + 1 < num_experts):
        e_cur += 1
        rb = 0
        m_cur = tl.minimum(tl.maximum(tl.load(m_ptr + e_cur), 0), num_rows)
        tiles_cur = (m_cur + (BM - 1)) // BM
    return e_cur, rb, c, m_cur, tiles_cur


@triton.jit
def _chunk_tiles(m_ptr, eo, num_experts, num_rows, BM: tl.constexpr):
    """Row-block tiles of the experts ``eo`` (one chunk of the prologue's masked_m scan)."""
    m = tl.load(m_ptr + eo, mask=eo < num_experts, other=0)
    m = tl.minimum(tl.maximum(m, 0), num_rows)
    return tl.sum((m + (BM - 1)) // BM, axis=0)


@triton.jit
def _chunk_locate(m_ptr, eo, num_experts, num_rows, t0, e_cur, before, acc, BM: tl.constexpr):
    """One chunk of the search for tile ``t0``: experts ending at or before it, their tiles, tiles so far."""
    m = tl.load(m_ptr + eo, mask=eo < num_experts, other=0)
    m = tl.minimum(tl.maximum(m, 0), num_rows)
    tiles = (m + (BM - 1)) // BM
    sel = ((tl.cumsum(tiles, axis=0) + acc) <= t0) & (eo < num_experts)
    e_cur += tl.sum(sel.to(tl.int32), axis=0)
    before += tl.sum(tl.where(sel, tiles, 0), axis=0)
    acc += tl.sum(tiles, axis=0)
    return e_cur, before, acc


@triton.jit(do_not_specialize=["num_experts", "num_rows", "s_e", "s_r", "s_g", "limit"])
def _silu_mul_quant_kernel(
    x_ptr,  # bf16 [E, N, 2D], contiguous
    m_ptr,  # int32 [E]
    out_ptr,  # fp8 e4m3 [E, N, D], contiguous
    s_ptr,  # fp32 scales, or int32 packed UE8M0 words
    num_experts,
    num_rows,  # N (not specialised: varies with the token count)
    s_e,  # scale strides in elements of the scale tensor (expert, row, group or packed group)
    s_r,
    s_g,
    limit,  # swiglu_limit already rounded to bf16 (read only when HAS_LIMIT)
    D: tl.constexpr,
    GS: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    BM: tl.constexpr,
    BC: tl.constexpr,
    NC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    ONE_CHUNK: tl.constexpr,  # num_experts <= BLOCK_E: masked_m is read once
    HAS_LIMIT: tl.constexpr,
    SWIZZLE: tl.constexpr,
    UE8M0: tl.constexpr,
    EVEN_D: tl.constexpr,
    PREFETCH: tl.constexpr,
    FAST: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e_offs = tl.arange(0, BLOCK_E)

    # Prologue: count the row-block tiles of the real rows, take an equal share of the work items,
    # find the expert and row block of the first one.
    if ONE_CHUNK:
        valid = e_offs < num_experts
        m = tl.minimum(tl.maximum(tl.load(m_ptr + e_offs, mask=valid, other=0), 0), num_rows)
        tiles = (m + (BM - 1)) // BM
        n_items = tl.sum(tiles, axis=0).to(tl.int64) * NC
        start = pid.to(tl.int64) * n_items // nprog
        end = (pid + 1).to(tl.int64) * n_items // nprog
        t0 = (start // NC).to(tl.int32)
        c = (start % NC).to(tl.int32)
        e_cur = 0
        before = 0
        if start < end:  # programs without work (decode sizes) skip the scan
            cum = tl.cumsum(tiles, axis=0)
            # One reduction gives both the expert index (count of experts ending at or before t0, in
            # the high word) and the tiles before it (low word).
            packed = tl.sum(tl.where((cum <= t0) & valid, tiles.to(tl.int64) + (1 << 32), 0), axis=0)
            e_cur = (packed >> 32).to(tl.int32)
            before = (packed & 0xFFFFFFFF).to(tl.int32)
    else:
        total = 0
        if FAST:
            for e0 in range(0, num_experts, BLOCK_E):
                total += _chunk_tiles(m_ptr, e0 + e_offs, num_experts, num_rows, BM)
        else:  # Triton 3.6's interpreter cannot take a tensor bound in range() (see the item loop below)
            e0 = 0
            while e0 < num_experts:
                total += _chunk_tiles(m_ptr, e0 + e_offs, num_experts, num_rows, BM)
                e0 += BLOCK_E
        n_items = total.to(tl.int64) * NC
        start = pid.to(tl.int64) * n_items // nprog
        end = (pid + 1).to(tl.int64) * n_items // nprog
        t0 = (start // NC).to(tl.int32)
        c = (start % NC).to(tl.int32)
        e_cur = 0
        before = 0
        acc = 0
        if FAST:
            for e0 in range(0, num_experts, BLOCK_E):
                e_cur, before, acc = _chunk_locate(m_ptr, e0 + e_offs, num_experts, num_rows, t0, e_cur, before,
                                                   acc, BM)
        else:
            e0 = 0
            while e0 < num_experts:
                e_cur, before, acc = _chunk_locate(m_ptr, e0 + e_offs, num_experts, num_rows, t0, e_cur, before,
                                                   acc, BM)
                e0 += BLOCK_E
    rb = t0 - before
    m_cur = tl.load(m_ptr + e_cur, mask=(e_cur < num_experts) & (start < end), other=0)
    m_cur = tl.minimum(tl.maximum(m_cur, 0), num_rows)
    tiles_cur = (m_cur + (BM - 1)) // BM

    if USE_PDL:
        # Programmatic dependent launch: masked_m was read above, as SGLang's kernel does; the input
        # of the previous kernel (gateup) and our outputs are touched only after it has completed.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()

    if FAST:  # compiled for the GPU: one scf.for over this program's items
        if PREFETCH:
            # Software pipelining: the next item's loads are in flight while this one is computed.
            gate, up = _load_tile(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
            for it in range(start, end):
                e_n = e_cur
                rb_n = rb
                c_n = c
                m_n = 0
                tiles_n = tiles_cur
                if it + 1 < end:  # never walk past the last item (trailing empty experts cost a load each)
                    e_n, rb_n, c_n, m_n, tiles_n = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                            num_rows, BM, NC)
                gate_n, up_n = _load_tile(x_ptr, e_n, rb_n, c_n, m_n, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
                _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D, GS,
                             G, GP, BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, FAST)
                gate = gate_n
                up = up_n
                e_cur = e_n
                rb = rb_n
                c = c_n
                m_cur = m_n
                tiles_cur = tiles_n
        else:
            for it in range(start, end):
                gate, up = _load_tile(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
                _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D, GS,
                             G, GP, BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, FAST)
                if it + 1 < end:  # never walk past the last item (trailing empty experts cost a load each)
                    e_cur, rb, c, m_cur, tiles_cur = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                              num_rows, BM, NC)
    else:
        # Triton's CPU interpreter: the same walk as a while loop. Triton 3.6's interpreter converts a
        # tensor bound of ``range`` with ``int()`` on a shape-(1,) NumPy array, which NumPy 2.4+ rejects
        # ("only 0-dimensional arrays can be converted to Python scalars"); a comparison works in all.
        it = start
        if PREFETCH:
            gate, up = _load_tile(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
            while it < end:
                e_n = e_cur
                rb_n = rb
                c_n = c
                m_n = 0
                tiles_n = tiles_cur
                if it + 1 < end:
                    e_n, rb_n, c_n, m_n, tiles_n = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                            num_rows, BM, NC)
                gate_n, up_n = _load_tile(x_ptr, e_n, rb_n, c_n, m_n, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
                _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D,
                             GS, G, GP, BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, FAST)
                gate = gate_n
                up = up_n
                e_cur = e_n
                rb = rb_n
                c = c_n
                m_cur = m_n
                tiles_cur = tiles_n
                it += 1
        else:
            while it < end:
                gate, up = _load_tile(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D)
                _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D,
                             GS, G, GP, BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, FAST)
                if it + 1 < end:
                    e_cur, rb, c, m_cur, tiles_cur = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                              num_rows, BM, NC)
                it += 1


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


_MAX_BLOCK_E = 1024
_MIN_BLOCK_E = 16  # E = 1 ... 16 share one compiled kernel (the masked_m vector is padded, not the work)
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


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Multiprocessor count of a CUDA device (device properties only, cached)."""
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


#: (device index, compiled-kernel key) -> (registers per thread, shared bytes, resident programs per SM)
_OCCUPANCY: dict[tuple, tuple[int, int, int]] = {}
_OCCUPANCY_LOCK = threading.Lock()


def occupancy_records() -> dict[tuple, tuple[int, int, int]]:
    """What :func:`launch` learnt about each compiled kernel: registers, shared memory, resident
    programs per SM (a copy; for benchmarks and ``doctor``-style reports)."""
    with _OCCUPANCY_LOCK:
        return dict(_OCCUPANCY)


@functools.lru_cache(maxsize=1)
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def resident_programs_per_sm(compiled, num_warps: int, device_index: int) -> int:
    """How many programs of ``compiled`` (a Triton ``CompiledKernel``) one SM holds at once: the CUDA
    occupancy calculator on the kernel's function handle, or, if the driver call is unavailable, the
    same bound from its registers and shared memory and the device's limits."""
    threads = num_warps * 32
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    lib = _libcuda()
    if lib is not None:
        blocks = ctypes.c_int(0)
        status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(int(compiled.function)), ctypes.c_int(threads), ctypes.c_size_t(shared))
        if status == 0 and blocks.value > 0:
            return int(blocks.value)
    props = torch.cuda.get_device_properties(device_index)
    regs_per_warp = -(-max(int(compiled.n_regs), 1) * 32 // 256) * 256
    by_regs = int(getattr(props, "regs_per_multiprocessor", 65536)) // regs_per_warp // num_warps
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // threads
    smem = int(getattr(props, "shared_memory_per_multiprocessor", 233472))
    by_shared = smem // (shared + 1024) if shared else by_threads
    return max(1, min(by_regs, by_threads, by_shared, 32))


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch derives from the sizes and flags alone: the arguments after the four pointers
    (``runtime``), the constexprs and launch options (``kwargs``, as ``kernel[grid](**kwargs)`` takes
    them) and the grid."""

    runtime: tuple
    kwargs: tuple[tuple[str, Any], ...]
    grid: tuple[int]
    use_pdl: bool

    @property
    def kwargs_dict(self) -> dict[str, Any]:
        return dict(self.kwargs)


def _dtype(arg: Any) -> torch.dtype:
    return arg if isinstance(arg, torch.dtype) else arg.dtype


def plan_launch(
    num_experts: int,
    num_rows: int,
    hidden: int,
    *,
    group_size: int,
    scale_strides: tuple[int, int, int],
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
    device_index: int | None,
    pointers: tuple[Any, Any, Any, Any],
) -> LaunchPlan | None:
    """The launch for these sizes (``None``: nothing to launch). ``device_index`` None means Triton's
    CPU interpreter. ``pointers``: the four tensors, or their dtypes (for the occupancy lookup, which
    compiles the kernel once per specialisation)."""
    if num_experts == 0 or num_rows == 0 or hidden == 0:
        return None
    if config is None:
        config = choose_config(num_experts, num_rows, hidden, group_size)
    groups = hidden // group_size
    block_c = config.block_c
    num_chunks = -(-hidden // block_c)
    max_items = num_experts * (-(-num_rows // config.block_m)) * num_chunks
    on_gpu = device_index is not None
    use_pdl = on_gpu and bool(pdl) and pdl_supported(device_index)
    block_e = min(max(next_pow2(num_experts), _MIN_BLOCK_E), _MAX_BLOCK_E)
    s_e, s_r, s_g = (int(s) for s in scale_strides)
    runtime = (num_experts, num_rows, s_e, s_r, s_g, float(swiglu_limit) if swiglu_limit is not None else 0.0)
    kwargs = dict(
        D=hidden, GS=group_size, G=groups, GP=(groups + 3) // 4, BM=config.block_m, BC=block_c, NC=num_chunks,
        BLOCK_E=block_e, ONE_CHUNK=num_experts <= block_e, HAS_LIMIT=swiglu_limit is not None,
        SWIZZLE=bool(swizzle), UE8M0=bool(ue8m0), EVEN_D=hidden % block_c == 0, PREFETCH=bool(config.prefetch),
        FAST=on_gpu, USE_PDL=use_pdl, num_warps=config.num_warps, num_stages=1,
    )
    if use_pdl:
        kwargs["launch_pdl"] = True
    if config.max_registers is not None:
        kwargs["maxnreg"] = int(config.max_registers)
    if on_gpu:
        per_sm = min(config.ctas_per_sm, _resident(device_index, tuple(pointers) + runtime, kwargs, config.num_warps))
        programs = sm_count(device_index) * per_sm * max(1, config.waves)
    else:
        programs = 3
    return LaunchPlan(runtime, tuple(kwargs.items()), (max(1, min(max_items, programs)),), use_pdl)


def launch(
    gateup: torch.Tensor,
    masked_m: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor,
    *,
    group_size: int,
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
) -> None:
    """Launch the kernel through Triton's JIT dispatch on already validated tensors; ``scale`` may be
    any strided layout. Every shape-dependent decision is made again on each call: the hooked path
    uses :func:`prepare_launch` instead.

    ``swiglu_limit`` must already be rounded to bf16. Reads no tensor data on the host. ``pdl``
    launches with programmatic dependent launch where the device and Triton support it (the kernel
    reads ``masked_m`` before waiting for the previous kernel, as SGLang's kernel does).
    """
    num_experts, num_rows, two_d = gateup.shape
    index = None
    if gateup.device.type == "cuda":
        index = gateup.device.index if gateup.device.index is not None else torch.cuda.current_device()
    plan = plan_launch(num_experts, num_rows, two_d // 2, group_size=group_size, scale_strides=scale.stride(),
                       swiglu_limit=swiglu_limit, swizzle=swizzle, ue8m0=ue8m0, config=config, pdl=pdl,
                       device_index=index, pointers=(gateup, masked_m, out, scale))
    if plan is not None:
        _silu_mul_quant_kernel[plan.grid](gateup, masked_m, out, scale, *plan.runtime, **plan.kwargs_dict)


def pointer_dtypes(ue8m0: bool) -> tuple[torch.dtype, torch.dtype, torch.dtype, torch.dtype]:
    """The dtypes of ``gateup``, ``masked_m``, ``out`` and ``scale``: :func:`prepare_launch` compiles
    the kernel for them as 16-byte-aligned pointers (``warmup`` wraps each in a ``MockTensor``), the
    specialisation Triton's JIT dispatch computes for aligned tensors of these dtypes."""
    return torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.int32 if ue8m0 else torch.float32


def _nothing(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
    return None


_LOW_LEVEL_FAILED: set[str] = set()


def prepare_launch(
    num_experts: int,
    num_rows: int,
    hidden: int,
    *,
    group_size: int,
    scale_strides: tuple[int, int, int],
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
    device_index: int | None,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]:
    """A launcher ``(gateup, masked_m, out, scale) -> None`` with everything that depends on the sizes
    decided now: launch configuration, constexprs, grid (occupancy looked up once), PDL, and the
    scale strides ``scale_strides`` (the layout's; the tensors passed later must have them).

    On a CUDA device (``device_index``) the kernel is compiled now and each call goes straight to the
    compiled kernel's launcher (:class:`~._triton_launch.LowLevelLaunch`); a call whose pointers are
    not 16-byte aligned or whose tensors are on another device takes the JIT path, as does every
    call when this Triton lacks the low-level entry point (decided here, once). ``device_index``
    None: Triton's CPU interpreter, through the JIT path.
    """
    dtypes = pointer_dtypes(ue8m0)
    plan = plan_launch(num_experts, num_rows, hidden, group_size=group_size, scale_strides=scale_strides,
                       swiglu_limit=swiglu_limit, swizzle=swizzle, ue8m0=ue8m0, config=config, pdl=pdl,
                       device_index=device_index, pointers=dtypes)
    if plan is None:
        return _nothing
    grid, runtime, kwargs = plan.grid, plan.runtime, plan.kwargs_dict

    def jit(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        _silu_mul_quant_kernel[grid](gateup, masked_m, out, scale, *runtime, **kwargs)

    if device_index is None:
        logger.debug("triton silu_mul_quant: prepared E=%d N=%d D=%d, grid %s, Triton's interpreter (JIT path)",
                     num_experts, num_rows, hidden, grid)
        return jit
    try:
        compiled = compile_specialisation(_silu_mul_quant_kernel, dtypes + runtime, kwargs, device_index)
        tail = ordered_arguments(_silu_mul_quant_kernel.arg_names, (0, 0, 0, 0) + runtime, kwargs)[4:]
        low = LowLevelLaunch(compiled, (grid[0], 1, 1), tail, device_index)
    except Exception as exc:  # noqa: BLE001 - another Triton: the JIT path still launches the same kernel
        reason = f"{type(exc).__name__}: {exc}"
        if reason not in _LOW_LEVEL_FAILED:
            _LOW_LEVEL_FAILED.add(reason)
            logger.warning("triton silu_mul_quant: launching through Triton's JIT dispatch (%s)", reason)
        return jit

    def prepared(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        px, pm, po, ps = gateup.data_ptr(), masked_m.data_ptr(), out.data_ptr(), scale.data_ptr()
        if (px | pm | po | ps) & 15 or gateup.get_device() != device_index:
            jit(gateup, masked_m, out, scale)
        else:
            low(px, pm, po, ps)

    prepared.low_level = low  # type: ignore[attr-defined]  # for tests and benchmarks
    logger.debug("triton silu_mul_quant: prepared E=%d N=%d D=%d on cuda:%d, grid %s, PDL %s, low-level launch",
                 num_experts, num_rows, hidden, device_index, grid, plan.use_pdl)
    return prepared


def _resident(index: int, args: tuple, constexprs: dict, num_warps: int) -> int:
    """Resident programs per SM of the kernel these arguments compile to (cached per specialisation:
    the first call compiles it through ``warmup`` without launching; pointers may be given as dtypes).
    A per-SM count above this splits the grid into a full wave and a partial one that runs at low
    occupancy (Kimi-K2 EP8 prefill: 16 launched, 12 resident, 51 us instead of 45)."""
    # plan_launch builds constexprs in one fixed order, so its items identify the specialisation as they are
    key = (index, *(_dtype(a) for a in args[:4]), tuple(constexprs.items()))
    with _OCCUPANCY_LOCK:
        hit = _OCCUPANCY.get(key)
    if hit is not None:
        return hit[2]
    try:
        compiled = compile_specialisation(_silu_mul_quant_kernel, args, constexprs, index)
        record = (int(compiled.n_regs), int(getattr(compiled.metadata, "shared", 0) or 0),
                  resident_programs_per_sm(compiled, num_warps, index))
    except Exception as exc:  # noqa: BLE001 - a Triton without warmup/n_regs: keep the configured grid
        logger.debug("triton silu_mul_quant: occupancy unknown (%s); using the configured grid", exc)
        record = (0, 0, 1 << 30)
    with _OCCUPANCY_LOCK:
        _OCCUPANCY[key] = record
    logger.debug("triton silu_mul_quant: %s registers, %s B shared, %s resident programs per SM for %s",
                 record[0], record[1], record[2], key[-1])
    return record[2]
