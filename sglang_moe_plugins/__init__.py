"""sglang-moe-plugins: SGLang's MoE activation/quantization kernel paths as plugins.

Importing this package does nothing else: no environment changes, no CUDA initialisation, no kernel
builds. Plugins are discovered on first use from the entry point group ``sglang_moe_plugins.kernels``.
"""

from ._version import CONTRACT_VERSION, __version__
from .api import dispatch, explain, get_registry, get_selector, reload, select, silu_mul_quant
from .config import UserConfig, load_config
from .contract import OptionValueError, Plugin, Support
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
from .registry import ENTRY_POINT_GROUP, PluginRecord, Registry
from .selection import BoundOp, Candidate, Selection, Selector, Verdict

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
