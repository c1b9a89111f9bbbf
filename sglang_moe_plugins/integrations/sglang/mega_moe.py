"""The MegaMoE adapter: SGLang 0.5.21-0.5.23's ``run_mega_routed_experts`` <-> op ``mega_moe``, and its
AROUND hook.

One adapter for every release of the version table; the release's record (:mod:`.versions`, read when
a layer is planned, never per call) drives what differs:

- the keywords the host function takes (its parameters): ``num_shared_experts`` /
  ``shared_l1_weights`` / ``shared_l2_weights`` from 0.5.22, ``activation`` and ``routing_in_buffer``
  from 0.5.23 (a release without them always runs SwiGLU without the mega gate);
- ``MegaHost.scaling_on_output``: 0.5.21 multiplies the bf16 output by ``routed_scaling_factor`` after
  the kernel on SM100 (``y.mul_(rsf)``); the op then runs with factor 1 and the result is multiplied in
  place, as the host does. Later releases, and SM90 in every release, put it on the top-k weights;
- ``MegaHost.mma_type_from_host``: 0.5.21 picks W4A4 (``mxf4xmxf4``) from a server flag through the
  host's ``_mega_moe_mma_type(experts)``; later releases read ``experts._mega_moe_w4a4``.

:func:`mega_moe_hook` calls :func:`run`, which returns the host's return value or :data:`DELEGATE`: the
call goes to the original function unchanged (counted and logged once per kind) when this package does
not model it: ``routing_in_buffer=True`` (SGLang's mega gate already wrote routing, maybe the input,
into the buffer); NVFP4 experts, an activation other than ``"swiglu"``, experts whose MegaMoE weights
are not built or lack an attribute the op reads, SGLang's AMD FlyDSL path; a keyword argument the
release does not take, or a missing required one. Arguments the op rejects raise
:class:`~sglang_moe_plugins.errors.InvalidArgumentError` (``num_tokens`` above
SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK included); a call no enabled plugin runs raises
NoPluginAvailableError (MegaMoE is collective: never a per-rank fallback).

**Planned once per layer** (:mod:`.mega_plan`). What depends only on the layer and its call flags
(validation of the weights, shape, config, the process group, the output scale) is computed the first
time and kept in a plan, keyed by a cheap tuple of the raw arguments (:func:`plan_for`): the ``id()``
of the experts object and of its weight containers, every flag that decides whether the call is
modelled, the other keyword arguments, dtypes, devices; never the token count. A hit checks that the
experts object and the weight tensors are the very ones planned and the token count's consequences
(``topk`` shapes, the cap). The plan's bound op is kept by the Selector (``call_cache``, keyed by the
plan). SGLang's settings (the token cap, the AMD path) are read once per process (:func:`reset` forgets
them). Reads only metadata (no device sync): safe under CUDA graph capture, and every rank builds the
same shape and config.

The variant comes from the weights the host built: ``experts._mega_moe_sm90_fp8_weights`` ->
``sm90_fp8``; ``experts._mega_moe_w4a4`` (0.5.21: the host's ``_mega_moe_mma_type``) -> ``mxf4xmxf4``;
otherwise ``fp8xfp4``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ... import api
from ...errors import InvalidArgumentError, NoPluginAvailableError, OutputValidationError
from ...log import LogOnce, get_logger
from ...ops import mega_moe as mm
from .entry import CALLS, delegate, delegate_withheld
from .mega_host import (
    HOST_FUNCTION,
    KNOWN_KWARGS,
    REQUIRED_KWARGS,
    _read_settings,
    _same_shared,
    _Settings,
    _unmodelled,
    variant_of,
)
from .mega_plan import MAX_PLANS, PLANS, MegaPlan, clear as _clear_plans, make_plan, remember
from .versions import MegaHost, active_target

__all__ = [
    "DELEGATE",
    "WITHHELD",
    "HOST_FUNCTION",
    "KNOWN_KWARGS",
    "REQUIRED_KWARGS",
    "MAX_PLANS",
    "PLANS",
    "MegaCall",
    "MegaPlan",
    "build_call",
    "mega_moe_hook",
    "plan_for",
    "reset",
    "run",
    "variant_of",
]

logger = get_logger(__name__)

#: What :func:`run` returns for a call it leaves to SGLang's function.
DELEGATE: Any = object()
#: What :func:`run` returns for a call only the withheld pure-torch reference could run (SGLang's function runs it).
WITHHELD: Any = object()
_OP = mm.OP

_settings: _Settings | None = None
_logged = LogOnce(cap=256)


def _ep_group() -> Any:
    """SGLang's expert-parallel device group, or None outside SGLang's runtime context (once per plan)."""
    try:
        from sglang.srt.runtime_context import get_parallel  # noqa: PLC0415

        return get_parallel().moe_ep_group.device_group
    except Exception:  # noqa: BLE001
        return None


def reset() -> None:
    """Forget every plan, what was logged and the settings read from SGLang (tests; a changed environment)."""
    global _settings, _logged
    _clear_plans()
    _settings = None
    _logged = LogOnce(cap=256)


def _log_once(key: str, level: str, message: str, *args: Any) -> None:
    if _logged.first(key):
        getattr(logger, level)(message, *args)


def _plan_afresh(
    key: tuple | None, experts: Any, hidden_states: Any, topk_ids: Any, topk_weights: Any, kwargs: dict[str, Any]
) -> MegaPlan | None:
    """No plan fits: check whether the op models the call, validate everything (``describe``) and keep
    what the layer's calls share."""
    global _settings
    settings = _settings
    if settings is None:
        settings = _settings = _read_settings()
    target = active_target(_OP)
    host = target.host if isinstance(target.host, MegaHost) else None
    try:
        variant = variant_of(experts, host)
    except Exception as exc:  # noqa: BLE001 - the host's _mega_moe_mma_type failed: not a call the op models
        _log_once(
            f"variant:{type(exc).__name__}",
            "warning",
            "sglang-moe-plugins: MegaMoE call left to SGLang: its MegaMoE variant cannot be read: %s",
            exc,
        )
        return None
    why = _unmodelled(experts, kwargs, settings, frozenset(target.parameters[4:]), variant)
    if why is not None:
        _log_once(f"unmodelled:{why}", "info", "sglang-moe-plugins: MegaMoE call left to SGLang: %s", why)
        return None
    num_tokens = kwargs["num_tokens"]
    if isinstance(hidden_states, torch.Tensor) and num_tokens != hidden_states.shape[0]:
        raise InvalidArgumentError(_OP, "num_tokens", num_tokens, f"hidden_states.shape[0] = {hidden_states.shape[0]}")
    rsf = kwargs.get("routed_scaling_factor", 1.0)
    on_output = host is not None and host.scaling_on_output and variant != "sm90_fp8"
    s1, s2 = kwargs.get("shared_l1_weights"), kwargs.get("shared_l2_weights")
    try:
        l1, l2 = experts.mega_l1_weights, experts.mega_l2_weights
        shape, config = mm.describe(
            hidden_states,
            topk_ids,
            topk_weights,
            l1_weights=l1,
            l2_weights=l2,
            variant=variant,  # type: ignore[arg-type]  # not None: _unmodelled() refused a None variant above
            num_experts=experts.num_experts,
            hidden_size=kwargs["hidden_size"],
            intermediate_size=kwargs["intermediate_size"],
            top_k=kwargs["top_k"],
            activation_clamp=kwargs.get("activation_clamp"),
            routed_scaling_factor=1.0 if on_output else rsf,
            activation=kwargs.get("activation", "swiglu"),
            num_shared_experts=kwargs.get("num_shared_experts", 0),
            shared_l1_weights=s1,
            shared_l2_weights=s2,
            ep_size=int(getattr(experts, "moe_ep_size", 1) or 1),
            max_tokens_per_rank=settings.max_tokens_per_rank,
        )
    except AttributeError as exc:
        _log_once(
            f"attribute:{exc}", "warning", "sglang-moe-plugins: MegaMoE call left to SGLang: experts lack %s", exc
        )
        return None
    plan = make_plan(shape, config, l1, l2, s1, s2, _ep_group(), hidden_states.device, float(rsf) if on_output else 1.0)
    return plan if key is None else remember(key, plan, experts)


def _result(plan: MegaPlan, outputs: mm.MegaMoEOutputs, num_tokens: int) -> torch.Tensor:
    """The host's return value, ``y[:num_tokens]`` (``y`` itself when it has exactly that many rows: a
    slice costs a view), multiplied in place by the release's output scale (0.5.21 on SM100:
    ``routed_scaling_factor`` on the bf16 output)."""
    y = outputs.y
    if y.shape[0] != num_tokens:
        y = y[:num_tokens]
    if plan.output_scale != 1.0:
        y.mul_(plan.output_scale)
    return y


def run(
    experts: Any, hidden_states: Any, topk_ids: Any, topk_weights: Any, kwargs: dict[str, Any], plan_only: bool = False
) -> Any:
    """The adapter's call: the host's return value for these arguments, or :data:`DELEGATE` (with
    ``plan_only``: the layer's plan, or None, without running it; :func:`plan_for`). Raises
    InvalidArgumentError for arguments the op rejects.

    The plan's key holds everything a plan depends on that a dict lookup can compare; the identities it
    cannot (the experts object, the weight tensors) a hit checks against the plan's weak references, with
    the batch's consequences (``topk`` shapes, the cap). The flags that decide delegation
    (``routing_in_buffer``, NVFP4, weights built) are in the key: a call that must go to SGLang never
    finds a plan. The op is bound once per shape key by the Selector (a repeated call is a dict hit: no
    selection, no output revalidation)."""
    get = kwargs.get
    try:
        l1, l2 = experts.mega_l1_weights, experts.mega_l2_weights
        key = (
            id(experts),
            id(l1),
            id(l2),
            tuple(kwargs),
            kwargs["hidden_size"],
            kwargs["intermediate_size"],
            kwargs["top_k"],
            get("activation_clamp"),
            get("routed_scaling_factor", 1.0),
            get("activation", "swiglu"),
            get("num_shared_experts", 0),
            id(get("shared_l1_weights")),
            id(get("shared_l2_weights")),
            get("routing_in_buffer", False),
            getattr(experts, "_mega_moe_nvfp4", False),
            getattr(experts, "_mega_moe_weights_built", False),
            hidden_states.dtype,
            hidden_states.device,
            None if topk_ids is None else topk_ids.dtype,
            None if topk_weights is None else topk_weights.dtype,
        )
        # typed as the code after the hit check reads it: a call without a plan returns or plans before that
        plan: MegaPlan = PLANS.get(key)  # type: ignore[assignment]
    except (KeyError, AttributeError, TypeError):
        key = plan = None  # type: ignore[assignment]  # no key: nothing to look up (plans afresh, unkeyed)
    hit = False
    if plan is not None:
        watch = plan.watch
        try:
            a, b = l1
            c, d = l2
            tokens, width = hidden_states.shape
        except (TypeError, ValueError):
            pass
        else:
            hidden, top_k, cap = plan.dims
            if (
                watch[0]() is experts
                and a is watch[1]()
                and b is watch[2]()
                and c is watch[3]()
                and d is watch[4]()
                and width == hidden
                and kwargs["num_tokens"] == tokens
                and tokens <= cap
                and (plan.shared is None or _same_shared(plan.shared, kwargs))
            ):
                if topk_ids is None or topk_weights is None:
                    hit = tokens == 0 and topk_ids is None and topk_weights is None
                else:
                    hit = (
                        topk_ids.shape == (tokens, top_k)
                        and topk_weights.shape == (tokens, top_k)
                        and (not tokens or hidden_states.stride(1) == 1)
                        and topk_ids.device == plan.device
                        and topk_weights.device == plan.device
                    )
    if not hit:
        plan = _plan_afresh(key, experts, hidden_states, topk_ids, topk_weights, kwargs)  # type: ignore[assignment]
        if plan is None or plan_only:
            return plan if plan_only else DELEGATE
        (a, b), (c, d), tokens = plan.l1_weights, plan.l2_weights, hidden_states.shape[0]
    elif plan_only:
        return plan
    shared = plan.shared
    inputs = mm.MegaMoEInputs(
        hidden_states,
        topk_ids,
        topk_weights,
        (a, b),
        (c, d),
        None if shared is None else (shared[0](), shared[1]()),
        None if shared is None else (shared[2](), shared[3]()),
        plan.ep_group,
    )
    outputs = mm.MegaMoEOutputs(torch.empty((tokens or 1, plan.dims[0]), dtype=torch.bfloat16, device=plan.device))
    # The Selector keeps the bound op (a dict hit on a known key): nothing keyed by the plan is cached, so
    # plans that are dropped (freed layers, reloaded weights) leave nothing behind.
    selector = api.current_selector()
    try:
        bound = selector.bind(_OP, plan.shape, plan.config)
    except NoPluginAvailableError as exc:
        if not exc.to_host:  # the same on every rank: the shape, the platform and the configuration decide
            raise
        _log_once("withheld", "warning", "sglang-moe-plugins: mega_moe: %s", exc)
        return WITHHELD
    outputs = selector.call(bound, inputs, outputs)
    if outputs.y.shape[0] < (tokens or 1):  # a plugin's own y: this call's tokens are not in the shape key
        raise OutputValidationError(
            f"plugin {bound.name!r} returned y.shape={tuple(outputs.y.shape)} for "
            f"num_tokens={tokens}; the host requires [max(num_tokens, 1), {plan.dims[0]}]"
        )
    return _result(plan, outputs, tokens)


def plan_for(
    experts: Any, hidden_states: Any, topk_ids: Any, topk_weights: Any, kwargs: dict[str, Any]
) -> MegaPlan | None:
    """The layer's plan for a ``run_mega_routed_experts`` call (what :func:`run` runs), or None to run the
    original unchanged. Raises InvalidArgumentError for arguments the op rejects."""
    return run(experts, hidden_states, topk_ids, topk_weights, kwargs, plan_only=True)


def _arguments(experts: Any, hidden_states: Any, topk_ids: Any, topk_weights: Any, **kwargs: Any) -> tuple:
    return experts, hidden_states, topk_ids, topk_weights, kwargs


_mega_calls = CALLS[_OP].hit


def mega_moe_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``run_mega_routed_experts``: same arguments, same return value."""
    _mega_calls()
    try:
        experts, hidden_states, topk_ids, topk_weights = args
    except ValueError:  # not the four positional arguments: bound by name, or the host says what is wrong
        try:
            experts, hidden_states, topk_ids, topk_weights, named = _arguments(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        y = run(experts, hidden_states, topk_ids, topk_weights, named)
    else:
        y = run(experts, hidden_states, topk_ids, topk_weights, kwargs)
    if y is DELEGATE:  # the adapter logs the precise reason once
        return delegate(_OP, "mega unmodelled", "arguments the mega_moe op does not model", original, args, kwargs)
    if y is WITHHELD:
        return delegate_withheld(_OP, original, args, kwargs)
    return y


@dataclass(frozen=True, eq=False)
class MegaCall:
    """One host call as the op sees it (:func:`build_call`)."""

    inputs: mm.MegaMoEInputs
    plan: MegaPlan

    @property
    def shape(self) -> mm.MegaMoEShape:
        return self.plan.shape

    @property
    def config(self) -> mm.MegaMoEConfig:
        return self.plan.config

    @property
    def output_scale(self) -> float:
        return self.plan.output_scale

    def allocate_outputs(self) -> mm.MegaMoEOutputs:
        """``y`` of ``max(num_tokens, 1)`` rows, as the host allocates it."""
        rows = max(self.inputs.hidden_states.shape[0], 1)
        return mm.MegaMoEOutputs(
            torch.empty((rows, self.plan.shape.hidden), dtype=torch.bfloat16, device=self.plan.device)
        )

    def result(self, outputs: mm.MegaMoEOutputs) -> torch.Tensor:
        """The host's return value: ``y[:num_tokens]``, times the release's output scale."""
        return _result(self.plan, outputs, self.inputs.hidden_states.shape[0])


def build_call(experts: Any, hidden_states: Any, topk_ids: Any, topk_weights: Any, **kwargs: Any) -> MegaCall | None:
    """The op call for a ``run_mega_routed_experts`` call of the active release, or None to run the
    original unchanged. Raises InvalidArgumentError for arguments the op rejects."""
    plan = plan_for(experts, hidden_states, topk_ids, topk_weights, kwargs)
    if plan is None:
        return None
    inputs = mm.MegaMoEInputs(
        hidden_states,
        topk_ids,
        topk_weights,
        plan.l1_weights,
        plan.l2_weights,
        plan.shared_l1_weights,
        plan.shared_l2_weights,
        plan.ep_group,
    )
    return MegaCall(inputs, plan)
