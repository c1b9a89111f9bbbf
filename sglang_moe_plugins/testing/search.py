"""Cases drawn from what the plugin supports, and coverage reported per dimension.

The blind draw (catalog, edge and random cases) is asked first. When the op's adapter offers
``dimensions`` (every value of every dimension to see run), ``dimensions_of(case)``,
``variant(template, dimension, value, budget)`` and ``redraw(rng, template, budget)``, the suite then:

- for each dimension value no accepted case covers, asks about variants of accepted cases (the
  templates, smallest first) with that one dimension moved, and keeps the first one accepted;
- for each random case the plugin declined, redraws a random case around a template, up to
  :data:`REDRAWS` times;

and, once the cases ran, reports per dimension which values ran, which the plugin declined (every
variant asked was refused) and which were accepted but not run (over the size budget) or could not be
asked. Coverage is "full" only when every value ran or was declined.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from .case import SuiteCase
from .report import DimensionCoverage

__all__ = ["REDRAWS", "TEMPLATES", "search_support", "dimension_coverage"]

#: Redraws of a declined random case around the plugin's accepted cases.
REDRAWS = 8
#: Accepted cases tried as templates for a missing dimension value.
TEMPLATES = 6


def _searchable(adapter: Any) -> bool:
    return all(callable(getattr(adapter, name, None)) for name in ("dimensions_of", "variant", "redraw")) and (
        isinstance(getattr(adapter, "dimensions", None), dict)
    )


def search_support(
    adapter: Any,
    drawn: list[SuiteCase],
    answers: dict[int, Any],
    ask: Callable[[SuiteCase], Any],
    budget: int,
    seed: int,
) -> tuple[list[SuiteCase], dict[tuple[str, str], int]]:
    """New cases inside the plugin's support (each already asked: ``answers`` holds its answer), and how
    many variants were asked per missing (dimension, value)."""
    if not _searchable(adapter):
        return [], {}
    rng = random.Random(seed ^ 0x5EA2C4)
    added: list[SuiteCase] = []
    asked: dict[tuple[str, str], int] = {}
    seen = {(c.shape, c.config, c.masked_m, c.inputs_writable) for c in drawn}
    counter = iter(range(1, 1 << 30))

    def accepted() -> list[SuiteCase]:
        cases = [c for c in [*drawn, *added] if c.execute and answers[id(c)][0]]
        cost = getattr(adapter, "cost", None)
        return sorted(cases, key=lambda c: float(cost(c))) if callable(cost) else cases

    def try_case(label: str, origin: str, found: tuple[Any, Any, str, bool], note: str) -> bool | None:
        shape, config, pattern, writable = found
        key = (shape, config, pattern, writable)
        if key in seen:
            return None
        seen.add(key)
        case_seed = (seed * 1_000_033 + 7919 * next(counter)) % (1 << 31)
        case = SuiteCase(label, origin, shape, config, pattern, case_seed, True, note, writable, "search")
        answers[id(case)] = ask(case)
        added.append(case)
        return bool(answers[id(case)][0])

    def covered() -> set[tuple[str, str]]:
        return {(d, v) for c in accepted() for d, values in adapter.dimensions_of(c).items() for v in values}

    templates = accepted()
    if not templates:
        return [], {}
    have = covered()
    for dimension, values in adapter.dimensions.items():
        for value in values:
            if (dimension, value) in have:
                continue
            tried = 0
            for template in _distinct(templates)[:TEMPLATES]:
                found = adapter.variant(template, dimension, value, budget)
                if found is None:
                    continue
                answer = try_case(
                    f"{dimension}={value} (from {template.label})",
                    "search",
                    found,
                    f"searched: {template.label} with {dimension} = {value}",
                )
                if answer is None:
                    continue
                tried += 1
                if answer:
                    have |= covered()
                    break
            asked[(dimension, value)] = tried
    for case in [c for c in drawn if c.origin == "random" and c.execute and not answers[id(c)][0]]:
        pool = accepted()
        for _ in range(REDRAWS):
            found = adapter.redraw(rng, rng.choice(pool[: 4 * TEMPLATES]), budget)
            if found is None:
                continue
            answer = try_case(
                f"{case.label}, redrawn inside the support", "random", found, "redrawn around an accepted case"
            )
            if answer:
                break
    return added, asked


def _distinct(cases: list[SuiteCase]) -> list[SuiteCase]:
    """One case per (shape, config) pair: templates differing in more than their masked_m pattern."""
    out, seen = [], set()
    for case in cases:
        key = (case.shape, case.config)
        if key not in seen:
            seen.add(key)
            out.append(case)
    return out


def dimension_coverage(
    adapter: Any, cases: list[SuiteCase], statuses: dict[int, str], asked: dict[tuple[str, str], int]
) -> tuple[DimensionCoverage, ...]:
    """Per dimension: the values that ran, that the plugin declined, and that were not run."""
    if not _searchable(adapter):
        return ()
    ran: dict[str, set[str]] = {d: set() for d in adapter.dimensions}
    accepted: dict[str, set[str]] = {d: set() for d in adapter.dimensions}
    rejected: dict[str, set[str]] = {d: set() for d in adapter.dimensions}
    for case in cases:
        status = statuses.get(id(case), "")
        for dimension, values in adapter.dimensions_of(case).items():
            target = ran if status in ("passed", "failed") else accepted if status == "probed" else rejected
            if status in ("passed", "failed", "probed", "rejected"):
                target[dimension] |= values
    out = []
    for dimension, values in adapter.dimensions.items():
        done = [v for v in values if v in ran[dimension]]
        declined = [
            v for v in values if v not in ran[dimension] and v not in accepted[dimension] and v in rejected[dimension]
        ]
        missing = [v for v in values if v not in done and v not in declined]
        out.append(DimensionCoverage(dimension, tuple(done), tuple(declined), tuple(missing)))
    return tuple(out)
