"""Temporary shim: the adapter of ``silu_mul_quant`` lives in :mod:`.ops.silu_mul_quant`, its cases and
inputs in :mod:`.ops.silu_mul_quant_cases`."""

from __future__ import annotations

from .ops.silu_mul_quant import SiluMulQuantConformance
from .ops.silu_mul_quant_cases import MASKED_PATTERNS, case_elements, make_gateup, masked_pattern

__all__ = ["SiluMulQuantConformance", "MASKED_PATTERNS", "masked_pattern", "make_gateup", "case_elements"]
