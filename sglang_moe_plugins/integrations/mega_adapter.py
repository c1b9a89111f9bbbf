"""Temporary re-export: the MegaMoE adapter lives in :mod:`sglang_moe_plugins.integrations.sglang.mega_moe`
(plans in :mod:`~sglang_moe_plugins.integrations.sglang.mega_plan`)."""

from .sglang.mega_moe import *  # noqa: F403
from .sglang.mega_moe import MegaCall, MegaPlan, build_call, plan_for, reset, variant_of  # noqa: F401
from .sglang.mega_moe import HOST_FUNCTION, KNOWN_KWARGS, MAX_PLANS, REQUIRED_KWARGS  # noqa: F401
from .sglang.mega_moe import _Settings, _ep_group  # noqa: F401
from .sglang.mega_plan import PLANS as _plans  # noqa: F401

__all__ = ["MegaCall", "MegaPlan", "build_call", "plan_for", "reset", "HOST_FUNCTION", "KNOWN_KWARGS",
           "REQUIRED_KWARGS", "MAX_PLANS", "variant_of"]
