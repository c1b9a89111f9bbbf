"""Temporary shim: the ``explain`` command lives in :mod:`sglang_moe_plugins.cli.explain`."""

from .cli.explain import *  # noqa: F401,F403

__all__ = ["add_explain_parser", "cmd_explain", "resolve_platform", "forced_here_warnings", "explain_calls"]
