"""Weight layouts of op ``mega_moe``: what ``experts.mega_l1_weights`` / ``mega_l2_weights`` hold after
SGLang's ``build_mega_moe_experts_weights`` / ``build_sm90_mega_moe_experts_weights``, encoded and decoded
in torch (CPU and GPU): gate/up interleaving, UTCCP scale transposes, packed UE8M0 scales, FP4 and FP8
weights, and :func:`decode_expert_weights`. Public through :mod:`.formats` (its ``__all__``, covered by
the plugin contract version); see :func:`encode_fp4_weights`, :func:`decode_fp4_weights`,
:func:`encode_fp8_block_weights`."""

from __future__ import annotations

from typing import Literal

import torch

from ...quant import (
    FP8_E4M3_MAX,
    dequantize_e2m1,
    pack_e2m1,
    quantize_e2m1_groups,
    quantize_fp8_groups,
    ue8m0_exponent,
    ue8m0_from_exponent,
    unpack_e2m1,
)
from . import MegaMoEConfig, MegaMoEInputs

__all__ = [
    "interleave_gate_up",
    "deinterleave_gate_up",
    "utccp_transpose",
    "utccp_untranspose",
    "pack_ue8m0_mn_major",
    "unpack_ue8m0_packed",
    "encode_fp4_weights",
    "decode_fp4_weights",
    "encode_fp8_shared_weights",
    "decode_fp8_shared_weights",
    "encode_fp8_block_weights",
    "decode_fp8_block_weights",
    "decode_expert_weights",
]


Interleave = Literal["gran8", "gran16_packed"] | None


def interleave_gate_up(t: torch.Tensor, mode: Interleave) -> torch.Tensor:
    """Rows ``[gate; up]`` (dim 1) -> DeepGEMM's L1 order (``gran8``: 8 gate, 8 up, ...;
    ``gran16_packed``: per 16-row chunk gate[0::2], up[0::2], gate[1::2], up[1::2])."""
    if mode is None:
        return t
    e, n, *rest = t.shape
    half = n // 2
    gran = 8 if mode == "gran8" else 16
    gate = t[:, :half].reshape(e, half // gran, gran, *rest)
    up = t[:, half:].reshape(e, half // gran, gran, *rest)
    if mode == "gran8":
        out = torch.stack([gate, up], dim=2)
    else:
        out = torch.cat([gate[:, :, 0::2], up[:, :, 0::2], gate[:, :, 1::2], up[:, :, 1::2]], dim=2)
    return out.reshape(e, n, *rest).contiguous()


def deinterleave_gate_up(t: torch.Tensor, mode: Interleave) -> torch.Tensor:
    """Inverse of :func:`interleave_gate_up`."""
    if mode is None:
        return t
    e, n, *rest = t.shape
    half = n // 2
    if mode == "gran8":
        chunks = t.reshape(e, half // 8, 2, 8, *rest)
        gate, up = chunks[:, :, 0], chunks[:, :, 1]
    else:
        chunks = t.reshape(e, half // 16, 4, 8, *rest)
        gate = torch.stack([chunks[:, :, 0], chunks[:, :, 2]], dim=3)  # [e, c, 8, 2, ...] -> even/odd
        up = torch.stack([chunks[:, :, 1], chunks[:, :, 3]], dim=3)
    gate = gate.reshape(e, half, *rest)
    up = up.reshape(e, half, *rest)
    return torch.cat([gate, up], dim=1)


def utccp_transpose(sf: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's ``_transpose_sf_for_utccp``: within each 128 rows, row 32a+c moves to 4c+a."""
    e, mn, k = sf.shape
    out = sf.reshape(e, mn // 128, 4, 32, k).transpose(2, 3).reshape(e, mn, k)
    return torch.empty_like(sf).copy_(out)


def utccp_untranspose(sf: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`utccp_transpose` (any strides in, contiguous out)."""
    e, mn, k = sf.shape
    return sf.reshape(e, mn // 128, 32, 4, k).transpose(2, 3).reshape(e, mn, k).contiguous()


def pack_ue8m0_mn_major(exponent: torch.Tensor) -> torch.Tensor:
    """Exponents ``[E, MN, KG]`` -> int32 ``[E, MN, ceil(KG/4)]`` with MN-major, TMA-aligned strides
    ``(pk * align(MN, 4), 1, align(MN, 4))``, group 4q+j in byte j: the layout of
    ``deep_gemm.transform_sf_into_required_layout(sf, mn, k, recipe=(1, 32), num_groups=E)`` on SM100."""
    e, mn, kg = exponent.shape
    pk = -(-kg // 4)
    raw = torch.zeros((e, mn, pk * 4), dtype=torch.uint8, device=exponent.device)
    raw[..., :kg] = exponent.to(torch.uint8)
    packed = raw.view(torch.int32)  # [e, mn, pk]
    tma_mn = -(-mn // 4) * 4
    storage = torch.zeros(e * pk * tma_mn, dtype=torch.int32, device=exponent.device)
    out = torch.as_strided(storage, (e, mn, pk), (pk * tma_mn, 1, tma_mn))
    out.copy_(packed)
    return out


def unpack_ue8m0_packed(sf: torch.Tensor, groups: int) -> torch.Tensor:
    """int32 ``[..., pk]`` (any strides) -> exponents int32 ``[..., groups]`` (byte j of word q is group 4q+j)."""
    shifts = torch.arange(4, device=sf.device, dtype=torch.int64) * 8
    raw = (sf.to(torch.int64).unsqueeze(-1) >> shifts) & 0xFF
    return raw.flatten(-2)[..., :groups].to(torch.int32)


def encode_fp4_weights(w: torch.Tensor, interleave: Interleave) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w [E, N, K]`` to FP4 E2M1 per-32 UE8M0 and lay it out as SGLang does for MegaMoE.

    Returns ``(data int8 [E, N, K/2], sf int32 [E, N, K/128], dequantized fp32 [E, N, K])``; data and
    sf interleaved (L1: ``gran8`` for fp8xfp4, ``gran16_packed`` for mxf4xmxf4; L2: None) and sf
    UTCCP-transposed, as ``build_mega_moe_experts_weights`` leaves ``experts.mega_l*_weights``.
    """
    e, n, k = w.shape
    codes, exponent = quantize_e2m1_groups(w.reshape(e * n, k).float(), 32, absmax_floor=1e-4)
    data = pack_e2m1(codes).view(torch.int8).reshape(e, n, k // 2)
    exponent = exponent.reshape(e, n, k // 32)
    deq = dequantize_e2m1(codes).reshape(e, n, k // 32, 32) * ue8m0_from_exponent(exponent).unsqueeze(-1)
    sf = pack_ue8m0_mn_major(exponent)
    if interleave is not None:
        data = interleave_gate_up(data, interleave)
        sf = _keep_mn_major(interleave_gate_up(sf, interleave))
    return data, _keep_mn_major(utccp_transpose(sf)), deq.reshape(e, n, k)


def _keep_mn_major(sf: torch.Tensor) -> torch.Tensor:
    e, mn, pk = sf.shape
    tma_mn = -(-mn // 4) * 4
    storage = torch.zeros(e * pk * tma_mn, dtype=sf.dtype, device=sf.device)
    out = torch.as_strided(storage, (e, mn, pk), (pk * tma_mn, 1, tma_mn))
    out.copy_(sf)
    return out


def _decode_packed_sf(sf: torch.Tensor, interleave: Interleave, groups: int) -> torch.Tensor:
    exponent = unpack_ue8m0_packed(utccp_untranspose(sf), groups)
    return deinterleave_gate_up(exponent, interleave)


def decode_fp4_weights(data: torch.Tensor, sf: torch.Tensor, interleave: Interleave) -> torch.Tensor:
    """fp32 ``[E, N, K]`` with rows in ``[gate; up]`` order from the MegaMoE FP4 layout."""
    e, n, half_k = data.shape
    k = half_k * 2
    codes = deinterleave_gate_up(unpack_e2m1(data.view(torch.uint8)), interleave)
    scale = ue8m0_from_exponent(_decode_packed_sf(sf, interleave, k // 32))
    values = dequantize_e2m1(codes).reshape(e, n, k // 32, 32) * scale.unsqueeze(-1)
    return values.reshape(e, n, k)


def encode_fp8_shared_weights(
    w: torch.Tensor, interleave: Interleave
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shared-expert FP8 weights ``w [N, K]`` with per-row per-32 UE8M0 scales, laid out as
    ``transform_weights_for_mega_moe`` returns them. Returns ``(data [N, K], sf int32 [N, K/128], deq)``."""
    n, k = w.shape
    q, scale = quantize_fp8_groups(w.float(), 32, ue8m0=True)
    exponent = ue8m0_exponent(scale).reshape(1, n, k // 32)
    deq = (q.float().reshape(n, k // 32, 32) * scale.unsqueeze(-1)).reshape(n, k)
    data = interleave_gate_up(q.unsqueeze(0), interleave)[0]
    sf = pack_ue8m0_mn_major(exponent)
    if interleave is not None:
        sf = _keep_mn_major(interleave_gate_up(sf, interleave))
    return data, _keep_mn_major(utccp_transpose(sf))[0], deq


def decode_fp8_shared_weights(data: torch.Tensor, sf: torch.Tensor, interleave: Interleave) -> torch.Tensor:
    """fp32 ``[N, K]`` of the fused shared expert's FP8 weights (``interleave="gran8"`` for L1, None for L2),
    rows ``[gate; up]``. Public (contract version 2)."""
    n, k = data.shape
    values = deinterleave_gate_up(data.float().unsqueeze(0), interleave)[0]
    scale = ue8m0_from_exponent(_decode_packed_sf(sf.unsqueeze(0), interleave, k // 32))[0]
    return (values.reshape(n, k // 32, 32) * scale.unsqueeze(-1)).reshape(n, k)


def encode_fp8_block_weights(
    w: torch.Tensor, interleave: Interleave
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SM90 FP8 weights: ``w [E, N, K]`` -> e4m3 with one fp32 scale per 128x128 block (absmax/448,
    floor 1e-4, as ``deep_gemm.utils.math.per_block_cast_to_fp8``), data interleaved (``gran8`` for
    L1) and scales left in ``[gate; up]`` block order, as ``build_sm90_mega_moe_experts_weights``."""
    e, n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    padded = torch.zeros((e, nb * 128, kb * 128), dtype=torch.float32, device=w.device)
    padded[:, :n, :k] = w.float()
    blocks = padded.reshape(e, nb, 128, kb, 128)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-4) / FP8_E4M3_MAX  # [e, nb, kb]
    q = (blocks * (1.0 / scale)[:, :, None, :, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, :, None, :, None]).reshape(e, nb * 128, kb * 128)[:, :n, :k]
    q = q.reshape(e, nb * 128, kb * 128)[:, :n, :k].contiguous()
    return interleave_gate_up(q, interleave), scale.contiguous(), deq.contiguous()


def decode_fp8_block_weights(data: torch.Tensor, sf: torch.Tensor, interleave: Interleave) -> torch.Tensor:
    _e, n, k = data.shape
    values = deinterleave_gate_up(data.float(), interleave)
    rows = torch.arange(n, device=data.device) // 128
    cols = torch.arange(k, device=data.device) // 128
    return values * sf.float()[:, rows][:, :, cols]


def _l1_interleave(variant: str) -> Interleave:
    return "gran16_packed" if variant == "mxf4xmxf4" else "gran8"


def decode_expert_weights(inputs: MegaMoEInputs, config: MegaMoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized ``(W1 [E, 2I, H] rows [gate; up], W2 [E, H, I])`` in fp32 of the experts in ``inputs``
    (the local experts under EP), from either weight format. Public (contract version 2)."""
    if config.weight_format == "fp8_e4m3_block128":
        w1 = decode_fp8_block_weights(*inputs.l1_weights, interleave="gran8")
        w2 = decode_fp8_block_weights(*inputs.l2_weights, interleave=None)
    else:
        w1 = decode_fp4_weights(*inputs.l1_weights, interleave=_l1_interleave(config.variant))
        w2 = decode_fp4_weights(*inputs.l2_weights, interleave=None)
    return w1, w2
