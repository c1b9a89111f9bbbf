"""GPU timing helpers shared by ``sglang-moe-plugins bench`` and ``benchmarks/silu_mul_quant.py``.

Times are medians over CUDA-graph replays of calls run back to back (launch overhead excluded, as under
SGLang's CUDA graphs); callers rotate the calls over input sets larger than the L2 cache so that every
call reads from memory. The ceiling is the device copy bandwidth, measured in the same process.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

__all__ = [
    "Timer",
    "CudaGraphTimer",
    "copy_bandwidth",
    "graph_time_us",
    "round_orders",
    "rotation_sets",
    "random_gateup",
    "L2_BYTES_FALLBACK",
]

#: When the device does not report its L2 size (bytes); an H200 has 60 MiB.
L2_BYTES_FALLBACK = 64 * 2**20


def copy_bandwidth(nbytes: int = 2**30) -> float:
    """Device copy bandwidth in bytes/s (read + write): median time of ``copy_`` of ``nbytes`` (Triton's
    ``do_bench``, as the benchmarks have always measured it; CUDA-graph replays without Triton)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    try:
        from triton.testing import do_bench
    except ImportError:
        us = graph_time_us([lambda: y.copy_(x)], min_calls=4)  # noqa: F821 - a closure's name, del'd later
    else:
        us = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median") * 1e3  # noqa: F821 - a closure's name, del'd later
    del x, y
    torch.cuda.empty_cache()
    return 2 * nbytes / (us * 1e-6)


def round_orders(items: list, rounds: int) -> Iterator[list]:
    """The order of ``items`` in each of ``rounds`` timing rounds (at least one): forward, reversed,
    forward, ... so that no item is always timed first."""
    for r in range(max(1, rounds)):
        yield items if r % 2 == 0 else items[::-1]


def graph_time_us(calls: Sequence[Callable[..., object]], min_calls: int = 24, target_ms: float = 40.0) -> float:
    """Median per-call time (us) over CUDA-graph replays of ``calls`` run back to back."""
    for fn in calls:
        fn()
    torch.cuda.synchronize()
    reps = max(1, math.ceil(min_calls / len(calls)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            for fn in calls:
                fn()
    n_calls = reps * len(calls)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    n = int(min(200, max(5, target_ms / one)))
    times = []
    for _ in range(n):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return statistics.median(times) * 1e3 / n_calls


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or L2_BYTES_FALLBACK)


def rotation_sets(bytes_per_set: int, max_sets: int = 64) -> int:
    """How many input/output sets to rotate over so that together they exceed three times the L2 cache (as benchmarks/ do)."""
    return max(1, min(max_sets, math.ceil(3 * l2_bytes() / max(1, bytes_per_set))))


def random_gateup(E: int, N: int, D: int, gen: torch.Generator, spread: int = 6, device: str = "cuda") -> torch.Tensor:
    """bf16 values spanning many binades: N(0,1) times 2**U[-spread, spread]."""
    x = torch.randn(E, N, 2 * D, device=device, generator=gen)
    x *= torch.exp2(torch.randint(-spread, spread + 1, (E, N, 2 * D), device=device, generator=gen).float())
    return x.to(torch.bfloat16)


class Timer(Protocol):
    """The GPU boundary of ``bench`` (tests replace it): the copy ceiling and the time of back-to-back calls."""

    def copy_bandwidth(self) -> float: ...

    def time_us(self, calls: Sequence[Callable[..., object]]) -> float: ...


class CudaGraphTimer:
    """The real timer: :func:`copy_bandwidth` and :func:`graph_time_us`."""

    def copy_bandwidth(self) -> float:
        return copy_bandwidth()

    def time_us(self, calls: Sequence[Callable[..., object]]) -> float:
        return graph_time_us(calls)
