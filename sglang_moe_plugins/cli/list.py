"""``sglang-moe-plugins list``: every plugin with its op, priority, state, availability here and distribution."""

from __future__ import annotations

import argparse

from ..errors import MoEPluginsError
from ..hardware import local_platform
from .health import forced_here_warnings, load_registry, platform_findings, stock_lines
from .util import emit, fail, table

__all__ = ["add_arguments", "cmd_list"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``list`` command's arguments; runs :func:`cmd_list`."""
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    loaded = load_registry()
    registry = loaded.registry
    if registry is None:  # the configuration cannot be loaded: one line, exit 2 (no table to show)
        if isinstance(loaded.error, MoEPluginsError):
            raise loaded.error
        fail("sglang-moe-plugins list", loaded.problems[0], bool(args.json), kind=type(loaded.error).__name__)
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
        rows.append((record.name, record.op, record.priority, state, avail_text, record.dist_label))
        payload.append(
            {
                "name": record.name,
                "op": record.op,
                "priority": record.priority,
                "default_priority": record.default_priority,
                "enabled": record.enabled,
                "status": record.status,
                "forced": forced,
                "available_here": avail_text,
                "distribution": record.distribution,
                "version": record.version,
                "builtin": record.builtin,
                "entry_point": record.entry_point,
                "options": dict(record.options),
                "description": record.description,
            }
        )
    text = f"plugins (platform here: {here}):\n" + table(
        ("name", "op", "priority", "state", "available here", "distribution"), rows
    )
    not_loaded = [n.describe() for n in registry.not_loaded]
    stock = stock_lines(registry)
    platform_problems, platform_notes = platform_findings(registry, here)
    warnings = forced_here_warnings(registry) + list(registry.notices) + platform_problems + platform_notes
    problems = list(loaded.problems) + [p.describe() for p in registry.problems]
    if loaded.failed:
        problems.append(
            "strict = true: start-up fails closed with the registry error above (every hooked call raises it); "
            "the table shows the plugins that would load without strict"
        )
    if not_loaded:
        text += "\n\nnot loaded (never imported):\n" + "\n".join(f"  - {n}" for n in not_loaded)
    if stock:
        text += "\n\nstock ops (not hooked):\n" + "\n".join(f"  - {n}" for n in stock)
    if warnings:
        text += "\n\nWARNING:\n" + "\n".join(f"  - {w}" for w in warnings)
    if problems:
        text += "\n\nproblems (skipped entry points):\n" + "\n".join(f"  - {p}" for p in problems)
    rules = [r.describe() for r in registry.config.priority_rules]
    if rules:
        text += (
            "\n\npriority rules (per shape bucket; the first matching rule naming a plugin sets its priority):\n"
            + "\n".join(f"  - {r}" for r in rules)
        )
    if registry.config.notes:
        text += "\n\nconfiguration notes:\n" + "\n".join(f"  - {n}" for n in registry.config.notes)
    emit(
        args,
        {
            "platform": str(here),
            "plugins": payload,
            "problems": [p.__dict__ for p in registry.problems],
            "problem_lines": problems,
            "not_loaded": [n.__dict__ for n in registry.not_loaded],
            "stock": stock,
            "config_notes": list(registry.config.notes),
            "force": dict(registry.config.force),
            "warnings": warnings,
            "priority_rules": rules,
        },
        text,
    )
    return 1 if loaded.failed else 0
