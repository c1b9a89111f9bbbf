"""``sglang-moe-plugins explain``: which plugin runs each MoE call of a model (both ops), and why not the others."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from .. import api
from ..catalog import (
    DEFAULT_ROWS,
    ModelSpec,
    deep_gemm_runner_runs_on,
    get_model,
    load_catalog,
    mega_moe_cases,
    model_from_hf_config,
    platform_uses_ue8m0,
    silu_mul_quant_cases,
)
from ..errors import InvalidArgumentError
from ..hardware import Platform
from ..ops.silu_mul_quant import GROUP_SIZES
from .health import forced_here_warnings
from .util import UsageError, emit, parse_platform, platform_arg, positive_int, rows_arg, table

__all__ = [
    "add_arguments",
    "add_explain_parser",
    "cmd_explain",
    "resolve_platform",
    "forced_here_warnings",
    "explain_calls",
]

OPS = ("silu_mul_quant", "mega_moe", "silu_mul_quant_contig")


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


def _is_config_path(text: str) -> bool:
    """A config.json (or a directory holding one) rather than a catalog id: catalog ids contain '/' too
    (``Qwen/Qwen3-30B-A3B``), so only a ``.json`` name or an existing path counts."""
    return text.endswith(".json") or os.path.exists(text)


def _models(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    if args.model:
        given = [f"--{n}" for n in ("experts", "hidden", "topk", "limit") if getattr(args, n) is not None]
        if given:
            raise UsageError(
                given[0],
                "not allowed with --model (the catalog or the config.json gives the model's sizes and "
                "swiglu limit); drop it, or drop --model and give --experts/--hidden/--topk",
            )
        if args.model != "all" and _is_config_path(args.model):
            try:
                return (model_from_hf_config(args.model),)
            except InvalidArgumentError as exc:
                raise UsageError(
                    "--model", f"{exc.argument} = {exc.value!r} is not allowed; allowed: {exc.allowed}"
                ) from None
        return load_catalog() if args.model == "all" else (get_model(args.model),)
    missing = [f"--{n}" for n in ("experts", "hidden", "topk") if getattr(args, n) is None]
    if missing:
        raise UsageError(
            "--model",
            f"give --model NAME (or 'all'), or all of --experts/--hidden/--topk; missing {', '.join(missing)}",
        )
    act = f"swiglu_limit={args.limit}" if args.limit is not None else "silu"
    return (ModelSpec("custom/custom", 0, args.hidden, args.experts, args.topk, 0, act, "", "given"),)


def _group_size(args: argparse.Namespace, model: ModelSpec) -> int:
    """``--group-size``, else the group the model's config.json declares, else 128."""
    if args.group_size is not None:
        return args.group_size
    if model.group_size is not None:
        if model.group_size not in GROUP_SIZES:
            raise UsageError(
                "--model",
                f"{model.short_name}'s quantization_config.weight_block_size gives group size {model.group_size}; "
                f"allowed: {', '.join(map(str, GROUP_SIZES))} (or pass --group-size)",
            )
        return model.group_size
    return 128


def _size_flag(model: ModelSpec) -> str:
    return "--hidden" if model.id == "custom/custom" else "--group-size"


def _check_parallel(
    models: tuple[ModelSpec, ...], eps: list[int], tp: int, args: argparse.Namespace, many: bool
) -> list[str]:
    """Errors for a bad --ep/--tp/--hidden/--group-size with one model; with ``--model all`` the skipped pairs, as notes."""
    notes = []
    for model in models:
        group_size = _group_size(args, model)
        for ep in eps:
            if model.experts % ep:
                divisors = [d for d in range(1, model.experts + 1) if model.experts % d == 0]
                text = f"EP{ep} does not divide {model.short_name}'s {model.experts} experts; allowed: {', '.join(map(str, divisors))}"
                if not many:
                    raise UsageError("--ep", text)
                notes.append(f"{model.short_name}: EP{ep} skipped: {text}")
        if model.gpt_oss_activation:
            continue
        if model.inter % group_size:
            if model.id == "custom/custom":
                text = f"{model.inter} is not a multiple of the group size {group_size}; allowed: a multiple of {group_size}"
            else:
                fits = [g for g in GROUP_SIZES if model.inter % g == 0]
                text = (
                    f"{model.short_name}'s intermediate size {model.inter} is not a multiple of group size {group_size}; "
                    f"allowed: {', '.join(map(str, fits)) or 'none of ' + ', '.join(map(str, GROUP_SIZES))}"
                )
            if not many:
                raise UsageError(_size_flag(model), text)
            notes.append(f"{model.short_name}: skipped: {text}")
            continue
        if model.inter % tp or (model.inter // tp) % group_size:
            fits = [
                t
                for t in range(1, model.inter // group_size + 1)
                if model.inter % t == 0 and (model.inter // t) % group_size == 0
            ]
            text = (
                f"TP{tp} leaves {model.short_name}'s intermediate size {model.inter} not split into multiples of group size "
                f"{group_size}; allowed: {', '.join(map(str, fits))}"
            )
            if not many:
                raise UsageError("--tp", text)
            notes.append(f"{model.short_name}: TP{tp} skipped: {text}")
    return notes


def explain_calls(
    args: argparse.Namespace, platform: Platform, ue8m0: bool
) -> tuple[list[tuple[str, str, Any, Any]], list[str]]:
    """``(label, op, shape, config)`` per call (``shape`` None: ``config`` is the note) and the notes."""
    models = _models(args)
    eps = list(dict.fromkeys(args.ep))
    notes = _check_parallel(models, eps, args.tp, args, many=len(models) > 1)
    ops = OPS if args.op == "all" else (args.op,)
    rows = args.rows or DEFAULT_ROWS
    cases: list[tuple[str, str, Any, Any]] = []
    for model in models:
        if model.gpt_oss_activation:
            cases.append(
                (
                    model.short_name,
                    "silu_mul_quant",
                    None,
                    "gpt-oss activation (gemm1_alpha): handed to SGLang's original function, not modelled (docs/reliability.md)",
                )
            )
            continue
        group_size = _group_size(args, model)
        tp_ok = not (model.inter % group_size or model.inter % args.tp or (model.inter // args.tp) % group_size)
        for ep in eps:
            if model.experts % ep:
                continue
            if "silu_mul_quant" in ops and tp_ok and not deep_gemm_runner_runs_on(platform):
                cases.append(
                    (
                        f"{model.short_name} EP{ep} TP{args.tp}",
                        "silu_mul_quant",
                        None,
                        f"not called on {platform}: SGLang runs its DeepGEMM MoE runner (the hooked "
                        f"_varlen_deep_gemm_silu_mul_quant) on sm90 or newer only, so another SGLang MoE backend "
                        f"serves this model there and no plugin is involved",
                    )
                )
            elif "silu_mul_quant" in ops and tp_ok:
                limit = "model" if args.model else args.limit
                reach = _masked_reach(model, ep, args.tp, group_size, limit)
                for case in silu_mul_quant_cases(
                    model,
                    ep=ep,
                    tp=args.tp,
                    rows=rows,
                    platform=platform,
                    ue8m0=ue8m0,
                    group_size=group_size,
                    swiglu_limit=limit,
                ):
                    cases.append((case.label + reach, "silu_mul_quant", case.shape, case.config))
            if "mega_moe" in ops:
                for mega in mega_moe_cases(model, ep=ep, platform=platform):
                    cases.append(
                        (mega.label, "mega_moe", mega.shape, mega.config if mega.shape is not None else mega.note)
                    )
    return cases, notes


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
            )
            views.append((f"{model.short_name} EP{ep} TP{args.tp}", view))
    return views


def _masked_reach(model: ModelSpec, ep: int, tp: int, group_size: int, limit: Any) -> str:
    """A label suffix where the installed SGLang's guard keeps standard dispatch off the masked layout."""
    from ..integrations.sglang.versions import _release_key, sglang_version
    from .layout_view import GUARD_RELEASE, sglang_guard_reason

    release = sglang_version()
    swiglu_limit = model.swiglu_limit if limit == "model" else limit
    if release is None or _release_key(release) < _release_key(GUARD_RELEASE):
        return ""
    reason = sglang_guard_reason(
        experts=model.experts // ep, hidden=model.inter // tp, group_size=group_size, swiglu_limit=swiglu_limit
    )
    if reason is None:
        return ""
    return (
        f" [masked layout: SGLang {release}'s guard sends standard dispatch to the compact layout ({reason}) "
        "unless the package lifts it (see 'DeepGEMM layouts'); DeepEP low-latency always calls it]"
    )


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
    finally:
        quiet.setLevel(level)
    layouts = _layouts(args, platform, ue8m0, selector)
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
    p.add_argument("--limit", type=float, help="swiglu_limit (only without --model; default none)")
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
