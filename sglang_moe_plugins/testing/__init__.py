"""The plugin authors' kit: a conformance suite that tells whether a kernel plugin is a correct, safe drop-in.

>>> from sglang_moe_plugins.testing import run_conformance
>>> report = run_conformance("my_plugin", seed=0)      # or a class, an instance, "path/to/mod.py:Class"
>>> print(report.summary()); report.raise_for_failures()

The same suite runs as ``sglang-moe-plugins check NAME`` and as a pytest plugin (``pytest --moe-plugin NAME``
or ``@pytest.mark.moe_plugin("NAME")`` with the ``moe_plugin_report`` fixture). See docs/authoring.md.

Importing this package imports nothing heavy: each public name loads its module (and so torch) on first
access (PEP 562), so the pytest plugin (``testing/pytest_plugin.py``, loaded by every pytest run of an
environment with this package) costs nothing until its options are used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names resolve lazily
    from .case import OpConformance, SuiteCase, SuiteOptions, poison
    from .loading import LoadedPlugin, PluginLoadError, load_plugin
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
    from .report import CHECKS, INCOMPLETE, CaseFailure, CaseResult, CheckResult, ConformanceFailure, ConformanceReport
    from .suite import conformance_for, run_conformance

__all__ = [
    "run_conformance",
    "SuiteOptions",
    "ConformanceReport",
    "CheckResult",
    "CaseResult",
    "CaseFailure",
    "ConformanceFailure",
    "CHECKS",
    "INCOMPLETE",
    "load_plugin",
    "LoadedPlugin",
    "PluginLoadError",
    "conformance_for",
    "OpConformance",
    "SuiteCase",
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


#: Public name -> the submodule that defines it (loaded on first access).
_LAZY = {
    **dict.fromkeys(("OpConformance", "SuiteCase", "SuiteOptions", "poison"), "case"),
    **dict.fromkeys(("LoadedPlugin", "PluginLoadError", "load_plugin"), "loading"),
    **dict.fromkeys(
        ("CHECKS", "INCOMPLETE", "CaseFailure", "CaseResult", "CheckResult", "ConformanceFailure", "ConformanceReport"),
        "report",
    ),
    **dict.fromkeys(("conformance_for", "run_conformance"), "suite"),
    **dict.fromkeys(
        (
            "BF16_INTERMEDIATES",
            "EXACT",
            "STRICT",
            "NumericsResult",
            "Tolerance",
            "ToleranceError",
            "check_against_fp64",
            "compare_with_fp64",
            "find_unwritten",
            "fp64_expected",
            "tolerance_for",
        ),
        "ops.silu_mul_quant",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
