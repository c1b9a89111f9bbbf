"""The ``bench`` subcommand: arguments, the CUDA check, and where the results go."""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
from typing import TYPE_CHECKING, Any

from .. import api
from ..bench.provenance import run_info
from ..bench.report import payload, plot, priority_toml, rank_plugins, results_table, shape_rules
from ..bench.runner import bench_cases, measure
from ..bench.timing import CudaGraphTimer, Timer
from ..catalog import DEFAULT_ROWS, ModelSpec, get_model
from ..hardware import platform_of
from .util import UsageError, emit, positive_int, rows_arg, to_json

if TYPE_CHECKING:
    import torch

__all__ = ["add_arguments", "add_bench_parser", "cmd_bench", "run_bench"]


def _models(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    if args.model:
        given = [f"--{n}" for n in ("experts", "hidden", "topk", "limit") if getattr(args, n) is not None]
        if given:
            raise UsageError(
                given[0], "not allowed with --model (the catalog gives the model's sizes); drop it or drop --model"
            )
        models = tuple(dict.fromkeys(get_model(name) for name in args.model))
    else:
        missing = [f"--{n}" for n in ("experts", "hidden", "topk") if getattr(args, n) is None]
        if missing:
            raise UsageError(
                "--model",
                f"give --model NAME (repeatable), or all of --experts/--hidden/--topk; missing {', '.join(missing)}",
            )
        act = f"swiglu_limit={args.limit}" if args.limit is not None else "silu"
        models = (ModelSpec("custom/custom", 0, args.hidden, args.experts, args.topk, 0, act, "", "given"),)
    for model in models:
        if model.gpt_oss_activation:
            raise UsageError(
                "--model",
                f"{model.short_name}'s gpt-oss activation goes to SGLang's own path (not modelled): nothing to time",
            )
        if model.experts % args.ep:
            raise UsageError(
                "--ep",
                f"EP{args.ep} does not divide {model.short_name}'s {model.experts} experts; allowed: a divisor of {model.experts}",
            )
        if model.inter % args.tp or (model.inter // args.tp) % 128:
            raise UsageError(
                "--tp",
                f"TP{args.tp} does not split {model.short_name}'s intermediate size {model.inter} into multiples of 128",
            )
    return models


def _check_outputs(args: argparse.Namespace) -> None:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "--plot", "needs matplotlib, which is not installed here (pip install matplotlib), or drop --plot"
        )
    for flag, path in (("--plot", args.plot), ("--write-config", args.write_config)):
        if path and not pathlib.Path(path).resolve().parent.is_dir():
            raise UsageError(flag, f"{path!r}: its folder does not exist")


def run_bench(args: argparse.Namespace, timer: Timer, device: torch.device) -> int:
    """Measure and report (``cmd_bench`` passes the real timer and the current CUDA device)."""
    models = _models(args)
    _check_outputs(args)
    platform = platform_of(device)
    cases = bench_cases(models, ep=args.ep, tp=args.tp, rows=args.rows or DEFAULT_ROWS, platform=platform)
    registry = api.get_registry()
    progress = None if args.quiet else sys.stderr
    bandwidth, results = measure(registry, cases, timer, device, progress)
    info = run_info()
    ranking = rank_plugins(results, {r.name: r.priority for r in registry.records("silu_mul_quant")})
    rules = shape_rules(cases, results, ranking)
    data = payload(cases, results, bandwidth, info, ranking, rules)
    text = results_table(cases, results, bandwidth)
    text = f"device: {info['device'] or platform} commit: {info['commit']}\n" + text
    text += "\n\npriorities this measurement supports:\n" + "\n".join(f"  {n} = {p}  ({w})" for n, p, w in ranking)
    if rules:
        text += (
            "\n\nper-shape rules this measurement supports (calls whose fastest plugin is not first above):\n"
            + "\n".join(f"  {c.shape.describe()}: {n} = {p}  ({w})" for c, n, p, w in rules)
        )
    if args.plot:
        plot(cases, results, args.plot, f"silu_mul_quant on {info['device'] or platform}, EP{args.ep} TP{args.tp}")
        text += f"\n\nplot: {args.plot}"
    if args.write_config:
        header = {
            "device": info["device"] or str(platform),
            "commit": info["commit"],
            "calls": ", ".join(c.label for c in cases),
        }
        pathlib.Path(args.write_config).write_text(priority_toml(ranking, header, rules))
        text += f"\nconfig: {args.write_config} (use it as SGLANG_MOE_PLUGINS_CONFIG, or copy its [priority] table and [[priority_rules]] into yours)"
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(to_json(data), indent=1))
        (out / "bench.md").write_text("```\n" + text + "\n```\n")
    emit(args, data, text)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    _models(args)  # argument errors first, also without a GPU
    _check_outputs(args)
    if not torch.cuda.is_available():
        raise UsageError(
            "bench",
            f"needs a CUDA GPU, and torch {torch.__version__} sees none here "
            "(use `explain` to see the selection without one)",
        )
    return run_bench(args, CudaGraphTimer(), torch.device("cuda", torch.cuda.current_device()))


def add_bench_parser(sub: Any) -> None:
    """Add the ``bench`` command to an ``argparse`` subparsers object."""
    from . import COMMANDS

    add_arguments(sub.add_parser("bench", help=COMMANDS["bench"]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``bench`` command's description and arguments; runs :func:`cmd_bench`."""
    p.description = (
        "Times each enabled plugin that supports each silu_mul_quant call of the model(s) at --ep/--tp, "
        "decode and prefill row counts, as benchmarks/silu_mul_quant.py does (CUDA-graph replays, inputs "
        "rotated past L2, the copy ceiling measured alongside). Needs a CUDA GPU (exit 2 without one)."
    )
    p.add_argument("--model", action="append", help="a catalog model (id or short name); repeat for several")
    p.add_argument("--experts", type=positive_int, help="routed experts (only without --model)")
    p.add_argument("--hidden", type=positive_int, help="per-expert intermediate size D (only without --model)")
    p.add_argument("--topk", type=positive_int, help="experts per token (only without --model)")
    p.add_argument("--limit", type=float, help="swiglu_limit (only without --model)")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel size (default 1)")
    p.add_argument("--tp", type=positive_int, default=1, help="MoE tensor-parallel size (default 1)")
    p.add_argument(
        "--rows",
        type=rows_arg,
        help=f"padded rows per expert N, comma separated (default {','.join(map(str, DEFAULT_ROWS))}: decode, prefill)",
    )
    p.add_argument("--json", action="store_true", help="typed JSON on stdout")
    p.add_argument(
        "--plot", metavar="FILE.png", help="fraction of the copy ceiling per call and plugin (needs matplotlib)"
    )
    p.add_argument(
        "--write-config",
        metavar="FILE.toml",
        help="write the [priority] table this measurement supports, and a [[priority_rules]] entry per call whose fastest plugin is not first in it",
    )
    p.add_argument("--out", metavar="DIR", help="also write bench.json and bench.md into DIR")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_bench)
