"""The ops that plugins implement. ``OPS`` maps op name to its :class:`OpSpec`."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from .base import OpSpec

__all__ = ["OPS", "OpSpec", "get_op"]


def _load() -> Mapping[str, OpSpec]:
    from . import silu_mul_quant

    specs = {silu_mul_quant.SPEC.name: silu_mul_quant.SPEC}
    try:
        from . import mega_moe
    except ImportError:  # pragma: no cover - only while the module is being written
        pass
    else:
        specs[mega_moe.SPEC.name] = mega_moe.SPEC
    return MappingProxyType(specs)


OPS: Mapping[str, OpSpec] = _load()


def get_op(name: str) -> OpSpec:
    """The spec of op ``name``; KeyError lists the known ops."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None
