"""Temporary shim: a MegaMoE variant's launch closure is built in :mod:`sglang_moe_plugins.plugins.deep_gemm.launch`;
SGLang's helpers are looked up in :mod:`sglang_moe_plugins.plugins.deep_gemm.sglang_host`."""

from __future__ import annotations

from .deep_gemm.launch import build_launch
from .deep_gemm.sglang_host import _SGLANG_HOST_MODULE, _host_buffer_keywords, host_helpers  # noqa: F401

__all__ = ["build_launch", "host_helpers"]
