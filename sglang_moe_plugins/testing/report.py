"""The conformance report: frozen value types, a text summary and a JSON-ready dict."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import MoEPluginsError

__all__ = [
    "PASSED",
    "FAILED",
    "SKIPPED",
    "NOT_EXERCISED",
    "INCOMPLETE",
    "CLAIM_NOT_EXERCISED",
    "CHECKS",
    "CaseFailure",
    "CheckResult",
    "CaseResult",
    "DimensionCoverage",
    "PARTIAL",
    "ConformanceReport",
    "ConformanceFailure",
]

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"
#: Overall status when no case could be run (op not covered, or the plugin supports no case here).
NOT_EXERCISED = "not exercised"
#: Overall status when every check that ran passed, but a claim of the plugin could not be exercised
#: (a mega_moe plugin that accepts ep_size > 1 and the kit could not run it over ranks).
INCOMPLETE = "incomplete"
#: Status of a check whose claim could not be exercised (the report is then INCOMPLETE).
CLAIM_NOT_EXERCISED = "not exercised"

#: Every check of the suite, in report order: ``name -> what it checks``.
CHECKS: dict[str, str] = {
    "contract": "name, op, priority, supports/run, contract_version and options satisfy the plugin contract",
    "name": "the plugin's name is not a built-in plugin's, and equals the name of the entry point that registers it",
    "supports_answer": "supports() returns a Support with a non-empty reason and never raises (a rejected case is rejected, not crashed)",
    "supports_deterministic": "supports() gives the same answer twice, and for equal but distinct shape/config objects",
    "supports_cheap": "supports() is cheap: median time per call under the budget, and no case's median over the per-call limit",
    "supports_no_sync": "supports() reads no tensor value (.item(), .tolist(), bool/int/float of a tensor, .cpu(), .numpy()): no host sync",
    "run_no_crash": "run() does not raise for a case supports() accepted",
    "output_layout": "outputs have the dtypes, shapes, strides and scale layout the host requires",
    "inputs_unchanged": "run() leaves its inputs unchanged (unless the caller marks gateup writable)",
    "rows_written": "every real row of the outputs is written (outputs poisoned first)",
    "numerics": "outputs within the documented tolerance policy of an independent fp64 computation",
    "deterministic": "two calls on identical inputs give bit-identical outputs (within the tolerance when the plugin declares "
    "deterministic = False)",
    "prepare": "a plugin with prepare(): calling it twice for one key works, and its launch gives run()'s outputs",
    "padding_ignored": "real rows do not depend on the padding rows of the input (past masked_m: NaN, then other values)",
    "second_call": "the second call of a shape key, with fresh inputs (mega_moe: another layer's weights), gives the results "
    "of its own inputs, through run() and through prepare()'s launch",
    "no_host_sync": "run() reads no tensor data on the host (CUDA: sync debug mode 'error'; CPU: "
    "masked_m .item()/.tolist()/int()/bool()); plugins declaring oracle = True are exempt",
    "padding_bytes": "packed UE8M0 scales hold 0 in the pad bytes of each real row's last int32 word",
    "inputs_released": "no reference to a call's input tensors is kept after the call returned",
    "expert_parallel": "a mega_moe plugin that accepts ep_size > 1 gives each rank's rows of the whole problem, run over a gloo "
    "group of processes on CPU",
}


@dataclass(frozen=True)
class CaseFailure:
    """One failed check on one case: which check, which case, and the error."""

    check: str
    case: str
    shape: str
    config: str
    error: str

    def describe(self) -> str:
        return f"[{self.check}] {self.case}: {self.shape} [{self.config}]: {self.error}"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check over every case it applied to."""

    name: str
    title: str
    status: str  # PASSED, FAILED, SKIPPED or CLAIM_NOT_EXERCISED
    checked: int
    failed: int
    first_failure: CaseFailure | None = None
    note: str = ""

    @property
    def passed(self) -> bool:
        return self.status != FAILED


#: Coverage when some dimension value the plugin accepts did not run (see :class:`DimensionCoverage`).
PARTIAL = "partial"


@dataclass(frozen=True)
class DimensionCoverage:
    """One dimension of the op's case space: the values that ran, the values the plugin declined (every
    case asked with them was refused) and the values not run (accepted but over the size budget, or no
    accepted case to derive one from)."""

    name: str
    ran: tuple[str, ...]
    declined: tuple[str, ...]
    not_run: tuple[str, ...]

    def describe(self) -> str:
        parts = [f"ran {', '.join(self.ran) or 'nothing'}"]
        if self.declined:
            parts.append(f"declined {', '.join(self.declined)}")
        if self.not_run:
            parts.append(f"NOT RUN {', '.join(self.not_run)}")
        return f"{self.name}: " + "; ".join(parts)


@dataclass(frozen=True)
class CaseResult:
    """One case: what ``supports`` said and, when it ran, how it went."""

    label: str
    origin: str  # "catalog", "edge", "random"
    shape: str
    config: str
    masked_m: str
    supported: bool | None  # None when supports() raised
    reason: str
    #: "passed", "failed", "rejected" (supports said no), "probed" (supports only: over the size budget
    #: or the op has no execution checks), "error" (supports() raised)
    status: str
    failures: tuple[CaseFailure, ...] = ()
    seconds: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class ConformanceReport:
    """The result of :func:`~sglang_moe_plugins.testing.run_conformance` for one plugin."""

    plugin: str
    plugin_class: str
    op: str
    #: "full" (supports and execution checks, every dimension value the plugin accepts ran), "partial"
    #: (some did not: :attr:`dimensions` says which), "supports-only" or "none" (the op is not covered yet).
    coverage: str
    coverage_note: str
    device: str
    platform: str
    seed: int
    #: The :class:`~sglang_moe_plugins.testing.SuiteOptions` the suite ran with (seed resolved).
    options: Any
    checks: tuple[CheckResult, ...]
    cases: tuple[CaseResult, ...]
    supports_median_us: float = 0.0
    supports_max_us: float = 0.0
    seconds: float = 0.0
    #: Per dimension of the op's case space: what ran, what the plugin declined, what did not run.
    dimensions: tuple[DimensionCoverage, ...] = ()
    #: run()'s time against the op's reference plugin on the same cases (information, not a check).
    speed: str = ""

    # -- summary ---------------------------------------------------------------------------------
    @property
    def failed_checks(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status == FAILED)

    @property
    def cases_run(self) -> int:
        return sum(1 for c in self.cases if c.status in (PASSED, FAILED))

    @property
    def cases_passed(self) -> int:
        return sum(1 for c in self.cases if c.status == PASSED)

    @property
    def cases_failed(self) -> int:
        return sum(1 for c in self.cases if c.status == FAILED)

    @property
    def cases_rejected(self) -> int:
        return sum(1 for c in self.cases if c.status == "rejected")

    @property
    def cases_probed(self) -> int:
        return sum(1 for c in self.cases if c.status == "probed")

    @property
    def status(self) -> str:
        if self.failed_checks or any(c.status in (FAILED, "error") for c in self.cases):
            return FAILED
        if self.coverage in ("full", PARTIAL) and self.cases_run == 0:
            return NOT_EXERCISED
        if self.coverage == "none":
            return NOT_EXERCISED
        if any(c.status == CLAIM_NOT_EXERCISED for c in self.checks):
            return INCOMPLETE
        return PASSED

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def first_failure(self) -> CaseFailure | None:
        for check in self.checks:
            if check.first_failure is not None:
                return check.first_failure
        return None

    def check(self, name: str) -> CheckResult:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; checks: {', '.join(c.name for c in self.checks)}")

    def not_exercised_reason(self) -> str:
        unverified = [f"{c.name}: {c.note}" for c in self.checks if c.status == CLAIM_NOT_EXERCISED]
        if unverified and self.status == INCOMPLETE:
            return "; ".join(unverified)
        if self.coverage == "none":
            return self.coverage_note
        if self.cases_run == 0:
            reasons = [c.reason for c in self.cases if c.status == "rejected"]
            first = f"; first reason: {reasons[0]}" if reasons else ""
            return f"plugin {self.plugin!r} supports none of the {len(self.cases)} cases on {self.platform}{first}"
        return ""

    def summary(self) -> str:
        """A human-readable summary: counts, the per-check table and the first failure."""
        lines = [
            f"conformance of plugin {self.plugin!r} ({self.plugin_class}), op {self.op}, on {self.device} ({self.platform}); "
            f"seed {self.seed} (rerun with --seed {self.seed})",
            f"coverage: {self.coverage}" + (f" ({self.coverage_note})" if self.coverage_note else ""),
            f"cases: {len(self.cases)} drawn, {self.cases_run} run, {self.cases_passed} passed, {self.cases_failed} failed, "
            f"{self.cases_rejected} rejected by supports(), {self.cases_probed} supports()-checked only",
        ]
        if self.dimensions:
            lines.append("coverage by dimension:")
            lines += [f"  {d.describe()}" for d in self.dimensions]
        if self.supports_median_us:
            lines.append(
                f"supports(): median {self.supports_median_us:.1f} us, max {self.supports_max_us:.1f} us per call"
            )
        if self.speed:
            lines.append(self.speed)
        rows = [(c.name, c.status, c.checked, c.failed, c.note) for c in self.checks]
        lines.append("")
        lines.append(_table(("check", "status", "checked", "failed", "note"), rows))
        first = self.first_failure
        errored = [c for c in self.cases if c.status == "error"]
        if first is not None:
            lines += [
                "",
                f"first failure: [{first.check}] {first.case}",
                f"  shape:  {first.shape}",
                f"  config: {first.config}",
                f"  error:  {first.error}",
            ]
        elif errored:
            lines += ["", f"first failure: {errored[0].label}: {errored[0].reason}"]
        lines.append("")
        verdict = self.status.upper()
        if self.status in (NOT_EXERCISED, INCOMPLETE):
            verdict += f": {self.not_exercised_reason()}"
        lines.append(f"result: {verdict}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: everything in the report plus the summary counts."""
        data = dataclasses.asdict(self)
        data.update(
            status=self.status,
            passed=self.passed,
            cases_total=len(self.cases),
            cases_run=self.cases_run,
            cases_passed=self.cases_passed,
            cases_failed=self.cases_failed,
            cases_rejected=self.cases_rejected,
            cases_probed=self.cases_probed,
            first_failure=dataclasses.asdict(self.first_failure) if self.first_failure else None,
            failed_checks=[c.name for c in self.failed_checks],
        )
        return data

    def raise_for_failures(self) -> None:
        """Raise :class:`ConformanceFailure` (with the summary) unless the report passed."""
        if not self.passed:
            raise ConformanceFailure(self)


class ConformanceFailure(MoEPluginsError, AssertionError):
    """A plugin failed (or could not be exercised by) the conformance suite. ``report`` holds the details."""

    def __init__(self, report: ConformanceReport):
        self.report = report
        super().__init__(report.summary())


def _table(headers: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()

    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])
