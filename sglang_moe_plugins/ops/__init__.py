"""The ops that plugins implement. ``OPS`` maps op name to its :class:`OpSpec`."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from . import mega_moe, silu_mul_quant, silu_mul_quant_contig
from .base import OpSpec

__all__ = ["OPS", "OpSpec", "get_op"]

OPS: Mapping[str, OpSpec] = MappingProxyType(
    {spec.name: spec for spec in (silu_mul_quant.SPEC, mega_moe.SPEC, silu_mul_quant_contig.SPEC)}
)


def get_op(name: str) -> OpSpec:
    """The spec of op ``name``; KeyError lists the known ops."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None
