"""Temporary re-export: the ``mega_reference`` plugin lives in :mod:`sglang_moe_plugins.plugins.reference.mega_moe`."""

from .reference.mega_moe import *  # noqa: F401,F403
from .reference.mega_moe import MegaReferencePlugin  # noqa: F401

__all__ = ["MegaReferencePlugin"]
