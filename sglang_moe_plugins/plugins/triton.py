"""Temporary re-export: the ``triton`` plugin lives in :mod:`sglang_moe_plugins.plugins.triton_smq.plugin`."""

from .triton_smq.plugin import *  # noqa: F401,F403
from .triton_smq.plugin import MIN_SM, TritonPlugin, triton_available  # noqa: F401

__all__ = ["TritonPlugin", "MIN_SM"]
