"""Temporary shim: the decision lives in :mod:`sglang_moe_plugins.core.decide`, the Selector in
:mod:`sglang_moe_plugins.core.dispatcher`, ``as_support`` in :mod:`sglang_moe_plugins.contract`."""

from .contract import as_support as _as_support  # noqa: F401
from .core.decide import INFO_LINE_MAX  # noqa: F401
from .core.dispatcher import *  # noqa: F403
from .core.dispatcher import __all__  # noqa: F401
from .log import LogOnce as _Once  # noqa: F401
