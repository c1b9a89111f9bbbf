"""The text forms of the list and pair switches (``a,b``; ``op=plugin,...``; ``plugin=N,...``), shared by the
``SGLANG_MOE_PLUGINS_ENABLE`` / ``_FORCE`` / ``_PRIORITY`` variables (:func:`.config.load_config`) and the
``--moe-plugins-*`` server arguments (:mod:`.integrations.sglang.server_args`). Pure code: imports nothing heavy."""

from __future__ import annotations

import json
import re
from typing import Any

from .config_values import _INT64
from .errors import ConfigError

__all__ = ["ENABLE_ENV", "FORCE_ENV", "PRIORITY_ENV", "parse_switch"]

ENABLE_ENV = "SGLANG_MOE_PLUGINS_ENABLE"
FORCE_ENV = "SGLANG_MOE_PLUGINS_FORCE"
PRIORITY_ENV = "SGLANG_MOE_PLUGINS_PRIORITY"

_FORMS = {
    "names": "a name or a comma-separated list of names (name[,name])",
    "allow": 'a comma-separated list of entry-point names, or "" for none',
    "force": "op=plugin[,op=plugin] (or a YAML mapping op: plugin)",
    "priority": "plugin=integer[,plugin=integer] (or a YAML mapping plugin: integer), integers of 64 bits",
}
_NAME = re.compile(r"[^\s,={}]+")
_INT = re.compile(r"[+-]?[0-9]+")


def _names(raw: str, origin: str, kind: str) -> tuple[str, ...]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    bad = next((n for n in names if not _NAME.fullmatch(n)), None)
    if bad is not None or (not names and kind != "allow"):
        raise ConfigError(f"{origin} {raw!r} is not {_FORMS[kind]}")
    return tuple(dict.fromkeys(names))


def _pairs(raw: str, origin: str, kind: str) -> tuple[tuple[str, Any], ...]:
    """``key=value`` items, or a JSON object (what SGLang's YAML merger passes for a mapping)."""
    form = _FORMS[kind]
    items: list[tuple[str, Any]] = []
    if raw.lstrip().startswith("{"):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin} {raw!r} is not {form}: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{origin} {raw!r} is not {form}")
        items = [(str(k), v) for k, v in data.items()]
    else:
        for item in (x.strip() for x in raw.split(",")):
            key, sep, text = (p.strip() for p in item.partition("="))
            if not sep:
                raise ConfigError(f"{origin} {raw!r} is not {form}: {item!r} has no '='")
            items.append((key, text))
    out: dict[str, Any] = {}
    for key, value in items:
        if kind == "priority":
            number = str(value) if not isinstance(value, bool) else ""
            if not _INT.fullmatch(number):
                raise ConfigError(f"{origin} {raw!r} is not {form}: the priority of {key!r} must be an integer")
            value = int(number)
            if not _INT64[0] <= value <= _INT64[1]:
                raise ConfigError(f"{origin} {raw!r}: priority {value} of {key!r} does not fit a 64-bit integer")
        elif not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ConfigError(f"{origin} {raw!r} is not {form}: {value!r} is not a plugin name")
        if not _NAME.fullmatch(key):
            raise ConfigError(f"{origin} {raw!r} is not {form}: {key!r} is not a name")
        if out.get(key, value) != value:
            raise ConfigError(f"{origin} {raw!r} gives {key!r} twice: {out[key]!r} and {value!r}")
        out[key] = value
    return tuple(out.items())


def parse_switch(kind: str, raw: str, origin: str) -> Any:
    """The value of a list or pair switch in its text form (a variable's, or one flag value): a tuple of names
    (``names``, ``allow``) or of ``(key, value)`` pairs (``force``: op and plugin; ``priority``: plugin and int).
    Raises ConfigError naming ``origin``, the value and the form allowed."""
    if kind in ("names", "allow"):
        return _names(raw, origin, kind)
    return _pairs(raw, origin, kind)
