"""What a shape key is bound to: :class:`BoundOp` (made by :func:`make_bound` for
:meth:`.dispatcher.Selector.bind`, run by :meth:`.dispatcher.Selector.call`); which inputs a failed plugin may
have written, and how far its ``writes_inputs`` is trusted; and the call-time facts the selector reads about a
call (its device, CUDA graph capture, a wrong result's error, a plugin's exception as one the policy handles).

**Trust in ``writes_inputs``.** A built-in plugin's declaration is trusted (this repository's tests and the
conformance kit verify it). A third party's counts only once it was seen true: on the first call of a key whose
host marked inputs writable, the marked inputs the plugin says it leaves alone are copied before the launch and
compared after it (:func:`snapshot_writes`; once per key, never on the warm path). A plugin seen changing one is
never trusted again in the process. A declaration that cannot be read (a name the op does not have, a method
that raises) promises nothing: the plugin may write every writable input.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, MoEPluginsError, OutputValidationError
from ..lazy import lazy_module
from ..log import get_logger
from .registry import PluginRecord
from .validation import read_writes_inputs

if TYPE_CHECKING:
    import torch

    from ..ops.base import OpSpec
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "BoundOp",
    "Distrusted",
    "FAILED_THEN",
    "PASS_THROUGH",
    "as_plugin_error",
    "check_given_outputs",
    "check_returned_device",
    "declared_writes",
    "distrust_reason",
    "inputs_maybe_written",
    "make_bound",
    "maybe_written",
    "snapshot_writes",
    "writes_seen",
    "written_note",
]

logger = get_logger(__name__)
#: Never handled as a plugin's fault (as at start-up, core/registry.py): they pass through unchanged.
PASS_THROUGH = (KeyboardInterrupt, GeneratorExit)


class _FirstCall:
    """Mutable flags of a frozen :class:`BoundOp`: its outputs have not been checked yet; its plugin's
    ``writes_inputs`` was seen true on a call that marked inputs writable."""

    __slots__ = ("pending", "writes_verified")

    def __init__(self) -> None:
        self.pending = True
        self.writes_verified = False


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
    #: The plugin's ``writes_inputs`` is trusted without being seen true (a built-in plugin).
    trusted_writes: bool = field(default=False, repr=False)
    #: The fields of ``output_type``: their device is checked when a launch returns its own outputs.
    output_fields: tuple[str, ...] = field(default=(), repr=False)

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def checked(self) -> bool:
        """Whether one call's outputs passed the op's checks."""
        return not self._first.pending


def make_bound(
    spec: OpSpec, record: PluginRecord, shape: Any, config: Any, check_every_call: bool, hit: Callable[[], int]
) -> BoundOp:
    """Bind ``record``'s plugin to one key of op ``spec``: its launch (``prepare(shape, config)``, else ``run``)
    and the op's output allocator, worked out once. A ``prepare`` that raises lets the exception through."""
    plugin = record.plugin
    launch = None
    prepare = getattr(plugin, "prepare", None)
    if prepare is not None:
        launch = prepare(shape, config)
        if launch is not None and not callable(launch):
            raise TypeError(
                f"plugin {record.name!r}: prepare() returned {launch!r}; it must return a callable "
                "launch(inputs, outputs) or None"
            )
    prepared = launch is not None
    if launch is None:
        run = plugin.run

        def launch(inputs: Any, outputs: Any) -> Any:
            return run(inputs, outputs, shape, config)

    if spec.output_allocator is not None:
        allocate = spec.output_allocator(shape, config)
    else:
        allocate_outputs = spec.allocate_outputs

        def allocate(device: torch.device) -> Any:
            return allocate_outputs(shape, config, device)

    output_type = spec.output_type
    fields = tuple(f.name for f in dataclasses.fields(output_type)) if dataclasses.is_dataclass(output_type) else ()
    return BoundOp(
        spec.name,
        shape,
        config,
        record,
        allocate,
        launch,
        prepared,
        spec.collective,
        check_every_call,
        spec.validate_outputs,
        output_type=output_type,
        writable_inputs=spec.writable_inputs,
        hit=hit,
        trusted_writes=record.builtin,
        output_fields=fields,
    )


# -- writes_inputs ----------------------------------------------------------------------------------------
def _marked(writable: tuple[tuple[str, str], ...], inputs: Any) -> tuple[str, ...]:
    return tuple(name for name, flag in writable if getattr(inputs, flag, False) is True)


def declared_writes(
    plugin: Any, writable: tuple[tuple[str, str], ...], shape: Any, config: Any, op: str = "?"
) -> frozenset[str] | None:
    """The inputs ``plugin`` declares it may write (``writes_inputs``: a collection of input names, or
    ``writes_inputs(shape, config)`` returning one). None: undeclared, or a declaration that cannot be read (a
    name that is not one of the ``writable`` inputs, a method that raises), which promises nothing."""
    declared = getattr(plugin, "writes_inputs", None)
    if declared is None:
        return None
    try:
        if callable(declared):
            declared = declared(shape, config)
        return read_writes_inputs(declared, op, tuple(name for name, _ in writable))
    except PASS_THROUGH:
        raise
    except BaseException:  # noqa: BLE001 - a broken declaration counts as 'may write anything'
        return None


def inputs_maybe_written(
    plugin: Any, writable: tuple[tuple[str, str], ...], inputs: Any, shape: Any, config: Any
) -> tuple[str, ...]:
    """The inputs of this call that ``plugin`` may have written by its own declaration: those the host marked
    writable (the flag of a ``writable`` pair is true) less those it declares it leaves alone. Undeclared, or
    a declaration that cannot be read: every marked input (the conservative answer)."""
    marked = _marked(writable, inputs)
    if not marked:
        return ()
    names = declared_writes(plugin, writable, shape, config)
    return marked if names is None else tuple(name for name in marked if name in names)


def snapshot_writes(bound: BoundOp, inputs: Any) -> dict[str, torch.Tensor] | None:
    """Copies of the inputs the host marked writable that ``bound``'s plugin says it leaves alone, taken before
    the launch of the key's first call when its declaration is not trusted yet (a third party). None when
    there is nothing to verify: a built-in, nothing marked, or a declaration that promises nothing."""
    if bound.trusted_writes or not bound.writable_inputs:
        return None
    marked = _marked(bound.writable_inputs, inputs)
    if not marked:
        return None
    declared = declared_writes(bound.record.plugin, bound.writable_inputs, bound.shape, bound.config, bound.op)
    if declared is None:
        return None
    copies = {}
    for name in marked:
        value = getattr(inputs, name)
        if name not in declared and isinstance(value, torch.Tensor):
            copies[name] = value.clone()
    return copies or None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.numel() == 0 or torch.equal(
        a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    )


def writes_seen(snapshot: dict[str, torch.Tensor], inputs: Any) -> tuple[str, ...]:
    """The inputs of ``snapshot`` whose bytes changed (NaN compares equal to itself)."""
    return tuple(name for name, before in snapshot.items() if not _same_bits(before, getattr(inputs, name)))


def maybe_written(
    bound: BoundOp, inputs: Any, seen: tuple[str, ...] | None, distrusted: str | None
) -> tuple[tuple[str, ...], str]:
    """``(inputs, why)``: the inputs of this failed call that the plugin may have written, and why its
    declaration was not enough (empty when it was read and trusted). ``seen``: the inputs that changed on this
    call (:func:`writes_seen` of the copies :func:`snapshot_writes` took before its launch; None: no copies);
    ``distrusted``: why the plugin is no longer trusted (None: it is not distrusted)."""
    marked = _marked(bound.writable_inputs, inputs)
    if not marked:
        return (), ""
    declared = declared_writes(bound.record.plugin, bound.writable_inputs, bound.shape, bound.config, bound.op)
    if declared is None:
        return marked, ""
    if seen is not None:
        names = tuple(name for name in marked if name in declared or name in seen)
        why = f"it changed {', '.join(seen)} on this call, which its writes_inputs leaves out" if seen else ""
        return names, why
    if bound.trusted_writes or (distrusted is None and bound._first.writes_verified):
        return tuple(name for name in marked if name in declared), ""
    if distrusted is not None:
        return marked, f"its writes_inputs is no longer trusted: {distrusted}"
    return marked, (
        f"plugin {bound.name!r} is not a built-in, and its writes_inputs was not verified: no call of this key "
        f"that marked {', '.join(marked)} writable has shown it true yet (the first such call of a key compares "
        "the inputs before and after the plugin runs)"
    )


def distrust_reason(bound: BoundOp, seen: tuple[str, ...], line: bool = False) -> str:
    """Why ``bound``'s plugin is no longer trusted: it changed ``seen``, which its writes_inputs leaves out
    (``line``: the ERROR line that says so, once)."""
    names = ", ".join(seen)
    if not line:
        return f"it changed {names} on a call of {bound.op} although its writes_inputs leaves {names} out"
    return (
        f"plugin {bound.name!r} changed the input {names} on a call of {bound.op} (marked writable by the host), "
        "which its writes_inputs declares it leaves alone; its declaration is no longer trusted: a failure of this "
        f"plugin on a call that marks {names} writable raises instead of falling back. Fix its writes_inputs "
        "(docs/plugin-contract.md)"
    )


def written_note(plugin: str, stage: str, op: str, written: tuple[str, ...], why: str) -> str:
    """The note on the exception of a call that raises because ``plugin`` may have written ``written``."""
    inputs = ", ".join(written)
    return (
        f"sglang-moe-plugins: raised by plugin {plugin!r} ({stage}) on op {op!r}; no fallback: it may have modified "
        f"the input {inputs} (marked writable by the host), which the next plugin would read"
        + (f" ({why})" if why else "")
        + f". The plugin is excluded for this key from the next call on (a plugin that never writes {inputs} "
        "declares it: writes_inputs, docs/plugin-contract.md)"
    )


#: What the failed call itself does, by whether it falls back (the ERROR line of a plugin's failure).
FAILED_THEN = {
    True: "falling back to the next plugin",
    False: "this call raises (no fallback: the plugin may have modified an input the host marked writable); "
    "the key's later calls run the next plugin",
}


class Distrusted:
    """The plugins (of one selector) seen changing an input their writes_inputs leaves out, and why: their
    declarations count no more (:func:`maybe_written`). Safe to share between threads."""

    def __init__(self) -> None:
        self._why: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, plugin: str) -> str | None:
        return self._why.get(plugin)

    def seen(
        self, bound: BoundOp, snapshot: dict[str, torch.Tensor] | None, inputs: Any, log: bool = True
    ) -> tuple[str, ...] | None:
        """The inputs of ``snapshot`` this call changed (None: no snapshot); a change distrusts the plugin
        (``log``: one ERROR line says so; a failed call's own line and note say it instead)."""
        if snapshot is None:
            return None
        seen = writes_seen(snapshot, inputs)
        if seen:
            with self._lock:
                first = bound.name not in self._why
                self._why.setdefault(bound.name, distrust_reason(bound, seen))
            if first and log:
                logger.error("sglang-moe-plugins: %s", distrust_reason(bound, seen, line=True))
        return seen


# -- a call's facts ------------------------------------------------------------------------------------------
def as_plugin_error(exc: BaseException, plugin: str, op: str, stage: str) -> Exception:
    """``exc`` as an Exception the failure policy handles: itself, or for ``SystemExit`` (and any other
    BaseException but :data:`PASS_THROUGH`) a MoEPluginsError naming the plugin, caused by it."""
    if isinstance(exc, Exception):
        return exc
    error = MoEPluginsError(
        f"plugin {plugin!r} raised {exc!r} ({stage}) on op {op!r}: a plugin must raise an Exception, never end "
        "the process; handled as a failure of the plugin"
    )
    error.__cause__ = exc
    return error


def check_given_outputs(spec: OpSpec, outputs: Any, shape: Any, config: Any, inputs: Any) -> None:
    """Outputs a caller passes (``dispatch(..., outputs=)``) are checked before any plugin runs: a wrong buffer
    is the caller's error (InvalidArgumentError), never counted as a plugin's failure."""
    try:
        spec.validate_outputs(outputs, shape, config, inputs=inputs)
    except OutputValidationError as exc:
        raise InvalidArgumentError(
            spec.name, "outputs", type(outputs).__name__, f"buffers as the op's allocate_outputs() makes them ({exc})"
        ) from None


def check_returned_device(bound: BoundOp, returned: Any, inputs: Any) -> None:
    """Raise OutputValidationError when a tensor of the outputs a launch returned (instead of filling the given
    ones) is on another device than the call's inputs. Called on every such call: a few attribute reads."""
    device = _inputs_device(inputs)
    for name in bound.output_fields:
        tensor = getattr(returned, name, None)
        if isinstance(tensor, torch.Tensor) and tensor.device != device:
            raise OutputValidationError(
                f"plugin {bound.name!r} returned {name}.device={tensor.device}, the host requires the device of the "
                f"call's inputs ({device})"
            )


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
