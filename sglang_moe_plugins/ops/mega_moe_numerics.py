"""Temporary shim: the torch numerics of op ``mega_moe`` live in :mod:`sglang_moe_plugins.ops.mega_moe.formats`
(pre-dispatch formats, weight layouts) and :mod:`sglang_moe_plugins.ops.mega_moe.reference` (the reference
forward). This path keeps working (its ``__all__`` is covered by contract version 2)."""

from __future__ import annotations

from ..quant import ue8m0_exponent  # noqa: F401 - read through this module by tests
from .mega_moe.activation import swiglu as _swiglu  # noqa: F401
from .mega_moe.formats import *  # noqa: F401,F403
from .mega_moe.formats import __all__ as _formats_all
from .mega_moe.reference import mega_moe_reference

__all__ = [*_formats_all, "mega_moe_reference"]
