"""The names of a configuration checked against the installed plugins and ops: :func:`check_names`.

Unknown plugin or op names are ConfigErrors that list the valid names and the closest one; names in ``disable`` and
``allow`` that are not installed here are warnings (one configuration may serve a mixed fleet). Contradictions
(``force`` of a ``stock`` op or of a disabled plugin, a plugin both enabled and disabled) are errors naming both keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .config_file import unknown_stock_op
from .config_values import STOCK_ALL, did_you_mean
from .errors import ConfigError
from .priority_rules import check_priority_rules

if TYPE_CHECKING:
    from .config import UserConfig

__all__ = ["check_names"]


def check_names(
    self: UserConfig, plugins: Mapping[str, str], ops: Iterable[str], known: Iterable[str] = ()
) -> tuple[str, ...]:
    """Raise ConfigError for unknown plugin or op names; return warnings for names that need not exist.

    ``plugins`` maps name -> op; ``ops`` is the op names, or a mapping of op name -> OpSpec (needed to
    check the shape fields of ``priority_rules``). ``known``: entry-point names installed here but not
    loaded (disabled, not allowed, or broken): valid in ``disable`` and ``allow``. Names in ``disable`` or
    ``allow`` that are not installed here are warnings (one configuration may serve a mixed fleet).
    """
    valid = ", ".join(sorted(plugins)) or "(none registered)"
    where = f" in {self.source}" if self.source else ""
    installed = set(plugins) | set(known)
    warnings = []
    for key, names in (("disable", self.disable), ("allow", self.allow or ())):
        for name in sorted(set(names) - installed):
            origin = self.provenance.get(f"{key}:{name}", f"{key}{where}")
            warnings.append(
                f"{key} names plugin {name!r} ({origin}), which is not installed here; ignored"
                + did_you_mean(name, installed)
            )
    for key, entries in (("enable", self.enable), ("priority", self.priority), ("options", self.options)):
        for name in sorted(entries):
            if name not in plugins:
                origin = self.provenance.get(f"{key}:{name}", f"{key}{where}")
                raise ConfigError(
                    f"unknown plugin {name!r} ({origin}); valid plugins: {valid}{did_you_mean(name, plugins)}"
                )
    both = sorted(self.disable & self.enable)
    if both:
        name = both[0]
        enabled = self.provenance.get(f"enable:{name}", f"enabled by 'enable'{where}")
        disabled = self.provenance.get(f"disable:{name}", f"disabled by 'disable'{where}")
        raise ConfigError(
            f"plugin {name!r} is both enabled and disabled ({enabled}; {disabled}); remove it from one of them"
        )
    op_names = sorted(ops)
    for op in sorted(self.stock - {STOCK_ALL}):
        if op not in op_names:
            origin = self.provenance.get(f"stock:{op}", f"stock{where}")
            error = unknown_stock_op(op, origin, op_names)
            raise ConfigError(
                f"{error}{'' if error.endswith('?') else '.'} At SGLang start-up an unknown op in stock leaves "
                "every op to SGLang (nothing is hooked; never failing closed)"
            )
    stock = set(op_names) if STOCK_ALL in self.stock else self.stock
    for op, name in sorted(self.force.items()):
        if op not in op_names:
            raise ConfigError(
                f"unknown op {op!r} in force{where}; valid ops: {', '.join(op_names)}{did_you_mean(op, op_names)}"
            )
        if name not in plugins:
            raise ConfigError(
                f"unknown plugin {name!r} in force.{op}{where}; valid plugins: {valid}{did_you_mean(name, plugins)}"
            )
        if op in stock:
            origin = self.provenance.get(f"stock:{op}", self.provenance.get(f"stock:{STOCK_ALL}", f"stock{where}"))
            raise ConfigError(
                f"force.{op} = {name!r}{where} contradicts stock ({origin}): a stock op runs SGLang's own "
                f"function, a forced one only plugin {name!r}; remove {op!r} from one of them"
            )
        if plugins[name] != op:
            raise ConfigError(
                f"force.{op} = {name!r}{where}, but plugin {name!r} implements op {plugins[name]!r}; "
                f"plugins of {op!r}: {', '.join(sorted(n for n, o in plugins.items() if o == op))}"
            )
        if name in self.disable:
            raise ConfigError(
                f"force.{op} = {name!r}{where}, but {name!r} is also {self.provenance.get('disable:' + name, 'disabled')}"
            )
    if self.priority_rules:
        specs = ops if isinstance(ops, Mapping) else dict.fromkeys(op_names)
        check_priority_rules(self.priority_rules, plugins, specs, where)
    return tuple(warnings)
