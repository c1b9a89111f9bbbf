"""Temporary re-export: the ``fp8_fallback`` plugin lives in
:mod:`sglang_moe_plugins.plugins.sglang_kernels.fp8_fallback`."""

from .sglang_kernels.fp8_fallback import *  # noqa: F401,F403
from .sglang_kernels.fp8_fallback import GROUP_SIZES, Fp8FallbackPlugin  # noqa: F401

__all__ = ["Fp8FallbackPlugin", "GROUP_SIZES"]
