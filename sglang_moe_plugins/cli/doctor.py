"""``sglang-moe-plugins doctor``: host versions, configuration, hooks applied or not and why, one probe call
per available plugin. Exit status 1 when it lists a problem; every configuration warning is one (an unknown
``SGLANG_MOE_PLUGINS_*`` variable, a name in ``disable`` or ``allow`` not installed here, a ``force`` ignored for
a ``stock`` op, an unknown op in ``stock``)."""

from __future__ import annotations

import argparse
import os
import platform as _py_platform
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any

from .._version import CONTRACT_VERSION, __version__
from ..config import stock_rollback, unknown_env_warnings
from ..errors import ConfigError
from ..hardware import local_platform
from ..ops import OPS
from .health import forced_here_warnings, load_registry, platform_findings, quiet_host_import, stock_lines
from .util import emit

__all__ = ["add_arguments", "cmd_doctor"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``doctor`` command's description and arguments; runs :func:`cmd_doctor`."""
    parser.description = (
        "Exit status: 1 when it lists a problem (among them: the configuration cannot be loaded, or under "
        "strict the plugin registry cannot be built, so every hooked call would raise; a plugin that cannot "
        "load; an op no enabled plugin can run here; every configuration warning: an unknown SGLANG_MOE_PLUGINS_* "
        "variable, a name in disable or allow not installed here, an unknown op in stock); 0 otherwise. The other "
        "warnings (a pure-torch plugin first on a GPU, a third-party plugin above the built-ins) do not change it."
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--no-hooks", action="store_true", help="skip importing SGLang to check the hook targets (fast)"
    )
    parser.add_argument(
        "--strict-exit",
        action="store_true",
        help="accepted for compatibility: doctor always exits 1 when it lists a problem",
    )
    parser.add_argument(
        "--no-self-check",
        action="store_true",
        help="skip running each available silu_mul_quant plugin once on a small probe call",
    )
    parser.set_defaults(func=cmd_doctor)


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

    from ..contract import as_support as _as_support
    from ..ops import silu_mul_quant as smq

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
            note(
                name, "error", f"run() on the probe call ({shape.describe()}) failed: {type(exc).__name__}: {exc}", True
            )
            continue
        note(name, "ok", f"supports and runs the probe call ({shape.describe()}) on {here}")
    return rows, problems


def _config_warnings(registry: Any) -> list[str]:
    """The configuration's warnings: settings not applied, and the names ``check_names`` warns about (as the
    registry was built: plugins installed here but not loaded are known names)."""
    from ..core.discovery import config_for_check

    config = registry.config
    names = {r.name: r.op for r in registry.records()}
    absent = ({n.entry_point for n in registry.not_loaded} | {p.entry_point for p in registry.problems}) - set(names)
    try:
        found = config_for_check(config, absent).check_names(names, OPS, known=absent)
    except ConfigError as exc:  # the registry was built with it, so this is not expected; shown, not raised
        found = (f"configuration error: {exc}",)
    return [*config.warnings, *found]


def cmd_doctor(args: argparse.Namespace) -> int:
    with quiet_host_import():  # SGLang's import-time AWQ / GGUF UserWarnings are not this report's business
        return _doctor(args)


def _masked_layout_text(config: Any) -> str:
    """The ``masked_layout`` setting and what it does on this install (integrations/sglang/layout.py)."""
    if config.masked_layout != "measured":
        return f"{config.masked_layout!r}: SGLang's activation guard alone decides which configs may take the masked layout"
    from ..integrations.sglang.layout import measured_configs

    table = measured_configs()
    faster = sorted(
        f"E={e} D={d} group={g}{' clamped' if c else ''} at {v['tokens_min']}-{v['tokens_max']} tokens"
        for (e, d, g, c), v in table.items()
        if v["masked_faster"]
    )
    return (
        "'measured': SGLang 0.5.20+'s activation guard is lifted where a plugin serves the masked call and the masked "
        f"layout measured faster: {', '.join(faster) if faster else 'no config measured faster, so none'} "
        "(SGLANG_MOE_PLUGINS_MASKED_LAYOUT=sglang gives the decision back)"
    )


def _doctor(args: argparse.Namespace) -> int:
    import torch

    import sglang_moe_plugins

    from ..plugins.sglang_kernels.host import host_kernels_source

    report: dict[str, Any] = {
        "versions": {
            "python": _py_platform.python_version(),
            "sglang-moe-plugins": __version__,
            "plugin contract": CONTRACT_VERSION,
            "torch": torch.__version__,
            "torch cuda": str(torch.version.cuda),
            "sglang": _version_of("sglang"),
            "sgl-deep-gemm": _version_of("sgl-deep-gemm"),
            "triton": _version_of("triton"),
        },
        "imported from": os.path.dirname(os.path.abspath(sglang_moe_plugins.__file__)),
        "platform": str(local_platform()),
    }
    loaded = load_registry()
    registry = loaded.registry
    problems: list[str] = list(loaded.problems)
    warnings: list[str] = []
    rollback = stock_rollback(OPS)  # what SGLang's start-up leaves unhooked, whatever else the configuration says
    problems += [
        f"{error}{'' if error.endswith('?') else '.'} At SGLang start-up this leaves every op to SGLang (nothing is "
        "hooked; never failing closed)"
        for error in rollback.errors
        if not any(error in p for p in problems)  # the configuration error already says it
    ]
    problems += unknown_env_warnings()
    if registry is not None:
        config = registry.config
        report["config"] = {
            "file": config.source,
            "strict": config.strict,
            "masked_layout": _masked_layout_text(config),
            "notes": list(config.notes),
            "force": dict(config.force),
            "allow": None if config.allow is None else sorted(config.allow),
            "priority_rules": [r.describe() for r in config.priority_rules],
        }
        forced = set(config.force.values())
        report["plugins"] = {r.name: r.status + (" [force]" if r.name in forced else "") for r in registry.records()}
        report["distributions"] = {r.name: r.dist_label for r in registry.records()}
        report["not loaded"] = [n.describe() for n in registry.not_loaded]
        report["stock"] = stock_lines(registry)
        if not loaded.failed:  # under strict the registry error above already lists its problems
            problems += _config_warnings(registry)
            problems += forced_here_warnings(registry)
            problems += [p.describe() for p in registry.problems]
            found, notes = platform_findings(registry, local_platform())
            problems += found
            warnings += list(registry.notices) + notes
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
    stock_ops = rollback.ops
    if report["versions"]["sglang"] != "not installed" and not args.no_hooks:
        from ..integrations.sglang import hook_status, version_case

        status = hook_status()
        case = version_case()
        report["sglang release"] = {"case": case.case, "table_release": case.table_release, "message": case.message}
        for check in case.checks:
            state = "would hook" if check.ok else "NOT hooked"
            if check.ok and check.op in stock_ops:
                state = "stock (not hooked)"
            elif status["registered"] and check.ok:
                state = "hooked in this process"
            hooks.append({"target": check.path, "op": check.op, "state": state, "reason": check.reason})
            if not check.ok:
                problems.append(f"{check.path}: {check.reason}")
    report["hooks"] = hooks
    report["warnings"] = warnings
    report["problems"] = problems
    lines = ["versions:"] + [f"  {k}: {v}" for k, v in report["versions"].items()]
    lines += [f"imported from: {report['imported from']}", f"platform: {report['platform']}"]
    if "config" in report:
        allow_text = (
            "unset (every installed plugin may load)"
            if config.allow is None
            else (", ".join(sorted(config.allow)) or "none")
        )
        lines.append(
            f"config: file={report['config']['file'] or '(none; defaults)'} strict={report['config']['strict']}"
        )
        lines.append(f"  allow (third-party plugins): {allow_text}")
        lines.append(f"  masked layout: {report['config']['masked_layout']}")
        lines += [f"  note: {n}" for n in report["config"]["notes"]]
        lines += [f"  rule: {r}" for r in report["config"]["priority_rules"]]
        lines.append("plugins:")
        lines += [f"  {k}: {v} ({report['distributions'][k]})" for k, v in report["plugins"].items()]
        lines += [f"  {n}" for n in report["not loaded"]]
        lines += [f"  {n}" for n in report["stock"]]
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
    if warnings:
        lines.append("warnings:")
        lines += [f"  - {w}" for w in warnings]
    lines.append("problems:" if problems else "problems: none")
    lines += [f"  - {p}" for p in problems]
    emit(args, report, "\n".join(lines))
    # Any listed problem exits 1 (a script checking the install must notice without a flag).
    return 1 if problems else 0
