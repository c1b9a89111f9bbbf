"""Temporary shim: entry-point discovery lives in :mod:`sglang_moe_plugins.core.discovery`."""

from .core.discovery import *  # noqa: F403
from .core.discovery import __all__, is_builtin  # noqa: F401
