"""The MegaMoE layer plans of :mod:`.mega_moe`: what every call of one layer with the same flags shares,
computed once, and the cache that holds them.

A plan holds no strong reference to the experts object or to any weight tensor: one flat tuple of weak
references (:attr:`MegaPlan.watch`: the experts object, then ``mega_l1_weights`` and ``mega_l2_weights``,
two tensors each) that a hit checks by identity, inline. When an experts object is freed its plans
leave the cache (a weak-reference callback), so a dropped layer's weights are freed with it. Experts
objects that cannot be weakly referenced are planned on every call (never cached). The cache holds at
most :data:`MAX_PLANS` plans (then it is cleared, with one warning).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ...log import LogOnce, get_logger
from ...ops import mega_moe as mm

__all__ = ["MegaPlan", "PLANS", "MAX_PLANS", "make_plan", "remember", "clear"]

logger = get_logger(__name__)

#: Plans kept at most (layers x call flags); past it the cache is cleared, with one warning.
MAX_PLANS = 4096
#: The plans by key (:func:`.mega_moe.plan_for`); read without a lock on the hot path.
PLANS: dict[tuple, MegaPlan] = {}
_lock = threading.Lock()
_logged = LogOnce(cap=8)


@dataclass(frozen=True, eq=False)
class MegaPlan:
    """One layer's calls with the same flags: shape and config (validated once), the process group, and
    weak references to the experts object and its weights (``l1_weights`` .. ``shared_l2_weights`` read
    them back: None in a slot whose tensor was freed). Hashed by identity: the Selector keeps the
    plan's bound op under the plan itself (``call_cache``)."""

    shape: mm.MegaMoEShape
    config: mm.MegaMoEConfig
    ep_group: Any
    device: torch.device
    #: 1.0, or the ``routed_scaling_factor`` the host multiplies its bf16 output by (0.5.21 on SM100).
    output_scale: float
    #: ``(hidden, top_k, max_tokens_per_rank)``: what a hit checks the batch against.
    dims: tuple[int, int, int] = field(repr=False)
    #: Weak references ``(experts, l1[0], l1[1], l2[0], l2[1])``; the experts slot is a dead reference
    #: until :func:`remember` ties the plan to its experts object.
    watch: tuple = field(repr=False)
    #: Weak references ``(shared_l1[0], shared_l1[1], shared_l2[0], shared_l2[1])``, or None.
    shared: tuple | None = field(repr=False)

    @property
    def l1_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.watch[1](), self.watch[2]())

    @property
    def l2_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.watch[3](), self.watch[4]())

    @property
    def shared_l1_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.shared is None else (self.shared[0](), self.shared[1]())

    @property
    def shared_l2_weights(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.shared is None else (self.shared[2](), self.shared[3]())


class _Unreferenced:
    """The referent of an unset experts slot: a weak reference to it is dead at once."""

    __slots__ = ("__weakref__",)


def _dead() -> Any:
    return weakref.ref(_Unreferenced())


def make_plan(
    shape: mm.MegaMoEShape,
    config: mm.MegaMoEConfig,
    l1: Any,
    l2: Any,
    shared_l1: Any,
    shared_l2: Any,
    ep_group: Any,
    device: torch.device,
    output_scale: float,
) -> MegaPlan:
    """A plan not yet tied to an experts object. ``l1`` .. ``shared_l2``: the validated weight pairs.
    TypeError when a tensor cannot be weakly referenced."""
    ref = weakref.ref
    shared = None if shared_l1 is None else (ref(shared_l1[0]), ref(shared_l1[1]), ref(shared_l2[0]), ref(shared_l2[1]))
    return MegaPlan(
        shape,
        config,
        ep_group,
        device,
        output_scale,
        (shape.hidden, shape.top_k, shape.max_tokens_per_rank),
        (_dead(), ref(l1[0]), ref(l1[1]), ref(l2[0]), ref(l2[1])),
        shared,
    )


def _forget(key: tuple, ref: Any) -> None:
    """Weak-reference callback: the experts object of ``key``'s plan was freed. No lock (a callback may run
    inside a garbage collection that interrupted a thread holding it); dict operations are atomic."""
    plan = PLANS.get(key)
    if plan is not None and plan.watch[0] is ref:
        PLANS.pop(key, None)


def remember(key: tuple, plan: MegaPlan, experts: Any) -> MegaPlan:
    """``plan`` tied to ``experts`` by a weak reference, in the cache (as it is when ``experts`` cannot be
    weakly referenced: then it is not cached)."""
    try:
        ref = weakref.ref(experts, lambda r, key=key: _forget(key, r))  # type: ignore[misc]  # mypy infers no lambda with a default
    except TypeError:
        name = type(experts).__qualname__
        if _logged.first(("weakref-experts", name)):
            logger.info(
                "sglang-moe-plugins: %s objects cannot be weakly referenced; their MegaMoE plans are not cached", name
            )
        return plan
    plan = dataclasses.replace(plan, watch=(ref, *plan.watch[1:]))
    with _lock:
        full = len(PLANS) >= MAX_PLANS
        if full:
            PLANS.clear()
        PLANS[key] = plan
    if full and _logged.first("plans-full"):
        logger.warning(
            "sglang-moe-plugins: more than %d MegaMoE layer plans; cache cleared (ever-changing arguments?)", MAX_PLANS
        )
    return plan


def clear() -> None:
    """Forget every plan and what was logged (tests; a changed environment)."""
    global _logged
    with _lock:
        PLANS.clear()
        _logged = LogOnce(cap=8)
