"""The conformance adapter of op ``silu_mul_quant_contig`` and its tolerance policy. The cases and their
inputs are drawn by :mod:`.silu_mul_quant_contig_cases`.

The numerics are those of ``silu_mul_quant`` over rows that are not grouped by expert, so the policy is
the masked op's, imported from :mod:`.silu_mul_quant` (one source): the comparison
(:func:`~.silu_mul_quant.compare_with_fp64`, run on the M rows seen as one expert whose rows are all
real), :class:`~.silu_mul_quant.Tolerance`, :data:`~.silu_mul_quant.STRICT`,
:data:`~.silu_mul_quant.BF16_INTERMEDIATES` and :func:`~.silu_mul_quant.tolerance_for`. A plugin's output
passes when, for **every** row (the op has no mask; M is the call's ``gateup.shape[0]``):

1. **Written.** Outputs are poisoned before the plugin runs (``testing.case.poison``: fp8 bytes ``0x7F``,
   NaN in float8_e4m3fn; fp32 scales NaN; packed UE8M0 scales ``-1``, byte ``0xFF`` being NaN in UE8M0).
   No poison may survive in any row.
2. **Scales and values** within the policy :func:`~.silu_mul_quant.tolerance_for` picks from the call's
   config:

   - ``keep_fp32=True``: ``STRICT``: fp32 scales within 1e-6 relative, UE8M0 scales identical, values
     within half an fp8 step (plus a fast exponential's argument rounding for negative gates).
   - ``keep_fp32=False``: ``BF16_INTERMEDIATES``: a relative error of 2^-7 on the values before
     quantization. A plugin may round the product to bf16 there (SGLang's two-kernel sequence does:
     ``silu_and_mul`` into a bf16 buffer, then ``sglang_per_token_group_quant_fp8``), as the masked op's
     ``fp8_fallback`` rounds SiLU to bf16 on the calls without ``keep_fp32``.

3. **Half an fp8 step, exactly** (``keep_fp32`` calls, on top of ``STRICT``; :func:`exact_step_violation`):
   each dequantized value within half the fp8 step of its own binade, ``2**(floor(log2|v / s|) - 4) * s``
   (``2**-10 * s`` below fp8's smallest normal), plus ``2**-20 * |v|`` for fp32 arithmetic and the fast-exp
   allowance. The masked policy's value bound, ``|v| * 2**-4``, is that step only at the bottom of a
   binade and up to twice it elsewhere, so with UE8M0 scales (powers of two, exact) it cannot see a
   product rounded to bf16; this bound sees it in about 1 value of 32 (a bf16 value landing on an fp8
   midpoint and tying away from the exact one), which is what the op's documented numerics say anyway.

So a plugin that rounds the product to bf16 (``contig_values(..., bf16_product=True)``) passes every call
without ``keep_fp32`` and fails the ``keep_fp32`` calls it accepts (every one in which the rounding
changes an output byte or a scale): it must decline them in ``supports()``. The failure then says so
first (:data:`BF16_ON_KEEP_FP32`).

The failure messages name the first offending row, group or column, and a cause the kit can tell:
a packed UE8M0 scale tensor written through row-major strides (:data:`SCALE_STRIDES`) instead of the
host's ``(1, Ma)``; a bf16 product on a ``keep_fp32`` call; and whether ``contig_reference`` passes
the same case.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import OutputValidationError
from ...hardware import Platform
from ...ops import silu_mul_quant as smq, silu_mul_quant_contig as contig
from ..case import FULL, SuiteCase, SuiteOptions, poison
from .silu_mul_quant import (
    _FAST_EXP_MAX_ARG,
    _FAST_EXP_PER_UNIT,
    BF16_INTERMEDIATES,
    NumericsResult,
    Tolerance,
    ToleranceError,
    _expected,
    _gate_up,
    compare_with_fp64,
    tolerance_for,
)
from .silu_mul_quant_contig_cases import case_elements, case_rows, draw_cases, make_fresh_inputs, make_inputs

__all__ = [
    "ContigConformance",
    "BF16_ON_KEEP_FP32",
    "SCALE_STRIDES",
    "find_unwritten",
    "exact_step_violation",
    "compare_contig_with_fp64",
    "check_contig_against_fp64",
]

#: The cause named first when a keep_fp32 call's output fails the strict policy but passes the bf16 one.
BF16_ON_KEEP_FP32 = (
    "keep_fp32: the output is within the bf16-product tolerance but not the strict one (the product was "
    "rounded to bf16?); a keep_fp32 call requires the fp32 product: compute it in fp32, or decline "
    "keep_fp32 calls in supports()"
)
#: The cause named first when packed UE8M0 scales read right through row-major strides.
SCALE_STRIDES = (
    "ue8m0_packed scales written through row-major strides {wrong}: the host's scale tensor [M, ceil(G/4)] "
    "has strides {want} (the transpose of a [ceil(G/4), Ma] buffer, Ma = M rounded up to 4): write through "
    "outputs.scale's own strides (copy_ honours them)"
)


def _masked_view(
    inputs: contig.ContigInputs, outputs: contig.ContigOutputs, shape: contig.ContigShape, config: contig.ContigConfig
) -> tuple[smq.SiluMulQuantInputs, smq.SiluMulQuantOutputs, smq.SiluMulQuantShape, smq.SiluMulQuantConfig]:
    """The call as a masked one of one expert whose M rows are all real (views, no copies of the tensors)."""
    rows = inputs.rows
    mshape = smq.SiluMulQuantShape(1, rows, shape.hidden, shape.group_size, 1)
    mconfig = smq.SiluMulQuantConfig(
        platform=config.platform,
        swiglu_limit=config.swiglu_limit,
        swizzle=config.swizzle,
        scale_layout=config.scale_layout,
        keep_fp32=config.keep_fp32,
    )
    minputs = smq.SiluMulQuantInputs(inputs.gateup.unsqueeze(0), torch.tensor([rows], dtype=torch.int32))
    return minputs, smq.SiluMulQuantOutputs(outputs.out.unsqueeze(0), outputs.scale.unsqueeze(0)), mshape, mconfig


def _rows_text(message: str) -> str:
    """A masked-op message about the one expert, said of the contig op's rows."""
    return message.replace("expert 0 row ", "row ")


def _unwritten(
    inputs: contig.ContigInputs, outputs: contig.ContigOutputs, shape: contig.ContigShape, config: contig.ContigConfig
) -> str | None:
    rows = inputs.rows
    if rows == 0:
        return None
    bad_out = torch.isnan(outputs.out.cpu().float()).any(-1)
    scale = outputs.scale.cpu()
    if config.scale_ue8m0:
        bytes_ = ((scale.to(torch.int64).unsqueeze(-1) >> torch.arange(0, 32, 8)) & 0xFF).reshape(rows, -1)
        bad_scale = (bytes_[:, : shape.num_groups] == 0xFF).any(-1)
    else:
        bad_scale = torch.isnan(scale.float()).any(-1)
    for what, bad in (("out", bad_out), ("scale", bad_scale)):
        if bad.any():
            row, count = int(bad.nonzero()[0, 0]), int(bad.sum())
            last = " (the last row)" if count == 1 and row == rows - 1 else ""
            return (
                f"{what} of row {row}{last} of M={rows} still holds the poison written before run(): "
                f"{count} row(s) not written"
            )
    return None


def _scale_strides_cause(
    inputs: contig.ContigInputs, outputs: contig.ContigOutputs, shape: contig.ContigShape, config: contig.ContigConfig
) -> str | None:
    """The cause when packed scales, read through row-major strides, are right (and were not right as given)."""
    rows, packed = inputs.rows, shape.packed_groups
    scale = outputs.scale
    if not config.scale_ue8m0 or rows < 1 or packed < 2 or scale.dim() != 2 or tuple(scale.shape) != (rows, packed):
        return None
    if tuple(scale.stride()) == (packed, 1):
        return None  # already row-major: validate_outputs names it
    try:
        as_row_major = scale.as_strided((rows, packed), (packed, 1))
    except RuntimeError:  # the storage is smaller than a row-major tensor: not that mistake
        return None
    other = contig.ContigOutputs(outputs.out, as_row_major)
    if _unwritten(inputs, other, shape, config) is not None:
        return None
    view = _masked_view(inputs, other, shape, config)
    if not compare_with_fp64(*view, tolerance_for(view[3])).ok:
        return None
    want = contig.expected_scale_strides(shape, config, rows)[1]
    return SCALE_STRIDES.format(wrong=(packed, 1), want=want)


def find_unwritten(
    inputs: contig.ContigInputs, outputs: contig.ContigOutputs, shape: contig.ContigShape, config: contig.ContigConfig
) -> str | None:
    """None when no row holds poison (or NaN); else where the first poisoned value is, with the cause
    first when the kit can tell it (:data:`SCALE_STRIDES`)."""
    found = _unwritten(inputs, outputs, shape, config)
    if found is None:
        return None
    cause = _scale_strides_cause(inputs, outputs, shape, config)
    return f"{cause}: {found}" if cause else found


#: fp32 arithmetic of a correct plugin (SiLU, product, 1 / scale, a few roundings): relative, per value.
_FP32_ARITHMETIC = 2.0**-20


def exact_step_violation(
    inputs: contig.ContigInputs,
    outputs: contig.ContigOutputs,
    shape: contig.ContigShape,
    config: contig.ContigConfig,
    fast_exp: bool = True,
) -> str | None:
    """None when every dequantized value is within half the fp8 step of its own binade of the fp64 value
    (see the module docstring, 3.); else the first value that is not. Expects written, finite outputs."""
    if inputs.rows == 0:
        return None
    gate, up = _gate_up(inputs.gateup.cpu(), config.swizzle, config.swiglu_limit)
    v, _ = _expected(gate, up, shape.group_size, config.scale_ue8m0)
    scale = (
        contig.scale_to_float(outputs.scale.cpu(), shape, config).double().repeat_interleave(shape.group_size, dim=-1)
    )
    deq = outputs.out.cpu().double() * scale
    # e4m3: smallest normal 2**-6; below it the (subnormal) step is 2**-9, that of binade -6
    binade = torch.floor(torch.log2(v.abs() / scale)).clamp(min=-6.0)
    half = torch.exp2(binade - 4.0) * scale
    allowance = _FP32_ARITHMETIC + ((-gate).clamp(0.0, _FAST_EXP_MAX_ARG) * _FAST_EXP_PER_UNIT if fast_exp else 0.0)
    bound = half * (1 + 1e-5) + v.abs() * allowance + 1e-30
    err = (deq - v).abs()
    bad = err > bound
    if not bool(bad.any()):
        return None
    row, column = (int(i) for i in bad.nonzero()[0])
    return (
        f"fp8 value of row {row} column {column} dequantizes to {deq[row, column].item():.6g}, expected "
        f"{v[row, column].item():.6g}: error {err[row, column].item():.3g} > half an fp8 step of the exact value "
        f"({half[row, column].item():.3g}, bound {bound[row, column].item():.3g}; {int(bad.sum())} value(s) off of "
        f"{bad.numel()}; keep_fp32: the strict policy)"
    )


def compare_contig_with_fp64(
    inputs: contig.ContigInputs,
    outputs: contig.ContigOutputs,
    shape: contig.ContigShape,
    config: contig.ContigConfig,
    tolerance: Tolerance | None = None,
) -> NumericsResult:
    """Compare every row of ``outputs`` with the fp64 values under ``tolerance`` (default: the policy the
    call's config asks for, :func:`~.silu_mul_quant.tolerance_for`). A failure names its cause first when
    the kit can tell it (:data:`BF16_ON_KEEP_FP32`, :data:`SCALE_STRIDES`)."""
    if inputs.rows == 0:
        return NumericsResult(True, "no rows")
    view = _masked_view(inputs, outputs, shape, config)
    policy = tolerance or tolerance_for(view[3])  # the masked op's policy, from the same keep_fp32
    result = compare_with_fp64(*view, policy)
    if result.ok and config.keep_fp32 and policy.intermediate_rtol == 0:
        step = exact_step_violation(inputs, outputs, shape, config, policy.fast_exp)
        if step is not None:
            result = dataclasses.replace(result, ok=False, message=step)
    if result.ok:
        return result
    message = _rows_text(result.message)
    cause = _scale_strides_cause(inputs, outputs, shape, config)
    if (
        cause is None
        and config.keep_fp32
        and policy.intermediate_rtol == 0
        and compare_with_fp64(*view, BF16_INTERMEDIATES).ok
    ):
        cause = BF16_ON_KEEP_FP32
    if cause:
        message = f"{cause}: {message}"
    return dataclasses.replace(result, message=message)


def check_contig_against_fp64(
    inputs: contig.ContigInputs,
    outputs: contig.ContigOutputs,
    shape: contig.ContigShape,
    config: contig.ContigConfig,
    tolerance: Tolerance | None = None,
) -> None:
    """Raise :class:`~.silu_mul_quant.ToleranceError` unless every row is written and within the policy."""
    unwritten = find_unwritten(inputs, outputs, shape, config)
    if unwritten is not None:
        raise ToleranceError(unwritten)
    result = compare_contig_with_fp64(inputs, outputs, shape, config, tolerance)
    if not result.ok:
        raise ToleranceError(result.message)


class ContigConformance:
    """The full conformance adapter of ``silu_mul_quant_contig``."""

    op = contig.OP
    coverage = FULL
    note = ""
    #: Catalog cases run on CPU by default: each runs at the size budget (M = budget / 2D), and they differ
    #: only in D and the flags, which the edge and random cases cover as well (8 take about 15 s on 2 cores).
    max_cpu_catalog_runs = 8

    def cases(self, options: SuiteOptions, platform: Platform, seed: int) -> Sequence[SuiteCase]:
        return draw_cases(options, platform, seed)

    # -- inputs and outputs ----------------------------------------------------------------------
    def make_inputs(self, case: SuiteCase, device: torch.device) -> contig.ContigInputs:
        return make_inputs(case, device)

    def make_fresh_inputs(self, case: SuiteCase, fresh: SuiteCase, device: torch.device) -> contig.ContigInputs:
        """A second call of ``case``'s key: new values and another M (see :func:`.silu_mul_quant_contig_cases.make_fresh_inputs`)."""
        return make_fresh_inputs(case, fresh, device)

    def __init__(self) -> None:
        self._given: contig.ContigOutputs | None = None

    def allocate_outputs(
        self, case: SuiteCase, inputs: contig.ContigInputs, device: torch.device
    ) -> contig.ContigOutputs:
        """The host's buffers for this call's M (packed scales: the transpose of ``[ceil(G/4), Ma]``); the
        latest ones are kept, so that :meth:`validate_outputs` can tell them from a plugin's own."""
        self._given = contig.allocate_outputs(case.shape, case.config, device, rows=inputs.rows)
        return self._given

    def poison(self, outputs: contig.ContigOutputs) -> None:
        poison(outputs)

    def validate_outputs(self, outputs: Any, case: SuiteCase, plugin: str) -> None:
        """The op's checks, and that the outputs are the buffers the host gave: SGLang's hook passes its own
        ``out`` and ``scale`` and reads only those, so a plugin's own tensors would never reach the next GEMM."""
        contig.validate_outputs(outputs, case.shape, case.config, plugin)
        given = self._given
        if given is not None and outputs is not given:
            for name in ("out", "scale"):
                mine, host = getattr(outputs, name), getattr(given, name)
                if mine.numel() and (mine.data_ptr(), mine.shape, mine.stride()) != (
                    host.data_ptr(),
                    host.shape,
                    host.stride(),
                ):
                    raise OutputValidationError(
                        f"plugin {plugin!r} returned its own {name} tensor, not the host's: op {contig.OP}'s host "
                        "(SGLang's hook) passes its own out and scale and reads only those; write into them "
                        "(copy_ honours their strides) and return None"
                    )
        rows = case_rows(case)
        if outputs.out.shape[0] != rows:
            raise OutputValidationError(
                f"plugin {plugin!r} returned out.shape={tuple(outputs.out.shape)}, the host requires "
                f"{(rows, case.shape.hidden)} (M={rows} rows in this call)"
            )

    def cost(self, case: SuiteCase) -> float:
        """Relative run time of a case (for the suite's time estimate): its input elements."""
        return 4096.0 + case_elements(case.shape, case_rows(case))

    # -- checks ----------------------------------------------------------------------------------
    def snapshot(self, inputs: contig.ContigInputs) -> contig.ContigInputs:
        return dataclasses.replace(inputs, gateup=inputs.gateup.clone())

    def inputs_changed(self, snapshot: contig.ContigInputs, inputs: contig.ContigInputs, case: SuiteCase) -> str | None:
        if case.inputs_writable or snapshot.gateup.numel() == 0:
            return None
        before, after = snapshot.gateup.view(torch.int16), inputs.gateup.view(torch.int16)
        if not torch.equal(before, after):
            row, column = (int(i) for i in (before != after).nonzero()[0])
            return (
                f"gateup changed at row {row} column {column}, though the caller did not mark it writable "
                "(gateup_writable=False); a plugin that writes gateup must do so only when the call allows it, "
                "and declare it (writes_inputs)"
            )
        return None

    def find_unwritten(self, inputs: contig.ContigInputs, outputs: contig.ContigOutputs, case: SuiteCase) -> str | None:
        return find_unwritten(inputs, outputs, case.shape, case.config)

    def compare(self, inputs: contig.ContigInputs, outputs: contig.ContigOutputs, case: SuiteCase) -> str | None:
        result = compare_contig_with_fp64(inputs, outputs, case.shape, case.config)
        if result.ok:
            return None
        return result.message + "; " + self._reference_verdict(inputs, case)

    def _reference_verdict(self, inputs: contig.ContigInputs, case: SuiteCase) -> str:
        """Run ``contig_reference`` on the same inputs: tells a plugin bug from a suite bug."""
        from ...plugins.reference.silu_mul_quant_contig import silu_mul_quant_contig_reference

        outputs = contig.allocate_outputs(case.shape, case.config, inputs.device, rows=inputs.rows)
        poison(outputs)
        silu_mul_quant_contig_reference(inputs, outputs, case.shape, case.config)
        ref = compare_contig_with_fp64(inputs, outputs, case.shape, case.config)
        if ref.ok:
            return "the reference plugin contig_reference passes this case"
        return f"the reference plugin contig_reference ALSO fails this case ({ref.message}): please report it to sglang-moe-plugins"
