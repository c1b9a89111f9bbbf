"""Launching the ``silu_mul_quant_contig`` Triton kernel: the launch configuration of a shape key
(:func:`choose_contig_config`, a pure function of the sizes), :func:`launch` (Triton's JIT dispatch; the
interpreter tests and benchmarks) and :func:`prepare_contig_launch` (everything that depends on the shape
key decided once; the plugin's path).

The row count ``M`` is the call's: the kernel takes it as a runtime argument (not specialised, so one
compiled kernel serves every M), and the grid, ``min(row blocks * column chunks, cap)``, is two integer
operations per call; ``cap`` (whole waves of the programs one SM keeps resident) is looked up once per
shape key. ``M = 0`` launches nothing. The UE8M0 scale stride ``Ma = round_up(M, 4)`` is computed from
``M`` (the op's layout contract), not read from the tensor.

This module imports Triton (through :mod:`.triton_kernel`) at its top level; the plugin imports it on its
first ``prepare`` or ``run``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...log import get_logger
from ..triton_common import (
    _hook_idle,
    _runtime_knobs,
    _stream_getter,
    compile_specialisation,
    ordered_arguments,
    pdl_supported,
)
from ..triton_smq.tuning import choose_block_c
from .triton_kernel import silu_mul_quant_contig_kernel

__all__ = ["ContigKernelConfig", "choose_contig_config", "constexprs", "launch", "prepare_contig_launch"]

logger = get_logger(__name__)
_TILE_ELEMS = 2048


@dataclass(frozen=True)
class ContigKernelConfig:
    """``block_m`` rows x ``block_c`` columns per tile on ``num_warps`` warps; the grid is capped at
    ``waves`` whole waves of ``min(ctas_per_sm, resident)`` programs per SM (``waves = 0``: no cap, one
    tile per program)."""

    block_m: int
    block_c: int
    num_warps: int = 4
    ctas_per_sm: int = 16
    waves: int = 0


@functools.lru_cache(maxsize=1024)
def choose_contig_config(
    hidden: int, group_size: int, tile_elems: int = _TILE_ELEMS, waves: int = 0
) -> ContigKernelConfig:
    """Tiles of ``tile_elems`` output elements: ``block_c`` the largest power of two in [group, 1024] that
    pads D by at most 1/8 (``choose_block_c``: 256 -> 256, 768 -> 256, 2880 -> 1024), ``block_m`` rows."""
    block_c = choose_block_c(hidden, group_size)
    return ContigKernelConfig(block_m=max(1, tile_elems // block_c), block_c=block_c, waves=waves)


def scale_strides(rows: int, groups: int, ue8m0: bool) -> tuple[int, int]:
    """(row, group) strides of the op's scale layouts for ``rows`` rows, in elements."""
    return (1, (rows + 3) // 4 * 4) if ue8m0 else (groups, 1)


def constexprs(
    hidden: int,
    group_size: int,
    *,
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: ContigKernelConfig,
    fast_exp: bool,
    on_gpu: bool,
    use_pdl: bool,
) -> dict[str, Any]:
    """The kernel's constexprs and launch options for a shape key."""
    groups = hidden // group_size
    kwargs: dict[str, Any] = dict(
        D=hidden,
        GS=group_size,
        G=groups,
        GP=(groups + 3) // 4,
        BM=config.block_m,
        BC=config.block_c,
        NC=-(-hidden // config.block_c),
        HAS_LIMIT=swiglu_limit is not None,
        SWIZZLE=bool(swizzle),
        UE8M0=bool(ue8m0),
        EVEN_D=hidden % config.block_c == 0,
        FAST_EXP=bool(fast_exp),
        ON_GPU=bool(on_gpu),
        USE_PDL=bool(use_pdl),
        num_warps=config.num_warps,
        num_stages=1,
    )
    if use_pdl:
        kwargs["launch_pdl"] = True
    return kwargs


def launch(
    gateup: torch.Tensor,
    out: torch.Tensor,
    scale: torch.Tensor,
    *,
    group_size: int,
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: ContigKernelConfig | None = None,
    fast_exp: bool = True,
    programs: int | None = None,
    pdl: bool = False,
) -> None:
    """Launch through Triton's JIT dispatch on validated tensors (``swiglu_limit`` already rounded to bf16).
    ``programs`` caps the grid (default: one tile per program)."""
    rows, two_d = gateup.shape
    if rows == 0:
        return
    hidden = two_d // 2
    config = config or choose_contig_config(hidden, group_size)
    on_gpu = gateup.device.type == "cuda"
    use_pdl = on_gpu and pdl and pdl_supported(gateup.get_device())
    kwargs = constexprs(
        hidden,
        group_size,
        swiglu_limit=swiglu_limit,
        swizzle=swizzle,
        ue8m0=ue8m0,
        config=config,
        fast_exp=fast_exp,
        on_gpu=on_gpu,
        use_pdl=use_pdl,
    )
    tiles = -(-rows // config.block_m) * kwargs["NC"]
    grid = (max(1, min(tiles, programs)) if programs else tiles,)
    s_r, s_g = scale_strides(rows, kwargs["G"], ue8m0)
    limit = float(swiglu_limit) if swiglu_limit is not None else 0.0
    silu_mul_quant_contig_kernel[grid](gateup, out, scale, rows, s_r, s_g, limit, **kwargs)


def _nothing(gateup: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
    return None


class _Prepared:
    """The launch of one shape key: ``(gateup, out, scale) -> None``. Per call: the row count, the grid
    (``min(tiles, cap)``), the UE8M0 stride, four pointers and the current stream; then the compiled
    kernel's launcher (``CompiledKernel.run``, what ``JITFunction.run`` ends with). A pointer that is not
    16-byte aligned or a tensor on another device takes the JIT path."""

    __slots__ = (
        "_function",
        "_jit",
        "_knobs",
        "_packed",
        "_run",
        "_stream",
        "block_m",
        "cap",
        "compiled",
        "device_index",
        "groups",
        "nc",
        "tail",
        "ue8m0",
    )

    def __init__(
        self,
        compiled: Any,
        tail: tuple,
        cap: int,
        block_m: int,
        nc: int,
        groups: int,
        ue8m0: bool,
        device_index: int,
        jit: Callable[..., None],
    ) -> None:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        if not hasattr(compiled, "launch_metadata"):
            raise RuntimeError("this Triton's CompiledKernel has no launch_metadata")
        self.compiled, self.tail, self.cap, self.block_m, self.nc = compiled, tail, cap, block_m, nc
        self.groups, self.ue8m0, self.device_index, self._jit = groups, ue8m0, device_index, jit
        self._run, self._function, self._packed = run, function, packed
        self._knobs = _runtime_knobs()
        self._stream = _stream_getter()

    def __call__(self, gateup: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        rows = gateup.shape[0]
        if rows == 0:
            return
        px, po, ps = gateup.data_ptr(), out.data_ptr(), scale.data_ptr()
        if (px | po | ps) & 15 or gateup.get_device() != self.device_index:
            self._jit(gateup, out, scale)
            return
        tiles = (rows + self.block_m - 1) // self.block_m * self.nc
        grid = tiles if tiles < self.cap else self.cap
        s_r, s_g = (1, (rows + 3) // 4 * 4) if self.ue8m0 else (self.groups, 1)
        stream = self._stream(self.device_index)
        knobs = self._knobs
        enter, leave = knobs.launch_enter_hook, knobs.launch_exit_hook
        args = (px, po, ps, rows, s_r, s_g, *self.tail)
        if _hook_idle(enter) and _hook_idle(leave):
            self._run(grid, 1, 1, stream, self._function, self._packed, None, None, None, *args)
            return
        metadata = self.compiled.launch_metadata((grid, 1, 1), stream, *args)
        self._run(grid, 1, 1, stream, self._function, self._packed, metadata, enter, leave, *args)


def prepare_contig_launch(
    hidden: int,
    *,
    group_size: int,
    swiglu_limit: float | None,
    swizzle: bool,
    ue8m0: bool,
    config: ContigKernelConfig | None = None,
    fast_exp: bool = True,
    pdl: bool = True,
    device_index: int | None,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]:
    """A launcher ``(gateup, out, scale) -> None`` for one shape key (``swiglu_limit`` rounded to bf16).
    On CUDA (``device_index``) the kernel is compiled now and calls go to its launcher directly; the
    grid cap is ``waves`` whole waves of resident programs. ``device_index`` None: Triton's CPU
    interpreter through the JIT path."""
    config = config or choose_contig_config(hidden, group_size)
    on_gpu = device_index is not None
    use_pdl = on_gpu and bool(pdl) and pdl_supported(device_index)
    kwargs = constexprs(
        hidden,
        group_size,
        swiglu_limit=swiglu_limit,
        swizzle=swizzle,
        ue8m0=ue8m0,
        config=config,
        fast_exp=fast_exp,
        on_gpu=on_gpu,
        use_pdl=use_pdl,
    )
    limit = float(swiglu_limit) if swiglu_limit is not None else 0.0
    groups, nc, block_m = kwargs["G"], kwargs["NC"], config.block_m

    def jit(gateup: torch.Tensor, out: torch.Tensor, scale: torch.Tensor) -> None:
        rows = gateup.shape[0]
        if rows == 0:
            return
        s_r, s_g = scale_strides(rows, groups, ue8m0)
        tiles = -(-rows // block_m) * nc
        silu_mul_quant_contig_kernel[(min(tiles, cap),)](gateup, out, scale, rows, s_r, s_g, limit, **kwargs)

    cap = 1 << 30
    if device_index is None:  # not on_gpu, tested on device_index itself so that the type checker narrows it
        cap = 3 if config.waves else cap  # the interpreter: several tiles per program, when capped
        return jit
    dtypes = (torch.bfloat16, torch.float8_e4m3fn, torch.int32 if ue8m0 else torch.float32)
    runtime = (1, 1, 1, limit)
    try:
        compiled = compile_specialisation(silu_mul_quant_contig_kernel, dtypes + runtime, kwargs, device_index)
        if config.waves:
            from ..triton_smq.launch import resident_programs_per_sm, sm_count

            per_sm = min(config.ctas_per_sm, resident_programs_per_sm(compiled, config.num_warps, device_index))
            cap = max(1, sm_count(device_index) * per_sm * config.waves)
        tail = ordered_arguments(silu_mul_quant_contig_kernel.arg_names, (0, 0, 0, 0, 0, 0, limit), kwargs)[6:]
        prepared = _Prepared(compiled, tail, cap, block_m, nc, groups, ue8m0, device_index, jit)
    except Exception as exc:
        logger.warning("contig_triton: launching through Triton's JIT dispatch (%s: %s)", type(exc).__name__, exc)
        return jit
    logger.debug(
        "contig_triton: prepared D=%d group=%d on cuda:%d, %s, cap %d, PDL %s",
        hidden,
        group_size,
        device_index,
        config,
        cap,
        use_pdl,
    )
    return prepared
