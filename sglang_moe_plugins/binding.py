"""Temporary shim: :class:`BoundOp` lives in :mod:`sglang_moe_plugins.core.bound`, ``CACHE_CAP`` in
:mod:`sglang_moe_plugins.core.dispatcher`, the log-once set in :mod:`sglang_moe_plugins.log`."""

from .core.bound import BoundOp, _FirstCall, inputs_maybe_written  # noqa: F401
from .core.dispatcher import CACHE_CAP
from .log import LogOnce as _Once  # noqa: F401

__all__ = ["BoundOp", "CACHE_CAP", "inputs_maybe_written"]
