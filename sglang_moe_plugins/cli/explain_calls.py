"""The calls ``sglang-moe-plugins explain`` explains: the models its arguments name (catalog, config.json, a model
directory or explicit sizes), the EP/TP/group-size checks, and each model's MoE calls per op with what stock SGLang
(the installed release) does with each (:func:`explain_calls`); importable from :mod:`.explain` too."""

from __future__ import annotations

import argparse
import dataclasses
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
from .layout_view import StockOutcome, hooked_here, stock_contig, stock_masked, stock_mega
from .util import UsageError, flat

__all__ = ["OPS", "Call", "explain_calls"]


OPS = ("silu_mul_quant", "mega_moe", "silu_mul_quant_contig")

_DENSE = (
    "dense model (its config.json names no routed experts: {keys}): SGLang runs no MoE layer for it, so neither "
    "the DeepGEMM MoE runner nor MegaMoE is called and no plugin is involved"
)
_BF16_MEGA = "bf16 weights: not modelled (SGLang's MegaMoE variants take FP8 or FP4 expert weights)"


@dataclasses.dataclass(frozen=True)
class Call:
    """One call explain explains, or (``shape`` None) why a model makes none: ``note`` says why, ``modelled`` False
    when the package does not model it (rather than SGLang not making it)."""

    label: str
    op: str
    shape: Any = None
    config: Any = None
    note: str = ""
    modelled: bool = True
    #: What stock SGLang (the installed release) does with the call.
    stock: StockOutcome | None = None
    #: Whether the package hooks the op on the installed release (else stock SGLang runs the call).
    hooked: bool = True


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
            from ..hf_config import DenseModelError

            try:
                return (model_from_hf_config(args.model),)
            except DenseModelError as exc:
                note = _DENSE.format(keys=exc.argument.replace("/", ", "))
                return (ModelSpec(f"config/{exc.name}", 0, 0, 0, 0, 0, "none", "", "dense", None, note),)
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
    models: tuple[ModelSpec, ...], eps: list[int], tps: list[int], args: argparse.Namespace, many: bool
) -> list[str]:
    """Errors for a bad --ep/--tp/--hidden/--group-size with one model; with ``--model all`` the skipped pairs, as notes."""
    notes = []
    for model in models:
        if not model.experts:  # dense: nothing to split
            continue
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
        for tp in tps:
            if not _tp_ok(model, tp, group_size):
                # TP t splits it into multiples of the group size exactly when t divides inter / group_size.
                text = (
                    f"TP{tp} leaves {model.short_name}'s intermediate size {model.inter} not split into multiples "
                    f"of group size {group_size}; allowed: {_divisors_text(model.inter // group_size)}"
                )
                if not many:
                    raise UsageError("--tp", text)
                notes.append(f"{model.short_name}: TP{tp} skipped: {text}")
    return notes


def _tp_ok(model: ModelSpec, tp: int, group_size: int) -> bool:
    return not (model.inter % group_size or model.inter % tp or (model.inter // tp) % group_size)


def parallel_sizes(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """``--ep`` and ``--tp`` as lists (each given comma- or space-separated, or as one int)."""
    return flat(args.ep if isinstance(args.ep, (list, tuple)) else [args.ep]), flat(
        args.tp if isinstance(args.tp, (list, tuple)) else [args.tp]
    )


def served(model: ModelSpec, args: argparse.Namespace) -> bool:
    """Whether SGLang's DeepGEMM runner makes the model's calls: not for a dense model or another quantization;
    a bf16 one only under ``--quantization fp8`` (online FP8, group 128)."""
    from ..hf_config import BF16_NOT_SERVED

    if not model.not_served:
        return True
    return model.experts > 0 and model.not_served == BF16_NOT_SERVED and getattr(args, "quantization", None) == "fp8"


def explain_calls(args: argparse.Namespace, platform: Platform, ue8m0: bool) -> tuple[list[Call], list[str]]:
    """Every call of the models at each EP and TP size, and the notes (EP/TP sizes skipped)."""
    from ..integrations.sglang.versions import sglang_version

    models = _models(args)
    eps, tps = parallel_sizes(args)
    notes = _check_parallel(models, eps, tps, args, many=len(models) > 1)
    ops = OPS if args.op == "all" else (args.op,)
    release = sglang_version()
    calls: list[Call] = []
    for model in models:
        if model.gpt_oss_activation:
            note = "gpt-oss activation (gemm1_alpha): handed to SGLang's original function, not modelled (docs/reliability.md)"
            calls.append(Call(model.short_name, "silu_mul_quant", note=note, modelled=False))
            continue
        if not served(model, args):
            calls += _not_served(model, ops)
            continue
        if model.not_served:  # bf16 under --quantization fp8: online FP8 weights, group 128
            model = dataclasses.replace(model, not_served="", quant="fp8 (--quantization fp8, online)")
        elif _catalog_bf16(model):
            notes.append(
                f"{model.short_name}: the catalog lists bf16 weights ({model.quant}); its calls are explained as served "
                "in FP8 (an FP8 checkpoint, or SGLang's --quantization fp8): as published, SGLang's DeepGEMM runner "
                "takes its bf16 path and no plugin is involved"
            )
        group_size = _group_size(args, model)
        for ep in eps:
            if model.experts % ep:
                continue
            for tp in tps:
                if _tp_ok(model, tp, group_size):
                    calls += _runner_calls(args, model, ep, tp, group_size, ops, platform, ue8m0, release)
            if "mega_moe" in ops:
                for mega in mega_moe_cases(model, ep=ep, platform=platform):
                    if mega.shape is None:
                        calls.append(Call(mega.label, "mega_moe", note=mega.note))
                        continue
                    variant = str(getattr(mega.config, "variant", ""))
                    stock = stock_mega(release, mega.label.rsplit(" ", 1)[-1], variant)
                    hooked = hooked_here("mega_moe", release)
                    calls.append(Call(mega.label, "mega_moe", mega.shape, mega.config, stock=stock, hooked=hooked))
    return calls, notes


def _catalog_bf16(model: ModelSpec) -> bool:
    """A catalog model published in bf16 only (no FP8 variant named)."""
    catalog = not model.id.startswith(("config/", "custom/"))
    return catalog and model.quant.startswith("bf16") and "fp8" not in model.quant.lower()


def _not_served(model: ModelSpec, ops: tuple[str, ...]) -> list[Call]:
    """A model SGLang's DeepGEMM runner makes no call for: one line per op saying why."""
    from ..hf_config import BF16_NOT_SERVED

    bf16 = model.not_served == BF16_NOT_SERVED
    out = []
    for op in ("silu_mul_quant", "mega_moe"):
        if op in ops or (op == "silu_mul_quant" and "silu_mul_quant_contig" in ops):
            note = _BF16_MEGA if bf16 and op == "mega_moe" else model.not_served
            modelled = model.experts == 0 or (bf16 and op == "silu_mul_quant")
            out.append(Call(model.short_name, op, note=note, modelled=modelled))
    return out


def _runner_calls(
    args: argparse.Namespace,
    model: ModelSpec,
    ep: int,
    tp: int,
    group_size: int,
    ops: tuple[str, ...],
    platform: Platform,
    ue8m0: bool,
    release: str | None,
) -> list[Call]:
    """The DeepGEMM runner's calls of one model at EP ``ep``, TP ``tp``: masked (per N), then compact."""
    from ..ops.silu_mul_quant_contig import ContigConfig, ContigShape

    head = f"{model.short_name} EP{ep} TP{tp}"
    if not deep_gemm_runner_runs_on(platform):
        if "silu_mul_quant" not in ops and "silu_mul_quant_contig" not in ops:
            return []
        note = (
            f"not called on {platform}: SGLang runs its DeepGEMM MoE runner (the hooked "
            "_varlen_deep_gemm_silu_mul_quant and compact runner) on sm90 or newer only, so another SGLang MoE "
            "backend serves this model there and no plugin is involved"
        )
        return [Call(head, "silu_mul_quant", note=note)]
    limit = "model" if args.model else args.limit
    swiglu_limit = model.swiglu_limit if limit == "model" else limit
    calls = []
    if "silu_mul_quant" in ops:
        reach = _masked_reach(model, ep, tp, group_size, limit)
        hooked = hooked_here("silu_mul_quant", release)
        for case in silu_mul_quant_cases(
            model,
            ep=ep,
            tp=tp,
            rows=args.rows or DEFAULT_ROWS,
            platform=platform,
            ue8m0=ue8m0,
            group_size=group_size,
            swiglu_limit=limit,
        ):
            shape = case.shape
            stock = stock_masked(
                release,
                experts=shape.num_experts,
                rows=shape.max_rows,
                hidden=shape.hidden,
                group_size=group_size,
                clamped=swiglu_limit is not None,
            )
            calls.append(Call(case.label + reach, "silu_mul_quant", shape, case.config, stock=stock, hooked=hooked))
    if "silu_mul_quant_contig" in ops:
        layout = "ue8m0_packed" if ue8m0 else "row_major"
        config = ContigConfig(platform, swiglu_limit, False, layout, False)  # type: ignore[arg-type]
        calls.append(
            Call(
                f"{head} compact",
                "silu_mul_quant_contig",
                ContigShape(model.inter // tp, group_size),
                config,
                stock=stock_contig(release, clamped=swiglu_limit is not None),
                hooked=hooked_here("silu_mul_quant_contig", release),
            )
        )
    return calls


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
