"""``sglang-moe-plugins explain``: which plugin runs each MoE call of a model (every op), why not the others, and
what stock SGLang (the installed release) does with the call instead: its kernel, or that it crashes. Exits 1 when
a call would raise; ``--summary`` prints one line per call; this machine's warnings are kept apart from a
``--platform`` explained elsewhere."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import Any

from .. import api
from ..catalog import DEFAULT_ROWS, deep_gemm_runner_runs_on, platform_uses_ue8m0
from ..hardware import Platform, local_platform
from ..ops.silu_mul_quant import GROUP_SIZES
from .explain_calls import OPS, Call, _group_size, _models, _tp_ok, explain_calls, parallel_sizes, served
from .health import forced_here_warnings
from .layout_view import stock_mega
from .util import UsageError, emit, int_list_arg, limit_arg, parse_platform, platform_arg, positive_int, rows_arg, table

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
    """Per model and EP/TP size: the layout the installed SGLang takes, and what runs in it (cli/layout_view.py)."""
    from .layout_view import layout_view

    if args.op not in ("all", "silu_mul_quant", "silu_mul_quant_contig") or not deep_gemm_runner_runs_on(platform):
        return []
    views = []
    stock = selector.registry.config.stock
    eps, tps = parallel_sizes(args)
    for model in _models(args):
        if model.gpt_oss_activation or not served(model, args):
            continue
        group_size = _group_size(args, model)
        limit = model.swiglu_limit if args.model else args.limit
        for ep in eps:
            if model.experts % ep:
                continue
            for tp in tps:
                if not _tp_ok(model, tp, group_size):
                    continue
                view = layout_view(
                    experts=model.experts // ep,
                    hidden=model.inter // tp,
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
                views.append((f"{model.short_name} EP{ep} TP{tp}", view))
    return views


def _outcome(selection: Any, forced: str | None) -> str:
    if selection.chosen is not None:
        return f"runs {selection.chosen.name}" + (" [force]" if forced else "")
    if forced:
        return f"raises NoPluginAvailableError (force.{selection.op} = {forced!r} cannot run it)"
    return "raises NoPluginAvailableError (no enabled plugin supports it)"


def _withheld_to_host(selection: Any, forced: str | None, strict: bool) -> bool:
    """No plugin runs the call only because the pure-torch reference is withheld on CUDA: the hook hands it to
    SGLang's own function (not under strict; never when forced)."""
    withheld = any(c.verdict == "withheld" for c in selection.candidates)
    return selection.chosen is None and forced is None and not strict and withheld


def _explained(call: Call, selector: Any, registry: Any) -> tuple[str, dict[str, Any], tuple[str, ...]]:
    """One call: its text block, its JSON record and its summary row."""
    if call.shape is None:
        outcome = "not called" if call.modelled else "not modelled"
        record: dict[str, Any] = {"call": call.label, "op": call.op, "shape": None, "config": None, "chosen": None}
        record.update(
            forced=False, outcome=outcome, note=call.note, candidates=[], stock=None, raises=False, hooked=call.hooked
        )
        return (
            f"{call.label}: {call.op}: {call.note}",
            record,
            (call.label, call.op, "-", "-", f"{outcome}: {call.note}"),
        )
    selection = selector.explain(call.op, call.shape, call.config)
    if call.op == "mega_moe" and call.stock is not None:  # DeepGEMM's shape checks, as its plugin reads them
        label = call.label.rsplit(" ", 1)[-1]
        call = dataclasses.replace(
            call, stock=stock_mega(call.stock.release, label, call.config.variant, selection.candidates)
        )
    stock_text = call.stock.runs if call.stock is not None else "-"
    forced = registry.config.force.get(call.op)
    if call.op in registry.config.stock or not call.hooked:
        why = (
            f"op {call.op} is in 'stock'"
            if call.op in registry.config.stock
            else "the package hooks it on later releases"
        )
        outcome = f"stock SGLang runs it ({why})"
        chosen, raises = None, bool(call.stock and call.stock.raises)
    elif registry.config.parity and call.op == "silu_mul_quant" and call.stock is not None and not call.stock.raises:
        outcome = "SGLang's own function runs it (parity = true: stock SGLang serves this call)"
        chosen, raises = None, False
    elif _withheld_to_host(selection, forced, registry.config.strict):
        outcome = "SGLang's own function runs it (only the pure-torch reference could, withheld on CUDA)"
        chosen, raises = None, bool(call.stock and call.stock.raises)
    else:
        outcome, chosen = _outcome(selection, forced), selection.chosen
        raises = chosen is None
    rows = [
        (c.name + (" [force]" if c.name == forced else ""), c.priority, c.verdict, c.reason)
        for c in selection.candidates
    ]
    lines = [f"{call.label}: {call.op} {selection.key_description()}"]
    if call.stock is not None:
        lines.append(f"  {call.stock.describe()}")
    lines.append(f"  -> {outcome}")
    lines += ["  " + line for line in table(("plugin", "priority", "verdict", "reason"), rows).splitlines()]
    record = {  # the keys in the order of the not-called record above
        "call": call.label,
        "op": call.op,
        "shape": call.shape,
        "config": call.config,
        "chosen": chosen.name if chosen else None,
        "forced": forced is not None,
        "outcome": outcome,
        "note": None,
        "candidates": list(selection.candidates),
        "stock": call.stock,
        "raises": raises,
        "hooked": call.hooked,
    }
    package = (chosen.name + (" [force]" if forced else "")) if chosen else outcome
    shape_text = selection.key_description().split(" [", 1)[0]
    return "\n".join(lines), record, (call.label.split(" [", 1)[0], call.op, shape_text, stock_text, package)


def cmd_explain(args: argparse.Namespace) -> int:
    platform, platform_text = resolve_platform(args.platform)
    ue8m0 = bool(args.ue8m0) or platform_uses_ue8m0(platform)
    if ue8m0 and not args.ue8m0:
        platform_text += "; UE8M0 scales (SGLang always uses them on sm100)"
    selector = api.get_selector()
    registry = selector.registry
    calls, notes = explain_calls(args, platform, ue8m0)
    here = forced_here_warnings(registry)
    # Warnings about this machine describe the explained platform only when it is this machine.
    warnings, this_machine = (here, []) if args.platform == "local" else ([], here)
    policy = (
        "strict: a plugin that fails at run time raises"
        if registry.config.strict
        else "a silu_mul_quant plugin that fails at run time is logged once and the next one runs; mega_moe raises (collective)"
    )
    head = (
        [f"platform: {platform_text}", f"failure policy: {policy}"]
        + [f"note: {n}" for n in notes]
        + [f"priority rule: {r.describe()}" for r in registry.config.priority_rules]
        + [f"WARNING: {w}" for w in warnings]
    )
    blocks, records, summary = ["\n".join(head)], [], []
    quiet = logging.getLogger("sglang_moe_plugins.core.dispatcher")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the no-plugin WARNING would repeat what is printed here
    try:
        for call in calls:
            block, record, row = _explained(call, selector, registry)
            blocks.append(block)
            records.append(record)
            summary.append(row)
        layouts = _layouts(args, platform, ue8m0, selector)  # its selections are printed, not logged
    finally:
        quiet.setLevel(level)
    if not calls and not layouts:
        raise UsageError("--model", "no call matches these arguments")
    tail = []
    if this_machine:
        tail.append(
            f"this machine ({local_platform()}), not the --platform {args.platform} explained above:\n"
            + "\n".join(f"  WARNING: {w}" for w in this_machine)
        )
    raising = sum(r["raises"] for r in records)
    if raising:
        tail.append(f"{raising} call(s) would raise (see '-> raises' or 'crashes' above): exit status 1")
    from ..integrations.sglang.versions import sglang_version

    release = sglang_version() or "(not installed)"
    payload = {
        "platform": str(platform),
        "platform_source": platform_text,
        "ue8m0": ue8m0,
        "strict": registry.config.strict,
        "force": dict(registry.config.force),
        "sglang": sglang_version(),
        "notes": notes,
        "warnings": warnings,
        "this_machine": this_machine,
        "calls": records,
        "raising_calls": raising,
        "priority_rules": [r.describe() for r in registry.config.priority_rules],
        "layouts": [{"call": label, **view.__dict__} for label, view in layouts],
        "summary": [dict(zip(("call", "op", "shape", "stock", "package"), row)) for row in summary],
    }
    if args.summary:
        text = "\n\n".join(
            ["\n".join(head), *tail, table(("call", "op", "shape", f"stock SGLang {release}", "package"), summary)]
        )
    else:
        blocks += [f"{label}: DeepGEMM layouts\n" + "\n".join(view.lines()) for label, view in layouts]
        text = "\n\n".join(blocks + tail)
    emit(args, payload, text)
    return 1 if raising else 0


def add_explain_parser(sub: Any) -> None:
    """Add the ``explain`` command to an ``argparse`` subparsers object."""
    from . import COMMANDS

    add_arguments(sub.add_parser("explain", help=COMMANDS["explain"]))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``explain`` command's description and arguments; runs :func:`cmd_explain`."""
    p.description = (
        "Explain plugin selection for a catalog model's MoE calls (or explicit sizes) on a platform, and what stock "
        "SGLang (the installed release) does with each. A call no enabled plugin supports raises "
        "NoPluginAvailableError at run time: exit status 1 when any call would raise."
    )
    p.add_argument(
        "--model",
        help="a model of the embedded catalog (id or short name), 'all', or a HuggingFace config.json or model "
        "directory (SGLang's --model-path: its config.json is read; for models the catalog lacks)",
    )
    p.add_argument("--experts", type=positive_int, help="routed experts (only without --model)")
    p.add_argument("--hidden", type=positive_int, help="per-expert intermediate size D (only without --model)")
    p.add_argument("--topk", type=positive_int, help="experts per token (only without --model)")
    p.add_argument(
        "--limit", type=limit_arg, help="swiglu_limit, a finite number >= 2**-126 (only without --model; default none)"
    )
    p.add_argument(
        "--ep",
        type=int_list_arg,
        nargs="+",
        default=[(1,)],
        help="expert-parallel size(s), comma-separated (1,2,8; space-separated also accepted), each dividing the "
        "experts (default 1)",
    )
    p.add_argument(
        "--tp",
        type=int_list_arg,
        nargs="+",
        default=[(1,)],
        help="MoE tensor-parallel size(s), comma-separated (2,4; space-separated also accepted) (default 1)",
    )
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
    p.add_argument(
        "--quantization",
        choices=("fp8",),
        help="as SGLang's --quantization fp8: a bf16 config.json explained with online FP8 weights (group 128)",
    )
    p.add_argument(
        "--summary", action="store_true", help="one line per call: op, shape, stock SGLang's outcome, the plugin"
    )
    p.add_argument("--json", action="store_true", help='typed JSON; errors as {"error": ...}')
    p.set_defaults(func=cmd_explain)
