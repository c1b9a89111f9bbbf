"""mega_reference against an independent fp64 computation on fresh random inputs (CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _mega_cases import Problem, make_problem

from sglang_moe_plugins.hardware import Platform
from sglang_moe_plugins.ops import mega_moe as mm
from sglang_moe_plugins.ops.mega_moe.reference import mega_moe_reference
from sglang_moe_plugins.ops.mega_moe.sm90 import SM90_EXACT, Sm90Numerics
from sglang_moe_plugins.plugins.reference.mega_moe import MegaReferencePlugin

dgm = pytest.importorskip("deep_gemm.utils.math", reason="sgl-deep-gemm's torch references quantize x independently")

E4M3_MAX = 448.0


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.float().to(torch.bfloat16).double()


def _pow2_ceil_of_fp32_product(amax: np.ndarray, factor: float) -> np.ndarray:
    """2 ** ceil(log2(fp32(amax) * fp32(factor))) with the product rounded in fp32, as the kernel."""
    product = amax.astype(np.float32) * np.float32(factor)
    mant, exp = np.frexp(product.astype(np.float64))  # product = mant * 2**exp, mant in [0.5, 1)
    exp = np.where(mant == 0.5, exp - 1, exp)  # exact powers of two stay
    return np.where(product > 0, np.ldexp(1.0, exp), 0.0)


def _requant_sm90_raw(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sm90_fp8_mega_moe.cuh's L1 epilogue: per 64 K (kL2ActsSFGranK), continuous fp32 scales.
    Returns (FP8 values as fp64 [I], scales fp64 [I/64])."""
    g = a.reshape(-1, 64)
    amax = g.abs().amax(-1).clamp_min(1e-10).numpy()
    scale = torch.from_numpy((amax.astype(np.float32) * np.float32(1.0 / 448.0)).astype(np.float64))
    inv = (1.0 / scale.float()).double()
    q = (g * inv[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double()
    return q.reshape(a.shape), scale


def _trunc_np(v: np.ndarray, fraction_bits: int = 13) -> np.ndarray:
    m, e = np.frexp(v)
    return np.ldexp(np.trunc(np.ldexp(m, fraction_bits + 1)), e - (fraction_bits + 1))


def _aligned_terms_np(acc: np.ndarray, w: np.ndarray, a: np.ndarray, fraction_bits: int = 13) -> np.ndarray:
    """One 32-K WGMMA step of the adder-tree model: for each output n the addends ``acc[n]`` and
    ``w[n, t] * a[t]`` (exact in fp64) are truncated toward zero to multiples of
    ``2 ** (floor(log2(max |addend|)) - fraction_bits)`` and summed exactly."""
    terms = np.concatenate([acc[:, None], w * a[None, :]], axis=1)
    top = np.abs(terms).max(axis=1)
    lead = np.where(top > 0, np.floor(np.log2(np.where(top > 0, top, 1.0))), 0.0)
    lead = (
        lead - (np.ldexp(1.0, lead.astype(np.int64)) > top) + (np.ldexp(1.0, lead.astype(np.int64) + 1) <= top)
    )  # log2 rounding
    ulp = np.ldexp(1.0, (lead - fraction_bits).astype(np.int64))[:, None]
    return (np.trunc(terms / ulp) * ulp).sum(axis=1)


def _kernel_gemm_np(
    aq: np.ndarray,
    a_s: np.ndarray,
    wq: np.ndarray,
    w_s: np.ndarray,
    block: int,
    mode: str,
    ratio: bool,
    terms: bool = True,
) -> np.ndarray:
    """One token through an SM90 MegaMoE GEMM as the kernel accumulates it (numpy, written apart
    from the package's torch version): ``aq [K]`` FP8 values, ``a_s [K/block]``, ``wq [N, K]``,
    ``w_s [N, K/block]``; every 32-K WGMMA step keeps 13 fraction bits: ``terms`` (the default
    model) truncates each addend at the largest addend's leading bit minus 13
    (:func:`_aligned_terms_np`), else the exact step sum is truncated to 14 significant bits; ``promote``:
    each block from zero, ``final += s * partial`` in fp32; ``reuse``: one accumulator rescaled in
    fp32 between blocks (``ratio``: by ``s_prev / s``, else by ``1/s`` before and ``s`` after)."""
    n, k = wq.shape
    out = np.zeros(n, np.float32)
    prev = None
    one = np.float32(1.0)
    for b in range(k // block):
        s = (np.float32(a_s[b]) * w_s[:, b].astype(np.float32)).astype(np.float32)
        if mode == "promote":
            acc = np.zeros(n)
        elif ratio:
            acc = out.astype(np.float64) if prev is None else (out * (prev * (one / s))).astype(np.float64)
        else:
            acc = out.astype(np.float64) if b == 0 else (out * (one / s)).astype(np.float64)
        for step in range(block // 32):
            lo = b * block + step * 32
            if terms:
                acc = _aligned_terms_np(acc, wq[:, lo : lo + 32], aq[lo : lo + 32])
            else:
                acc = _trunc_np(acc + wq[:, lo : lo + 32] @ aq[lo : lo + 32])
        if mode == "promote":
            out = (out + s * acc.astype(np.float32)).astype(np.float32)
        elif ratio:
            out = acc.astype(np.float32)
        else:
            out = (acc.astype(np.float32) * s).astype(np.float32)
        prev = s
    if mode == "reuse" and ratio:
        out = (out * prev).astype(np.float32)
    return out


def _requant_fp64(a: torch.Tensor, variant: str) -> torch.Tensor:
    """The kernel's L1-epilogue quantization, written independently in fp64 / numpy."""
    if variant == "sm90_fp8":
        q, scale = _requant_sm90_raw(a)
        return (q.reshape(-1, 64) * scale[:, None]).reshape(a.shape)
    g = a.reshape(-1, 32)
    finfo = 6.0 if variant == "mxf4xmxf4" else E4M3_MAX
    scale = torch.from_numpy(_pow2_ceil_of_fp32_product(g.abs().amax(-1).numpy(), 1.0 / finfo))
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    v = g / safe[:, None]
    if variant == "mxf4xmxf4":
        grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
        dist = (v.abs().clamp(max=6.0)[..., None] - grid).abs()
        near = dist.topk(2, dim=-1, largest=False)
        first, second = near.indices[..., 0], near.indices[..., 1]
        tie = near.values[..., 0] == near.values[..., 1]
        idx = torch.where(tie & (first % 2 == 1), second, first)  # a tie goes to the even code
        q = grid[idx] * v.sign()
    else:
        q = v.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).double()
    return (q * scale[:, None]).reshape(a.shape)


def _x_dequantized(p: Problem) -> torch.Tensor:
    x = p.inputs.hidden_states
    v = p.config.variant
    if v == "fp8xfp4":
        q, sf = dgm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
        return dgm.cast_back_from_fp8(q, sf, gran_k=32).double()
    if v == "mxf4xmxf4":
        q, sf = dgm.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
        return dgm.cast_back_from_fp4(q, sf, gran_k=32).double()
    q, sf = dgm.per_token_cast_to_fp8(x, use_ue8m0=False, gran_k=128)
    return dgm.cast_back_from_fp8(q, sf, gran_k=128).double()


def _expert_fp64(xq: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, weight: float, p: Problem) -> torch.Tensor:
    inter = w1.shape[0] // 2
    h = w1.double() @ xq
    gate, up = h[:inter], h[inter:]
    limit = p.config.activation_clamp
    if p.config.variant != "sm90_fp8":
        gate, up = _bf16(gate), _bf16(up)
        if limit is not None:
            bound = float(torch.tensor(limit).to(torch.bfloat16))
            gate, up = gate.clamp(max=bound), up.clamp(-bound, bound)
    elif limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    act = gate * torch.sigmoid(gate) * up * weight
    return _bf16(w2.double() @ _requant_fp64(act, p.config.variant))


def _deinterleave_gran8_np(d: np.ndarray) -> np.ndarray:
    """[2I, H] rows (8 gate, 8 up, ...) -> rows [gate; up]."""
    n = d.shape[0]
    chunks = d.reshape(n // 16, 2, 8, -1)
    return np.concatenate([chunks[:, 0].reshape(n // 2, -1), chunks[:, 1].reshape(n // 2, -1)])


def _sm90_expert_model(t: int, e: int, weight: float, p: Problem, mode: str, terms: bool = True) -> torch.Tensor:
    """One (token, expert) of the SM90 kernel with its GEMM accumulation (numpy)."""
    q, sf = dgm.per_token_cast_to_fp8(p.inputs.hidden_states[t : t + 1], use_ue8m0=False, gran_k=128)
    aq, a_s = q.double().numpy()[0], sf.double().numpy()[0]
    d1, s1 = p.inputs.l1_weights
    d2, s2 = p.inputs.l2_weights
    w1 = _deinterleave_gran8_np(d1[e].double().numpy())
    s1r = s1[e].double().numpy()[np.arange(w1.shape[0]) // 128]
    w2 = d2[e].double().numpy()
    s2r = np.repeat(s2[e].double().numpy()[np.arange(w2.shape[0]) // 128], 2, axis=1)  # per 64 K
    ratio = p.shape.hidden >= 7168
    h = torch.from_numpy(_kernel_gemm_np(aq, a_s, w1, s1r, 128, mode, ratio, terms).astype(np.float64))
    inter = h.shape[0] // 2
    gate, up = h[:inter], h[inter:]
    limit = p.config.activation_clamp
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    act = gate * torch.sigmoid(gate) * up * weight
    lq, ls = _requant_sm90_raw(act)
    y = _kernel_gemm_np(lq.numpy(), ls.numpy(), w2, s2r, 64, mode, ratio, terms)
    return _bf16(torch.from_numpy(y.astype(np.float64)))


def independent_fp64(p: Problem, sm90_model: bool = True, terms: bool = True) -> torch.Tensor:
    """fp64 emulation; for sm90_fp8 (``sm90_model``) with the kernel's accumulation in the mode its
    heuristic picks (BLOCK_M = 128, ``reuse``, at >= 64 expected tokens per expert), 13 fraction
    bits, the ``terms`` alignment (the default model) unless ``terms=False`` (the step sum)."""
    sm90 = p.config.variant == "sm90_fp8" and sm90_model
    mode = "reuse" if p.inputs.num_tokens * p.shape.top_k / p.shape.num_experts >= 64 else "promote"
    xq = _x_dequantized(p)
    ids, weights = p.inputs.topk_ids, p.inputs.topk_weights
    rsf = np.float32(p.config.routed_scaling_factor)
    out = torch.zeros(p.inputs.num_tokens, p.shape.hidden, dtype=torch.float64)
    for t in range(p.inputs.num_tokens):
        for k in range(p.shape.top_k):
            e = int(ids[t, k])
            if e < 0:
                continue
            w = float(np.float32(weights[t, k].item()) * rsf)
            out[t] += (
                _sm90_expert_model(t, e, w, p, mode, terms) if sm90 else _expert_fp64(xq[t], p.w1[e], p.w2[e], w, p)
            )
        if p.s1 is not None:
            out[t] += _expert_fp64(xq[t], p.s1, p.s2, 1.0, p)
    return out.to(torch.bfloat16).double()


def _run_reference(p: Problem, sm90: Sm90Numerics | None = None) -> torch.Tensor:
    out = mm.allocate_outputs(p.shape, p.config, p.inputs.device, num_tokens=p.inputs.num_tokens)
    out.y.fill_(float("nan"))
    if sm90 is None:
        MegaReferencePlugin().run(p.inputs, out, p.shape, p.config)
    else:
        mega_moe_reference(p.inputs, out, p.shape, p.config, sm90=sm90)
    return out.y


@pytest.mark.parametrize(
    "variant,clamp,rsf,shared,seed",
    [
        ("fp8xfp4", 10.0, 1.0, False, 11),
        ("fp8xfp4", 10.0, 2.5, True, 12),
        ("fp8xfp4", None, 1.0, False, 13),
        ("mxf4xmxf4", 10.0, 1.5, False, 14),
        ("mxf4xmxf4", None, 1.0, False, 15),
        ("sm90_fp8", 10.0, 2.5, False, 16),
        ("sm90_fp8", None, 1.0, False, 17),
    ],
)
def test_reference_matches_independent_fp64(variant: str, clamp, rsf: float, shared: bool, seed: int) -> None:
    seed = seed * 1000 + int(torch.randint(0, 1000, ()).item())  # fresh inputs every run, reproducible from the id
    p = make_problem(variant, clamp=clamp, rsf=rsf, shared=shared, seed=seed, tokens=10, top_k=3)
    y = _run_reference(p).double()
    assert not torch.isnan(y).any()
    ref = independent_fp64(p)
    rel = ((y - ref).norm() / ref.norm()).item()
    exact = (y == ref).double().mean().item()
    # The only differences: fp32 vs fp64 sums in the GEMMs/activation flipping a rounding (rare).
    print(f"{variant}: rel {rel:.2e}, bit-equal {exact:.1%}")
    assert rel < 3e-3, f"seed {seed}: relative error {rel:.2e}"
    assert exact > 0.9, f"seed {seed}: only {exact:.1%} of outputs bit-equal"


@pytest.mark.parametrize("tokens,top_k,experts", [(10, 3, 4), (90, 3, 4)])
def test_sm90_exact_sums_match_independent_fp64(tokens: int, top_k: int, experts: int) -> None:
    """The SM90 pipeline without the accumulator model (exact sums) against fp64 without it."""
    seed = int(torch.randint(0, 1 << 20, ()).item())
    p = make_problem(
        "sm90_fp8", clamp=10.0, rsf=2.5, seed=seed, tokens=tokens, top_k=top_k, experts=experts, max_tokens_per_rank=128
    )
    y = _run_reference(p, SM90_EXACT).double()
    ref = independent_fp64(p, sm90_model=False)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < 3e-3 and (y == ref).double().mean().item() > 0.9, f"seed {seed}: {rel:.2e}"


@pytest.mark.parametrize("tokens", [10, 90])  # promote, reuse (90 * 3 / 4 >= 64)
def test_sm90_model_matches_independent_numpy(tokens: int) -> None:
    """The default model (terms alignment, 13 bits, the heuristic's mode) against the numpy oracle."""
    seed = int(torch.randint(0, 1 << 20, ()).item())
    p = make_problem("sm90_fp8", clamp=None, seed=seed, tokens=tokens, top_k=3, experts=4, max_tokens_per_rank=128)
    y = _run_reference(p).double()
    ref = independent_fp64(p)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < 3e-3 and (y == ref).double().mean().item() > 0.9, f"seed {seed}: {rel:.2e}"
    exact = independent_fp64(p, sm90_model=False)
    assert not torch.equal(ref, exact)  # the model is active
    summed = independent_fp64(p, terms=False)
    assert ((summed - ref).norm() / ref.norm()).item() > (
        (y - ref).norm() / ref.norm()
    ).item()  # terms, not the step sum


def test_sm90_sum_alignment_matches_independent_numpy() -> None:
    """The ``sum`` alignment (kept for studies) against the numpy oracle's step-sum truncation."""
    seed = int(torch.randint(0, 1 << 20, ()).item())
    p = make_problem("sm90_fp8", clamp=10.0, seed=seed, tokens=90, top_k=3, experts=4, max_tokens_per_rank=128)
    y = _run_reference(p, Sm90Numerics("reuse")).double()
    ref = independent_fp64(p, terms=False)
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < 3e-3 and (y == ref).double().mean().item() > 0.9, f"seed {seed}: {rel:.2e}"


def test_clamp_is_active_on_these_inputs() -> None:
    """The clamp case is meaningful: without it the output differs."""
    a = _run_reference(make_problem("fp8xfp4", clamp=10.0, seed=3))
    b = _run_reference(make_problem("fp8xfp4", clamp=None, seed=3))
    assert not torch.equal(a, b)


def test_masked_slots_and_zero_tokens() -> None:
    p = make_problem("fp8xfp4", seed=4, tokens=6)
    p.inputs.topk_ids[:] = -1
    assert torch.equal(_run_reference(p)[:6], torch.zeros(6, p.shape.hidden, dtype=torch.bfloat16))
    empty = make_problem("fp8xfp4", seed=4, tokens=0)
    out = mm.allocate_outputs(empty.shape, empty.config, torch.device("cpu"), num_tokens=0)
    MegaReferencePlugin().run(empty.inputs, out, empty.shape, empty.config)
    assert out.y.shape == (1, empty.shape.hidden)


def test_supports_everything_with_all_experts_local() -> None:
    plugin = MegaReferencePlugin()
    p = make_problem("mxf4xmxf4", seed=5)
    assert plugin.supports(p.shape, p.config)
    assert plugin.available(Platform.cpu())
    import dataclasses

    ep8 = dataclasses.replace(p.shape, num_experts=64, ep_size=8)
    verdict = plugin.supports(ep8, p.config)
    assert not verdict and "ep_size=8" in verdict.reason and "8 of 64 experts" in verdict.reason
