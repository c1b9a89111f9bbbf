"""Formats of op ``mega_moe``: pre-dispatch activation formats and DeepGEMM weight layouts, in torch.

Everything here is pure torch (CPU and GPU) and is the oracle the kernels are tested against; the
reference forward is in :mod:`.reference`, the SM90 GEMM emulation in :mod:`.sm90`.

Public API for plugin authors: every name in ``__all__`` (notably :func:`decode_expert_weights`,
:func:`decode_fp8_shared_weights`, :func:`quantize_activations` and :func:`dequantize_activations`)
is covered by the plugin contract version (``sglang_moe_plugins.CONTRACT_VERSION``, 2): names,
signatures, layouts and numerics change only with a new contract version. docs/authoring.md
("Writing a mega_moe plugin") shows their use.

Pre-dispatch (bf16 activations ``x [T, H]`` -> the symmetric buffer's ``x``/``x_sf`` slots), per
variant, exactly as the host's kernels do it:

- ``fp8xfp4`` (SGLang's JIT ``mega_moe_pre_dispatch``): groups of 32, ``absmax`` floored at 1e-10,
  ``e = ceil_log2(absmax / 448)`` (IEEE division), ``q = sat_e4m3(x * 2**-e)``; the UE8M0 byte of
  group g of token t at byte ``t * row_stride_bytes + g`` of ``x_sf`` (int32 ``[P, G/4]``).
- ``mxf4xmxf4`` (sgl-deep-gemm's ``mega_moe_pre_dispatch`` = ``per_token_cast_to_fp4``): groups
  of 32, floor 1e-4, ``e = clamp(ceil_log2(absmax / 6), 1, 254)``, E2M1 by bucketize (midpoints
  0.25, 1.25, 2.5, 5 round down, 0.75, 1.75, 3.5 round up: ties to the even code), two codes per
  byte, low nibble = even column, row stride ``H / 2`` bytes.
- ``sm90_fp8`` (sgl-deep-gemm's ``mega_moe_pre_dispatch_sm90``): groups of 128, floor 1e-10,
  ``scale = absmax / 448`` (fp32), ``q = sat_e4m3(x * (1 / scale))``, ``x_sf`` fp32 ``[P, H/128]``.

All variants copy ``topk_idx`` (as int64) and ``topk_weights * routed_scaling_factor`` (fp32) for
the real rows and fill rows ``[T, P)`` with ``(-1, 0.0)``.

Weight layouts (what ``experts.mega_l1_weights`` / ``mega_l2_weights`` hold after SGLang's
``build_mega_moe_experts_weights`` / ``build_sm90_mega_moe_experts_weights``): see
:func:`encode_fp4_weights`, :func:`decode_fp4_weights`, :func:`encode_fp8_block_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    "ActFormat",
    "ACT_FORMATS",
    "act_format",
    "quantize_activations",
    "dequantize_activations",
    "pre_dispatch_reference",
    "shared_sf_row",
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


@dataclass(frozen=True)
class ActFormat:
    """How the pre-dispatch quantizes activations for a variant."""

    element: Literal["e4m3", "e2m1"]
    group_size: int
    ue8m0: bool
    absmax_floor: float

    @property
    def bytes_per_row(self) -> Literal[1, 2]:
        """Divisor of H giving the bytes of one token row (1 for FP8, 2 for packed E2M1)."""
        return 2 if self.element == "e2m1" else 1


ACT_FORMATS = {
    "fp8xfp4": ActFormat("e4m3", 32, True, 1e-10),
    "mxf4xmxf4": ActFormat("e2m1", 32, True, 1e-4),
    "sm90_fp8": ActFormat("e4m3", 128, False, 1e-10),
}


def act_format(variant: str) -> ActFormat:
    return ACT_FORMATS[variant]


# -- activations ------------------------------------------------------------------------------------


def quantize_activations(x: torch.Tensor, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [T, H]`` -> ``(q, scales)``: q float8_e4m3fn ``[T, H]`` or packed uint8 ``[T, H/2]``;
    scales: UE8M0 exponents int32 ``[T, G]`` or fp32 ``[T, G]`` (``sm90_fp8``)."""
    fmt = act_format(variant)
    values = x.float()
    if fmt.element == "e2m1":
        codes, exponent = quantize_e2m1_groups(values, fmt.group_size, absmax_floor=fmt.absmax_floor)
        return pack_e2m1(codes), exponent
    q, scale = _quantize_fp8_groups_ieee(values, fmt.group_size, ue8m0=fmt.ue8m0, absmax_floor=fmt.absmax_floor)
    return q, (ue8m0_exponent(scale) if fmt.ue8m0 else scale)


def _quantize_fp8_groups_ieee(
    values: torch.Tensor, group_size: int, *, ue8m0: bool, absmax_floor: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~sglang_moe_plugins.quant.quantize_fp8_groups` with IEEE divisions on every device.

    On CUDA torch computes ``tensor / python_scalar`` as a multiplication by the reciprocal; the
    pre-dispatch kernels divide (``absmax / 448.f``, ``1.f / scale``), so the scale of the fp32
    (SM90) format would differ in the last bit. Dividing tensor by tensor is IEEE on CPU and CUDA.
    """
    rows, cols = values.shape
    grouped = values.float().reshape(rows, cols // group_size, group_size)
    absmax = grouped.abs().amax(dim=-1).clamp_min(absmax_floor)
    scale = absmax / torch.full_like(absmax, FP8_E4M3_MAX)
    if ue8m0:
        scale = ue8m0_from_exponent(ue8m0_exponent(scale))
    inv = torch.ones_like(scale) / scale
    scaled = (grouped * inv.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return scaled.reshape(rows, cols).to(torch.float8_e4m3fn), scale


def dequantize_activations(q: torch.Tensor, scales: torch.Tensor, variant: str) -> torch.Tensor:
    """fp32 ``[T, H]`` from :func:`quantize_activations`' output."""
    fmt = act_format(variant)
    if fmt.element == "e2m1":
        values = dequantize_e2m1(unpack_e2m1(q))
    else:
        values = q.float()
    factor = ue8m0_from_exponent(scales) if fmt.ue8m0 else scales.float()
    rows, cols = values.shape
    grouped = values.reshape(rows, cols // fmt.group_size, fmt.group_size) * factor.unsqueeze(-1)
    return grouped.reshape(rows, cols)


def shared_sf_row(token: torch.Tensor, shared_block_m: int) -> torch.Tensor:
    """Row of a token's scale in the BLOCK_M-paged, UTCCP-ordered shared-expert scale buffer."""
    m = token % shared_block_m
    page = -(-shared_block_m // 128) * 128
    return token // shared_block_m * page + m // 128 * 128 + m % 32 * 4 + m % 128 // 32


def _byte_rows(buf: torch.Tensor, bytes_per_row: int) -> torch.Tensor:
    """A uint8 ``[rows, bytes_per_row]`` view of a contiguous buffer's storage."""
    if not buf.is_contiguous():
        raise ValueError(f"buffer must be contiguous, got strides {tuple(buf.stride())}")
    flat = buf.view(torch.uint8).reshape(-1)
    return flat[: flat.numel() // bytes_per_row * bytes_per_row].view(-1, bytes_per_row)


def pre_dispatch_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    buf_x: torch.Tensor,
    buf_x_sf: torch.Tensor,
    buf_topk_idx: torch.Tensor,
    buf_topk_weights: torch.Tensor,
    *,
    variant: str,
    routed_scaling_factor: float = 1.0,
    shared_x_sf: torch.Tensor | None = None,
    shared_block_m: int = 0,
) -> None:
    """Write the symmetric buffer's input slots as the host's pre-dispatch kernels do (torch)."""
    fmt = act_format(variant)
    num_tokens, hidden = x.shape
    groups = hidden // fmt.group_size
    if num_tokens:
        q, scales = quantize_activations(x, variant)
        _byte_rows(buf_x, hidden // fmt.bytes_per_row)[:num_tokens] = q.view(torch.uint8)
        if fmt.ue8m0:
            if buf_x_sf.stride(-1) != 1:
                raise ValueError("x_sf must have unit stride along its last dimension")
            row_bytes = buf_x_sf.stride(0) * buf_x_sf.element_size()
            raw = torch.as_strided(buf_x_sf.view(torch.uint8), (buf_x_sf.shape[0], groups), (row_bytes, 1))
            raw[:num_tokens] = scales.to(torch.uint8)
            if shared_x_sf is not None:
                _write_shared_sf(shared_x_sf, scales, shared_block_m)
        else:
            buf_x_sf[:num_tokens, :groups] = scales
        ids = topk_ids.to(torch.int64)
        weights = topk_weights.to(torch.float32)
        if routed_scaling_factor != 1.0:
            weights = weights * routed_scaling_factor
        buf_topk_idx[:num_tokens] = ids
        buf_topk_weights[:num_tokens] = weights
    buf_topk_idx[num_tokens:] = -1
    buf_topk_weights[num_tokens:] = 0.0


def _write_shared_sf(shared_x_sf: torch.Tensor, exponents: torch.Tensor, shared_block_m: int) -> None:
    if shared_block_m <= 0:
        raise ValueError("shared_block_m must be positive when shared_x_sf is given")
    tokens, groups = exponents.shape
    rows = shared_sf_row(torch.arange(tokens, device=exponents.device), shared_block_m)
    col_stride = shared_x_sf.stride(1)
    flat = torch.as_strided(
        shared_x_sf, (shared_x_sf.untyped_storage().nbytes() // 4,), (1,), shared_x_sf.storage_offset()
    )
    raw = flat.view(torch.uint8)
    g = torch.arange(groups, device=exponents.device)
    offsets = (rows[:, None] + (g // 4)[None, :] * col_stride) * 4 + (g % 4)[None, :]
    raw[offsets.reshape(-1)] = exponents.to(torch.uint8).reshape(-1)


# -- weight layouts ---------------------------------------------------------------------------------


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
    e, n, k = data.shape
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
