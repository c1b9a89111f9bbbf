"""Op ``silu_mul_quant_contig``: SwiGLU then per-token-group FP8 e4m3 quantization over contiguous rows.

The activation step between the two grouped GEMMs of SGLang's DeepGEMM **contiguous** (compact) runner
(``DeepGemmRunnerCore._run_contiguous_gemm``: the compact layout of SGLang 0.5.20+, and DeepEP normal
dispatch). It computes what :mod:`.silu_mul_quant` computes, over rows that are not grouped by expert:

- ``gateup`` bf16 ``[M, 2D]``: M rows (every expert's rows, each expert padded to DeepGEMM's contiguous
  alignment; padding rows hold whatever the first GEMM left there). Without ``swizzle`` the gate is
  ``[:, :D]`` and up ``[:, D:]``; with ``swizzle`` (gran-8 interleave) every 16 columns are
  ``gate[8] up[8]``.
- ``out`` float8_e4m3fn ``[M, D]``, contiguous.
- ``scale`` per (row, group of ``group_size`` columns), G = D // group_size, in one of the two layouts the
  host allocates there (``create_per_token_group_quant_fp8_output_scale`` with every flag equal to
  DeepGEMM's UE8M0 mode):

  ============== ======= ================== ==========================================
  scale_layout   dtype   shape              strides (Ma = M rounded up to 4)
  ============== ======= ================== ==========================================
  row_major      fp32    [M, G]             contiguous (G, 1)
  ue8m0_packed   int32   [M, ceil(G/4)]     (1, Ma): the transpose of ``[ceil(G/4), Ma]``; group 4k+j in byte j
  ============== ======= ================== ==========================================

The row count M is a property of the call, not of the shape key: one key serves every batch of a layer.
Every row is computed (the op has no mask; the host's padding rows are computed like the others and
ignored downstream).

Numerics (those of :mod:`.silu_mul_quant`): gate clamped to ``<= L`` and up to ``[-L, L]`` in bf16 when
``swiglu_limit`` is set; SiLU and product in fp32; absmax per group floored at 1e-10;
``scale = absmax / 448``, with UE8M0 rounded up to a power of two; values multiplied by ``1 / scale`` and
saturated to +-448; the same non-finite policy. ``keep_fp32``: the caller requires the product in fp32.
Without it a plugin may round the product to bf16 before quantizing, as SGLang's two-kernel sequence
(``silu_and_mul`` into a bf16 buffer, then ``sglang_per_token_group_quant_fp8``) does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import InvalidArgumentError, OutputValidationError
from ..hardware import Platform, platform_of
from ..lazy import lazy_module
from .base import OpSpec, activation_describe, check_activation, check_output_devices

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "OP",
    "GROUP_SIZES",
    "SCALE_LAYOUTS",
    "ContigScaleLayout",
    "ContigShape",
    "ContigConfig",
    "ContigInputs",
    "ContigOutputs",
    "describe",
    "allocate_outputs",
    "output_allocator",
    "validate_outputs",
    "expected_scale_strides",
    "scale_to_float",
    "dequantize",
    "SPEC",
]

OP = "silu_mul_quant_contig"
GROUP_SIZES = (16, 32, 64, 128, 256)
SCALE_LAYOUTS = ("row_major", "ue8m0_packed")
ContigScaleLayout = Literal["row_major", "ue8m0_packed"]


@dataclass(frozen=True)
class ContigShape:
    """Sizes of one shape key (no row count: that is the call's). Hashable."""

    hidden: int  # D, output columns (input has 2D)
    group_size: int

    @property
    def num_groups(self) -> int:
        return self.hidden // self.group_size

    @property
    def packed_groups(self) -> int:
        return (self.num_groups + 3) // 4

    def describe(self) -> str:
        return f"D={self.hidden} group={self.group_size}"


@dataclass(frozen=True)
class ContigConfig:
    """Numerics and layout requested by the call, and where it runs. Hashable."""

    platform: Platform = Platform()
    swiglu_limit: float | None = None
    swizzle: bool = False
    scale_layout: ContigScaleLayout = "row_major"
    #: The caller requires the SiLU * up product in fp32 (no bf16 rounding before quantization).
    keep_fp32: bool = False

    @property
    def scale_ue8m0(self) -> bool:
        return self.scale_layout == "ue8m0_packed"

    def describe(self) -> str:
        return activation_describe(self.platform, self.scale_layout, self.swiglu_limit, self.swizzle, self.keep_fp32)


@dataclass(frozen=True, eq=False)
class ContigInputs:
    gateup: torch.Tensor
    #: The caller lets plugins overwrite ``gateup`` (the host's GEMM output, dead after this call).
    gateup_writable: bool = False

    @property
    def device(self) -> torch.device:
        return self.gateup.device

    @property
    def rows(self) -> int:
        """M, this call's row count."""
        return int(self.gateup.shape[0])


@dataclass(frozen=True, eq=False)
class ContigOutputs:
    out: torch.Tensor
    scale: torch.Tensor


def _bad(argument: str, value: object, allowed: str) -> InvalidArgumentError:
    return InvalidArgumentError(OP, argument, value, allowed)


def describe(
    gateup: torch.Tensor,
    *,
    group_size: int,
    swiglu_limit: float | None = None,
    swizzle: bool = False,
    scale_layout: ContigScaleLayout = "row_major",
    keep_fp32: bool = False,
) -> tuple[ContigShape, ContigConfig]:
    """Validate a call's arguments and build its shape and config (reads no tensor data)."""
    if not isinstance(gateup, torch.Tensor):
        raise _bad("gateup", type(gateup).__name__, "a torch.Tensor")
    if gateup.dtype != torch.bfloat16:
        raise _bad("gateup.dtype", gateup.dtype, "torch.bfloat16")
    if gateup.dim() != 2:
        raise _bad("gateup.shape", tuple(gateup.shape), "2 dimensions [M, 2*D]")
    rows, two_d = gateup.shape
    if two_d % 2 != 0 or two_d == 0:
        raise _bad("gateup.shape[1]", two_d, "a positive even number 2*D")
    if rows > 1 and tuple(gateup.stride()) != (two_d, 1):
        raise _bad("gateup.stride()", tuple(gateup.stride()), f"contiguous strides {(two_d, 1)}")
    hidden = two_d // 2
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size not in GROUP_SIZES:
        raise _bad("group_size", group_size, f"one of {GROUP_SIZES}")
    if hidden % group_size != 0:
        raise _bad("gateup.shape[1] // 2 (D)", hidden, f"a multiple of group_size={group_size}")
    swiglu_limit = check_activation(OP, swiglu_limit, swizzle, keep_fp32)
    if swizzle and hidden % 8 != 0:
        raise _bad("gateup.shape[1] // 2 (D)", hidden, "a multiple of 8 with swizzle (gran-8 interleave)")
    if scale_layout not in SCALE_LAYOUTS:
        raise _bad("scale_layout", scale_layout, f"one of {SCALE_LAYOUTS}")
    shape = ContigShape(hidden, group_size)
    config = ContigConfig(
        platform=platform_of(gateup),
        swiglu_limit=swiglu_limit,
        swizzle=bool(swizzle),
        scale_layout=scale_layout,
        keep_fp32=bool(keep_fp32),
    )
    return shape, config


def expected_scale_strides(
    shape: ContigShape, config: ContigConfig, rows: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, strides)`` of the scale tensor of a call of ``rows`` rows in this layout."""
    if config.scale_layout == "row_major":
        return (rows, shape.num_groups), (shape.num_groups, 1)
    return (rows, shape.packed_groups), (1, (rows + 3) // 4 * 4)


def output_allocator(shape: ContigShape, config: ContigConfig) -> Callable[..., ContigOutputs]:
    """``allocate(device, rows=M) -> outputs``: dtypes worked out once per shape key; the row count is
    the call's (the hooked path never allocates: SGLang passes its own buffers)."""
    scale_dtype = torch.int32 if config.scale_ue8m0 else torch.float32
    hidden, packed, groups, ue8m0 = shape.hidden, shape.packed_groups, shape.num_groups, config.scale_ue8m0
    empty, fp8 = torch.empty, torch.float8_e4m3fn

    def allocate(device: torch.device, rows: int | None = None) -> ContigOutputs:
        if rows is None or isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise _bad("rows", rows, "the call's row count M (int >= 0); the shape key holds no row count")
        out = empty((rows, hidden), dtype=fp8, device=device)
        if ue8m0:
            # As the host allocates it: [ceil(G/4), Ma] int32, transposed, sliced to M rows.
            scale = empty((packed, (rows + 3) // 4 * 4), dtype=scale_dtype, device=device).t()[:rows]
        else:
            scale = empty((rows, groups), dtype=scale_dtype, device=device)
        return ContigOutputs(out, scale)

    return allocate


def allocate_outputs(
    shape: ContigShape, config: ContigConfig, device: torch.device, rows: int | None = None
) -> ContigOutputs:
    """Empty outputs of ``rows`` rows in the layout the config asks for (``rows`` is required)."""
    return output_allocator(shape, config)(device, rows)


def validate_outputs(
    outputs: ContigOutputs,
    shape: ContigShape,
    config: ContigConfig,
    plugin: str | None = None,
    inputs: ContigInputs | None = None,
) -> None:
    """Check types, dtypes, devices, shapes and strides (metadata only; no device sync). The row count
    is the call's: checked against ``inputs`` when given, else only the widths are."""
    who = f"plugin {plugin!r}" if plugin else OP

    def fail(what: str, got: object, want: object) -> OutputValidationError:
        return OutputValidationError(f"{who} returned {what}={got}, the host requires {want}")

    if not isinstance(outputs, ContigOutputs):
        raise fail("outputs of type", type(outputs).__name__, "ContigOutputs")
    out, scale = outputs.out, outputs.scale
    for name, tensor in (("out", out), ("scale", scale)):
        if not isinstance(tensor, torch.Tensor):
            raise fail(name, type(tensor).__name__, "a torch.Tensor")
    rows = inputs.rows if inputs is not None else int(out.shape[0]) if out.dim() == 2 else -1
    check_output_devices(
        fail, (("out", out), ("scale", scale)), None if inputs is None else inputs.device, config.platform, "gateup"
    )
    if out.dtype != torch.float8_e4m3fn:
        raise fail("out.dtype", out.dtype, torch.float8_e4m3fn)
    if tuple(out.shape) != (rows, shape.hidden):
        raise fail("out.shape", tuple(out.shape), (rows, shape.hidden))
    if out.numel() and not out.is_contiguous():
        raise fail("out.stride()", tuple(out.stride()), "contiguous")
    sizes, strides = expected_scale_strides(shape, config, rows)
    dtype = torch.int32 if config.scale_ue8m0 else torch.float32
    if scale.dtype != dtype:
        raise fail("scale.dtype", scale.dtype, f"{dtype} for scale_layout={config.scale_layout!r}")
    if tuple(scale.shape) != sizes:
        raise fail("scale.shape", tuple(scale.shape), sizes)
    significant = tuple(None if s == 1 else st for s, st in zip(sizes, scale.stride()))
    if scale.numel() and significant != tuple(None if s == 1 else st for s, st in zip(sizes, strides)):
        raise fail("scale.stride()", tuple(scale.stride()), f"{strides} for scale_layout={config.scale_layout!r}")


def scale_to_float(scale: torch.Tensor, shape: ContigShape, config: ContigConfig) -> torch.Tensor:
    """Scales as fp32 ``[M, G]`` whatever the layout (unpacks UE8M0)."""
    if not config.scale_ue8m0:
        return scale.float()
    from ..quant import ue8m0_from_exponent, unpack_ue8m0_bytes

    return ue8m0_from_exponent(unpack_ue8m0_bytes(scale.contiguous(), shape.num_groups))


def dequantize(outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> torch.Tensor:
    """fp32 ``[M, D]``: ``out * scale`` per group."""
    scales = scale_to_float(outputs.scale, shape, config)
    rows = outputs.out.shape[0]
    grouped = outputs.out.float().reshape(rows, shape.num_groups, shape.group_size)
    return (grouped * scales.unsqueeze(-1)).reshape(rows, shape.hidden)


SPEC = OpSpec(
    name=OP,
    allocate_outputs=allocate_outputs,
    validate_outputs=validate_outputs,
    output_allocator=output_allocator,
    shape_type=ContigShape,
    output_type=ContigOutputs,
    writable_inputs=(("gateup", "gateup_writable"),),
    conformance="sglang_moe_plugins.testing.ops.silu_mul_quant_contig:ContigConformance",
)
