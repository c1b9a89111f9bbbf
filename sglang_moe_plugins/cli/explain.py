"""``sglang-moe-plugins explain``: which plugin runs each MoE call of a model (both ops), and why not the others."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from .. import api
from ..catalog import DEFAULT_ROWS, deep_gemm_runner_runs_on, platform_uses_ue8m0
from ..hardware import Platform
from ..ops.silu_mul_quant import GROUP_SIZES
from .explain_calls import OPS, _group_size, _models, explain_calls
from .health import forced_here_warnings
from .util import UsageError, emit, limit_arg, parse_platform, platform_arg, positive_int, rows_arg, table

__all__ = [
    "add_arguments",
    "add_explain_parser",
    "cmd_explain",
    "resolve_platform",
    "forced_here_warnings",
    "explain_calls",
]


def resolve_platform(text: str) -> tuple[Platform, str]:
    """The platform and a sentence saying where it came from (``local`` says what this machine is)."""
    platform = parse_platform(text)
    if text != "local":
        return platform, f"{platform} (--platform {text})"
    if platform.is_cuda:
        return platform, f"{platform} (this machine)"
    return (
        platform,
        f"{platform} (this machine has no CUDA device, so cpu is assumed: pass --platform sm90 or sm100 to explain a GPU server)",
    )


def _layouts(args: argparse.Namespace, platform: Platform, ue8m0: bool, selector: Any) -> list[tuple[str, Any]]:
    """Per model and EP size: the layout the installed SGLang takes, and what runs in it (cli/layout_view.py)."""
    from .layout_view import layout_view

    if args.op not in ("all", "silu_mul_quant", "silu_mul_quant_contig") or not deep_gemm_runner_runs_on(platform):
        return []
    views = []
    stock = selector.registry.config.stock
    for model in _models(args):
        group_size = _group_size(args, model)
        if model.gpt_oss_activation or model.inter % args.tp or (model.inter // args.tp) % group_size:
            continue
        limit = model.swiglu_limit if args.model else args.limit
        for ep in dict.fromkeys(args.ep):
            if model.experts % ep:
                continue
            view = layout_view(
                experts=model.experts // ep,
                hidden=model.inter // args.tp,
                group_size=group_size,
                swiglu_limit=limit,
                topk=model.topk,
                platform=platform,
                ue8m0=ue8m0,
                selector=selector,
                masked_layout=selector.registry.config.masked_layout,
                smq_hooked="silu_mul_quant" not in stock,
                contig_hooked="silu_mul_quant_contig" not in stock,
            )
            views.append((f"{model.short_name} EP{ep} TP{args.tp}", view))
    return views


def _outcome(selection: Any, forced: str | None) -> str:
    if selection.chosen is not None:
        return f"runs {selection.chosen.name}" + (" [force]" if forced else "")
    if forced:
        return f"raises NoPluginAvailableError (force.{selection.op} = {forced!r} cannot run it)"
    return "raises NoPluginAvailableError (no enabled plugin supports it)"


def cmd_explain(args: argparse.Namespace) -> int:
    platform, platform_text = resolve_platform(args.platform)
    ue8m0 = bool(args.ue8m0) or platform_uses_ue8m0(platform)
    if ue8m0 and not args.ue8m0:
        platform_text += "; UE8M0 scales (SGLang always uses them on sm100)"
    selector = api.get_selector()
    registry = selector.registry
    cases, notes = explain_calls(args, platform, ue8m0)
    warnings = forced_here_warnings(registry)
    policy = (
        "strict: a plugin that fails at run time raises"
        if registry.config.strict
        else "a silu_mul_quant plugin that fails at run time is logged once and the next one runs; mega_moe raises (collective)"
    )
    blocks = [
        "\n".join(
            [f"platform: {platform_text}", f"failure policy: {policy}"]
            + [f"note: {n}" for n in notes]
            + [f"priority rule: {r.describe()}" for r in registry.config.priority_rules]
            + [f"WARNING: {w}" for w in warnings]
        )
    ]
    calls = []
    quiet = logging.getLogger("sglang_moe_plugins.core.dispatcher")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the no-plugin WARNING would repeat what is printed here
    try:
        for label, op, shape, config in cases:
            if shape is None:
                blocks.append(f"{label}: {op}: {config}")
                calls.append(
                    {
                        "call": label,
                        "op": op,
                        "shape": None,
                        "config": None,
                        "chosen": None,
                        "forced": False,
                        "outcome": "not modelled" if "SGLang's original" in config else "not called",
                        "note": config,
                        "candidates": [],
                    }
                )
                continue
            selection = selector.explain(op, shape, config)
            forced = registry.config.force.get(op)
            outcome = _outcome(selection, forced)
            rows = [
                (c.name + (" [force]" if c.name == forced else ""), c.priority, c.verdict, c.reason)
                for c in selection.candidates
            ]
            blocks.append(
                f"{label}: {op} {selection.key_description()}\n  -> {outcome}\n"
                + "\n".join(
                    "  " + line for line in table(("plugin", "priority", "verdict", "reason"), rows).splitlines()
                )
            )
            calls.append(
                {
                    "call": label,
                    "op": op,
                    "shape": shape,
                    "config": config,
                    "chosen": selection.chosen.name if selection.chosen else None,
                    "forced": forced is not None,
                    "outcome": outcome,
                    "note": None,
                    "candidates": list(selection.candidates),
                }
            )
        layouts = _layouts(args, platform, ue8m0, selector)  # its selections are printed, not logged
    finally:
        quiet.setLevel(level)
    blocks += [f"{label}: DeepGEMM layouts\n" + "\n".join(view.lines()) for label, view in layouts]
    if not calls and not layouts:
        raise UsageError("--model", "no call matches these arguments")
    payload = {
        "platform": str(platform),
        "platform_source": platform_text,
        "ue8m0": ue8m0,
        "strict": registry.config.strict,
        "force": dict(registry.config.force),
        "notes": notes,
        "warnings": warnings,
        "calls": calls,
        "priority_rules": [r.describe() for r in registry.config.priority_rules],
        "layouts": [{"call": label, **view.__dict__} for label, view in layouts],
    }
    emit(args, payload, "\n\n".join(blocks))
    return 0


def add_explain_parser(sub: Any) -> None:
    """Add the ``explain`` command to an ``argparse`` subparsers object."""
    from . import COMMANDS

    add_arguments(sub.add_parser("explain", help=COMMANDS["explain"]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``explain`` command's description and arguments; runs :func:`cmd_explain`."""
    p.description = (
        "Explain plugin selection for a catalog model's MoE calls (or explicit sizes) on a platform. "
        "A call no enabled plugin supports raises NoPluginAvailableError at run time."
    )
    p.add_argument(
        "--model",
        help="a model of the embedded catalog (id or short name), 'all', or a HuggingFace config.json "
        "(path; for models the catalog lacks)",
    )
    p.add_argument("--experts", type=positive_int, help="routed experts (only without --model)")
    p.add_argument("--hidden", type=positive_int, help="per-expert intermediate size D (only without --model)")
    p.add_argument("--topk", type=positive_int, help="experts per token (only without --model)")
    p.add_argument(
        "--limit", type=limit_arg, help="swiglu_limit, a finite number >= 2**-126 (only without --model; default none)"
    )
    p.add_argument(
        "--ep",
        type=positive_int,
        nargs="+",
        default=[1],
        help="expert-parallel size(s), each dividing the experts (default 1)",
    )
    p.add_argument("--tp", type=positive_int, default=1, help="MoE tensor-parallel size (default 1)")
    p.add_argument(
        "--rows",
        type=rows_arg,
        help=f"padded rows per expert N, comma-separated ints >= 1 (default {','.join(map(str, DEFAULT_ROWS))})",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        choices=GROUP_SIZES,
        help="quantization group size (default: the config.json's weight_block_size, else 128)",
    )
    p.add_argument(
        "--ue8m0", action="store_true", help="UE8M0 packed scales on sm90 too (implied on sm100, as SGLang does)"
    )
    p.add_argument(
        "--platform",
        type=platform_arg,
        default="local",
        help="local (this machine; default, shown in the output), cpu, or smNN (sm90, sm100)",
    )
    p.add_argument("--op", choices=("all", *OPS), default="all", help="which op's calls to explain (default all)")
    p.add_argument("--json", action="store_true", help='typed JSON; errors as {"error": ...}')
    p.set_defaults(func=cmd_explain)
