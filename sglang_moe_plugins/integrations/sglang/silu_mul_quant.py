"""The AROUND hook of SGLang's ``_varlen_deep_gemm_silu_mul_quant`` (op ``silu_mul_quant``), its
raw-argument key, and the host's scale-layout rule.

The hook binds once per shape key: a call whose raw arguments (tensor shapes, dtypes, devices,
contiguity, flags and their types, the host's UE8M0 mode) were seen before goes straight to its bound
op (no argument checks, no selection), since every check that does not read tensor data is decided by
those arguments. The bound op is kept by the Selector (``remember`` / ``call_cache``), never here.

Calls the op does not model go to SGLang's original function (:func:`.entry.delegate`):
``gemm1_alpha`` / ``gemm1_clamp_limit`` (the gpt-oss activation) and ``masked_m=None``. So do, per key (kept as
``HOST_FUNCTION``): under ``parity = true``, every call the installed release serves itself
(:func:`.stock_rules.masked_stock_crash` is None), and, without ``strict``, a CUDA call that only a withheld
pure-torch reference could run (``reference_on_gpu = false``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import api
from ...core.decide import HOST_FUNCTION
from ...errors import NoPluginAvailableError
from ...ops import silu_mul_quant as smq
from ...ops.silu_mul_quant import ScaleLayout
from .entry import CALLS, delegate, delegate_withheld
from .stock_rules import masked_stock_crash
from .versions import SmqHost, active_target

__all__ = ["silu_mul_quant_hook", "refresh_host_state", "host_scale_layout", "release_scale_layout"]


def host_scale_layout(dsv4_branch: bool, ue8m0: bool) -> ScaleLayout:
    """The scale layout SGLang's ``_varlen_deep_gemm_silu_mul_quant`` returns on a call.

    ``dsv4_branch``: the call takes the DSV4 JIT branch (``swiglu_limit``, ``swizzle`` or
    ``silu_mul_keep_fp32`` set); ``ue8m0``: DeepGEMM's UE8M0 scale mode
    (``deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0``). UE8M0 scales are packed on both branches; otherwise
    the DSV4 branch returns row-major fp32 and the default branch TMA-aligned column-major fp32.
    """
    if ue8m0:
        return "ue8m0_packed"
    return "row_major" if dsv4_branch else "column_major"


def release_scale_layout(host: SmqHost, arguments: dict[str, Any], ue8m0: bool) -> ScaleLayout:
    """The op's ``scale_layout`` for a call with these (bound) arguments on the release of ``host``."""
    return host_scale_layout(host.dsv4_branch(arguments), ue8m0)


def _smq_arguments(
    gateup_output,
    masked_m,
    group_size,
    topk,
    swiglu_limit=None,
    swizzle=False,
    gemm1_alpha=None,
    gemm1_clamp_limit=None,
    num_real_tokens=None,
    silu_mul_keep_fp32=False,
):
    """The host function's parameters (SGLang 0.5.23; 0.5.16-0.5.20 lack the last one, and never pass it),
    bound by the interpreter itself: positional or keyword, with the host's defaults."""
    return (
        gateup_output,
        masked_m,
        group_size,
        topk,
        swiglu_limit,
        swizzle,
        gemm1_alpha,
        gemm1_clamp_limit,
        num_real_tokens,
        silu_mul_keep_fp32,
    )


_host_ue8m0: bool | None = None


def _scale_ue8m0() -> bool:
    """SGLang's DeepGEMM UE8M0 scale mode, read on the first call and kept (see refresh_host_state)."""
    global _host_ue8m0
    if _host_ue8m0 is None:
        try:
            from sglang.srt.layers import deep_gemm_wrapper
        except ImportError:  # outside SGLang (benchmarks, tests): fp32 scales
            _host_ue8m0 = False
        else:
            _host_ue8m0 = bool(deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0)
    return _host_ue8m0


def refresh_host_state() -> None:
    """Read SGLang's UE8M0 mode again on the next call (it is read once: SGLang sets it at start-up)."""
    global _host_ue8m0
    _host_ue8m0 = None


def _stock_serves(host: SmqHost, g: Any, group_size: Any, limit: Any, swizzle: Any, keep: Any) -> bool:
    """Whether the release's own function serves this call (parity); False when the arguments cannot be read."""
    try:
        experts, rows, width = g.shape
        crash = masked_stock_crash(
            host.jit_arguments,
            experts=int(experts),
            rows=int(rows),
            hidden=int(width) // 2,
            group_size=int(group_size),
            swiglu_limit=limit,
            swizzle=bool(swizzle),
            keep_fp32=bool(keep),
        )
    except (AttributeError, TypeError, ValueError):  # not a 3-d tensor: describe() names what is wrong
        return False
    return crash is None


_smq_calls = CALLS[smq.OP].hit


def silu_mul_quant_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``_varlen_deep_gemm_silu_mul_quant``: same arguments, same return value."""
    _smq_calls()
    try:
        g, m, group_size, topk, limit, swizzle, alpha, clamp, real_tokens, keep = _smq_arguments(*args, **kwargs)
    except TypeError:  # not a valid call of the host function: let the host say so
        return original(*args, **kwargs)
    if alpha is not None or clamp is not None:
        return delegate(
            smq.OP, "gemm1_alpha", "gemm1_alpha / gemm1_clamp_limit (the gpt-oss activation)", original, args, kwargs
        )
    if m is None:
        return delegate(smq.OP, "masked_m=None", "masked_m=None", original, args, kwargs)
    ue8m0 = _host_ue8m0 if _host_ue8m0 is not None else _scale_ue8m0()
    selector = api.current_selector()
    try:
        # Everything describe() checks that does not read tensor data; types too (True == 1 == 1.0).
        key = (
            g.shape,
            g.dtype,
            g.device,
            g.is_contiguous(),
            m.shape,
            m.dtype,
            m.device,
            m.is_contiguous(),
            group_size,
            group_size.__class__,
            topk,
            topk.__class__,
            limit,
            limit.__class__,
            swizzle,
            swizzle.__class__,
            keep,
            keep.__class__,
            ue8m0,
        )
        bound = selector.call_cache.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable arguments: describe() says what is wrong
        key = bound = None  # type: ignore[assignment]  # no key: this call binds afresh and is not remembered
    if bound is not None:
        if bound is HOST_FUNCTION:
            return delegate(smq.OP, "host", "parity or a withheld reference (per key)", original, args, kwargs)
        try:
            outputs = selector.call(bound, smq.SiluMulQuantInputs(g, m, real_tokens, True), device=key[2])
        except NoPluginAvailableError as exc:  # a kernel failed at run time and only the withheld reference is left
            if not exc.to_host:
                raise
            return delegate_withheld(smq.OP, original, args, kwargs)
        return outputs.out, outputs.scale
    # First call of this key (or past the cache's cap): check, select, bind. Raises InvalidArgumentError
    # for invalid arguments and NoPluginAvailableError when no plugin can run the call.
    host: SmqHost = active_target(smq.OP).host  # type: ignore[assignment]  # the silu_mul_quant target's record
    if selector.registry.config.parity and _stock_serves(host, g, group_size, limit, swizzle, keep):
        if key is not None:
            selector.remember_host(key)
        return delegate(smq.OP, "parity", "parity = true: calls SGLang's own kernels serve", original, args, kwargs)
    # The layout the host itself returns on this call's branch, per release (versions.SmqHost).
    layout = release_scale_layout(host, {"swiglu_limit": limit, "swizzle": swizzle, "silu_mul_keep_fp32": keep}, ue8m0)
    shape, config = smq.describe(
        g, m, group_size=group_size, topk=topk, swiglu_limit=limit, swizzle=swizzle, scale_layout=layout, keep_fp32=keep
    )
    try:
        bound = selector.bind(smq.OP, shape, config)
    except NoPluginAvailableError as exc:
        if not exc.to_host:
            raise
        if key is not None:
            selector.remember_host(key)
        return delegate_withheld(smq.OP, original, args, kwargs)
    try:
        outputs = selector.call(bound, smq.SiluMulQuantInputs(g, m, real_tokens, True))
    except NoPluginAvailableError as exc:  # the plugin failed at run time and only the withheld reference is left
        if not exc.to_host:
            raise
        return delegate_withheld(smq.OP, original, args, kwargs)
    if key is not None:
        # Kept only once its outputs were checked, and only while it is the key's current bound op (a
        # plugin that failed on this call and fell back is not remembered; the next call binds afresh).
        selector.remember(key, bound)
    return outputs.out, outputs.scale
