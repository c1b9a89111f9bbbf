"""The conformance suite: draw cases, ask ``supports``, run what it accepts, check everything, report.

Op-agnostic: the op's adapter (:class:`~.case.OpConformance`, found by :func:`conformance_for` through the
op's spec) supplies cases, inputs and output checks.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from ..core.registry import validate_plugin
from ..errors import InvalidArgumentError, MoEPluginsError
from ..hardware import platform_of
from ..log import get_logger
from ..ops import OPS
from .adapters import SupportsOnlyConformance, conformance_for
from .case import (
    DEFAULT_CPU_CATALOG_RUNS,
    DEFAULT_CPU_MAX_ELEMENTS,
    DEFAULT_CUDA_MAX_ELEMENTS,
    FULL,
    NONE,
    SuiteCase,
    SuiteOptions,
)
from .contract_extra import SpeedLog, check_contract_extra
from .execute import (
    Checks as _Checks,
    describe as _describe,
    error_text as _error_text,
    execute_case,
    is_deterministic,
    short as _short,
)
from .loading import LoadedPlugin, load_plugin
from .names import check_name
from .report import FAILED, PARTIAL, PASSED, CaseFailure, CaseResult, ConformanceReport, DimensionCoverage
from .search import dimension_coverage, search_support
from .supports_cost import CostLog, _check_supports, ask_all, judge_cost

__all__ = [
    "SuiteOptions",
    "run_conformance",
    "ProgressCallback",
    "EstimateCallback",
    "ESTIMATE_THRESHOLD_S",
    "DEFAULT_CPU_MAX_ELEMENTS",
    "DEFAULT_CUDA_MAX_ELEMENTS",
    "DEFAULT_CPU_CATALOG_RUNS",
    "conformance_for",
    "SupportsOnlyConformance",
]

logger = get_logger(__name__)

#: ``progress(done, total, label)``, called before each case and once at the end (label "").
ProgressCallback = Callable[[int, int, str], None]
#: ``estimate(seconds, cases)``: called once, early, when the whole run is estimated to take longer than
#: :data:`ESTIMATE_THRESHOLD_S` (``seconds``: the estimated total; ``cases``: the cases to run).
EstimateCallback = Callable[[float, int], None]
ESTIMATE_THRESHOLD_S = 30.0


def _resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InvalidArgumentError("conformance suite", "device", spec, '"auto", "cpu", "cuda" or "cuda:N"') from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise MoEPluginsError(
                f"device {spec!r} requested, but CUDA is not available here; use --device cpu or auto"
            )
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _select_run_cases(accepted: list[SuiteCase], catalog_limit: int | None, seed: int) -> set[int]:
    """ids of the accepted cases to run: every edge and random case, and up to ``catalog_limit``
    catalog cases chosen round-robin over the models (in a seeded order)."""
    chosen = {id(c) for c in accepted if c.origin != "catalog"}
    catalog = [c for c in accepted if c.origin == "catalog"]
    if catalog_limit is None or len(catalog) <= catalog_limit:
        return chosen | {id(c) for c in catalog}
    rng = random.Random(seed)
    groups: dict[str, list[SuiteCase]] = defaultdict(list)
    for case in catalog:
        groups[case.group].append(case)
    order = sorted(groups)
    rng.shuffle(order)
    for name in order:
        rng.shuffle(groups[name])
    picked = 0
    while picked < catalog_limit:
        for name in order:
            if groups[name] and picked < catalog_limit:
                chosen.add(id(groups[name].pop()))
                picked += 1
    return chosen


def run_conformance(
    target: Any,
    options: SuiteOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    estimate: EstimateCallback | None = None,
    **overrides: Any,
) -> ConformanceReport:
    """Run the conformance suite on ``target`` and return a :class:`ConformanceReport`.

    ``target``: a plugin instance or class, a registered plugin name, ``path/to/module.py[:Class]`` or
    ``package.module:Class``. ``overrides`` replace fields of ``options`` (``seed=1, random_cases=8``).
    Never raises for a plugin's failure: every finding is in the report. Raises
    :class:`~sglang_moe_plugins.testing.PluginLoadError` when ``target`` cannot be loaded.
    ``estimate(seconds, cases)`` is called once, after the first cases ran, when the whole run is
    estimated to take longer than :data:`ESTIMATE_THRESHOLD_S` seconds (the CLI prints it).
    """
    started = time.perf_counter()
    valid = [f.name for f in dataclasses.fields(SuiteOptions)]
    for key in overrides:
        if key not in valid:
            raise InvalidArgumentError(
                "conformance suite", key, overrides[key], f"a SuiteOptions field: {', '.join(valid)}"
            )
    options = dataclasses.replace(options or SuiteOptions(), **overrides)
    if options.seed is None:
        options = dataclasses.replace(options, seed=random.SystemRandom().randrange(1 << 31))
    seed = int(options.seed)  # type: ignore[arg-type]
    loaded = target if isinstance(target, LoadedPlugin) else load_plugin(target)
    plugin = loaded.plugin
    name = str(getattr(plugin, "name", "?"))
    op = str(getattr(plugin, "op", "?"))
    device = _resolve_device(options.device)
    platform = platform_of(device)
    logger.info(
        "sglang-moe-plugins conformance: plugin %r (%s), op %s, on %s, seed %d", name, loaded.origin, op, device, seed
    )
    checks = _Checks()
    speed: SpeedLog | None = None

    def report(
        coverage: str,
        note: str,
        cases: tuple[CaseResult, ...] = (),
        timings: list[float] | None = None,
        dimensions: tuple[DimensionCoverage, ...] = (),
    ) -> ConformanceReport:
        timings = timings or []
        return ConformanceReport(
            plugin=name,
            plugin_class=f"{type(plugin).__module__}.{type(plugin).__qualname__} ({loaded.origin})",
            op=op,
            coverage=coverage,
            coverage_note=note,
            device=str(device),
            platform=str(platform),
            seed=seed,
            options=options,
            checks=checks.results(),
            cases=cases,
            supports_median_us=statistics.median(timings) if timings else 0.0,
            supports_max_us=max(timings) if timings else 0.0,
            seconds=time.perf_counter() - started,
            dimensions=dimensions,
            speed=speed.describe() if speed is not None else "",
        )

    try:
        validate_plugin(plugin, loaded.origin)
        available = getattr(plugin, "available", None)
        if callable(available):
            answer = available(platform)
            if not isinstance(getattr(answer, "reason", None), str):
                raise MoEPluginsError(
                    f"available({platform}) returned {answer!r}; it must return sglang_moe_plugins.Support"
                )
    except Exception as exc:  # noqa: BLE001 - the finding
        checks.fail("contract", None, str(exc) if isinstance(exc, MoEPluginsError) else _error_text(exc))
        if not isinstance(getattr(plugin, "name", None), str) or not callable(getattr(plugin, "supports", None)):
            return report(NONE, "the plugin does not satisfy the contract; nothing else was checked")
    else:
        checks.ok("contract")
    wrong_name = check_name(plugin, loaded.entry_point)
    if wrong_name:
        checks.fail("name", None, wrong_name)
    else:
        checks.ok("name")

    if op not in OPS:
        return report(NONE, f"op {op!r} is not a known op (known: {', '.join(sorted(OPS))}); nothing to check")
    adapter = conformance_for(op)
    if adapter is None:
        return report(
            NONE, f"op {op!r} is not covered by the conformance suite yet (its op module offers no conformance cases)"
        )

    drawn = list(adapter.cases(options, platform, seed))
    log = CostLog(options.supports_limit_us, options.supports_budget_us)
    timings = log.timings
    answers: dict[int, tuple[bool | None, str, list[CaseFailure]]] = {}
    stopped = ask_all(
        drawn, answers, lambda case: _check_supports(plugin, case, checks, log, _short), log, progress, _short
    )
    searched: dict[tuple[str, str], int] = {}
    if stopped:
        drawn = [c for c in drawn if id(c) in answers]
    elif adapter.coverage == FULL:
        found, searched = search_support(
            adapter,
            drawn,
            answers,
            lambda case: _check_supports(plugin, case, checks, log, _short),
            options.resolved_max_elements(platform),
            seed,
        )
        drawn += found
    accepted = [c for c in drawn if c.execute and answers[id(c)][0]]
    catalog_limit = options.resolved_max_catalog_runs(platform)
    adapter_cpu_limit = getattr(adapter, "max_cpu_catalog_runs", None)
    if options.max_catalog_runs is None and not platform.is_cuda and isinstance(adapter_cpu_limit, int):
        catalog_limit = adapter_cpu_limit
    to_run = _select_run_cases(accepted, catalog_limit, seed)

    speed = SpeedLog()
    results: list[CaseResult] = []
    total = len(drawn)
    run_cost = getattr(adapter, "cost", None)
    costs = {id(c): float(run_cost(c)) if callable(run_cost) else 1.0 for c in drawn if id(c) in to_run}
    pending, spent, ran_seconds, estimated = sum(costs.values()), 0.0, 0.0, False
    runs_started = time.perf_counter()
    for index, case in enumerate(drawn):
        if progress is not None:
            progress(index, total, case.label)
        supported, reason, failures = answers[id(case)]
        case_start = time.perf_counter()
        if supported is None:
            status = "error"
        elif not supported:
            status = "rejected"
        elif not case.execute or id(case) not in to_run or adapter.coverage != FULL:
            status = "probed"
        else:
            try:
                failures = failures + execute_case(plugin, adapter, case, device, checks)
                if not failures:
                    failures = check_contract_extra(plugin, adapter, case, device, checks, speed, options.repeats)
            except Exception as exc:  # noqa: BLE001 - a suite problem must not hide as a pass
                logger.exception("conformance suite error on case %s", case.label)
                failures = [
                    *failures,
                    checks.fail("run_no_crash", case, f"the suite itself failed on this case: {_error_text(exc)}"),
                ]
            status = FAILED if failures else PASSED
            spent += costs.get(id(case), 0.0)
            ran_seconds += time.perf_counter() - case_start
            if not estimated and spent and (ran_seconds > 1.0 or spent >= 0.1 * pending):
                estimated = True
                total_s = (time.perf_counter() - started) + ran_seconds / spent * (pending - spent)
                if total_s > ESTIMATE_THRESHOLD_S:
                    logger.info(
                        "sglang-moe-plugins conformance: estimated %.0f s in all (%d cases to run)", total_s, len(costs)
                    )
                    if estimate is not None:
                        estimate(total_s, len(costs))
        if failures and status in ("rejected", "probed"):
            status = FAILED
        results.append(
            CaseResult(
                case.label,
                case.origin,
                _describe(case.shape),
                _describe(case.config),
                case.masked_m,
                supported,
                reason,
                status,
                tuple(failures),
                time.perf_counter() - case_start,
                case.seed,
            )
        )
    if progress is not None:
        progress(total, total, "")
    logger.debug("conformance runs took %.2f s", time.perf_counter() - runs_started)
    from .expert_parallel import check_expert_parallel

    check_expert_parallel(
        plugin, loaded, adapter, [c for c in drawn if answers[id(c)][0]], checks, options, platform, device
    )

    if timings:
        too_costly = judge_cost(plugin, drawn, log, stopped, _short)
        if too_costly:
            checks.fail("supports_cheap", None, too_costly)
        else:
            checks.ok("supports_cheap")
        median = statistics.median(timings)
        slowest = max(m for _, _, m in log.per_case) if log.per_case else max(timings)
        checks.notes["supports_cheap"] = (
            f"median {median:.1f} us, slowest case {slowest:.1f} us (median of its calls); budget "
            f"{log.budget:.0f} us median, {log.limit:.0f} us per call; {log.speed.describe()}"
        )
    if adapter.coverage != FULL:
        for key in (
            "run_no_crash",
            "output_layout",
            "inputs_unchanged",
            "rows_written",
            "numerics",
            "prepare",
            "deterministic",
            "padding_ignored",
            "second_call",
        ):
            checks.notes[key] = "not exercised: " + adapter.note
    if not callable(getattr(plugin, "prepare", None)):
        checks.ok("prepare")  # optional: a plugin without it satisfies the contract
        checks.notes.setdefault("prepare", "the plugin has no prepare(): run() is called on every call (allowed)")
    if not is_deterministic(plugin):
        checks.notes["deterministic"] = (
            "the plugin declares deterministic = False: repeated calls are compared within the "
            "tolerance, not bit for bit"
        )
    if not callable(getattr(adapter, "repad", None)) or not any(
        getattr(adapter, "has_padding", lambda c: True)(c) for c in drawn
    ):
        checks.notes.setdefault("padding_ignored", f"op {op} has no padding rows in its inputs")
        if not checks.failures.get("padding_ignored"):
            checks.ok("padding_ignored")
    rejected = sum(1 for r in results if r.status == "rejected")
    probed = sum(1 for r in results if r.status == "probed")
    checks.notes.setdefault("supports_answer", f"{len(drawn) - rejected} accepted, {rejected} rejected")
    if probed:
        checks.notes.setdefault(
            "run_no_crash", f"{probed} accepted case(s) supports()-checked only (size budget or max_catalog_runs)"
        )
    coverage, note = adapter.coverage, adapter.note
    statuses = {id(case): result.status for case, result in zip(drawn, results)}
    dimensions = dimension_coverage(adapter, drawn, statuses, searched) if coverage == FULL else ()
    missing = [f"{d.name}={v}" for d in dimensions for v in d.not_run]
    if missing:
        coverage = PARTIAL
        note = f"not run, though the plugin may accept them: {', '.join(missing)} (see coverage by dimension)"
    final = report(coverage, note, tuple(results), timings, dimensions)
    logger.info("sglang-moe-plugins conformance: plugin %r: %s (%d cases run)", name, final.status, final.cases_run)
    return final
