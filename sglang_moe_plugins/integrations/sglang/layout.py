"""The masked layout back where it wins: the AROUND hook of SGLang's ``_masked_activation_unsupported_reason``.

SGLang 0.5.20-0.5.23 refuse the masked (standard) layout for every clamped (``swiglu_limit``) or MegaMoE-a2a
config that their DSV4 JIT kernel cannot take (``D // 8 < E``, a group other than 128, ``D % 512``), and send
it to the compact layout, whose padding makes the activation and both GEMMs run over many more rows. With
the package, the masked call goes to the ``silu_mul_quant`` hook, whose plugins take every such shape.

The hook lifts the guard's refusal for a batch (the reason becomes None) when all of these hold; otherwise it
returns SGLang's own reason unchanged:

- ``masked_layout = "measured"`` (the default; ``"sglang"``, or ``SGLANG_MOE_PLUGINS_MASKED_LAYOUT=sglang``,
  gives the decision back to SGLang);
- op ``silu_mul_quant`` is hooked in this process (not ``stock``): otherwise the masked call would reach
  SGLang's asserted kernel;
- an enabled plugin other than the reference serves the config's masked call at every token count probed;
- the end-to-end benchmark measured the masked layout at least 5% faster than the compact one for this config at
  this batch's token count (``data/masked_layout.json``: a range of token counts per config, written by
  ``benchmarks/masked_layout_table.py`` from ``benchmarks/results/contig_e2e_NVIDIA-H200.json``). The token count
  is the one SGLang's own ``_should_use_masked_standard_layout(runner_config, quant_info, hidden_states)`` sees: its
  AROUND hook (:func:`masked_policy_hook`) records ``hidden_states.shape[0]`` for the guard it calls. A guard call
  from anywhere else keeps SGLang's reason.

Nothing here reads tensor data: the decision is a function of the layer's config, the process configuration and
the batch's token count, which SGLang's own memory policy reads too. SGLang's own policy still
decides after the guard (``SGLANG_DEEPGEMM_STANDARD_LAYOUT``, the masked layout's memory budget).
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ... import api
from ...log import get_logger

__all__ = [
    "LayoutKey",
    "LayoutDecision",
    "masked_guard_hook",
    "masked_policy_hook",
    "decide_layout",
    "measured_configs",
    "PROBE_ROWS",
]

logger = get_logger(__name__)
#: Padded rows per expert at which the masked call must be served (decode to prefill).
PROBE_ROWS = (8, 256, 4096)
_lock = threading.Lock()
_decisions: dict[Any, LayoutDecision] = {}
#: ``tokens``: the batch's token count while SGLang's ``_should_use_masked_standard_layout`` runs (its hook sets it).
_local = threading.local()


@dataclass(frozen=True)
class LayoutKey:
    """What the guard's answer depends on."""

    experts: int
    hidden: int  # D per partition
    group_size: int
    swiglu_limit: float | None
    swizzle: bool
    topk: int

    def describe(self) -> str:
        limit = "" if self.swiglu_limit is None else f" swiglu_limit={self.swiglu_limit:g}"
        return f"E={self.experts} D={self.hidden} group={self.group_size}{limit}{' swizzle' if self.swizzle else ''}"


@dataclass(frozen=True)
class LayoutDecision:
    """Whether the guard may be lifted for a layer config, and for which batch sizes (token counts, inclusive)."""

    lift: bool
    reason: str
    tokens_min: int = 0
    tokens_max: int = 0

    def lifts(self, tokens: int | None) -> bool:
        return self.lift and tokens is not None and self.tokens_min <= tokens <= self.tokens_max


@functools.cache
def measured_configs() -> dict[tuple[int, int, int, bool], dict[str, Any]]:
    """``{(E, D, group, clamped): entry}`` of the configs the benchmark measured, from ``data/masked_layout.json``."""
    text = resources.files("sglang_moe_plugins").joinpath("data/masked_layout.json").read_text(encoding="utf-8")
    data = json.loads(text)
    return {(c["experts"], c["hidden"], c["group_size"], bool(c["clamped"])): c for c in data["configs"]}


def decide_layout(
    key: LayoutKey, *, masked_layout: str, smq_hooked: bool, serving: Callable[[int], str | None]
) -> LayoutDecision:
    """Whether the guard's refusal is lifted for ``key`` (pure, given ``serving(rows) -> plugin or None``)."""
    if masked_layout != "measured":
        return LayoutDecision(False, f"masked_layout = {masked_layout!r}: SGLang's guard decides")
    if not smq_hooked:
        return LayoutDecision(
            False, "op silu_mul_quant is not hooked here (stock): SGLang's masked kernel would assert"
        )
    if key.swizzle:
        return LayoutDecision(False, f"{key.describe()}: swizzled (MegaMoE) layers were not measured")
    measured = measured_configs().get((key.experts, key.hidden, key.group_size, key.swiglu_limit is not None))
    if measured is None:
        return LayoutDecision(False, f"{key.describe()} was not measured (data/masked_layout.json)")
    if not measured.get("masked_faster"):
        return LayoutDecision(
            False, f"{key.describe()}: the compact layout measured faster ({measured.get('summary', '')})"
        )
    plugins = set()
    for rows in PROBE_ROWS:
        plugin = serving(rows)
        if plugin is None or plugin == "reference":
            return LayoutDecision(False, f"no plugin but the reference serves the masked call at N={rows}")
        plugins.add(plugin)
    low, high = int(measured["tokens_min"]), int(measured["tokens_max"])
    return LayoutDecision(
        True,
        f"{key.describe()}: masked measured faster ({measured.get('summary', '')}); "
        f"served by {', '.join(sorted(plugins))}",
        low,
        high,
    )


def _key(runner_config: Any, quant_info: Any, swizzle: bool) -> LayoutKey | None:
    experts = getattr(runner_config, "num_local_experts", None)
    hidden = getattr(runner_config, "intermediate_size_per_partition", None)
    if experts is None or hidden is None:
        return None
    block = getattr(quant_info, "block_shape", None)
    return LayoutKey(
        int(experts),
        int(hidden),
        int(block[1]) if block else 128,
        runner_config.swiglu_limit,
        swizzle,
        int(getattr(runner_config, "top_k", None) or 1),
    )


def _serving(key: LayoutKey) -> Callable[[int], str | None]:
    from ...hardware import local_platform
    from ...ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
    from .silu_mul_quant import _scale_ue8m0

    selector = api.current_selector()
    layout = "ue8m0_packed" if _scale_ue8m0() else "row_major"  # the DSV4 branch's layouts (limit or swizzle set)
    config = SiluMulQuantConfig(local_platform(), key.swiglu_limit, key.swizzle, layout)  # type: ignore[arg-type]

    def serving(rows: int) -> str | None:
        shape = SiluMulQuantShape(key.experts, rows, key.hidden, key.group_size, key.topk)
        chosen = selector.explain("silu_mul_quant", shape, config).chosen
        return None if chosen is None else chosen.name

    return serving


def _swizzle() -> bool:
    from sglang.srt.layers.moe.utils import get_moe_a2a_backend

    return bool(get_moe_a2a_backend().is_megamoe())


def masked_guard_hook(
    original: Callable[..., Any], runner_config: Any, quant_info: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND hook of ``_masked_activation_unsupported_reason``: SGLang's reason, or None where lifted."""
    reason = original(runner_config, quant_info, *args, **kwargs)
    if reason is None:
        return None
    try:
        key = _key(runner_config, quant_info, _swizzle())
    except Exception:  # noqa: BLE001 - a config the hook cannot read: SGLang's answer stands
        return reason
    if key is None:
        return reason
    selector = api.current_selector()
    cache_key = (key, selector)  # the selector itself: a new one (api.reload) never reuses an old decision
    decision = _decisions.get(cache_key)
    if decision is None:
        from .entry import hooked_ops

        decision = decide_layout(
            key,
            masked_layout=selector.registry.config.masked_layout,
            smq_hooked="silu_mul_quant" in hooked_ops(),
            serving=_serving(key),
        )
        with _lock:
            if cache_key not in _decisions:
                _decisions[cache_key] = decision
                where = f"at {decision.tokens_min}-{decision.tokens_max} tokens" if decision.lift else "left to SGLang"
                logger.info(
                    "sglang-moe-plugins: masked layout for %s: %s: %s (SGLang's guard: %s)",
                    key.describe(),
                    where,
                    decision.reason,
                    reason,
                )
    return None if decision.lifts(getattr(_local, "tokens", None)) else reason


def masked_policy_hook(
    original: Callable[..., Any], runner_config: Any, quant_info: Any, hidden_states: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND hook of ``_should_use_masked_standard_layout``: makes the batch's token count known to the guard's
    hook (which SGLang calls from inside it) for the call; SGLang's function decides, unchanged."""
    previous = getattr(_local, "tokens", None)
    try:
        _local.tokens = int(hidden_states.shape[0])
    except Exception:  # noqa: BLE001 - not a tensor: the guard's hook then keeps SGLang's reason
        _local.tokens = None
    try:
        return original(runner_config, quant_info, hidden_states, *args, **kwargs)
    finally:
        _local.tokens = previous
