"""The hooks of op ``silu_mul_quant_contig``: the activation step of SGLang's compact (contiguous) runner.

SGLang 0.5.20-0.5.23's ``DeepGemmRunnerCore._run_contiguous_gemm`` computes its activation step in one of
three branches (:class:`.versions.ContigHost`): ``situ``; the fused branch, SGLang's JIT
``silu_and_mul_contig_post_quant`` into an fp8 buffer and a scale buffer the method allocates (taken with a
swizzled input or ``silu_mul_keep_fp32``); and otherwise two kernels, ``silu_and_mul_clamp`` /
``silu_and_mul`` into a bf16 buffer, then ``sglang_per_token_group_quant_fp8``. The fused branch allocates
exactly the outputs the two-kernel branch returns (same shapes, dtypes and scale layout, from the same UE8M0
flags), and everything after the step is the same code.

Two AROUND hooks serve the step without a copy of SGLang's method:

- :func:`contig_runner_hook` on ``_run_contiguous_gemm`` reads the layer's step (D from the weights, the
  group size, ``swiglu_limit``, swizzle, ``silu_mul_keep_fp32``, DeepGEMM's UE8M0 mode), binds the op for
  it once per key (selection before anything changes: a call no plugin can run raises here), and runs
  SGLang's method with that binding in a thread-local context. For the two-kernel branch it sets the
  release's redirect attribute (``config.silu_mul_keep_fp32``; ``use_swizzle`` on 0.5.20) for the duration
  of the call, so that the method takes its fused branch, and restores it afterwards, also on an error.
- :func:`contig_kernel_hook` on ``silu_and_mul_contig_post_quant`` runs the bound op on SGLang's own
  buffers when the call comes from a hooked runner call and is the step it expects; any other call of that
  function (another caller, no context) runs SGLang's kernel unchanged.

Calls the op does not model go to SGLang's own code unchanged, logged once per kind: the ``situ``
activation, a device other than CUDA (MUSA runs its own two-kernel code) and a layer whose weights are
not a 2-D gate/up matrix. Counted in ``stats()`` as delegations.
"""

from __future__ import annotations

import functools
import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from ... import api
from ...core.bound import BoundOp
from ...core.decide import HOST_FUNCTION
from ...errors import NoPluginAvailableError
from ...ops import silu_mul_quant_contig as contig
from .entry import CALLS, delegate, delegate_withheld
from .silu_mul_quant import _scale_ue8m0
from .versions import ContigHost, active_target

__all__ = ["contig_runner_hook", "contig_kernel_hook", "ContigStep", "runner_step"]

_OP = contig.OP
_contig_calls = CALLS[_OP].hit
_local = threading.local()


class ContigStep(NamedTuple):
    """The activation step a runner call will make, as read from the runner (no tensor data). A named tuple:
    built and hashed on every hooked call, as the key of the step's bound op."""

    hidden: int
    group_size: int
    swiglu_limit: float | None
    swizzle: bool
    keep_fp32: bool
    ue8m0: bool
    #: The call takes SGLang's two-kernel branch, which the hook sends through the fused branch.
    redirected: bool


class _Context(NamedTuple):
    step: ContigStep
    bound: BoundOp
    device: Any


@functools.cache
def _accessors(
    host: ContigHost,
) -> tuple[tuple[Callable[[Any], Any], ...], Callable[[Any], Any], Callable[[Any, Any], None]]:
    """``(fused_when getters, redirect getter, redirect setter)`` of a release's record, made once."""
    *path, name = host.redirect.split(".")
    owner = operator.attrgetter(".".join(path)) if path else (lambda runner: runner)

    def set_redirect(runner: Any, value: Any) -> None:
        setattr(owner(runner), name, value)

    return tuple(operator.attrgetter(n) for n in host.fused_when), operator.attrgetter(host.redirect), set_redirect


def runner_step(
    runner: Any, quant_info: Any, running_state: dict, host: ContigHost, ue8m0: bool, redirect_value: Any = None
) -> ContigStep | str:
    """The step of this runner call, or why the op does not model it (a delegation kind). ``redirect_value``: the
    value SGLang gave the redirect attribute, where another thread's call of this runner has redirected it now."""
    config = runner.config
    if getattr(config, "activation", "silu") != "silu":
        return "activation"
    weight = quant_info.w13_weight
    if weight.dim() != 3 or weight.shape[1] % 2:
        return "weights"
    group = quant_info.block_shape[1] if getattr(quant_info, "use_mxfp8", False) else 128
    getters = _accessors(host)[0]
    fused = any(
        bool(redirect_value if redirect_value is not None and name == host.redirect else get(runner))
        for name, get in zip(host.fused_when, getters)
    )
    swizzle = bool(runner.use_swizzle) and not running_state.get("deepep_v2_disable_contig_swizzle", False)
    return ContigStep(
        hidden=int(weight.shape[1]) // 2,
        group_size=int(group),
        swiglu_limit=runner.swiglu_limit,
        swizzle=swizzle if fused else False,
        # The fused branch computes the product in fp32; the two-kernel branch rounds it to bf16.
        keep_fp32=fused,
        ue8m0=ue8m0,
        redirected=not fused,
    )


#: The step of each runner, read once (SGLang sets what it depends on in the runner's constructor), with the two
#: facts of the call it also depends on: DeepGEMM's UE8M0 mode (as this process read it, ``refresh_host_state``)
#: and the running state's swizzle opt-out.
_steps: weakref.WeakKeyDictionary[Any, tuple[bool, Any, ContigStep | str]] = weakref.WeakKeyDictionary()
#: Redirects in flight: ``id(runner) -> [calls, SGLang's value]``. The first call of a runner sets the attribute, the
#: last one restores SGLang's value, so that calls of one runner from several threads never leave it changed.
_redirects: dict[int, list[Any]] = {}
_redirect_lock = threading.Lock()


def _step_of(runner: Any, quant_info: Any, running_state: dict, ue8m0: bool) -> ContigStep | str:
    """:func:`runner_step`, kept per runner (a weak reference: a freed layer drops its entry)."""
    flag = running_state.get("deepep_v2_disable_contig_swizzle", False)
    try:
        cached = _steps.get(runner)
    except TypeError:  # a runner that cannot be weakly referenced: read every call
        cached = None
    if cached is not None and cached[0] is ue8m0 and cached[1] == flag:
        return cached[2]
    with _redirect_lock:  # read SGLang's value, not one another thread's redirect has set
        in_flight = _redirects.get(id(runner))
        host = active_target(_OP).host
        step = runner_step(runner, quant_info, running_state, host, ue8m0, in_flight[1] if in_flight else None)  # type: ignore[arg-type]
    try:
        _steps[runner] = (ue8m0, flag, step)
    except TypeError:
        pass
    return step


def _bind(step: ContigStep, device: Any) -> BoundOp:
    """The bound op of ``step`` on ``device``, checked, selected and bound now (raises InvalidArgumentError /
    NoPluginAvailableError before SGLang runs)."""
    selector = api.current_selector()
    import torch

    # An empty tensor of the step's width on the call's device: describe() reads its metadata only.
    probe = torch.empty((0, 2 * step.hidden), dtype=torch.bfloat16, device=device)
    shape, config = contig.describe(
        probe,
        group_size=step.group_size,
        swiglu_limit=step.swiglu_limit,
        swizzle=step.swizzle,
        scale_layout="ue8m0_packed" if step.ue8m0 else "row_major",
        keep_fp32=step.keep_fp32,
    )
    return selector.bind(_OP, shape, config)


def contig_runner_hook(
    original: Callable[..., Any],
    runner: Any,
    runner_input: Any,
    quant_info: Any,
    running_state: dict,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """AROUND hook of ``DeepGemmRunnerCore._run_contiguous_gemm``: same arguments, same return value."""
    _contig_calls()
    call = (runner, runner_input, quant_info, running_state, *args)
    device = runner_input.hidden_states.device
    if device.type not in ("cuda", "cpu"):
        return delegate(_OP, "device", f"device {device.type!r} (SGLang's own activation code)", original, call, kwargs)
    step = _step_of(runner, quant_info, running_state, _scale_ue8m0())
    if isinstance(step, str):
        detail = {
            "activation": "an activation other than silu (situ: SGLang's own kernels)",
            "weights": "gate/up weights that are not [E, 2*D, K]",
        }[step]
        return delegate(_OP, step, detail, original, call, kwargs)
    key = (_OP, step, device)
    bound = api.current_selector().call_cache.get(key)
    if bound is HOST_FUNCTION:
        return delegate_withheld(_OP, original, call, kwargs)
    cached = bound is not None
    if bound is None:  # not cached (tested on bound itself, so that the type checker narrows it)
        try:
            bound = _bind(step, device)
        except NoPluginAvailableError as exc:
            if not exc.to_host:
                raise
            api.current_selector().remember_host(key)
            return delegate_withheld(_OP, original, call, kwargs)
    previous = getattr(_local, "context", None)
    _local.context = _Context(step, bound, device)
    try:
        if not step.redirected:
            return original(*call, **kwargs)
        _, get_redirect, set_redirect = _accessors(active_target(_OP).host)
        saved = get_redirect(runner)
        set_redirect(runner, True)
        try:
            return original(*call, **kwargs)
        finally:
            set_redirect(runner, saved)
    finally:
        _local.context = previous
        if not cached and bound.checked:  # kept once its outputs were checked (Selector.remember)
            api.current_selector().remember(key, bound)


def contig_kernel_hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of ``silu_and_mul_contig_post_quant``: serves the runner's step on SGLang's buffers."""
    context: _Context | None = getattr(_local, "context", None)
    if context is None:  # not inside a hooked runner call: another caller's kernel
        return original(*args, **kwargs)
    step = context.step
    try:
        gateup, out, scale, group, ue8m0, transposed, limit, swizzle = _kernel_arguments(*args, **kwargs)
    except TypeError:
        if step.redirected:  # the call the hook sent there, in a form it cannot read: never SGLang's kernel
            raise
        return delegate(_OP, "kernel-arguments", "a fused-kernel call it cannot read", original, args, kwargs)
    matches = (
        group == step.group_size
        and bool(ue8m0) == step.ue8m0
        and bool(transposed) == step.ue8m0
        and limit == step.swiglu_limit
        and (step.redirected or bool(swizzle) == step.swizzle)
        and getattr(gateup, "dim", lambda: 0)() == 2
        and gateup.shape[1] == 2 * step.hidden
    )
    if not matches:
        if step.redirected:  # the method took the branch the hook sent it to, with arguments it did not expect
            from ...errors import MoEPluginsError

            raise MoEPluginsError(
                f"sglang-moe-plugins: op {_OP}: SGLang's fused contiguous kernel was called with group={group}, "
                f"scale_ue8m0={ue8m0}, transposed={transposed}, swiglu_limit={limit}, input shape "
                f"{tuple(getattr(gateup, 'shape', ()))}, not the step the runner hook read ({step}); set "
                f"SGLANG_MOE_PLUGINS_STOCK={_OP} to leave this step to SGLang"
            )
        detail = "a fused-kernel call that differs from the step the runner hook read (SGLang's kernel runs it)"
        return delegate(_OP, "kernel-mismatch", detail, original, args, kwargs)
    outputs = contig.ContigOutputs(out, scale)
    try:
        result = api.current_selector().call(
            context.bound, contig.ContigInputs(gateup, True), outputs, device=context.device
        )
    except NoPluginAvailableError as exc:  # the plugin failed at run time and only the withheld reference is left
        if not exc.to_host:
            raise
        if step.redirected:  # SGLang's runner would not have called its fused kernel here: nothing to hand back to
            exc.add_note(
                f"sglang-moe-plugins: op {_OP}: but this call cannot go to SGLang's function: the package sent the "
                "compact step to the fused kernel, which SGLang's runner does not call for it; the call fails (set "
                f"reference_on_gpu = true, or SGLANG_MOE_PLUGINS_STOCK={_OP})"
            )
            raise
        return delegate_withheld(_OP, original, args, kwargs)
    if result is not outputs:  # a plugin returned outputs of its own: SGLang's GEMM reads only its own buffers
        _copy_back(result, outputs, context.bound.name)
    return None


def _copy_back(result: Any, outputs: Any, plugin: str) -> None:
    """Copy a plugin's own outputs into SGLang's buffers, same shapes only (``copy_`` would broadcast)."""
    for name in ("out", "scale"):
        got, want = getattr(result, name), getattr(outputs, name)
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            from ...errors import OutputValidationError

            raise OutputValidationError(
                f"plugin {plugin!r} returned {name}.shape={tuple(got.shape)} {got.dtype} on op {_OP!r}; SGLang's buffer "
                f"is {tuple(want.shape)} {want.dtype}"
            )
        want.copy_(got)


def _kernel_arguments(
    input,
    output,
    output_scale,
    quant_group_size,
    scale_ue8m0=False,
    transposed=False,
    swiglu_limit=None,
    swizzle=False,
) -> tuple:
    """The kernel wrapper's parameters (identical in 0.5.20-0.5.23), bound by the interpreter itself."""
    return input, output, output_scale, quant_group_size, scale_ue8m0, transposed, swiglu_limit, swizzle
