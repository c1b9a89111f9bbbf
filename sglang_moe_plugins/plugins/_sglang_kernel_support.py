"""Checks shared by the plugins that launch SGLang's own CUDA kernels (``jit_ep``, ``fp8_fallback``)."""

from __future__ import annotations

from ..contract import Support
from ..hardware import Platform
from ..host_kernels import host_kernels_source

__all__ = ["cuda_host_kernels"]


def cuda_host_kernels(platform: Platform, min_sm: int | None = None) -> Support:
    """Yes when the call is on CUDA (at least ``sm{min_sm}``) and SGLang's kernels can be reached."""
    if not platform.is_cuda:
        return Support.no(f"requires a CUDA device, the call is on {platform}")
    if min_sm is not None and (platform.sm or 0) < min_sm:
        return Support.no(f"requires CUDA sm{min_sm}+, the device is sm{platform.sm}")
    source = host_kernels_source()
    if source is None:
        return Support.no("SGLang's kernels are not importable (install sglang, or install a HostKernels override)")
    return Support.yes(f"SGLang kernels from {source}")
