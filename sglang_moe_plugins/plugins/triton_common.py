"""Shared pieces of this project's Triton launchers (the ``triton`` plugin's ``silu_mul_quant`` kernel,
the MegaMoE Triton pre-dispatch): compile once, launch with precomputed arguments.

``kernel[grid](*args, **constexprs)`` (Triton's JIT dispatch) re-derives on every call what a
bound op already knows: it binds the arguments, specialises each one (dtype, 16-byte alignment,
integer value), hashes them into the compiled-kernel key, looks the kernel up, builds the launch
metadata and calls the launcher. :class:`LowLevelLaunch` does that once: it compiles the
specialisation (``warmup``) and then calls the compiled kernel's launcher (``CompiledKernel.run``,
the call ``JITFunction.run`` itself ends with) with a precomputed argument tuple. Pointers are
passed as integers (``data_ptr()``), so the launcher does not query the driver for each of them.

What the JIT path checks per call and a prepared launch must keep true:

- pointer alignment: the kernel was compiled for 16-byte-aligned pointers; a call whose pointers
  are not all aligned takes the JIT path (which compiles the other specialisation);
- the device: a call on another device than the one compiled for takes the JIT path;
- the stream: read per call (CUDA-graph capture runs on a side stream);
- launch hooks (``triton.knobs.runtime.launch_enter_hook``, e.g. the Proton profiler): when one is
  installed, the launch metadata is built and the hooks passed, as the JIT path does.

Everything here imports Triton lazily; importing this module imports neither Triton nor CUDA.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "ALIGNMENT",
    "next_pow2",
    "pdl_supported",
    "triton_has_pdl",
    "LowLevelLaunch",
    "ordered_arguments",
    "compile_specialisation",
]

#: Pointer alignment the prepared kernels are compiled for (Triton's ``tt.divisibility`` = 16).
ALIGNMENT = 16


def next_pow2(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for ``value <= 1``)."""
    return 1 << max(0, int(value) - 1).bit_length()


@functools.lru_cache(maxsize=1)
def triton_has_pdl() -> bool:
    """Whether this Triton launches with programmatic dependent launch: the ``launch_pdl`` compile
    option (3.4+) and ``gdc_wait`` / ``gdc_launch_dependents`` in ``triton.language.extra.cuda``."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda as tl_cuda
    except Exception:  # noqa: BLE001 - an older or different Triton: launch normally
        return False
    has_option = "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}
    return has_option and hasattr(tl_cuda, "gdc_wait") and hasattr(tl_cuda, "gdc_launch_dependents")


@functools.cache
def pdl_supported(device_index: int) -> bool:
    """Programmatic dependent launch on CUDA device ``device_index``: sm90+ and a Triton that has it."""
    import torch

    return torch.cuda.get_device_capability(device_index)[0] >= 9 and triton_has_pdl()


def ordered_arguments(arg_names: Sequence[str], runtime: Sequence[Any], constexprs: Mapping[str, Any]) -> tuple:
    """All kernel parameters in declaration order, as ``JITFunction.run`` hands them to the launcher:
    the runtime arguments first (as declared), then the constexpr values (the launcher skips them).
    Keys of ``constexprs`` that are not parameters (``num_warps``, ``launch_pdl``, ...) are options."""
    names = list(arg_names)
    tail = names[len(runtime) :]
    missing = [name for name in tail if name not in constexprs]
    if missing:
        raise KeyError(f"constexpr parameters without a value: {missing}")
    return tuple(runtime) + tuple(constexprs[name] for name in tail)


def compile_specialisation(jit_fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any], device_index: int) -> Any:
    """Compile (or fetch from Triton's cache) the kernel ``jit_fn[grid](*args, **kwargs)`` would
    launch on device ``device_index``, with its handles loaded. Pointer arguments may be given as
    ``torch.dtype`` (compiled as 16-byte aligned, as Triton's ``warmup`` does)."""
    import torch

    with torch.cuda.device(device_index):
        compiled = jit_fn.warmup(*args, grid=(1,), **kwargs)
        if hasattr(compiled, "result"):  # asynchronous compilation (a future)
            compiled = compiled.result()
        compiled._init_handles()
    return compiled


@functools.lru_cache(maxsize=1)
def _runtime_knobs() -> Any:
    try:
        from triton import knobs

        return knobs.runtime
    except Exception:  # noqa: BLE001 - Triton < 3.4: hooks live on CompiledKernel
        from triton.compiler import CompiledKernel

        return CompiledKernel


def _hook_idle(hook: Any) -> bool:
    # Triton 3.4+: a HookChain (empty list ``calls`` when unused); before: None or a callable.
    return hook is None or not getattr(hook, "calls", True)


@functools.lru_cache(maxsize=1)
def _stream_getter() -> Callable[[int], int]:
    from triton.runtime.driver import driver

    return driver.active.get_current_stream


class LowLevelLaunch:
    """One compiled kernel, one grid, fixed trailing arguments: ``launch(*leading)`` launches it.

    ``leading`` are the per-call arguments (pointers as ``data_ptr()`` integers first); ``tail``
    every later parameter, constexprs included, exactly as :func:`ordered_arguments` orders them.
    Raises ``RuntimeError`` at construction when this Triton's ``CompiledKernel`` lacks the
    low-level entry point (callers then keep the JIT path)."""

    __slots__ = ("_function", "_knobs", "_packed", "_run", "_stream", "compiled", "device_index", "grid", "tail")

    def __init__(self, compiled: Any, grid: tuple[int, int, int], tail: tuple, device_index: int) -> None:
        run = getattr(compiled, "run", None)
        function = getattr(compiled, "function", None)
        packed = getattr(compiled, "packed_metadata", None)
        if run is None or function is None or packed is None or not hasattr(compiled, "launch_metadata"):
            raise RuntimeError("this Triton's CompiledKernel has no run/function/packed_metadata entry point")
        self.compiled = compiled
        self.grid = grid
        self.tail = tail
        self.device_index = device_index
        self._run = run
        self._function = function
        self._packed = packed
        self._knobs = _runtime_knobs()
        self._stream = _stream_getter()

    def __call__(self, *leading: Any) -> None:
        stream = self._stream(self.device_index)
        gx, gy, gz = self.grid
        knobs = self._knobs
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        if _hook_idle(enter) and _hook_idle(leave):
            self._run(gx, gy, gz, stream, self._function, self._packed, None, None, None, *leading, *self.tail)
            return
        args = (*leading, *self.tail)
        metadata = self.compiled.launch_metadata(self.grid, stream, *args)
        self._run(gx, gy, gz, stream, self._function, self._packed, metadata, enter, leave, *args)
