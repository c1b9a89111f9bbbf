"""Temporary shim: the shared vocabulary lives in :mod:`.case`, ``conformance_for`` in :mod:`.suite`."""

from __future__ import annotations

from .case import FULL, NONE, SUPPORTS_ONLY, OpConformance, SuiteCase
from .case import catalog_models as _models
from .suite import SupportsOnlyConformance, conformance_for

__all__ = ["SuiteCase", "OpConformance", "SupportsOnlyConformance", "conformance_for", "FULL", "SUPPORTS_ONLY", "NONE"]
