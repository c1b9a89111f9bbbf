"""How the conformance suite asks ``supports()``: timed, under a watch for tensor-value reads, and stopped
at the first call over the per-call limit (so a costly ``supports()`` fails in seconds, with progress);
and how its answers are checked (:func:`_check_supports`: a Support with a reason, deterministic, no sync).

Shapes and configs hold plain Python values only (ints, floats, strings, :class:`Platform`), never
tensors, so ``supports()`` cannot read call data; a tensor read seen here comes from a tensor the plugin
holds or makes, and is a host sync that may answer differently per rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from torch.overrides import TorchFunctionMode

from ..contract import Support
from .case import SuiteCase
from .checks import Checks as _Checks, copy_value as _copy, error_text as _error_text
from .report import CaseFailure

__all__ = ["HostReadWatch", "ask", "ask_all"]

#: Tensor methods that read a tensor's values on the host (a device sync on CUDA).
_HOST_READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy", "cpu", "__array__"}
)


class HostReadWatch(TorchFunctionMode):
    """Records tensor-value reads made while supports() runs. Shapes and configs hold plain values only,
    so such a read comes from a tensor the plugin holds or makes itself."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            self.reads.append(f".{name}()" if not name.startswith("__") else f"{name.strip('_')}(tensor)")
        return func(*args, **(kwargs or {}))


def ask(plugin: Any, shape: Any, config: Any) -> tuple[Any, float, list[str]]:
    watch = HostReadWatch()
    start = time.perf_counter()
    with watch:
        answer = plugin.supports(shape, config)
    return answer, (time.perf_counter() - start) * 1e6, watch.reads


def ask_all(
    drawn: list[Any],
    answers: dict[int, Any],
    check: Callable[[Any, float], Any],
    timings: list[float],
    limit_us: float,
    budget_us: float,
    progress: Callable[[int, int, str], None] | None,
    short: Callable[[Any], str],
) -> str:
    """Ask supports() about every case (progress as ``supports() <label>``). Stops at the first call over
    the per-call limit, or once the median of 30+ calls is over 10x the budget; returns why ('' if not)."""
    limit = limit_us
    for index, case in enumerate(drawn):
        if progress is not None:
            progress(index, len(drawn), f"supports() {case.label}")
        answers[id(case)] = check(case, limit)
        slow = [t for t in timings[1:] if t > limit]
        left = len(drawn) - index - 1
        if slow:
            return (
                f"supports() took {max(slow) / 1e6:.3f} s on one call ({short(case)}), over the {limit / 1e3:.0f} ms per-call limit "
                f"(the first call of the run is exempt); {left} remaining case(s) not asked"
            )
        if len(timings) >= 30 and statistics.median(timings) > 10 * budget_us:
            return (
                f"supports() takes {statistics.median(timings):.0f} us per call (median of {len(timings)}), over 10x the "
                f"{budget_us:.0f} us budget; {left} remaining case(s) not asked"
            )
    return ""


def _check_supports(
    plugin: Any, case: SuiteCase, checks: _Checks, timings: list[float], limit_us: float = float("inf")
) -> tuple[bool | None, str, list[CaseFailure]]:
    """Ask supports() three times (twice as drawn, once on copies) under a watch for tensor reads;
    returns (supported, reason, failures). Stops early after a call over ``limit_us``."""
    failures: list[CaseFailure] = []
    answers = []
    reads: list[str] = []
    for shape, config in (
        (case.shape, case.config),
        (case.shape, case.config),
        (_copy(case.shape), _copy(case.config)),
    ):
        try:
            answer, micros, read = ask(plugin, shape, config)
        except Exception as exc:  # noqa: BLE001 - the finding
            failures.append(
                checks.fail(
                    "supports_answer", case, f"supports() raised {_error_text(exc)}; it must return Support.no(reason)"
                )
            )
            return None, f"supports() raised {type(exc).__name__}: {exc}", failures
        timings.append(micros)
        answers.append(answer)
        reads += read
        if micros > limit_us and len(timings) > 1:
            break  # over the per-call limit: the caller stops asking
    if reads:
        failures.append(
            checks.fail(
                "supports_no_sync",
                case,
                f"supports() read tensor values ({', '.join(dict.fromkeys(reads))}): "
                "a host sync, and an answer that may differ between ranks; decide from the shape and config only",
            )
        )
    else:
        checks.ok("supports_no_sync")
    if len(answers) < 3:
        return None, "not decided: supports() went over the per-call time limit", failures
    first = answers[0]
    reason = getattr(first, "reason", None)
    if not isinstance(first, Support) and not isinstance(reason, str):
        failures.append(
            checks.fail(
                "supports_answer", case, f"supports() returned {first!r}; it must return sglang_moe_plugins.Support"
            )
        )
        return None, "no Support returned", failures
    if not isinstance(reason, str) or not reason.strip():
        failures.append(
            checks.fail("supports_answer", case, f"supports() returned {first!r} without a human-readable reason")
        )
        return bool(first), "(no reason)", failures
    checks.ok("supports_answer")
    keys = [(bool(a), getattr(a, "reason", None)) for a in answers]
    if keys[0] != keys[1]:
        failures.append(
            checks.fail("supports_deterministic", case, f"asked twice, supports() answered {keys[0]} then {keys[1]}")
        )
    elif keys[0] != keys[2]:
        failures.append(
            checks.fail(
                "supports_deterministic",
                case,
                f"supports() answered {keys[0]}, but {keys[2]} for an equal copy of the shape and config",
            )
        )
    else:
        checks.ok("supports_deterministic")
    return bool(first), reason, failures
