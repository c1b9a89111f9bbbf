"""Per-process counters (``sglang_moe_plugins.stats()``) of what the hooks did: calls per (op, plugin), fallbacks, calls handed to SGLang.

Counting is one C call per event (``next()`` on an ``itertools.count``, atomic under the GIL), so it
takes no lock on the hot path; :func:`stats` reads every counter into a frozen, JSON-ready
:class:`Stats` labelled with this process's rank. :func:`reset_stats` zeroes them in place (a bound op keeps
its counter and goes on counting); :func:`totals`, every count since the process started, is what :mod:`.metrics`
exports through SGLang's Prometheus endpoint when SGLang runs with ``--enable-metrics``, labelled with
:func:`sglang_labels` (the labels SGLang's own scheduler series carry for this process).

What each counter means:

- ``calls``: calls a plugin was launched for (a call that fails and falls back counts for both plugins);
- ``fallbacks``: calls on which the plugin failed and the next plugin ran the call instead;
- ``delegations``: hooked calls handed to SGLang's original function (the documented unmodelled
  calls), per op and kind (``gemm1_alpha``, ``masked_m=None``, ``mega unmodelled``, ...).
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "SGLANG_LABELS",
    "EventCounter",
    "PluginStats",
    "SglangLabels",
    "Stats",
    "counter",
    "process_rank",
    "reset_stats",
    "sglang_labels",
    "stats",
    "totals",
]

#: The kinds of counters (the middle element of a counter key).
KINDS = ("calls", "fallbacks", "delegations")


class EventCounter:
    """A lock-free event counter: ``hit()`` is ``next()`` on an ``itertools.count``.

    ``hit`` is bound to the count once (callers keep ``counter(...).hit``), so a reset cannot replace the count:
    :meth:`reset` moves a base instead, and :attr:`total` (every hit since the process started) never goes down."""

    __slots__ = ("_base", "_count", "hit")

    def __init__(self) -> None:
        self._count = itertools.count()
        self._base = 0
        self.hit: Callable[[], int] = functools.partial(next, self._count)

    @property
    def total(self) -> int:
        """Every hit since the counter was made, resets or not (the count's next value, read from its repr: no hit
        is consumed)."""
        return int(repr(self._count)[len("count(") : -1])

    @property
    def value(self) -> int:
        """Hits since the last :meth:`reset`."""
        return self.total - self._base

    def reset(self) -> None:
        """Start :attr:`value` from zero again; :attr:`total` and ``hit`` are unchanged."""
        self._base = self.total


_lock = threading.Lock()
#: ``(kind, op, name) -> counter``; ``name`` is a plugin, or for delegations the kind of call.
_counters: dict[tuple[str, str, str], EventCounter] = {}


def counter(kind: str, op: str, name: str) -> EventCounter:
    """The counter of ``kind`` (one of :data:`KINDS`) for ``op`` and ``name``, created once."""
    key = (kind, op, name)
    found = _counters.get(key)
    if found is None:
        with _lock:
            found = _counters.setdefault(key, EventCounter())
    return found


def reset_stats() -> None:
    """Zero every counter of :func:`stats` in place. The counter objects stay, so a bound op's counter (taken
    at bind time) keeps counting into :func:`stats`; :func:`totals`, which the Prometheus export reads, is
    not reset (a Prometheus counter never goes down)."""
    with _lock:
        for found in _counters.values():
            found.reset()


def totals() -> dict[tuple[str, str, str], int]:
    """``{(kind, op, name): count}`` of every counter since the process started, untouched by :func:`reset_stats`
    (what :mod:`.metrics` exports)."""
    with _lock:
        return {key: c.total for key, c in _counters.items()}


def process_rank() -> tuple[int | None, int | None]:
    """``(rank, world_size)`` of torch.distributed's default group, or ``(None, None)`` when it is not
    initialised (or torch is not imported yet: nothing is imported for this)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001 - a half-initialised group: no label rather than an error in a log call
        pass
    return None, None


#: The labels of SGLang's scheduler series (``sglang:*``) that the package's series carry too, in SGLang's order.
#: SGLang's ``engine_type`` and its ``--extra-metric-labels`` are not carried.
SGLANG_LABELS = ("model_name", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank")
_RANKS = SGLANG_LABELS[1:]
#: Where releases before SGLang's runtime context keep the ranks: (label, getter of ``parallel_state``).
_GROUP_GETTERS = (
    ("tp_rank", "get_tensor_model_parallel_rank"),
    ("pp_rank", "get_pipeline_model_parallel_rank"),
    ("moe_ep_rank", "get_moe_expert_parallel_rank"),
)


@dataclass(frozen=True)
class SglangLabels:
    """What :func:`sglang_labels` found."""

    #: ``{label: value}`` (values as SGLang's labels print them), only those SGLang has for this process: empty
    #: outside an SGLang server process.
    labels: Mapping[str, str]
    #: True when a scoped override of SGLang's parallel state (a draft model's narrowed TP group, shared experts'
    #: MoE group) hides this process's own ranks now: :attr:`labels` is empty, read again later.
    scoped: bool = False


def _label(read: Callable[..., Any], *args: Any) -> str | None:
    """``read(*args)`` as a label value: an int (not a bool) or a non-empty string; None when it is neither or
    raises."""
    try:
        value = read(*args)
    except Exception:  # noqa: BLE001 - not published, not initialised, another release: no label rather than a guess
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value if isinstance(value, str) and value else None


def sglang_labels() -> SglangLabels:
    """SGLang's labels of this process, as its scheduler series (``sglang:*``) carry them: ``model_name``
    (``--served-model-name``, else the model path), ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, and ``dp_rank`` where
    a data-parallel controller gives one.

    Read from the SGLang modules this process has already imported (nothing is imported for this): SGLang's runtime
    context (0.5.19 and later: what ``publish`` recorded for the scheduler, read as SGLang's metrics collector reads
    it), else the groups of ``parallel_state`` once SGLang's distributed init has run. A label SGLang has not set is
    left out, never guessed; while a scoped override hides the process's own ranks, nothing is returned
    (:attr:`SglangLabels.scoped`)."""
    labels: dict[str, str] = {}
    context = sys.modules.get("sglang.srt.runtime_context")
    if context is not None:
        try:
            parallel = context.get_parallel()
        except Exception:  # noqa: BLE001 - another release's context: no labels from it
            parallel = None
        # SGLang keeps a scope's values (its ``override``) in one dict read before the process's own: a private
        # name, read defensively (absent on another release: no scope is seen).
        scoped = getattr(parallel, "_overrides", None)
        if isinstance(scoped, dict) and any(name in scoped for name in _RANKS):
            return SglangLabels(MappingProxyType({}), scoped=True)
        model = _label(lambda: context.get_serving().served_model_name)
        if model is not None:
            labels["model_name"] = model
        for name in _RANKS if parallel is not None else ():
            value = _label(getattr, parallel, name)
            if value is not None:
                labels[name] = value
    if not any(name in labels for name in _RANKS):
        state = sys.modules.get("sglang.srt.distributed.parallel_state")
        if state is not None and _label(lambda: int(bool(state.model_parallel_is_initialized()))) == "1":
            if getattr(state, "_TP_STATE_PATCHED", False) is True or getattr(state, "_PP_STATE_PATCHED", False) is True:
                return SglangLabels(MappingProxyType({}), scoped=True)
            for name, getter in _GROUP_GETTERS:
                value = _label(lambda found: found(), getattr(state, getter, None))
                if value is not None:
                    labels[name] = value
            server_args = sys.modules.get("sglang.srt.server_args")
            if "model_name" not in labels and server_args is not None:
                model = _label(lambda: server_args.get_global_server_args().served_model_name)
                if model is not None:
                    labels["model_name"] = model
    return SglangLabels(MappingProxyType({k: labels[k] for k in SGLANG_LABELS if k in labels}))


@dataclass(frozen=True)
class PluginStats:
    """The counters of one plugin on one op."""

    op: str
    plugin: str
    calls: int
    fallbacks: int

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "plugin": self.plugin, "calls": self.calls, "fallbacks": self.fallbacks}


@dataclass(frozen=True)
class Stats:
    """What this process did, as counted so far. ``share`` gives each plugin's share of an op's calls."""

    rank: int | None
    world_size: int | None
    plugins: tuple[PluginStats, ...]
    #: ``{op: {kind of call: count}}``: hooked calls handed to SGLang's own function.
    delegations: Mapping[str, Mapping[str, int]]

    def share(self, op: str) -> dict[str, float]:
        """``{plugin: fraction of op's plugin calls}`` (empty when the op ran no call)."""
        rows = [p for p in self.plugins if p.op == op]
        total = sum(p.calls for p in rows)
        return {p.plugin: p.calls / total for p in rows} if total else {}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: plain dicts, lists, ints and floats."""
        ops = sorted({p.op for p in self.plugins} | set(self.delegations))
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "plugins": [p.to_dict() for p in self.plugins],
            "delegations": {op: dict(kinds) for op, kinds in self.delegations.items()},
            "share": {op: self.share(op) for op in ops if self.share(op)},
        }


def stats() -> Stats:
    """The counters of this process (calls, fallbacks and delegations) since it started or since the last
    :func:`reset_stats`, labelled with its rank; a counter still at zero is left out."""
    with _lock:
        items = [(key, value) for key, c in _counters.items() if (value := c.value)]
    per_plugin: dict[tuple[str, str], dict[str, int]] = {}
    delegations: dict[str, dict[str, int]] = {}
    for (kind, op, name), value in items:
        if kind == "delegations":
            delegations.setdefault(op, {})[name] = value
        else:
            per_plugin.setdefault((op, name), {"calls": 0, "fallbacks": 0})[kind] = value
    plugins = tuple(PluginStats(op, name, v["calls"], v["fallbacks"]) for (op, name), v in sorted(per_plugin.items()))
    rank, world = process_rank()
    frozen = MappingProxyType({op: MappingProxyType(dict(sorted(k.items()))) for op, k in sorted(delegations.items())})
    return Stats(rank, world, plugins, frozen)
