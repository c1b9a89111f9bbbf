"""Temporary re-export: the ``jit_ep`` plugin lives in :mod:`sglang_moe_plugins.plugins.sglang_kernels.jit_ep`."""

from .sglang_kernels.jit_ep import *  # noqa: F401,F403
from .sglang_kernels.jit_ep import MAX_EXPERTS, MAX_HIDDEN, JitEpPlugin  # noqa: F401

__all__ = ["JitEpPlugin", "MAX_EXPERTS", "MAX_HIDDEN"]
