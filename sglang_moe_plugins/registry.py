"""Temporary shim: the registry lives in :mod:`sglang_moe_plugins.core.registry`."""

from .core.registry import *  # noqa: F403
from .core.registry import __all__  # noqa: F401
