"""The ``sglang-moe-plugins`` command: ``list``, ``explain``, ``doctor``, ``check``, ``bench``. ``--json`` for machines.

A bad argument is one line naming it and what is allowed (a JSON ``{"error": ...}`` under ``--json``), exit 2.
"""

from __future__ import annotations

import argparse
import os
import platform as _py_platform
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, Sequence

from . import api
from ._version import CONTRACT_VERSION, __version__
from ._cli_explain import add_explain_parser, forced_here_warnings
from ._cli_util import Parser, UsageError, emit, fail, set_argv, table
from .bench.cli import add_bench_parser
from .errors import ConfigError, MoEPluginsError
from .hardware import local_platform
from .testing.cli_check import add_check_parser

__all__ = ["main", "build_parser"]


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
        forced = registry.config.force.get(record.op) == record.name
        if forced:
            state += " [force]"
        rows.append((record.name, record.op, record.priority, state, avail_text, record.distribution or "-"))
        payload.append({
            "name": record.name, "op": record.op, "priority": record.priority,
            "default_priority": record.default_priority, "enabled": record.enabled, "status": record.status, "forced": forced,
            "available_here": avail_text, "distribution": record.distribution, "entry_point": record.entry_point,
            "options": dict(record.options), "description": record.description,
        })
    text = f"plugins (platform here: {here}):\n" + table(("name", "op", "priority", "state", "available here", "distribution"), rows)
    warnings = forced_here_warnings(registry)
    if warnings:
        text += "\n\nWARNING:\n" + "\n".join(f"  - {w}" for w in warnings)
    if registry.problems:
        text += "\n\nskipped entry points:\n" + "\n".join(f"  - {p.describe()}" for p in registry.problems)
    rules = [r.describe() for r in registry.config.priority_rules]
    if rules:
        text += "\n\npriority rules (per shape bucket; the first matching rule naming a plugin sets its priority):\n" + \
            "\n".join(f"  - {r}" for r in rules)
    if registry.config.notes:
        text += "\n\nconfiguration notes:\n" + "\n".join(f"  - {n}" for n in registry.config.notes)
    emit(args, {"platform": str(here), "plugins": payload, "problems": [p.__dict__ for p in registry.problems],
                 "config_notes": list(registry.config.notes), "force": dict(registry.config.force), "warnings": warnings,
                 "priority_rules": rules}, text)
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
    config_failed = False
    try:
        registry = api.get_registry()
    except ConfigError as exc:
        problems.append(f"configuration error: {exc}")
        registry = None
        config_failed = True
    except MoEPluginsError as exc:  # strict = true and a plugin could not be registered
        problems.append(f"plugin registry error: {exc}")
        registry = None
        config_failed = True
    if registry is not None:
        report["config"] = {"file": registry.config.source, "strict": registry.config.strict, "notes": list(registry.config.notes),
                            "force": dict(registry.config.force),
                            "priority_rules": [r.describe() for r in registry.config.priority_rules]}
        forced = {name for name in registry.config.force.values()}
        report["plugins"] = {r.name: r.status + (" [force]" if r.name in forced else "") for r in registry.records()}
        problems += forced_here_warnings(registry)
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
        lines += [f"  rule: {r}" for r in report["config"]["priority_rules"]]
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
    emit(args, report, "\n".join(lines))
    if config_failed:
        # The configuration (or, under strict, the registry) cannot be loaded: the package is off, or under
        # strict every hooked call raises. A script checking the install must notice without a flag.
        return 1
    return 1 if problems and args.strict_exit else 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sglang-moe-plugins", description="Inspect, debug and measure MoE kernel plugin selection.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="every plugin: op, priority, state, availability, distribution")
    p_list.add_argument("--json", action="store_true")
    p_list.set_defaults(func=cmd_list)
    add_explain_parser(sub)
    p_doc = sub.add_parser(
        "doctor", help="host versions, configuration, hooks applied or not and why",
        description="Exit status: 1 when the configuration cannot be loaded, or under strict the plugin registry cannot be "
                    "built (the package would be off, or every hooked call would raise); otherwise 0, also when other "
                    "problems are listed, unless --strict-exit is given.")
    p_doc.add_argument("--json", action="store_true")
    p_doc.add_argument("--no-hooks", action="store_true", help="skip importing SGLang to check the hook targets (fast)")
    p_doc.add_argument("--strict-exit", action="store_true", help="exit 1 when any problem is found (a configuration or strict registry error always exits 1)")
    p_doc.add_argument("--no-self-check", action="store_true",
                       help="skip running each available silu_mul_quant plugin once on a small probe call")
    p_doc.set_defaults(func=cmd_doctor)
    add_check_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
