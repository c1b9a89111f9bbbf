"""Temporary shim: the DeepGEMM MegaMoE plugins live in :mod:`sglang_moe_plugins.plugins.deep_gemm.plugin`.

The installed entry points (``sglang_moe_plugins.plugins.mega_deep_gemm:MegaW4A8Plugin`` ...) resolve here."""

from __future__ import annotations

from .deep_gemm.plugin import *  # noqa: F401,F403
from .deep_gemm.plugin import __all__  # noqa: F401
