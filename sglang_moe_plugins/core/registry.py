"""Plugin discovery (entry point group ``sglang_moe_plugins.kernels``), validation and user config.

Built-in plugins register through the same entry point group as third-party ones. Start-up never dies
from one plugin: any exception raised while an entry point is imported, instantiated or validated
(``SystemExit`` and attribute access included; not ``KeyboardInterrupt``) skips that plugin and is
reported (``Registry.problems``, one log line naming its distribution, ``list`` and ``doctor``). With
``strict`` the registry refuses to build instead (PluginValidationError listing every problem).

Before anything is imported (:func:`.discovery.resolve`, which ``check`` shares): a third-party entry
point that takes a built-in's name is refused (ERROR naming both distributions; the built-in stays,
whatever the discovery order), so are the entry points of a name two admitted distributions declare
(ERROR naming both; neither is imported), and one that is disabled or not in ``allow`` (entry-point
names or ``dist-name:entry-point``) is not imported at all (``Registry.not_loaded``). Built-ins are the
entry points of the distribution this package was imported from, proved by file location
(:mod:`.own_distribution`). An entry point's name must equal its plugin's ``name`` (``disable`` and
``allow`` match entry-point names).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..config import UserConfig
from ..config_values import did_you_mean
from ..errors import ConfigError, PluginValidationError
from ..log import get_logger
from ..ops import OPS
from .discovery import (
    BUILTIN_DISTRIBUTION,
    BUILTIN_MODULE_PREFIX,
    BUILTIN_PLUGINS,
    EntryPointInfo,
    NotLoaded,
    allow_matches,
    check_absent_references,
    config_for_check,
    describe_entry_point,
    installed_entry_points,
    resolve,
)
from .validation import _Attrs, _merge_options, _read_attrs, validate_plugin

try:  # Python 3.12+ has the selectable entry_points API in the stdlib.
    from importlib.metadata import EntryPoint
except ImportError:  # pragma: no cover
    from importlib_metadata import EntryPoint  # type: ignore[assignment]

__all__ = [
    "ENTRY_POINT_GROUP",
    "BUILTIN_PLUGINS",
    "PluginRecord",
    "LoadProblem",
    "NotLoaded",
    "Registry",
    "validate_plugin",
]

logger = get_logger(__name__)

ENTRY_POINT_GROUP = "sglang_moe_plugins.kernels"
#: Never swallowed while a plugin loads.
_PASS_THROUGH = (KeyboardInterrupt, GeneratorExit)


@dataclass(frozen=True)
class PluginRecord:
    """A registered plugin with the user config applied."""

    plugin: Any
    name: str
    op: str
    default_priority: int
    priority: int
    enabled: bool
    #: Human-readable: why enabled/disabled and where the priority came from.
    status: str
    distribution: str | None
    entry_point: str | None
    options: Mapping[str, Any]
    #: The distribution's version, where known.
    version: str | None = None
    #: Declared by this package (see :func:`.discovery.is_builtin`).
    builtin: bool = False

    @property
    def description(self) -> str:
        return str(getattr(self.plugin, "description", "") or "")

    @property
    def dist_label(self) -> str:
        if not self.distribution:
            return "-"
        return f"{self.distribution} {self.version}" if self.version else self.distribution


@dataclass(frozen=True)
class LoadProblem:
    """A plugin that could not be registered, and why."""

    entry_point: str
    value: str
    distribution: str | None
    error: str
    version: str | None = None
    #: The log level it is reported at: ``WARNING``, or ``ERROR`` for a refused built-in name.
    level: str = "WARNING"

    def describe(self) -> str:
        dist = self.distribution or "unknown distribution"
        return f"plugin entry point {self.entry_point!r} ({self.value}, from {dist}) skipped: {self.error}"


def _failure(exc: BaseException) -> str:
    try:
        text = str(exc)
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        text = "(its message cannot be shown)"
    return text if isinstance(exc, PluginValidationError) else f"{type(exc).__name__}: {text}"


def _safe_name(plugin: Any) -> str:
    try:
        name = getattr(plugin, "name", None)
    except _PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001
        name = None
    return name if isinstance(name, str) else type(plugin).__name__


def _outranking(records: Iterable[PluginRecord]) -> tuple[str, ...]:
    """One line per enabled third-party plugin whose priority is above every built-in plugin of its op."""
    records = list(records)
    notices = []
    for op in sorted({r.op for r in records}):
        builtins = [r for r in records if r.op == op and r.builtin]
        if not builtins:
            continue
        top = max(builtins, key=lambda r: (r.priority, r.name))
        for record in sorted(
            (r for r in records if r.op == op and not r.builtin and r.enabled), key=lambda r: -r.priority
        ):
            if record.priority > top.priority:
                notices.append(
                    f"third-party plugin {record.name!r} ({record.dist_label}) has priority {record.priority}, above every "
                    f"built-in plugin of op {op!r} (highest: {top.name}, {top.priority}): it is tried first for every "
                    f"call it supports"
                )
    return tuple(notices)


class Registry:
    """The plugins of every op, with the user configuration applied. Immutable once built."""

    def __init__(
        self,
        records: Iterable[PluginRecord],
        problems: Iterable[LoadProblem],
        config: UserConfig,
        not_loaded: Iterable[NotLoaded] = (),
        notices: Iterable[str] = (),
        allow_installed: Iterable[str] = (),
    ):
        self._records = tuple(sorted(records, key=lambda r: (r.op, -r.priority, r.name)))
        self._by_name = {r.name: r for r in self._records}
        self.problems: tuple[LoadProblem, ...] = tuple(problems)
        #: Installed entry points that were not imported (disabled, or not in ``allow``).
        self.not_loaded: tuple[NotLoaded, ...] = tuple(not_loaded)
        #: Warnings about the plugins that loaded (a third-party plugin outranking the built-ins).
        self.notices: tuple[str, ...] = tuple(notices)
        #: ``allow`` entries in ``dist-name:entry-point`` form that name an installed entry point (for
        #: ``check_names``'s ``known``: they are not "not installed here").
        self.allow_installed: frozenset[str] = frozenset(allow_installed)
        self.config = config

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def discover(cls, config: UserConfig | None = None, eps: Iterable[EntryPoint] | None = None) -> Registry:
        """Load the entry points of ``sglang_moe_plugins.kernels`` that may load and apply ``config``."""
        config = config or UserConfig()
        problems: list[LoadProblem] = []
        notices: list[str] = []
        if eps is None:
            eps, broken, notices = installed_entry_points(ENTRY_POINT_GROUP)
            problems += [
                LoadProblem("(metadata)", path, None, f"cannot read this distribution's metadata: {error}")
                for path, error in broken
            ]
        infos = [describe_entry_point(ep) for ep in eps]
        resolution = resolve(infos, config)  # the one resolution of names, shared with `check`
        problems += [
            LoadProblem(e.info.name, e.info.value, e.info.distribution, e.reason, e.info.version, "ERROR")
            for e in resolution.refused
        ]
        loaded: list[tuple[Any, EntryPointInfo | None, str | None]] = []
        not_loaded: list[NotLoaded] = list(resolution.not_loaded)
        for info in resolution.admitted:
            try:
                factory = info.entry_point.load()
                if not isinstance(factory, type):
                    raise PluginValidationError(f"entry point must name a plugin class, got {type(factory).__name__}")
                plugin = factory()
            except _PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: BLE001 - SystemExit included: one plugin never takes start-up down
                if info.name in config.disable:  # a disabled built-in that cannot be imported is not a problem
                    reason = config.provenance.get(f"disable:{info.name}", "disabled by config")
                    not_loaded.append(
                        NotLoaded(
                            info.name,
                            info.value,
                            info.distribution,
                            info.version,
                            f"{reason}; importing it failed: {_failure(exc)}",
                        )
                    )
                else:
                    problems.append(LoadProblem(info.name, info.value, info.distribution, _failure(exc), info.version))
                continue
            loaded.append((plugin, info, info.distribution))
        # allow's `dist-name:entry-point` entries that name an installed entry point are not "not installed"
        known = {entry for entry in config.allow or () if any(allow_matches(entry, i) for i in infos)}
        return cls._build(loaded, problems, config, not_loaded, notices, known)

    @classmethod
    def from_plugins(
        cls, plugins: Iterable[Any], config: UserConfig | None = None, distribution: str | None = None
    ) -> Registry:
        """A registry of plugin objects given directly (tests, notebooks, embedding). They are trusted as
        given: ``allow`` and the reserved built-in names apply to entry points only."""
        return cls._build([(p, None, distribution) for p in plugins], [], config or UserConfig())

    @classmethod
    def _build(
        cls,
        loaded: list[tuple[Any, EntryPointInfo | None, str | None]],
        problems: list[LoadProblem],
        config: UserConfig,
        not_loaded: Iterable[NotLoaded] = (),
        discovery_notices: Iterable[str] = (),
        known: Iterable[str] = (),
    ) -> Registry:
        not_loaded, known = tuple(not_loaded), frozenset(known)
        accepted: dict[str, tuple[Any, _Attrs, EntryPointInfo | None, str | None]] = {}
        for plugin, info, dist in loaded:
            origin = f"entry point {info.origin}" if info else "given directly"
            origin += f", distribution {info.dist_label if info else dist}" if dist else ""
            try:
                attrs = _read_attrs(plugin, origin)
                if info is not None and attrs.name != info.name:
                    raise PluginValidationError(
                        f"the plugin it loads is named {attrs.name!r}, not {info.name!r}: an entry point's name "
                        f"must equal its plugin's name (disable and allow match entry-point names); rename one of them"
                    )
                if attrs.name in accepted:
                    other = accepted[attrs.name][3] or "unknown distribution"
                    raise PluginValidationError(f"duplicate plugin name {attrs.name!r}: already registered by {other}")
            except _PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: BLE001 - an attribute that raises is this plugin's problem only
                name = info.name if info else _safe_name(plugin)
                problems.append(
                    LoadProblem(
                        name,
                        info.value if info else type(plugin).__name__,
                        dist,
                        _failure(exc),
                        info.version if info else None,
                    )
                )
                continue
            accepted[attrs.name] = (plugin, attrs, info, dist)
        # An entry point not loaded, or refused, under a name another distribution's plugin has: the name is loaded.
        by_name = {n.entry_point: n for n in not_loaded if n.entry_point not in accepted}
        broken = {p.entry_point: p for p in problems if p.entry_point not in accepted}
        check_absent_references(config, by_name, broken)
        absent = set(by_name) | set(broken)
        check = config_for_check(config, absent)
        plugins = {name: a.op for name, (_, a, _, _) in accepted.items()}
        for warning in check.check_names(plugins, OPS, known=absent | known):
            logger.warning("sglang-moe-plugins: %s", warning)
        records = []
        for name, (plugin, attrs, info, dist) in accepted.items():
            default_priority = attrs.priority
            priority = int(config.priority.get(name, default_priority))
            if name in config.disable:
                enabled, status = False, config.provenance.get(f"disable:{name}", "disabled by config")
            elif name in config.enable:
                enabled, status = True, config.provenance.get(f"enable:{name}", "enabled by config")
            elif attrs.enabled_by_default:
                enabled, status = True, "enabled (default)"
            else:
                enabled, status = False, "disabled (off by default; add it to 'enable')"
            if name in config.priority:
                status += f"; priority {priority} " + config.provenance.get(f"priority:{name}", "set by config")
            options: Mapping[str, Any] = MappingProxyType(dict(attrs.options))
            try:  # a check_options or options setter that breaks is this plugin's problem only
                options = _merge_options(name, attrs.options, config.options.get(name, {}), config.source, plugin)
                if options:
                    plugin.options = options
            except AttributeError as exc:
                if config.options.get(name):  # the user's values cannot reach the plugin (no default-only case)
                    raise ConfigError(f"plugin {name!r} does not accept options: {exc}") from None
            except (ConfigError, *_PASS_THROUGH):
                raise
            except BaseException as exc:  # noqa: BLE001
                problems.append(
                    LoadProblem(
                        name,
                        info.value if info else type(plugin).__name__,
                        dist,
                        f"setting its options raised {_failure(exc)}",
                        info.version if info else None,
                    )
                )
                continue
            if info is not None:
                builtin, version = info.builtin, info.version
            else:
                builtin = (
                    bool(dist)
                    and dist == BUILTIN_DISTRIBUTION
                    and type(plugin).__module__.startswith(BUILTIN_MODULE_PREFIX)
                )
                version = None
            records.append(
                PluginRecord(
                    plugin,
                    name,
                    attrs.op,
                    default_priority,
                    priority,
                    enabled,
                    status,
                    dist,
                    info.origin if info else None,
                    options,
                    version,
                    builtin,
                )
            )
        for problem in problems:
            logger.log(logging.getLevelName(problem.level), "sglang-moe-plugins: %s", problem.describe())
        notices = (*discovery_notices, *_outranking(records))
        for notice in notices:
            logger.warning("sglang-moe-plugins: %s", notice)
        if config.strict and problems:
            # strict: a plugin that cannot be registered is an error, not a skipped entry.
            listed = "\n".join(f"  - {p.describe()}" for p in problems)
            raise PluginValidationError(
                f"strict = true and {len(problems)} plugin(s) could not be registered "
                f"(without strict they are skipped and reported):\n{listed}"
            )
        return cls(records, problems, config, not_loaded, notices, known)

    # -- queries ------------------------------------------------------------------------------
    def records(self, op: str | None = None) -> tuple[PluginRecord, ...]:
        """Records of ``op`` (all ops if None), highest priority first."""
        return tuple(r for r in self._records if op is None or r.op == op)

    def get(self, name: str) -> PluginRecord:
        try:
            return self._by_name[name]
        except KeyError:
            valid = ", ".join(sorted(self._by_name)) or "(none registered)"
            raise KeyError(
                f"no plugin named {name!r}; registered plugins: {valid}{did_you_mean(name, self._by_name)}"
            ) from None

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._records)
