"""Running one accepted case: the first call's checks, then the repeated calls of the same shape key.

Per case, in this order (each into outputs poisoned first):

1. ``run()`` on inputs A: ``run_no_crash``, ``output_layout`` (the op's checks, and every output on the
   inputs' device), ``inputs_unchanged``, ``rows_written``, ``numerics``. A real row left unwritten is re-run with finite padding rows in the input (ops with
   padding rows: ``silu_mul_quant``); when every real row is then written, the NaN of the padding
   reached the real rows and the case fails ``padding_ignored`` ("reads rows past masked_m"), not
   ``rows_written``.

When the first call passed:

2. ``run()`` on an identical copy of A, with every input the op lets a host mark writable marked writable (as
   SGLang's hooks call): ``deterministic`` (real rows bit-identical; within the op's tolerance when the plugin
   declares ``deterministic = False``).
3. ``run()`` on A with other (finite, large) padding rows: ``padding_ignored`` (real rows unchanged).
4. ``run()`` on fresh inputs B of the same shape key (new values, the same masked_m; ``mega_moe``: another layer's weights and tokens):
   ``second_call`` (B's own results: "stale output on the second call of a key").
5. With ``prepare()``: the launch (prepared twice, the second one used) on a copy of A must give run()'s
   outputs (``prepare``), then the same launch on fresh inputs B must give B's results (``second_call``).

Every run's input tensors are copied before it and compared after it (:class:`.checks.InputWatch`):
``inputs_unchanged`` fails, naming the input, when a run changed one that its call did not mark writable,
or one that the plugin's ``writes_inputs`` leaves out (run 2 shows whether the plugin keeps its promise when
it may write: a host falls back to the next plugin on such an input after a failure).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..errors import MoEPluginsError
from .case import OpConformance, SuiteCase
from .checks import (
    Checks,
    copy_value,
    describe,
    error_text,
    fresh_case,
    inputs_problem,
    is_deterministic,
    mark_writable,
    short,
    wrong_device,
)
from .report import CaseFailure

__all__ = ["Checks", "execute_case", "fresh_case", "is_deterministic", "describe", "error_text", "short", "copy_value"]

STALE = "stale output on the second call of a key"
PAST_MASKED_M = "reads rows past masked_m"


def _tensors(outputs: Any) -> list[tuple[str, torch.Tensor]]:
    if dataclasses.is_dataclass(outputs):
        return [
            (f.name, getattr(outputs, f.name))
            for f in dataclasses.fields(outputs)
            if isinstance(getattr(outputs, f.name), torch.Tensor)
        ]
    return []


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` in row-major order, whatever its strides (NaN compares equal to itself)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t).reshape(-1).view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and (a.numel() == 0 or torch.equal(_bits(a), _bits(b)))


def _real_differs(adapter: OpConformance, inputs: Any, a: Any, b: Any, case: SuiteCase) -> str | None:
    """None when the real rows of ``a`` and ``b`` are bit-identical; else the first tensor that differs."""
    real = getattr(adapter, "real_outputs", None)
    pairs_a = real(inputs, a, case) if callable(real) else _tensors(a)
    pairs_b = dict(real(inputs, b, case) if callable(real) else _tensors(b))
    for name, got in pairs_a:
        if not _same(got, pairs_b[name]):
            return name
    return None


class _Call:
    """One call of the plugin (``run`` or a launch) into freshly poisoned outputs."""

    def __init__(self, plugin: Any, adapter: OpConformance, case: SuiteCase, device: torch.device):
        self.plugin, self.adapter, self.case, self.device = plugin, adapter, case, device
        #: The first input a call changed though it may not (checks.inputs_problem), for ``inputs_unchanged``.
        self.undeclared: str | None = None

    def __call__(self, inputs: Any, launch: Any = None, case: SuiteCase | None = None) -> Any:
        case = case or self.case
        outputs = self.adapter.allocate_outputs(case, inputs, self.device)
        self.adapter.poison(outputs)
        snapshot = self.adapter.snapshot(inputs)
        returned = (
            launch(inputs, outputs) if launch is not None else self.plugin.run(inputs, outputs, case.shape, case.config)
        )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.undeclared is None:
            self.undeclared = inputs_problem(self.adapter, self.plugin, snapshot, inputs, case)
        return outputs if returned is None else returned


def _cut(detail: str) -> str:
    return detail.split(" still holds", 1)[0]


def execute_case(
    plugin: Any, adapter: OpConformance, case: SuiteCase, device: torch.device, checks: Checks
) -> list[CaseFailure]:
    """Run one accepted case and every check above; returns the failures."""
    call = _Call(plugin, adapter, case, device)
    failures = _execute(plugin, adapter, case, device, checks, call)
    if call.undeclared is not None and not any(f.check == "inputs_unchanged" for f in failures):
        failures.append(checks.fail("inputs_unchanged", case, call.undeclared))
    return failures


def _execute(
    plugin: Any, adapter: OpConformance, case: SuiteCase, device: torch.device, checks: Checks, call: _Call
) -> list[CaseFailure]:
    failures: list[CaseFailure] = []
    inputs = adapter.make_inputs(case, device)
    snapshot = adapter.snapshot(inputs)
    outputs = adapter.allocate_outputs(case, inputs, device)
    adapter.poison(outputs)
    try:
        returned = plugin.run(inputs, outputs, case.shape, case.config)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001 - the finding
        failures.append(
            checks.fail(
                "run_no_crash",
                case,
                f"supports() accepted the case ({short(case)}), then run() raised {error_text(exc)}",
            )
        )
        return failures
    checks.ok("run_no_crash")
    result = outputs if returned is None else returned
    try:
        adapter.validate_outputs(result, case, getattr(plugin, "name", "?"))
        elsewhere = wrong_device(result, device)
    except Exception as exc:  # noqa: BLE001
        failures.append(
            checks.fail("output_layout", case, str(exc) if isinstance(exc, MoEPluginsError) else error_text(exc))
        )
        return failures
    if elsewhere:
        failures.append(
            checks.fail("output_layout", case, f"plugin {getattr(plugin, 'name', '?')!r} returned {elsewhere}")
        )
        return failures
    checks.ok("output_layout")
    changed = inputs_problem(adapter, plugin, snapshot, inputs, case)
    if changed:
        failures.append(checks.fail("inputs_unchanged", case, changed))
    else:
        checks.ok("inputs_unchanged")
    unwritten = adapter.find_unwritten(snapshot, result, case)
    if unwritten:
        cause = _padding_cause(call, adapter, case, snapshot)
        if cause:
            failures.append(
                checks.fail(
                    "padding_ignored",
                    case,
                    f"{PAST_MASKED_M}: {_cut(unwritten)} holds NaN when the padding rows "
                    f"of the input hold NaN, and is written when they hold finite values ({cause})",
                )
            )
            return failures
        if result is not outputs:
            unwritten += " (run() returned a new outputs object; only the preallocated outputs are poisoned)"
        failures.append(checks.fail("rows_written", case, unwritten))
        return failures
    checks.ok("rows_written")
    mismatch = adapter.compare(snapshot, result, case)
    if mismatch:
        failures.append(checks.fail("numerics", case, mismatch))
        return failures
    checks.ok("numerics")
    if failures:
        return failures
    return _repeats(plugin, adapter, case, device, checks, call, snapshot, result)


def _padding_cause(call: _Call, adapter: OpConformance, case: SuiteCase, snapshot: Any) -> str | None:
    """Re-run with finite padding rows: a description when every real row is then written."""
    repad = getattr(adapter, "repad", None)
    if not callable(repad):
        return None
    padded = repad(adapter.snapshot(snapshot), case)
    if padded is None:
        return None
    try:
        again = call(padded)
    except Exception:  # noqa: BLE001 - no attribution; the unwritten row is reported
        return None
    if adapter.find_unwritten(padded, again, case) is None:
        return "rerun with finite padding rows: every real row written"
    return None


def _repeats(
    plugin: Any,
    adapter: OpConformance,
    case: SuiteCase,
    device: torch.device,
    checks: Checks,
    call: _Call,
    snapshot: Any,
    first: Any,
) -> list[CaseFailure]:
    failures: list[CaseFailure] = []
    exact = is_deterministic(plugin)

    def fail(name: str, error: str) -> None:
        failures.append(checks.fail(name, case, error))

    # 2. identical inputs, marked writable where the op lets a host mark them
    varies = not exact
    try:
        again = call(mark_writable(adapter.make_inputs(case, device), adapter.op))
    except Exception as exc:  # noqa: BLE001
        fail("deterministic", f"the second run() on identical inputs raised {error_text(exc)}; the first did not")
        return failures
    if exact:
        differs = _real_differs(adapter, snapshot, first, again, case)
        if differs:
            varies = True
            fail(
                "deterministic",
                f"two run() calls on identical inputs wrote different {differs} in real rows (compared bit for bit); "
                "a plugin whose results vary between calls must declare deterministic = False "
                "(the kit then compares each call within the tolerance)",
            )
        else:
            checks.ok("deterministic")
    else:
        mismatch = adapter.find_unwritten(snapshot, again, case) or adapter.compare(snapshot, again, case)
        if mismatch:
            fail(
                "deterministic",
                f"deterministic = False: the second run() on identical inputs is out of the tolerance: {mismatch}",
            )
        else:
            checks.ok("deterministic")

    # 3. other padding rows
    repad = getattr(adapter, "repad", None)
    padded = repad(adapter.snapshot(snapshot), case) if callable(repad) else None
    if padded is not None:
        try:
            got = call(padded)
            unwritten = adapter.find_unwritten(padded, got, case)
            if unwritten:
                problem: str | None = f"{_cut(unwritten)} is not written when only the padding rows changed"
            elif not varies:
                differs = _real_differs(adapter, padded, first, got, case)
                problem = (
                    f"real rows of {differs} changed when only the padding rows of the input changed"
                    if differs
                    else None
                )
            else:
                mismatch = adapter.compare(padded, got, case)
                problem = (
                    f"with other padding rows the real rows are out of the tolerance: {mismatch}" if mismatch else None
                )
        except Exception as exc:  # noqa: BLE001
            problem = f"run() raised {error_text(exc)} when only the padding rows of the input changed"
        if problem:
            fail(
                "padding_ignored",
                f"{PAST_MASKED_M}: {problem} (padding rows: NaN on the first call, finite values now)",
            )
        else:
            checks.ok("padding_ignored")

    # 4. fresh inputs, same key, through run()
    fresh = fresh_case(case)
    check, problem = _fresh_call(call, adapter, fresh, device, None)
    if problem:
        fail(check, f"{STALE} through run(): {problem}" if check == "second_call" else problem)
    else:
        checks.ok("second_call")

    # 5. prepare()'s launch
    if callable(getattr(plugin, "prepare", None)):
        # a run() that already varied: its launch is compared within the tolerance (the cause is reported once)
        failures += _check_prepare(plugin, adapter, case, device, checks, call, first, exact and not varies, fresh)
    return failures


def _fresh_call(
    call: _Call, adapter: OpConformance, fresh: SuiteCase, device: torch.device, launch: Any
) -> tuple[str, str | None]:
    """``(check, problem)`` of a call on fresh inputs of the same key (problem None: its own results)."""
    make_fresh = getattr(adapter, "make_fresh_inputs", None)
    inputs = make_fresh(call.case, fresh, device) if callable(make_fresh) else adapter.make_inputs(fresh, device)
    snapshot = adapter.snapshot(inputs)
    try:
        got = call(inputs, launch, fresh)
    except Exception as exc:  # noqa: BLE001
        return "second_call", f"the call on fresh inputs raised {error_text(exc)}"
    unwritten = adapter.find_unwritten(snapshot, got, fresh)
    if unwritten:
        if _padding_cause(call, adapter, fresh, snapshot):
            return "padding_ignored", (
                f"{PAST_MASKED_M}: on fresh inputs {_cut(unwritten)} holds NaN when the padding rows of the "
                "input hold NaN, and is written when they hold finite values"
            )
        return "second_call", unwritten
    mismatch = adapter.compare(snapshot, got, fresh)
    return "second_call", (
        f"the outputs are not the results of the fresh inputs (new values, same shape key: {short(fresh)}): {mismatch}"
        if mismatch
        else None
    )


def _check_prepare(
    plugin: Any,
    adapter: OpConformance,
    case: SuiteCase,
    device: torch.device,
    checks: Checks,
    call: _Call,
    run_result: Any,
    exact: bool,
    fresh: SuiteCase,
) -> list[CaseFailure]:
    """``prepare(shape, config)`` twice for the key (allowed), then the second launch on the same inputs as
    run(), into outputs poisoned the same way: every output tensor must equal run()'s bit for bit (within
    the tolerance for a nondeterministic plugin); then the same launch on fresh inputs."""
    try:
        first = plugin.prepare(case.shape, case.config)
        launch = plugin.prepare(case.shape, case.config)
    except Exception as exc:  # noqa: BLE001 - the finding
        return [checks.fail("prepare", case, f"prepare() raised {error_text(exc)} for a case supports() accepted")]
    if first is None and launch is None:
        checks.ok("prepare")  # None: the plugin's run() is used for this key
        return []
    if not callable(launch) or (first is not None and not callable(first)):
        return [
            checks.fail(
                "prepare", case, f"prepare() returned {launch!r}; it must return launch(inputs, outputs) or None"
            )
        ]
    inputs = adapter.make_inputs(case, device)
    snapshot = adapter.snapshot(inputs)
    try:
        result = call(inputs, launch)
    except Exception as exc:  # noqa: BLE001
        return [checks.fail("prepare", case, f"the launch from prepare() raised {error_text(exc)}; run() did not")]
    if exact:
        want = dict(_tensors(run_result))
        for name, got in _tensors(result):
            ref = want.get(name)
            if ref is None or not _same(got, ref):
                return [
                    checks.fail(
                        "prepare",
                        case,
                        f"the launch from prepare() wrote a different {name} than run() on the same "
                        "inputs (compared bit for bit, outputs poisoned alike)",
                    )
                ]
    else:
        mismatch = adapter.find_unwritten(snapshot, result, case) or adapter.compare(snapshot, result, case)
        if mismatch:
            return [
                checks.fail(
                    "prepare", case, f"the launch from prepare() is out of the tolerance where run() is not: {mismatch}"
                )
            ]
    checks.ok("prepare")
    check, problem = _fresh_call(call, adapter, fresh, device, launch)
    if problem:
        return [
            checks.fail(
                check, case, f"{STALE} through prepare()'s launch: {problem}" if check == "second_call" else problem
            )
        ]
    checks.ok("second_call")
    return []
