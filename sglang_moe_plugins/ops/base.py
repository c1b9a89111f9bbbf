"""What every op module provides to the registry, the selector and the conformance kit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["OpSpec"]


@dataclass(frozen=True)
class OpSpec:
    """Describes one op: how its outputs are made and checked, and how the selector treats failures."""

    name: str
    #: ``allocate_outputs(shape, config, device) -> outputs``
    allocate_outputs: Callable[..., Any]
    #: ``validate_outputs(outputs, shape, config, plugin) -> None``; raises OutputValidationError.
    validate_outputs: Callable[..., None]
    #: ``output_allocator(shape, config) -> (device -> outputs)``: sizes, strides and dtypes worked out
    #: once per shape key, so that a call only allocates. None: ``allocate_outputs`` on every call.
    output_allocator: Callable[..., Callable[[Any], Any]] | None = None
    #: Every rank runs the op's kernel together (a collective): a plugin that fails at run time is
    #: never replaced by another plugin on one rank only; the error is raised on that rank.
    collective: bool = False
    #: The op's shape dataclass (its integer fields are what ``[[priority_rules]]`` bounds match on).
    shape_type: type | None = None
