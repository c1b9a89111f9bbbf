"""Temporary re-export: the version table lives in :mod:`sglang_moe_plugins.integrations.sglang.versions`."""

from .sglang.versions import *  # noqa: F403
from .sglang.versions import __all__, _active, _release_key  # noqa: F401
