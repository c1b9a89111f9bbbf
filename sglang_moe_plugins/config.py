"""User configuration: a TOML file named by ``SGLANG_MOE_PLUGINS_CONFIG`` plus environment switches.

File format (every table optional)::

    strict = false                       # re-raise plugin failures instead of falling back
    on_config_error = "closed"           # "closed": an invalid config makes every hooked call raise it;
                                         # "stock": the package is off and SGLang runs its own code
    allow = ["my_kernels"]               # third-party plugins (entry-point names) that may load; unset: all
    stock = ["mega_moe"]                 # ops left unhooked: SGLang's own function runs them ("all": every op)
    masked_layout = "measured"           # or "sglang": SGLang's activation guard decides the layout alone
    parity = false                       # true: SGLang's own kernels wherever SGLang can serve a call (bit-identical)
    reference_on_gpu = false             # true: the pure-torch references may serve CUDA calls (else only when forced)
    debug = false                        # check every call's outputs, not only the first per shape key
    disable = ["jit_ep"]                 # never select these
    enable = ["my_experimental_kernel"]  # turn on plugins that are off by default / disabled by env
    [priority]                           # override default priorities (higher is tried first)
    triton = 150
    [force]                              # per op: use exactly this plugin (an error if it cannot)
    silu_mul_quant = "triton"
    [options.triton]                     # per-plugin options, validated against the plugin's own
    pdl = false
    [[priority_rules]]                   # per op and shape bucket: priorities for the matching shapes
    op = "silu_mul_quant"
    when = { hidden_min = 8193 }         # inclusive bounds on the op's shape fields (<field>_min / _max)
    priority = { fp8_fallback = 200 }    # first matching rule naming a plugin wins (priority_rules.py)

Environment:

- ``SGLANG_MOE_PLUGINS_DISABLE=a,b``: adds to ``disable``. Names not installed on this host are a warning
  (one config may serve a mixed fleet); names in ``enable``, ``force``, ``priority`` and ``options`` must exist.
- ``SGLANG_MOE_PLUGINS_ALLOW=a,b``: replaces ``allow`` (the third-party plugins that may load).
- ``SGLANG_MOE_PLUGINS_STOCK=op,op`` (or ``all``): adds to ``stock``; wins over the file's ``force`` of those ops
  (a warning). ``register()`` reads it through :func:`stock_rollback` (.config_file), which never fails closed.
- ``SGLANG_MOE_PLUGINS_ON_CONFIG_ERROR=closed|stock``, ``SGLANG_MOE_PLUGINS_MASKED_LAYOUT=measured|sglang``:
  set ``on_config_error``, ``masked_layout``. ``SGLANG_MOE_PLUGINS_STRICT=1``, ``..._DEBUG=1``: ``strict``, ``debug``.
- ``SGLANG_MOE_PLUGINS_PARITY=1``, ``..._REFERENCE_ON_GPU=1``: ``parity``, ``reference_on_gpu``. ``parity`` adds
  :data:`PARITY_STOCK_OPS` to ``stock`` and sets ``masked_layout = "sglang"``; the masked op's hook sends every call
  the installed release serves to SGLang's function (``integrations/sglang/stock_rules.py``).
- ``SGLANG_MOE_PLUGINS_REQUIRE_KNOWN_SGLANG=1``: read by ``integrations/sglang/versions.py``, checked here.
- :data:`KNOWN_ENV` names every variable the package reads (others: :func:`unknown_env_warnings`). Booleans take
  1/0, true/false, yes/no, on/off; another word is a ConfigError.
- SGLang's older switches are translated (and reported by ``doctor``/``list``):
  ``SGLANG_OPT_USE_JIT_EP_ACTIVATION=0`` disables ``jit_ep``;
  ``SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS=1`` or ``SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND=1``
  prefers ``mega_w4a4`` (priority above ``mega_w4a8``). They are never forwarded to DeepGEMM.

The file must be a regular file of at most :data:`MAX_CONFIG_BYTES` (a FIFO, device or socket is refused
without being opened), UTF-8 (a BOM is accepted); ``~`` in the path is expanded.

This module parses and checks the form; plugin names are checked when the configuration is applied
(:meth:`UserConfig.check_names`: errors list the valid names and the closest one). Contradictions (``force`` of a
``stock`` op or of a disabled plugin, a plugin both enabled and disabled) are errors naming both keys.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .config_file import (
    CONFIG_ENV,
    MAX_CONFIG_BYTES,
    StockRollback,
    config_error_policy,
    config_path as _config_path,
    parse_file as _parse_file,
    stock_rollback,
)
from .config_legacy import LEGACY_ENV, translate_legacy
from .config_values import (
    _FALSE,
    _INT64,
    ALLOW_ENV,
    DEBUG_ENV,
    DISABLE_ENV,
    KNOWN_ENV,
    MASKED_LAYOUT_CHOICES,
    MASKED_LAYOUT_ENV,
    ON_CONFIG_ERROR_CHOICES,
    ON_CONFIG_ERROR_ENV,
    PARITY_ENV,
    PARITY_STOCK_OPS,
    REFERENCE_ON_GPU_ENV,
    REQUIRE_KNOWN_ENV,
    STOCK_ALL,
    STOCK_ENV,
    STRICT_ENV,
    _env_flag,
    _expand_all,
    _frozen,
    _hashable,
    _masked_layout,
    _names,
    _one_or_list,
    _policy,
    _string_list,
    did_you_mean,
    env_switches,
    unknown_env_warnings,
)
from .errors import ConfigError
from .priority_rules import PriorityRule, parse_priority_rules

__all__ = [
    "CONFIG_ENV",
    "DISABLE_ENV",
    "STRICT_ENV",
    "DEBUG_ENV",
    "ALLOW_ENV",
    "STOCK_ENV",
    "STOCK_ALL",
    "REQUIRE_KNOWN_ENV",
    "KNOWN_ENV",
    "ON_CONFIG_ERROR_ENV",
    "ON_CONFIG_ERROR_CHOICES",
    "MASKED_LAYOUT_ENV",
    "MASKED_LAYOUT_CHOICES",
    "PARITY_ENV",
    "PARITY_STOCK_OPS",
    "REFERENCE_ON_GPU_ENV",
    "MAX_CONFIG_BYTES",
    "config_error_policy",
    "LEGACY_ENV",
    "StockRollback",
    "UserConfig",
    "did_you_mean",
    "load_config",
    "parse_config",
    "stock_rollback",
    "strict_requested",
    "unknown_env_warnings",
]

_TOP_KEYS = (
    "strict",
    "debug",
    "on_config_error",
    "allow",
    "stock",
    "disable",
    "enable",
    "priority",
    "force",
    "options",
    "priority_rules",
    "masked_layout",
    "parity",
    "reference_on_gpu",
)


@dataclass(frozen=True)
class UserConfig:
    """The validated user configuration. ``notes`` says where each setting came from."""

    strict: bool = False
    #: Check the outputs of every call against the op's layout, not only the first call of each shape key.
    debug: bool = False
    #: What an invalid configuration does (:data:`ON_CONFIG_ERROR_CHOICES`); read by ``register()``.
    on_config_error: str = "closed"
    #: Third-party plugins (entry-point names) that may load; None: every installed one. Built-ins always may.
    allow: frozenset[str] | None = None
    #: Ops left unhooked: SGLang's own function runs them (``"all"``: every op; :func:`load_config` expands it).
    stock: frozenset[str] = frozenset()
    #: Who decides whether an activation-guarded config may take the masked layout (:data:`MASKED_LAYOUT_CHOICES`).
    masked_layout: str = "measured"
    #: SGLang's own kernels wherever the installed release serves a call (PARITY_STOCK_OPS stock, the masked op's
    #: servable calls handed to SGLang's function): outputs bit-identical to stock; the plugins only where it crashes.
    parity: bool = False
    #: Whether the pure-torch reference plugins (``Plugin.oracle``) may serve CUDA calls without being forced.
    reference_on_gpu: bool = False
    disable: frozenset[str] = frozenset()
    enable: frozenset[str] = frozenset()
    priority: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    force: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _frozen({}))
    #: ``[[priority_rules]]``: per op and shape bucket priorities, in file order.
    priority_rules: tuple[PriorityRule, ...] = ()
    #: ``{"disable:<plugin>" | "enable:<plugin>" | "priority:<plugin>": "why"}``: where each entry came from.
    provenance: Mapping[str, str] = field(default_factory=lambda: _frozen({}))
    notes: tuple[str, ...] = ()
    source: str | None = None
    #: Settings that were not applied, one line each (``force`` of an op that the environment left ``stock``).
    warnings: tuple[str, ...] = ()

    def __hash__(self) -> int:
        # By value, as equality is: the mappings (and option values such as lists) are frozen first.
        return hash(tuple(_hashable(getattr(self, f.name)) for f in fields(self)))

    def check_names(self, plugins: Mapping[str, str], ops: Iterable[str], known: Iterable[str] = ()) -> tuple[str, ...]:
        """Raise ConfigError for unknown plugin or op names and contradictions; return warnings for names that need
        not exist (:func:`.config_names.check_names`)."""
        from .config_names import check_names

        return check_names(self, plugins, ops, known)


def parse_config(data: Mapping[str, Any], source: str | None = None) -> UserConfig:
    """Check the form of a parsed TOML document and build a UserConfig."""
    where = f" in {source}" if source else ""
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r}{where}; valid keys: {', '.join(_TOP_KEYS)}{did_you_mean(unknown[0], _TOP_KEYS)}"
        )
    strict, debug, parity, reference_on_gpu = (
        _boolean(data, key, where) for key in ("strict", "debug", "parity", "reference_on_gpu")
    )
    on_config_error = _policy(data.get("on_config_error", "closed"), f"on_config_error{where}")
    masked_layout = _masked_layout(data.get("masked_layout", "measured"), f"masked_layout{where}")
    allow = _string_list(data["allow"], "allow", where) if "allow" in data else None
    stock = _string_list(_one_or_list(data.get("stock", [])), "stock", where, "op names")  # "all" as a string too
    disable = _string_list(data.get("disable", []), "disable", where)
    enable = _string_list(data.get("enable", []), "enable", where)
    priority = data.get("priority", {})
    if not isinstance(priority, dict):
        raise ConfigError(f"[priority]{where} must be a table of plugin = integer, got {priority!r}")
    for name, value in priority.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"priority.{name}{where} must be an integer, got {value!r}")
        if not _INT64[0] <= value <= _INT64[1]:
            raise ConfigError(
                f"priority.{name}{where} = {value} does not fit a 64-bit integer ({_INT64[0]} to {_INT64[1]})"
            )
    force = data.get("force", {})
    if not isinstance(force, dict) or not all(isinstance(v, str) for v in force.values()):
        raise ConfigError(f'[force]{where} must be a table of op = "plugin name", got {force!r}')
    options = data.get("options", {})
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise ConfigError(f"[options]{where} must hold one table per plugin ([options.<plugin>]), got {options!r}")
    rules = parse_priority_rules(data.get("priority_rules", []), where)
    provenance = {f"disable:{name}": f"disabled by 'disable'{where}" for name in disable}
    provenance.update({f"enable:{name}": f"enabled by 'enable'{where}" for name in enable})
    provenance.update({f"priority:{name}": f"set by [priority]{where}" for name in priority})
    provenance.update({f"allow:{name}": f"allowed by 'allow'{where}" for name in allow or ()})
    provenance.update({f"stock:{op}": f"left to SGLang by 'stock'{where}" for op in stock})
    if parity:
        provenance.update({f"stock:{op}": f"left to SGLang by parity = true{where}" for op in PARITY_STOCK_OPS})
        stock = stock | frozenset(PARITY_STOCK_OPS)
    return UserConfig(
        strict=strict,
        debug=debug,
        on_config_error=on_config_error,
        allow=allow,
        stock=stock,
        masked_layout="sglang" if parity else masked_layout,
        parity=parity,
        reference_on_gpu=reference_on_gpu,
        disable=disable,
        enable=enable,
        priority=_frozen(priority),
        force=_frozen(force),
        options=_frozen({k: _frozen(v) for k, v in options.items()}),
        priority_rules=rules,
        provenance=_frozen(provenance),
        source=source,
    )


def _boolean(data: Mapping[str, Any], key: str, where: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{key}{where} must be true or false, got {value!r}")
    return value


def load_config(env: Mapping[str, str] | None = None) -> UserConfig:
    """Read the file named by ``SGLANG_MOE_PLUGINS_CONFIG`` (if set) and apply the environment."""
    env = os.environ if env is None else env
    path = _config_path(env)
    if path:
        raw = env.get(CONFIG_ENV, "").strip()
        config = parse_config(_parse_file(path, f"{CONFIG_ENV}={raw!r}"), source=path)
    else:
        config = UserConfig()
    enable_env, force_env, priority_env = env_switches(env)  # the --moe-plugins-* server arguments' variables
    disable, enable = set(config.disable), {*config.enable, *enable_env}
    priority = {**config.priority, **dict(priority_env)}
    provenance = dict(config.provenance)
    notes = list(config.notes)
    strict = config.strict
    debug = config.debug

    for name in _names(env.get(DISABLE_ENV, "")):
        disable.add(name)
        provenance[f"disable:{name}"] = f"disabled by {DISABLE_ENV}"
    allow = config.allow
    if ALLOW_ENV in env:
        allow = frozenset(_names(env[ALLOW_ENV]))
        provenance.update({f"allow:{name}": f"allowed by {ALLOW_ENV}" for name in allow})
        notes.append(
            f"{ALLOW_ENV}={env[ALLOW_ENV]!r}: third-party plugins allowed: {', '.join(sorted(allow)) or 'none'}"
        )
    stock = set(config.stock)
    from_env: set[str] = set()
    parity = bool(config.parity or _env_flag(env, PARITY_ENV))
    parity_env = PARITY_STOCK_OPS if parity and not config.parity else ()
    for op, origin in [
        *((op, STOCK_ENV) for op in _names(env.get(STOCK_ENV, ""))),
        *((op, f"{PARITY_ENV}=1") for op in parity_env),
    ]:
        stock.add(op)
        from_env.add(op)
        provenance.setdefault(f"stock:{op}", f"left to SGLang by {origin}")
    force = {**config.force, **dict(force_env)}
    warnings = []
    # The environment's rollback wins over the file's force (a warning); the file's own contradiction is an error.
    for op in sorted(set(force) & _expand_all(from_env) - _expand_all(set(config.stock))):
        warnings.append(
            f"force.{op} = {force.pop(op)!r} in {config.source} is ignored: op {op!r} is stock "
            f"({provenance.get(f'stock:{op}', provenance.get(f'stock:{STOCK_ALL}', STOCK_ENV)).removeprefix('left to SGLang by ')}), so SGLang's own function runs it"
        )
    on_config_error = config.on_config_error
    if env.get(ON_CONFIG_ERROR_ENV, "").strip():
        on_config_error = _policy(env[ON_CONFIG_ERROR_ENV].strip().lower(), ON_CONFIG_ERROR_ENV)
    masked_layout = config.masked_layout
    if env.get(MASKED_LAYOUT_ENV, "").strip():
        masked_layout = _masked_layout(env[MASKED_LAYOUT_ENV].strip().lower(), MASKED_LAYOUT_ENV)
        notes.append(f"{MASKED_LAYOUT_ENV}={env[MASKED_LAYOUT_ENV]!r} -> masked_layout = {masked_layout!r}")
    if parity:
        if masked_layout != "sglang":
            notes.append(f"parity = true -> masked_layout = 'sglang' (not {masked_layout!r}): SGLang's guard decides")
        masked_layout = "sglang"
        notes.append("parity = true: SGLang's own kernels wherever the installed release can serve a call")
    reference_on_gpu = bool(config.reference_on_gpu or _env_flag(env, REFERENCE_ON_GPU_ENV))
    if _env_flag(env, STRICT_ENV):
        strict = True
        notes.append(f"{STRICT_ENV}=1 -> strict = true")
    if _env_flag(env, DEBUG_ENV):
        debug = True
        notes.append(f"{DEBUG_ENV}=1 -> debug = true (every call's outputs are checked)")
    if _env_flag(env, REQUIRE_KNOWN_ENV):  # read by integrations/sglang/versions.py; its value is checked here
        notes.append(f"{REQUIRE_KNOWN_ENV}=1 -> only SGLang releases of the version table are hooked")

    translate_legacy(env, _env_flag, disable, enable, priority, provenance, notes)
    return UserConfig(
        strict=strict,
        debug=debug,
        on_config_error=on_config_error,
        allow=allow,
        stock=_expand_all(stock),
        masked_layout=masked_layout,
        parity=parity,
        reference_on_gpu=reference_on_gpu,
        disable=frozenset(disable),
        enable=frozenset(enable),
        priority=_frozen(priority),
        force=_frozen(force),
        options=config.options,
        priority_rules=config.priority_rules,
        provenance=_frozen(provenance),
        notes=tuple(notes),
        source=config.source,
        warnings=tuple(warnings),
    )


def strict_requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the user asked for strict mode, also when the configuration itself is invalid.

    ``SGLANG_MOE_PLUGINS_STRICT`` set to anything but a false value (an invalid value counts: the user
    meant something), or a configuration that loads and says ``strict = true``.
    """
    env = os.environ if env is None else env
    raw = env.get(STRICT_ENV)
    if raw is not None and raw.strip().lower() not in _FALSE:
        return True
    try:
        return load_config(env).strict
    except ConfigError:
        return False
