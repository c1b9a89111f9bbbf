"""Shared pieces of the command line: one-line usage errors (JSON under ``--json``), tables, typed output.

Imports nothing heavy (no torch): the parser and ``--help`` use it before any command module is imported."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from ..hardware import Platform

__all__ = [
    "UsageError",
    "Parser",
    "fail",
    "set_argv",
    "table",
    "emit",
    "parse_platform",
    "platform_arg",
    "positive_int",
    "limit_arg",
    "int_list_arg",
    "flat",
    "rows_arg",
    "to_json",
]


class UsageError(Exception):
    """A bad command-line argument: printed as one line naming it and what is allowed; exit 2."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument


def _wants_json(argv: Sequence[str]) -> bool:
    return "--json" in argv


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), as JSON when ``--json`` is on the command line."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        fail(self.prog, message, _wants_json(sys.argv[1:] if _ARGV is None else _ARGV))


_ARGV: Sequence[str] | None = None


def set_argv(argv: Sequence[str] | None) -> None:
    """The command line ``Parser.error`` looks at for ``--json`` (``main`` sets it; ``None``: ``sys.argv``)."""
    global _ARGV
    _ARGV = argv


def fail(prog: str, message: str, as_json: bool, code: int = 2, kind: str = "usage") -> NoReturn:
    """Print one error line (a JSON ``{"error": ...}`` object under ``--json``) and exit with ``code``."""
    if as_json:
        print(json.dumps({"error": {"kind": kind, "message": message}}))
    else:
        print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def to_json(value: Any) -> Any:
    """JSON types for the package's values: dataclasses as dicts, platforms as text, tuples as lists;
    booleans, numbers and None stay typed."""
    import dataclasses

    from ..hardware import Platform

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Platform):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
        describe = getattr(value, "describe", None)
        if not out and callable(describe):
            return describe()
        return out
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return str(value)


def emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    print(json.dumps(to_json(payload), indent=2) if getattr(args, "json", False) else text)


def parse_platform(text: str | None) -> Platform:
    """``local`` (this machine), ``cpu`` or ``smNN`` (``sm90``, ``sm100``, ``sm120``)."""
    from ..hardware import Platform, local_platform

    if text is None or text == "local":
        return local_platform()
    text = text.lower().strip()
    if text == "cpu":
        return Platform.cpu()
    digits = text[2:]
    if text.startswith("sm") and digits.isdigit() and len(digits) in (2, 3) and digits[0] != "0":
        number = int(digits)
        return Platform.cuda(number // 10, number % 10)
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a platform; allowed: local (this machine), cpu, or smNN (sm90, sm100, sm120)"
    )


def platform_arg(text: str) -> str:
    parse_platform(text)  # validate early; resolved later (local may need CUDA)
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; allowed: an int >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; allowed: an int >= 1")
    return value


def limit_arg(text: str) -> float:
    """A swiglu limit: a finite float of at least bf16's smallest normal (2**-126), as the ops allow."""
    from ..ops.base import BF16_MIN_NORMAL, finite_float

    allowed = "a finite number >= 2**-126 (bf16's smallest normal)"
    try:
        value = finite_float(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; allowed: {allowed}") from None
    if value is None or not value >= BF16_MIN_NORMAL:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: {allowed}")
    return value


def rows_arg(text: str) -> tuple[int, ...]:
    """Comma-separated ints >= 1 (``64,128``; the one list syntax of the command line), duplicates dropped."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: {part!r} is not an integer; allowed: comma-separated ints >= 1"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: {value} is not allowed; allowed: comma-separated ints >= 1")
        out.append(value)
    return tuple(dict.fromkeys(out))


def int_list_arg(text: str) -> tuple[int, ...]:
    """A list option given comma-separated (``1,2,8``) as :func:`rows_arg`; one value is checked (and refused) as
    :func:`positive_int` does (``--ep 0``), as when these options took one int per word."""
    return rows_arg(text) if "," in text else (positive_int(text),)


def flat(values: Sequence[Sequence[int]] | Sequence[int]) -> list[int]:
    """A list option's values in order, duplicates dropped: ``nargs="+"`` of :func:`int_list_arg` (``--ep 1 2,8``)."""
    out: list[int] = []
    for value in values:
        out.extend(value if isinstance(value, (tuple, list)) else (value,))
    return list(dict.fromkeys(out))
