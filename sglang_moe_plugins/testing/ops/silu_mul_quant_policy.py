"""The tolerance policy of op ``silu_mul_quant``, checked against an independent fp64 computation. The
conformance adapter is :mod:`.silu_mul_quant` (which re-exports these names); the cases and their inputs
are drawn by :mod:`.silu_mul_quant_cases`.

This module is the single source of the policy; the conformance suite and this project's own tests
use it. A plugin's output passes when, for every real row (``row < masked_m[expert]``):

1. **Written.** Outputs are poisoned before the plugin runs (``testing.case.poison``: fp8 bytes ``0x7F``,
   which is NaN in float8_e4m3fn; fp32 scales NaN; packed UE8M0 scales ``-1``, byte ``0xFF`` being NaN in
   UE8M0). No poison may survive in a real row. Padding rows are unspecified and never read.
2. **Scales.** fp32 scales within a relative ``scale_rtol`` (1e-6) of the fp64 value
   ``max(absmax, 1e-10) / 448``; UE8M0 scales exactly the power of two ``2 ** ceil(log2(...))``.
3. **Values.** Each dequantized value ``q * scale`` within half an fp8 e4m3 step of the fp64 value:
   ``max(|v| * 2**-4, scale * 2**-10)`` (the second term is the subnormal step), times 1 + 1e-5.

**Fast exponentials.** A kernel may evaluate ``e^-g`` as ``ex2.approx(g * fp32(log2 e))`` (CUDA's
``__expf``, SGLang's kernel, the ``triton`` plugin). The rounded argument and the rounded constant cost
a relative error of up to about ``1.22 * 2^-24 * |g|`` where the gate ``g`` is negative
(``silu(g) ~ g * e^g``): up to ~4e-6 near g = -45 to -88. The policy allows ``2^-23 * min(-g, 88)``
(``Tolerance.fast_exp``, on by default) on each value with a negative gate. A group's scale may then
lie anywhere between the largest value of the group shrunk and grown by its own allowance. So only a
group whose largest value comes from a negative gate gets a noticeable allowance: 1.2e-6 at g = -10,
at most 1.05e-5.

The fp64 computation follows the op's documented numerics: ``swiglu_limit`` rounded to bf16 and
applied to the bf16 inputs (``gate <= L``, ``-L <= up <= L``), ``silu(gate) * up``, per-group absmax.

**Intermediates rounded to bf16.** A call without ``keep_fp32`` lets a plugin round ``silu(gate)`` and
the product to bf16 before quantizing (SGLang's ``per_token_group_quant`` does). :func:`tolerance_for`
then allows a relative error of ``2**-7`` on the values before quantization (two bf16 roundings are at
most ``2**-8``; the margin covers the fp32 arithmetic around them): fp32 scales within ``2**-7``, UE8M0
scales any power of two between the bounds the perturbed absmax allows, values within half an fp8
step plus ``2**-7 * |v|``. With ``keep_fp32`` the strict policy applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import MoEPluginsError
from ...ops import silu_mul_quant as smq

__all__ = [
    "Tolerance",
    "STRICT",
    "EXACT",
    "BF16_INTERMEDIATES",
    "tolerance_for",
    "ToleranceError",
    "NumericsResult",
    "fp64_expected",
    "find_unwritten",
    "compare_with_fp64",
    "check_against_fp64",
]

_HALF_FP8_STEP = 2.0**-4  # e4m3 has 3 mantissa bits: half a step is 2**-4 of the value
_HALF_FP8_SUBNORMAL_STEP = 2.0**-10  # subnormal step 2**-9 (in units of the scale), half of it
_ARITHMETIC_SLACK = 1e-5


@dataclass(frozen=True)
class Tolerance:
    """How far a plugin's output may be from the fp64 values (see the module docstring)."""

    #: Relative tolerance of fp32 scales.
    scale_rtol: float = 1e-6
    #: Multiplies the value bound (1.0 = half an fp8 step).
    value_slack: float = 1.0
    #: Relative error allowed on the values before quantization (0: fp32 intermediates).
    intermediate_rtol: float = 0.0
    #: Allow the argument rounding of a fast exponential (see the module docstring).
    fast_exp: bool = True

    def describe(self) -> str:
        ue8m0 = "UE8M0 exact" if not (self.intermediate_rtol or self.fast_exp) else "UE8M0 within the same allowances"
        text = f"scales rtol {self.scale_rtol:g} ({ue8m0}), values within {self.value_slack:g} x half an fp8 step"
        if self.intermediate_rtol:
            text += f", intermediates may be rounded (rtol {self.intermediate_rtol:g})"
        if self.fast_exp:
            text += ", plus a fast exp's argument rounding (2^-23 x |gate| for negative gates)"
        return text


#: fp32 intermediates: the op's documented numerics.
STRICT = Tolerance()
#: The strict policy without the fast-exp allowance: what an IEEE implementation (the reference) meets.
EXACT = Tolerance(fast_exp=False)
#: The call lets plugins round SiLU and the product to bf16 (``keep_fp32=False``).
BF16_INTERMEDIATES = Tolerance(scale_rtol=2.0**-7, intermediate_rtol=2.0**-7)


def tolerance_for(config: smq.SiluMulQuantConfig) -> Tolerance:
    """The policy a call's config asks for: strict with ``keep_fp32``, bf16 intermediates allowed otherwise."""
    return STRICT if config.keep_fp32 else BF16_INTERMEDIATES


class ToleranceError(MoEPluginsError, AssertionError):
    """An output is outside the tolerance policy (an AssertionError, so pytest shows it as a failure)."""


@dataclass(frozen=True)
class NumericsResult:
    """Outcome of a comparison. ``message`` names the first offending expert/row/group when not ``ok``."""

    ok: bool
    message: str
    #: Largest value error as a fraction of its bound (<= 1 passes).
    worst_value_ratio: float = 0.0
    #: Largest relative scale error (fp32 scales) or 0/1 (UE8M0: 1 when some scale differs).
    worst_scale_error: float = 0.0

    def __bool__(self) -> bool:
        return self.ok


def _bf16(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).double())


def _gate_up(gateup: torch.Tensor, swizzle: bool, limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and up in fp64 ``[..., D]``, after the ``swiglu_limit`` clamp."""
    x = gateup.double()
    d = x.shape[-1] // 2
    if swizzle:
        chunks = x.reshape(*x.shape[:-1], d // 8, 2, 8)
        gate, up = chunks[..., 0, :].reshape(*x.shape[:-1], d), chunks[..., 1, :].reshape(*x.shape[:-1], d)
    else:
        gate, up = x[..., :d], x[..., d:]
    if limit is not None:  # the limit is applied in bf16, to bf16 inputs: exact in fp64
        bound = _bf16(limit)
        gate = gate.clamp(max=bound)
        up = up.clamp(-bound, bound)
    return gate, up


#: Allowed relative error of ``ex2.approx(g * fp32(log2 e))`` per unit of ``-g`` (see the docstring; the
#: error reaches about 1.22 * 2^-24 per unit).
_FAST_EXP_PER_UNIT = 2.0**-23
#: The allowance stops growing here: ``e^-g`` overflows fp32 just beyond (g < -88.72), where kernels
#: return 0 for ``silu(g)``.
_FAST_EXP_MAX_ARG = 88.0


def fp64_expected(
    gateup: torch.Tensor, swizzle: bool, limit: float | None, group: int, ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``[..., D]`` and scales ``[..., G]`` in fp64, computed independently of the package's kernels."""
    return _expected(*_gate_up(gateup, swizzle, limit), group, ue8m0)


def _expected(gate: torch.Tensor, up: torch.Tensor, group: int, ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    d = gate.shape[-1]
    v = gate * torch.sigmoid(gate) * up
    grouped = v.reshape(*v.shape[:-1], d // group, group)
    scale = grouped.abs().amax(-1).clamp_min(1e-10) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return v, scale


def _real_rows(inputs: smq.SiluMulQuantInputs, shape: smq.SiluMulQuantShape) -> torch.Tensor:
    return smq.real_rows(inputs.masked_m.cpu(), shape.max_rows)


def find_unwritten(
    inputs: smq.SiluMulQuantInputs,
    outputs: smq.SiluMulQuantOutputs,
    shape: smq.SiluMulQuantShape,
    config: smq.SiluMulQuantConfig,
) -> str | None:
    """None when every real row holds no poison (or NaN); else where the first poisoned value is."""
    if shape.num_experts == 0 or shape.max_rows == 0:
        return None
    real = _real_rows(inputs, shape)
    if not real.any():
        return None
    out = outputs.out.cpu()
    bad_out = torch.isnan(out.float()).any(-1) & real
    scale = outputs.scale.cpu()
    if config.scale_ue8m0:
        bytes_ = ((scale.to(torch.int64).unsqueeze(-1) >> torch.arange(0, 32, 8)) & 0xFF).reshape(*scale.shape[:-1], -1)
        bad_scale = (bytes_[..., : shape.num_groups] == 0xFF).any(-1) & real
    else:
        bad_scale = torch.isnan(scale.float()).any(-1) & real
    for what, bad in (("out", bad_out), ("scale", bad_scale)):
        if bad.any():
            e, r = (int(i) for i in bad.nonzero()[0])
            count = int(bad.sum())
            return (
                f"{what} of real row {r} of expert {e} (masked_m[{e}]={int(inputs.masked_m[e])}) still holds the "
                f"poison written before run(): {count} real row(s) not written"
            )
    return None


def compare_with_fp64(
    inputs: smq.SiluMulQuantInputs,
    outputs: smq.SiluMulQuantOutputs,
    shape: smq.SiluMulQuantShape,
    config: smq.SiluMulQuantConfig,
    tolerance: Tolerance = STRICT,
) -> NumericsResult:
    """Compare the real rows of ``outputs`` with the fp64 values under ``tolerance``."""
    if shape.num_experts == 0 or shape.max_rows == 0:
        return NumericsResult(True, "no rows")
    real = _real_rows(inputs, shape)
    if not real.any():
        return NumericsResult(True, "no real rows")
    index = real.nonzero()  # [R, 2] (expert, row)
    where = lambda i: f"expert {int(index[i, 0])} row {int(index[i, 1])}"  # noqa: E731
    gateup = inputs.gateup.cpu()[real]
    gate, up = _gate_up(gateup, config.swizzle, config.swiglu_limit)
    v, scale64 = _expected(gate, up, shape.group_size, config.scale_ue8m0)
    out = outputs.out.cpu()[real]
    got_scale = smq.scale_to_float(outputs.scale.cpu(), shape, config)[real].double()
    if torch.isnan(out.float()).any() or torch.isnan(got_scale).any():
        bad = (torch.isnan(out.float()).any(-1) | torch.isnan(got_scale).any(-1)).nonzero()[0, 0]
        return NumericsResult(False, f"NaN in the output of real {where(bad)}", float("inf"), float("inf"))
    if not bool(torch.isfinite(gateup).all()):
        bad = (~torch.isfinite(gateup)).any(-1).nonzero()[0, 0]
        return NumericsResult(
            False,
            f"non-finite input in real {where(bad)}: this comparison covers finite inputs only (the op's "
            "non-finite policy has tests of its own)",
            float("inf"),
            float("inf"),
        )
    r = tolerance.intermediate_rtol
    # Relative allowance per value: rounded intermediates, and a fast exp's argument rounding for negative gates.
    fast = torch.zeros_like(v)
    if tolerance.fast_exp:
        fast = (-gate).clamp(0.0, _FAST_EXP_MAX_ARG) * _FAST_EXP_PER_UNIT
    # A plugin's absmax is max_i |v_i| (1 + d_i) with |d_i| <= allowance_i: the unrounded scale lies between
    # these two. With no allowance both are the exact scale before rounding.
    magnitude = v.abs().reshape(*v.shape[:-1], shape.num_groups, shape.group_size)

    def scale_bounds(allowance: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = allowance.reshape(magnitude.shape)
        return (
            (magnitude * (1 - a)).amax(-1).clamp_min(1e-10) / 448.0,
            (magnitude * (1 + a)).amax(-1).clamp_min(1e-10) / 448.0,
        )

    # Scales.
    if config.scale_ue8m0:
        lo, hi = scale_bounds(fast + r)  # exact equality when there is no allowance
        bad = (got_scale < torch.exp2(torch.ceil(torch.log2(lo)))) | (
            got_scale > torch.exp2(torch.ceil(torch.log2(hi)))
        )
        if bad.any():
            i, g = (int(x) for x in bad.nonzero()[0])
            return NumericsResult(
                False,
                f"UE8M0 scale of {where(i)} group {g} is {got_scale[i, g].item():g}, expected {scale64[i, g].item():g} "
                f"({int(bad.sum())} scale(s) differ; {tolerance.describe()})",
                0.0,
                1.0,
            )
        scale_err = 0.0
    else:
        rel = (got_scale - scale64).abs() / scale64
        lo, hi = scale_bounds(fast)
        rtol = max(tolerance.scale_rtol, r)  # around the floored scale too (all-zero groups)
        low, high = lo * (1 - rtol), hi * (1 + rtol)
        bad = (got_scale < low) | (got_scale > high)
        scale_err = float(rel.max())
        if bad.any():
            i, g = (int(x) for x in bad.nonzero()[0])
            return NumericsResult(
                False,
                f"fp32 scale of {where(i)} group {g} is {got_scale[i, g].item():.9g}, expected {scale64[i, g].item():.9g} "
                f"(relative error {rel[i, g].item():.3g}, allowed {low[i, g].item():.9g} .. {high[i, g].item():.9g}; "
                f"{int(bad.sum())} scale(s) off; {tolerance.describe()})",
                0.0,
                scale_err,
            )
    # Values.
    deq = (out.double().reshape(out.shape[0], shape.num_groups, shape.group_size) * got_scale.unsqueeze(-1)).reshape(
        out.shape
    )
    s = got_scale.repeat_interleave(shape.group_size, dim=-1)
    err = (deq - v).abs()
    bound = torch.maximum(v.abs() * _HALF_FP8_STEP, s * _HALF_FP8_SUBNORMAL_STEP) * (1 + _ARITHMETIC_SLACK)
    bound = (bound + v.abs() * (r * (1 + _HALF_FP8_STEP) + fast) + 1e-30) * tolerance.value_slack
    ratio = err / bound
    worst = float(ratio.max())
    if worst > 1.0:
        i, c = (int(x) for x in (ratio > 1.0).nonzero()[0])
        return NumericsResult(
            False,
            f"fp8 value of {where(i)} column {c} dequantizes to {deq[i, c].item():.6g}, expected {v[i, c].item():.6g} "
            f"(error {err[i, c].item():.3g} > bound {bound[i, c].item():.3g}; worst {worst:.3g} x the bound; "
            f"{int((ratio > 1.0).sum())} value(s) off; {tolerance.describe()})",
            worst,
            scale_err,
        )
    return NumericsResult(True, f"within tolerance (worst value {worst:.3g} x the bound)", worst, scale_err)


def check_against_fp64(
    inputs: smq.SiluMulQuantInputs,
    outputs: smq.SiluMulQuantOutputs,
    shape: smq.SiluMulQuantShape,
    config: smq.SiluMulQuantConfig,
    *,
    scale_rtol: float = STRICT.scale_rtol,
    value_slack: float = STRICT.value_slack,
    tolerance: Tolerance | None = None,
) -> None:
    """Raise :class:`ToleranceError` unless every real row is written and within the policy.

    ``tolerance`` defaults to the strict policy with the given ``scale_rtol`` and ``value_slack``.
    """
    tolerance = tolerance or Tolerance(scale_rtol=scale_rtol, value_slack=value_slack)
    unwritten = find_unwritten(inputs, outputs, shape, config)
    if unwritten is not None:
        raise ToleranceError(unwritten)
    result = compare_with_fp64(inputs, outputs, shape, config, tolerance)
    if not result.ok:
        raise ToleranceError(result.message)
