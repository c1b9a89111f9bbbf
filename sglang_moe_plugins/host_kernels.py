"""Temporary re-export: the host kernels live in :mod:`sglang_moe_plugins.plugins.sglang_kernels.host`."""

from .plugins.sglang_kernels.host import *  # noqa: F401,F403
from .plugins.sglang_kernels.host import HostKernels, get_host_kernels, host_kernels_source, use_host_kernels  # noqa: F401

__all__ = ["HostKernels", "get_host_kernels", "use_host_kernels", "host_kernels_source"]
