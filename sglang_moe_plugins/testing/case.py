"""What the suite needs from an op: cases, inputs, output checks. One adapter per op.

The suite itself (:mod:`.suite`) is op-agnostic: it asks :func:`conformance_for` for the op's adapter.
``silu_mul_quant`` (:mod:`.silu_mul_quant`) and ``mega_moe`` (:mod:`.mega_moe`) have full adapters
in this package. Another op is covered when its op module (``sglang_moe_plugins.ops.<op>``) offers one:

- ``conformance``: an object implementing :class:`OpConformance` (full coverage), or
- ``cases_for_model(model, *, ep, platform) -> [(label, shape, config), ...]``: the suite then checks
  ``supports()`` (answers, determinism, cost) on those shapes but runs nothing ("supports-only").

Otherwise the op is reported as not covered by the suite yet.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from ..hardware import Platform

if TYPE_CHECKING:
    from .suite import SuiteOptions

__all__ = ["SuiteCase", "OpConformance", "SupportsOnlyConformance", "conformance_for", "FULL", "SUPPORTS_ONLY", "NONE"]

FULL = "full"
SUPPORTS_ONLY = "supports-only"
NONE = "none"


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

    def cases(self, options: "SuiteOptions", platform: Platform, seed: int) -> Sequence[SuiteCase]:
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


class SupportsOnlyConformance:
    """Cases from an op module's ``cases_for_model``; nothing is run (no inputs, no tolerance policy)."""

    coverage = SUPPORTS_ONLY

    def __init__(self, op: str, cases_for_model: Any):
        self.op = op
        self._cases_for_model = cases_for_model
        self.note = (
            f"ops.{op} offers shapes (cases_for_model) but no input generator or tolerance policy "
            "(a 'conformance' object): supports() is checked, run() is not exercised by the suite yet"
        )

    def cases(self, options: "SuiteOptions", platform: Platform, seed: int) -> Sequence[SuiteCase]:
        from ..catalog import load_catalog

        cases = []
        for model in _models(options, load_catalog()):
            for ep in options.eps:
                if model.experts % ep:
                    continue
                for label, shape, config in self._cases_for_model(model, ep=ep, platform=platform):
                    cases.append(SuiteCase(label, "catalog", shape, config, seed=seed, execute=False, note=self.note))
        return cases


def _models(options: "SuiteOptions", catalog: Sequence[Any]) -> list[Any]:
    if options.models is None:
        return list(catalog)
    from ..catalog import get_model

    return [get_model(name) for name in options.models]


def conformance_for(op: str) -> OpConformance | None:
    """The adapter of ``op``, or None when the suite does not cover the op yet."""
    if op == "silu_mul_quant":
        from .silu_mul_quant import SiluMulQuantConformance

        return SiluMulQuantConformance()
    if op == "mega_moe":
        from .mega_moe import MegaMoEConformance

        return MegaMoEConformance()
    try:
        module = importlib.import_module(f"sglang_moe_plugins.ops.{op}")
    except ImportError:
        return None
    adapter = getattr(module, "conformance", None)
    if adapter is not None:
        return adapter
    builder = getattr(module, "cases_for_model", None)
    if callable(builder):
        return SupportsOnlyConformance(op, builder)
    return None
