"""sglang-moe-plugins: SGLang's MoE activation/quantization kernel paths as plugins.

Importing this package does nothing else: no environment changes, no CUDA initialisation, no kernel
builds, and no heavy imports. The public names below load their module on first access (PEP 562), so
``import sglang_moe_plugins`` (and the pytest plugin, which every pytest run of an environment with this
package loads) costs neither torch nor SGLang until a name is used. Plugins are discovered on first use
from the entry point group ``sglang_moe_plugins.kernels``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import CONTRACT_VERSION, __version__

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names resolve lazily
    from .api import dispatch, explain, get_registry, get_selector, reload, select, silu_mul_quant
    from .config import UserConfig, load_config
    from .contract import OptionValueError, Plugin, Support
    from .core.bound import BoundOp
    from .core.decide import Candidate, Selection, Verdict
    from .core.dispatcher import Selector
    from .core.registry import ENTRY_POINT_GROUP, PluginRecord, Registry
    from .counters import PluginStats, Stats, stats
    from .errors import (
        ConfigError,
        InvalidArgumentError,
        KernelNotAvailableError,
        MoEPluginsError,
        NoPluginAvailableError,
        OutputValidationError,
        PluginValidationError,
    )
    from .hardware import Platform
    from .ops import OPS

__all__ = [
    "__version__",
    "CONTRACT_VERSION",
    "ENTRY_POINT_GROUP",
    "OPS",
    "Plugin",
    "Support",
    "OptionValueError",
    "Platform",
    "UserConfig",
    "load_config",
    "Registry",
    "PluginRecord",
    "Selector",
    "BoundOp",
    "Selection",
    "Candidate",
    "Verdict",
    "select",
    "explain",
    "dispatch",
    "silu_mul_quant",
    "get_registry",
    "get_selector",
    "reload",
    "stats",
    "Stats",
    "PluginStats",
    "MoEPluginsError",
    "ConfigError",
    "InvalidArgumentError",
    "PluginValidationError",
    "NoPluginAvailableError",
    "KernelNotAvailableError",
    "OutputValidationError",
]

#: Public name -> the submodule that defines it (loaded on first access).
_LAZY = {
    **dict.fromkeys(
        ("dispatch", "explain", "get_registry", "get_selector", "reload", "select", "silu_mul_quant"), "api"
    ),
    **dict.fromkeys(("UserConfig", "load_config"), "config"),
    **dict.fromkeys(("OptionValueError", "Plugin", "Support"), "contract"),
    **dict.fromkeys(("PluginStats", "Stats", "stats"), "counters"),
    **dict.fromkeys(
        (
            "ConfigError",
            "InvalidArgumentError",
            "KernelNotAvailableError",
            "MoEPluginsError",
            "NoPluginAvailableError",
            "OutputValidationError",
            "PluginValidationError",
        ),
        "errors",
    ),
    "Platform": "hardware",
    "OPS": "ops",
    **dict.fromkeys(("ENTRY_POINT_GROUP", "PluginRecord", "Registry"), "core.registry"),
    "BoundOp": "core.bound",
    **dict.fromkeys(("Candidate", "Selection", "Verdict"), "core.decide"),
    "Selector": "core.dispatcher",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        # ``sglang_moe_plugins.api`` and the other submodules the package root used to import eagerly
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
