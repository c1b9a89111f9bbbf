"""Op ``silu_mul_quant``: masked SwiGLU then per-token-group FP8 e4m3 quantization.

The step between the two grouped GEMMs of SGLang's DeepGEMM masked runner
(``_varlen_deep_gemm_silu_mul_quant``). Inputs, outputs and layouts are the host's:

- ``gateup`` bf16 ``[E, N, 2D]``: E local experts, N padded rows per expert; only the first
  ``masked_m[e]`` rows of expert e are real. Without ``swizzle`` the gate is ``[..., :D]`` and
  up ``[..., D:]``; with ``swizzle`` (gran-8 interleave) every 16 columns are ``gate[8] up[8]``.
- ``out`` float8_e4m3fn ``[E, N, D]``.
- ``scale`` per (row, group of ``group_size`` columns), G = D // group_size, in one of three layouts:

  ============== ======= =============== ===========================================
  scale_layout   dtype   shape           strides (Na = N rounded up to 4)
  ============== ======= =============== ===========================================
  row_major      fp32    [E, N, G]       contiguous
  column_major   fp32    [E, N, G]       (G * Na, 1, Na)   (TMA-aligned, per expert)
  ue8m0_packed   int32   [E, N, ceil(G/4)] (ceil(G/4) * Na, 1, Na); group 4k+j in byte j
  ============== ======= =============== ===========================================

Numerics: gate clamped to ``<= L`` and up to ``[-L, L]`` in bf16 when ``swiglu_limit`` is set;
SiLU and product in fp32; absmax per group floored at 1e-10; ``scale = absmax / 448``, with UE8M0
rounded up to a power of two; values multiplied by ``1 / scale`` and saturated to +-448.
Rows past ``masked_m[e]`` are padding: their contents are unspecified.

Results defined for data that :func:`describe` cannot check without a host sync (docs/reliability.md):

- ``masked_m[e]`` is clamped to ``[0, N]``: a count above N makes all N rows real, a negative count
  none. Every plugin must clamp (never read or write past row N).
- Non-finite values: ``v = silu(gate) * up`` is evaluated in IEEE fp32 after the clamp (which keeps
  NaN). In each group NaN is left out of the absmax and quantizes to NaN (that element only); +-Inf,
  and products that overflow fp32 (finite but huge inputs), count as +-FLT_MAX and saturate to +-448.
  Scales are always finite and positive, and finite inputs never give NaN. IEEE gives NaN for NaN
  in gate or up, ``gate = -Inf`` (``-Inf * sigmoid(-Inf) = -Inf * 0``), and ``Inf * 0`` products.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import InvalidArgumentError, OutputValidationError
from ..hardware import Platform, platform_of
from ..lazy import lazy_module
from .base import BF16_MIN_NORMAL, OpSpec, activation_describe, check_activation, check_output_devices, finite_float

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "OP",
    "BF16_MIN_NORMAL",
    "GROUP_SIZES",
    "SCALE_LAYOUTS",
    "ScaleLayout",
    "SiluMulQuantShape",
    "SiluMulQuantConfig",
    "SiluMulQuantInputs",
    "SiluMulQuantOutputs",
    "describe",
    "allocate_outputs",
    "output_allocator",
    "validate_outputs",
    "expected_scale_strides",
    "finite_float",
    "scale_to_float",
    "dequantize",
    "real_rows",
    "split_gate_up",
    "SPEC",
]

OP = "silu_mul_quant"
GROUP_SIZES = (16, 32, 64, 128, 256)
SCALE_LAYOUTS = ("row_major", "column_major", "ue8m0_packed")
ScaleLayout = Literal["row_major", "column_major", "ue8m0_packed"]


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


@dataclass(frozen=True)
class SiluMulQuantShape:
    """Sizes of one call. Hashable; part of the selection key."""

    num_experts: int  # E
    max_rows: int  # N, padded rows per expert
    hidden: int  # D, output columns (input has 2D)
    group_size: int
    topk: int

    @property
    def num_groups(self) -> int:
        return self.hidden // self.group_size

    @property
    def packed_groups(self) -> int:
        return (self.num_groups + 3) // 4

    @property
    def aligned_rows(self) -> int:
        """N rounded up to 4: the token stride of column-major scales."""
        return _round_up(self.max_rows, 4)

    def describe(self) -> str:
        return f"E={self.num_experts} N={self.max_rows} D={self.hidden} group={self.group_size} topk={self.topk}"


@dataclass(frozen=True)
class SiluMulQuantConfig:
    """Numerics and layout requested by the call, and where it runs. Hashable."""

    platform: Platform = Platform()
    swiglu_limit: float | None = None
    swizzle: bool = False
    scale_layout: ScaleLayout = "column_major"
    #: The caller requires the SiLU * up product in fp32 (no bf16 rounding before quantization).
    keep_fp32: bool = False

    @property
    def scale_ue8m0(self) -> bool:
        return self.scale_layout == "ue8m0_packed"

    def describe(self) -> str:
        return activation_describe(self.platform, self.scale_layout, self.swiglu_limit, self.swizzle, self.keep_fp32)


@dataclass(frozen=True, eq=False)
class SiluMulQuantInputs:
    gateup: torch.Tensor
    masked_m: torch.Tensor
    #: Tokens on this rank before dispatch, when the host knows it (a scheduling hint only).
    num_real_tokens: int | None = None
    #: The caller lets plugins overwrite ``gateup`` (the host's GEMM workspace, dead after this call).
    gateup_writable: bool = False

    @property
    def device(self) -> torch.device:
        return self.gateup.device


@dataclass(frozen=True, eq=False)
class SiluMulQuantOutputs:
    out: torch.Tensor
    scale: torch.Tensor


def _bad(argument: str, value: object, allowed: str) -> InvalidArgumentError:
    return InvalidArgumentError(OP, argument, value, allowed)


def describe(
    gateup: torch.Tensor,
    masked_m: torch.Tensor,
    *,
    group_size: int,
    topk: int,
    swiglu_limit: float | None = None,
    swizzle: bool = False,
    scale_layout: ScaleLayout = "column_major",
    keep_fp32: bool = False,
) -> tuple[SiluMulQuantShape, SiluMulQuantConfig]:
    """Validate a call's arguments and build its shape and config (reads no tensor data)."""
    if not isinstance(gateup, torch.Tensor):
        raise _bad("gateup", type(gateup).__name__, "a torch.Tensor")
    if gateup.dtype != torch.bfloat16:
        raise _bad("gateup.dtype", gateup.dtype, "torch.bfloat16")
    if gateup.dim() != 3:
        raise _bad("gateup.shape", tuple(gateup.shape), "3 dimensions [E, N, 2*D]")
    num_experts, max_rows, two_d = gateup.shape
    if two_d % 2 != 0 or two_d == 0:
        raise _bad("gateup.shape[2]", two_d, "a positive even number 2*D")
    if not gateup.is_contiguous():
        raise _bad("gateup.stride()", tuple(gateup.stride()), f"contiguous strides {(max_rows * two_d, two_d, 1)}")
    hidden = two_d // 2
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise _bad("group_size", group_size, f"one of {GROUP_SIZES}")
    if hidden % group_size != 0:
        raise _bad("gateup.shape[2] // 2 (D)", hidden, f"a multiple of group_size={group_size}")
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise _bad("topk", topk, "an int >= 1")
    if not isinstance(masked_m, torch.Tensor):
        raise _bad("masked_m", type(masked_m).__name__, "a torch.Tensor")
    if masked_m.dtype != torch.int32:
        raise _bad("masked_m.dtype", masked_m.dtype, "torch.int32")
    if tuple(masked_m.shape) != (num_experts,):
        raise _bad("masked_m.shape", tuple(masked_m.shape), f"({num_experts},) (one count per expert)")
    if num_experts > 1 and masked_m.stride(0) != 1:
        raise _bad(
            "masked_m.stride()", tuple(masked_m.stride()), "(1,) (contiguous; kernels read masked_m[e] at offset e)"
        )
    if masked_m.device != gateup.device:
        raise _bad("masked_m.device", masked_m.device, f"the device of gateup ({gateup.device})")
    swiglu_limit = check_activation(OP, swiglu_limit, swizzle, keep_fp32)
    if scale_layout not in SCALE_LAYOUTS:
        raise _bad("scale_layout", scale_layout, f"one of {SCALE_LAYOUTS}")
    shape = SiluMulQuantShape(num_experts, max_rows, hidden, group_size, topk)
    config = SiluMulQuantConfig(
        platform=platform_of(gateup),
        swiglu_limit=swiglu_limit,
        swizzle=bool(swizzle),
        scale_layout=scale_layout,
        keep_fp32=bool(keep_fp32),
    )
    return shape, config


def expected_scale_strides(
    shape: SiluMulQuantShape, config: SiluMulQuantConfig
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, strides)`` of the scale tensor for this layout."""
    e, n, g = shape.num_experts, shape.max_rows, shape.num_groups
    na = shape.aligned_rows
    if config.scale_layout == "row_major":
        return (e, n, g), (n * g, g, 1)
    if config.scale_layout == "column_major":
        return (e, n, g), (g * na, 1, na)
    gp = shape.packed_groups
    return (e, n, gp), (gp * na, 1, na)


def output_allocator(
    shape: SiluMulQuantShape, config: SiluMulQuantConfig
) -> Callable[[torch.device], SiluMulQuantOutputs]:
    """``allocate(device) -> outputs``: sizes, strides and dtypes worked out now, once per shape key;
    each call of ``allocate`` only makes the two empty tensors."""
    out_size = (shape.num_experts, shape.max_rows, shape.hidden)
    sizes, strides = expected_scale_strides(shape, config)
    scale_dtype = torch.int32 if config.scale_ue8m0 else torch.float32
    empty, empty_strided, fp8 = torch.empty, torch.empty_strided, torch.float8_e4m3fn

    def allocate(device: torch.device) -> SiluMulQuantOutputs:
        # empty_strided sizes the storage for the strided view (column-major layouts pad N to Na).
        return SiluMulQuantOutputs(
            empty(out_size, dtype=fp8, device=device), empty_strided(sizes, strides, dtype=scale_dtype, device=device)
        )

    return allocate


def allocate_outputs(shape: SiluMulQuantShape, config: SiluMulQuantConfig, device: torch.device) -> SiluMulQuantOutputs:
    """Empty outputs in the layout the config asks for."""
    return output_allocator(shape, config)(device)


def validate_outputs(
    outputs: SiluMulQuantOutputs,
    shape: SiluMulQuantShape,
    config: SiluMulQuantConfig,
    plugin: str | None = None,
    inputs: SiluMulQuantInputs | None = None,
) -> None:
    """Check devices, dtypes, shapes and strides (metadata only; no device sync). The shape key fixes every
    size; ``inputs`` gives the device the outputs must be on (without them: the config's platform's type)."""
    who = f"plugin {plugin!r}" if plugin else OP

    def fail(what: str, got: object, want: object) -> OutputValidationError:
        return OutputValidationError(f"{who} returned {what}={got}, the host requires {want}")

    if not isinstance(outputs, SiluMulQuantOutputs):
        raise fail("outputs of type", type(outputs).__name__, "SiluMulQuantOutputs")
    out, scale = outputs.out, outputs.scale
    for name, tensor in (("out", out), ("scale", scale)):
        if not isinstance(tensor, torch.Tensor):
            raise fail(name, type(tensor).__name__, "a torch.Tensor")
    check_output_devices(
        fail, (("out", out), ("scale", scale)), None if inputs is None else inputs.device, config.platform, "gateup"
    )
    want_out = (shape.num_experts, shape.max_rows, shape.hidden)
    if out.dtype != torch.float8_e4m3fn:
        raise fail("out.dtype", out.dtype, torch.float8_e4m3fn)
    if tuple(out.shape) != want_out:
        raise fail("out.shape", tuple(out.shape), want_out)
    if out.numel() and not out.is_contiguous():
        raise fail("out.stride()", tuple(out.stride()), "contiguous")
    sizes, strides = expected_scale_strides(shape, config)
    dtype = torch.int32 if config.scale_ue8m0 else torch.float32
    if scale.dtype != dtype:
        raise fail("scale.dtype", scale.dtype, f"{dtype} for scale_layout={config.scale_layout!r}")
    if tuple(scale.shape) != sizes:
        raise fail("scale.shape", tuple(scale.shape), sizes)
    if scale.numel() and _significant_strides(scale.shape, scale.stride()) != _significant_strides(sizes, strides):
        raise fail("scale.stride()", tuple(scale.stride()), f"{strides} for scale_layout={config.scale_layout!r}")


def _significant_strides(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int | None, ...]:
    # A stride of a size-1 dimension is irrelevant to the memory layout.
    return tuple(None if s == 1 else st for s, st in zip(sizes, strides))


def real_rows(masked_m: torch.Tensor, max_rows: int) -> torch.Tensor:
    """Bool ``[E, N]``: which rows are real (reads masked_m: for references and tests only)."""
    rows = torch.arange(max_rows, device=masked_m.device)
    return rows.unsqueeze(0) < masked_m.to(torch.int64).clamp(0, max_rows).unsqueeze(1)


def split_gate_up(gateup: torch.Tensor, swizzle: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and up halves ``[..., D]`` of ``gateup [..., 2D]`` (natural or gran-8 interleaved)."""
    two_d = gateup.shape[-1]
    if not swizzle:
        return gateup[..., : two_d // 2], gateup[..., two_d // 2 :]
    chunks = gateup.reshape(*gateup.shape[:-1], two_d // 16, 2, 8)
    return chunks[..., 0, :].reshape(*gateup.shape[:-1], two_d // 2), chunks[..., 1, :].reshape(
        *gateup.shape[:-1], two_d // 2
    )


def scale_to_float(scale: torch.Tensor, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> torch.Tensor:
    """Scales as fp32 ``[E, N, G]`` whatever the layout (unpacks UE8M0)."""
    if not config.scale_ue8m0:
        return scale.float()
    from ..quant import ue8m0_from_exponent, unpack_ue8m0_bytes

    return ue8m0_from_exponent(unpack_ue8m0_bytes(scale.contiguous(), shape.num_groups))


def dequantize(outputs: SiluMulQuantOutputs, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> torch.Tensor:
    """fp32 ``[E, N, D]``: ``out * scale`` per group."""
    scales = scale_to_float(outputs.scale, shape, config)
    e, n, d = shape.num_experts, shape.max_rows, shape.hidden
    grouped = outputs.out.float().reshape(e, n, shape.num_groups, shape.group_size)
    return (grouped * scales.unsqueeze(-1)).reshape(e, n, d)


SPEC = OpSpec(
    name=OP,
    allocate_outputs=allocate_outputs,
    validate_outputs=validate_outputs,
    output_allocator=output_allocator,
    shape_type=SiluMulQuantShape,
    output_type=SiluMulQuantOutputs,
    writable_inputs=(("gateup", "gateup_writable"),),
    conformance="sglang_moe_plugins.testing.ops.silu_mul_quant:SiluMulQuantConformance",
)
