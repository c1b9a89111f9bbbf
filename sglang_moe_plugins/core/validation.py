"""A plugin's contract, checked: its attributes read once (name, op, priority, methods, contract version,
options) and its option defaults merged with the user's table. :mod:`.registry` applies both."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .._version import CONTRACT_VERSION
from ..contract import OptionValueError
from ..errors import ConfigError, PluginValidationError
from ..ops import OPS

__all__ = ["validate_plugin"]


_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class _Attrs:
    """A plugin's contract attributes, read once."""

    name: str
    op: str
    priority: int
    enabled_by_default: bool
    options: Mapping[str, Any]


def _read_attrs(plugin: Any, origin: str) -> _Attrs:
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
        raise PluginValidationError(
            f"{who}: prepare={prepare!r} must be a method prepare(shape, config) -> launch or None"
        )
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
    return _Attrs(name, str(op), int(priority), bool(getattr(plugin, "enabled_by_default", True)), options)


def validate_plugin(plugin: Any, origin: str) -> None:
    """Raise PluginValidationError if ``plugin`` does not satisfy the contract. ``origin`` is for messages.
    An attribute whose access raises lets that exception through (the registry reports it)."""
    _read_attrs(plugin, origin)


def _merge_options(
    record_name: str, defaults: Mapping[str, Any], user: Mapping[str, Any], source: str | None, plugin: Any = None
) -> Mapping[str, Any]:
    """The plugin's defaults merged with the user's table: unknown names and wrong types are ConfigErrors,
    and so is a value the plugin's ``check_options(merged)`` rejects (OptionValueError or ValueError)."""
    merged = dict(defaults)
    where = f" in {source}" if source else ""
    for key, value in user.items():
        if key not in defaults:
            valid = ", ".join(sorted(defaults)) or "(this plugin has no options)"
            raise ConfigError(f"unknown option {key!r} for plugin {record_name!r}{where}; valid options: {valid}")
        default = defaults[key]
        if (
            default is not None
            and not isinstance(value, type(default))
            and not (isinstance(default, float) and isinstance(value, int))
        ):
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
        raise ConfigError(
            f"plugin {record_name!r}: check_options={check!r} must be a method check_options(options) -> None"
        )
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
