"""Temporary shim: the tolerance policy of ``silu_mul_quant`` lives in :mod:`.ops.silu_mul_quant`, the
poison helper in :mod:`.case`."""

from __future__ import annotations

from .case import POISON_FP8, POISON_SCALE_INT, poison
from .ops.silu_mul_quant import (
    BF16_INTERMEDIATES,
    EXACT,
    STRICT,
    NumericsResult,
    Tolerance,
    ToleranceError,
    check_against_fp64,
    compare_with_fp64,
    find_unwritten,
    fp64_expected,
    tolerance_for,
)

__all__ = [
    "POISON_FP8",
    "POISON_SCALE_INT",
    "Tolerance",
    "STRICT",
    "EXACT",
    "BF16_INTERMEDIATES",
    "tolerance_for",
    "ToleranceError",
    "NumericsResult",
    "fp64_expected",
    "poison",
    "find_unwritten",
    "compare_with_fp64",
    "check_against_fp64",
]
