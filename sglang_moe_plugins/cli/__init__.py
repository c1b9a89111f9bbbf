"""The ``sglang-moe-plugins`` command: ``list``, ``explain``, ``doctor``, ``check``, ``bench``. ``--json`` for machines.

A bad argument is one line naming it and what is allowed (a JSON ``{"error": ...}`` under ``--json``), exit 2.

The parser knows each command's name and one-line help; a command's module (``cli/list.py``, ...), which
adds its arguments and runs it, is imported only when that command is parsed (run or asked for its
``--help``). So ``sglang-moe-plugins --help`` imports neither torch nor any command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import MoEPluginsError
from .util import Parser, UsageError, fail, set_argv

__all__ = ["main", "build_parser", "COMMANDS", "command_module", "CommandParser"]

#: Every command, in the order ``--help`` lists them, with its one-line help. The module
#: ``sglang_moe_plugins.cli.<name>`` defines ``add_arguments(parser)``, which sets ``func`` (the runner).
COMMANDS: dict[str, str] = {
    "list": "every plugin: op, priority, state, availability, distribution",
    "explain": "which plugin runs each MoE call of a model (silu_mul_quant and mega_moe), and why not the others",
    "doctor": "host versions, configuration, hooks applied or not and why",
    "check": "run the conformance suite on a plugin (a registered NAME, path/to/module.py[:Class] or package.module:Class)",
    "bench": "time every enabled silu_mul_quant plugin on a model's calls on this GPU, side by side",
}

# Attributes of the former ``sglang_moe_plugins.cli`` module, served from the command modules on first use.
_LAZY = {"cmd_list": "list", "cmd_doctor": "doctor"}


def command_module(name: str) -> ModuleType:
    """The module of command ``name`` (imported now if it was not)."""
    if name not in COMMANDS:
        raise ValueError(f"command={name!r} is not a command of sglang-moe-plugins; allowed: {', '.join(COMMANDS)}")
    return importlib.import_module(f"{__name__}.{name}")


class CommandParser(Parser):
    """A command's parser: its arguments are added by its module, imported on the first parse or help."""

    def __init__(self, *args: Any, command: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.command = command
        self._arguments_added = command is None

    def add_command_arguments(self) -> None:
        """Import the command's module and let it add its arguments (once)."""
        if not self._arguments_added:
            self._arguments_added = True
            command_module(self.command).add_arguments(self)  # type: ignore[arg-type]

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None) -> Any:  # type: ignore[override]  # noqa: D102 - argparse's overloads; same call
        self.add_command_arguments()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:  # noqa: D102
        self.add_command_arguments()
        return super().format_usage()

    def format_help(self) -> str:  # noqa: D102
        self.add_command_arguments()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The whole command line. Cheap: no command module is imported until its command is parsed."""
    parser = Parser(prog="sglang-moe-plugins", description="Inspect, debug and measure MoE kernel plugin selection.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser)
    for name, help_text in COMMANDS.items():
        sub.add_parser(name, help=help_text, command=name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Not the builtin ``list`` here: importing the ``list`` command binds that name in this package.
    argv = [*(sys.argv[1:] if argv is None else argv)]
    set_argv(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"sglang-moe-plugins {args.command}"
    as_json = bool(getattr(args, "json", False))
    try:
        return int(args.func(args) or 0)
    except UsageError as exc:
        fail(prog, str(exc), as_json)
    except MoEPluginsError as exc:
        fail(prog, str(exc), as_json, kind=type(exc).__name__)
    finally:
        set_argv(None)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(command_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
