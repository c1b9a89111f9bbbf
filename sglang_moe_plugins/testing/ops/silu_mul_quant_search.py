"""Cases drawn from what a ``silu_mul_quant`` plugin supports: the dimensions the suite must see run, and
variants of an accepted case that move one dimension (used by :mod:`..search`).

A narrow plugin (one group size, D a multiple of 512, no swizzle) declines most blindly drawn cases; the
suite then takes the cases it accepted as templates and asks about each template with one dimension
changed (``keep_fp32`` on, the input writable, E = 0, N = 0, a tall expert, a prefill-size N, every
scale layout, group size and masked_m pattern), and redraws random cases around the templates. Each
variant fits the size budget (E is reduced first, then N), so an accepted one runs.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from ...ops import silu_mul_quant as smq
from ..case import SuiteCase
from .silu_mul_quant_cases import MASKED_PATTERNS, case_elements

__all__ = ["DIMENSIONS", "dimensions_of", "variant", "redraw"]

#: Every value of every dimension the suite wants to see run (or declined by the plugin).
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "group_size": tuple(str(g) for g in smq.GROUP_SIZES),
    "scale_layout": tuple(smq.SCALE_LAYOUTS),
    "swizzle": ("off", "on"),
    "swiglu_limit": ("none", "set"),
    "keep_fp32": ("off", "on"),
    "gateup_writable": ("no", "yes"),
    "experts": ("0", "1", "2+"),
    "rows": ("0", "1-64", "65-256", "257+ (tall expert)", "1024+ (prefill)"),
    "masked_m": MASKED_PATTERNS,
}

#: An N for each value of the ``rows`` dimension (the masked_m pattern makes expert 0 hold N real rows).
_ROWS_FOR = {"0": 0, "1-64": 6, "65-256": 100, "257+ (tall expert)": 320, "1024+ (prefill)": 1024}


def _rows_bin(n: int) -> str:
    if n == 0:
        return "0"
    if n <= 64:
        return "1-64"
    if n <= 256:
        return "65-256"
    return "1024+ (prefill)" if n >= 1024 else "257+ (tall expert)"


def dimensions_of(case: SuiteCase) -> dict[str, set[str]]:
    """The value of each dimension ``case`` exercises (a tall or prefill-size N also counts as tall)."""
    shape, config = case.shape, case.config
    rows = {_rows_bin(shape.max_rows)}
    if shape.max_rows >= 1024:
        rows.add("257+ (tall expert)")
    e = shape.num_experts
    return {
        "group_size": {str(shape.group_size)},
        "scale_layout": {config.scale_layout},
        "swizzle": {"on" if config.swizzle else "off"},
        "swiglu_limit": {"none" if config.swiglu_limit is None else "set"},
        "keep_fp32": {"on" if config.keep_fp32 else "off"},
        "gateup_writable": {"yes" if case.inputs_writable else "no"},
        "experts": {"0" if e == 0 else "1" if e == 1 else "2+"},
        "rows": rows,
        "masked_m": {case.masked_m or "ragged"},
    }


def _fit(shape: smq.SiluMulQuantShape, budget: int, keep_rows: bool) -> smq.SiluMulQuantShape | None:
    """``shape`` within the size budget: fewer experts first, then (unless ``keep_rows``) fewer rows."""
    while case_elements(shape) > budget and shape.num_experts > 1:
        shape = dataclasses.replace(shape, num_experts=max(1, shape.num_experts // 2))
    while not keep_rows and case_elements(shape) > budget and shape.max_rows > 1:
        shape = dataclasses.replace(shape, max_rows=max(1, shape.max_rows // 2))
    return shape if case_elements(shape) <= budget else None


def variant(template: SuiteCase, dimension: str, value: str, budget: int) -> tuple[Any, Any, str, bool] | None:
    """(shape, config, masked_m pattern, writable): ``template`` with ``dimension`` set to ``value``,
    within ``budget`` input elements; None when no valid case fits."""
    try:
        return _variant(template, dimension, value, budget)
    except Exception:  # noqa: BLE001 - an invalid combination (the op's own validation): no variant
        return None


def _variant(template: SuiteCase, dimension: str, value: str, budget: int) -> tuple[Any, Any, str, bool] | None:
    shape, config = template.shape, template.config
    pattern, writable = template.masked_m or "ragged", template.inputs_writable
    keep_rows = False
    if dimension == "group_size":
        group = int(value)
        hidden = shape.hidden if shape.hidden % group == 0 else shape.num_groups * group
        shape = dataclasses.replace(shape, group_size=group, hidden=hidden)
    elif dimension == "scale_layout":
        config = dataclasses.replace(config, scale_layout=value)
    elif dimension == "swizzle":
        config = dataclasses.replace(config, swizzle=value == "on")
    elif dimension == "swiglu_limit":
        config = dataclasses.replace(config, swiglu_limit=None if value == "none" else 10.0)
    elif dimension == "keep_fp32":
        config = dataclasses.replace(config, keep_fp32=value == "on")
    elif dimension == "gateup_writable":
        writable = value == "yes"
    elif dimension == "experts":
        experts = {"0": 0, "1": 1}.get(value, max(2, shape.num_experts))
        shape = dataclasses.replace(shape, num_experts=experts)
        pattern = "empty" if experts == 0 else pattern
    elif dimension == "rows":
        rows = _ROWS_FOR[value]
        shape = dataclasses.replace(shape, max_rows=rows)
        pattern = "empty" if rows == 0 else "ragged"
        keep_rows = True
    elif dimension == "masked_m":
        pattern = value
    else:
        return None
    fitted = _fit(shape, budget, keep_rows)
    if fitted is None:
        return None
    return fitted, config, pattern, writable


def redraw(rng: random.Random, template: SuiteCase, budget: int) -> tuple[Any, Any, str, bool] | None:
    """A random case around ``template``: two to four of its dimensions moved to random values."""
    dims = list(DIMENSIONS)
    rng.shuffle(dims)
    drawn: tuple[Any, Any, str, bool] | None = None
    current = template
    for dimension in dims[: rng.randint(2, 4)]:
        value = rng.choice(DIMENSIONS[dimension])
        if dimension == "rows" and value in ("0", "1024+ (prefill)") and rng.random() < 0.7:
            value = "1-64"
        moved = variant(current, dimension, value, budget)
        if moved is None:
            continue
        drawn = moved
        shape, config, pattern, writable = moved
        current = dataclasses.replace(current, shape=shape, config=config, masked_m=pattern, inputs_writable=writable)
    return drawn
