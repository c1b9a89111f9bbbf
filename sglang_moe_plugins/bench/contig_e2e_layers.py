"""One MoE layer as SGLang 0.5.23's ``DeepGemmRunnerCore`` runs it on a Hopper GPU (DeepGEMM scales fp32, TMA-aligned),
for ``benchmarks/contig_e2e.py``: the compact layout, the masked layout and DeepEP normal's contiguous layout, each
with a pluggable activation step, plus the fp32 reference MoE on the dequantized weights.

The code follows 0.5.23's ``deep_gemm.py`` call for call (``pre_permute_standard_to_deep_gemm``,
``_run_contiguous_gemm``, ``_run_masked_gemm``, ``post_permute_deep_gemm_to_standard``,
``pre_permute_deepep_normal_to_deep_gemm`` / ``post_permute_deep_gemm_to_deepep_normal``) with the branches a
Hopper GPU takes (``DEEPGEMM_SCALE_UE8M0`` False, ``DEEPGEMM_NEED_TMA_ALIGNED_SCALES`` True), SGLang's own Triton
permute kernels (``kernels``: :mod:`.sglang_moe_host`), ``stock``'s quantizer (SGLang's
``sglang_per_token_group_quant_fp8``) and DeepGEMM's grouped FP8 GEMMs. An activation is
``act(gateup, masked_m) -> (fp8, scale)``: ``gateup`` is ``[M, 2D]`` (contiguous) or ``[E, m, 2D]`` (masked), the
scale fp32 row-major (contiguous: ``[M, G]``; masked: ``[E, m, G]`` or column-major for the default masked branch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Weights", "Inputs", "Layer", "make_weights", "make_inputs", "make_deepep_inputs", "reference_moe", "rel_l2"]

Act = Callable[[torch.Tensor, Any], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, eq=False)
class Weights:
    w13: torch.Tensor  # fp8 [E, 2D, K]
    w13_s: torch.Tensor  # fp32 [E, 2D/128, K/128]
    w2: torch.Tensor  # fp8 [E, K, D]
    w2_s: torch.Tensor  # fp32 [E, K/128, D/128]


@dataclass(frozen=True, eq=False)
class Inputs:
    """A standard-dispatch call (``x`` bf16 [T, K]) or a DeepEP-normal one (``x`` fp8, ``x_s``, ``counts``)."""

    x: torch.Tensor
    topk_ids: torch.Tensor  # int32 [T, topk]; -1: not on this rank (DeepEP)
    topk_w: torch.Tensor  # fp32 [T, topk]
    x_s: torch.Tensor | None = None
    counts: list[int] | None = None  # DeepEP: received rows per local expert, 128-aligned


def _fp8_random(shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    out = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    for i in range(0, shape[0], 8):
        chunk = torch.randn((min(8, shape[0] - i), *shape[1:]), generator=gen, device=device, dtype=torch.bfloat16)
        out[i : i + chunk.shape[0]] = chunk.to(torch.float8_e4m3fn)
    return out


def _scales(shape: tuple[int, ...], gen: torch.Generator, device: str, lo: int, hi: int) -> torch.Tensor:
    exp = torch.randint(lo, hi + 1, shape, generator=gen, device=device).float()
    return torch.exp2(exp) * (1 + 0.5 * torch.rand(shape, generator=gen, device=device))


def make_weights(e: int, d: int, k: int, gen: torch.Generator, device: str = "cuda") -> Weights:
    """Random FP8 block-128 weights: fp8(N(0,1)) values, per-128x128 scales 2**U[-6,-4] x U[1, 1.5) (the gate then
    reaches SwiGLU's limit 10 on some rows)."""
    return Weights(
        _fp8_random((e, 2 * d, k), gen, device),
        _scales((e, 2 * d // 128, k // 128), gen, device, -6, -4),
        _fp8_random((e, k, d), gen, device),
        _scales((e, k // 128, d // 128), gen, device, -6, -4),
    )


def _route(t: int, experts: int, topk: int, gen: torch.Generator, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.rand((t, experts), generator=gen, device=device).topk(topk, dim=1).indices.to(torch.int32)
    w = torch.rand((t, topk), generator=gen, device=device) + 0.1
    return ids, (w / w.sum(dim=1, keepdim=True)).float()


def make_inputs(t: int, k: int, experts: int, topk: int, gen: torch.Generator, device: str = "cuda") -> Inputs:
    """Standard dispatch: bf16 tokens, uniform random top-k over all experts (TP: every expert is local)."""
    ids, w = _route(t, experts, topk, gen, device)
    return Inputs(torch.randn((t, k), generator=gen, device=device).to(torch.bfloat16), ids, w)


def make_deepep_inputs(
    t: int,
    k: int,
    experts: int,
    local: int,
    topk: int,
    ep: int,
    ptgq: Callable[..., Any],
    gen: torch.Generator,
    device: str = "cuda",
) -> Inputs:
    """What DeepEP normal dispatch hands rank 0 when each of ``ep`` ranks routes ``t`` tokens uniformly: the received
    tokens (those with at least one expert in ``[0, local)``), FP8-quantized (group 128), their top-k with the
    other ranks' experts as -1, and the per-expert counts aligned to 128 (DeepEP's ``expert_alignment``)."""
    ids, w = _route(t * ep, experts, topk, gen, device)
    keep = (ids < local).any(dim=1)
    ids, w = ids[keep], w[keep]
    ids = torch.where(ids < local, ids, torch.full_like(ids, -1))
    x = torch.randn((ids.shape[0], k), generator=gen, device=device).to(torch.bfloat16)
    xq, xs = ptgq(x, 128)
    counts = torch.bincount(ids[ids >= 0].long(), minlength=local).tolist()
    return Inputs(xq, ids.contiguous(), w.contiguous(), xs, [-(-c // 128) * 128 for c in counts])


class Layer:
    """The layer's code paths over one set of weights. ``keep``: where the last call leaves its activation's input."""

    def __init__(
        self, dg: Any, kernels: Any, ptgq: Callable[..., Any], weights: Weights, topk: int, global_experts: int
    ) -> None:
        self.dg, self.k, self.ptgq, self.w = dg, kernels, ptgq, weights
        self.topk, self.global_experts = topk, global_experts
        self.keep: dict[str, Any] = {}

    # -- deep_gemm_wrapper (0.5.23) on this DeepGEMM
    def alignment(self, expected_m: int, num_groups: int) -> int:
        """``get_contiguous_layout_alignment``."""
        alignment = self.dg.get_mk_alignment_for_contiguous_layout()
        if isinstance(alignment, tuple):
            alignment = alignment[0]
        theoretical = getattr(self.dg, "get_theoretical_mk_alignment_for_contiguous_layout", None)
        if theoretical is None:
            return alignment
        try:
            candidate = theoretical((expected_m + num_groups - 1) // num_groups)
        except Exception:
            return alignment
        return candidate if 0 < candidate <= alignment else alignment

    @contextlib.contextmanager
    def scope(self, alignment: int | None) -> Iterator[None]:
        """``contiguous_layout_alignment_scope``."""
        setter = getattr(self.dg, "set_mk_alignment_for_contiguous_layout", None)
        if alignment is None or setter is None:
            yield
            return
        previous = self.dg.get_mk_alignment_for_contiguous_layout()
        setter(alignment)
        try:
            yield
        finally:
            setter(previous[0] if isinstance(previous, tuple) else previous)

    def mn_major(self, sf: torch.Tensor) -> torch.Tensor:
        """``deep_gemm_wrapper.get_mn_major_tma_aligned_tensor`` (keeps ``sf`` when DeepGEMM aliases it)."""
        out = self.dg.get_mn_major_tma_aligned_tensor(sf)
        return sf if out.data_ptr() == sf.data_ptr() else out

    # -- _run_contiguous_gemm (DEEPGEMM_NEED_TMA_ALIGNED_SCALES: tma_align_input_scale before each GEMM)
    def _contig_gemms(self, a: torch.Tensor, a_s: torch.Tensor, m_indices: torch.Tensor, act: Act) -> torch.Tensor:
        w, rows = self.w, a.shape[0]
        gateup = torch.empty((rows, w.w13.shape[1]), device=a.device, dtype=torch.bfloat16)
        a_s = self.k.tma_align_input_scale(a_s)
        self.dg.m_grouped_fp8_gemm_nt_contiguous((a, a_s), (w.w13, w.w13_s), gateup, m_indices)
        self.keep["gateup"], self.keep["masked_m"] = gateup, None
        down_in, down_s = act(gateup, None)
        down_out = torch.empty((rows, w.w2.shape[1]), device=a.device, dtype=torch.bfloat16)
        down_s = self.k.tma_align_input_scale(down_s)
        self.dg.m_grouped_fp8_gemm_nt_contiguous((down_in, down_s), (w.w2, w.w2_s), down_out, m_indices)
        return down_out

    def compact(self, inp: Inputs, act: Act) -> torch.Tensor:
        """``pre_permute_standard_to_deep_gemm`` (compact branch) + ``_run_contiguous_gemm`` + post-permute."""
        x, ids = inp.x, inp.topk_ids
        t, hidden = x.shape
        num_experts = self.w.w13.shape[0]
        n_assign = ids.numel()
        block_e = self.alignment(n_assign, num_experts)
        max_nonempty = min(n_assign, num_experts)
        all_tokens = block_e * (max_nonempty + (n_assign - max_nonempty) // block_e)
        counts, unused = self.k.fused_moe_dispatch_index(ids, num_experts, 1)
        del unused
        valid = counts
        counts = self.k.pad_expert_counts(counts, block_e, all_tokens)
        xq, xs = self.ptgq(x, 128)
        packed = torch.empty((all_tokens, hidden), device=x.device, dtype=torch.float8_e4m3fn)
        packed_s = torch.zeros((all_tokens, hidden // 128), device=x.device, dtype=xs.dtype)
        start = torch.empty(num_experts, device=x.device, dtype=torch.int32)
        m_indices = torch.empty(all_tokens, device=x.device, dtype=torch.int32)
        src2dst = torch.empty_like(ids, dtype=torch.int32)
        self.k.ep_scatter(
            xq,
            xs,
            ids,
            counts,
            valid,
            start,
            packed,
            packed_s,
            m_indices,
            src2dst,
            scale_ue8m0=False,
            quant_block_size=128,
            expert_alignment=block_e,
        )
        self.keep["all_tokens"], self.keep["block_e"] = all_tokens, block_e
        with self.scope(block_e):
            down_out = self._contig_gemms(packed, packed_s, m_indices, act)
        out = torch.empty((t, hidden), device=x.device, dtype=torch.bfloat16)
        self.k.post_reorder_deepgemm(down_out, out, src2dst, ids, inp.topk_w, self.topk, t, hidden, 1.0)
        return out

    def masked(self, inp: Inputs, act: Act) -> torch.Tensor:
        """``pre_permute_standard_to_deep_gemm`` (masked branch) + ``_run_masked_gemm`` + post-permute."""
        x, ids = inp.x, inp.topk_ids
        t, hidden = x.shape
        num_experts = self.w.w13.shape[0]
        masked_m, _, src2dst, a, a_s = self.k.moe_ep_deepgemm_preprocess(ids, num_experts, x, self.topk, [128, 128])
        expected_m = max(1, -(-t * self.topk // self.global_experts))
        a_s = self.mn_major(a_s)
        e, m, _ = a.shape
        gateup = torch.empty((e, m, self.w.w13.shape[1]), device=x.device, dtype=torch.bfloat16)
        self.dg.fp8_m_grouped_gemm_nt_masked((a, a_s), (self.w.w13, self.w.w13_s), gateup, masked_m, expected_m)
        self.keep["gateup"], self.keep["masked_m"], self.keep["m_max"] = gateup, masked_m, m
        down_in, down_s = act(gateup, masked_m)
        down_s = self.mn_major(down_s)
        down_out = torch.empty((e, m, self.w.w2.shape[1]), device=x.device, dtype=torch.bfloat16)
        self.dg.fp8_m_grouped_gemm_nt_masked(
            (down_in, down_s), (self.w.w2, self.w.w2_s), down_out, masked_m, expected_m
        )
        out = torch.empty((t, hidden), device=x.device, dtype=torch.bfloat16)
        self.k.post_reorder_deepgemm(down_out, out, src2dst, ids, inp.topk_w, self.topk, t, hidden, 1.0)
        return out

    def deepep(self, inp: Inputs, act: Act) -> torch.Tensor:
        """``pre_permute_deepep_normal_to_deep_gemm`` + ``_run_contiguous_gemm`` + ``post_permute_deep_gemm_to_deepep_normal``
        (no alignment scope: DeepEP's 128-aligned counts, DeepGEMM's default alignment)."""
        if inp.counts is None or inp.x_s is None:
            raise ValueError("deepep() needs Inputs made for DeepEP normal dispatch (counts and x_s set)")
        x, ids = inp.x, inp.topk_ids
        all_tokens = sum(inp.counts)
        hidden = x.shape[1]
        a = torch.empty((all_tokens, hidden), device=x.device, dtype=x.dtype)
        a_s = torch.empty((all_tokens, hidden // 128), device=x.device, dtype=torch.float32)
        m_indices = torch.empty(all_tokens, device=x.device, dtype=torch.int32)
        output_index = torch.empty_like(ids)
        pinned = x.device.type == "cuda"
        counts = torch.tensor(inp.counts, dtype=torch.int32, pin_memory=pinned, device="cpu")
        counts = counts.to(x.device, non_blocking=True)
        start = torch.empty_like(counts)
        self.k.ep_scatter(x, inp.x_s, ids, counts, counts, start, a, a_s, m_indices, output_index, scale_ue8m0=False)
        self.keep["all_tokens"], self.keep["block_e"] = all_tokens, 128
        down_out = self._contig_gemms(a, a_s, m_indices, act)
        out = torch.empty((x.shape[0], hidden), device=x.device, dtype=torch.bfloat16)
        self.k.ep_gather(down_out, ids, inp.topk_w, output_index, out)
        return out


def _dequant(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return w.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)


def reference_moe(inp: Inputs, w: Weights, swiglu_limit: float | None) -> torch.Tensor:
    """fp32 MoE on the dequantized weights (the inputs as given: bf16, or DeepEP's dequantized FP8); experts
    marked -1 contribute nothing; SwiGLU's limit as SGLang applies it (gate <= L, up in [-L, L])."""
    x = inp.x.float()
    if inp.x_s is not None:
        x = x * inp.x_s.repeat_interleave(128, 1)
    out = torch.zeros((x.shape[0], w.w2.shape[1]), device=x.device, dtype=torch.float32)
    d = w.w2.shape[2]
    for e in torch.unique(inp.topk_ids[inp.topk_ids >= 0]).tolist():
        tok, slot = (inp.topk_ids == e).nonzero(as_tuple=True)
        h = x[tok] @ _dequant(w.w13[e], w.w13_s[e]).T
        gate, up = h[:, :d], h[:, d:]
        if swiglu_limit is not None:
            gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
        y = (torch.nn.functional.silu(gate) * up) @ _dequant(w.w2[e], w.w2_s[e]).T
        out.index_add_(0, tok, y * inp.topk_w[tok, slot, None])
    return out


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; inf where ``out`` holds a non-finite value."""
    o = out.float()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - ref).norm() / ref.norm().clamp_min(1e-30))
