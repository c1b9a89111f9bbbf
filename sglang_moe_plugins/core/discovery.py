"""Entry points of group ``sglang_moe_plugins.kernels`` before anything is imported: which distribution
declares each, whether it is a built-in, and whether the configuration lets it load (:func:`resolve`, the
one resolution that the runtime (:mod:`.registry`) and ``check`` (:mod:`..testing.loading`) share).

Built-ins are proved by file location, not by a name anyone can write: the entry points of the
distribution installed where this package was imported from (:func:`is_own_distribution`). An ``allow``
entry is an entry-point name or ``dist-name:entry-point``; a name that two distributions declare is
imported from neither (ERROR naming both). Nothing here imports a plugin module.
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
from .own_distribution import BUILTIN_MODULE_PREFIX, installed_entry_points, is_own_distribution, meta_dir

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "BUILTIN_MODULE_PREFIX",
    "BUILTIN_PLUGINS",
    "EntryPointInfo",
    "Excluded",
    "NotLoaded",
    "Resolution",
    "admission",
    "allow_matches",
    "builtins_first",
    "check_absent_references",
    "config_for_check",
    "describe_entry_point",
    "find",
    "installed_entry_points",
    "is_builtin",
    "is_own_distribution",
    "resolve",
    "split_qualified",
]

#: The distribution whose entry points are the built-in plugins (its name, for messages: built-ins are
#: proved by location, see :func:`is_own_distribution`).
BUILTIN_DISTRIBUTION = "sglang-moe-plugins"
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
_PASS_THROUGH = (KeyboardInterrupt, GeneratorExit)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def is_builtin(value: str, dist: Any) -> bool:
    """A built-in entry point names a module of this package and is declared by this package's own
    distribution (:func:`is_own_distribution`), or by none: an ``EntryPoint`` built in-process (e.g. from
    a checkout's pyproject.toml) is trusted as given. Any other distribution's entry point is third-party,
    whatever its name says and whichever modules it names."""
    if not value.partition(":")[0].strip().startswith(BUILTIN_MODULE_PREFIX):
        return False
    return dist is None or is_own_distribution(dist)


@dataclass(frozen=True)
class EntryPointInfo:
    """What the entry point says, read without importing its module."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    builtin: bool
    entry_point: Any = field(default=None, compare=False, repr=False)
    #: Declared by an installed distribution (False: an ``EntryPoint`` built in-process).
    installed: bool = False
    #: The directory that holds its distribution's metadata, where known.
    location: str | None = None

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


def describe_entry_point(ep: Any) -> EntryPointInfo:
    """Read ``ep``'s name, value and distribution; never raises (a broken dist-info reads as unknown)."""
    name, value = str(getattr(ep, "name", "?")), str(getattr(ep, "value", "?"))
    dist = dist_name = dist_version = location = None
    try:
        dist = getattr(ep, "dist", None)
        if dist is not None:
            meta = meta_dir(dist)
            location = str(meta.parent) if meta is not None else None
            metadata = dist.metadata  # parsed once (its name and version)
            dist_name = metadata["Name"] or None
            dist_version = metadata["Version"] or None
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001
        pass
    return EntryPointInfo(name, value, dist_name, dist_version, is_builtin(value, dist), ep, dist is not None, location)


# -- what the configuration lets load ---------------------------------------------------------------------
def split_qualified(text: str) -> tuple[str | None, str]:
    """``"dist-name:entry-point"`` -> ``("dist-name", "entry-point")``; a bare name -> ``(None, name)``."""
    dist, sep, name = text.strip().rpartition(":")
    return (dist.strip() or None, name.strip()) if sep else (None, text.strip())


def allow_matches(entry: str, info: EntryPointInfo) -> bool:
    """Whether ``allow`` entry ``entry`` names ``info``: its entry-point name, or ``dist-name:name`` (the
    distribution's name compared as pip compares them: case, ``-``, ``_`` and ``.`` do not matter)."""
    dist, name = split_qualified(entry)
    if name != info.name:
        return False
    return dist is None or (info.distribution is not None and _canonical(dist) == _canonical(info.distribution))


def admission(info: EntryPointInfo, config: UserConfig) -> str | None:
    """Why a third-party entry point must not be imported (``None``: it may). Built-ins always may."""
    if info.builtin:
        return None
    if info.name in config.disable:
        return config.provenance.get(f"disable:{info.name}", "disabled by config")
    if config.allow is not None and not any(allow_matches(entry, info) for entry in config.allow):
        allowed = ", ".join(sorted(config.allow)) or "none"
        where = f"'allow' in {config.source}" if config.source else "'allow'"
        origin = ALLOW_ENV if any(n.startswith(f"{ALLOW_ENV}=") for n in config.notes) else where
        return f"not in allow ({origin}: {allowed})"
    return None


def builtins_first(infos: Iterable[EntryPointInfo]) -> list[EntryPointInfo]:
    """Built-ins first (so their names are taken before any third party's), otherwise in discovery order."""
    infos = list(infos)
    return [i for i in infos if i.builtin] + [i for i in infos if not i.builtin]


@dataclass(frozen=True)
class Excluded:
    """An installed entry point that is not imported, and why: not admitted by the configuration
    (``refused`` False: a :class:`NotLoaded`), or refused (a built-in's name, a name two distributions
    declare: an ERROR, a problem under ``strict``)."""

    info: EntryPointInfo
    reason: str
    refused: bool = False


@dataclass(frozen=True)
class Resolution:
    """What discovery does with each entry point, decided before anything is imported."""

    #: To import, built-ins first.
    admitted: tuple[EntryPointInfo, ...]
    excluded: tuple[Excluded, ...]

    @property
    def not_loaded(self) -> tuple[NotLoaded, ...]:
        return tuple(
            NotLoaded(e.info.name, e.info.value, e.info.distribution, e.info.version, e.reason)
            for e in self.excluded
            if not e.refused
        )

    @property
    def refused(self) -> tuple[Excluded, ...]:
        return tuple(e for e in self.excluded if e.refused)


def _reserved(info: EntryPointInfo, builtins: Mapping[str, EntryPointInfo]) -> str:
    owner = builtins[info.name].dist_label if info.name in builtins else BUILTIN_DISTRIBUTION
    return (
        f"refused: {info.name!r} is the name of a built-in plugin of {owner}, and built-in names are reserved "
        f"({info.dist_label} may not take it; the built-in stays). Rename the third-party plugin and its entry point"
    )


def _ambiguous(name: str, infos: list[EntryPointInfo]) -> str:
    where = ", ".join(f"{i.dist_label} at {i.location}" if i.location else i.dist_label for i in infos)
    named = " or ".join(f"'{_canonical(i.distribution)}:{name}'" for i in infos if i.distribution)
    return (
        f"refused: entry point {name!r} is declared by {len(infos)} distributions ({where}), and a plugin name "
        f"must come from one; none of them is imported. Allow only the one you mean"
        + (f", by distribution and name ({named}), in allow or {ALLOW_ENV}" if named else "")
    )


def resolve(infos: Iterable[EntryPointInfo], config: UserConfig) -> Resolution:
    """Which entry points may be imported under ``config``, and why each other one may not: the one
    resolution of names, shared by the runtime (``Registry.discover``) and ``check``.

    Built-ins always are. A third-party entry point is not when it is disabled or not in ``allow``
    (``NotLoaded``), when it takes a built-in's name, or when another installed distribution declares
    the same name and is also admitted (refused, ERROR): whichever is found first on ``sys.path`` never
    decides. Entry points built in-process (no distribution) are the caller's and are not compared."""
    infos = builtins_first(infos)
    builtins = {i.name: i for i in infos if i.builtin}
    reserved = set(BUILTIN_PLUGINS) | set(builtins)
    admitted: list[EntryPointInfo] = []
    excluded: list[Excluded] = []
    for info in infos:
        reason = admission(info, config)
        if reason is not None:  # never imported: its module's import-time code does not run
            excluded.append(Excluded(info, reason))
        elif not info.builtin and info.name in reserved:  # refused before it is imported
            excluded.append(Excluded(info, _reserved(info, builtins), refused=True))
        else:
            admitted.append(info)
    by_name: dict[str, list[EntryPointInfo]] = {}
    for info in admitted:
        if not info.builtin:
            by_name.setdefault(info.name, []).append(info)
    clashes = {
        id(i): _ambiguous(n, group)
        for n, group in by_name.items()
        if len(group) > 1 and any(i.installed for i in group)
        for i in group
    }
    excluded += [Excluded(i, clashes[id(i)], refused=True) for i in admitted if id(i) in clashes]
    return Resolution(tuple(i for i in admitted if id(i) not in clashes), tuple(excluded))


def find(resolution: Resolution, target: str) -> tuple[EntryPointInfo | None, str | None]:
    """The entry point ``target`` (an entry-point name, or ``dist-name:entry-point``) resolves to in
    ``resolution``: ``(info, None)`` when it is imported; ``(None, why)`` when it is installed but not
    imported; ``(None, None)`` when no such entry point is installed."""
    for info in resolution.admitted:
        if allow_matches(target, info):
            return info, None
    why: dict[str, list[str]] = {}
    for e in resolution.excluded:
        if allow_matches(target, e.info):
            why.setdefault(e.reason, []).append(f"{e.info.origin}, from {e.info.dist_label}")
    if not why:
        return None, None
    return None, "; ".join(f"{' and '.join(origins)}: {reason}" for reason, origins in why.items())


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
