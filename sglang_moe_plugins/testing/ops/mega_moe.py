"""The conformance adapter of op ``mega_moe`` and its tolerance policy.

The cases and their inputs are drawn by :mod:`.mega_moe_cases`; ``y`` is poisoned with NaN before
``run()``.

Tolerance policy (:data:`MEGA_TOLERANCE`): the oracle is ``mega_reference``'s emulation
(:func:`~sglang_moe_plugins.ops.mega_moe_numerics.mega_moe_reference`, itself tested against an
independent fp64 computation) run on a snapshot of the same inputs. A plugin passes when the relative
L2 error over all real rows is at most ``1e-2`` (the bound the GPU tests hold the DeepGEMM kernels
to: fp32 vs tensor-core accumulation order and the rare requantization flip it causes), and every
token row is within ``5e-2`` relative L2 of its reference row plus ``1e-3 * sqrt(hidden)`` (so one
wrong row cannot hide in a large batch; a masked token's row must be ~0).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import OutputValidationError
from ...hardware import Platform
from ...ops import mega_moe as mm
from ...ops.mega_moe.reference import mega_moe_reference
from ..case import FULL, SuiteCase, SuiteOptions, poison
from .mega_moe_cases import MAX_CPU_CATALOG_RUNS, draw_cases, make_inputs, parse_batch

__all__ = [
    "MegaMoEConformance",
    "MegaTolerance",
    "MEGA_TOLERANCE",
    "compare_rows",
    "find_unwritten_rows",
    "compare_with_reference",
]


@dataclass(frozen=True)
class MegaTolerance:
    """How far ``y`` may be from ``mega_reference``'s (see the module docstring)."""

    #: Relative L2 error over every real row.
    total_rtol: float = 1e-2
    #: Relative L2 error of one token's row ...
    row_rtol: float = 5e-2
    #: ... plus this times sqrt(hidden) (absolute, for rows that are ~0).
    row_atol: float = 1e-3

    def describe(self) -> str:
        return (
            f"relative L2 over all rows <= {self.total_rtol:g}, per row <= {self.row_rtol:g} x |ref row| "
            f"+ {self.row_atol:g} x sqrt(hidden)"
        )


MEGA_TOLERANCE = MegaTolerance()


def find_unwritten_rows(y: torch.Tensor, num_tokens: int) -> str | None:
    """None when rows ``[:num_tokens]`` of ``y`` hold no NaN (the poison); else the first such row."""
    if num_tokens == 0:
        return None
    bad = torch.isnan(y[:num_tokens].float().cpu()).any(-1)
    if not bad.any():
        return None
    row = int(bad.nonzero()[0, 0])
    return f"y row {row} (token {row} of {num_tokens}) still holds the NaN poison written before run(): {int(bad.sum())} token row(s) not written"


def compare_with_reference(
    inputs: mm.MegaMoEInputs,
    y: torch.Tensor,
    shape: mm.MegaMoEShape,
    config: mm.MegaMoEConfig,
    tolerance: MegaTolerance = MEGA_TOLERANCE,
) -> str | None:
    """None when ``y[:T]`` is within ``tolerance`` of ``mega_reference`` on ``inputs``; else the first offence."""
    num_tokens = inputs.num_tokens
    if num_tokens == 0:
        return None
    expected = mm.allocate_outputs(shape, config, inputs.device, num_tokens=num_tokens)
    mega_moe_reference(inputs, expected, shape, config)
    return compare_rows(y[:num_tokens], expected.y[:num_tokens], inputs.topk_ids, shape.hidden, tolerance)


def compare_rows(
    y: torch.Tensor,
    reference: torch.Tensor,
    topk_ids: torch.Tensor | None,
    hidden: int,
    tolerance: MegaTolerance = MEGA_TOLERANCE,
) -> str | None:
    """None when the rows ``y`` are within ``tolerance`` of ``reference`` (same row count); else the first offence."""
    ref = reference.double().cpu()
    got = y.double().cpu()
    if got.shape[0] == 0:
        return None
    if not torch.isfinite(got).all():
        row = int((~torch.isfinite(got)).any(-1).nonzero()[0, 0])
        return f"y row {row} holds a non-finite value ({tolerance.describe()})"
    err = (got - ref).norm(dim=-1)
    bound = tolerance.row_rtol * ref.norm(dim=-1) + tolerance.row_atol * math.sqrt(hidden)
    if (err > bound).any():
        row = int((err > bound).nonzero()[0, 0])
        ids = topk_ids[row].tolist() if topk_ids is not None else []
        return (
            f"y row {row} (experts {ids}) is {err[row].item():.4g} from the reference (L2), over the bound "
            f"{bound[row].item():.4g} (|ref row| {ref[row].norm().item():.4g}); {int((err > bound).sum())} row(s) off; "
            f"{tolerance.describe()}"
        )
    total = ref.norm().item()
    rel = (got - ref).norm().item() / total if total > 0 else 0.0
    if rel > tolerance.total_rtol:
        return f"relative L2 error of y {rel:.3g} > {tolerance.total_rtol:g} ({tolerance.describe()})"
    return None


class MegaMoEConformance:
    """The full conformance adapter of ``mega_moe``."""

    op = mm.OP
    coverage = FULL
    note = ""
    #: Catalog cases run on CPU when ``SuiteOptions.max_catalog_runs`` is None.
    max_cpu_catalog_runs = MAX_CPU_CATALOG_RUNS

    def cases(self, options: SuiteOptions, platform: Platform, seed: int) -> Sequence[SuiteCase]:
        return draw_cases(options, platform, seed)

    # -- inputs and outputs ----------------------------------------------------------------------
    def make_inputs(self, case: SuiteCase, device: torch.device) -> mm.MegaMoEInputs:
        return make_inputs(case, device)

    def allocate_outputs(self, case: SuiteCase, inputs: mm.MegaMoEInputs, device: torch.device) -> mm.MegaMoEOutputs:
        return mm.allocate_outputs(case.shape, case.config, device, num_tokens=inputs.num_tokens)

    def poison(self, outputs: mm.MegaMoEOutputs) -> None:
        poison(outputs)  # y: NaN

    def validate_outputs(self, outputs: Any, case: SuiteCase, plugin: str) -> None:
        mm.validate_outputs(outputs, case.shape, case.config, plugin)
        tokens, _ = parse_batch(case.masked_m)
        if outputs.y.shape[0] < max(tokens, 1):
            raise OutputValidationError(
                f"plugin {plugin!r} returned y.shape={tuple(outputs.y.shape)}, the host requires at least max(num_tokens, 1) = {max(tokens, 1)} rows"
            )

    def cost(self, case: SuiteCase) -> float:
        """Relative run time of a case (for the suite's time estimate): weight elements decoded plus
        token-slot GEMM work."""
        shape = case.shape
        tokens, _ = parse_batch(case.masked_m)
        work = 3 * shape.hidden * shape.intermediate * (shape.num_experts + tokens * shape.top_k)
        return 1e5 + work * (4 if case.config.variant == "sm90_fp8" else 1)

    def real_outputs(
        self, inputs: mm.MegaMoEInputs, outputs: mm.MegaMoEOutputs, case: SuiteCase
    ) -> list[tuple[str, torch.Tensor]]:
        """The token rows ``y[:T]`` (what the determinism check compares)."""
        return [("y", outputs.y[: inputs.num_tokens])]

    # -- checks ----------------------------------------------------------------------------------
    def snapshot(self, inputs: mm.MegaMoEInputs) -> mm.MegaMoEInputs:
        def pair(p: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor] | None:
            return None if p is None else (p[0].clone(), p[1].clone())

        return dataclasses.replace(
            inputs,
            hidden_states=inputs.hidden_states.clone(),
            topk_ids=None if inputs.topk_ids is None else inputs.topk_ids.clone(),
            topk_weights=None if inputs.topk_weights is None else inputs.topk_weights.clone(),
            l1_weights=pair(inputs.l1_weights),  # type: ignore[arg-type]  # None in, None out
            l2_weights=pair(inputs.l2_weights),  # type: ignore[arg-type]  # None in, None out
            shared_l1_weights=pair(inputs.shared_l1_weights),
            shared_l2_weights=pair(inputs.shared_l2_weights),
        )

    def inputs_changed(self, snapshot: mm.MegaMoEInputs, inputs: mm.MegaMoEInputs, case: SuiteCase) -> str | None:
        def tensors(x: mm.MegaMoEInputs) -> list[tuple[str, torch.Tensor | None]]:
            out: list[tuple[str, torch.Tensor | None]] = [
                ("hidden_states", x.hidden_states),
                ("topk_ids", x.topk_ids),
                ("topk_weights", x.topk_weights),
            ]
            for name in ("l1_weights", "l2_weights", "shared_l1_weights", "shared_l2_weights"):
                p = getattr(x, name)
                out += [(f"{name}[0]", None if p is None else p[0]), (f"{name}[1]", None if p is None else p[1])]
            return out

        for (name, before), (_, after) in zip(tensors(snapshot), tensors(inputs)):
            if before is None or after is None:
                if before is not after:
                    return f"{name} was replaced"
                continue
            if before.shape != after.shape or before.dtype != after.dtype:
                return f"{name} changed shape/dtype"
            if before.numel() and not torch.equal(
                before.reshape(-1).view(torch.uint8), after.reshape(-1).view(torch.uint8)
            ):
                return f"{name} changed during run(); the host reuses it"
        return None

    def find_unwritten(self, inputs: mm.MegaMoEInputs, outputs: mm.MegaMoEOutputs, case: SuiteCase) -> str | None:
        return find_unwritten_rows(outputs.y, inputs.num_tokens)

    def compare(self, inputs: mm.MegaMoEInputs, outputs: mm.MegaMoEOutputs, case: SuiteCase) -> str | None:
        return compare_with_reference(inputs, outputs.y, case.shape, case.config)
