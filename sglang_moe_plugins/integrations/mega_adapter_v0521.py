"""Adapter and AROUND hook for ``run_mega_routed_experts`` of SGLang 0.5.21 and 0.5.22.

Their host function takes ``experts, hidden_states, topk_ids, topk_weights`` and keyword-only
``hidden_size, intermediate_size, top_k, num_tokens, activation_clamp, routed_scaling_factor`` (10
parameters, 0.5.21), plus ``num_shared_experts, shared_l1_weights, shared_l2_weights`` (13, 0.5.22).
There is no ``activation`` (always SwiGLU) and no ``routing_in_buffer`` (no mega gate). What differs
from 0.5.23, read from the wheels, is a field of the release's :class:`~.sglang_versions.MegaHost`:

- 0.5.21 multiplies the bf16 output by ``routed_scaling_factor`` after the kernel on SM100
  (``y.mul_(rsf)``); 0.5.22 scales the top-k weights before dispatch. On SM90 both pass the factor to
  ``mega_moe_pre_dispatch_sm90`` (on the weights). The adapter does what the release does: with
  ``scaling_on_output`` the op runs with factor 1 and the result is multiplied in place, as the host does.
- 0.5.21 picks W4A4 (``mxf4xmxf4``) from a server flag through ``_mega_moe_mma_type(experts)``; the
  adapter asks that function. 0.5.22 reads ``experts._mega_moe_w4a4`` (as 0.5.23).
- The host's ``_get_mega_moe_symm_buffer`` takes ``mma_type`` only (0.5.21) or also
  ``num_shared_experts`` (0.5.22), never ``activation``: the buffer hook passes only those keywords.

Calls the op does not model go to the original function unchanged, logged once: NVFP4 experts, weights
not built. Invalid arguments raise :class:`~sglang_moe_plugins.errors.InvalidArgumentError`; a call no
enabled plugin supports raises :class:`~sglang_moe_plugins.errors.NoPluginAvailableError` (MegaMoE is
collective: never a per-rank fallback).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import InvalidArgumentError
from ..ops import mega_moe as mm
from .sglang_versions import MegaHost, active_target

__all__ = ["OldMegaCall", "build_call", "mega_moe_hook"]

logger = logging.getLogger(__name__)
_OP = "mega_moe"
_logged: set[str] = set()
_lock = threading.Lock()


def _log_once(key: str, message: str, *args: Any) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.info(message, *args)


@dataclass(frozen=True, eq=False)
class OldMegaCall:
    """One 0.5.21/0.5.22 host call as the op sees it, and how to turn the op's output into the host's."""

    inputs: mm.MegaMoEInputs
    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig
    output_scale: float  # 1.0, or 0.5.21's routed_scaling_factor applied to y after the kernel

    def allocate_outputs(self) -> mm.MegaMoEOutputs:
        return mm.allocate_outputs(self.shape, self.config, self.inputs.device, num_tokens=self.inputs.num_tokens)

    def result(self, outputs: mm.MegaMoEOutputs) -> torch.Tensor:
        y = outputs.y[: self.inputs.num_tokens]
        if self.output_scale != 1.0:
            y.mul_(self.output_scale)
        return y


def _host_module() -> Any:
    from sglang.srt.layers.moe import mega_moe as host  # noqa: PLC0415

    return host


def _variant(experts: Any, behaviour: MegaHost) -> str | None:
    if getattr(experts, "_mega_moe_nvfp4", False):
        return None
    if getattr(experts, "_mega_moe_sm90_fp8_weights", False):
        return "sm90_fp8"
    if behaviour.mma_type_from_host:
        mma_type = _host_module()._mega_moe_mma_type(experts)
        return None if mma_type == "nvfp4xnvfp4" else mma_type
    return "mxf4xmxf4" if getattr(experts, "_mega_moe_w4a4", False) else "fp8xfp4"


def _buffer_hook(behaviour: MegaHost) -> Callable[..., Any] | None:
    host_fn = getattr(_host_module(), "_get_mega_moe_symm_buffer", None)
    if host_fn is None:
        return None

    def get_symm_buffer(group: Any, *sizes: int, **keywords: Any) -> Any:
        if keywords.get("num_shared_experts", 0) and "num_shared_experts" not in behaviour.buffer_keywords:
            raise InvalidArgumentError(_OP, "num_shared_experts", keywords["num_shared_experts"], "0 on this SGLang release")
        return host_fn(group, *sizes, **{k: v for k, v in keywords.items() if k in behaviour.buffer_keywords})

    return get_symm_buffer


@functools.lru_cache(maxsize=4)
def _host_hooks(behaviour: MegaHost) -> Any:
    hooks = getattr(mm, "MegaHostHooks", None)  # the op's host-helper record, where the op carries one
    if hooks is None:
        return None
    return hooks(
        get_symm_buffer=_buffer_hook(behaviour),
        num_sms_context=getattr(_host_module(), "_configure_mega_moe_deep_gemm_num_sms", None),
    )


def _max_tokens_per_rank() -> int:
    from sglang.srt.environ import envs  # noqa: PLC0415

    return int(envs.SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK.get())


def _ep_group() -> Any:
    from sglang.srt.runtime_context import get_parallel  # noqa: PLC0415

    return get_parallel().moe_ep_group.device_group


def build_call(behaviour: MegaHost, arguments: dict[str, Any]) -> OldMegaCall | None:
    """The op call for bound host arguments, or None when the op does not model the call."""
    experts = arguments["experts"]
    variant = _variant(experts, behaviour)
    if variant is None:
        _log_once("nvfp4", "sglang-moe-plugins: MegaMoE with NVFP4 experts stays with SGLang (not modelled)")
        return None
    if not getattr(experts, "_mega_moe_weights_built", False):
        _log_once("unbuilt", "sglang-moe-plugins: MegaMoE experts without built weights stay with SGLang")
        return None
    hidden_states = arguments["hidden_states"]
    num_tokens = arguments["num_tokens"]
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != 2 or num_tokens != hidden_states.shape[0]:
        raise InvalidArgumentError(_OP, "num_tokens", num_tokens, "hidden_states.shape[0] (a 2-D hidden_states tensor)")
    rsf = arguments.get("routed_scaling_factor", 1.0)
    on_output = behaviour.scaling_on_output and variant != "sm90_fp8"
    shape, config = mm.describe(
        hidden_states, arguments["topk_ids"], arguments["topk_weights"],
        l1_weights=experts.mega_l1_weights, l2_weights=experts.mega_l2_weights,
        variant=variant, num_experts=experts.num_experts,
        hidden_size=arguments["hidden_size"], intermediate_size=arguments["intermediate_size"], top_k=arguments["top_k"],
        activation_clamp=arguments.get("activation_clamp"),
        routed_scaling_factor=1.0 if on_output else rsf,
        num_shared_experts=arguments.get("num_shared_experts", 0),
        shared_l1_weights=arguments.get("shared_l1_weights"), shared_l2_weights=arguments.get("shared_l2_weights"),
        ep_size=int(getattr(experts, "moe_ep_size", 1) or 1),
        max_tokens_per_rank=_max_tokens_per_rank(),
    )
    fields = {f.name for f in dataclasses.fields(mm.MegaMoEInputs)}
    extra = {"experts": experts, "host": _host_hooks(behaviour)}
    inputs = mm.MegaMoEInputs(
        hidden_states=hidden_states, topk_ids=arguments["topk_ids"], topk_weights=arguments["topk_weights"],
        l1_weights=tuple(experts.mega_l1_weights), l2_weights=tuple(experts.mega_l2_weights),
        shared_l1_weights=arguments.get("shared_l1_weights"), shared_l2_weights=arguments.get("shared_l2_weights"),
        ep_group=_ep_group(), **{k: v for k, v in extra.items() if k in fields},
    )
    return OldMegaCall(inputs, shape, config, float(rsf) if on_output else 1.0)


@functools.lru_cache(maxsize=8)
def _signature(original: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(original)


def mega_moe_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of 0.5.21/0.5.22's ``run_mega_routed_experts``: same arguments, same return value."""
    from .. import api  # noqa: PLC0415

    target = active_target(_OP)
    behaviour = target.host
    if not isinstance(behaviour, MegaHost) or target.parameters != tuple(_signature(original).parameters):
        _log_once("release", "sglang-moe-plugins: run_mega_routed_experts of this release is not the 0.5.21/0.5.22 one; left to SGLang")
        return original(*args, **kwargs)
    bound = _signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    call = build_call(behaviour, dict(bound.arguments))
    if call is None:
        return original(*args, **kwargs)
    # bind() is cached per (shape, config) by the selector; call() runs the bound op without the
    # per-call output revalidation of dispatch() (the adapter allocates the outputs itself).
    selector = api.current_selector()
    bound_op = selector.bind(_OP, call.shape, call.config)
    return call.result(selector.call(bound_op, call.inputs, call.allocate_outputs()))
