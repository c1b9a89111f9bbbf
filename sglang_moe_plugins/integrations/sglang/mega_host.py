"""SGLang's side of a MegaMoE call (:mod:`.mega_moe`): the keywords of ``run_mega_routed_experts``, SGLang's
process settings (the token cap, the AMD path), the variant of the host's experts and whether the op models
a call. The names are importable from :mod:`.mega_moe` too."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from ...ops import mega_moe as mm
from .versions import MegaHost

__all__ = ["HOST_FUNCTION", "KNOWN_KWARGS", "REQUIRED_KWARGS", "variant_of"]

#: The host function this adapter models.
HOST_FUNCTION = "sglang.srt.layers.moe.mega_moe.run_mega_routed_experts"
REQUIRED_KWARGS = frozenset({"hidden_size", "intermediate_size", "top_k", "num_tokens"})
#: The keywords of the newest release (0.5.23); a release takes those of its table entry's parameters.
KNOWN_KWARGS = REQUIRED_KWARGS | frozenset(
    {
        "activation_clamp",
        "routed_scaling_factor",
        "activation",
        "num_shared_experts",
        "shared_l1_weights",
        "shared_l2_weights",
        "routing_in_buffer",
    }
)
_CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"


@dataclass(frozen=True)
class _Settings:
    """SGLang's process-wide settings, read once."""

    max_tokens_per_rank: int
    amd_flydsl: bool


def _host_module() -> Any:
    return importlib.import_module("sglang.srt.layers.moe.mega_moe")


def _read_settings() -> _Settings:
    try:
        from sglang.srt.environ import envs  # noqa: PLC0415 - once per process

        cap = int(envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())
    except Exception:  # noqa: BLE001 - outside SGLang: the variable or the default
        try:
            cap = int(os.environ.get(_CAP_ENV, mm.DEFAULT_MAX_TOKENS_PER_RANK))
        except ValueError:
            cap = mm.DEFAULT_MAX_TOKENS_PER_RANK
    try:
        amd = bool(_host_module()._use_amd_flydsl_mega_moe())
    except Exception:  # noqa: BLE001
        amd = False
    return _Settings(cap, amd)


def variant_of(experts: Any, host: MegaHost | None = None) -> str | None:
    """The op variant of a host experts module (on the release of ``host``; default: the newest), or None
    when the op does not model it."""
    if getattr(experts, "_mega_moe_nvfp4", False):
        return None
    if getattr(experts, "_mega_moe_sm90_fp8_weights", False):
        return "sm90_fp8"
    if host is not None and host.mma_type_from_host:
        mma_type = _host_module()._mega_moe_mma_type(experts)
        return None if mma_type == "nvfp4xnvfp4" else mma_type
    return "mxf4xmxf4" if getattr(experts, "_mega_moe_w4a4", False) else "fp8xfp4"


def _same_shared(shared: tuple, kwargs: dict[str, Any]) -> bool:
    s1, s2 = kwargs.get("shared_l1_weights"), kwargs.get("shared_l2_weights")
    try:
        a, b = s1  # type: ignore[misc]
        c, d = s2  # type: ignore[misc]
    except (TypeError, ValueError):
        return False
    return a is shared[0]() and b is shared[1]() and c is shared[2]() and d is shared[3]()


def _unmodelled(
    experts: Any, kwargs: dict[str, Any], settings: _Settings, known: frozenset[str], variant: str | None
) -> str | None:
    """Why the call is left to the host (logged once), or None when the op models it."""
    unknown = set(kwargs) - known
    if unknown:
        return f"keyword arguments {sorted(unknown)} this version does not model"
    missing = REQUIRED_KWARGS - set(kwargs)
    if missing:
        return f"called without {sorted(missing)}"
    if kwargs.get("routing_in_buffer", False):
        return "routing_in_buffer=True (mega gate)"
    activation = kwargs.get("activation", "swiglu")
    if variant is None or activation not in mm.ACTIVATIONS:
        return f"{'NVFP4' if variant is None else variant} experts with activation={activation!r}"
    if not getattr(experts, "_mega_moe_weights_built", False):
        return "the experts' MegaMoE weights are not built"
    if settings.amd_flydsl:
        return "SGLang's AMD FlyDSL MegaMoE path"
    return None
