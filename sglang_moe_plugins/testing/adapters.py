"""Finding an op's conformance adapter (:func:`conformance_for`, through the op's spec) and the adapter of
an op that offers shapes only (:class:`SupportsOnlyConformance`). Public through :mod:`.suite`."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from ..hardware import Platform
from ..ops import OPS
from .case import SUPPORTS_ONLY, OpConformance, SuiteCase, SuiteOptions, catalog_models

__all__ = ["conformance_for", "SupportsOnlyConformance"]


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

    def cases(self, options: SuiteOptions, platform: Platform, seed: int) -> Sequence[SuiteCase]:
        from ..catalog import load_catalog

        cases = []
        for model in catalog_models(options, load_catalog()):
            for ep in options.eps:
                if model.experts % ep:
                    continue
                for label, shape, config in self._cases_for_model(model, ep=ep, platform=platform):
                    cases.append(SuiteCase(label, "catalog", shape, config, seed=seed, execute=False, note=self.note))
        return cases


def conformance_for(op: str) -> OpConformance | None:
    """The adapter of ``op``, or None when the suite does not cover the op yet.

    The op's spec names its adapter factory (``OpSpec.conformance``, ``"module:attr"``, imported here on
    first use). Without one, the op module's ``conformance`` object or ``cases_for_model`` builder.
    """
    spec = OPS.get(op)
    factory = getattr(spec, "conformance", None)
    if factory:
        module, _, attr = factory.partition(":")
        return getattr(importlib.import_module(module), attr)()
    try:
        module = importlib.import_module(f"sglang_moe_plugins.ops.{op}")
    except ImportError:
        return None
    adapter = getattr(module, "conformance", None)
    if adapter is not None:
        return adapter
    builder = getattr(module, "cases_for_model", None)
    if callable(builder):
        return SupportsOnlyConformance(op, builder)  # type: ignore[return-value]  # supports-only: no run-side members
    return None
