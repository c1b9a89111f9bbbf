"""Temporary shim: what ``list`` and ``doctor`` say about the registry lives in :mod:`sglang_moe_plugins.cli.health`."""

from .cli.health import *  # noqa: F401,F403

__all__ = ["RegistryReport", "load_registry", "platform_findings", "stock_lines", "quiet_host_import", "PURE_TORCH"]
