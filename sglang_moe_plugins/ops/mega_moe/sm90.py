"""How DeepGEMM's SM90 ``fp8_mega_moe`` computes its two GEMMs, emulated in torch.

Read from ``deep_gemm/include/deep_gemm/impls/sm90_fp8_mega_moe.cuh`` (sgl-deep-gemm 0.1.5.post1;
0.2.3.post2's differs only in the scheduler's class name) and the host heuristics of DeepGEMM's SM90
MegaMoE (sgl-project/DeepGEMM pull request 36, ``csrc/jit_kernels/heuristics/sm90_mega_moe.hpp`` and
``csrc/jit_kernels/impls/sm90_fp8_mega_moe.hpp``):

- The kernel picks ``BLOCK_M = 128`` when the expected tokens per expert,
  ``num_tokens * num_ranks * top_k / num_experts``, is at least 64, else ``BLOCK_M = 64``
  (:func:`sm90_block_m`).
- With ``BLOCK_M = 128`` it sets ``reuse_accum_as_final``: the WGMMA instructions accumulate the
  **whole K loop** into the final accumulator registers. Between scale blocks the accumulator is
  rescaled in fp32 (``H < 7168``: multiplied by ``1 / s_b`` before block b's WGMMAs and by ``s_b``
  after; ``H >= 7168``: multiplied by ``s_{b-1} / s_b`` before block b and by the last ``s`` at the
  end), where ``s_b`` is the activation scale times the weight scale of block b.
- With ``BLOCK_M = 64`` (and the decode swap-AB path) each scale block's WGMMAs start from zero and
  the block's sum is promoted to fp32: ``final += s_b * partial`` (the usual DeepGEMM pattern).
- Hopper's FP8 WGMMA does not accumulate in full fp32. One FP8 WGMMA covers K = 32; the model
  (``alignment="terms"``, 13 fraction bits, the default of :func:`sm90_numerics_for`) aligns every
  addend of a step (the accumulator and the 32 exact FP8 products) to the largest addend's leading
  bit, truncates each toward zero 13 bits below it, and sums the truncated addends exactly (an
  adder tree with a 14-bit significand window). Promoting every 128 (L1) / 64 (L2) K bounds the
  loss (``BLOCK_M = 64``); accumulating the whole K loop (``reuse``, ``BLOCK_M = 128``) lets it grow
  with K. Measured on an H200 against the real kernel (sgl-deep-gemm 0.1.5.post1, 2026-12-01, eight
  shapes, both BLOCK_M): 0.23-0.39% relative L2 of ``y`` per case, at most 1.4% per row; truncating
  only the step sum (``alignment="sum"``) left up to 1.53%, 14 bits up to 1.01%. The hardware
  behaviour is an assumption checked by that fit (``tests/gpu/mega_sm90_residue.py``), not read
  from a specification.
- L1 scale blocks: 128 K (per-128 activation scale x 128x128 weight block). L2 scale blocks: 64 K
  (per-64 activation scale from the L1 epilogue, ``kL2ActsSFGranK = 64``, x the 128x128 weight
  block covering them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch

from ...quant import FP8_E4M3_MAX
from . import MegaMoEConfig, MegaMoEInputs, MegaMoEShape
from .activation import swiglu
from .formats import deinterleave_gate_up, quantize_activations

__all__ = [
    "Sm90Numerics",
    "SM90_EXACT",
    "SM90_DEFAULT_BITS",
    "sm90_block_m",
    "sm90_numerics_for",
    "sm90_block_gemm",
    "sm90_l2_quantize",
    "sm90_reference_slots",
    "truncate_significand",
]

Accumulation = Literal["exact", "promote", "reuse"]
Alignment = Literal["sum", "terms"]


@dataclass(frozen=True)
class Sm90Numerics:
    """How the SM90 emulation accumulates the GEMMs and groups the L2 activation scales.

    ``accumulation``: ``exact`` (fp64 sums of the dequantized operands), ``promote`` (a truncated
    tensor-core partial per scale block, promoted to fp32: ``BLOCK_M = 64``), ``reuse`` (the whole K
    loop in the truncating accumulator: ``BLOCK_M = 128``). ``fraction_bits``: fraction bits the
    accumulator keeps after each step (truncation toward zero); ``mma_k``: K per step.
    ``l2_act_group``: K elements per L2 activation scale (the kernel: 64; 128 only for studies).
    ``alignment``: where the accumulator drops bits in each step. ``sum``: the exact step sum
    (accumulator + ``mma_k`` products) truncated to ``1 + fraction_bits`` significant bits.
    ``terms``: every addend (the accumulator and each exact FP8 product) is first aligned to the
    largest addend's leading bit and truncated toward zero to ``fraction_bits`` bits below it, then
    the truncated addends are summed exactly (the adder-tree model of Hopper's FP8 tensor core:
    small products lose their low bits too, not only the running sum).
    """

    accumulation: Accumulation = "exact"
    fraction_bits: int = 13
    mma_k: int = 32
    l2_act_group: int = 64
    alignment: Alignment = "sum"

    def __post_init__(self) -> None:
        if self.accumulation not in ("exact", "promote", "reuse"):
            raise ValueError(f"accumulation must be exact, promote or reuse, got {self.accumulation!r}")
        if self.l2_act_group not in (64, 128):
            raise ValueError(f"l2_act_group must be 64 (the kernel) or 128, got {self.l2_act_group}")
        if self.mma_k not in (8, 16, 32, 64) or not 4 <= self.fraction_bits <= 23:
            raise ValueError(
                f"mma_k must divide 64 and fraction_bits lie in [4, 23], got {self.mma_k}, {self.fraction_bits}"
            )
        if self.alignment not in ("sum", "terms"):
            raise ValueError(f"alignment must be sum or terms, got {self.alignment!r}")

    def describe(self) -> str:
        text = f"L2 acts per {self.l2_act_group}, {self.accumulation}"
        if self.accumulation != "exact":
            text += f" (e8m{self.fraction_bits} per {self.mma_k} K" + (
                ", aligned terms)" if self.alignment == "terms" else ")"
            )
        return text


SM90_EXACT = Sm90Numerics()
#: Fraction bits of the default model (``terms`` alignment): 13 fits the H200 at BLOCK_M 64 and 128;
#: 14 leaves 0.4-1.0% (tests/gpu/README.md, run 2).
SM90_DEFAULT_BITS = 13


def sm90_block_m(num_tokens: int, num_ranks: int, top_k: int, num_experts: int) -> int:
    """``BLOCK_M`` of DeepGEMM's SM90 MegaMoE heuristic (``get_block_config_for_mega_moe_sm90``).

    The sgl-deep-gemm wheels ship no host source; the revisions of that function in
    sgl-project/DeepGEMM agree on the switch at 64 expected tokens per expert on H100/H200 but not on
    whether exactly 64 takes ``BLOCK_M = 128`` (``>=`` in some, ``>`` in others; H20 uses other
    thresholds). This follows ``>=``; the GPU tests keep away from exactly 64.
    """
    expected = num_tokens * num_ranks * top_k / num_experts
    return 128 if expected >= 64.0 else 64


def sm90_numerics_for(num_tokens: int, num_ranks: int, top_k: int, num_experts: int) -> Sm90Numerics:
    """The emulation of the kernel configuration DeepGEMM picks for this call (this rank's tokens):
    ``reuse`` at ``BLOCK_M = 128``, ``promote`` at ``BLOCK_M = 64``, both with the ``terms``
    alignment and 13 fraction bits (:data:`SM90_DEFAULT_BITS`), the model that fits the real kernel
    on the H200 (0.23-0.39% relative L2 per case, at most 1.4% per row; docs/mega-moe.md)."""
    reuse = sm90_block_m(num_tokens, num_ranks, top_k, num_experts) == 128
    return Sm90Numerics(
        accumulation="reuse" if reuse else "promote", fraction_bits=SM90_DEFAULT_BITS, alignment="terms"
    )


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact fp64 ``2 ** exponent`` (integer tensor in [-1022, 1023]) from the bits (no pow/exp2 rounding)."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def truncate_significand(x: torch.Tensor, fraction_bits: int) -> torch.Tensor:
    """``x`` (fp64) truncated toward zero to ``1 + fraction_bits`` significant bits."""
    mantissa, exponent = torch.frexp(x)  # x = m * 2**e, |m| in [0.5, 1); frexp(0) = (0, 0)
    bits = fraction_bits + 1
    return torch.trunc(mantissa * float(2**bits)) * _pow2(exponent - bits)


def _aligned_step(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, fraction_bits: int) -> torch.Tensor:
    """One tensor-core step in the ``terms`` model: ``acc [M, N]`` (fp64) plus the products of
    ``a [M, k]`` and ``b [N, k]`` (FP8 values), every addend truncated toward zero to a multiple of
    ``2 ** (leading bit of the largest addend - fraction_bits)``, summed exactly (fp64 holds it:
    at most 65 addends of at most ``2 ** (fraction_bits + 1)`` units)."""
    m, n = acc.shape
    out = torch.empty_like(acc)
    chunk = max(1, (1 << 24) // max(1, m * a.shape[1]))  # <= 16 Mi fp64 products at a time
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        products = a.unsqueeze(1) * b[lo:hi].unsqueeze(0)  # [M, n, k], exact in fp64
        head = acc[:, lo:hi]
        top = torch.maximum(products.abs().amax(-1), head.abs())
        _, exponent = torch.frexp(top)  # top = m * 2**e, m in [0.5, 1)
        scale = _pow2(1 + fraction_bits - exponent)  # 1 / ulp, exact
        # truncated addends in units of the ulp are integers (< 2**(fraction_bits + 1)): exact sums
        units = torch.trunc(products * scale.unsqueeze(-1)).sum(-1) + torch.trunc(head * scale)
        out[:, lo:hi] = units / scale
    return out


def sm90_block_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    *,
    block_k: int,
    numerics: Sm90Numerics,
    ratio_rescale: bool,
) -> torch.Tensor:
    """fp32 ``[M, N]``: ``a [M, K]`` (FP8 values as float) times ``b [N, K]`` (FP8 values) with
    scales ``a_scale [M, K/block_k]`` and ``b_scale [N, K/block_k]`` (expanded to the same blocks).

    ``exact``: fp64 sum of the dequantized products. ``promote`` / ``reuse``: the SM90 kernel's
    accumulation (module docstring); ``ratio_rescale`` selects the ``H >= 7168`` rescale form.
    """
    m, k = a.shape
    n = b.shape[0]
    blocks = k // block_k
    a64, b64 = a.double(), b.double()
    if numerics.accumulation == "exact":
        deq_a = (a64.reshape(m, blocks, block_k) * a_scale.double().unsqueeze(-1)).reshape(m, k)
        deq_b = (b64.reshape(n, blocks, block_k) * b_scale.double().unsqueeze(-1)).reshape(n, k)
        return (deq_a @ deq_b.T).float()
    steps = block_k // numerics.mma_k
    bits = numerics.fraction_bits
    out = torch.zeros((m, n), dtype=torch.float32, device=a.device)
    prev: torch.Tensor | None = None
    for blk in range(blocks):
        s = a_scale[:, blk].float().unsqueeze(1) * b_scale[:, blk].float().unsqueeze(0)  # fp32 [M, N]
        if numerics.accumulation == "promote":
            acc = torch.zeros((m, n), dtype=torch.float64, device=a.device)
        elif ratio_rescale:
            acc = out.double() if prev is None else (out * (prev * (1.0 / s))).double()
        else:
            acc = out.double() if blk == 0 else (out * (1.0 / s)).double()
        for step in range(steps):
            lo = blk * block_k + step * numerics.mma_k
            hi = lo + numerics.mma_k
            if numerics.alignment == "terms":
                acc = _aligned_step(acc, a64[:, lo:hi], b64[:, lo:hi], bits)
            else:
                acc = truncate_significand(acc + a64[:, lo:hi] @ b64[:, lo:hi].T, bits)
        if numerics.accumulation == "promote":
            out = out + s * acc.float()
        elif ratio_rescale:
            out = acc.float()
        else:
            out = acc.float() * s
        prev = s
    if numerics.accumulation == "reuse" and ratio_rescale and prev is not None:
        out = out * prev
    return out


def sm90_l2_quantize(act: torch.Tensor, group: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The SM90 L1 epilogue's quantization of the L2 input: per ``group`` K (the kernel: 64), fp32
    scale ``fmul_rn(max(amax, 1e-10), 1/448)``, ``q = e4m3(v * (1 / scale))``. Returns
    ``(q as fp32 [M, I], scale fp32 [M, I / group])``."""
    rows, cols = act.shape
    grouped = act.reshape(rows, cols // group, group)
    scale = grouped.abs().amax(-1).clamp_min(1e-10) * torch.tensor(1.0 / 448.0, dtype=torch.float32, device=act.device)
    q = (
        (grouped * (torch.ones_like(scale) / scale).unsqueeze(-1))
        .clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        .to(torch.float8_e4m3fn)
    )
    return q.float().reshape(rows, cols), scale


def _sm90_expert_weights(
    inputs: MegaMoEInputs, expert: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw FP8 values (fp32) and per-row block scales of one expert: ``(w1 [2I, H] rows [gate; up],
    s1 [2I, H/128], w2 [H, I], s2 [H, I/128])``."""
    d1, sf1 = inputs.l1_weights
    d2, sf2 = inputs.l2_weights
    w1 = deinterleave_gate_up(d1[expert : expert + 1].float(), "gran8")[0]
    w2 = d2[expert].float()
    rows1 = torch.arange(w1.shape[0], device=w1.device) // 128
    rows2 = torch.arange(w2.shape[0], device=w2.device) // 128
    return w1, sf1[expert].float()[rows1], w2, sf2[expert].float()[rows2]


def _sm90_expert_forward(
    xq: torch.Tensor,
    xs: torch.Tensor,
    weight: torch.Tensor,
    parts: tuple[torch.Tensor, ...],
    config: MegaMoEConfig,
    numerics: Sm90Numerics,
    ratio_rescale: bool,
) -> torch.Tensor:
    """One expert's rows through the SM90 kernel's numerics: fp32 ``[rows, H]`` before the bf16 cast."""
    w1, s1, w2, s2 = parts
    h = sm90_block_gemm(xq, xs, w1, s1, block_k=128, numerics=numerics, ratio_rescale=ratio_rescale)
    act = swiglu(h, config, weight)
    group = numerics.l2_act_group
    aq, a_scale = sm90_l2_quantize(act, group)
    w_scale = s2.repeat_interleave(128 // group, dim=1)  # the 128x128 weight block over each group
    return sm90_block_gemm(aq, a_scale, w2, w_scale, block_k=group, numerics=numerics, ratio_rescale=ratio_rescale)


def sm90_reference_slots(
    inputs: MegaMoEInputs, shape: MegaMoEShape, config: MegaMoEConfig, weights: torch.Tensor, numerics: Sm90Numerics
) -> torch.Tensor:
    """bf16-rounded per-slot rows ``[T, top_k, H]`` (fp32) of the SM90 kernel."""
    num_tokens = inputs.num_tokens
    x = inputs.hidden_states
    xq, xs = quantize_activations(x, "sm90_fp8")
    xq = xq.float()
    ids = cast("torch.Tensor", inputs.topk_ids).to(torch.int64)  # present when num_tokens > 0
    slots = torch.zeros((num_tokens, shape.top_k, shape.hidden), dtype=torch.float32, device=x.device)
    ratio = shape.hidden >= 7168
    for expert in torch.unique(ids).tolist():
        if expert < 0 or expert >= inputs.l1_weights[0].shape[0]:
            continue
        tok, slot = (ids == expert).nonzero(as_tuple=True)
        parts = _sm90_expert_weights(inputs, expert)
        y = _sm90_expert_forward(xq[tok], xs[tok], weights[tok, slot], parts, config, numerics, ratio)
        slots[tok, slot] = y.to(torch.bfloat16).float()
    return slots
