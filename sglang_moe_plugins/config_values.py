"""Parsing helpers of the user configuration (:mod:`.config`): the checks of single values from the file and
the environment (name lists, choices, 64-bit priorities, boolean switches: every boolean variable is read by
:func:`_env_flag`), the closest known name for a name error (:func:`did_you_mean`) and the frozen mappings of
:class:`.config.UserConfig`; the public names are importable from :mod:`.config`."""

from __future__ import annotations

import difflib
import os
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

__all__ = [
    "ON_CONFIG_ERROR_CHOICES",
    "MASKED_LAYOUT_CHOICES",
    "CONFIG_ENV",
    "DISABLE_ENV",
    "STRICT_ENV",
    "DEBUG_ENV",
    "ALLOW_ENV",
    "STOCK_ENV",
    "STOCK_ALL",
    "ON_CONFIG_ERROR_ENV",
    "MASKED_LAYOUT_ENV",
    "REQUIRE_KNOWN_ENV",
    "PARITY_ENV",
    "PARITY_STOCK_OPS",
    "REFERENCE_ON_GPU_ENV",
    "env_switches",
    "KNOWN_ENV",
    "did_you_mean",
    "unknown_env_warnings",
]

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


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to ``name`` (difflib's ratio, at least 0.6), else ``""``:
    appended to every name error, after the list of valid names."""
    close = difflib.get_close_matches(name, sorted(set(choices) - {name}), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _env_flag(env: Mapping[str, str], name: str) -> bool | None:
    """The boolean variable ``name`` of ``env``: None when unset; an unknown word is a ConfigError naming the
    variable, the value and the words allowed. Every boolean variable of the package is read here."""
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


CONFIG_ENV = "SGLANG_MOE_PLUGINS_CONFIG"
DISABLE_ENV = "SGLANG_MOE_PLUGINS_DISABLE"
STRICT_ENV = "SGLANG_MOE_PLUGINS_STRICT"
DEBUG_ENV = "SGLANG_MOE_PLUGINS_DEBUG"
ALLOW_ENV = "SGLANG_MOE_PLUGINS_ALLOW"
STOCK_ENV = "SGLANG_MOE_PLUGINS_STOCK"
ON_CONFIG_ERROR_ENV = "SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR"
MASKED_LAYOUT_ENV = "SGLANG_MOE_PLUGINS_MASKED_LAYOUT"
REQUIRE_KNOWN_ENV = "SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG"
PARITY_ENV = "SGLANG_MOE_PLUGINS_PARITY"
REFERENCE_ON_GPU_ENV = "SGLANG_MOE_PLUGINS_REFERENCE_ON_GPU"
#: The ops ``parity = true`` leaves to SGLang's own function: SGLang serves every call of them itself (the compact
#: activation step, MegaMoE), so the package would only change their numerics. The masked op stays hooked: its
#: calls go to SGLang's function wherever the installed release can serve them, to the plugins only where it crashes.
PARITY_STOCK_OPS = ("silu_mul_quant_contig", "mega_moe")
#: In ``stock``: every op.
STOCK_ALL = "all"

#: Every ``SGLANG_MOE_PLUGINS_*`` variable the package (and its test suite) reads, and what it does; any other
#: one is a warning naming the closest of these (:func:`unknown_env_warnings`).
KNOWN_ENV: Mapping[str, str] = _frozen(
    {
        CONFIG_ENV: "the TOML configuration file",
        DISABLE_ENV: "plugins added to disable",
        ALLOW_ENV: "the third-party plugins that may load (replaces allow)",
        STOCK_ENV: "ops left to SGLang's own function (or all)",
        ON_CONFIG_ERROR_ENV: "what an invalid configuration does: closed or stock",
        MASKED_LAYOUT_ENV: "who decides the masked layout: measured or sglang",
        STRICT_ENV: "strict = true (boolean)",
        DEBUG_ENV: "debug = true (boolean)",
        REQUIRE_KNOWN_ENV: "hook only SGLang releases of the version table (boolean)",
        PARITY_ENV: "parity = true (boolean): SGLang's own kernels wherever SGLang can serve a call",
        REFERENCE_ON_GPU_ENV: "reference_on_gpu = true (boolean): the pure-torch references may serve CUDA calls",
        "SGLANG_MOE_PLUGINS_ENABLE": "plugins added to enable (set by --moe-plugins-enable: server_args.py)",
        "SGLANG_MOE_PLUGINS_FORCE": "[force] as op=plugin pairs (set by --moe-plugins-force: server_args.py)",
        "SGLANG_MOE_PLUGINS_PRIORITY": "[priority] as plugin=N pairs (set by --moe-plugins-priority: server_args.py)",
        "SGLANG_MOE_PLUGINS_COMMIT": "benchmarks: the commit recorded where the tree has no .git",
        "SGLANG_MOE_PLUGINS_WHEEL_CACHE": "the test suite: where downloaded SGLang and DeepGEMM wheels are kept",
    }
)
#: Variables checked against :data:`KNOWN_ENV` start with this (``SGLANG_MOE_PLUGIN_X`` is a typo too).
_ENV_PREFIX = "SGLANG_MOE_PLUGIN"


def unknown_env_warnings(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """One line per ``SGLANG_MOE_PLUGIN*`` variable of ``env`` that is not in :data:`KNOWN_ENV`, naming the closest
    known one."""
    env = os.environ if env is None else env
    suffixes = {name.removeprefix(_ENV_PREFIX + "S_"): name for name in KNOWN_ENV}
    out = []
    for name in sorted(n for n in env if n.startswith(_ENV_PREFIX) and n not in KNOWN_ENV):
        rest = name.removeprefix(_ENV_PREFIX).removeprefix("S").removeprefix("_")
        close = difflib.get_close_matches(rest, list(suffixes), n=1, cutoff=0.5)
        hint = f"did you mean {suffixes[close[0]]}?" if close else f"known: {', '.join(sorted(KNOWN_ENV))}"
        out.append(f"environment variable {name} is not one sglang-moe-plugins reads; ignored; {hint}")
    return tuple(out)


def _expand_all(names: set[str]) -> frozenset[str]:
    """``names`` with ``all`` replaced by every op (an unknown name stays: the registry names it)."""
    if STOCK_ALL not in names:
        return frozenset(names)
    from .ops import OPS  # at call time: the op specs import no torch, and this module stays below them

    return frozenset(names - {STOCK_ALL}) | frozenset(OPS)


def env_switches(
    env: Mapping[str, str],
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]:
    """``SGLANG_MOE_PLUGINS_ENABLE`` (``a,b``), ``_FORCE`` (``op=plugin,...``) and ``_PRIORITY`` (``plugin=N,...``), the
    variables the ``--moe-plugins-enable/force/priority`` server arguments set: (enable, force pairs, priority
    pairs); an empty or unset variable is none. Raises ConfigError naming the variable, the value and the form."""
    from .switch_values import ENABLE_ENV, FORCE_ENV, PRIORITY_ENV, parse_switch

    def read(name: str, kind: str) -> Any:
        raw = env.get(name, "")
        return parse_switch(kind, raw, name) if raw.strip() else ()

    return read(ENABLE_ENV, "names"), read(FORCE_ENV, "force"), read(PRIORITY_ENV, "priority")


def _one_or_list(value: Any) -> Any:
    """A single string where a list of names is expected (``stock = "all"``) is a list of one."""
    return [value] if isinstance(value, str) else value
