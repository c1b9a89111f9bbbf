"""Adapter between SGLang 0.5.23's ``run_mega_routed_experts`` and op ``mega_moe``.

The contract for the hook (an AROUND hook on
``sglang.srt.layers.moe.mega_moe.run_mega_routed_experts``)::

    def around(original, experts, hidden_states, topk_ids, topk_weights, **kwargs):
        call = mega_adapter.build_call(experts, hidden_states, topk_ids, topk_weights, **kwargs)
        if call is None:
            return original(experts, hidden_states, topk_ids, topk_weights, **kwargs)
        outputs = sglang_moe_plugins.dispatch(
            "mega_moe", call.inputs, call.shape, call.config, outputs=call.allocate_outputs())
        return call.result(outputs)

``build_call`` takes exactly the host function's arguments (``hidden_size``, ``intermediate_size``,
``top_k``, ``num_tokens``, ``activation_clamp``, ``routed_scaling_factor``, ``activation``,
``num_shared_experts``, ``shared_l1_weights``, ``shared_l2_weights``, ``routing_in_buffer``, all
keyword-only in SGLang) and returns ``None`` -- the call must go to the original function unchanged --
when this package does not model it:

- ``routing_in_buffer=True`` (SGLang's mega gate already wrote routing, maybe the input, into the buffer);
- NVFP4 experts (``experts._mega_moe_nvfp4``), an activation other than ``"swiglu"``, experts whose
  MegaMoE weights are not built, SGLang's AMD FlyDSL path;
- a keyword argument this version does not know (a newer SGLang), or a missing required one;
- arguments the op rejects (``describe`` raises InvalidArgumentError; logged once at WARNING) --
  this includes ``num_tokens`` above SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK, which the
  original then reports with its own message.

Otherwise it returns a :class:`MegaCall`: ``inputs``/``shape``/``config`` for the op, and
``allocate_outputs()`` (``y`` of ``max(num_tokens, 1)`` rows, as the host allocates it) and
``result(outputs)`` (``y[:num_tokens]``, the host's return value). It reads only metadata (no
device sync), so it is safe under CUDA graph capture, and every rank builds the same shape/config.

The variant comes from the weights the host built: ``experts._mega_moe_sm90_fp8_weights`` ->
``sm90_fp8``; ``experts._mega_moe_w4a4`` -> ``mxf4xmxf4``; otherwise ``fp8xfp4``. The process
group, SGLang's buffer cache (``_get_mega_moe_symm_buffer``) and SM reservation
(``_configure_mega_moe_deep_gemm_num_sms``) are passed as host hooks, resolved lazily.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ..ops import mega_moe as mm

__all__ = ["MegaCall", "build_call", "HOST_FUNCTION", "KNOWN_KWARGS", "REQUIRED_KWARGS", "variant_of"]

logger = logging.getLogger(__name__)

#: The host function this adapter models.
HOST_FUNCTION = "sglang.srt.layers.moe.mega_moe.run_mega_routed_experts"
REQUIRED_KWARGS = frozenset({"hidden_size", "intermediate_size", "top_k", "num_tokens"})
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
_DEFAULT_MAX_TOKENS_PER_RANK = 8192  # SGLang 0.5.23's default for the variable below
_CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"

_logged: set[str] = set()
_logged_lock = threading.Lock()


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.log(level, message, *args)


@dataclass(frozen=True, eq=False)
class MegaCall:
    """One host call, as the op sees it."""

    inputs: mm.MegaMoEInputs
    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig

    @property
    def num_tokens(self) -> int:
        return self.inputs.num_tokens

    def allocate_outputs(self) -> mm.MegaMoEOutputs:
        return mm.allocate_outputs(self.shape, self.config, self.inputs.device, num_tokens=self.num_tokens)

    def result(self, outputs: mm.MegaMoEOutputs) -> torch.Tensor:
        """The host's return value: ``y[:num_tokens]``."""
        return outputs.y[: self.num_tokens]


def variant_of(experts: Any) -> str | None:
    """The op variant of a host experts module, or None when the op does not model it."""
    if getattr(experts, "_mega_moe_nvfp4", False):
        return None
    if getattr(experts, "_mega_moe_sm90_fp8_weights", False):
        return "sm90_fp8"
    return "mxf4xmxf4" if getattr(experts, "_mega_moe_w4a4", False) else "fp8xfp4"


def _max_tokens_per_rank() -> int:
    try:
        from sglang.srt.environ import envs  # noqa: PLC0415

        return int(envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())
    except Exception:  # noqa: BLE001 - outside SGLang: the variable or the default
        try:
            return int(os.environ.get(_CAP_ENV, _DEFAULT_MAX_TOKENS_PER_RANK))
        except ValueError:
            return _DEFAULT_MAX_TOKENS_PER_RANK


def _uses_amd_flydsl() -> bool:
    try:
        from sglang.srt.layers.moe import mega_moe as host  # noqa: PLC0415

        return bool(host._use_amd_flydsl_mega_moe())
    except Exception:  # noqa: BLE001
        return False


def _ep_group() -> Any:
    from sglang.srt.runtime_context import get_parallel  # noqa: PLC0415

    return get_parallel().moe_ep_group.device_group


@functools.lru_cache(maxsize=1)
def _host_hooks() -> mm.MegaHostHooks | None:
    try:
        from sglang.srt.layers.moe import mega_moe as host  # noqa: PLC0415
    except Exception:  # noqa: BLE001
        return None
    return mm.MegaHostHooks(
        get_symm_buffer=getattr(host, "_get_mega_moe_symm_buffer", None),
        num_sms_context=getattr(host, "_configure_mega_moe_deep_gemm_num_sms", None),
    )


def build_call(
    experts: Any,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    **kwargs: Any,
) -> MegaCall | None:
    """The op call for a ``run_mega_routed_experts`` call, or None to run the original unchanged."""
    unknown = set(kwargs) - KNOWN_KWARGS
    if unknown:
        _log_once(f"unknown:{sorted(unknown)}", logging.WARNING,
                  "sglang-moe-plugins: %s got keyword arguments %s this version does not model; leaving MegaMoE to SGLang",
                  HOST_FUNCTION, sorted(unknown))
        return None
    missing = REQUIRED_KWARGS - set(kwargs)
    if missing:
        _log_once(f"missing:{sorted(missing)}", logging.WARNING,
                  "sglang-moe-plugins: %s called without %s; leaving MegaMoE to SGLang", HOST_FUNCTION, sorted(missing))
        return None
    if kwargs.get("routing_in_buffer", False):
        _log_once("routing_in_buffer", logging.INFO,
                  "sglang-moe-plugins: MegaMoE calls with routing_in_buffer=True (mega gate) stay with SGLang")
        return None
    activation = kwargs.get("activation", "swiglu")
    variant = variant_of(experts)
    if variant is None or activation not in mm.ACTIVATIONS:
        _log_once(f"unmodelled:{variant}:{activation}", logging.INFO,
                  "sglang-moe-plugins: MegaMoE with %s experts and activation=%r stays with SGLang",
                  "NVFP4" if variant is None else variant, activation)
        return None
    if not getattr(experts, "_mega_moe_weights_built", False) or _uses_amd_flydsl():
        return None
    if not isinstance(hidden_states, torch.Tensor) or kwargs["num_tokens"] != hidden_states.shape[0]:
        return None
    try:
        shape, config = mm.describe(
            hidden_states, topk_ids, topk_weights,
            l1_weights=experts.mega_l1_weights, l2_weights=experts.mega_l2_weights,
            variant=variant, num_experts=experts.num_experts,
            hidden_size=kwargs["hidden_size"], intermediate_size=kwargs["intermediate_size"], top_k=kwargs["top_k"],
            activation_clamp=kwargs.get("activation_clamp"),
            routed_scaling_factor=kwargs.get("routed_scaling_factor", 1.0),
            activation=activation,
            num_shared_experts=kwargs.get("num_shared_experts", 0),
            shared_l1_weights=kwargs.get("shared_l1_weights"),
            shared_l2_weights=kwargs.get("shared_l2_weights"),
            ep_size=int(getattr(experts, "moe_ep_size", 1) or 1),
            max_tokens_per_rank=_max_tokens_per_rank(),
        )
    except (InvalidArgumentError, AttributeError) as exc:
        _log_once(f"invalid:{type(exc).__name__}:{exc}", logging.WARNING,
                  "sglang-moe-plugins: MegaMoE call left to SGLang: %s", exc)
        return None
    inputs = mm.MegaMoEInputs(
        hidden_states=hidden_states,
        topk_ids=topk_ids,
        topk_weights=topk_weights,
        l1_weights=tuple(experts.mega_l1_weights),
        l2_weights=tuple(experts.mega_l2_weights),
        shared_l1_weights=kwargs.get("shared_l1_weights"),
        shared_l2_weights=kwargs.get("shared_l2_weights"),
        ep_group=_ep_group,
        experts=experts,
        host=_host_hooks(),
    )
    return MegaCall(inputs, shape, config)
