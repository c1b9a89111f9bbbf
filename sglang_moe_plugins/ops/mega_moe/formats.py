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
``build_mega_moe_experts_weights`` / ``build_sm90_mega_moe_experts_weights``) are defined in
:mod:`.weights` and public here: see :func:`encode_fp4_weights`, :func:`decode_fp4_weights`,
:func:`encode_fp8_block_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch

from ...quant import (
    FP8_E4M3_MAX,
    dequantize_e2m1,
    pack_e2m1,
    quantize_e2m1_groups,
    ue8m0_exponent,
    ue8m0_from_exponent,
    unpack_e2m1,
)
from .weights import (
    decode_expert_weights,
    decode_fp4_weights,
    decode_fp8_block_weights,
    decode_fp8_shared_weights,
    deinterleave_gate_up,
    encode_fp4_weights,
    encode_fp8_block_weights,
    encode_fp8_shared_weights,
    interleave_gate_up,
    pack_ue8m0_mn_major,
    unpack_ue8m0_packed,
    utccp_transpose,
    utccp_untranspose,
)

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
        ids = cast("torch.Tensor", topk_ids).to(torch.int64)  # present when num_tokens > 0
        weights = cast("torch.Tensor", topk_weights).to(torch.float32)
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
