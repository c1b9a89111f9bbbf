"""The ``sglang-moe-plugins`` command: ``list``, ``explain``, ``doctor``, ``check``, ``bench``. ``--json`` for machines.
``--version``: the package version, then the installed SGLang release and whether the release table knows it
(also ``python -m sglang_moe_plugins --version``).

A bad argument is one line naming it and what is allowed (a JSON ``{"error": ...}`` under ``--json``), exit 2.

The parser knows each command's name and one-line help; a command's module (``cli/list.py``, ...), which
adds its arguments and runs it, is imported only when that command is parsed (run or asked for its
``--help``). So ``sglang-moe-plugins --help`` imports neither torch nor any command.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..errors import MoEPluginsError
from .util import Parser, UsageError, fail, set_argv

__all__ = ["main", "build_parser", "COMMANDS", "command_module", "CommandParser", "version_text"]

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


def _table_releases() -> list[str]:
    """The SGLang releases of the version table: the keys of ``KNOWN_TARGETS`` in
    ``integrations/sglang/version_table.py``, read with ``ast``. Importing that module goes through its package,
    which imports the hooks, and torch with them."""
    import ast

    path = pathlib.Path(__file__).resolve().parents[1] / "integrations" / "sglang" / "version_table.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "KNOWN_TARGETS" and isinstance(value, ast.Dict):
            return [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    raise RuntimeError(f"{path} has no KNOWN_TARGETS dict literal: the release table moved")


def version_text() -> str:
    """``--version``: this package's version; the installed SGLang and whether the release table knows it.
    Reads installed metadata only: imports neither torch nor SGLang."""
    from importlib.metadata import PackageNotFoundError, version

    from .._version import __version__

    try:
        sglang = version("sglang")
    except PackageNotFoundError:
        return f"sglang-moe-plugins {__version__}\nsglang: not installed (nothing to hook)"
    releases = _table_releases()
    table = f"the release table has {releases[0]} to {releases[-1]}" if releases else "the release table is empty"
    if sglang.split("+", 1)[0] in releases:  # a local build (0.5.23+cu129) is its release, as the hooks read it
        status = f"a known release ({table})"
    else:
        status = (
            f"not a release of the table ({table}); `sglang-moe-plugins doctor` says whether it is hooked "
            "(a newer release is where its functions have the newest release's signatures)"
        )
    return f"sglang-moe-plugins {__version__}\nsglang {sglang}: {status}"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_text` and exit 0 (computed only when asked, unlike argparse's own)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The whole command line. Cheap: no command module is imported until its command is parsed."""
    parser = Parser(prog="sglang-moe-plugins", description="Inspect, debug and measure MoE kernel plugin selection.")
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the package version, the installed SGLang release and whether the release table knows it",
    )
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
