"""The calls ``sglang-moe-plugins explain`` explains: the models its arguments name (catalog, config.json or
explicit sizes), the EP/TP/group-size checks, and each model's MoE calls per op (:func:`explain_calls`);
importable from :mod:`.explain` too."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from ..catalog import (
    DEFAULT_ROWS,
    ModelSpec,
    deep_gemm_runner_runs_on,
    get_model,
    load_catalog,
    mega_moe_cases,
    model_from_hf_config,
    silu_mul_quant_cases,
)
from ..errors import InvalidArgumentError
from ..hardware import Platform
from ..ops.silu_mul_quant import GROUP_SIZES
from .util import UsageError

__all__ = ["OPS", "explain_calls"]


OPS = ("silu_mul_quant", "mega_moe", "silu_mul_quant_contig")


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
                    "--model", f"{exc.argument} = {_value_text(exc.value)} is not allowed; allowed: {exc.allowed}"
                ) from None
        return load_catalog() if args.model == "all" else (get_model(args.model),)
    missing = [f"--{n}" for n in ("experts", "hidden", "topk") if getattr(args, n) is None]
    if missing:
        raise UsageError(
            "--model",
            f"give --model NAME (or 'all'), or all of --experts/--hidden/--topk; missing {', '.join(missing)}",
        )
    if args.topk > args.experts:
        raise UsageError("--topk", f"{args.topk} is more than the {args.experts} experts; allowed: 1 to {args.experts}")
    act = f"swiglu_limit={args.limit!r}" if args.limit is not None else "silu"
    return (ModelSpec("custom/custom", 0, args.hidden, args.experts, args.topk, 0, act, "", "given"),)


def _value_text(value: object) -> str:
    """A bad value's repr, cut to 120 characters (control characters come escaped: it is a repr)."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int of more digits than str() allows, a nest past the limit
        return f"<{type(value).__name__}>"
    return text if len(text) <= 120 else text[:117] + "..."


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


#: Divisors are listed for counts up to this (at most a thousand trial divisions); a larger count is named instead.
_LIST_DIVISORS_UP_TO = 1 << 20


def _divisors_text(count: int) -> str:
    """The divisors of ``count``, comma-separated; for a count above :data:`_LIST_DIVISORS_UP_TO`, "a divisor of
    COUNT" (its divisors are not searched: the message stays short and comes at once)."""
    if count > _LIST_DIVISORS_UP_TO:
        return f"a divisor of {count}"
    low = [d for d in range(1, math.isqrt(count) + 1) if count % d == 0]
    return ", ".join(map(str, sorted({*low, *(count // d for d in low)})))


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
                text = (
                    f"EP{ep} does not divide {model.short_name}'s {model.experts} experts; "
                    f"allowed: {_divisors_text(model.experts)}"
                )
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
            # TP t splits it into multiples of the group size exactly when t divides inter / group_size.
            text = (
                f"TP{tp} leaves {model.short_name}'s intermediate size {model.inter} not split into multiples of group size "
                f"{group_size}; allowed: {_divisors_text(model.inter // group_size)}"
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
