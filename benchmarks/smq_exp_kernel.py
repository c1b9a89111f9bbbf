"""An experimental variant of the ``triton`` silu_mul_quant kernel (benchmarks only; never used by the plugin).

It reuses the production kernel's per-item code (``_load_tile``, ``_quant_store``, ``_advance``) and differs in
how work items reach programs, with four switches, all off in ``exp_default`` (which must time as the
production kernel does):

- ``PACK_FIRST``: where a call has fewer items than programs, program ``p`` takes item ``p`` (the first
  programs, which the GPU starts first), instead of items spread over the grid.
- ``ACTIVE``: the grid is sized for the shape key's row bound, and each program derives from ``masked_m`` how
  many whole waves of programs this call needs (``round(items / act_div)``, at least ``act_min``); programs
  beyond them leave at once. A per-call grid decided on the device, with no host sync.
- ``DYNAMIC`` (chunk of items, 0 = off): one wave of resident programs takes chunks of items from an atomic
  counter (``ctr_ptr``, two int32 words, zero before the launch); the last program to finish sets both words
  back to zero, so the next launch finds them zero. The next chunk is claimed while the current chunk's
  first loads are in flight.
- ``EVICT``: gate/up loads with ``evict_first``.

GPU only (inline PTX), and ``E <= BLOCK_E`` (one masked_m chunk), which every benchmark shape satisfies.
``_load_tile_ev`` repeats the production ``_load_tile``'s index arithmetic with an eviction policy added, so
that the production kernel's code stays as it is measured.
"""

from __future__ import annotations

import triton
import triton.language as tl

from sglang_moe_plugins.plugins.triton_smq.kernel import _advance, _quant_store

__all__ = ["smq_exp_kernel"]


@triton.jit
def _load_tile_ev(x_ptr, e_cur, rb, c, m_cur, num_rows, D: tl.constexpr, GS: tl.constexpr, BM: tl.constexpr,
                  BC: tl.constexpr, SWIZZLE: tl.constexpr, EVEN_D: tl.constexpr, EVICT: tl.constexpr):
    NGC: tl.constexpr = BC // GS
    rows = rb * BM + tl.arange(0, BM)
    grow = e_cur.to(tl.int64) * num_rows + rows
    col = (c * NGC + tl.arange(0, NGC))[:, None] * GS + tl.arange(0, GS)[None, :]
    if SWIZZLE:
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
    if EVICT:
        gate = tl.load(xrow + gcol[None, :, :], mask=mask, other=0.0, eviction_policy="evict_first")
        up = tl.load(xrow + ucol[None, :, :], mask=mask, other=0.0, eviction_policy="evict_first")
    else:
        gate = tl.load(xrow + gcol[None, :, :], mask=mask, other=0.0)
        up = tl.load(xrow + ucol[None, :, :], mask=mask, other=0.0)
    return gate, up


@triton.jit(do_not_specialize=["num_experts", "num_rows", "s_e", "s_r", "s_g", "limit", "act_div", "act_min", "wave"])
def _smq_exp_kernel(
    x_ptr, m_ptr, out_ptr, s_ptr, ctr_ptr,
    num_experts, num_rows, s_e, s_r, s_g, limit, act_div, act_min, wave,
    D: tl.constexpr, GS: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr,
    NC: tl.constexpr, BLOCK_E: tl.constexpr, HAS_LIMIT: tl.constexpr, SWIZZLE: tl.constexpr, UE8M0: tl.constexpr,
    EVEN_D: tl.constexpr, USE_PDL: tl.constexpr, IDLE_EXIT: tl.constexpr, FRONT_LOAD: tl.constexpr,
    PACK_FIRST: tl.constexpr, ACTIVE: tl.constexpr, DYNAMIC: tl.constexpr, EVICT: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    e_offs = tl.arange(0, BLOCK_E)
    valid = e_offs < num_experts
    m = tl.minimum(tl.maximum(tl.load(m_ptr + e_offs, mask=valid, other=0), 0), num_rows)
    tiles = (m + (BM - 1)) // BM
    n_items = tl.sum(tiles, axis=0).to(tl.int64) * NC
    if DYNAMIC > 0:
        cum = tl.cumsum(tiles, axis=0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        s = tl.atomic_add(ctr_ptr, DYNAMIC).to(tl.int64)
        while s < n_items:
            end = tl.minimum(s + DYNAMIC, n_items)
            t0 = (s // NC).to(tl.int32)
            c = (s % NC).to(tl.int32)
            packed = tl.sum(tl.where((cum <= t0) & valid, tiles.to(tl.int64) + (1 << 32), 0), axis=0)
            e_cur = (packed >> 32).to(tl.int32)
            rb = t0 - (packed & 0xFFFFFFFF).to(tl.int32)
            m_cur = tl.minimum(tl.maximum(tl.load(m_ptr + e_cur), 0), num_rows)
            tiles_cur = (m_cur + (BM - 1)) // BM
            gate, up = _load_tile_ev(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D, EVICT)
            s_next = tl.atomic_add(ctr_ptr, DYNAMIC).to(tl.int64)
            _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D, GS, G, GP,
                         BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, True)
            it = s + 1
            while it < end:
                e_cur, rb, c, m_cur, tiles_cur = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                          num_rows, BM, NC)
                gate, up = _load_tile_ev(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D,
                                         EVICT)
                _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D, GS, G,
                             GP, BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, True)
                it += 1
            s = s_next
        done = tl.atomic_add(ctr_ptr + 1, 1)
        if done == nprog - 1:  # every other program has made its last claim: reset for the next launch
            tl.atomic_xchg(ctr_ptr, 0)
            tl.atomic_xchg(ctr_ptr + 1, 0)
    else:
        p = pid.to(tl.int64)
        nact = nprog.to(tl.int64)
        if ACTIVE:
            waves_all = nact // wave
            w = (n_items + act_div // 2) // act_div
            w = tl.minimum(tl.maximum(w, act_min), waves_all)
            nact = w * wave
        start = p * n_items // nact
        end = (p + 1) * n_items // nact
        if FRONT_LOAD:
            if n_items >= nact:
                q, r = n_items // nact, n_items % nact
                start = p * q + tl.minimum(p, r)
                end = start + q + (p < r).to(tl.int64)
        if PACK_FIRST:
            if n_items < nact:
                start = tl.minimum(p, n_items)
                end = tl.minimum(p + 1, n_items)
        if p >= nact:
            start = n_items
            end = n_items
        t0 = (start // NC).to(tl.int32)
        c = (start % NC).to(tl.int32)
        e_cur = 0
        before = 0
        if start < end:
            cum = tl.cumsum(tiles, axis=0)
            packed = tl.sum(tl.where((cum <= t0) & valid, tiles.to(tl.int64) + (1 << 32), 0), axis=0)
            e_cur = (packed >> 32).to(tl.int32)
            before = (packed & 0xFFFFFFFF).to(tl.int32)
        rb = t0 - before
        m_cur = tl.load(m_ptr + e_cur, mask=(e_cur < num_experts) & (start < end), other=0)
        m_cur = tl.minimum(tl.maximum(m_cur, 0), num_rows)
        tiles_cur = (m_cur + (BM - 1)) // BM
        if USE_PDL:
            if IDLE_EXIT:
                if (start < end) | (pid == 0):
                    tl.extra.cuda.gdc_wait()
            else:
                tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        for it in range(start, end):
            gate, up = _load_tile_ev(x_ptr, e_cur, rb, c, m_cur, num_rows, D, GS, BM, BC, SWIZZLE, EVEN_D, EVICT)
            _quant_store(gate, up, out_ptr, s_ptr, e_cur, rb, c, m_cur, num_rows, s_e, s_r, s_g, limit, D, GS, G, GP,
                         BM, BC, NC, HAS_LIMIT, UE8M0, EVEN_D, True)
            if it + 1 < end:
                e_cur, rb, c, m_cur, tiles_cur = _advance(m_ptr, e_cur, rb, c, m_cur, tiles_cur, num_experts,
                                                          num_rows, BM, NC)


smq_exp_kernel = _smq_exp_kernel
