"""Temporary re-export: ``cuda_host_kernels`` lives in :mod:`sglang_moe_plugins.plugins.sglang_kernels.host`."""

from .sglang_kernels.host import cuda_host_kernels  # noqa: F401

__all__ = ["cuda_host_kernels"]
