"""The ``sglang-moe-plugins`` command: ``list``, ``explain``, ``doctor``, ``check``. ``--json`` for machines."""

from __future__ import annotations

import argparse
import json
import os
import platform as _py_platform
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Sequence

from . import api
from ._version import CONTRACT_VERSION, __version__
from .catalog import DEFAULT_ROWS, get_model, load_catalog, silu_mul_quant_cases
from .errors import ConfigError, MoEPluginsError
from .hardware import Platform, local_platform
from .testing.cli_check import add_check_parser

__all__ = ["main", "build_parser"]


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def _parse_platform(text: str | None) -> Platform:
    if text is None or text == "local":
        return local_platform()
    text = text.lower().strip()
    if text == "cpu":
        return Platform.cpu()
    if text.startswith("sm") and text[2:].isdigit() and len(text) >= 4:
        number = int(text[2:])
        return Platform.cuda(number // 10, number % 10)
    raise argparse.ArgumentTypeError(f"--platform {text!r}: use cpu, local, or smNN (e.g. sm90, sm100)")


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    print(json.dumps(payload, indent=2, default=str) if args.json else text)


# -- list ----------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    registry = api.get_registry()
    here = local_platform()
    rows, payload = [], []
    for record in registry.records():
        try:
            avail = record.plugin.available(here) if hasattr(record.plugin, "available") else None
        except Exception as exc:  # noqa: BLE001 - show it, do not die
            avail_text = f"error: {type(exc).__name__}: {exc}"
        else:
            avail_text = "yes" if avail is None or avail else f"no: {avail.reason}"
        state = record.status
        rows.append((record.name, record.op, record.priority, state, avail_text, record.distribution or "-"))
        payload.append({
            "name": record.name, "op": record.op, "priority": record.priority,
            "default_priority": record.default_priority, "enabled": record.enabled, "status": record.status,
            "available_here": avail_text, "distribution": record.distribution, "entry_point": record.entry_point,
            "options": dict(record.options), "description": record.description,
        })
    text = f"plugins (platform here: {here}):\n" + _table(("name", "op", "priority", "state", "available here", "distribution"), rows)
    if registry.problems:
        text += "\n\nskipped entry points:\n" + "\n".join(f"  - {p.describe()}" for p in registry.problems)
    if registry.config.notes:
        text += "\n\nconfiguration notes:\n" + "\n".join(f"  - {n}" for n in registry.config.notes)
    _emit(args, {"platform": str(here), "plugins": payload, "problems": [p.__dict__ for p in registry.problems],
                 "config_notes": list(registry.config.notes)}, text)
    return 0


# -- explain -------------------------------------------------------------------------------------
def _explain_cases(args: argparse.Namespace) -> list[tuple[str, str, Any, Any]]:
    platform = _parse_platform(args.platform)
    rows = tuple(int(r) for r in args.rows.split(",")) if args.rows else DEFAULT_ROWS
    if args.model:
        models = load_catalog() if args.model == "all" else (get_model(args.model),)
    else:
        missing = [f"--{n}" for n in ("experts", "hidden", "topk") if getattr(args, n) is None]
        if missing:
            raise SystemExit(f"explain: give --model NAME (or 'all') or all of --experts/--hidden/--topk; missing {', '.join(missing)}")
        from .catalog import ModelSpec

        act = f"swiglu_limit={args.limit}" if args.limit is not None else "silu"
        models = (ModelSpec("custom/custom", 0, args.hidden, args.experts, args.topk, 0, act, "", "given"),)
    cases: list[tuple[str, str, Any, Any]] = []
    for model in models:
        if model.gpt_oss_activation:
            cases.append((model.short_name, "silu_mul_quant", None, "gpt-oss activation (gemm1_alpha): handed to SGLang's own Triton path, not modelled"))
            continue
        for ep in args.ep:
            if model.experts % ep:
                continue
            limit = "model" if args.limit is None or args.model else args.limit
            for case in silu_mul_quant_cases(model, ep=ep, tp=args.tp, rows=rows, platform=platform, ue8m0=args.ue8m0,
                                             group_size=args.group_size, swiglu_limit=limit):
                cases.append((case.label, "silu_mul_quant", case.shape, case.config))
            cases.extend(_mega_cases(model, ep, platform))
    return cases


def _mega_cases(model: Any, ep: int, platform: Platform) -> list[tuple[str, str, Any, Any]]:
    try:
        from .ops import mega_moe
    except ImportError:
        return []
    builder = getattr(mega_moe, "cases_for_model", None)
    if builder is None:
        return []
    return [(label, "mega_moe", shape, config) for label, shape, config in builder(model, ep=ep, platform=platform)]


def cmd_explain(args: argparse.Namespace) -> int:
    selector = api.get_selector()
    blocks, payload = [], []
    for label, op, shape, config in _explain_cases(args):
        if shape is None:
            blocks.append(f"{label}: {config}")
            payload.append({"call": label, "op": op, "chosen": None, "note": config})
            continue
        selection = selector.explain(op, shape, config)
        chosen = selection.chosen.name if selection.chosen else None
        rows = [(c.name, c.priority, c.verdict, c.reason) for c in selection.candidates]
        blocks.append(f"{label}: {op} {selection.key_description()}\n  -> {chosen or 'NO PLUGIN (SGLang original would run)'}\n"
                      + "\n".join("  " + line for line in _table(("plugin", "priority", "verdict", "reason"), rows).splitlines()))
        payload.append({"call": label, "op": op, "shape": shape.__dict__, "config": {k: str(v) for k, v in config.__dict__.items()},
                        "chosen": chosen, "candidates": [c.__dict__ for c in selection.candidates]})
    if not payload:
        raise SystemExit("explain: no call matches (is --ep a divisor of the model's expert count?)")
    _emit(args, payload, "\n\n".join(blocks))
    return 0


# -- doctor --------------------------------------------------------------------------------------
def _version_of(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def _self_check(registry: Any) -> tuple[list[dict[str, str]], list[str]]:
    """Ask every enabled ``silu_mul_quant`` plugin that is available here about one small probe call and
    run it once: a plugin whose ``supports``/``run`` raises or whose outputs break the op's contract is a
    problem. Returns ``(rows, problems)``."""
    import torch

    from .ops import silu_mul_quant as smq
    from .selection import _as_support

    here = local_platform()
    device = torch.device("cuda", torch.cuda.current_device()) if here.is_cuda else torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    gateup = torch.randn(2, 4, 1024, generator=gen).to(torch.bfloat16).to(device)
    masked = torch.tensor([4, 1], dtype=torch.int32).to(device)
    shape, config = smq.describe(gateup, masked, group_size=128, topk=1)
    rows: list[dict[str, str]] = []
    problems: list[str] = []

    def note(name: str, state: str, detail: str, problem: bool = False) -> None:
        rows.append({"plugin": name, "state": state, "detail": detail})
        if problem:
            problems.append(f"plugin {name!r} self-check: {detail}")

    for record in registry.records(smq.OP):
        name = record.name
        if not record.enabled:
            note(name, "skipped", record.status)
            continue
        try:
            avail = record.plugin.available(here) if hasattr(record.plugin, "available") else None
        except Exception as exc:  # noqa: BLE001 - report, do not die
            note(name, "error", f"available() raised {type(exc).__name__}: {exc}", True)
            continue
        if avail is not None and not avail:
            note(name, "skipped", f"not available here: {avail.reason}")
            continue
        try:
            support = _as_support(record.plugin.supports(shape, config), name)
        except Exception as exc:  # noqa: BLE001
            note(name, "error", f"supports({shape.describe()}) raised {type(exc).__name__}: {exc}", True)
            continue
        if not support:
            note(name, "skipped", f"does not support the probe call ({shape.describe()}): {support.reason}")
            continue
        outputs = smq.allocate_outputs(shape, config, device)
        try:
            returned = record.plugin.run(smq.SiluMulQuantInputs(gateup.clone(), masked), outputs, shape, config)
            smq.validate_outputs(outputs if returned is None else returned, shape, config, name)
        except Exception as exc:  # noqa: BLE001
            note(name, "error", f"run() on the probe call ({shape.describe()}) failed: {type(exc).__name__}: {exc}", True)
            continue
        note(name, "ok", f"supports and runs the probe call ({shape.describe()}) on {here}")
    return rows, problems


def cmd_doctor(args: argparse.Namespace) -> int:
    import torch

    from .host_kernels import host_kernels_source

    report: dict[str, Any] = {
        "versions": {
            "python": _py_platform.python_version(), "sglang-moe-plugins": __version__, "plugin contract": CONTRACT_VERSION,
            "torch": torch.__version__, "torch cuda": str(torch.version.cuda), "sglang": _version_of("sglang"),
            "sgl-deep-gemm": _version_of("sgl-deep-gemm"), "triton": _version_of("triton"),
        },
        "platform": str(local_platform()),
    }
    problems: list[str] = []
    try:
        registry = api.get_registry()
    except ConfigError as exc:
        problems.append(f"configuration error: {exc}")
        registry = None
    except MoEPluginsError as exc:  # strict = true and a plugin could not be registered
        problems.append(f"plugin registry error: {exc}")
        registry = None
    if registry is not None:
        report["config"] = {"file": registry.config.source, "strict": registry.config.strict, "notes": list(registry.config.notes)}
        report["plugins"] = {r.name: r.status for r in registry.records()}
        problems += [p.describe() for p in registry.problems]
        if not args.no_self_check:
            report["self check"], found = _self_check(registry)
            problems += found
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "moe_plugins"]
    allow = os.environ.get("SGLANG_PLUGINS", "")
    allowed = not allow or "moe_plugins" in {x.strip() for x in allow.split(",")}
    report["sglang entry point"] = "registered" if eps else "missing (reinstall sglang-moe-plugins)"
    if not allowed:
        problems.append(f"SGLANG_PLUGINS={allow!r} does not include 'moe_plugins': SGLang will not load the hooks")
    report["host kernels"] = host_kernels_source() or "unavailable (jit_ep and fp8_fallback cannot run)"
    hooks: list[dict[str, Any]] = []
    if report["versions"]["sglang"] != "not installed" and not args.no_hooks:
        from .integrations.sglang import hook_status, version_case

        status = hook_status()
        case = version_case()
        report["sglang release"] = {"case": case.case, "table_release": case.table_release, "message": case.message}
        for check in case.checks:
            state = "would hook" if check.ok else "NOT hooked"
            if status["registered"] and check.ok:
                state = "hooked in this process"
            hooks.append({"target": check.path, "op": check.op, "state": state, "reason": check.reason})
            if not check.ok:
                problems.append(f"{check.path}: {check.reason}")
    report["hooks"] = hooks
    report["problems"] = problems
    lines = ["versions:"] + [f"  {k}: {v}" for k, v in report["versions"].items()] + [f"platform: {report['platform']}"]
    if "config" in report:
        lines.append(f"config: file={report['config']['file'] or '(none; defaults)'} strict={report['config']['strict']}")
        lines += [f"  note: {n}" for n in report["config"]["notes"]]
        lines.append("plugins:")
        lines += [f"  {k}: {v}" for k, v in report["plugins"].items()]
    if report.get("self check"):
        lines.append("self check (one probe call per plugin available here):")
        lines += [f"  {r['plugin']}: {r['state']}: {r['detail']}" for r in report["self check"]]
    lines.append(f"sglang entry point moe_plugins: {report['sglang entry point']}")
    lines.append(f"host kernels: {report['host kernels']}")
    if "sglang release" in report:
        lines.append(f"sglang release: {report['sglang release']['case']}: {report['sglang release']['message']}")
    if hooks:
        lines.append("hooks:")
        lines += [f"  {h['state']}: {h['target']} (op {h['op']}): {h['reason']}" for h in hooks]
    lines.append("problems:" if problems else "problems: none")
    lines += [f"  - {p}" for p in problems]
    _emit(args, report, "\n".join(lines))
    return 1 if problems and args.strict_exit else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-moe-plugins", description="Inspect and debug MoE kernel plugin selection.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="every plugin: op, priority, state, availability, distribution")
    p_list.add_argument("--json", action="store_true")
    p_list.set_defaults(func=cmd_list)
    p_exp = sub.add_parser("explain", help="which plugin runs each MoE call of a model, and why the others do not")
    p_exp.add_argument("--model", help="a model of the embedded catalog (id or short name), or 'all'")
    p_exp.add_argument("--experts", type=int, help="routed experts (without --model)")
    p_exp.add_argument("--hidden", type=int, help="per-expert intermediate size (without --model)")
    p_exp.add_argument("--topk", type=int, help="experts per token (without --model)")
    p_exp.add_argument("--limit", type=float, help="swiglu_limit (without --model; default none)")
    p_exp.add_argument("--ep", type=int, nargs="+", default=[1], help="expert-parallel size(s) (default 1)")
    p_exp.add_argument("--tp", type=int, default=1, help="MoE tensor-parallel size (default 1)")
    p_exp.add_argument("--rows", help=f"padded rows per expert N, comma separated (default {','.join(map(str, DEFAULT_ROWS))})")
    p_exp.add_argument("--group-size", type=int, default=128)
    p_exp.add_argument("--ue8m0", action="store_true", help="UE8M0 packed scales (DeepGEMM's UE8M0 mode, e.g. on sm100)")
    p_exp.add_argument("--platform", default="sm90", help="cpu, local, or smNN (default sm90)")
    p_exp.add_argument("--json", action="store_true")
    p_exp.set_defaults(func=cmd_explain)
    p_doc = sub.add_parser("doctor", help="host versions, configuration, hooks applied or not and why")
    p_doc.add_argument("--json", action="store_true")
    p_doc.add_argument("--no-hooks", action="store_true", help="skip importing SGLang to check the hook targets (fast)")
    p_doc.add_argument("--strict-exit", action="store_true", help="exit 1 when a problem is found")
    p_doc.add_argument("--no-self-check", action="store_true",
                       help="skip running each available silu_mul_quant plugin once on a small probe call")
    p_doc.set_defaults(func=cmd_doctor)
    add_check_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MoEPluginsError as exc:
        print(f"sglang-moe-plugins {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
