"""Temporary shim: the SM90 GEMM emulation of op ``mega_moe`` lives in :mod:`sglang_moe_plugins.ops.mega_moe.sm90`."""

from __future__ import annotations

from .mega_moe.sm90 import *  # noqa: F401,F403
from .mega_moe.sm90 import __all__, _aligned_step  # noqa: F401
