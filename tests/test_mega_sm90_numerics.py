"""The SM90 kernel's GEMM accumulation model (ops/mega_moe/sm90.py) against a scalar model
written independently, and its effect on mega_reference (CPU)."""

from __future__ import annotations

import math

import pytest
import torch
from _mega_cases import make_problem

from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe.reference import mega_moe_reference
from sglang_moe_plugins.ops.mega_moe.sm90 import (
    Sm90Numerics,
    _aligned_step,
    sm90_block_gemm,
    sm90_block_m,
    sm90_numerics_for,
    truncate_significand,
)


def _trunc_scalar(v: float, fraction_bits: int) -> float:
    if v == 0.0:
        return 0.0
    m, e = math.frexp(v)
    scale = 2.0 ** (fraction_bits + 1)
    return math.ldexp(math.trunc(m * scale) / scale, e)


def _aligned_terms_scalar(terms: list[float], fraction_bits: int) -> float:
    """The ``terms`` step: each addend truncated toward zero to a multiple of 2**(top - fraction_bits),
    top = the largest addend's leading bit, then summed exactly."""
    biggest = max(abs(t) for t in terms)
    if biggest == 0.0:
        return 0.0
    top = math.frexp(biggest)[1] - 1  # 2**top <= biggest < 2**(top + 1)
    ulp = math.ldexp(1.0, top - fraction_bits)
    return math.fsum(math.trunc(t / ulp) * ulp for t in terms)


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def _scalar_gemm_entry(a, sa, b, sb, i, j, block_k, numerics, ratio) -> float:
    """One output entry, step by step, in Python floats rounded to fp32 where the kernel is fp32."""
    k = len(a[i])
    out, prev = 0.0, None
    for blk in range(k // block_k):
        s = _f32(_f32(sa[i][blk]) * _f32(sb[j][blk]))
        if numerics.accumulation == "promote":
            acc = 0.0
        elif ratio:
            acc = out if prev is None else _f32(out * _f32(prev * _f32(1.0 / s)))
        else:
            acc = out if blk == 0 else _f32(out * _f32(1.0 / s))
        for step in range(block_k // numerics.mma_k):
            lo = blk * block_k + step * numerics.mma_k
            if numerics.alignment == "terms":
                acc = _aligned_terms_scalar(
                    [acc] + [a[i][t] * b[j][t] for t in range(lo, lo + numerics.mma_k)], numerics.fraction_bits
                )
            else:
                acc = _trunc_scalar(
                    acc + math.fsum(a[i][t] * b[j][t] for t in range(lo, lo + numerics.mma_k)), numerics.fraction_bits
                )
        if numerics.accumulation == "promote":
            out = _f32(out + _f32(s * _f32(acc)))
        elif ratio:
            out = _f32(acc)
        else:
            out = _f32(_f32(acc) * s)
        prev = s
    if numerics.accumulation == "reuse" and ratio:
        out = _f32(out * prev)
    return out


def _fp8(shape, gen) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * 60).clamp(-448, 448).to(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("alignment", ["sum", "terms"])
@pytest.mark.parametrize("accumulation", ["promote", "reuse"])
@pytest.mark.parametrize("ratio", [False, True])
@pytest.mark.parametrize("block_k", [64, 128])
def test_block_gemm_matches_scalar_model(accumulation: str, ratio: bool, block_k: int, alignment: str) -> None:
    gen = torch.Generator().manual_seed(int(torch.randint(0, 1 << 30, ()).item()))
    m, n, k = 3, 4, 512
    a, b = _fp8((m, k), gen), _fp8((n, k), gen)
    sa = torch.rand(m, k // block_k, generator=gen) * 1e-2 + 1e-4
    sb = torch.rand(n, k // block_k, generator=gen) * 1e-3 + 1e-5
    numerics = Sm90Numerics(accumulation=accumulation, alignment=alignment)
    got = sm90_block_gemm(a, sa, b, sb, block_k=block_k, numerics=numerics, ratio_rescale=ratio)
    al, bl, sal, sbl = a.double().tolist(), b.double().tolist(), sa.tolist(), sb.tolist()
    for i in range(m):
        for j in range(n):
            want = _scalar_gemm_entry(al, sal, bl, sbl, i, j, block_k, numerics, ratio)
            assert got[i, j].item() == pytest.approx(want, rel=2e-6), (i, j)


def test_terms_alignment_drops_the_low_bits_of_small_products() -> None:
    """By hand: accumulator 1024 (leading bit 2**10), 13 bits -> grid 2**-3. ``terms``: each product
    0.0625 truncates to 0 on that grid, 1024 stays; ``sum``: 1024.125 has 14 significant bits, kept."""
    a = torch.tensor([[0.0625, 0.0625] + [0.0] * 30], dtype=torch.float64)
    b = torch.tensor([[1.0, 1.0] + [0.0] * 30], dtype=torch.float64)
    acc = torch.full((1, 1), 1024.0, dtype=torch.float64)
    assert _aligned_step(acc, a, b, 13).item() == 1024.0
    assert truncate_significand(acc + a @ b.T, 13).item() == 1024.125
    assert _aligned_step(-acc, a, -b, 13).item() == -1024.0  # toward zero on both signs
    small = torch.tensor([[1.0625, -0.0625] + [0.0] * 30], dtype=torch.float64)
    assert _aligned_step(torch.zeros(1, 1, dtype=torch.float64), small, b, 13).item() == 1.0  # exact on its own grid
    with pytest.raises(ValueError):
        Sm90Numerics(alignment="nearest")  # type: ignore[arg-type]


def test_truncation_is_toward_zero_and_keeps_the_bits() -> None:
    x = torch.tensor([1.0 + 2.0**-13 + 2.0**-14, -(1.0 + 2.0**-13 + 2.0**-14), 3.0, 0.0], dtype=torch.float64)
    out = truncate_significand(x, 13)
    assert out.tolist() == [1.0 + 2.0**-13, -(1.0 + 2.0**-13), 3.0, 0.0]


def test_reuse_shrinks_a_long_positive_sum() -> None:
    """Truncation toward zero over a long K loop loses magnitude; promotion per block loses less."""
    gen = torch.Generator().manual_seed(1)
    a = _fp8((4, 4096), gen).abs()
    b = _fp8((8, 4096), gen).abs()
    sa, sb = torch.full((4, 32), 1e-3), torch.full((8, 32), 1e-3)
    exact = sm90_block_gemm(a, sa, b, sb, block_k=128, numerics=Sm90Numerics(), ratio_rescale=False)
    reuse = sm90_block_gemm(a, sa, b, sb, block_k=128, numerics=Sm90Numerics("reuse"), ratio_rescale=False)
    promote = sm90_block_gemm(a, sa, b, sb, block_k=128, numerics=Sm90Numerics("promote"), ratio_rescale=False)
    assert (reuse < exact).all()
    loss_reuse = (1 - reuse / exact).mean().item()
    loss_promote = (1 - promote / exact).abs().mean().item()
    assert 1e-4 < loss_reuse < 1e-2 and loss_promote < loss_reuse / 4, (loss_reuse, loss_promote)


def test_block_m_heuristic() -> None:
    # the measured shapes: only E=32, T=512, top-k 8 reaches 64 tokens per expert
    assert sm90_block_m(512, 1, 8, 32) == 128
    assert sm90_block_m(128, 1, 4, 16) == 64 and sm90_block_m(64, 1, 8, 32) == 64 and sm90_block_m(32, 1, 2, 8) == 64
    assert sm90_block_m(256, 2, 8, 32) == 128 and sm90_block_m(64, 2, 4, 16) == 64  # the EP=2 runs
    # the default model is exactly the residue study's terms13 column, for both BLOCK_M
    assert sm90_numerics_for(512, 1, 8, 32) == Sm90Numerics(
        "reuse", fraction_bits=13, mma_k=32, l2_act_group=64, alignment="terms"
    )
    assert sm90_numerics_for(1, 1, 8, 32) == Sm90Numerics(
        "promote", fraction_bits=13, mma_k=32, l2_act_group=64, alignment="terms"
    )


def test_l2_activations_are_quantized_per_64() -> None:
    act = torch.randn(3, 256)
    act[:, 64:128] *= 1000.0  # a loud second group must not change the first group's scale
    q, scale = nm_l2(act)
    assert scale.shape == (3, 4)
    deq = (q.reshape(3, 4, 64) * scale.unsqueeze(-1)).reshape(3, 256)
    rel_first = ((deq[:, :64] - act[:, :64]).norm() / act[:, :64].norm()).item()
    assert rel_first < 0.05


def nm_l2(act):
    from sglang_moe_plugins.ops.mega_moe.sm90 import sm90_l2_quantize

    return sm90_l2_quantize(act, 64)


@pytest.mark.parametrize("tokens,top_k,experts", [(10, 3, 4), (96, 3, 4)])
def test_reference_numerics_close_to_exact(tokens: int, top_k: int, experts: int) -> None:
    """The default (heuristic-chosen) emulation stays within the kernel bound of the exact GEMMs."""
    p = make_problem(
        "sm90_fp8",
        tokens=tokens,
        top_k=top_k,
        experts=experts,
        seed=int(torch.randint(0, 1 << 20, ()).item()),
        max_tokens_per_rank=128,
    )
    chosen = sm90_numerics_for(tokens, 1, top_k, experts)
    assert chosen.accumulation == ("reuse" if tokens * top_k / experts >= 64 else "promote")
    summed = Sm90Numerics(chosen.accumulation)  # the previous default (step sum truncated)
    ys = []
    for numerics in (None, Sm90Numerics(), summed):
        out = mm.allocate_outputs(p.shape, p.config, p.inputs.device, num_tokens=tokens)
        out.y.fill_(float("nan"))
        mega_moe_reference(p.inputs, out, p.shape, p.config, sm90=numerics)
        ys.append(out.y.double())
    for y in (ys[0], ys[2]):
        rel = ((y - ys[1]).norm() / ys[1].norm()).item()
        assert 0 < rel < 1e-2, rel
