"""The plugin authors' kit: a conformance suite that tells whether a kernel plugin is a correct, safe drop-in.

>>> from sglang_moe_plugins.testing import run_conformance
>>> report = run_conformance("my_plugin", seed=0)      # or a class, an instance, "path/to/mod.py:Class"
>>> print(report.summary()); report.raise_for_failures()

The same suite runs as ``sglang-moe-plugins check NAME`` and as a pytest plugin (``pytest --moe-plugin NAME``
or ``@pytest.mark.moe_plugin("NAME")`` with the ``moe_plugin_report`` fixture). See docs/authoring.md.

Importing this package imports torch (as the rest of sglang-moe-plugins does) and nothing heavier.
"""

from .adapters import OpConformance, SuiteCase, conformance_for
from .loading import LoadedPlugin, PluginLoadError, load_plugin
from .report import CHECKS, INCOMPLETE, CaseFailure, CaseResult, CheckResult, ConformanceFailure, ConformanceReport
from .suite import SuiteOptions, run_conformance
from .tolerance import (
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
    poison,
    tolerance_for,
)

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
