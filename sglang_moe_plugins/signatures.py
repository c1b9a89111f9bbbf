"""The one place that reads function signatures: SGLang's hook targets, sgl-deep-gemm's API (imported, or
read from a wheel's source with ``ast``) and the keywords a host function takes."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["parameter_names", "accepted_keywords", "ast_parameter_names"]


def parameter_names(function: Callable[..., Any]) -> tuple[str, ...]:
    """The names of ``function``'s parameters, in order; ``TypeError``/``ValueError`` when it has no
    inspectable signature (as :func:`inspect.signature`)."""
    return tuple(inspect.signature(function).parameters)


def accepted_keywords(function: Callable[..., Any], candidates: Iterable[str]) -> frozenset[str] | None:
    """The ``candidates`` that ``function`` takes as keywords (all of them when it has ``**kwargs``);
    None when its signature cannot be read."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return frozenset(candidates)
    return frozenset(k for k in candidates if k in parameters)


def ast_parameter_names(args: ast.arguments) -> tuple[str, ...]:
    """The parameter names of a function definition read with ``ast`` (positional-only, positional,
    keyword-only; not ``*args``/``**kwargs``), as :func:`parameter_names` gives them for the same code."""
    return tuple(a.arg for a in args.posonlyargs + args.args + args.kwonlyargs)
