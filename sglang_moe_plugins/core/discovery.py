"""Entry points of group ``sglang_moe_plugins.kernels`` before anything is imported: which distribution
declares each, whether it is a built-in, and whether the configuration lets it load.

Nothing here imports a plugin module; :mod:`.registry` imports only the entry points this module lets
through (:func:`admission`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..config import ALLOW_ENV, UserConfig
from ..errors import ConfigError

try:  # Python 3.12+ has the selectable entry_points API in the stdlib.
    from importlib.metadata import distributions, entry_points
except ImportError:  # pragma: no cover
    from importlib.metadata import distributions, entry_points

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "BUILTIN_MODULE_PREFIX",
    "BUILTIN_PLUGINS",
    "EntryPointInfo",
    "NotLoaded",
    "describe_entry_point",
    "installed_entry_points",
    "admission",
    "builtins_first",
    "config_for_check",
    "check_absent_references",
]

#: The distribution whose entry points are the built-in plugins.
BUILTIN_DISTRIBUTION = "sglang-moe-plugins"
#: A built-in entry point names a module of this package.
BUILTIN_MODULE_PREFIX = "sglang_moe_plugins."
#: The built-in plugins' names (pyproject.toml's entry points): reserved, whatever is installed.
BUILTIN_PLUGINS = (
    "jit_ep",
    "fp8_fallback",
    "triton",
    "reference",
    "mega_w4a8",
    "mega_w4a4",
    "mega_sm90_fp8",
    "mega_reference",
    "contig_reference",
    "contig_triton",
    "contig_sglang_fused",
    "contig_sglang_two_kernel",
)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class EntryPointInfo:
    """What the entry point says, read without importing its module."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    builtin: bool
    entry_point: Any = field(default=None, compare=False, repr=False)

    @property
    def origin(self) -> str:
        return f"{self.name} = {self.value}"

    @property
    def dist_label(self) -> str:
        if not self.distribution:
            return "unknown distribution"
        return f"{self.distribution} {self.version}" if self.version else self.distribution


@dataclass(frozen=True)
class NotLoaded:
    """An installed entry point that was not imported, and why (disabled, not in ``allow``)."""

    entry_point: str
    value: str
    distribution: str | None
    version: str | None
    reason: str

    def describe(self) -> str:
        dist = self.distribution or "unknown distribution"
        dist += f" {self.version}" if self.version and self.distribution else ""
        return f"plugin entry point {self.entry_point!r} ({self.value}, from {dist}) not loaded: {self.reason}"


def is_builtin(value: str, distribution: str | None) -> bool:
    """A built-in entry point names a module of this package and is declared by this package's
    distribution (or by no distribution: ``EntryPoint`` objects built in-process, e.g. from a checkout's
    pyproject.toml). Another distribution's entry point is third-party even when it names our modules."""
    module = value.partition(":")[0].strip()
    if not module.startswith(BUILTIN_MODULE_PREFIX):
        return False
    return distribution is None or _canonical(distribution) == BUILTIN_DISTRIBUTION


def describe_entry_point(ep: Any) -> EntryPointInfo:
    """Read ``ep``'s name, value and distribution; never raises (a broken dist-info reads as unknown)."""
    name, value = str(getattr(ep, "name", "?")), str(getattr(ep, "value", "?"))
    dist_name = dist_version = None
    try:
        dist = getattr(ep, "dist", None)
        if dist is not None:
            dist_name = dist.name or None
            dist_version = dist.version or None
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException:
        pass
    return EntryPointInfo(name, value, dist_name, dist_version, is_builtin(value, dist_name), ep)


def installed_entry_points(group: str) -> tuple[list[Any], list[tuple[str, str]]]:
    """The installed entry points of ``group`` and ``(distribution, error)`` for each distribution whose
    metadata could not be read (one broken dist-info does not hide the others)."""
    try:
        return list(entry_points(group=group)), []
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException:
        pass
    found: list[Any] = []
    broken: list[tuple[str, str]] = []
    seen: set[str] = set()
    for dist in distributions():
        try:
            name = dist.metadata["Name"] or "?"
            if _canonical(name) in seen:
                continue
            seen.add(_canonical(name))
            found += [ep for ep in dist.entry_points if ep.group == group]
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            broken.append((str(getattr(dist, "_path", "?")), f"{type(exc).__name__}: {exc}"))
    return found, broken


def admission(info: EntryPointInfo, config: UserConfig) -> str | None:
    """Why a third-party entry point must not be imported (``None``: it may). Built-ins always may."""
    if info.builtin:
        return None
    if info.name in config.disable:
        return config.provenance.get(f"disable:{info.name}", "disabled by config")
    if config.allow is not None and info.name not in config.allow:
        allowed = ", ".join(sorted(config.allow)) or "none"
        where = f"'allow' in {config.source}" if config.source else "'allow'"
        origin = ALLOW_ENV if any(n.startswith(f"{ALLOW_ENV}=") for n in config.notes) else where
        return f"not in allow ({origin}: {allowed})"
    return None


def builtins_first(infos: Iterable[EntryPointInfo]) -> list[EntryPointInfo]:
    """Built-ins first (so their names are taken before any third party's), otherwise in discovery order."""
    infos = list(infos)
    return [i for i in infos if i.builtin] + [i for i in infos if not i.builtin]


def config_for_check(config: UserConfig, absent: set[str]) -> UserConfig:
    """``config`` less the ``priority``, ``options`` and ``priority_rules`` entries of plugins that are
    installed but not loaded (disabled, not allowed, broken): those entries are ignored, not errors."""
    if not absent:
        return config
    rules = []
    for rule in config.priority_rules:
        kept = tuple((n, p) for n, p in rule.priority if n not in absent)
        if kept:
            rules.append(dataclasses.replace(rule, priority=kept))
    return dataclasses.replace(
        config,
        priority=MappingProxyType({k: v for k, v in config.priority.items() if k not in absent}),
        options=MappingProxyType({k: v for k, v in config.options.items() if k not in absent}),
        priority_rules=tuple(rules),
    )


def check_absent_references(config: UserConfig, not_loaded: Mapping[str, NotLoaded], broken: Mapping[str, Any]) -> None:
    """``force`` of a plugin that is not loaded, or ``enable`` of one outside ``allow``, cannot be honoured."""
    where = f" in {config.source}" if config.source else ""
    for op, name in sorted(config.force.items()):
        if name in not_loaded:
            raise ConfigError(
                f"force.{op} = {name!r}{where}, but plugin {name!r} is not loaded: {not_loaded[name].reason}"
            )
        if name in broken:
            raise ConfigError(
                f"force.{op} = {name!r}{where}, but plugin {name!r} could not be loaded: {broken[name].error}"
            )
    for name in sorted(config.enable):
        if name in not_loaded and name not in config.disable:
            raise ConfigError(f"enable names plugin {name!r}{where}, which is {not_loaded[name].reason}")
