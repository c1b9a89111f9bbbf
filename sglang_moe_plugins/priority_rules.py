"""Per-op, per-shape-bucket priority overrides: the ``[[priority_rules]]`` tables of the configuration.

::

    [[priority_rules]]
    op = "silu_mul_quant"
    when = { hidden_min = 8193 }            # inclusive bounds on the op's shape fields: <field>_min / <field>_max
    priority = { fp8_fallback = 200 }       # plugin = priority, for the shapes the bounds match

A rule matches a shape when every bound holds (no bound: every shape of the op). For each plugin, the
first matching rule (in file order) that names it sets its priority for that shape key; plugins no
matching rule names keep their priority (``[priority]`` or the plugin's default). The selector applies
them once per shape key. ``force`` still wins, and a disabled plugin stays disabled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["PriorityRule", "parse_priority_rules", "check_priority_rules", "rule_priorities"]

_RULE_KEYS = ("op", "when", "priority")
_SUFFIXES = ("_min", "_max")


@dataclass(frozen=True)
class PriorityRule:
    """One ``[[priority_rules]]`` entry. Hashable by value (bounds and priorities are sorted tuples)."""

    index: int
    op: str
    #: ``(field, min or None, max or None)`` per bounded field, sorted by field name; both bounds inclusive.
    bounds: tuple[tuple[str, int | None, int | None], ...]
    #: ``(plugin, priority)`` pairs, sorted by plugin name.
    priority: tuple[tuple[str, int], ...]

    @property
    def label(self) -> str:
        return f"priority_rules[{self.index}]"

    def describe_bounds(self) -> str:
        """``hidden >= 8193, max_rows in 512..1024``; ``every shape`` when unbounded."""
        parts = []
        for name, low, high in self.bounds:
            if low is not None and high is not None:
                parts.append(f"{name} == {low}" if low == high else f"{name} in {low}..{high}")
            elif low is not None:
                parts.append(f"{name} >= {low}")
            else:
                parts.append(f"{name} <= {high}")
        return ", ".join(parts) or "every shape"

    def describe(self) -> str:
        prios = ", ".join(f"{name} = {value}" for name, value in self.priority)
        return f"{self.label}: {self.op} where {self.describe_bounds()}: {prios}"

    def matches(self, shape: Any) -> bool:
        for name, low, high in self.bounds:
            value = getattr(shape, name, None)
            if isinstance(value, bool) or not isinstance(value, int):
                return False
            if (low is not None and value < low) or (high is not None and value > high):
                return False
        return True


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_priority_rules(value: Any, where: str) -> tuple[PriorityRule, ...]:
    """Check the form of ``priority_rules`` (a TOML array of tables). Names are checked later."""
    if not isinstance(value, list):
        raise ConfigError(f"priority_rules{where} must be an array of tables ([[priority_rules]]), got {value!r}")
    rules = []
    for index, entry in enumerate(value):
        label = f"priority_rules[{index}]{where}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{label} must be a table with keys {', '.join(_RULE_KEYS)}, got {entry!r}")
        unknown = sorted(set(entry) - set(_RULE_KEYS))
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} in {label}; valid keys: {', '.join(_RULE_KEYS)}")
        op = entry.get("op")
        if not isinstance(op, str) or not op:
            raise ConfigError(f"{label}: 'op' must name an op (a string), got {op!r}")
        when = entry.get("when", {})
        if not isinstance(when, dict):
            raise ConfigError(f"{label}: 'when' must be a table of <field>_min / <field>_max = integer, got {when!r}")
        bounds: dict[str, list[int | None]] = {}
        for key, bound in when.items():
            if not key.endswith(_SUFFIXES) or len(key) <= 4:
                raise ConfigError(
                    f"{label}: bound {key!r} must be <field>_min or <field>_max (inclusive bounds on a shape field)"
                )
            if not _int(bound):
                raise ConfigError(f"{label}: bound {key} must be an integer, got {bound!r}")
            pair = bounds.setdefault(key[:-4], [None, None])
            pair[0 if key.endswith("_min") else 1] = bound
        for name, (low, high) in bounds.items():
            if low is not None and high is not None and low > high:
                raise ConfigError(f"{label}: {name}_min = {low} is above {name}_max = {high}; the bucket is empty")
        priority = entry.get("priority")
        if not isinstance(priority, dict) or not priority:
            raise ConfigError(f"{label}: 'priority' must be a non-empty table of plugin = integer, got {priority!r}")
        for name, prio in priority.items():
            if not _int(prio):
                raise ConfigError(f"{label}: priority.{name} must be an integer, got {prio!r}")
        rules.append(
            PriorityRule(
                index,
                op,
                tuple(sorted((name, low, high) for name, (low, high) in bounds.items())),
                tuple(sorted(priority.items())),
            )
        )
    return tuple(rules)


def check_priority_rules(
    rules: tuple[PriorityRule, ...], plugins: Mapping[str, str], ops: Mapping[str, Any], where: str
) -> None:
    """Raise ConfigError for an unknown op, shape field or plugin, or a plugin of another op.

    ``plugins`` maps plugin name -> op; ``ops`` maps op name -> its OpSpec (``shape_type``).
    """
    valid_plugins = ", ".join(sorted(plugins)) or "(none registered)"
    for rule in rules:
        label = f"{rule.label}{where}"
        if rule.op not in ops:
            raise ConfigError(f"unknown op {rule.op!r} in {label}; valid ops: {', '.join(sorted(ops))}")
        shape_type = getattr(ops[rule.op], "shape_type", None)
        if shape_type is not None and dataclasses.is_dataclass(shape_type):
            names = [f.name for f in dataclasses.fields(shape_type)]
            for name, _, _ in rule.bounds:
                if name not in names:
                    valid = ", ".join(f"{n}_min, {n}_max" for n in names)
                    raise ConfigError(
                        f"unknown shape field {name!r} in {label}.when (op {rule.op!r}, {shape_type.__name__}); "  # type: ignore[union-attr]  # a dataclass type here (is_dataclass above)
                        f"valid bounds: {valid}"
                    )
        for name, _ in rule.priority:
            if name not in plugins:
                raise ConfigError(f"unknown plugin {name!r} in {label}.priority; valid plugins: {valid_plugins}")
            if plugins[name] != rule.op:
                of_op = ", ".join(sorted(n for n, o in plugins.items() if o == rule.op)) or "(none registered)"
                raise ConfigError(
                    f"{label}.priority names plugin {name!r}, which implements op {plugins[name]!r}, not {rule.op!r}; "
                    f"plugins of {rule.op!r}: {of_op}"
                )


def rule_priorities(rules: Sequence[PriorityRule], op: str, shape: Any) -> dict[str, tuple[int, PriorityRule]]:
    """``{plugin: (priority, rule)}`` set by the first matching rule of ``op`` that names each plugin."""
    out: dict[str, tuple[int, PriorityRule]] = {}
    for rule in rules:
        if rule.op != op or not rule.matches(shape):
            continue
        for name, prio in rule.priority:
            out.setdefault(name, (prio, rule))
    return out
