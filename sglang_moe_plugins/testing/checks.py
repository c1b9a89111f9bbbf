"""What the checks of a case share (:mod:`.execute` runs them, :mod:`.suite` and :mod:`.expert_parallel`
report them): :class:`Checks`, the per-check counts and first failures, and the helpers that describe
values, errors and cases, copy values and pick a case's fresh inputs. Public through :mod:`.execute`."""

from __future__ import annotations

import copy
import dataclasses
import traceback
from collections import defaultdict
from typing import Any

from .case import SuiteCase
from .report import CHECKS, FAILED, PASSED, SKIPPED, CaseFailure, CheckResult

__all__ = ["Checks", "fresh_case", "is_deterministic", "describe", "error_text", "short", "copy_value"]


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
