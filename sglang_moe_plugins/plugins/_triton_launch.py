"""Temporary re-export: the shared Triton launch pieces live in :mod:`sglang_moe_plugins.plugins.triton_common`."""

from .triton_common import *  # noqa: F401,F403
from .triton_common import (  # noqa: F401
    ALIGNMENT,
    LowLevelLaunch,
    compile_specialisation,
    next_pow2,
    ordered_arguments,
    pdl_supported,
    triton_has_pdl,
)

__all__ = ["next_pow2", "pdl_supported", "triton_has_pdl", "LowLevelLaunch", "ordered_arguments", "compile_specialisation"]
