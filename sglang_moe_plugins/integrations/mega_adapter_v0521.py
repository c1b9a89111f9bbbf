"""Temporary re-export: one MegaMoE adapter serves SGLang 0.5.21-0.5.23,
:mod:`sglang_moe_plugins.integrations.sglang.mega_moe`."""

from .sglang.mega_moe import mega_moe_hook

__all__ = ["mega_moe_hook"]
