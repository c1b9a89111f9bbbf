"""Temporary shim: which sgl-deep-gemm MegaMoE API is installed is read in
:mod:`sglang_moe_plugins.plugins.deep_gemm.api`."""

from __future__ import annotations

from .plugins.deep_gemm.api import *  # noqa: F401,F403
from .plugins.deep_gemm.api import __all__  # noqa: F401
