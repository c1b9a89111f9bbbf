"""Deprecated path (kept for one minor release; docs of 0.3 named it): the adapter and tolerance of
``mega_moe`` live in :mod:`sglang_moe_plugins.testing.ops.mega_moe`, its cases and inputs
(``make_problem``) in :mod:`sglang_moe_plugins.testing.ops.mega_moe_cases`. Importing this module warns."""

from __future__ import annotations

import warnings

from .ops.mega_moe import (
    MEGA_TOLERANCE,
    MegaMoEConformance,
    MegaTolerance,
    compare_rows,
    compare_with_reference,
    find_unwritten_rows,
)
from .ops.mega_moe_cases import (
    DECODE_TOKENS,
    MANY_TOKENS,
    PREFILL_TOKENS,
    ROUTINGS,
    MegaProblem,
    make_problem,
    megamoe_capable,
    weight_budget,
)

warnings.warn(
    "sglang_moe_plugins.testing.mega_moe is deprecated: import from sglang_moe_plugins.testing.ops.mega_moe "
    "(tolerance, compare_with_reference) and sglang_moe_plugins.testing.ops.mega_moe_cases (make_problem)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "MegaMoEConformance",
    "MegaProblem",
    "make_problem",
    "ROUTINGS",
    "DECODE_TOKENS",
    "PREFILL_TOKENS",
    "MANY_TOKENS",
    "compare_rows",
    "MegaTolerance",
    "MEGA_TOLERANCE",
    "megamoe_capable",
    "weight_budget",
    "find_unwritten_rows",
    "compare_with_reference",
]
