"""SGLang integration: the ``sglang.srt.plugins`` entry point ``moe_plugins`` (``register``) and its hooks.

- :mod:`.entry`: :func:`register`, the fail-closed hooks, :func:`hook_status`, call counters, delegation;
- :mod:`.versions`: the release table (what each release's host does);
- :mod:`.silu_mul_quant`: the ``silu_mul_quant`` hook, its raw-argument key, the host's scale layouts;
- :mod:`.mega_moe` (plans in :mod:`.mega_plan`): the MegaMoE adapter of 0.5.21-0.5.23 and its hook.

The names below are re-exported here, so that ``sglang_moe_plugins.integrations.sglang:register``
(the entry point) and every import of this package keep working.
"""

from __future__ import annotations

from .entry import _delegations_logged, hook_status, register  # noqa: F401 - _delegations_logged: tests
from .mega_moe import mega_moe_hook
from .silu_mul_quant import refresh_host_state, silu_mul_quant_hook
from .versions import KNOWN_TARGETS, HookTarget, TargetCheck, VersionCase, check_targets, sglang_version, version_case

__all__ = [
    "HookTarget",
    "TargetCheck",
    "KNOWN_TARGETS",
    "VersionCase",
    "register",
    "check_targets",
    "version_case",
    "sglang_version",
    "hook_status",
    "silu_mul_quant_hook",
    "mega_moe_hook",
    "refresh_host_state",
]
