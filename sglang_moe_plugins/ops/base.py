"""What every op module provides to the registry, the selector and the conformance kit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["OpSpec"]


@dataclass(frozen=True)
class OpSpec:
    """Describes one op: its value types and the checks that the selector runs around a plugin."""

    name: str
    summary: str
    shape_type: type
    config_type: type
    inputs_type: type
    outputs_type: type
    #: ``allocate_outputs(shape, config, device) -> outputs``
    allocate_outputs: Callable[..., Any]
    #: ``validate_outputs(outputs, shape, config, plugin) -> None``; raises OutputValidationError.
    validate_outputs: Callable[..., None]
