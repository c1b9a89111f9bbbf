"""The process-wide registry and selector, created lazily on first use, and the convenience calls."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint
from typing import TYPE_CHECKING, Any

from .config import UserConfig, load_config
from .core.dispatcher import Selection, Selector
from .core.registry import Registry
from .ops import silu_mul_quant as smq

if TYPE_CHECKING:
    import torch

__all__ = [
    "get_registry",
    "get_selector",
    "current_selector",
    "reload",
    "select",
    "explain",
    "dispatch",
    "silu_mul_quant",
]

_lock = threading.Lock()
_selector: Selector | None = None


def get_selector() -> Selector:
    """The process-wide selector (discovers plugins and reads the config on first call)."""
    global _selector
    with _lock:
        if _selector is None:
            _selector = Selector(Registry.discover(load_config()))
        return _selector


def current_selector() -> Selector:
    """:func:`get_selector` without taking the lock once the selector exists (the hooks' hot path)."""
    selector = _selector
    return selector if selector is not None else get_selector()


def get_registry() -> Registry:
    return get_selector().registry


def reload(
    config: UserConfig | None = None,
    env: Mapping[str, str] | None = None,
    *,
    entry_points: Iterable[EntryPoint] | None = None,
) -> Selector:
    """Rediscover plugins and re-read the configuration (or use ``config``); clears every cache.

    ``entry_points``: discover these instead of the installed ones (e.g. where the package runs from a
    checkout without being installed).
    """
    global _selector
    selector = Selector(Registry.discover(config if config is not None else load_config(env), entry_points))
    with _lock:
        _selector = selector
    return selector


def select(op: str, shape: Any, config: Any) -> Selection:
    """The plugin that would run ``op`` for this shape and config, and why each other one would not.

    Raises NoPluginAvailableError when no enabled plugin supports the call.
    """
    return get_selector().select(op, shape, config)


def explain(op: str, shape: Any, config: Any) -> Selection:
    """Like :func:`select` but returns a Selection with ``chosen=None`` instead of raising."""
    return get_selector().explain(op, shape, config)


def dispatch(op: str, inputs: Any, shape: Any, config: Any, outputs: Any = None) -> Any:
    """Select a plugin and run it (with runtime fallback); returns the op's outputs."""
    return get_selector().dispatch(op, inputs, shape, config, outputs)


def silu_mul_quant(
    gateup: torch.Tensor,
    masked_m: torch.Tensor,
    *,
    group_size: int = 128,
    topk: int = 1,
    swiglu_limit: float | None = None,
    swizzle: bool = False,
    scale_layout: smq.ScaleLayout = "column_major",
    keep_fp32: bool = False,
    num_real_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run op ``silu_mul_quant`` through the selected plugin; returns ``(out, scale)``."""
    shape, config = smq.describe(
        gateup,
        masked_m,
        group_size=group_size,
        topk=topk,
        swiglu_limit=swiglu_limit,
        swizzle=swizzle,
        scale_layout=scale_layout,
        keep_fp32=keep_fp32,
    )
    outputs = dispatch(smq.OP, smq.SiluMulQuantInputs(gateup, masked_m, num_real_tokens), shape, config)
    return outputs.out, outputs.scale
