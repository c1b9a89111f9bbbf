"""How the conformance suite asks ``supports()``: timed, under a watch for tensor-value reads, and stopped
at the first call over the per-call limit (so a costly ``supports()`` fails in seconds, with progress).

Shapes and configs hold plain Python values only (ints, floats, strings, :class:`Platform`), never
tensors, so ``supports()`` cannot read call data; a tensor read seen here comes from a tensor the plugin
holds or makes, and is a host sync that may answer differently per rank.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from torch.overrides import TorchFunctionMode

__all__ = ["HostReadWatch", "ask", "ask_all"]

#: Tensor methods that read a tensor's values on the host (a device sync on CUDA).
_HOST_READS = frozenset(
    {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "__complex__", "numpy", "cpu", "__array__"}
)


class HostReadWatch(TorchFunctionMode):
    """Records tensor-value reads made while supports() runs. Shapes and configs hold plain values only,
    so such a read comes from a tensor the plugin holds or makes itself."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS:
            self.reads.append(f".{name}()" if not name.startswith("__") else f"{name.strip('_')}(tensor)")
        return func(*args, **(kwargs or {}))


def ask(plugin: Any, shape: Any, config: Any) -> tuple[Any, float, list[str]]:
    watch = HostReadWatch()
    start = time.perf_counter()
    with watch:
        answer = plugin.supports(shape, config)
    return answer, (time.perf_counter() - start) * 1e6, watch.reads


def ask_all(
    drawn: list[Any],
    answers: dict[int, Any],
    check: Callable[[Any, float], Any],
    timings: list[float],
    limit_us: float,
    budget_us: float,
    progress: Callable[[int, int, str], None] | None,
    short: Callable[[Any], str],
) -> str:
    """Ask supports() about every case (progress as ``supports() <label>``). Stops at the first call over
    the per-call limit, or once the median of 30+ calls is over 10x the budget; returns why ('' if not)."""
    limit = limit_us
    for index, case in enumerate(drawn):
        if progress is not None:
            progress(index, len(drawn), f"supports() {case.label}")
        answers[id(case)] = check(case, limit)
        slow = [t for t in timings[1:] if t > limit]
        left = len(drawn) - index - 1
        if slow:
            return (
                f"supports() took {max(slow) / 1e6:.3f} s on one call ({short(case)}), over the {limit / 1e3:.0f} ms per-call limit "
                f"(the first call of the run is exempt); {left} remaining case(s) not asked"
            )
        if len(timings) >= 30 and statistics.median(timings) > 10 * budget_us:
            return (
                f"supports() takes {statistics.median(timings):.0f} us per call (median of {len(timings)}), over 10x the "
                f"{budget_us:.0f} us budget; {left} remaining case(s) not asked"
            )
    return ""
