"""Temporary shim: the ``check`` command lives in :mod:`sglang_moe_plugins.cli.check`.

``python -m sglang_moe_plugins.testing.cli_check TARGET [options]`` still runs it on its own."""

import sys

from ..cli.check import *  # noqa: F401,F403
from ..cli.check import main

__all__ = ["add_check_parser", "cmd_check", "main", "EXIT_PASSED", "EXIT_FAILED", "EXIT_ERROR", "EXIT_NOT_EXERCISED",
           "EXIT_INCOMPLETE"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
