"""Exceptions raised by sglang-moe-plugins. Every message names what is wrong and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "MoEPluginsError",
    "ConfigError",
    "InvalidArgumentError",
    "PluginValidationError",
    "NoPluginAvailableError",
    "KernelNotAvailableError",
    "OutputValidationError",
]


class MoEPluginsError(Exception):
    """Base class of every error this package raises."""


class ConfigError(MoEPluginsError, ValueError):
    """The user configuration (TOML file or environment variables) is invalid."""


class InvalidArgumentError(MoEPluginsError, ValueError):
    """An argument of an op call is invalid. ``argument`` names it, ``value`` holds the bad value."""

    def __init__(self, op: str, argument: str, value: Any, allowed: str, plugin: str | None = None):
        self.op = op
        self.argument = argument
        self.value = value
        self.allowed = allowed
        self.plugin = plugin
        where = f"{op}" + (f" (plugin {plugin!r})" if plugin else "")
        super().__init__(f"{where}: invalid argument {argument}={_short(value)}; allowed: {allowed}")


class PluginValidationError(MoEPluginsError, TypeError):
    """A plugin object does not satisfy the plugin contract."""


class NoPluginAvailableError(MoEPluginsError, RuntimeError):
    """No enabled plugin supports a call. ``rejections`` holds ``(plugin name, reason)`` pairs.

    When the configuration forces a plugin for the op, ``forced`` names it and the message starts with
    that plugin and its reason: a forced plugin that cannot run a call is an error, never a fallback.
    """

    def __init__(
        self,
        op: str,
        key_description: str,
        rejections: Iterable[tuple[str, str]],
        hint: str = "",
        forced: str | None = None,
        to_host: bool = False,
    ):
        self.op = op
        self.rejections = tuple(rejections)
        self.forced = forced
        #: Only a withheld pure-torch reference could run the call, and strict is off: the SGLang hooks hand it to
        #: SGLang's own function (docs/reliability.md) instead of raising.
        self.to_host = to_host
        if forced is not None:
            reason = dict(self.rejections).get(forced, "it is not registered")
            lines = [
                f"the forced plugin {forced!r} (force.{op} in the configuration) cannot run {op} {key_description}: "
                f"{reason}; the call is not handed to another plugin or to the host's function (remove force.{op} "
                "to let the others run it)"
            ]
        else:
            lines = [f"no enabled plugin of op {op!r} supports {key_description}:"]
            lines += [f"  - {name}: {reason}" for name, reason in self.rejections] or ["  (no plugins registered)"]
        if any(reason.startswith("withheld:") for _name, reason in self.rejections):
            lines.append(
                "the pure-torch reference is withheld from CUDA calls (reference_on_gpu = false): "
                + ("SGLang's own function runs the call" if to_host else "under strict the call fails")
            )
        if hint:
            lines.append(hint)
        super().__init__("\n".join(lines))


class KernelNotAvailableError(MoEPluginsError, NotImplementedError):
    """A plugin was asked to run a path whose kernel is not available in this build or on this host."""


class OutputValidationError(MoEPluginsError, RuntimeError):
    """A plugin returned outputs that do not match the op's contract (shape, dtype, strides)."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
