"""Parsing helpers of the user configuration (:mod:`.config`): the checks of single values from the file and
the environment (name lists, choices, 64-bit priorities, boolean switches) and the frozen mappings of
:class:`.config.UserConfig`; the public names are importable from :mod:`.config`."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

__all__ = ["ON_CONFIG_ERROR_CHOICES", "MASKED_LAYOUT_CHOICES"]

#: ``closed``: hooks installed, every hooked call raises the error; ``stock``: no hooks, SGLang's own code runs.
ON_CONFIG_ERROR_CHOICES = ("closed", "stock")
#: ``measured``: where a plugin serves the masked call and the masked layout was measured faster, SGLang's
#: activation guard (``_masked_activation_unsupported_reason``) no longer refuses it; ``sglang``: the guard
#: is SGLang's own (the decision given back). SGLang's memory policy decides after the guard in both cases.
MASKED_LAYOUT_CHOICES = ("measured", "sglang")
#: Priorities must fit a signed 64-bit integer.
_INT64 = (-(1 << 63), (1 << 63) - 1)

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _frozen(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping))


def _hashable(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, (set, frozenset)):
        return tuple(sorted(repr(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def _string_list(value: Any, key: str, where: str, what: str = "plugin names") -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{key}{where} must be a list of {what} (strings), got {value!r}")
    return frozenset(value)


def _policy(value: Any, origin: str) -> str:
    if value not in ON_CONFIG_ERROR_CHOICES:
        raise ConfigError(f"{origin} must be one of {', '.join(map(repr, ON_CONFIG_ERROR_CHOICES))}, got {value!r}")
    return str(value)


def _masked_layout(value: Any, origin: str) -> str:
    if value not in MASKED_LAYOUT_CHOICES:
        raise ConfigError(f"{origin} must be one of {', '.join(map(repr, MASKED_LAYOUT_CHOICES))}, got {value!r}")
    return str(value)


def _env_flag(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def _names(raw: str) -> list[str]:
    return [n.strip() for n in raw.split(",") if n.strip()]
