"""What a shape key is bound to: :class:`BoundOp` (made by :meth:`.dispatcher.Selector.bind`, run by
:meth:`.dispatcher.Selector.call`), which inputs a failed plugin may have written, and the call-time
facts the selector reads about a call (its device, CUDA graph capture, a wrong result's error)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import OutputValidationError
from ..lazy import lazy_module
from .registry import PluginRecord

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = ["BoundOp", "inputs_maybe_written"]


class _FirstCall:
    """Mutable flag of a frozen :class:`BoundOp`: its outputs have not been checked yet."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending = True


@dataclass(frozen=True, eq=False)
class BoundOp:
    """One shape key bound to its plugin: what a call needs, worked out once (see :meth:`Selector.bind`).

    ``allocate(device) -> outputs`` makes empty outputs (sizes, strides and dtypes precomputed);
    ``launch(inputs, outputs)`` runs the plugin (the closure its ``prepare`` returned, or its ``run``).
    Run it with :meth:`Selector.call`, which applies the failure policy.
    """

    op: str
    shape: Any
    config: Any
    record: PluginRecord
    allocate: Callable[[torch.device], Any]
    launch: Callable[[Any, Any], Any]
    #: Whether ``launch`` came from the plugin's ``prepare``.
    prepared: bool
    #: The op is collective: no per-rank fallback (OpSpec.collective).
    collective: bool
    #: Check the outputs of every call (strict or debug), not only the first one.
    check_every_call: bool
    validate: Callable[..., None] = field(repr=False)
    _first: _FirstCall = field(default_factory=_FirstCall, repr=False)
    #: The op's outputs type (OpSpec.output_type): what a launch may return besides None.
    output_type: type | None = field(default=None, repr=False)
    #: The op's ``(input, flag)`` pairs of inputs a host may mark writable (OpSpec.writable_inputs).
    writable_inputs: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: Counts a call of this bound op in :func:`sglang_moe_plugins.stats` (set by ``Selector.bind``).
    hit: Callable[[], int] = field(default=int, repr=False)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def checked(self) -> bool:
        """Whether one call's outputs passed the op's checks."""
        return not self._first.pending


def inputs_maybe_written(
    plugin: Any, writable: tuple[tuple[str, str], ...], inputs: Any, shape: Any, config: Any
) -> tuple[str, ...]:
    """The inputs of this call that ``plugin`` may have written: those the host marked writable (the
    flag of a ``writable`` pair is true) and the plugin does not declare it leaves alone.

    ``plugin.writes_inputs``: a collection of input names, or ``writes_inputs(shape, config)``
    returning one. Undeclared, or a declaration that cannot be read: every writable input (the
    conservative answer). Called on the failure path only.
    """
    marked = tuple(name for name, flag in writable if getattr(inputs, flag, False) is True)
    if not marked:
        return ()
    declared = getattr(plugin, "writes_inputs", None)
    if declared is None:
        return marked
    try:
        if callable(declared):
            declared = declared(shape, config)
        names = {declared} if isinstance(declared, str) else set(declared)
    except Exception:  # noqa: BLE001 - a broken declaration counts as 'may write anything'
        return marked
    return tuple(name for name in marked if name in names)


def _wrong_result(bound: BoundOp, returned: Any) -> OutputValidationError:
    want = bound.output_type.__name__ if bound.output_type is not None else "None"
    return OutputValidationError(
        f"plugin {bound.name!r} returned {type(returned).__name__} from {'its launch' if bound.prepared else 'run()'} "
        f"on op {bound.op!r}; it must return None (outputs filled in place) or {want}"
    )


def _inputs_device(inputs: Any) -> torch.device:
    device = getattr(inputs, "device", None)
    if isinstance(device, torch.device):
        return device
    for item in dataclasses.fields(inputs):
        value = getattr(inputs, item.name)
        if isinstance(value, torch.Tensor):
            return value.device
    raise TypeError(f"cannot tell the device of {type(inputs).__name__}: it holds no tensor")


def _capturing(inputs: Any) -> bool:
    """Whether the call's CUDA stream is being captured into a graph (False off CUDA)."""
    try:
        device = _inputs_device(inputs)
    except TypeError:
        return False
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
