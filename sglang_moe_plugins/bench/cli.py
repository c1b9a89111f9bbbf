"""Temporary shim: the ``bench`` command lives in :mod:`sglang_moe_plugins.cli.bench`."""

from ..cli.bench import *  # noqa: F401,F403

__all__ = ["add_bench_parser", "cmd_bench", "run_bench"]
