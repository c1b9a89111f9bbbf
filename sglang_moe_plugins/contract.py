"""The kernel-plugin contract: ``Support`` answers and the ``Plugin`` base class.

A plugin is any object with

- ``name``: short unique identifier (``[a-z][a-z0-9_]*``: a lowercase letter, then lowercase
  letters, digits and underscores),
- ``op``: the op it implements (``"silu_mul_quant"`` or ``"mega_moe"``),
- ``priority``: int, higher is tried first,
- ``supports(shape, config) -> Support``: cheap, pure, never reads device tensors,
- ``run(inputs, outputs, shape, config) -> None``: fills the preallocated ``outputs``.

Optional: ``contract_version`` (int, defaults to the current one), ``options`` (a mapping of option
name to default value; users override them in the config file), ``description`` (one line),
``available(platform) -> Support`` (whether it can run on this machine at all; ``list`` shows it),
``prepare(shape, config) -> launch | None`` (the launch for one shape key, worked out once: see
docs/plugin-contract.md, "prepare"), ``check_options(options) -> None`` (checks the option values
once the user's are merged in; raises :class:`OptionValueError` or ValueError, which the registry
turns into a ConfigError naming the plugin), ``writes_inputs`` (which inputs the plugin may overwrite
when the host marks them writable: a collection of input names, or ``writes_inputs(shape, config)``
returning one; undeclared means every writable input, and a failure after a possible write is never
followed by another plugin on the same call). :class:`Plugin` does not define ``prepare`` or
``writes_inputs``: a plugin without ``prepare`` is run through ``run`` on every call.

Subclassing :class:`Plugin` is convenient but not required: the registry checks the attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from ._version import CONTRACT_VERSION
from .hardware import Platform

__all__ = ["OptionValueError", "Support", "Plugin", "as_support"]


@dataclass(frozen=True)
class Support:
    """A yes/no answer with the reason, e.g. ``Support.no("D // 8 (64) < E (128)")``."""

    ok: bool
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError("Support.reason must be a non-empty string explaining the answer")

    def __bool__(self) -> bool:
        return self.ok

    @classmethod
    def yes(cls, reason: str = "supported") -> Support:
        return cls(True, reason)

    @classmethod
    def no(cls, reason: str) -> Support:
        return cls(False, reason)

    @classmethod
    def all_of(cls, *checks: Support, ok_reason: str = "supported") -> Support:
        """The first failing check, or ``yes(ok_reason)`` when all pass."""
        for check in checks:
            if not check:
                return check
        return cls.yes(ok_reason)


def as_support(answer: Any, plugin: str) -> Support:
    """``answer`` (what ``plugin``'s ``supports`` returned) as a :class:`Support`.

    A Support is returned as is; an object that is truthy or falsy and has a non-empty string ``reason``
    (a duck-typed Support) is converted. Anything else is a TypeError naming the
    plugin.
    """
    if isinstance(answer, Support):
        return answer
    reason = getattr(answer, "reason", None)
    if isinstance(reason, str) and reason:
        return Support(bool(answer), reason)
    raise TypeError(f"plugin {plugin!r}: supports() returned {answer!r}; it must return sglang_moe_plugins.Support")


class OptionValueError(ValueError):
    """An option value a plugin does not accept: ``check_options`` raises it (the registry reports it as
    a ConfigError naming the plugin, where the value came from, the option, the value and ``allowed``)."""

    def __init__(self, option: str, value: Any, allowed: str):
        self.option = option
        self.value = value
        self.allowed = allowed
        super().__init__(f"option {option}={value!r}; allowed: {allowed}")


class Plugin:
    """Convenience base class for plugins. Subclasses set ``name``, ``op``, ``priority``."""

    name: ClassVar[str] = ""
    op: ClassVar[str] = ""
    priority: ClassVar[int] = 0
    contract_version: ClassVar[int] = CONTRACT_VERSION
    description: ClassVar[str] = ""
    #: A numerics oracle (pure torch, far slower than a kernel): on CUDA it serves a call only when forced for the op
    #: or with ``reference_on_gpu = true`` (otherwise, where it would serve the call, its verdict is ``withheld``).
    #: Optional; False by default.
    oracle: ClassVar[bool] = False
    #: Option names and default values. The registry replaces ``self.options`` with the defaults
    #: merged with the user's ``[options.<name>]`` table.
    options: Mapping[str, Any] = MappingProxyType({})

    def available(self, platform: Platform) -> Support:  # pragma: no cover - trivial default
        return Support.yes("no special requirements")

    def supports(self, shape: Any, config: Any) -> Support:
        raise NotImplementedError(f"plugin {self.name!r} does not implement supports()")

    def run(self, inputs: Any, outputs: Any, shape: Any, config: Any) -> None:
        raise NotImplementedError(f"plugin {self.name!r} does not implement run()")

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Check option values (their types are checked against the defaults already): raise
        :class:`OptionValueError` for a value the plugin cannot use. Called once, when the registry
        is built, with the defaults merged with the user's ``[options.<name>]`` table."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.op}/{self.name} priority={self.priority}>"
