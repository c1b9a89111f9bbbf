"""A plugin module whose import fails: it needs a package that is not installed (issue 7.2)."""

import fancy_kernels_not_installed  # noqa: F401

from sglang_moe_plugins import Plugin


class MissingDependency(Plugin):
    name = "fault_missing_dep"
    op = "silu_mul_quant"
    priority = 950
