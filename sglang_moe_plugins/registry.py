"""Plugin discovery (entry point group ``sglang_moe_plugins.kernels``), validation and user config.

Built-in plugins register through the same entry point group as third-party ones. A plugin that
fails to load or to validate is reported (``Registry.problems``, the log, ``doctor``) with the
distribution it came from and skipped; it never takes the others down. With ``strict`` the registry
refuses to build instead (PluginValidationError listing every problem).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from ._version import CONTRACT_VERSION
from .config import UserConfig
from .contract import OptionValueError
from .errors import ConfigError, PluginValidationError
from .ops import OPS

try:  # Python 3.12+ has the selectable entry_points API in the stdlib.
    from importlib.metadata import EntryPoint, entry_points
except ImportError:  # pragma: no cover
    from importlib_metadata import EntryPoint, entry_points  # type: ignore[no-redef]

__all__ = ["ENTRY_POINT_GROUP", "PluginRecord", "LoadProblem", "Registry", "validate_plugin"]

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "sglang_moe_plugins.kernels"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


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

    @property
    def description(self) -> str:
        return str(getattr(self.plugin, "description", "") or "")


@dataclass(frozen=True)
class LoadProblem:
    """A plugin that could not be registered, and why."""

    entry_point: str
    value: str
    distribution: str | None
    error: str

    def describe(self) -> str:
        dist = self.distribution or "unknown distribution"
        return f"plugin entry point {self.entry_point!r} ({self.value}, from {dist}) skipped: {self.error}"


def validate_plugin(plugin: Any, origin: str) -> None:
    """Raise PluginValidationError if ``plugin`` does not satisfy the contract. ``origin`` is for messages."""
    name = getattr(plugin, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PluginValidationError(f"{origin}: name={name!r} must be a string matching {_NAME_RE.pattern}")
    who = f"plugin {name!r} ({origin})"
    op = getattr(plugin, "op", None)
    if op not in OPS:
        raise PluginValidationError(f"{who}: op={op!r} is not a known op; known ops: {', '.join(sorted(OPS))}")
    priority = getattr(plugin, "priority", None)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PluginValidationError(f"{who}: priority={priority!r} must be an int (higher is tried first)")
    for method in ("supports", "run"):
        if not callable(getattr(plugin, method, None)):
            raise PluginValidationError(f"{who}: {method} must be a method; see sglang_moe_plugins.contract")
    prepare = getattr(plugin, "prepare", None)
    if prepare is not None and not callable(prepare):
        raise PluginValidationError(f"{who}: prepare={prepare!r} must be a method prepare(shape, config) -> launch or None")
    version = getattr(plugin, "contract_version", CONTRACT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int):
        raise PluginValidationError(f"{who}: contract_version={version!r} must be an int")
    if version != CONTRACT_VERSION:
        raise PluginValidationError(
            f"{who}: written for plugin contract version {version}, this sglang-moe-plugins implements "
            f"version {CONTRACT_VERSION}; update the plugin (docs/authoring.md, 'Versioning')"
        )
    options = getattr(plugin, "options", {})
    if not isinstance(options, Mapping):
        raise PluginValidationError(f"{who}: options={options!r} must be a mapping of option name to default value")


def _merge_options(record_name: str, defaults: Mapping[str, Any], user: Mapping[str, Any], source: str | None,
                   plugin: Any = None) -> Mapping[str, Any]:
    """The plugin's defaults merged with the user's table: unknown names and wrong types are ConfigErrors,
    and so is a value the plugin's ``check_options(merged)`` rejects (OptionValueError or ValueError)."""
    merged = dict(defaults)
    where = f" in {source}" if source else ""
    for key, value in user.items():
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "(this plugin has no options)"
            raise ConfigError(f"unknown option {key!r} for plugin {record_name!r}{where}; valid options: {valid}")
        default = defaults[key]
        if default is not None and not isinstance(value, type(default)) and not (isinstance(default, float) and isinstance(value, int)):
            raise ConfigError(
                f"option {key}={value!r} for plugin {record_name!r}{where} must be of type {type(default).__name__} "
                f"(default {default!r})"
            )
        merged[key] = value
    merged_view = MappingProxyType(merged)
    check = getattr(plugin, "check_options", None)
    if check is None:
        return merged_view
    if not callable(check):
        raise ConfigError(f"plugin {record_name!r}: check_options={check!r} must be a method check_options(options) -> None")
    try:
        check(merged_view)
    except OptionValueError as exc:
        origin = where if exc.option in user else " (the plugin's default)"
        raise ConfigError(
            f"option {exc.option}={exc.value!r} for plugin {record_name!r}{origin} is not accepted; allowed: {exc.allowed}"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"invalid option value for plugin {record_name!r}{where}: {exc}") from None
    return merged_view


class Registry:
    """The plugins of every op, with the user configuration applied. Immutable once built."""

    def __init__(self, records: Iterable[PluginRecord], problems: Iterable[LoadProblem], config: UserConfig):
        self._records = tuple(sorted(records, key=lambda r: (r.op, -r.priority, r.name)))
        self._by_name = {r.name: r for r in self._records}
        self.problems: tuple[LoadProblem, ...] = tuple(problems)
        self.config = config

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def discover(cls, config: UserConfig | None = None, eps: Iterable[EntryPoint] | None = None) -> "Registry":
        """Load every entry point of ``sglang_moe_plugins.kernels`` and apply ``config``."""
        config = config or UserConfig()
        if eps is None:
            eps = entry_points(group=ENTRY_POINT_GROUP)
        loaded: list[tuple[Any, str | None, str | None]] = []
        problems: list[LoadProblem] = []
        for ep in eps:
            dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
            try:
                factory = ep.load()
                if not isinstance(factory, type):
                    raise PluginValidationError(f"entry point must name a plugin class, got {type(factory).__name__}")
                plugin = factory()
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the others down
                problems.append(LoadProblem(ep.name, ep.value, dist, f"{type(exc).__name__}: {exc}"))
                continue
            loaded.append((plugin, dist, f"{ep.name} = {ep.value}"))
        return cls._build(loaded, problems, config)

    @classmethod
    def from_plugins(cls, plugins: Iterable[Any], config: UserConfig | None = None, distribution: str | None = None) -> "Registry":
        """A registry of plugin objects given directly (tests, notebooks, embedding)."""
        return cls._build([(p, distribution, None) for p in plugins], [], config or UserConfig())

    @classmethod
    def _build(cls, loaded: list[tuple[Any, str | None, str | None]], problems: list[LoadProblem], config: UserConfig) -> "Registry":
        accepted: dict[str, tuple[Any, str | None, str | None]] = {}
        for plugin, dist, ep in loaded:
            origin = f"entry point {ep}" if ep else "given directly"
            origin += f", distribution {dist}" if dist else ""
            try:
                validate_plugin(plugin, origin)
                if plugin.name in accepted:
                    other = accepted[plugin.name][1] or "unknown distribution"
                    raise PluginValidationError(f"duplicate plugin name {plugin.name!r}: already registered by {other}")
            except PluginValidationError as exc:
                name = getattr(plugin, "name", "?")
                problems.append(LoadProblem(str(name), ep or type(plugin).__name__, dist, str(exc)))
                continue
            accepted[plugin.name] = (plugin, dist, ep)
        for warning in config.check_names({name: p.op for name, (p, _, _) in accepted.items()}, OPS):
            logger.warning("sglang-moe-plugins: %s", warning)
        records = []
        for name, (plugin, dist, ep) in accepted.items():
            default_priority = int(plugin.priority)
            priority = int(config.priority.get(name, default_priority))
            default_on = bool(getattr(plugin, "enabled_by_default", True))
            if name in config.disable:
                enabled, status = False, config.provenance.get(f"disable:{name}", "disabled by config")
            elif name in config.enable:
                enabled, status = True, config.provenance.get(f"enable:{name}", "enabled by config")
            elif default_on:
                enabled, status = True, "enabled (default)"
            else:
                enabled, status = False, "disabled (off by default; add it to 'enable')"
            if name in config.priority:
                status += f"; priority {priority} " + config.provenance.get(f"priority:{name}", "set by config")
            options = _merge_options(name, getattr(plugin, "options", {}), config.options.get(name, {}), config.source, plugin)
            if options:
                try:
                    plugin.options = options
                except AttributeError as exc:
                    raise ConfigError(f"plugin {name!r} does not accept options: {exc}") from None
            records.append(PluginRecord(plugin, name, plugin.op, default_priority, priority, enabled, status, dist, ep, options))
        for problem in problems:
            logger.warning("sglang-moe-plugins: %s", problem.describe())
        if config.strict and problems:
            # strict: a plugin that cannot be registered is an error, not a skipped entry.
            listed = "\n".join(f"  - {p.describe()}" for p in problems)
            raise PluginValidationError(
                f"strict = true and {len(problems)} plugin(s) could not be registered "
                f"(without strict they are skipped and reported):\n{listed}"
            )
        return cls(records, problems, config)

    # -- queries ------------------------------------------------------------------------------
    def records(self, op: str | None = None) -> tuple[PluginRecord, ...]:
        """Records of ``op`` (all ops if None), highest priority first."""
        return tuple(r for r in self._records if op is None or r.op == op)

    def get(self, name: str) -> PluginRecord:
        try:
            return self._by_name[name]
        except KeyError:
            valid = ", ".join(sorted(self._by_name)) or "(none registered)"
            raise KeyError(f"no plugin named {name!r}; registered plugins: {valid}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._records)
