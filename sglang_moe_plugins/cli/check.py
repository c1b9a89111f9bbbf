"""``sglang-moe-plugins check NAME | path/to/module.py[:Class] | package.module:Class``.

Runs the conformance suite with a progress bar on stderr and prints a summary table (``--json``: the
whole report as JSON on stdout). Exit status: 0 passed, 1 failed, 2 usage or load error, 3 nothing
could be exercised (the plugin supports no drawn case on this device, or its op is not covered yet),
4 incomplete: every check that ran passed, but a claim could not be exercised (a mega_moe plugin that
accepts ep_size > 1 the kit could not run over ranks: "claims EP > 1; not exercised").

When the run is estimated to take longer than 30 s, the estimate is printed on stderr after the first
cases ran (with the options that shorten it).

The main CLI adds the arguments with ``add_arguments(parser)`` (``add_check_parser(subparsers)`` adds the
whole command to another parser); also runnable on its own as ``python -m sglang_moe_plugins.cli.check
...`` (:func:`main`). Adding the parser loads nothing: the suite is imported when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

__all__ = [
    "add_arguments",
    "add_check_parser",
    "cmd_check",
    "main",
    "EXIT_PASSED",
    "EXIT_FAILED",
    "EXIT_ERROR",
    "EXIT_NOT_EXERCISED",
    "EXIT_INCOMPLETE",
]

EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_ERROR = 2
EXIT_NOT_EXERCISED = 3
EXIT_INCOMPLETE = 4


class _Progress:
    """A progress bar on a stream: redrawn in place on a terminal, a line per 10% otherwise."""

    def __init__(self, stream: TextIO, width: int = 30):
        self.stream = stream
        self.width = width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last_decile = -1
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int, label: str) -> None:
        total = max(total, 1)
        if done == 0:
            self.last_decile = -1  # a new phase (supports() questions, then runs)
        filled = self.width * done // total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.started
        text = f"[{bar}] {done}/{total} {elapsed:5.1f}s {label}"
        if self.tty:
            self.stream.write("\r\x1b[K" + text[:120])
            if done >= total:
                self.stream.write("\n")
        else:
            decile = 10 * done // total
            if decile != self.last_decile:
                self.last_decile = decile
                self.stream.write(text + "\n")
        self.stream.flush()


def add_check_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``check`` command to an ``argparse`` subparsers object."""
    from . import COMMANDS

    parser = subparsers.add_parser("check", help=COMMANDS["check"])
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``check`` command's description and arguments; runs :func:`cmd_check`."""
    parser.description = (
        "Run the conformance suite: draw cases (embedded catalog at EP 1/2/4/8, decode and prefill N, edge cases, "
        "seeded random cases), keep those the plugin supports, run them and check layouts, written rows and "
        "numerics; check that supports() is deterministic, cheap and explains itself. Exit status: 0 passed, "
        "1 failed, 2 usage/load error, 3 nothing exercised, 4 incomplete (a claim such as EP > 1 not exercised)."
    )
    parser.add_argument("target", help="registered plugin name, path/to/module.py[:Class] or package.module:Class")
    parser.add_argument("--seed", type=int, help="seed of the random cases and inputs (default: drawn and printed)")
    parser.add_argument("--cases", type=int, metavar="N", help="number of random property-based cases (default 24)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N")
    parser.add_argument(
        "--max-elements",
        type=int,
        metavar="N",
        help="size budget per case in input elements (default 2**20 on CPU, 2**27 on CUDA)",
    )
    parser.add_argument(
        "--catalog-runs",
        type=int,
        metavar="N",
        help="run at most N catalog cases (default 24 on CPU, all on CUDA); the rest are supports()-checked",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        help="calls per run case on identical inputs for the deterministic check (default 2; raise it to hunt "
        "rare nondeterminism: a fault on a fraction p of calls is seen with probability 1-(1-p)**((N-1)*cases))",
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="restrict the catalog to this model (repeatable; default every model)",
    )
    parser.add_argument("--no-catalog", action="store_true", help="skip the catalog cases")
    parser.add_argument(
        "--supports-budget-us", type=float, default=1000.0, help="supports() median budget per call (default 1000)"
    )
    parser.add_argument(
        "--supports-limit-ms",
        type=float,
        default=50.0,
        help="no case's supports() may take longer per call (default 50 ms; the median of its calls, scaled on a "
        "slow machine); once the median over 5+ cases is over it, the remaining cases are not asked",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--verbose", "-v", action="store_true", help="list every case that ran or failed")
    parser.set_defaults(func=cmd_check)


def _case_table(report: Any) -> str:
    rows = [
        (c.status, c.origin, c.label, c.shape, f"{c.seconds:.2f}s")
        for c in report.cases
        if c.status not in ("probed", "rejected")
    ]
    rows += [(c.status, c.origin, c.label, c.shape, c.reason) for c in report.cases if c.status == "rejected"]
    if not rows:
        return ""
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(r[:4], widths)) + "  " + str(r[4]) for r in rows)


def cmd_check(args: argparse.Namespace) -> int:
    """Run the suite as ``args`` say; print; return the exit status."""
    from ..errors import MoEPluginsError
    from ..testing.case import SuiteOptions
    from ..testing.report import FAILED, INCOMPLETE, PASSED
    from ..testing.suite import run_conformance

    overrides: dict[str, Any] = {
        "device": args.device,
        "supports_budget_us": args.supports_budget_us,
        "supports_limit_us": args.supports_limit_ms * 1e3,
    }
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.cases is not None:
        overrides["random_cases"] = args.cases
    if args.max_elements is not None:
        overrides["max_elements"] = args.max_elements
    if args.catalog_runs is not None:
        overrides["max_catalog_runs"] = args.catalog_runs
    if args.repeats is not None:
        overrides["repeats"] = args.repeats
    if args.models:
        overrides["models"] = tuple(args.models)
    if args.no_catalog:
        overrides["catalog"] = False
    progress = None if args.no_progress else _Progress(sys.stderr)

    def estimate(seconds: float, cases: int) -> None:
        print(
            f"sglang-moe-plugins check: this run will take about {seconds:.0f} s ({cases} cases to run); "
            "--cases N, --catalog-runs N, --model NAME or --no-catalog shorten it",
            file=sys.stderr,
            flush=True,
        )

    try:
        report = run_conformance(args.target, SuiteOptions(), progress=progress, estimate=estimate, **overrides)
    except MoEPluginsError as exc:
        print(f"sglang-moe-plugins check: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        if args.verbose:
            table = _case_table(report)
            if table:
                print(table + "\n")
        print(report.summary())
    if report.status == PASSED:
        return EXIT_PASSED
    if report.status == FAILED:
        return EXIT_FAILED
    if report.status == INCOMPLETE:
        return EXIT_INCOMPLETE
    return EXIT_NOT_EXERCISED


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry: ``python -m sglang_moe_plugins.cli.check TARGET [options]``."""
    parser = argparse.ArgumentParser(prog="sglang-moe-plugins")
    sub = parser.add_subparsers(dest="command", required=True)
    add_check_parser(sub)
    args = parser.parse_args(["check", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
