"""The conformance adapter of op ``silu_mul_quant``. Its tolerance policy, checked against an independent
fp64 computation, is :mod:`.silu_mul_quant_policy` (re-exported here, where the suite, the tests and
the documentation name it); the cases and their inputs are drawn by :mod:`.silu_mul_quant_cases`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from ...hardware import Platform
from ...ops import silu_mul_quant as smq
from ..case import FULL, SuiteCase, SuiteOptions, poison
from .silu_mul_quant_cases import case_elements, draw_cases, make_fresh_inputs, make_inputs, repad
from .silu_mul_quant_policy import (
    _FAST_EXP_MAX_ARG as _FAST_EXP_MAX_ARG,
    _FAST_EXP_PER_UNIT as _FAST_EXP_PER_UNIT,
    BF16_INTERMEDIATES,
    EXACT,
    STRICT,
    NumericsResult,
    Tolerance,
    ToleranceError,
    _expected as _expected,
    _gate_up as _gate_up,
    check_against_fp64,
    compare_with_fp64,
    find_unwritten,
    fp64_expected,
    tolerance_for,
)
from .silu_mul_quant_search import DIMENSIONS, dimensions_of, redraw, variant

__all__ = [
    "SiluMulQuantConformance",
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


class SiluMulQuantConformance:
    """The full conformance adapter of ``silu_mul_quant``."""

    op = smq.OP
    coverage = FULL
    note = ""

    def cases(self, options: SuiteOptions, platform: Platform, seed: int) -> Sequence[SuiteCase]:
        return draw_cases(options, platform, seed)

    # -- cases inside the plugin's support (:mod:`..search`) --------------------------------------
    dimensions = DIMENSIONS

    def dimensions_of(self, case: SuiteCase) -> dict[str, set[str]]:
        return dimensions_of(case)

    def variant(self, template: SuiteCase, dimension: str, value: str, budget: int) -> Any:
        return variant(template, dimension, value, budget)

    def redraw(self, rng: Any, template: SuiteCase, budget: int) -> Any:
        return redraw(rng, template, budget)

    # -- inputs and outputs ----------------------------------------------------------------------
    def make_inputs(self, case: SuiteCase, device: torch.device) -> smq.SiluMulQuantInputs:
        return make_inputs(case, device)

    def make_fresh_inputs(self, case: SuiteCase, fresh: SuiteCase, device: torch.device) -> smq.SiluMulQuantInputs:
        """A second call of ``case``'s key with new values (see :func:`.silu_mul_quant_cases.make_fresh_inputs`)."""
        return make_fresh_inputs(case, fresh, device)

    def allocate_outputs(self, case: SuiteCase, inputs: Any, device: torch.device) -> smq.SiluMulQuantOutputs:
        return smq.allocate_outputs(case.shape, case.config, device)

    def poison(self, outputs: smq.SiluMulQuantOutputs) -> None:
        poison(outputs)

    def validate_outputs(self, outputs: Any, case: SuiteCase, plugin: str) -> None:
        smq.validate_outputs(outputs, case.shape, case.config, plugin)

    def cost(self, case: SuiteCase) -> float:
        """Relative run time of a case (for the suite's time estimate): its input elements."""
        return 4096.0 + case_elements(case.shape)

    def repad(self, inputs: smq.SiluMulQuantInputs, case: SuiteCase) -> smq.SiluMulQuantInputs | None:
        """``inputs`` with other padding rows (see :func:`.silu_mul_quant_cases.repad`); None: no padding."""
        return repad(inputs, case)

    def real_outputs(
        self, inputs: smq.SiluMulQuantInputs, outputs: smq.SiluMulQuantOutputs, case: SuiteCase
    ) -> list[tuple[str, torch.Tensor]]:
        """The real rows of ``out`` and ``scale`` (what the determinism and padding checks compare)."""
        shape = case.shape
        if shape.num_experts == 0 or shape.max_rows == 0:
            return [("out", outputs.out.reshape(-1)[:0]), ("scale", outputs.scale.reshape(-1)[:0])]
        real = smq.real_rows(inputs.masked_m.cpu(), shape.max_rows).to(outputs.out.device)
        return [("out", outputs.out[real]), ("scale", outputs.scale[real])]

    # -- checks ----------------------------------------------------------------------------------
    def snapshot(self, inputs: smq.SiluMulQuantInputs) -> smq.SiluMulQuantInputs:
        return dataclasses.replace(inputs, gateup=inputs.gateup.clone(), masked_m=inputs.masked_m.clone())

    def inputs_changed(
        self, snapshot: smq.SiluMulQuantInputs, inputs: smq.SiluMulQuantInputs, case: SuiteCase
    ) -> str | None:
        if not torch.equal(snapshot.masked_m, inputs.masked_m):
            changed = (snapshot.masked_m != inputs.masked_m).nonzero().flatten().tolist()
            e = changed[0]
            return (
                f"masked_m changed at expert {e}: was {int(snapshot.masked_m[e])}, now {int(inputs.masked_m[e])} "
                f"({len(changed)} of {snapshot.masked_m.numel()} experts changed); masked_m is never writable"
            )
        if case.inputs_writable or snapshot.gateup.numel() == 0:
            return None
        before, after = snapshot.gateup.view(torch.int16), inputs.gateup.view(torch.int16)
        if not torch.equal(before, after):
            e, r, c = (int(i) for i in (before != after).nonzero()[0])
            return f"gateup changed at expert {e} row {r} column {c}, though the caller did not mark it writable"
        return None

    def find_unwritten(
        self, inputs: smq.SiluMulQuantInputs, outputs: smq.SiluMulQuantOutputs, case: SuiteCase
    ) -> str | None:
        return find_unwritten(inputs, outputs, case.shape, case.config)

    def compare(self, inputs: smq.SiluMulQuantInputs, outputs: smq.SiluMulQuantOutputs, case: SuiteCase) -> str | None:
        result = compare_with_fp64(inputs, outputs, case.shape, case.config, tolerance_for(case.config))
        if result.ok:
            return None
        return result.message + "; " + self._reference_verdict(inputs, case)

    def _reference_verdict(self, inputs: smq.SiluMulQuantInputs, case: SuiteCase) -> str:
        """Run the reference plugin on the same inputs: tells a plugin bug from a suite bug."""
        from ...plugins.reference import silu_mul_quant_reference

        outputs = smq.allocate_outputs(case.shape, case.config, inputs.device)
        poison(outputs)
        silu_mul_quant_reference(inputs, outputs, case.shape, case.config)
        ref = compare_with_fp64(inputs, outputs, case.shape, case.config, tolerance_for(case.config))
        if ref.ok:
            return "the reference plugin passes this case"
        return f"the reference plugin ALSO fails this case ({ref.message}): please report it to sglang-moe-plugins"
