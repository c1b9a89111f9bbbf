"""This project's MegaMoE pre-dispatch kernels (Triton), one launch per call.

``pre_dispatch(...)`` quantizes bf16 activations ``x [T, H]`` into the symmetric buffer's ``x`` /
``x_sf`` slots in the format of the variant (FP8 per-32 UE8M0, MXFP4 E2M1 per-32 UE8M0, FP8
per-128 fp32), copies ``topk_idx`` (int64) and ``topk_weights * routed_scaling_factor`` (fp32),
fills rows ``[T, P)`` with ``(-1, 0)``, and optionally writes the fused shared expert's paged scale
copy, bit for bit as :func:`sglang_moe_plugins.ops.mega_moe.formats.pre_dispatch_reference`
(which matches SGLang's JIT kernel for FP8 and sgl-deep-gemm's kernels and torch references).

E2M1 midpoints (``mxf4xmxf4``) round as ``e2m1_ties`` says: ``"even"`` (sgl-deep-gemm 0.2.0+ and the
reference) or ``"toward_zero"`` (sgl-deep-gemm up to 0.1.7, kernel and ``per_token_cast_to_fp4``
alike); the plugin passes the installed release's (:attr:`~sglang_moe_plugins.plugins.deep_gemm.api.DeepGemmApi.e2m1_ties`).

Scheduling: a 1-D grid; programs ``[0, n_quant)`` each take ``BT`` tokens x ``BC`` columns (whole
scale groups) and, in the first column block, the tokens' top-k rows; the remaining programs fill
the padding rows. Divisions that decide a scale use IEEE rounding (``div_rn``), as the references do.
The kernel itself is in :mod:`.pre_dispatch_kernel`.

Triton is imported on first use only.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from ...log import get_logger
from ..triton_common import (
    LowLevelLaunch,
    compile_specialisation,
    next_pow2,
    ordered_arguments,
    pdl_supported,
    triton_has_pdl,
)
from .pre_dispatch_kernel import pre_dispatch_kernel
from .pre_dispatch_tiling import PreDispatchTiling, choose_tiling

__all__ = [
    "PreDispatchTiling",
    "choose_tiling",
    "pre_dispatch",
    "prepare_pre_dispatch",
    "PreDispatchLauncher",
    "FORMAT_CODES",
    "E2M1_TIES",
]

#: variant -> (format code used by the kernel, group size, absmax floor)
FORMAT_CODES = {"fp8xfp4": (0, 32, 1e-10), "mxf4xmxf4": (1, 32, 1e-4), "sm90_fp8": (2, 128, 1e-10)}
_PAD_BLOCK = 1024
#: How E2M1 midpoints may round: to the even code, or toward zero (to the smaller magnitude).
E2M1_TIES = ("even", "toward_zero")
logger = get_logger(__name__)


def _use_pdl(device: torch.device) -> bool:
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return pdl_supported(device.index if device.index is not None else torch.cuda.current_device())


def _check_buffers(
    buf_x: torch.Tensor,
    buf_x_sf: torch.Tensor,
    buf_topk_idx: torch.Tensor,
    buf_topk_weights: torch.Tensor,
    fmt: int,
    shared_x_sf: torch.Tensor | None,
) -> None:
    if not (buf_x.is_contiguous() and buf_topk_idx.is_contiguous() and buf_topk_weights.is_contiguous()):
        raise ValueError("buf_x, buf_topk_idx and buf_topk_weights must be contiguous")
    if buf_x_sf.stride(-1) != 1:
        raise ValueError("buf_x_sf must have unit stride along its last dimension")
    if shared_x_sf is not None and fmt != 0:
        raise ValueError("shared_x_sf is only written for fp8xfp4")


def _arguments(
    x: Any,
    topk_ids: Any,
    topk_weights: Any,
    strides: tuple[int, int, int],
    num_tokens: int,
    hidden: int,
    buf_x: torch.Tensor,
    buf_x_sf: torch.Tensor,
    buf_topk_idx: torch.Tensor,
    buf_topk_weights: torch.Tensor,
    *,
    variant: str,
    routed_scaling_factor: float,
    shared_x_sf: torch.Tensor | None,
    shared_block_m: int,
    tiling: PreDispatchTiling | None,
    use_pdl: bool,
    e2m1_ties: str = "even",
) -> tuple[tuple[int], tuple, dict[str, Any]] | None:
    """``(grid, arguments, keyword arguments)`` of the launch, or None when the grid is empty.
    ``x`` / ``topk_ids`` / ``topk_weights``: tensors, or dtypes (compiled as aligned pointers)."""
    fmt, group_size, floor = FORMAT_CODES[variant]
    padded_max, top_k = buf_topk_idx.shape
    if num_tokens > padded_max:
        raise ValueError(f"num_tokens={num_tokens} exceeds the buffer's {padded_max} rows")
    if hidden % group_size:
        raise ValueError(f"hidden={hidden} is not a multiple of group_size={group_size}")
    tiling = tiling or choose_tiling(num_tokens, hidden, group_size, packed_fp4=fmt == 1)
    n_cb = -(-hidden // tiling.block_cols)
    n_quant = -(-num_tokens // tiling.block_tokens) * n_cb
    n_pad = -(-(padded_max - num_tokens) * top_k // _PAD_BLOCK)
    if n_quant + n_pad == 0:
        return None
    sf_row_stride = buf_x_sf.stride(0) if fmt == 2 else buf_x_sf.stride(0) * buf_x_sf.element_size()
    write_shared = shared_x_sf is not None and num_tokens > 0
    args = (
        x,
        strides[0],
        topk_ids,
        strides[1],
        topk_weights,
        strides[2],
        buf_x,
        hidden // 2 if fmt == 1 else hidden,
        buf_x_sf,
        sf_row_stride,
        buf_topk_idx,
        buf_topk_weights,
        shared_x_sf if write_shared else buf_x_sf,
        shared_x_sf.stride(1) if write_shared else 0,  # type: ignore[union-attr]  # write_shared: not None
        max(int(shared_block_m), 1),
        num_tokens,
        hidden,
        padded_max,
        n_quant,
        n_cb,
        float(routed_scaling_factor),
    )
    kwargs: dict[str, Any] = dict(
        K=top_k,
        KP=next_pow2(top_k),
        FMT=fmt,
        GS=group_size,
        FLOOR=floor,
        BT=tiling.block_tokens,
        BC=tiling.block_cols,
        PAD=_PAD_BLOCK,
        WRITE_SHARED=write_shared,
        COPY_TOPK=True,
        PDL=use_pdl,
        EVICT_FIRST=tiling.evict_first,
        TIES_EVEN=e2m1_ties == "even",
        num_warps=tiling.num_warps,
    )
    if use_pdl and triton_has_pdl():  # an explicit pdl=True on an older Triton: in-kernel wait only
        kwargs["launch_pdl"] = True
    return (n_quant + n_pad,), args, kwargs


def pre_dispatch(
    x: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    buf_x: torch.Tensor,
    buf_x_sf: torch.Tensor,
    buf_topk_idx: torch.Tensor,
    buf_topk_weights: torch.Tensor,
    *,
    variant: str,
    routed_scaling_factor: float = 1.0,
    shared_x_sf: torch.Tensor | None = None,
    shared_block_m: int = 0,
    tiling: PreDispatchTiling | None = None,
    pdl: bool | None = None,
    e2m1_ties: str = "even",
) -> None:
    """Launch the pre-dispatch for ``variant`` (``fp8xfp4`` | ``mxf4xmxf4`` | ``sm90_fp8``) through
    Triton's JIT dispatch, deciding everything again on each call (:func:`prepare_pre_dispatch`
    decides it once per buffer set and token count).

    ``buf_x``: contiguous, >= ``P * H`` bytes (FP8) or ``P * H / 2`` bytes (E2M1), any dtype;
    ``buf_x_sf``: int32 ``[P, G/4]`` with unit last stride (UE8M0 formats) or fp32 ``[P, G]``;
    ``buf_topk_idx`` int64 / ``buf_topk_weights`` fp32 ``[P, K]`` contiguous; ``x`` bf16 with unit
    column stride; ``topk_ids`` integer and ``topk_weights`` floating ``[T, K]`` (None if T == 0).
    ``pdl``: launch with programmatic dependent launch (default: on sm90+ when Triton supports it; the
    kernel waits for the previous grid before touching memory, as SGLang's JIT kernel does).
    ``e2m1_ties``: how E2M1 midpoints round (:data:`E2M1_TIES`; ``mxf4xmxf4`` only).
    """
    _check_ties(e2m1_ties)
    fmt = FORMAT_CODES[variant][0]
    _check_buffers(buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, fmt, shared_x_sf)
    num_tokens, hidden = x.shape
    if num_tokens == 0:  # no quantize programs run: hand the kernel valid (unused) pointers
        x, topk_ids, topk_weights = buf_topk_weights, buf_topk_idx, buf_topk_weights
    use_pdl = _use_pdl(x.device) if pdl is None else bool(pdl)
    plan = _arguments(
        x,
        topk_ids,
        topk_weights,
        (x.stride(0), topk_ids.stride(0), topk_weights.stride(0)),  # type: ignore[union-attr]  # None only if T == 0
        num_tokens,
        hidden,
        buf_x,
        buf_x_sf,
        buf_topk_idx,
        buf_topk_weights,
        variant=variant,
        routed_scaling_factor=routed_scaling_factor,
        shared_x_sf=shared_x_sf,
        shared_block_m=shared_block_m,
        tiling=tiling,
        use_pdl=use_pdl,
        e2m1_ties=e2m1_ties,
    )
    if plan is not None:
        grid, args, kwargs = plan
        pre_dispatch_kernel()[grid](*args, **kwargs)


class PreDispatchLauncher:
    """:func:`pre_dispatch` into one fixed set of buffers: ``launcher(x, topk_ids, topk_weights)``.

    Per distinct ``(x.shape, strides, dtypes, device)`` (in practice: per token count) the tiling, the
    grid, the argument tuple and the PDL choice are computed once and the kernel compiled; each call
    then reads the three input pointers and calls the compiled kernel's launcher directly (see
    ``_triton_launch``). Inputs that are not 16-byte aligned take the JIT path. Thread-safe."""

    def __init__(
        self,
        buf_x: torch.Tensor,
        buf_x_sf: torch.Tensor,
        buf_topk_idx: torch.Tensor,
        buf_topk_weights: torch.Tensor,
        *,
        variant: str,
        routed_scaling_factor: float = 1.0,
        shared_x_sf: torch.Tensor | None = None,
        shared_block_m: int = 0,
        pdl: bool | None = None,
        max_plans: int = 1024,
        e2m1_ties: str = "even",
    ) -> None:
        _check_ties(e2m1_ties)
        if variant not in FORMAT_CODES:
            raise ValueError(f"variant={variant!r} is not one of {tuple(FORMAT_CODES)}")
        _check_buffers(buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights, FORMAT_CODES[variant][0], shared_x_sf)
        self.buffers = (buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights)
        self.options: dict[str, Any] = dict(
            variant=variant,
            routed_scaling_factor=float(routed_scaling_factor),
            shared_x_sf=shared_x_sf,
            shared_block_m=int(shared_block_m),
            e2m1_ties=e2m1_ties,
        )
        self.pdl = pdl
        self.max_plans = int(max_plans)
        self._plans: dict[tuple, Any] = {}
        self._lock = threading.Lock()
        self.plans_built = 0  # how many plans were computed (tests: once per key)

    def __call__(self, x: torch.Tensor, topk_ids: torch.Tensor | None, topk_weights: torch.Tensor | None) -> None:
        if x.shape[0] == 0:
            key: tuple = (x.shape, x.get_device())
        else:
            key = (
                x.shape,
                x.stride(0),
                topk_ids.stride(0),  # type: ignore[union-attr]  # None only if T == 0 (no cast: the hot path)
                topk_weights.stride(0),  # type: ignore[union-attr]
                topk_ids.dtype,  # type: ignore[union-attr]
                topk_weights.dtype,  # type: ignore[union-attr]
                x.get_device(),
            )
        plan = self._plans.get(key)
        if plan is None:
            plan = self._build(key, x, topk_ids, topk_weights)
        plan(x, topk_ids, topk_weights)

    def _jit(self, x: torch.Tensor, topk_ids: Any, topk_weights: Any) -> None:
        pre_dispatch(x, topk_ids, topk_weights, *self.buffers, pdl=self.pdl, **self.options)

    def _build(self, key: tuple, x: torch.Tensor, topk_ids: Any, topk_weights: Any) -> Any:
        plan = self._make_plan(x, topk_ids, topk_weights)
        with self._lock:
            if len(self._plans) >= self.max_plans:
                logger.warning(
                    "mega pre-dispatch: more than %d input layouts; dropping the cached launches", self.max_plans
                )
                self._plans.clear()
            self._plans[key] = plan
            self.plans_built += 1
        return plan

    def _make_plan(self, x: torch.Tensor, topk_ids: Any, topk_weights: Any) -> Any:
        num_tokens, hidden = x.shape
        if x.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
            return self._jit
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        use_pdl = pdl_supported(index) if self.pdl is None else bool(self.pdl)
        _buf_x, _buf_x_sf, buf_topk_idx, buf_topk_weights = self.buffers
        if num_tokens == 0:
            inputs: tuple[Any, Any, Any] = (buf_topk_weights, buf_topk_idx, buf_topk_weights)
            strides = (buf_topk_weights.stride(0), buf_topk_idx.stride(0), buf_topk_weights.stride(0))
        else:
            inputs = (x.dtype, topk_ids.dtype, topk_weights.dtype)  # compiled for aligned pointers
            strides = (x.stride(0), topk_ids.stride(0), topk_weights.stride(0))
        planned = _arguments(
            *inputs, strides, num_tokens, hidden, *self.buffers, tiling=None, use_pdl=use_pdl, **self.options
        )
        if planned is None:
            return _nothing
        grid, args, kwargs = planned
        try:
            kernel = pre_dispatch_kernel()
            compiled = compile_specialisation(kernel, args, kwargs, index)
            tail = ordered_arguments(kernel.arg_names, tuple(_pointer(a) for a in args), kwargs)[6:]
            low = LowLevelLaunch(compiled, (grid[0], 1, 1), tail, index)
        except Exception as exc:  # noqa: BLE001 - another Triton: the JIT path launches the same kernel
            _warn_once(f"{type(exc).__name__}: {exc}")
            return self._jit
        if num_tokens == 0:
            fixed = tuple(_pointer(a) for a in args[:6])
            return lambda x, topk_ids, topk_weights: low(*fixed)
        sx, si, sw = strides

        def prepared(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> None:
            px, pi, pw = x.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr()
            if (px | pi | pw) & 15:
                self._jit(x, topk_ids, topk_weights)
            else:
                low(px, sx, pi, si, pw, sw)

        prepared.low_level = low  # type: ignore[attr-defined]  # for tests and benchmarks
        return prepared


def prepare_pre_dispatch(
    buf_x: torch.Tensor,
    buf_x_sf: torch.Tensor,
    buf_topk_idx: torch.Tensor,
    buf_topk_weights: torch.Tensor,
    *,
    variant: str,
    routed_scaling_factor: float = 1.0,
    shared_x_sf: torch.Tensor | None = None,
    shared_block_m: int = 0,
    pdl: bool | None = None,
    e2m1_ties: str = "even",
) -> PreDispatchLauncher:
    """A launcher ``(x, topk_ids, topk_weights) -> None`` that writes what :func:`pre_dispatch` writes
    into these buffers, bit for bit, with the per-call host work of a direct kernel launch. Build it
    once per symmetric buffer (the buffer tensors are kept alive by it)."""
    return PreDispatchLauncher(
        buf_x,
        buf_x_sf,
        buf_topk_idx,
        buf_topk_weights,
        variant=variant,
        routed_scaling_factor=routed_scaling_factor,
        shared_x_sf=shared_x_sf,
        shared_block_m=shared_block_m,
        pdl=pdl,
        e2m1_ties=e2m1_ties,
    )


def _check_ties(e2m1_ties: str) -> None:
    if e2m1_ties not in E2M1_TIES:
        raise ValueError(f"e2m1_ties={e2m1_ties!r} is not one of {E2M1_TIES}")


def _pointer(arg: Any) -> Any:
    return arg.data_ptr() if isinstance(arg, torch.Tensor) else arg


def _nothing(x: Any, topk_ids: Any, topk_weights: Any) -> None:
    return None


_WARNED: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        logger.warning("mega pre-dispatch: launching through Triton's JIT dispatch (%s)", reason)
