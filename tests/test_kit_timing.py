"""The conformance kit's supports() cost limits hold on a busy machine: cost by the median of a case's
repeated calls (CPU-bound waiting for a core is not the plugin's cost), limits scaled by a calibration
loop run on the same machine, the questions never stopped by one slow call.

Runs on CPU. The busy-machine test starts CPU-bound processes beside the suite (killed in a finally).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sglang_moe_plugins.plugins.reference import ReferencePlugin
from sglang_moe_plugins.testing import SuiteOptions, run_conformance
from sglang_moe_plugins.testing.report import FAILED, PASSED

HERE = os.path.dirname(__file__)
BROKEN = os.path.join(HERE, "broken_plugins.py")
#: A short draw: every edge case and a few random cases, no catalog.
QUICK = dict(seed=0, catalog=False, random_cases=4)
#: CPU-bound processes started beside the suite in the busy-machine test.
BUSY_PROCESSES = 4


def _spin(seconds: float) -> None:
    """Pure-Python CPU work for about ``seconds`` on an idle core."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class _CostlyOnAFewShapes(ReferencePlugin):
    """A legal plugin: supports() spends 25 ms of CPU on its first three distinct shapes (a table search),
    every time it is asked about them, and microseconds on the others. Under the 50 ms limit."""

    name = "costly_on_a_few_shapes"
    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.costly: list[object] = []

    def supports(self, shape, config):
        if shape not in self.costly and len(self.costly) < 3:
            self.costly.append(shape)
        if shape in self.costly:
            _spin(0.025)
        return super().supports(shape, config)


class _OneSlowCall(ReferencePlugin):
    """A legal plugin whose fifth supports() call is slow once (a page fault, a GC pause, a busy core)."""

    name = "one_slow_call"
    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def supports(self, shape, config):
        self.calls += 1
        if self.calls == 5:
            time.sleep(0.12)
        return super().supports(shape, config)


class _SleepySupports(ReferencePlugin):
    """supports() takes half a second on every call (a costly search over real model shapes)."""

    name = "sleepy_supports"
    priority = 1

    def supports(self, shape, config):
        time.sleep(0.5)
        return super().supports(shape, config)


def _verdict(report) -> tuple[str, tuple[str, ...]]:
    return report.status, tuple(sorted(c.name for c in report.failed_checks))


def _verdicts() -> dict[str, tuple[str, tuple[str, ...]]]:
    targets = {
        "reference": ReferencePlugin(),
        "costly_on_a_few_shapes": _CostlyOnAFewShapes(),
        "slow_supports": f"{BROKEN}:SlowSupportsPlugin",
        "unwritten_row": f"{BROKEN}:UnwrittenRowPlugin",
    }
    return {name: _verdict(run_conformance(target, SuiteOptions(**QUICK))) for name, target in targets.items()}


def test_verdicts_are_the_same_with_cpu_bound_processes_beside_the_suite():
    idle = _verdicts()
    assert idle == {
        "reference": (PASSED, ()),
        "costly_on_a_few_shapes": (PASSED, ()),
        "slow_supports": (FAILED, ("supports_cheap",)),
        "unwritten_row": (FAILED, ("rows_written",)),
    }
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY_PROCESSES)]
    try:
        time.sleep(0.5)
        loaded = _verdicts()
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait()
    assert loaded == idle


def test_one_slow_call_neither_fails_nor_stops_the_questions():
    report = run_conformance(_OneSlowCall(), SuiteOptions(**QUICK))
    assert report.check("supports_cheap").status == PASSED, report.summary()
    assert report.status == PASSED
    every = run_conformance(ReferencePlugin(), SuiteOptions(**QUICK))
    assert len(report.cases) == len(every.cases)


def test_a_costly_supports_is_reported_by_its_median_and_fails_in_seconds():
    started = time.perf_counter()
    report = run_conformance(_SleepySupports(), SuiteOptions(seed=0))
    elapsed = time.perf_counter() - started
    # Not 3 calls on each of the ~375 catalog, edge and random cases (more than 9 minutes): the suite
    # stops once the median of several cases is over the limit, and says so.
    assert elapsed < 30, elapsed
    cheap = report.check("supports_cheap")
    assert cheap.status == FAILED and report.status == FAILED, report.summary()
    error = cheap.first_failure.error
    assert error.startswith("supports() takes 500 ms per call (median of "), error
    assert "remaining case(s) not asked" in error
