"""Temporary shim: this project's MegaMoE pre-dispatch (Triton) lives in
:mod:`sglang_moe_plugins.plugins.deep_gemm.pre_dispatch_triton` (the kernel in ``.pre_dispatch_kernel``)."""

from __future__ import annotations

from .deep_gemm.pre_dispatch_kernel import pre_dispatch_kernel as _kernel  # noqa: F401
from .deep_gemm.pre_dispatch_triton import *  # noqa: F401,F403
from .deep_gemm.pre_dispatch_triton import (  # noqa: F401 - read through this module by tests and benchmarks
    __all__,
    _arguments,
    _pointer,
    _use_pdl,
    next_pow2,
    pdl_supported,
)
