"""The conformance suite: draw cases, ask ``supports``, run what it accepts, check everything, report.

Op-agnostic: the op's adapter (:mod:`.adapters`) supplies cases, inputs and output checks.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..catalog import DEFAULT_ROWS
from ..contract import Support
from ..errors import InvalidArgumentError, MoEPluginsError
from ..hardware import Platform, platform_of
from ..ops import OPS
from ..registry import validate_plugin
from .adapters import FULL, NONE, OpConformance, SuiteCase, conformance_for
from .loading import LoadedPlugin, load_plugin
from .execute import Checks as _Checks
from .execute import copy_value as _copy
from .execute import describe as _describe
from .execute import error_text as _error_text
from .execute import execute_case, is_deterministic
from .execute import short as _short
from .names import check_name
from .supports_cost import ask, ask_all
from .report import FAILED, PASSED, CaseFailure, CaseResult, ConformanceReport

__all__ = ["SuiteOptions", "run_conformance", "ProgressCallback", "EstimateCallback", "ESTIMATE_THRESHOLD_S",
           "DEFAULT_CPU_MAX_ELEMENTS", "DEFAULT_CUDA_MAX_ELEMENTS", "DEFAULT_CPU_CATALOG_RUNS"]

logger = logging.getLogger(__name__)

#: Per-case size budget (input elements, E * N * 2D for silu_mul_quant) on CPU and on CUDA.
DEFAULT_CPU_MAX_ELEMENTS = 1 << 20
DEFAULT_CUDA_MAX_ELEMENTS = 1 << 27
#: Catalog cases run on CPU (the rest are supports()-checked only); all run on CUDA.
DEFAULT_CPU_CATALOG_RUNS = 24

#: ``progress(done, total, label)``, called before each case and once at the end (label "").
ProgressCallback = Callable[[int, int, str], None]
#: ``estimate(seconds, cases)``: called once, early, when the whole run is estimated to take longer than
#: :data:`ESTIMATE_THRESHOLD_S` (``seconds``: the estimated total; ``cases``: the cases to run).
EstimateCallback = Callable[[float, int], None]
ESTIMATE_THRESHOLD_S = 30.0


@dataclass(frozen=True)
class SuiteOptions:
    """What the suite draws and where it runs. Every field has a sensible default."""

    #: Seed of the random cases and inputs; None draws one (it is in the report: rerun with it).
    seed: int | None = None
    #: Number of property-based random cases.
    random_cases: int = 24
    #: Draw the embedded catalog's models.
    catalog: bool = True
    #: Restrict the catalog to these models (ids or short names); None: every model.
    models: tuple[str, ...] | None = None
    #: Expert-parallel sizes of the catalog cases.
    eps: tuple[int, ...] = (1, 2, 4, 8)
    #: Padded rows per expert (N) of the catalog cases: decode-size and prefill-size.
    rows: tuple[int, ...] = DEFAULT_ROWS
    #: Draw the curated edge cases.
    edge_cases: bool = True
    #: "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N".
    device: str = "auto"
    #: Largest case run as drawn (input elements); larger catalog cases also run at a reduced N.
    #: None: 2**21 on CPU, 2**27 on CUDA.
    max_elements: int | None = None
    #: supports() must take less than this per call (median), in microseconds.
    supports_budget_us: float = 1000.0
    #: No single supports() call may take longer than this (microseconds; the first call of the run, which
    #: may pay one-time imports, is exempt). A slower call fails ``supports_cheap`` at once and the
    #: remaining cases are not asked, so a costly supports() fails fast.
    supports_limit_us: float = 50_000.0
    #: Run at most this many of the accepted catalog cases, spread over the models (the others are
    #: supports()-checked only). None: 24 on CPU (or the op adapter's ``max_cpu_catalog_runs``), all on
    #: CUDA. Edge and random cases always run.
    max_catalog_runs: int | None = None

    def __post_init__(self) -> None:
        def bad(field: str, allowed: str) -> InvalidArgumentError:
            return InvalidArgumentError("conformance suite", field, getattr(self, field), allowed)

        def positive_int(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value > 0

        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise bad("seed", "None or an int")
        if isinstance(self.random_cases, bool) or not isinstance(self.random_cases, int) or self.random_cases < 0:
            raise bad("random_cases", "an int >= 0")
        for field in ("eps", "rows"):
            values = getattr(self, field)
            if not isinstance(values, tuple) or not all(positive_int(v) for v in values):
                raise bad(field, "a tuple of ints >= 1")
        if self.models is not None and (not isinstance(self.models, tuple) or not all(isinstance(m, str) for m in self.models)):
            raise bad("models", "None or a tuple of model names")
        for field in ("max_elements", "max_catalog_runs"):
            value = getattr(self, field)
            if value is not None and not (positive_int(value) or (field == "max_catalog_runs" and value == 0)):
                raise bad(field, "None or a positive int")
        for field in ("supports_budget_us", "supports_limit_us"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise bad(field, "a number > 0")
        if not isinstance(self.device, str):
            raise bad("device", '"auto", "cpu", "cuda" or "cuda:N"')

    def resolved_max_elements(self, platform: Platform) -> int:
        if self.max_elements is not None:
            return self.max_elements
        return DEFAULT_CUDA_MAX_ELEMENTS if platform.is_cuda else DEFAULT_CPU_MAX_ELEMENTS

    def resolved_max_catalog_runs(self, platform: Platform) -> int | None:
        if self.max_catalog_runs is not None:
            return self.max_catalog_runs
        return None if platform.is_cuda else DEFAULT_CPU_CATALOG_RUNS


def _resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InvalidArgumentError("conformance suite", "device", spec, '"auto", "cpu", "cuda" or "cuda:N"') from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise MoEPluginsError(f"device {spec!r} requested, but CUDA is not available here; use --device cpu or auto")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _check_supports(
    plugin: Any, case: SuiteCase, checks: _Checks, timings: list[float], limit_us: float = float("inf")
) -> tuple[bool | None, str, list[CaseFailure]]:
    """Ask supports() three times (twice as drawn, once on copies) under a watch for tensor reads;
    returns (supported, reason, failures). Stops early after a call over ``limit_us``."""
    failures: list[CaseFailure] = []
    answers = []
    reads: list[str] = []
    for shape, config in ((case.shape, case.config), (case.shape, case.config), (_copy(case.shape), _copy(case.config))):
        try:
            answer, micros, read = ask(plugin, shape, config)
        except Exception as exc:  # noqa: BLE001 - the finding
            failures.append(checks.fail("supports_answer", case, f"supports() raised {_error_text(exc)}; it must return Support.no(reason)"))
            return None, f"supports() raised {type(exc).__name__}: {exc}", failures
        timings.append(micros)
        answers.append(answer)
        reads += read
        if micros > limit_us and len(timings) > 1:
            break  # over the per-call limit: the caller stops asking
    if reads:
        failures.append(checks.fail("supports_no_sync", case, f"supports() read tensor values ({', '.join(dict.fromkeys(reads))}): "
                                    "a host sync, and an answer that may differ between ranks; decide from the shape and config only"))
    else:
        checks.ok("supports_no_sync")
    if len(answers) < 3:
        return None, "not decided: supports() went over the per-call time limit", failures
    first = answers[0]
    reason = getattr(first, "reason", None)
    if not isinstance(first, Support) and not isinstance(reason, str):
        failures.append(checks.fail("supports_answer", case, f"supports() returned {first!r}; it must return sglang_moe_plugins.Support"))
        return None, "no Support returned", failures
    if not isinstance(reason, str) or not reason.strip():
        failures.append(checks.fail("supports_answer", case, f"supports() returned {first!r} without a human-readable reason"))
        return bool(first), "(no reason)", failures
    checks.ok("supports_answer")
    keys = [(bool(a), getattr(a, "reason", None)) for a in answers]
    if keys[0] != keys[1]:
        failures.append(checks.fail("supports_deterministic", case, f"asked twice, supports() answered {keys[0]} then {keys[1]}"))
    elif keys[0] != keys[2]:
        failures.append(
            checks.fail("supports_deterministic", case, f"supports() answered {keys[0]}, but {keys[2]} for an equal copy of the shape and config")
        )
    else:
        checks.ok("supports_deterministic")
    return bool(first), reason, failures


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
            raise InvalidArgumentError("conformance suite", key, overrides[key], f"a SuiteOptions field: {', '.join(valid)}")
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
    logger.info("sglang-moe-plugins conformance: plugin %r (%s), op %s, on %s, seed %d", name, loaded.origin, op, device, seed)
    checks = _Checks()

    def report(coverage: str, note: str, cases: tuple[CaseResult, ...] = (), timings: list[float] | None = None) -> ConformanceReport:
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
        )

    try:
        validate_plugin(plugin, loaded.origin)
        available = getattr(plugin, "available", None)
        if callable(available):
            answer = available(platform)
            if not isinstance(getattr(answer, "reason", None), str):
                raise MoEPluginsError(f"available({platform}) returned {answer!r}; it must return sglang_moe_plugins.Support")
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
        return report(NONE, f"op {op!r} is not covered by the conformance suite yet (its op module offers no conformance cases)")

    drawn = list(adapter.cases(options, platform, seed))
    timings: list[float] = []
    answers: dict[int, tuple[bool | None, str, list[CaseFailure]]] = {}
    stopped = ask_all(drawn, answers, lambda case, limit: _check_supports(plugin, case, checks, timings, limit), timings,
                      options.supports_limit_us, options.supports_budget_us, progress, _short)
    if stopped:
        drawn = [c for c in drawn if id(c) in answers]
    accepted = [c for c in drawn if c.execute and answers[id(c)][0]]
    catalog_limit = options.resolved_max_catalog_runs(platform)
    adapter_cpu_limit = getattr(adapter, "max_cpu_catalog_runs", None)
    if options.max_catalog_runs is None and not platform.is_cuda and isinstance(adapter_cpu_limit, int):
        catalog_limit = adapter_cpu_limit
    to_run = _select_run_cases(accepted, catalog_limit, seed)

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
            except Exception as exc:  # noqa: BLE001 - a suite problem must not hide as a pass
                logger.exception("conformance suite error on case %s", case.label)
                failures = failures + [checks.fail("run_no_crash", case, f"the suite itself failed on this case: {_error_text(exc)}")]
            status = FAILED if failures else PASSED
            spent += costs.get(id(case), 0.0)
            ran_seconds += time.perf_counter() - case_start
            if not estimated and spent and (ran_seconds > 1.0 or spent >= 0.1 * pending):
                estimated = True
                total_s = (time.perf_counter() - started) + ran_seconds / spent * (pending - spent)
                if total_s > ESTIMATE_THRESHOLD_S:
                    logger.info("sglang-moe-plugins conformance: estimated %.0f s in all (%d cases to run)", total_s, len(costs))
                    if estimate is not None:
                        estimate(total_s, len(costs))
        if failures and status in ("rejected", "probed"):
            status = FAILED
        results.append(
            CaseResult(case.label, case.origin, _describe(case.shape), _describe(case.config), case.masked_m, supported, reason,
                       status, tuple(failures), time.perf_counter() - case_start, case.seed)
        )
    if progress is not None:
        progress(total, total, "")
    logger.debug("conformance runs took %.2f s", time.perf_counter() - runs_started)
    from .expert_parallel import check_expert_parallel

    check_expert_parallel(plugin, loaded, adapter, [c for c in drawn if answers[id(c)][0]], checks, options, platform, device)

    if timings:
        median = statistics.median(timings)
        budget = options.supports_budget_us
        if stopped:
            checks.fail("supports_cheap", None, stopped)
        elif median > budget:
            checks.fail("supports_cheap", None, f"supports() took {median:.0f} us per call (median of {len(timings)}), over the {budget:.0f} us budget")
        else:
            checks.ok("supports_cheap")
        slowest = max(timings[1:]) if len(timings) > 1 else timings[0]
        checks.notes["supports_cheap"] = (f"median {median:.1f} us, slowest {slowest:.1f} us after the first call ({timings[0]:.1f} us); "
                                          f"budget {budget:.0f} us median, {options.supports_limit_us:.0f} us per call")
    if adapter.coverage != FULL:
        for key in ("run_no_crash", "output_layout", "inputs_unchanged", "rows_written", "numerics", "prepare", "deterministic",
                    "padding_ignored", "second_call"):
            checks.notes[key] = "not exercised: " + adapter.note
    if not callable(getattr(plugin, "prepare", None)):
        checks.ok("prepare")  # optional: a plugin without it satisfies the contract
        checks.notes.setdefault("prepare", "the plugin has no prepare(): run() is called on every call (allowed)")
    if not is_deterministic(plugin):
        checks.notes["deterministic"] = ("the plugin declares deterministic = False: repeated calls are compared within the "
                                         "tolerance, not bit for bit")
    if not callable(getattr(adapter, "repad", None)) or not any(getattr(adapter, "has_padding", lambda c: True)(c) for c in drawn):
        checks.notes.setdefault("padding_ignored", f"op {op} has no padding rows in its inputs")
        if not checks.failures.get("padding_ignored"):
            checks.ok("padding_ignored")
    rejected = sum(1 for r in results if r.status == "rejected")
    probed = sum(1 for r in results if r.status == "probed")
    checks.notes.setdefault("supports_answer", f"{len(drawn) - rejected} accepted, {rejected} rejected")
    if probed:
        checks.notes.setdefault("run_no_crash", f"{probed} accepted case(s) supports()-checked only (size budget or max_catalog_runs)")
    final = report(adapter.coverage, adapter.note, tuple(results), timings)
    logger.info("sglang-moe-plugins conformance: plugin %r: %s (%d cases run)", name, final.status, final.cases_run)
    return final
