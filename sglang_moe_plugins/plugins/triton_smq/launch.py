"""Launching the ``silu_mul_quant`` Triton kernel: the plan (grid, runtime arguments, constexprs),
the occupancy lookup behind the grid, and the two launchers: :func:`launch` (Triton's JIT dispatch,
every decision made per call; benchmarks and the interpreter tests) and :func:`prepare_launch` (every
shape-dependent decision made once; the plugin's path).

The kernel itself is in :mod:`.kernel`, the launch configuration in :mod:`.tuning`. This module
imports Triton (through :mod:`.kernel`) at its top level; the plugin imports it on its first
``prepare`` or ``run``.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...log import get_logger
from ..triton_common import LowLevelLaunch, compile_specialisation, next_pow2, ordered_arguments, pdl_supported
from .kernel import silu_mul_quant_kernel
from .tuning import KernelConfig, choose_config, waves_for

__all__ = [
    "LaunchPlan",
    "launch",
    "plan_launch",
    "prepare_launch",
    "pointer_dtypes",
    "sm_count",
    "resident_programs_per_sm",
    "occupancy_records",
]

logger = get_logger(__name__)

_MAX_BLOCK_E = 1024
_MIN_BLOCK_E = 16  # E = 1 ... 16 share one compiled kernel (the masked_m vector is padded, not the work)


@functools.cache
def sm_count(device_index: int) -> int:
    """Multiprocessor count of a CUDA device (device properties only, cached)."""
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


#: (device index, compiled-kernel key) -> (registers per thread, shared bytes, resident programs per SM)
_OCCUPANCY: dict[tuple, tuple[int, int, int]] = {}
_OCCUPANCY_LOCK = threading.Lock()


def occupancy_records() -> dict[tuple, tuple[int, int, int]]:
    """What :func:`launch` learnt about each compiled kernel: registers, shared memory, resident
    programs per SM (a copy; for benchmarks and ``doctor``-style reports)."""
    with _OCCUPANCY_LOCK:
        return dict(_OCCUPANCY)


@functools.lru_cache(maxsize=1)
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def resident_programs_per_sm(compiled, num_warps: int, device_index: int) -> int:
    """How many programs of ``compiled`` (a Triton ``CompiledKernel``) one SM holds at once: the CUDA
    occupancy calculator on the kernel's function handle, or, if the driver call is unavailable, the
    same bound from its registers and shared memory and the device's limits."""
    threads = num_warps * 32
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    lib = _libcuda()
    if lib is not None:
        blocks = ctypes.c_int(0)
        status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks),
            ctypes.c_void_p(int(compiled.function)),
            ctypes.c_int(threads),
            ctypes.c_size_t(shared),
        )
        if status == 0 and blocks.value > 0:
            return int(blocks.value)
    props = torch.cuda.get_device_properties(device_index)
    regs_per_warp = -(-max(int(compiled.n_regs), 1) * 32 // 256) * 256
    by_regs = int(getattr(props, "regs_per_multiprocessor", 65536)) // regs_per_warp // num_warps
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // threads
    smem = int(getattr(props, "shared_memory_per_multiprocessor", 233472))
    by_shared = smem // (shared + 1024) if shared else by_threads
    return max(1, min(by_regs, by_threads, by_shared, 32))


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch derives from the sizes and flags alone: the arguments after the four pointers
    (``runtime``), the constexprs and launch options (``kwargs``, as ``kernel[grid](**kwargs)`` takes
    them) and the grid."""

    runtime: tuple
    kwargs: tuple[tuple[str, Any], ...]
    grid: tuple[int]
    use_pdl: bool

    @property
    def kwargs_dict(self) -> dict[str, Any]:
        return dict(self.kwargs)


def _dtype(arg: Any) -> torch.dtype:
    return arg if isinstance(arg, torch.dtype) else arg.dtype


def plan_launch(
    num_experts: int,
    num_rows: int,
    hidden: int,
    *,
    group_size: int,
    scale_strides: tuple[int, int, int],
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
    device_index: int | None,
    pointers: tuple[Any, Any, Any, Any],
) -> LaunchPlan | None:
    """The launch for these sizes (``None``: nothing to launch). ``device_index`` None means Triton's
    CPU interpreter. ``pointers``: the four tensors, or their dtypes (for the occupancy lookup, which
    compiles the kernel once per specialisation)."""
    if num_experts == 0 or num_rows == 0 or hidden == 0:
        return None
    if config is None:
        config = choose_config(num_experts, num_rows, hidden, group_size)
    groups = hidden // group_size
    block_c = config.block_c
    num_chunks = -(-hidden // block_c)
    max_items = num_experts * (-(-num_rows // config.block_m)) * num_chunks
    on_gpu = device_index is not None
    use_pdl = on_gpu and bool(pdl) and pdl_supported(device_index)
    block_e = min(max(next_pow2(num_experts), _MIN_BLOCK_E), _MAX_BLOCK_E)
    s_e, s_r, s_g = (int(s) for s in scale_strides)
    runtime = (num_experts, num_rows, s_e, s_r, s_g, float(swiglu_limit) if swiglu_limit is not None else 0.0)
    kwargs = dict(
        D=hidden,
        GS=group_size,
        G=groups,
        GP=(groups + 3) // 4,
        BM=config.block_m,
        BC=block_c,
        NC=num_chunks,
        BLOCK_E=block_e,
        ONE_CHUNK=num_experts <= block_e,
        HAS_LIMIT=swiglu_limit is not None,
        SWIZZLE=bool(swizzle),
        UE8M0=bool(ue8m0),
        EVEN_D=hidden % block_c == 0,
        PREFETCH=bool(config.prefetch),
        FAST=on_gpu,
        USE_PDL=use_pdl,
        EARLY_TRIGGER=bool(config.early_trigger),
        IDLE_EXIT=bool(config.idle_exit),
        FRONT_LOAD=bool(config.front_load),
        num_warps=config.num_warps,
        num_stages=1,
    )
    if use_pdl:
        kwargs["launch_pdl"] = True
    if config.max_registers is not None:
        kwargs["maxnreg"] = int(config.max_registers)
    if on_gpu:
        per_sm = min(config.ctas_per_sm, _resident(device_index, tuple(pointers) + runtime, kwargs, config.num_warps))  # type: ignore[arg-type]  # an int when on_gpu
        wave = sm_count(device_index) * per_sm
        programs = wave * waves_for(config, wave)
        if config.max_programs is not None:
            programs = min(programs, int(config.max_programs))
    else:
        programs = 3
    return LaunchPlan(runtime, tuple(kwargs.items()), (max(1, min(max_items, programs)),), use_pdl)


def launch(
    gateup: torch.Tensor,
    masked_m: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor,
    *,
    group_size: int,
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
) -> None:
    """Launch the kernel through Triton's JIT dispatch on already validated tensors; ``scale`` may be
    any strided layout. Every shape-dependent decision is made again on each call: the hooked path
    uses :func:`prepare_launch` instead.

    ``swiglu_limit`` must already be rounded to bf16. Reads no tensor data on the host. ``pdl``
    launches with programmatic dependent launch where the device and Triton support it (the kernel
    reads ``masked_m`` before waiting for the previous kernel, as SGLang's kernel does).
    """
    num_experts, num_rows, two_d = gateup.shape
    index = None
    if gateup.device.type == "cuda":
        index = gateup.device.index if gateup.device.index is not None else torch.cuda.current_device()
    plan = plan_launch(
        num_experts,
        num_rows,
        two_d // 2,
        group_size=group_size,
        scale_strides=scale.stride(),  # type: ignore[arg-type]  # a 3-d scale
        swiglu_limit=swiglu_limit,
        swizzle=swizzle,
        ue8m0=ue8m0,
        config=config,
        pdl=pdl,
        device_index=index,
        pointers=(gateup, masked_m, out, scale),
    )
    if plan is not None:
        silu_mul_quant_kernel[plan.grid](gateup, masked_m, out, scale, *plan.runtime, **plan.kwargs_dict)


def pointer_dtypes(ue8m0: bool) -> tuple[torch.dtype, torch.dtype, torch.dtype, torch.dtype]:
    """The dtypes of ``gateup``, ``masked_m``, ``out`` and ``scale``: :func:`prepare_launch` compiles
    the kernel for them as 16-byte-aligned pointers (``warmup`` wraps each in a ``MockTensor``), the
    specialisation Triton's JIT dispatch computes for aligned tensors of these dtypes."""
    return torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.int32 if ue8m0 else torch.float32


def _nothing(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
    return None


_LOW_LEVEL_FAILED: set[str] = set()


def prepare_launch(
    num_experts: int,
    num_rows: int,
    hidden: int,
    *,
    group_size: int,
    scale_strides: tuple[int, int, int],
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: KernelConfig | None = None,
    pdl: bool = True,
    device_index: int | None,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]:
    """A launcher ``(gateup, masked_m, out, scale) -> None`` with everything that depends on the sizes
    decided now: launch configuration, constexprs, grid (occupancy looked up once), PDL, and the
    scale strides ``scale_strides`` (the layout's; the tensors passed later must have them).

    On a CUDA device (``device_index``) the kernel is compiled now and each call goes straight to the
    compiled kernel's launcher (:class:`~..triton_common.LowLevelLaunch`); a call whose pointers are
    not 16-byte aligned or whose tensors are on another device takes the JIT path, as does every
    call when this Triton lacks the low-level entry point (decided here, once). ``device_index``
    None: Triton's CPU interpreter, through the JIT path.
    """
    dtypes = pointer_dtypes(ue8m0)
    plan = plan_launch(
        num_experts,
        num_rows,
        hidden,
        group_size=group_size,
        scale_strides=scale_strides,
        swiglu_limit=swiglu_limit,
        swizzle=swizzle,
        ue8m0=ue8m0,
        config=config,
        pdl=pdl,
        device_index=device_index,
        pointers=dtypes,
    )
    if plan is None:
        return _nothing
    grid, runtime, kwargs = plan.grid, plan.runtime, plan.kwargs_dict

    def jit(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        silu_mul_quant_kernel[grid](gateup, masked_m, out, scale, *runtime, **kwargs)

    if device_index is None:
        logger.debug(
            "triton silu_mul_quant: prepared E=%d N=%d D=%d, grid %s, Triton's interpreter (JIT path)",
            num_experts,
            num_rows,
            hidden,
            grid,
        )
        return jit
    try:
        compiled = compile_specialisation(silu_mul_quant_kernel, dtypes + runtime, kwargs, device_index)
        tail = ordered_arguments(silu_mul_quant_kernel.arg_names, (0, 0, 0, 0, *runtime), kwargs)[4:]
        low = LowLevelLaunch(compiled, (grid[0], 1, 1), tail, device_index)
    except Exception as exc:  # noqa: BLE001 - another Triton: the JIT path still launches the same kernel
        reason = f"{type(exc).__name__}: {exc}"
        if reason not in _LOW_LEVEL_FAILED:
            _LOW_LEVEL_FAILED.add(reason)
            logger.warning("triton silu_mul_quant: launching through Triton's JIT dispatch (%s)", reason)
        return jit

    def prepared(gateup: torch.Tensor, masked_m: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        px, pm, po, ps = gateup.data_ptr(), masked_m.data_ptr(), out.data_ptr(), scale.data_ptr()
        if (px | pm | po | ps) & 15 or gateup.get_device() != device_index:
            jit(gateup, masked_m, out, scale)
        else:
            low(px, pm, po, ps)

    prepared.low_level = low  # type: ignore[attr-defined]  # for tests and benchmarks
    logger.debug(
        "triton silu_mul_quant: prepared E=%d N=%d D=%d on cuda:%d, grid %s, PDL %s, low-level launch",
        num_experts,
        num_rows,
        hidden,
        device_index,
        grid,
        plan.use_pdl,
    )
    return prepared


def _resident(index: int, args: tuple, constexprs: dict, num_warps: int) -> int:
    """Resident programs per SM of the kernel these arguments compile to (cached per specialisation:
    the first call compiles it through ``warmup`` without launching; pointers may be given as dtypes).
    A per-SM count above this splits the grid into a full wave and a partial one that runs at low
    occupancy (Kimi-K2 EP8 prefill: 16 launched, 12 resident, 51 us instead of 45)."""
    # plan_launch builds constexprs in one fixed order, so its items identify the specialisation as they are
    key = (index, *(_dtype(a) for a in args[:4]), tuple(constexprs.items()))
    with _OCCUPANCY_LOCK:
        hit = _OCCUPANCY.get(key)
    if hit is not None:
        return hit[2]
    try:
        compiled = compile_specialisation(silu_mul_quant_kernel, args, constexprs, index)
        record = (
            int(compiled.n_regs),
            int(getattr(compiled.metadata, "shared", 0) or 0),
            resident_programs_per_sm(compiled, num_warps, index),
        )
    except Exception as exc:  # noqa: BLE001 - a Triton without warmup/n_regs: keep the configured grid
        logger.debug("triton silu_mul_quant: occupancy unknown (%s); using the configured grid", exc)
        record = (0, 0, 1 << 30)
    with _OCCUPANCY_LOCK:
        _OCCUPANCY[key] = record
    logger.debug(
        "triton silu_mul_quant: %s registers, %s B shared, %s resident programs per SM for %s",
        record[0],
        record[1],
        record[2],
        key[-1],
    )
    return record[2]
