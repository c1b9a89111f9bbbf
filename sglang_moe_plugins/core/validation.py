"""A plugin's contract, checked: its attributes read once (name, op, priority, methods, contract version,
options, a static ``writes_inputs``) and its option defaults merged with the user's table. :mod:`.registry`
applies both. :func:`read_writes_inputs` reads a ``writes_inputs`` declaration the same way for the
registry, the selector's failure policy (:mod:`.bound`) and the conformance kit."""

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

__all__ = ["read_writes_inputs", "validate_plugin", "writable_names"]


_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class _Attrs:
    """A plugin's contract attributes, read once."""

    name: str
    op: str
    priority: int
    enabled_by_default: bool
    options: Mapping[str, Any]


def writable_names(op: str) -> tuple[str, ...]:
    """The inputs of ``op`` that a host may mark writable (OpSpec.writable_inputs), by name."""
    return tuple(name for name, _ in OPS[op].writable_inputs)


def read_writes_inputs(declared: object, op: str, allowed: tuple[str, ...] | None = None) -> frozenset[str]:
    """A ``writes_inputs`` value (already called when it is a method) as a set of input names of ``op``.

    Raises ValueError, naming the value and what is allowed, for anything else: not a string or a collection
    of strings, or a name that is not one of the op's writable inputs (``('gateup_output',)`` for
    ``gateup``). A declaration that cannot be read promises nothing: the selector then assumes the plugin
    may write every writable input. ``allowed``: the writable inputs' names (default: the op's)."""
    if allowed is None:
        allowed = writable_names(op)
    names: frozenset[str] | None = None
    if isinstance(declared, str):
        names = frozenset((declared,))
    elif isinstance(declared, (tuple, list, set, frozenset)) and all(isinstance(n, str) for n in declared):
        names = frozenset(declared)
    want = (
        f"a collection of names among {allowed} (empty: it writes no input)"
        if allowed
        else f"an empty collection (op {op!r} has no input a host may mark writable)"
    )
    if names is None:
        raise ValueError(f"writes_inputs={declared!r} is not a collection of input names; allowed: {want}")
    unknown = sorted(names.difference(allowed))
    if unknown:
        raise ValueError(
            f"writes_inputs={declared!r} names {', '.join(map(repr, unknown))}, which is not an input op {op!r} "
            f"lets a host mark writable; allowed: {want}"
        )
    return names


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
    declared = getattr(plugin, "writes_inputs", None)
    if declared is not None and not callable(declared):
        try:
            read_writes_inputs(declared, str(op))
        except ValueError as exc:
            raise PluginValidationError(
                f"{who}: {exc}, or a method writes_inputs(shape, config) returning one (docs/plugin-contract.md)"
            ) from None
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
