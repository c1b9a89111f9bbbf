"""A narrow indirection to the host's (SGLang's) own CUDA kernels used by ``jit_ep`` and ``fp8_fallback``,
and the check both plugins share (:func:`cuda_host_kernels`).

By default the functions come from SGLang's Python wrappers, imported on first use:

- ``silu_and_mul_masked_post_quant(input, output, output_scale, quant_group_size, masked_m,
  scale_ue8m0=False, topk=8, transposed=False, swiglu_limit=None, swizzle=False) -> None``
  (``sglang.kernels.ops.moe.dsv4``)
- ``per_token_group_quant(input, output_q=None, output_s=None, group_size=128, scale_ue8m0=False,
  fuse_silu_and_mul=False, masked_m=None, expected_m=None, ...) -> (q, s)``
  (``sglang.kernels.ops.quantization.per_token_group_quant``)

A machine without SGLang installed (the GPU machine used for benchmarks) can build the same kernels
from the sglang wheel's JIT sources and install them with :func:`use_host_kernels`, so that the
plugins' own argument and layout handling is what runs and is tested.

:func:`sglang_mega_pre_dispatch` reaches SGLang's JIT MegaMoE pre-dispatch kernel (imported on call,
never at import time).
"""

from __future__ import annotations

import contextlib
import importlib.util
import pathlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...contract import Support
from ...hardware import Platform

__all__ = [
    "HostKernels",
    "get_host_kernels",
    "use_host_kernels",
    "host_kernels_source",
    "cuda_host_kernels",
    "sglang_mega_pre_dispatch",
]


@dataclass(frozen=True)
class HostKernels:
    """The host kernel entry points, with the signatures of SGLang 0.5.23's Python wrappers."""

    silu_and_mul_masked_post_quant: Callable[..., Any]
    per_token_group_quant: Callable[..., Any]
    source: str


_lock = threading.Lock()
_override: HostKernels | None = None
_default: HostKernels | None = None


def _load_sglang() -> HostKernels:
    from sglang.kernels.ops.moe.dsv4 import silu_and_mul_masked_post_quant
    from sglang.kernels.ops.quantization.per_token_group_quant import per_token_group_quant

    return HostKernels(silu_and_mul_masked_post_quant, per_token_group_quant, source="sglang")


def get_host_kernels() -> HostKernels:
    """The installed override, else SGLang's own wrappers (ImportError when SGLang is missing)."""
    global _default
    with _lock:
        if _override is not None:
            return _override
        if _default is None:
            _default = _load_sglang()
        return _default


_SGLANG_KERNEL_FILES = ("kernels/ops/moe/dsv4.py", "kernels/ops/quantization/per_token_group_quant.py")


def host_kernels_source() -> str | None:
    """Where the host kernels come from now, or ``None`` when neither an override nor SGLang is there.

    Cheap: it looks for SGLang's kernel modules on disk without importing SGLang (plugins call it
    from ``supports``); the import happens on the first :func:`get_host_kernels`.
    """
    with _lock:
        if _override is not None:
            return _override.source
        if _default is not None:
            return _default.source
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = pathlib.Path(next(iter(spec.submodule_search_locations)))
    return "sglang" if all((root / rel).is_file() for rel in _SGLANG_KERNEL_FILES) else None


@contextlib.contextmanager
def use_host_kernels(kernels: HostKernels) -> Iterator[HostKernels]:
    """Install ``kernels`` as the host kernels for the duration of the ``with`` block."""
    global _override
    with _lock:
        previous, _override = _override, kernels
    try:
        yield kernels
    finally:
        with _lock:
            _override = previous


def cuda_host_kernels(platform: Platform, min_sm: int | None = None) -> Support:
    """Yes when the call is on CUDA (at least ``sm{min_sm}``) and SGLang's kernels can be reached."""
    if not platform.is_cuda:
        return Support.no(f"requires a CUDA device, the call is on {platform}")
    if min_sm is not None and (platform.sm or 0) < min_sm:
        return Support.no(f"requires CUDA sm{min_sm}+, the device is sm{platform.sm}")
    source = host_kernels_source()
    if source is None:
        return Support.no("SGLang's kernels are not importable (install sglang, or install a HostKernels override)")
    return Support.yes(f"SGLang kernels from {source}")


def sglang_mega_pre_dispatch() -> Callable[..., Any]:
    """SGLang's JIT MegaMoE pre-dispatch kernel, ``sglang.kernels.ops.moe.dsv4.mega_moe_pre_dispatch``
    (SGLang 0.5.23: ``(x, topk_idx, topk_weights, buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights,
    quant_group_size=32, *, shared_x_sf=None, shared_block_m=0, copy_topk=True) -> None``), imported on
    this call. Raises
    ImportError when the installed SGLang does not have it. Not covered by :func:`use_host_kernels`."""
    from sglang.kernels.ops.moe.dsv4 import mega_moe_pre_dispatch

    return mega_moe_pre_dispatch
