"""Torch numerics shared by the reference plugins: FP8 e4m3, UE8M0 scales, MXFP4 E2M1.

These mirror the device kernels bit for bit where the kernels are exact (power-of-two scales,
multiplication by the reciprocal scale, saturation to +-448) and are the oracle the tests use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_module

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "FP8_E4M3_MAX",
    "FP32_MAX",
    "FP4_E2M1_MAX",
    "ceil_to_ue8m0",
    "ue8m0_exponent",
    "ue8m0_from_exponent",
    "pack_ue8m0_bytes",
    "unpack_ue8m0_bytes",
    "quantize_fp8_groups",
    "quantize_e2m1",
    "quantize_e2m1_groups",
    "dequantize_e2m1",
    "pack_e2m1",
    "unpack_e2m1",
    "round_to_bf16",
]

FP8_E4M3_MAX = 448.0
#: Largest finite fp32 (what +-Inf counts as in an FP8 group's absmax).
FP32_MAX = (2.0 - 2.0**-23) * 2.0**127  # float(torch.finfo(torch.float32).max), exactly
FP4_E2M1_MAX = 6.0
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_to_bf16(value: float) -> float:
    """``value`` rounded to the nearest bf16, as a Python float (kernels clamp in bf16)."""
    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).float())


def ue8m0_exponent(scale: torch.Tensor) -> torch.Tensor:
    """Biased exponent (int32) of the smallest power of two >= ``scale`` (positive fp32)."""
    bits = scale.float().contiguous().view(torch.int32)
    return ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def ue8m0_from_exponent(exponent: torch.Tensor) -> torch.Tensor:
    """fp32 value ``2 ** (exponent - 127)`` from biased exponents."""
    return (exponent.to(torch.int32) << 23).view(torch.float32)


def ceil_to_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """Round positive fp32 scales up to a power of two."""
    return ue8m0_from_exponent(ue8m0_exponent(scale))


def pack_ue8m0_bytes(exponent: torch.Tensor) -> torch.Tensor:
    """Pack exponents ``[..., G]`` into int32 ``[..., ceil(G/4)]``: group 4k+j in byte j; pad bytes 0."""
    *lead, groups = exponent.shape
    packed_groups = (groups + 3) // 4
    raw = torch.zeros((*lead, packed_groups * 4), dtype=torch.uint8, device=exponent.device)
    raw[..., :groups] = exponent.to(torch.uint8)
    return raw.view(torch.int32)


def unpack_ue8m0_bytes(packed: torch.Tensor, groups: int) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0_bytes`: int32 ``[..., ceil(G/4)]`` -> int32 exponents ``[..., G]``."""
    shifts = torch.arange(0, 32, 8, dtype=torch.int32, device=packed.device)
    raw = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xFF  # [..., ceil(G/4), 4], any strides
    return raw.reshape(*packed.shape[:-1], packed.shape[-1] * 4)[..., :groups]


def quantize_fp8_groups(
    values: torch.Tensor, group_size: int, *, ue8m0: bool, absmax_floor: float = 1e-10
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group FP8 e4m3 quantization of fp32 ``values [R, D]``.

    Returns ``(q [R, D] float8_e4m3fn, scale [R, D // group_size] fp32)`` with
    ``scale = max(absmax, floor) / 448`` (rounded up to a power of two with ``ue8m0``) and
    ``q = sat(values * (1 / scale))``, the order of operations the kernels use.

    Non-finite values (docs/reliability.md, "Non-finite values"): NaN is left out of the absmax and
    quantizes to NaN (that element only); +-Inf counts as +-FLT_MAX in the absmax and saturates to
    +-448. The scale is therefore always finite and positive, and finite values never give NaN.
    """
    rows, cols = values.shape
    grouped = values.float().reshape(rows, cols // group_size, group_size)
    magnitude = grouped.abs()
    magnitude = torch.where(torch.isnan(magnitude), 0.0, magnitude.clamp(max=FP32_MAX))
    absmax = magnitude.amax(dim=-1).clamp_min(absmax_floor)
    # tensor / tensor: on CUDA, torch turns a division by a Python scalar into a multiplication by its
    # reciprocal, which is not the IEEE quotient the kernels compute
    scale = absmax / torch.full_like(absmax, FP8_E4M3_MAX)
    if ue8m0:
        scale = ceil_to_ue8m0(scale)
    inv = torch.ones_like(scale) / scale
    scaled = (grouped * inv.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return scaled.reshape(rows, cols).to(torch.float8_e4m3fn), scale


def quantize_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of fp32 ``x``: round to nearest, ties as sgl-deep-gemm
    does (midpoints 0.25, 1.25, 2.5, 5.0 go down; 0.75, 1.75, 3.5 go up), saturating at 6."""
    ax = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for boundary, round_up in zip(
        (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0), (False, True, False, True, False, True, False)
    ):
        code += (ax >= boundary if round_up else ax > boundary).to(torch.uint8)
    sign = (x < 0) & (code != 0)
    return code | (sign.to(torch.uint8) << 3)


def quantize_e2m1_groups(
    values: torch.Tensor, group_size: int, *, absmax_floor: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group MXFP4 quantization of ``values [R, D]`` as ``deep_gemm.utils.math.per_token_cast_to_fp4``
    (``use_ue8m0=True``) and sgl-deep-gemm's MXFP4 pre-dispatch kernel do it.

    ``scale = 2 ** ceil(log2(max(absmax, floor) / 6))`` (exponent clamped to [1, 254]),
    ``codes = e2m1(values * (1 / scale))``. Returns ``(codes [R, D] uint8, exponent [R, G] int32)``.
    """
    rows, cols = values.shape
    grouped = values.float().reshape(rows, cols // group_size, group_size)
    absmax = grouped.abs().amax(dim=-1).clamp_min(absmax_floor)
    # tensor / tensor: on CUDA, torch turns a division by a Python scalar into a multiplication by
    # its reciprocal, which is not the IEEE quotient the kernels compute
    exponent = ue8m0_exponent(absmax / torch.full_like(absmax, FP4_E2M1_MAX)).clamp(1, 254)
    scale = ue8m0_from_exponent(exponent)
    inv = torch.ones_like(scale) / scale
    codes = quantize_e2m1(grouped * inv.unsqueeze(-1))
    return codes.reshape(rows, cols), exponent


def dequantize_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of E2M1 codes (uint8)."""
    table = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=codes.device)
    codes = codes.to(torch.int64)
    mag = table[codes & 0x7]
    return torch.where((codes & 0x8) != 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last axis: even column in the low nibble."""
    return (codes[..., 0::2] & 0x0F) | ((codes[..., 1::2] & 0x0F) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1` (uint8 ``[..., K/2]`` -> uint8 codes ``[..., K]``)."""
    packed = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    out = torch.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=torch.uint8, device=packed.device)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = (packed >> 4) & 0x0F
    return out
