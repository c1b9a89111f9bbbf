"""The conformance kit's shared vocabulary: what the suite and every op's adapter speak.

:class:`SuiteCase` (one drawn case), :class:`SuiteOptions` (what the suite draws and where it runs),
:class:`OpConformance` (what the suite needs from an op: cases, inputs, output checks; one adapter per op,
in :mod:`.ops`), the coverage levels, and :func:`poison`, the one poison helper of the suite and the tests.

The suite (:mod:`.suite`) finds an op's adapter through the op's spec (``OpSpec.conformance``). Another
op is covered when its op module (``sglang_moe_plugins.ops.<op>``) offers one:

- ``conformance``: an object implementing :class:`OpConformance` (full coverage), or
- ``cases_for_model(model, *, ep, platform) -> [(label, shape, config), ...]``: the suite then checks
  ``supports()`` (answers, determinism, cost) on those shapes but runs nothing ("supports-only").

Otherwise the op is reported as not covered by the suite yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..catalog import DEFAULT_ROWS
from ..errors import InvalidArgumentError
from ..hardware import Platform

__all__ = [
    "SuiteCase",
    "SuiteOptions",
    "OpConformance",
    "FULL",
    "SUPPORTS_ONLY",
    "NONE",
    "DEFAULT_CPU_MAX_ELEMENTS",
    "DEFAULT_CUDA_MAX_ELEMENTS",
    "DEFAULT_CPU_CATALOG_RUNS",
    "catalog_models",
    "POISON_FP8",
    "POISON_SCALE_INT",
    "poison",
]

FULL = "full"
SUPPORTS_ONLY = "supports-only"
NONE = "none"

#: Per-case size budget (input elements, E * N * 2D for silu_mul_quant) on CPU and on CUDA.
DEFAULT_CPU_MAX_ELEMENTS = 1 << 20
DEFAULT_CUDA_MAX_ELEMENTS = 1 << 27
#: Catalog cases run on CPU (the rest are supports()-checked only); all run on CUDA.
DEFAULT_CPU_CATALOG_RUNS = 24


@dataclass(frozen=True)
class SuiteCase:
    """One drawn case. ``execute`` False: only ``supports()`` is checked on it."""

    label: str
    origin: str  # "catalog", "edge", "random"
    shape: Any
    config: Any
    #: How the real rows are laid out (the masked_m pattern), e.g. "ragged", "empty".
    masked_m: str = ""
    seed: int = 0
    execute: bool = True
    #: Why the case is supports-only, or what it exercises.
    note: str = ""
    #: The caller lets the plugin overwrite its input workspace.
    inputs_writable: bool = False
    #: Cases of one group (e.g. one catalog model) are spread out when only some are run.
    group: str = ""


class OpConformance(Protocol):
    """The per-op part of the conformance suite.

    An adapter may also set ``max_cpu_catalog_runs`` (int): the number of catalog cases run on CPU
    when ``SuiteOptions.max_catalog_runs`` is None (default: the suite's own), and offer (each optional):

    - ``real_outputs(inputs, outputs, case) -> [(name, tensor)]``: the real part of the outputs, which
      the ``deterministic`` and ``padding_ignored`` checks compare bit for bit (default: every tensor);
    - ``repad(inputs, case) -> inputs | None``: a copy with other padding rows (None: the op has none);
    - ``make_fresh_inputs(case, fresh, device)``: the second call's inputs of the key (default:
      ``make_inputs(fresh, device)``, ``fresh`` being ``case`` with another seed);
    - ``cost(case) -> float``: relative run time, for the suite's time estimate.
    """

    op: str
    coverage: str  # FULL or SUPPORTS_ONLY
    note: str

    def cases(self, options: SuiteOptions, platform: Platform, seed: int) -> Sequence[SuiteCase]:
        """Every case to draw for ``platform`` (its configs must name that platform)."""

    def make_inputs(self, case: SuiteCase, device: torch.device) -> Any:
        """Fresh inputs for ``case`` on ``device`` (seeded by ``case.seed``)."""

    def allocate_outputs(self, case: SuiteCase, inputs: Any, device: torch.device) -> Any:
        """Preallocated outputs in the layout the host uses."""

    def poison(self, outputs: Any) -> None:
        """Fill outputs with values no plugin writes for real data."""

    def validate_outputs(self, outputs: Any, case: SuiteCase, plugin: str) -> None:
        """Raise when dtypes/shapes/strides/layouts are not the host's (the op's own validate_outputs)."""

    def snapshot(self, inputs: Any) -> Any:
        """A deep copy of the inputs, taken before run(): the ground truth of the checks below."""

    def inputs_changed(self, snapshot: Any, inputs: Any, case: SuiteCase) -> str | None:
        """None, or what the plugin changed in its inputs that it was not allowed to."""

    def find_unwritten(self, inputs: Any, outputs: Any, case: SuiteCase) -> str | None:
        """None, or where a real output still holds the poison (``inputs``: the snapshot)."""

    def compare(self, inputs: Any, outputs: Any, case: SuiteCase) -> str | None:
        """None when within the tolerance policy, else the first offending value (``inputs``: the snapshot)."""


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
    #: supports() must take less than this per call (median of every call), in microseconds.
    supports_budget_us: float = 1000.0
    #: No case's supports() may take longer than this per call (microseconds; the median of the case's
    #: calls, so one slow call decides nothing). Both limits are scaled up on a machine slower than the
    #: kit's reference (a calibration loop), and time spent waiting for a busy core is not counted. Once
    #: the median over 5+ cases is over it, the remaining cases are not asked (a costly supports() fails fast).
    supports_limit_us: float = 50_000.0
    #: Run at most this many of the accepted catalog cases, spread over the models (the others are
    #: supports()-checked only). None: 24 on CPU (or the op adapter's ``max_cpu_catalog_runs``), all on
    #: CUDA. Edge and random cases always run.
    max_catalog_runs: int | None = None
    #: Calls per run case on identical inputs for the ``deterministic`` check (2: the first call and one
    #: repeat). A plugin whose bits change on a fraction p of calls is caught with probability
    #: 1 - (1 - p) ** ((repeats - 1) * cases run); raise it to hunt rare nondeterminism.
    repeats: int = 2

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
        if self.models is not None and (
            not isinstance(self.models, tuple) or not all(isinstance(m, str) for m in self.models)
        ):
            raise bad("models", "None or a tuple of model names")
        for field in ("max_elements", "max_catalog_runs"):
            value = getattr(self, field)
            if value is not None and not (positive_int(value) or (field == "max_catalog_runs" and value == 0)):
                raise bad(field, "None or a positive int")
        for field in ("supports_budget_us", "supports_limit_us"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise bad(field, "a number > 0")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 2:
            raise bad("repeats", "an int >= 2")
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


#: NaN in float8_e4m3fn: what every output byte holds before the plugin runs.
POISON_FP8 = 0x7F
#: Every byte 0xFF (NaN in UE8M0): what packed scales hold before the plugin runs.
POISON_SCALE_INT = -1


def catalog_models(options: SuiteOptions, catalog: Sequence[Any]) -> list[Any]:
    """The catalog models the suite draws: ``options.models`` (looked up by name), else every model of ``catalog``."""
    if options.models is None:
        return list(catalog)
    from ..catalog import get_model

    return [get_model(name) for name in options.models]


def poison(outputs: Any) -> None:
    """Fill every tensor of an op's outputs (a dataclass of tensors) with values no plugin writes for
    a real row: FP8 bytes ``POISON_FP8`` (NaN), integer words ``POISON_SCALE_INT`` (packed UE8M0
    scales: NaN), floating point NaN. The one poison helper of the conformance suite and the tests
    (``silu_mul_quant``: ``out``, ``scale``; ``mega_moe``: ``y``)."""
    for field in dataclasses.fields(outputs):
        value = getattr(outputs, field.name)
        if not isinstance(value, torch.Tensor):
            continue
        if value.element_size() == 1 and value.is_floating_point():
            value.view(torch.uint8).fill_(POISON_FP8)
        elif value.is_floating_point():
            value.fill_(float("nan"))
        else:
            value.fill_(POISON_SCALE_INT)
