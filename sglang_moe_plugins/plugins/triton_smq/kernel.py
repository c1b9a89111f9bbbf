"""The Triton kernel for ``silu_mul_quant`` (masked SwiGLU + per-token-group FP8 quantization): the
``@triton.jit`` code only. The launch configuration is in :mod:`.tuning`, the grid, the constexprs and
the launchers in :mod:`.launch`.

This module imports Triton at its top level; the ``triton`` plugin imports :mod:`.launch` (which
imports it) on its first ``prepare`` or ``run``, never at package import. It defines the
``@triton.jit`` functions only; compilation happens on the first launch (or ``warmup``).

Design (see ``docs/triton-kernel.md`` for the measurements behind it):

- Persistent grid sized to the device in whole waves: ``ctas_per_sm`` programs per SM, capped at
  the number the compiled kernel keeps resident per SM (so no wave is split), times ``waves``, and at
  ``max_programs`` (at decode sizes: an upper bound of the work items the shape key's row bound allows;
  at E <= 64 prefill sizes the number of waves follows that bound); independent of the data.
- Work items are ``(expert, block of BM real rows, chunk of BC columns)``. Every program reads
  ``masked_m`` itself (no host sync, no second launch), counts the items of the real rows only,
  takes one contiguous range of items (equal counts per program, so routing skew does not matter;
  with ``FRONT_LOAD`` and at least as many items as programs, the longer ranges on the first programs)
  and, when it has work, locates its first item with one vectorised prefix sum; it then walks its
  range in order, stepping to the next non-empty expert with one scalar read when a block of rows
  is done (never past its last item).
- Programmatic dependent launch on sm90+: ``masked_m`` is read before ``griddepcontrol.wait``,
  ``gateup`` and the outputs after it (SGLang's kernel makes the same assumption). ``IDLE_EXIT``:
  programs without items skip the wait (program 0 always waits, so the grid never completes before
  the previous kernel); ``EARLY_TRIGGER``: ``launch_dependents`` at program start instead of after
  the wait (off by default: slower at decode).
- A tile is loaded as ``[BM, BC // GS, GS]`` so that the per-group absmax is a reduction over the
  last axis. Gate and up are read with 16-byte loads in both the natural and the gran-8 swizzled
  layouts. Scales are written through explicit strides (row-major, column-major), or for UE8M0 as
  single bytes into the packed int32 words (group ``4k+j`` in byte ``j``), pad bytes zeroed; on the
  GPU with predicated inline-PTX stores that keep the reduction's register layout (no shared memory).
- Integer arguments that vary with the token count (``N`` and the scale strides) are not
  specialised and the compiled configuration depends on E, D, the group size and the regime (two at
  most per shape family; see :mod:`.tuning`) only: one compiled kernel per regime serves every token
  count and every ``masked_m``.

Numerics follow the ``reference`` plugin: clamp (limit pre-rounded to bf16) on bf16 values, SiLU
and product in fp32 (``ex2.approx`` and ``rcp.approx``, as SGLang's kernel; plain ``tl.exp`` and
division under Triton's CPU interpreter), absmax floored at 1e-10,
``scale = absmax / 448`` (IEEE division), rounded up to a power of two for UE8M0, values
multiplied by ``1 / scale`` and converted with round-to-nearest-even and saturation.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["silu_mul_quant_kernel"]


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
def _share(pid, nprog, n_items, FRONT_LOAD: tl.constexpr):
    """This program's contiguous range ``[start, end)`` of the ``n_items`` items: equal counts, one more for
    some, spread over the grid; with ``FRONT_LOAD`` and at least as many items as programs, the longer
    ranges go to the first programs, which the GPU starts first."""
    p = pid.to(tl.int64)
    start = p * n_items // nprog
    end = (p + 1) * n_items // nprog
    if FRONT_LOAD:
        if n_items >= nprog:
            q, r = n_items // nprog, n_items % nprog
            start = p * q + tl.minimum(p, r)
            end = start + q + (p < r).to(tl.int64)
    return start, end


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
    EARLY_TRIGGER: tl.constexpr,  # let the next kernel launch at once (it still waits for our completion)
    IDLE_EXIT: tl.constexpr,  # a program without work items leaves before waiting for the previous kernel
    FRONT_LOAD: tl.constexpr,  # with items >= programs, the first programs take the longer shares (_share)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e_offs = tl.arange(0, BLOCK_E)
    if USE_PDL:
        if EARLY_TRIGGER:
            # griddepcontrol.launch_dependents only lets the next kernel start its own prologue: its
            # griddepcontrol.wait still returns after this whole grid has completed and its writes are visible.
            tl.extra.cuda.gdc_launch_dependents()

    # Prologue: count the row-block tiles of the real rows, take an equal share of the work items,
    # find the expert and row block of the first one.
    if ONE_CHUNK:
        valid = e_offs < num_experts
        m = tl.minimum(tl.maximum(tl.load(m_ptr + e_offs, mask=valid, other=0), 0), num_rows)
        tiles = (m + (BM - 1)) // BM
        n_items = tl.sum(tiles, axis=0).to(tl.int64) * NC
        start, end = _share(pid, nprog, n_items, FRONT_LOAD)
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
        start, end = _share(pid, nprog, n_items, FRONT_LOAD)
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
        # A program without items touches neither, so with IDLE_EXIT it does not wait, except program 0:
        # this grid must not complete before the previous kernel (the next kernel's wait orders it
        # after ours only), also when no program has items (every masked_m 0).
        if IDLE_EXIT:
            if (start < end) | (pid == 0):
                tl.extra.cuda.gdc_wait()
        else:
            tl.extra.cuda.gdc_wait()
        if not EARLY_TRIGGER:
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


#: The kernel, under its public name. The ``@triton.jit`` function keeps its own name: it is the
#: compiled kernel's symbol and part of Triton's cache key.
silu_mul_quant_kernel = _silu_mul_quant_kernel
