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
keyword-only in SGLang) and returns ``None`` -- the call goes to the original function unchanged,
logged once -- when this package does not model it:

- ``routing_in_buffer=True`` (SGLang's mega gate already wrote routing, maybe the input, into the buffer);
- NVFP4 experts (``experts._mega_moe_nvfp4``), an activation other than ``"swiglu"``, experts whose
  MegaMoE weights are not built or lack an attribute the op reads, SGLang's AMD FlyDSL path;
- a keyword argument this version does not know (a newer SGLang), or a missing required one.

Arguments the op rejects raise :class:`~sglang_moe_plugins.errors.InvalidArgumentError` (argument,
value, what is allowed), ``num_tokens`` above SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK
included. Otherwise it returns a :class:`MegaCall`: ``inputs``/``shape``/``config`` for the op,
``allocate_outputs()`` (``y`` of ``max(num_tokens, 1)`` rows, as the host allocates it),
``result(outputs)`` (``y[:num_tokens]``, the host's return value) and ``plan``.

**Bound once per layer.** What depends only on the layer and its call flags (validation of the
weights, shape, config, the process group) is computed the first time and kept in a :class:`MegaPlan`,
keyed by a cheap tuple of the raw arguments: the experts object's ``id()``, every flag that decides
whether the call is modelled (``routing_in_buffer``, ``experts._mega_moe_nvfp4``,
``experts._mega_moe_weights_built``), the other keyword arguments, dtypes, devices; never the token
count. A plan holds no strong reference to the experts object or to any weight tensor: it keeps
weak references, and a hit checks that the experts object is the very one planned (so an object
that reuses a freed one's ``id()`` is planned afresh), that ``mega_l1_weights`` / ``mega_l2_weights``
and the shared weights are still the same tensors, and the token count's consequences (``topk``
shapes, the cap), then builds the inputs. When an experts object is freed its plans leave the cache
(a weak-reference callback), so a dropped layer's weights are freed with it. Experts objects that
cannot be weakly referenced are planned on every call (never cached). The cache holds at most
:data:`MAX_PLANS` plans (then it is cleared, with one warning). SGLang's settings (the token cap, the
AMD path, the process group's accessor) are read once per process, at the first call (:func:`reset`
forgets them). Reads only metadata (no device sync): safe under CUDA graph capture, and every rank
builds the same shape and config.

The variant comes from the weights the host built: ``experts._mega_moe_sm90_fp8_weights`` ->
``sm90_fp8``; ``experts._mega_moe_w4a4`` -> ``mxf4xmxf4``; otherwise ``fp8xfp4``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import InvalidArgumentError
from ..ops import mega_moe as mm

__all__ = [
    "MegaCall",
    "MegaPlan",
    "build_call",
    "plan_for",
    "inputs_for",
    "allocate",
    "result",
    "reset",
    "HOST_FUNCTION",
    "KNOWN_KWARGS",
    "REQUIRED_KWARGS",
    "MAX_PLANS",
    "variant_of",
]

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
#: Plans kept at most (layers x call flags); past it the cache is cleared, with one warning.
MAX_PLANS = 4096
_CAP_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"

_lock = threading.Lock()
_plans: dict[tuple, "MegaPlan"] = {}
_settings: "_Settings | None" = None
_logged: set[str] = set()


def _log_once(key: str, level: int, message: str, *args: Any) -> None:
    with _lock:
        if key in _logged or len(_logged) > 256:
            return
        _logged.add(key)
    logger.log(level, message, *args)


@dataclass(frozen=True)
class _Settings:
    """SGLang's process-wide settings, read once."""

    max_tokens_per_rank: int
    amd_flydsl: bool


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
        host = importlib.import_module("sglang.srt.layers.moe.mega_moe")
        amd = bool(host._use_amd_flydsl_mega_moe())
    except Exception:  # noqa: BLE001
        amd = False
    return _Settings(cap, amd)


def _get_settings() -> _Settings:
    global _settings
    settings = _settings
    if settings is None:
        settings = _read_settings()
        with _lock:
            _settings = settings
    return settings


def _ep_group() -> Any:
    """SGLang's expert-parallel device group, or None outside SGLang's runtime context."""
    try:
        from sglang.srt.runtime_context import get_parallel  # noqa: PLC0415 - once per plan

        return get_parallel().moe_ep_group.device_group
    except Exception:  # noqa: BLE001
        return None


def reset() -> None:
    """Forget every plan and the settings read from SGLang (tests; a changed environment)."""
    global _settings
    with _lock:
        _plans.clear()
        _settings = None
        _logged.clear()


_Refs = tuple  # a tuple of weakref.ref to tensors


def _refs(weights: Any) -> "_Refs | None":
    """Weak references to the tensors of a weight pair (None for None). TypeError when an element cannot
    be weakly referenced."""
    return None if weights is None else tuple(weakref.ref(t) for t in weights)


def _deref(refs: "_Refs | None") -> tuple[torch.Tensor, ...] | None:
    if refs is None:
        return None
    if len(refs) == 2:  # (data, scales): every MegaMoE weight; the hot path
        return (refs[0](), refs[1]())
    return tuple(r() for r in refs)


def _same(weights: Any, refs: "_Refs | None") -> bool:
    """``weights`` holds exactly the (live) tensors ``refs`` point to."""
    if refs is None:
        return weights is None
    if weights is None or len(weights) != len(refs):
        return False
    if len(refs) == 2:
        return weights[0] is refs[0]() and weights[1] is refs[1]()
    return all(tensor is ref() for tensor, ref in zip(weights, refs))


@dataclass(frozen=True, eq=False)
class MegaPlan:
    """What every call of one layer with the same flags shares, computed once.

    It holds the experts object and the weight tensors by weak reference only; ``l1_weights`` ..
    ``shared_l2_weights`` read them back (None in a slot whose tensor was freed)."""

    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig
    _l1: _Refs = field(repr=False)
    _l2: _Refs = field(repr=False)
    _shared_l1: "_Refs | None" = field(repr=False)
    _shared_l2: "_Refs | None" = field(repr=False)
    ep_group: Any
    #: ``id()`` of the containers ``experts.mega_l1_weights`` / ``mega_l2_weights`` were (a hit also
    #: checks every tensor in them by identity, so a reused id never brings other tensors).
    sources: tuple[int, int] = field(repr=False)
    device: torch.device
    #: A weak reference to the experts object the plan was made for (a hit checks it is that object).
    experts: Any = field(default=None, repr=False)
    #: Free for the hook (e.g. its bound op), so that a hit hashes no shape or config.
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def l1_weights(self) -> tuple[torch.Tensor, ...]:
        return _deref(self._l1)  # type: ignore[return-value]

    @property
    def l2_weights(self) -> tuple[torch.Tensor, ...]:
        return _deref(self._l2)  # type: ignore[return-value]

    @property
    def shared_l1_weights(self) -> tuple[torch.Tensor, ...] | None:
        return _deref(self._shared_l1)

    @property
    def shared_l2_weights(self) -> tuple[torch.Tensor, ...] | None:
        return _deref(self._shared_l2)


@dataclass(frozen=True, eq=False)
class MegaCall:
    """One host call, as the op sees it."""

    inputs: mm.MegaMoEInputs
    plan: MegaPlan

    @property
    def shape(self) -> mm.MegaMoEShape:
        return self.plan.shape

    @property
    def config(self) -> mm.MegaMoEConfig:
        return self.plan.config

    @property
    def num_tokens(self) -> int:
        return self.inputs.hidden_states.shape[0]

    def allocate_outputs(self) -> mm.MegaMoEOutputs:
        return allocate(self.plan, self.inputs.hidden_states.shape[0])

    def result(self, outputs: mm.MegaMoEOutputs) -> torch.Tensor:
        """The host's return value: ``y[:num_tokens]``."""
        return result(outputs, self.inputs.hidden_states.shape[0])


def allocate(plan: MegaPlan, num_tokens: int) -> mm.MegaMoEOutputs:
    """``y`` of ``max(num_tokens, 1)`` rows, as the host allocates it."""
    return mm.MegaMoEOutputs(torch.empty((max(num_tokens, 1), plan.shape.hidden), dtype=torch.bfloat16, device=plan.device))


def result(outputs: mm.MegaMoEOutputs, num_tokens: int) -> torch.Tensor:
    """The host's return value, ``y[:num_tokens]``: ``y`` itself when it has exactly that many rows (a
    slice costs a view, ~3 us of host time)."""
    y = outputs.y
    return y if y.shape[0] == num_tokens else y[:num_tokens]


def variant_of(experts: Any) -> str | None:
    """The op variant of a host experts module, or None when the op does not model it."""
    if getattr(experts, "_mega_moe_nvfp4", False):
        return None
    if getattr(experts, "_mega_moe_sm90_fp8_weights", False):
        return "sm90_fp8"
    return "mxf4xmxf4" if getattr(experts, "_mega_moe_w4a4", False) else "fp8xfp4"


def _unmodelled(experts: Any, kwargs: dict[str, Any], settings: _Settings) -> str | None:
    """Why the call is left to the host (logged once), or None when the op models it."""
    unknown = set(kwargs) - KNOWN_KWARGS
    if unknown:
        return f"keyword arguments {sorted(unknown)} this version does not model"
    missing = REQUIRED_KWARGS - set(kwargs)
    if missing:
        return f"called without {sorted(missing)}"
    if kwargs.get("routing_in_buffer", False):
        return "routing_in_buffer=True (mega gate)"
    activation = kwargs.get("activation", "swiglu")
    variant = variant_of(experts)
    if variant is None or activation not in mm.ACTIVATIONS:
        return f"{'NVFP4' if variant is None else variant} experts with activation={activation!r}"
    if not getattr(experts, "_mega_moe_weights_built", False):
        return "the experts' MegaMoE weights are not built"
    if settings.amd_flydsl:
        return "SGLang's AMD FlyDSL MegaMoE path"
    return None


def _plan(experts: Any, hidden_states: torch.Tensor, topk_ids: Any, topk_weights: Any, kwargs: dict[str, Any],
          settings: _Settings) -> MegaPlan:
    """Validate everything (``describe``) and keep what the layer's calls share."""
    l1, l2 = experts.mega_l1_weights, experts.mega_l2_weights
    shape, config = mm.describe(
        hidden_states, topk_ids, topk_weights,
        l1_weights=l1, l2_weights=l2,
        variant=variant_of(experts), num_experts=experts.num_experts,  # type: ignore[arg-type]
        hidden_size=kwargs["hidden_size"], intermediate_size=kwargs["intermediate_size"], top_k=kwargs["top_k"],
        activation_clamp=kwargs.get("activation_clamp"),
        routed_scaling_factor=kwargs.get("routed_scaling_factor", 1.0),
        activation=kwargs.get("activation", "swiglu"),
        num_shared_experts=kwargs.get("num_shared_experts", 0),
        shared_l1_weights=kwargs.get("shared_l1_weights"),
        shared_l2_weights=kwargs.get("shared_l2_weights"),
        ep_size=int(getattr(experts, "moe_ep_size", 1) or 1),
        max_tokens_per_rank=settings.max_tokens_per_rank,
    )
    s1, s2 = kwargs.get("shared_l1_weights"), kwargs.get("shared_l2_weights")
    return MegaPlan(
        shape, config, _refs(l1), _refs(l2), _refs(s1), _refs(s2),  # type: ignore[arg-type]
        _ep_group(), (id(l1), id(l2)), hidden_states.device,
    )


def _key(experts: Any, hidden_states: torch.Tensor, topk_ids: Any, topk_weights: Any, kwargs: dict[str, Any]) -> tuple:
    """Everything a plan depends on that a dict lookup can compare; the identities it cannot (the experts
    object, the weight tensors) are checked by :func:`_fits`. The flags that decide delegation
    (``routing_in_buffer``, NVFP4, weights built) are part of it: a call that must go to SGLang never
    finds a plan."""
    get = kwargs.get
    return (
        id(experts), tuple(kwargs), kwargs["hidden_size"], kwargs["intermediate_size"], kwargs["top_k"],
        get("activation_clamp"), get("routed_scaling_factor", 1.0), get("activation", "swiglu"),
        get("num_shared_experts", 0), id(get("shared_l1_weights")), id(get("shared_l2_weights")),
        get("routing_in_buffer", False),
        getattr(experts, "_mega_moe_nvfp4", False), getattr(experts, "_mega_moe_weights_built", False),
        hidden_states.dtype, hidden_states.device,
        None if topk_ids is None else topk_ids.dtype, None if topk_weights is None else topk_weights.dtype,
    )


def _fits(plan: MegaPlan, experts: Any, hidden_states: torch.Tensor, topk_ids: Any, topk_weights: Any,
          kwargs: dict[str, Any]) -> bool:
    """On a plan hit: the same experts object and weight tensors, and the batch-dependent checks of
    ``describe`` (False: re-validate in full)."""
    ref = plan.experts
    if ref is None or ref() is not experts:
        return False
    l1, l2 = experts.mega_l1_weights, experts.mega_l2_weights
    sources = plan.sources
    if id(l1) != sources[0] or id(l2) != sources[1] or not _same(l1, plan._l1) or not _same(l2, plan._l2):
        return False
    if plan._shared_l1 is not None or plan._shared_l2 is not None:
        if not _same(kwargs.get("shared_l1_weights"), plan._shared_l1) or not _same(kwargs.get("shared_l2_weights"), plan._shared_l2):
            return False
    num_tokens = kwargs.get("num_tokens")
    shape = plan.shape
    size = hidden_states.shape
    if len(size) != 2 or size[1] != shape.hidden:
        return False
    tokens = size[0]
    if num_tokens != tokens or tokens > shape.max_tokens_per_rank:
        return False
    if topk_ids is None or topk_weights is None:
        return tokens == 0 and topk_ids is None and topk_weights is None
    want = (tokens, shape.top_k)
    if topk_ids.shape != want or topk_weights.shape != want:
        return False
    if tokens and hidden_states.stride(1) != 1:
        return False
    return topk_ids.device == plan.device and topk_weights.device == plan.device


def plan_for(
    experts: Any,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> MegaPlan | None:
    """The layer's plan for a ``run_mega_routed_experts`` call (a dict lookup and the batch checks on a
    hit), or None to run the original unchanged. The hook's hot path: :func:`build_call` without the
    :class:`MegaCall`. Raises InvalidArgumentError for arguments the op rejects."""
    settings = _settings if _settings is not None else _get_settings()
    try:
        key = _key(experts, hidden_states, topk_ids, topk_weights, kwargs)
    except (KeyError, AttributeError, TypeError):
        key = None
    plan = _plans.get(key) if key is not None else None
    if plan is not None and _fits(plan, experts, hidden_states, topk_ids, topk_weights, kwargs):
        return plan
    num_tokens = kwargs.get("num_tokens")
    why = _unmodelled(experts, kwargs, settings)
    if why is not None:
        _log_once(f"unmodelled:{why}", logging.INFO, "sglang-moe-plugins: MegaMoE call left to SGLang: %s", why)
        return None
    if isinstance(hidden_states, torch.Tensor) and num_tokens != hidden_states.shape[0]:
        raise InvalidArgumentError(mm.OP, "num_tokens", num_tokens, f"hidden_states.shape[0] = {hidden_states.shape[0]}")
    try:
        plan = _plan(experts, hidden_states, topk_ids, topk_weights, kwargs, settings)
    except AttributeError as exc:
        _log_once(f"attribute:{exc}", logging.WARNING, "sglang-moe-plugins: MegaMoE call left to SGLang: experts lack %s", exc)
        return None
    if key is not None:
        plan = _remember(key, plan, experts)
    return plan


def _forget(key: tuple, ref: Any) -> None:
    """Weak-reference callback: the experts object of ``key``'s plan was freed. No lock (a callback may run
    inside a garbage collection that interrupted a thread holding it); dict operations are atomic."""
    plan = _plans.get(key)
    if plan is not None and plan.experts is ref:
        _plans.pop(key, None)


def _remember(key: tuple, plan: MegaPlan, experts: Any) -> MegaPlan:
    """``plan`` tied to ``experts`` by a weak reference, in the cache (as it is when ``experts`` cannot be
    weakly referenced: then it is not cached)."""
    try:
        ref = weakref.ref(experts, lambda r, key=key: _forget(key, r))
    except TypeError:
        _log_once(f"weakref-experts:{type(experts).__qualname__}", logging.INFO,
                  "sglang-moe-plugins: %s objects cannot be weakly referenced; their MegaMoE plans are not cached",
                  type(experts).__qualname__)
        return plan
    plan = dataclasses.replace(plan, experts=ref)
    with _lock:
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
            full = True
        else:
            full = False
        _plans[key] = plan
    if full:
        _log_once("plans-full", logging.WARNING,
                  "sglang-moe-plugins: more than %d MegaMoE layer plans; cache cleared (ever-changing arguments?)", MAX_PLANS)
    return plan


def inputs_for(plan: MegaPlan, hidden_states: torch.Tensor, topk_ids: Any, topk_weights: Any) -> mm.MegaMoEInputs:
    """The op's inputs of one call of ``plan``'s layer."""
    l1, l2, s1, s2 = plan._l1, plan._l2, plan._shared_l1, plan._shared_l2
    return mm.MegaMoEInputs(
        hidden_states, topk_ids, topk_weights, _deref(l1), _deref(l2),  # type: ignore[arg-type]
        None if s1 is None else _deref(s1), None if s2 is None else _deref(s2), plan.ep_group,
    )


def build_call(
    experts: Any,
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    **kwargs: Any,
) -> MegaCall | None:
    """The op call for a ``run_mega_routed_experts`` call, or None to run the original unchanged.

    Raises InvalidArgumentError for arguments the op rejects.
    """
    plan = plan_for(experts, hidden_states, topk_ids, topk_weights, kwargs)
    if plan is None:
        return None
    return MegaCall(inputs_for(plan, hidden_states, topk_ids, topk_weights), plan)
