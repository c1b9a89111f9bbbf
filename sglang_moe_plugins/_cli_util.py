"""Temporary shim: the command line's shared pieces live in :mod:`sglang_moe_plugins.cli.util`."""

from .cli.util import *  # noqa: F401,F403
from .cli.util import fail, set_argv  # noqa: F401

__all__ = ["UsageError", "Parser", "table", "emit", "parse_platform", "platform_arg", "positive_int", "rows_arg", "to_json"]
