"""The Triton kernel for ``silu_mul_quant_contig`` (SwiGLU + per-token-group FP8 quantization over
contiguous rows): the ``@triton.jit`` code only. The launch configuration and the prepared launch are in
:mod:`.triton_launch`.

This module imports Triton at its top level; the ``contig_triton`` plugin imports :mod:`.triton_launch`
(which imports it) on its first ``prepare`` or ``run``, never at package import.

Design: a tile is ``BM`` rows by ``BC`` columns, loaded as ``[BM, BC // GS, GS]`` so that the per-group
absmax is a reduction over the last axis; tile ``t`` is row block ``t // NC``, column chunk ``t % NC``
(consecutive programs read consecutive bytes). The grid is ``min(tiles, cap)`` programs, each walking
tiles ``pid, pid + grid, ...`` (``cap`` whole waves of the resident programs, decided once per shape key;
the row count ``M`` is a runtime argument, not specialised, so one compiled kernel serves every M).
Rows ``>= M`` are masked off: the kernel never reads or writes past row ``M``. Gate and up are read with
16-byte loads in the natural and the gran-8 swizzled layouts. Scales are written through explicit
strides (fp32 row-major ``[M, G]``; UE8M0 as single bytes into the packed int32 words ``[M, ceil(G/4)]``
of strides ``(1, Ma)``, group ``4k+j`` in byte ``j``, pad bytes of a partial last word zeroed), on the
GPU with predicated inline-PTX stores that keep the reduction's register layout (no shared memory).
Programmatic dependent launch (sm90+): ``gdc_wait`` before the first load of ``gateup``.

Numerics (the op's, see :mod:`sglang_moe_plugins.ops.silu_mul_quant_contig`): the limit (pre-rounded to
bf16) clamps gate to ``<= L`` and up to ``[-L, L]`` (fp32 clamping of bf16 values by a bf16 bound is the
bf16 clamp; NaN stays NaN); SiLU and product in fp32. ``FAST_EXP`` off (the plugin's ``fast_exp=False``): ``e^-g`` by
libdevice's ``expf`` (CUDA's correctly rounded-to-within-an-ulp ``expf``, the function torch's CUDA
``exp`` calls) and the IEEE division ``g / (1 + e)``, then ``* up``: the reference's operations in its
order, so the bytes equal the reference's wherever the two ``expf`` agree (measured: all of them). ``FAST_EXP``
on (the plugin's default): ``ex2.approx(g * -log2 e)`` and ``rcp.approx`` as SGLang's kernel (``__expf``, fast
division): about 40% fewer instructions, at copy speed. Absmax
per group (NaN left out, +-Inf counted as FLT_MAX) floored at 1e-10; ``scale = absmax / 448`` (IEEE
division), UE8M0 rounded up to a power of two by bit arithmetic; ``q = sat(v * (1 / scale))`` by
``cvt.rn.satfinite`` (NaN stays NaN). Under Triton's CPU interpreter (``ON_GPU`` off) plain ``tl.exp``,
``tl.div_rn`` and ``tl.store`` replace libdevice and the inline PTX.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["silu_mul_quant_contig_kernel"]


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
    # A predicated 4-byte store in the value's own layout (tl.store would convert the per-group scales to a
    # store layout through shared memory). Threads holding the same group store the same value.
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptrs.to(tl.int64), value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _store_b8(ptrs, value, mask):
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b8 [$1], $2; mov.b32 $0, 0; }",
        "=r,l,r,r", [ptrs.to(tl.int64), value, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _tile(x_ptr, out_ptr, s_ptr, t, M, s_r, s_g, limit, D: tl.constexpr, GS: tl.constexpr, G: tl.constexpr,
          GP: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr, NC: tl.constexpr, HAS_LIMIT: tl.constexpr,
          SWIZZLE: tl.constexpr, UE8M0: tl.constexpr, EVEN_D: tl.constexpr, FAST_EXP: tl.constexpr,
          ON_GPU: tl.constexpr):
    """Load, compute and store tile ``t``."""
    NGC: tl.constexpr = BC // GS
    rb = t // NC
    c = t % NC
    rows = rb * BM + tl.arange(0, BM)
    rmask = rows < M
    rows64 = rows.to(tl.int64)
    gidx = c * NGC + tl.arange(0, NGC)
    col = gidx[:, None] * GS + tl.arange(0, GS)[None, :]
    if SWIZZLE:  # gran-8 interleave: every 16 input columns are gate[8] up[8]
        gcol = (col // 8) * 16 + (col % 8)
        ucol = gcol + 8
    else:
        gcol = col
        ucol = col + D
    if EVEN_D:
        mask = rmask[:, None, None]
    else:
        mask = rmask[:, None, None] & (col < D)[None, :, :]
    xrow = x_ptr + rows64[:, None, None] * (2 * D)
    g = tl.load(xrow + gcol[None, :, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(xrow + ucol[None, :, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_LIMIT:  # the limit is a bf16 value, so clamping in fp32 equals clamping in bf16
        g = tl.minimum(g, limit, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as torch.clamp
        u = tl.minimum(tl.maximum(u, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                       propagate_nan=tl.PropagateNan.ALL)
    if FAST_EXP and ON_GPU:  # as SGLang's kernel (__expf, fast division): one MUFU.EX2 and one MUFU.RCP
        v = g * _rcp_approx(1.0 + _exp2_approx(g * -1.4426950408889634)) * u
    elif ON_GPU:  # the reference's operations: expf, IEEE division, product
        v = tl.div_rn(g, 1.0 + tl.extra.cuda.libdevice.exp(-g)) * u
    else:  # Triton's CPU interpreter: no libdevice, no inline PTX
        v = tl.div_rn(g, 1.0 + tl.exp(-g)) * u
    # Non-finite policy of the op: NaN is left out of the absmax (max.f32 drops NaN operands) and quantizes
    # to NaN; +-Inf (and fp32 overflow) counts as FLT_MAX and saturates to +-448 below.
    amax = tl.max(tl.abs(v), axis=2)  # [BM, NGC]; NaN only for a group of NaN only
    if not ON_GPU:  # the interpreter evaluates the NaN-dropping maximum below with np.maximum
        amax = tl.where(amax == amax, amax, 0.0)
    amax = tl.minimum(tl.maximum(amax, 1e-10), 3.4028234663852886e38)
    scale = tl.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        bits = scale.to(tl.int32, bitcast=True)
        expo = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        scale = (expo << 23).to(tl.float32, bitcast=True)
    inv = tl.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
    q = (v * inv[:, :, None]).to(tl.float8e4nv)  # cvt.rn.satfinite: saturates to +-448, keeps NaN
    tl.store(out_ptr + rows64[:, None, None] * D + col[None, :, :], q, mask=mask)

    smask = rmask[:, None] & (gidx < G)[None, :]
    sbase = rows64 * s_r  # [BM]
    if UE8M0:
        sb = s_ptr.to(tl.pointer_type(tl.uint8), bitcast=True)
        boff = (sbase[:, None] + (gidx // 4)[None, :].to(tl.int64) * s_g) * 4 + (gidx % 4)[None, :]
        if ON_GPU:
            _store_b8(sb + boff, expo, smask)
        else:
            tl.store(sb + boff, expo.to(tl.uint8), mask=smask)
        if G % 4 != 0:  # zero the pad bytes of the partial last word (done by the last column chunk)
            j = tl.arange(0, 4)
            poff = (sbase[:, None] + (GP - 1) * s_g) * 4 + j[None, :]
            pmask = rmask[:, None] & (j >= G % 4)[None, :] & (c == NC - 1)
            tl.store(sb + poff, tl.zeros([BM, 4], tl.uint8), mask=pmask)
    else:
        soff = sbase[:, None] + gidx[None, :].to(tl.int64) * s_g
        if ON_GPU:
            _store_b32(s_ptr + soff, scale.to(tl.int32, bitcast=True), smask)
        else:
            tl.store(s_ptr + soff, scale, mask=smask)


@triton.jit(do_not_specialize=["M", "s_r", "s_g", "limit"])
def _silu_mul_quant_contig_kernel(
    x_ptr,  # bf16 [M, 2D], contiguous
    out_ptr,  # fp8 e4m3 [M, D], contiguous
    s_ptr,  # fp32 scales, or int32 packed UE8M0 words
    M,  # rows of this call (not specialised)
    s_r,  # scale strides in elements of the scale tensor: row, group (or packed group)
    s_g,
    limit,  # swiglu_limit already rounded to bf16 (read only when HAS_LIMIT)
    D: tl.constexpr,
    GS: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    BM: tl.constexpr,
    BC: tl.constexpr,
    NC: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    SWIZZLE: tl.constexpr,
    UE8M0: tl.constexpr,
    EVEN_D: tl.constexpr,
    FAST_EXP: tl.constexpr,
    ON_GPU: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    n_tiles = tl.cdiv(M, BM) * NC
    if USE_PDL:
        # gateup is the previous kernel's output: touched only after it has completed.
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if ON_GPU:
        for t in range(pid, n_tiles, nprog):
            _tile(x_ptr, out_ptr, s_ptr, t, M, s_r, s_g, limit, D, GS, G, GP, BM, BC, NC, HAS_LIMIT, SWIZZLE,
                  UE8M0, EVEN_D, FAST_EXP, ON_GPU)
    else:
        # Triton 3.6's interpreter converts a tensor bound of ``range`` with ``int()`` on a shape-(1,) array,
        # which NumPy 2.4+ rejects; a while loop works everywhere.
        t = pid
        while t < n_tiles:
            _tile(x_ptr, out_ptr, s_ptr, t, M, s_r, s_g, limit, D, GS, G, GP, BM, BC, NC, HAS_LIMIT, SWIZZLE,
                  UE8M0, EVEN_D, FAST_EXP, ON_GPU)
            t += nprog


#: The kernel, under its public name (the ``@triton.jit`` function keeps its own: the compiled symbol).
silu_mul_quant_contig_kernel = _silu_mul_quant_contig_kernel
