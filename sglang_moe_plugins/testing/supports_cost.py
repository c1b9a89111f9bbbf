"""How the conformance suite asks ``supports()``: timed, under a watch for tensor-value reads, and how its
answers are checked (:func:`_check_supports`: a Support with a reason, deterministic, no sync).

Timing limits that hold on a busy machine: a call's cost is its wall time less the time it waited for a
core (:func:`ask`); a case's cost is the median of its three calls, so one slow call (a GC pause, a
preemption) decides nothing; the limits are scaled by a calibration loop run on the same machine
(:func:`calibrate`: a slower machine gets proportionally more time), measured again before any verdict
of "too costly". The questions stop early only when the median over several cases is over the per-call
limit (a costly ``supports()`` still fails in seconds, with progress).

Shapes and configs hold plain Python values only (ints, floats, strings, :class:`Platform`), never
tensors, so ``supports()`` cannot read call data; a tensor read seen here comes from a tensor the plugin
holds or makes, and is a host sync that may answer differently per rank.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.overrides import TorchFunctionMode

from ..contract import Support
from .case import SuiteCase
from .checks import Checks as _Checks, copy_value as _copy, error_text as _error_text
from .report import CaseFailure

__all__ = ["HostReadWatch", "MachineSpeed", "CostLog", "calibrate", "ask", "ask_all", "judge_cost"]

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


#: Thread CPU time (us) of :func:`calibrate`'s loop on an idle reference machine; a machine slower than
#: that has its supports() limits raised in proportion (a faster one keeps them).
CALIBRATION_REFERENCE_US = 16_000.0
#: Cases asked before a consistently costly supports() stops the questions.
MIN_CASES_BEFORE_STOP = 5
#: Calls made on the costliest case before it fails the per-case limit (its median decides).
CONFIRM_CALLS = 5


@dataclass(frozen=True)
class MachineSpeed:
    """What :func:`calibrate` measured: ``slowness`` (>= 1), the loop's CPU time over the reference's
    (a slower core, or one shared with a hyperthread sibling); ``contention`` (>= 1), the loop's wall
    time over its CPU time (other processes taking turns on the cores)."""

    slowness: float = 1.0
    contention: float = 1.0

    def worse(self, other: MachineSpeed) -> MachineSpeed:
        return MachineSpeed(max(self.slowness, other.slowness), max(self.contention, other.contention))

    def describe(self) -> str:
        return f"calibration: this machine {self.slowness:.1f}x the reference, {self.contention:.1f}x CPU contention"


def _loop(n: int) -> int:
    acc, table = 0, {}
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFF
        if i & 63 == 0:
            table[acc] = i
    return acc + len(table)


def calibrate(rounds: int = 3) -> MachineSpeed:
    """Run a fixed pure-Python loop ``rounds`` times on this thread and compare it with the reference
    machine: the median CPU time gives ``slowness``, wall over CPU time in all gives ``contention``."""
    cpu, wall = [], []
    for _ in range(rounds):
        start_wall, start_cpu = time.perf_counter(), time.thread_time()
        _loop(100_000)
        cpu.append((time.thread_time() - start_cpu) * 1e6)
        wall.append((time.perf_counter() - start_wall) * 1e6)
    slowness = max(1.0, statistics.median(cpu) / CALIBRATION_REFERENCE_US)
    contention = max(1.0, sum(wall) / max(sum(cpu), 1.0))
    return MachineSpeed(slowness, contention)


def ask(plugin: Any, shape: Any, config: Any, speed: MachineSpeed = MachineSpeed()) -> tuple[Any, float, list[str]]:
    """Ask ``plugin.supports(shape, config)`` once under a :class:`HostReadWatch`; returns (answer, cost
    in microseconds, reads). The cost is the call's wall time less the time it waited for a core: its
    CPU time, plus the time it spent off the CPU (sleeping, waiting on I/O or another thread) beyond
    what ``speed.contention`` makes a call of that CPU time wait on this machine now."""
    watch = HostReadWatch()
    start_cpu, start = time.thread_time(), time.perf_counter()
    with watch:
        answer = plugin.supports(shape, config)
    wall, cpu = (time.perf_counter() - start) * 1e6, (time.thread_time() - start_cpu) * 1e6
    waited = max(0.0, wall - cpu)
    return answer, min(wall, cpu + max(0.0, waited - cpu * (speed.contention - 1.0))), watch.reads


@dataclass
class CostLog:
    """Every call's cost (``timings``, in order) and each asked case's median (``per_case``: label,
    shape text, median), the machine's calibration (the worst seen), the scaled limits."""

    limit_us: float
    budget_us: float
    speed: MachineSpeed = field(default_factory=MachineSpeed)
    timings: list[float] = field(default_factory=list)
    per_case: list[tuple[Any, str, float]] = field(default_factory=list)

    @property
    def limit(self) -> float:
        return self.limit_us * self.speed.slowness

    @property
    def budget(self) -> float:
        return self.budget_us * self.speed.slowness

    def recalibrate(self) -> None:
        self.speed = self.speed.worse(calibrate())

    def scale_note(self, scaled: float, unit: float, suffix: str) -> str:
        if self.speed.slowness <= 1.0:
            return ""
        return f" (scaled to {scaled / unit:.0f} {suffix} for this machine's speed, {self.speed.slowness:.2f}x the reference)"


def ask_all(
    drawn: list[Any],
    answers: dict[int, Any],
    check: Callable[[Any], Any],
    log: CostLog,
    progress: Callable[[int, int, str], None] | None,
    short: Callable[[Any], str],
) -> str:
    """Ask supports() about every case (progress as ``supports() <label>``). One slow call never stops
    the questions (each case's cost is the median of its calls); they stop only once the median over
    :data:`MIN_CASES_BEFORE_STOP` or more cases is over the per-call limit, or the median of 30+ calls
    over 10x the budget, on a machine recalibrated at that moment. Returns why it stopped ('' if not)."""
    log.speed = log.speed.worse(calibrate())
    for index, case in enumerate(drawn):
        if progress is not None:
            progress(index, len(drawn), f"supports() {case.label}")
        answers[id(case)] = check(case)
        left = len(drawn) - index - 1
        if not left:
            break
        medians = [m for _, _, m in log.per_case]
        over_limit = len(medians) >= MIN_CASES_BEFORE_STOP and statistics.median(medians) > log.limit
        over_budget = len(log.timings) >= 30 and statistics.median(log.timings) > 10 * log.budget
        if not (over_limit or over_budget):
            continue
        log.recalibrate()
        median = statistics.median(medians)
        if len(medians) >= MIN_CASES_BEFORE_STOP and median > log.limit:
            return (
                f"supports() takes {median / 1e3:.0f} ms per call (median of {len(medians)} cases, "
                f"{len(log.timings)} calls), over the {log.limit_us / 1e3:.0f} ms per-call limit{log.scale_note(log.limit, 1e3, 'ms')}; "
                f"{left} remaining case(s) not asked"
            )
        if len(log.timings) >= 30 and statistics.median(log.timings) > 10 * log.budget:
            return (
                f"supports() takes {statistics.median(log.timings):.0f} us per call (median of {len(log.timings)}), "
                f"over 10x the {log.budget_us:.0f} us budget{log.scale_note(log.budget, 1, 'us')}; {left} remaining case(s) not asked"
            )
    return ""


def judge_cost(plugin: Any, drawn: list[Any], log: CostLog, stopped: str, short: Callable[[Any], str]) -> str:
    """'' when supports() is cheap enough, else the failure: ``stopped`` (the questions stopped), the
    median of every call over the budget, or the costliest case's median over the per-call limit, each
    confirmed on a machine recalibrated then (the costliest case asked :data:`CONFIRM_CALLS` more
    times)."""
    if stopped or not log.timings:
        return stopped
    median = statistics.median(log.timings)
    if median > log.budget:
        log.recalibrate()
        if median > log.budget:
            return (
                f"supports() took {median:.0f} us per call (median of {len(log.timings)}), "
                f"over the {log.budget_us:.0f} us budget{log.scale_note(log.budget, 1, 'us')}"
            )
    if not log.per_case:
        return ""
    case, shape_text, worst = max(log.per_case, key=lambda item: item[2])
    if worst <= log.limit:
        return ""
    log.recalibrate()
    costs = [ask(plugin, case.shape, case.config, log.speed)[1] for _ in range(CONFIRM_CALLS)]
    confirmed = statistics.median(costs)
    if confirmed <= log.limit:
        return ""
    return (
        f"supports() takes {confirmed / 1e3:.0f} ms per call on {shape_text} (median of {CONFIRM_CALLS} calls), "
        f"over the {log.limit_us / 1e3:.0f} ms per-call limit{log.scale_note(log.limit, 1e3, 'ms')}"
    )


def _check_supports(
    plugin: Any, case: SuiteCase, checks: _Checks, log: CostLog, short: Callable[[Any], str] = str
) -> tuple[bool | None, str, list[CaseFailure]]:
    """Ask supports() three times (twice as drawn, once on copies) under a watch for tensor reads;
    returns (supported, reason, failures). The calls' costs go to ``log`` (their median as the case's)."""
    failures: list[CaseFailure] = []
    answers = []
    costs: list[float] = []
    reads: list[str] = []
    for shape, config in (
        (case.shape, case.config),
        (case.shape, case.config),
        (_copy(case.shape), _copy(case.config)),
    ):
        try:
            answer, micros, read = ask(plugin, shape, config, log.speed)
        except Exception as exc:  # noqa: BLE001 - the finding
            failures.append(
                checks.fail(
                    "supports_answer", case, f"supports() raised {_error_text(exc)}; it must return Support.no(reason)"
                )
            )
            return None, f"supports() raised {type(exc).__name__}: {exc}", failures
        log.timings.append(micros)
        costs.append(micros)
        answers.append(answer)
        reads += read
    log.per_case.append((case, short(case), statistics.median(costs)))
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
