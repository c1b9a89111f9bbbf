"""What the checks of a case share (:mod:`.execute` runs them, :mod:`.suite` and :mod:`.expert_parallel`
report them): :class:`Checks`, the per-check counts and first failures, the helpers that describe
values, errors and cases, copy values and pick a case's fresh inputs, and the op-independent checks of
every run: :class:`InputWatch` (every input tensor compared before and after the run, against the
plugin's ``writes_inputs``), :func:`mark_writable` and :func:`wrong_device`. Public through :mod:`.execute`."""

from __future__ import annotations

import copy
import dataclasses
import traceback
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ..core.validation import read_writes_inputs
from ..lazy import lazy_module
from ..ops import get_op
from .case import SuiteCase
from .report import CHECKS, FAILED, PASSED, SKIPPED, CaseFailure, CheckResult

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "Checks",
    "InputWatch",
    "fresh_case",
    "is_deterministic",
    "is_marked",
    "inputs_problem",
    "describe",
    "error_text",
    "mark_writable",
    "short",
    "copy_value",
    "wrong_device",
]


def describe(value: Any) -> str:
    method = getattr(value, "describe", None)
    return method() if callable(method) else repr(value)


def error_text(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


def short(case: SuiteCase) -> str:
    return f"{describe(case.shape)} [{describe(case.config)}]"


def copy_value(value: Any) -> Any:
    """An equal but distinct object (dataclasses are rebuilt field by field)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value)
    return copy.deepcopy(value)


def is_deterministic(plugin: Any) -> bool:
    """False only when the plugin declares ``deterministic = False``."""
    return getattr(plugin, "deterministic", True) is not False


def fresh_case(case: SuiteCase) -> SuiteCase:
    """The same shape key with other input values (another seed: new tokens, new weights)."""
    return dataclasses.replace(case, seed=(case.seed * 7919 + 104_729) % (1 << 31))


def _input_tensors(inputs: Any) -> list[tuple[str, str, torch.Tensor]]:
    """``(field, label, tensor)`` of every input tensor, those inside tuples too (``l1_weights[0]``)."""
    found: list[tuple[str, str, torch.Tensor]] = []
    if not dataclasses.is_dataclass(inputs):
        return found
    for item in dataclasses.fields(inputs):
        value = getattr(inputs, item.name)
        if isinstance(value, torch.Tensor):
            found.append((item.name, item.name, value))
        elif isinstance(value, (tuple, list)):
            found += [(item.name, f"{item.name}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor)]
    return found


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return a.numel() == 0 or torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def mark_writable(inputs: Any, op: str) -> Any:
    """A copy of ``inputs`` with every input the op lets a host mark writable marked writable (the hooks' calls)."""
    flags = {flag: True for _, flag in get_op(op).writable_inputs}
    if flags and dataclasses.is_dataclass(inputs) and not isinstance(inputs, type):
        return dataclasses.replace(inputs, **flags)
    return inputs


def is_marked(inputs: Any, op: str) -> bool:
    """Whether the call marks an input writable (a flag of the op's writable inputs is true)."""
    return any(getattr(inputs, flag, False) is True for _, flag in get_op(op).writable_inputs)


def wrong_device(outputs: Any, device: torch.device) -> str | None:
    """None when every output tensor is on ``device`` (the run's), else the first that is not."""
    if dataclasses.is_dataclass(outputs):
        for item in dataclasses.fields(outputs):
            value = getattr(outputs, item.name)
            if isinstance(value, torch.Tensor) and value.device != torch.device(device):
                return f"{item.name}.device={value.device}, the host requires the device of the inputs ({device})"
    return None


class InputWatch:
    """Every input tensor of one run as it was before the run (``snapshot``: the adapter's deep copy, taken
    before it); :meth:`problem` after the run names an input the plugin changed though it may not: one the call
    did not mark writable, or one its ``writes_inputs`` leaves out (an undeclared ``writes_inputs`` allows every
    input the call marks writable)."""

    def __init__(self, snapshot: Any) -> None:
        self.before = _input_tensors(snapshot)

    def problem(self, plugin: Any, op: str, inputs: Any, case: SuiteCase) -> str | None:
        name = getattr(plugin, "name", "?")
        flags = dict(get_op(op).writable_inputs)
        after = {label: t for _, label, t in _input_tensors(inputs)}
        for field, label, before in self.before:
            now = after.get(label)
            if now is not None and _same_bits(before, now):
                continue
            flag = flags.get(field)
            if flag is None:
                return f"plugin {name!r} changed the input {label}, which no host lets a plugin write"
            if getattr(inputs, flag, False) is not True:
                return f"plugin {name!r} changed the input {label}, though the call did not mark it writable ({flag}=False)"
            declared, error = _declared(plugin, op, case)
            if error is not None:
                return f"plugin {name!r} changed the input {label} (marked writable), and {error}"
            if declared is not None and field not in declared:
                return (
                    f"plugin {name!r} changed the input {label} (marked writable by the call), which its "
                    f"writes_inputs ({sorted(declared)}) does not declare: a host would run the next plugin on the "
                    "damaged input after a failure of this one. Declare it (writes_inputs, docs/plugin-contract.md)"
                )
        return None


def inputs_problem(adapter: Any, plugin: Any, snapshot: Any, inputs: Any, case: SuiteCase) -> str | None:
    """What a run changed in its inputs that it may not (None: nothing): the op adapter's check (as the run's
    inputs are marked writable or not), then :class:`InputWatch`'s against ``writes_inputs``."""
    marked = dataclasses.replace(case, inputs_writable=True) if is_marked(inputs, adapter.op) else case
    return adapter.inputs_changed(snapshot, inputs, marked) or InputWatch(snapshot).problem(
        plugin, adapter.op, inputs, case
    )


def _declared(plugin: Any, op: str, case: SuiteCase) -> tuple[frozenset[str] | None, str | None]:
    """``(names, error)``: the inputs the plugin declares it may write for this case (None: undeclared, which
    allows every writable input), or why its declaration cannot be read."""
    declared = getattr(plugin, "writes_inputs", None)
    if declared is None:
        return None, None
    try:
        value = declared(case.shape, case.config) if callable(declared) else declared
        return read_writes_inputs(value, op), None
    except Exception as exc:  # noqa: BLE001 - the finding
        return (
            None,
            f"its writes_inputs cannot be read ({error_text(exc)}); a host then assumes it may write every input",
        )


class Checks:
    """Accumulates per-check counts and first failures."""

    def __init__(self) -> None:
        self.checked: dict[str, int] = defaultdict(int)
        self.failures: dict[str, list[CaseFailure]] = defaultdict(list)
        self.notes: dict[str, str] = {}
        self.unverified: dict[str, str] = {}

    def ok(self, name: str) -> None:
        self.checked[name] += 1

    def fail(self, name: str, case: SuiteCase | None, error: str) -> CaseFailure:
        self.checked[name] += 1
        failure = CaseFailure(
            name,
            case.label if case else "(plugin)",
            describe(case.shape) if case else "-",
            describe(case.config) if case else "-",
            error,
        )
        self.failures[name].append(failure)
        return failure

    def not_exercised(self, name: str, note: str) -> None:
        self.unverified[name] = note

    def results(self) -> tuple[CheckResult, ...]:
        from .report import CLAIM_NOT_EXERCISED

        out = []
        for name, title in CHECKS.items():
            failures = self.failures.get(name, [])
            checked = self.checked.get(name, 0)
            status = (
                FAILED
                if failures
                else (CLAIM_NOT_EXERCISED if name in self.unverified else (PASSED if checked else SKIPPED))
            )
            note = self.unverified.get(name, self.notes.get(name, ""))
            out.append(
                CheckResult(name, title, status, checked, len(failures), failures[0] if failures else None, note)
            )
        return tuple(out)
