"""The package's switches as SGLang server arguments: ``--moe-plugins-*`` (argparse group "sglang-moe-plugins") on
the parser of ``sglang serve`` and ``python -m sglang.launch_server``, and as keys of SGLang's YAML ``--config``
(``moe-plugins-stock: mega_moe``); each sets the package's environment variable, which the server's processes read.

SGLang's launchers run ``load_plugins()`` before they parse the command line (``launch_server``: always;
``sglang serve``: except for ``--help``, which SGLang prints before it loads any plugin); the package's entry point
then calls :func:`register_server_args`, which registers two hooks through SGLang's ``HookRegistry``:

- AFTER ``ServerArgs.add_cli_args``: the group joins every parser SGLang builds from it, so the flags are in
  ``--help`` and in the parse. SGLang's YAML ``--config`` merger (``prepare_server_args``) turns each key into the
  flag of that name, after the parser is built, so it knows them too (a list is several values, a mapping JSON);
- AROUND ``ServerArgs.from_cli_args``: ``ServerArgs`` keeps only its dataclass fields, so the flags are read from
  the parsed namespace there and exported (:func:`export_server_args`) before SGLang starts its scheduler and
  detokenizer processes, which inherit the environment and load the package themselves.

A variable already set (to a non-empty value; ``SGLANG_MOE_PLUGINS_ALLOW`` set to empty means "none") and a flag
for the same switch must agree: the same value is fine, a different one is a :class:`~..errors.ConfigError`
naming both, and nothing is exported. A malformed value is the parser's error (exit 2) naming the flag, the value
and the form allowed. On a release where either target is missing, one INFO line says so and nothing is hooked
(the variables still work). The launcher's own process loaded the package before the parse: its configuration
(which runs no MoE layer) is the environment's alone.

``enable``, ``force`` and ``priority`` had no variable (TOML only): :data:`ENABLE_ENV`, :data:`FORCE_ENV` and
:data:`PRIORITY_ENV` are theirs, in the forms :func:`parse_switch` reads (``a,b``; ``op=plugin,op=plugin``;
``plugin=N,plugin=N``).
"""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...config_values import (
    _TRUE,
    ALLOW_ENV,
    CONFIG_ENV,
    DEBUG_ENV,
    DISABLE_ENV,
    MASKED_LAYOUT_CHOICES,
    MASKED_LAYOUT_ENV,
    ON_CONFIG_ERROR_CHOICES,
    ON_CONFIG_ERROR_ENV,
    PARITY_ENV,
    REFERENCE_ON_GPU_ENV,
    REQUIRE_KNOWN_ENV,
    STOCK_ENV,
    STRICT_ENV,
)
from ...errors import ConfigError
from ...log import LogOnce, get_logger
from ...switch_values import ENABLE_ENV, FORCE_ENV, PRIORITY_ENV, parse_switch

__all__ = [
    "ADD_CLI_ARGS_TARGET",
    "FROM_CLI_ARGS_TARGET",
    "GROUP_TITLE",
    "ENABLE_ENV",
    "FORCE_ENV",
    "PRIORITY_ENV",
    "ServerSwitch",
    "SWITCHES",
    "parse_switch",
    "export_server_args",
    "register_server_args",
]

logger = get_logger(__name__)

ADD_CLI_ARGS_TARGET = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS_TARGET = "sglang.srt.server_args.ServerArgs.from_cli_args"
GROUP_TITLE = "sglang-moe-plugins"
#: Proposed variables of the switches that had none; ``config.py`` reads them once wired (see the module docstring).


@dataclass(frozen=True)
class ServerSwitch:
    """One server argument: ``--moe-plugins-<name>``, the variable it sets and the form of its value."""

    name: str
    env: str
    #: ``names`` / ``allow`` (lists), ``force`` / ``priority`` (pairs), ``choice``, ``path``, ``flag`` (boolean).
    kind: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()

    @property
    def flag(self) -> str:
        return f"--moe-plugins-{self.name}"

    @property
    def dest(self) -> str:
        return "moe_plugins_" + self.name.replace("-", "_")


SWITCHES: tuple[ServerSwitch, ...] = (
    ServerSwitch("config", CONFIG_ENV, "path", "the TOML configuration file", "PATH"),
    ServerSwitch("stock", STOCK_ENV, "names", "ops left to SGLang's own function (the rollback): op[,op] or all", "OP"),
    ServerSwitch("disable", DISABLE_ENV, "names", "plugins never selected: plugin[,plugin]", "PLUGIN"),
    ServerSwitch("enable", ENABLE_ENV, "names", "plugins turned on that are off by default: plugin[,plugin]", "PLUGIN"),
    ServerSwitch(
        "allow", ALLOW_ENV, "allow", 'the third-party plugins that may load: name[,name], or "" for none', "NAME"
    ),
    ServerSwitch(
        "force", FORCE_ENV, "force", "per op, only this plugin (or an error): op=plugin[,op=plugin]", "OP=PLUGIN"
    ),
    ServerSwitch("priority", PRIORITY_ENV, "priority", "higher is tried first: plugin=N[,plugin=N]", "PLUGIN=N"),
    ServerSwitch(
        "on-config-error",
        ON_CONFIG_ERROR_ENV,
        "choice",
        "an invalid configuration: closed (hooked calls raise it) or stock (the package is off)",
        choices=ON_CONFIG_ERROR_CHOICES,
    ),
    ServerSwitch(
        "masked-layout",
        MASKED_LAYOUT_ENV,
        "choice",
        "who lifts SGLang's masked-layout refusal: measured (where measured faster) or sglang (SGLang alone)",
        choices=MASKED_LAYOUT_CHOICES,
    ),
    ServerSwitch("parity", PARITY_ENV, "flag", "SGLang's own kernels wherever SGLang serves a call (bit-identical)"),
    ServerSwitch("reference-on-gpu", REFERENCE_ON_GPU_ENV, "flag", "the pure-torch references may serve CUDA calls"),
    ServerSwitch("strict", STRICT_ENV, "flag", "a plugin failure is an error, not a fallback"),
    ServerSwitch("debug", DEBUG_ENV, "flag", "check every call's outputs, not only each shape key's first"),
    ServerSwitch("require-known-sglang", REQUIRE_KNOWN_ENV, "flag", "hook only SGLang releases of the version table"),
)


def _flag_type(switch: ServerSwitch) -> Callable[[str], Any]:
    def convert(raw: str) -> Any:
        try:
            return parse_switch(switch.kind, raw, "value")  # argparse names the flag
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = switch.kind
    return convert


def _path(raw: str) -> str:
    if not raw.strip():
        raise argparse.ArgumentTypeError(f"--moe-plugins-config {raw!r} is empty; it names a TOML file")
    return raw


def _canonical(switch: ServerSwitch, value: Any) -> tuple[str, Any]:
    """The variable's text for a parsed flag value, and the value in the form :func:`_agrees` compares."""
    if switch.kind == "flag":
        return "1", True
    if switch.kind == "choice":
        return str(value), str(value)
    if switch.kind == "path":
        path = os.path.abspath(os.path.expanduser(str(value)))
        return path, os.path.realpath(path)
    items: list[Any] = [x for part in (value if isinstance(value, list) else [value]) for x in part]
    if switch.kind in ("names", "allow"):
        names = tuple(dict.fromkeys(items))
        return ",".join(names), frozenset(names)
    pairs: dict[str, Any] = {}
    for key, item in items:
        if pairs.get(key, item) != item:
            raise ConfigError(f"{switch.flag} gives {key!r} twice: {pairs[key]!r} and {item!r}")
        pairs[key] = item
    return ",".join(f"{k}={v}" for k, v in pairs.items()), pairs


def _agrees(switch: ServerSwitch, raw: str, wanted: Any) -> bool:
    """Whether a variable's text means what the flag says (same names in any order, same pairs, same path)."""
    text = raw.strip()
    try:
        if switch.kind == "flag":
            return text.lower() in _TRUE
        if switch.kind == "choice":
            return bool(text.lower() == wanted)
        if switch.kind == "path":
            return bool(os.path.realpath(os.path.abspath(os.path.expanduser(text))) == wanted)
        parsed = parse_switch(switch.kind, text, switch.env)
    except (ConfigError, OSError):
        return False
    return bool((frozenset(parsed) if switch.kind in ("names", "allow") else dict(parsed)) == wanted)


def _is_set(switch: ServerSwitch, env: Mapping[str, str]) -> bool:
    raw = env.get(switch.env)
    return raw is not None and (switch.kind == "allow" or bool(raw.strip()))


def export_server_args(namespace: argparse.Namespace, env: Any = None) -> dict[str, str]:
    """Set the variable of every ``--moe-plugins-*`` flag ``namespace`` holds (``env``: ``os.environ``); returns
    what was set. A variable already set to something else is a ConfigError naming both (nothing is set)."""
    env = os.environ if env is None else env
    wanted: dict[str, str] = {}
    conflicts = []
    for switch in SWITCHES:
        value = getattr(namespace, switch.dest, None)
        if value is None or value is False:
            continue
        text, compared = _canonical(switch, value)
        if _is_set(switch, env):
            if not _agrees(switch, env[switch.env], compared):
                shown = switch.flag if switch.kind == "flag" else f"{switch.flag} {text!r}"
                conflicts.append(f"{shown} conflicts with {switch.env}={env[switch.env]!r} in the environment")
            continue  # the same value: the variable stays as the user wrote it
        wanted[switch.env] = text
    if conflicts:
        raise ConfigError(
            "sglang-moe-plugins server arguments: "
            + "; ".join(conflicts)
            + " (set each switch in one place, the command line or --config or the environment, or give both the "
            "same value)"
        )
    for name, text in wanted.items():
        env[name] = text
    if wanted:
        logger.info(
            "sglang-moe-plugins: server arguments set %s for the server's processes",
            ", ".join(f"{k}={v!r}" for k, v in wanted.items()),
        )
    return wanted


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    if SWITCHES[0].flag in getattr(parser, "_option_string_actions", {}):
        return  # this parser has them already
    group = parser.add_argument_group(
        GROUP_TITLE,
        "The switches of sglang-moe-plugins (docs/configuration.md), also as keys of --config "
        "(moe-plugins-stock: mega_moe). Each sets the environment variable it names for the server's processes; "
        "a variable already set to another value is an error.",
    )
    for switch in SWITCHES:
        text = f"{switch.help} ({switch.env})."
        if switch.kind == "flag":
            group.add_argument(switch.flag, dest=switch.dest, action="store_true", default=None, help=text)
        elif switch.kind == "choice":
            group.add_argument(switch.flag, dest=switch.dest, choices=switch.choices, default=None, help=text)
        elif switch.kind == "path":
            group.add_argument(
                switch.flag, dest=switch.dest, type=_path, default=None, metavar=switch.metavar, help=text
            )
        else:
            group.add_argument(
                switch.flag,
                dest=switch.dest,
                nargs="+",  # a YAML list is several values; each may hold several, separated by commas
                type=_flag_type(switch),
                default=None,
                metavar=switch.metavar,
                help=text,
            )


def _after_add_cli_args(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ServerArgs.add_cli_args(parser)``: the group joins the parser. Leaves the result alone."""
    parser = next((a for a in (*args, *kwargs.values()) if isinstance(a, argparse.ArgumentParser)), None)
    if parser is not None:
        try:
            _add_arguments(parser)
        except Exception as exc:  # noqa: BLE001 - never break SGLang's parser; the variables still work
            if _warned.first("add"):
                logger.warning(
                    "sglang-moe-plugins: the --moe-plugins-* server arguments could not be added: %s: %s; "
                    "the SGLANG_MOE_PLUGINS_* variables still work",
                    type(exc).__name__,
                    exc,
                )
    return None


def _around_from_cli_args(original: Callable[..., Any], cls: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
    """AROUND ``ServerArgs.from_cli_args(args)``: the flags' variables are set before SGLang builds its record."""
    export_server_args(args)
    return original(cls, args, *rest, **kwargs)


_lock = threading.Lock()
_warned = LogOnce(cap=1)
_registered = False


def _missing_targets() -> list[str]:
    """The targets this SGLang lacks (or has in another form), each with why."""
    import sglang.srt.server_args as host

    server_args = getattr(host, "ServerArgs", None)
    found = vars(server_args) if isinstance(server_args, type) else {}
    missing = []
    for target, kind in ((ADD_CLI_ARGS_TARGET, staticmethod), (FROM_CLI_ARGS_TARGET, classmethod)):
        attr = found.get(target.rsplit(".", 1)[1])
        if not isinstance(attr, kind):
            what = "missing" if attr is None else f"a {type(attr).__name__}"
            missing.append(f"{target} is {what}, not a {kind.__name__}")
    return missing


def register_server_args() -> None:
    """Register the two hooks (module docstring) through SGLang's ``HookRegistry``, once per process; called by the
    package's entry point (``register()``) whatever its configuration says, so the flags parse even when the
    package turns itself off. Never raises: on a release without the targets, one INFO line and nothing hooked."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        missing = _missing_targets()
        if missing:
            logger.info(
                "sglang-moe-plugins: no --moe-plugins-* server arguments on this SGLang (%s); the SGLANG_MOE_PLUGINS_* "
                "variables and the TOML file still apply",
                "; ".join(missing),
            )
            return
        HookRegistry.register(ADD_CLI_ARGS_TARGET, _after_add_cli_args, HookType.AFTER)
        HookRegistry.register(FROM_CLI_ARGS_TARGET, _around_from_cli_args, HookType.AROUND)
    except Exception as exc:  # noqa: BLE001 - the entry point never raises into SGLang's loader
        logger.info(
            "sglang-moe-plugins: no --moe-plugins-* server arguments on this SGLang (%s: %s); the "
            "SGLANG_MOE_PLUGINS_* variables and the TOML file still apply",
            type(exc).__name__,
            exc,
        )
