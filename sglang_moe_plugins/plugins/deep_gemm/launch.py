"""The launch closure of a DeepGEMM MegaMoE variant, built once per shape and config.

:func:`build_launch` imports ``deep_gemm``, picks the buffer source, the SM reservation, the
pre-dispatch and the entry point's keyword arguments, passing only what the installed release takes
(:meth:`~sglang_moe_plugins.plugins.deep_gemm.api.DeepGemmApi.takes`), and returns ``launch(inputs, outputs)``.
Per call it checks the token count, finds the cached buffer for ``(group, SM count)``, runs the
pre-dispatch and the kernel: no import, no environment read, one SM reservation. What it takes from
SGLang (its buffer cache, SM reservation and JIT pre-dispatch) comes from :mod:`.sglang_host`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ...errors import InvalidArgumentError, KernelNotAvailableError
from ...ops.mega_moe import OP, MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape
from .api import DeepGemmApi, load_deep_gemm
from .sglang_host import HOST_BUFFER_KEYWORDS, host_helpers, sglang_jit_pre_dispatch

__all__ = ["build_launch"]

_RESERVED_SMS_ENV = "SGLANG_OPT_DEEPGEMM_MEGA_MOE_RESERVED_SMS"

_buffer_lock = threading.Lock()
_buffers: dict[tuple, Any] = {}

Launch = Callable[[MegaMoEInputs, MegaMoEOutputs], None]

#: The top-k dtypes the prepared Triton pre-dispatch reads as they are (no per-call copy).
_NATIVE_IDS = (torch.int32, torch.int64)
_NATIVE_WEIGHTS = (torch.float32, torch.bfloat16)


def _sm_limit(device: torch.device | None = None) -> int:
    """SGLang's ``_mega_moe_max_num_sms`` on SM100: the physical count less the reserved SMs (default 2)."""
    try:
        reserved = int(os.environ.get(_RESERVED_SMS_ENV, 2))
    except ValueError:
        reserved = 2
    physical = torch.cuda.get_device_properties(
        device if device is not None else torch.cuda.current_device()
    ).multi_processor_count
    return max(2, physical - max(reserved, 0))


def _make_reserve(deep_gemm: Any, host_context: Callable[[Any], Any] | None) -> Callable[[torch.device], Any]:
    """The SM100 reservation as a context factory of the call's device (SGLang's own when it is loaded)."""
    if host_context is not None:
        return lambda device: host_context(deep_gemm)
    limit: list[int | None] = []

    @contextlib.contextmanager
    def reserve(device: torch.device) -> Iterator[None]:
        if not limit:  # once: the device's SM count and the environment
            limit.append(_sm_limit(device) if device.type == "cuda" else None)
        if limit[0] is None:
            yield
            return
        current = deep_gemm.get_num_sms()
        target = min(limit[0], current)
        target -= target % 2
        if target == current:
            yield
            return
        deep_gemm.set_num_sms(target)
        try:
            yield
        finally:
            deep_gemm.set_num_sms(current)

    return reserve


def build_launch(
    variant: Any, api: DeepGemmApi, choice: str, shape: MegaMoEShape, config: MegaMoEConfig, plugin: str
) -> Launch:
    """The launch closure of ``variant`` (a :class:`~.plugin.Variant`) for one shape and config."""
    deep_gemm = load_deep_gemm()
    host_buffer, host_context = host_helpers(api)
    if (
        host_buffer is not None
        and shape.num_shared_experts
        and "num_shared_experts" not in getattr(host_buffer, "keywords", HOST_BUFFER_KEYWORDS)
    ):
        host_buffer = None  # that release's helper makes no shared-expert buffers: deep_gemm's own
    cap, top_k, hidden = shape.max_tokens_per_rank, shape.top_k, shape.hidden
    sm100 = variant.arch == "sm100"
    reserve = _make_reserve(deep_gemm, host_context) if sm100 else None

    # -- the buffer: SGLang's cache, else ours; per (group, SM count) as SGLang keys it
    buffer_args = (shape.num_experts, cap, top_k, hidden, shape.intermediate)
    buffer_kwargs: dict[str, Any] = {}
    if api.takes("get_symm_buffer_for_mega_moe", "num_shared_experts"):
        buffer_kwargs["num_shared_experts"] = shape.num_shared_experts
    if api.takes("get_symm_buffer_for_mega_moe", "mma_type"):
        buffer_kwargs["mma_type"] = variant.mma_type
    if api.takes("get_symm_buffer_for_mega_moe", "activation"):
        buffer_kwargs["activation"] = config.activation
    get_buffer = deep_gemm.get_symm_buffer_for_mega_moe
    bound: dict[tuple[int, int], Any] = {}

    def buffer(group: Any) -> Any:
        key = (id(group), deep_gemm.get_num_sms())
        buf = bound.get(key)
        if buf is None:
            if host_buffer is not None:
                buf = host_buffer(
                    group,
                    *buffer_args,
                    num_shared_experts=shape.num_shared_experts,
                    mma_type=variant.mma_type,
                    activation=config.activation,
                )
            else:
                full = (*key, *buffer_args, tuple(sorted(buffer_kwargs.items())))
                with _buffer_lock:
                    buf = _buffers.get(full)
                    if buf is None:
                        buf = _buffers[full] = get_buffer(group, *buffer_args, **buffer_kwargs)
            bound[key] = buf
        return buf

    # -- the pre-dispatch, bound once
    shared = shape.num_shared_experts > 0
    block_m: dict[int, int] = {}

    def shared_block_m(buf: Any, num_tokens: int) -> int:
        n = max(num_tokens, 1)
        value = block_m.get(n)
        if value is None:
            value = block_m[n] = int(
                deep_gemm.get_block_m_for_mega_moe(
                    num_ranks=buf.group.size(),
                    num_experts=buf.num_experts,
                    num_max_tokens_per_rank=buf.num_max_tokens_per_rank,
                    num_tokens=n,
                    num_topk=buf.num_topk,
                    mma_type=variant.mma_type,
                )
            )
        return value

    pre_dispatch = _pre_dispatch(variant, api, choice, deep_gemm, config)
    native = choice == "triton"  # the prepared launcher reads int32/int64 ids, fp32/bf16 weights as they are

    # -- the entry point
    kernel = getattr(deep_gemm, variant.kernel)
    if sm100:
        kernel_kwargs = dict(
            activation=config.activation,
            activation_clamp=config.activation_clamp,
            fast_math=True,
            recipe=variant.recipe,
        )
    else:
        kernel_kwargs = dict(
            recipe=variant.recipe, activation="swiglu", activation_clamp=config.activation_clamp, fast_math=True
        )

    def launch(inputs: MegaMoEInputs, outputs: MegaMoEOutputs) -> None:
        x = inputs.hidden_states
        num_tokens = x.shape[0]
        if num_tokens > cap:
            raise InvalidArgumentError(
                OP,
                "hidden_states.shape[0]",
                num_tokens,
                f"<= max_tokens_per_rank={cap} (SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK)",
                plugin,
            )
        y = outputs.y
        if y.shape[0] < max(num_tokens, 1):
            raise InvalidArgumentError(
                OP, "outputs.y.shape[0]", y.shape[0], f">= max(num_tokens, 1) = {max(num_tokens, 1)}", plugin
            )
        group = inputs.ep_group
        if group is None:
            raise KernelNotAvailableError(
                f"{plugin}: DeepGEMM MegaMoE needs the expert-parallel process group (MegaMoEInputs.ep_group)"
            )
        if num_tokens > 0:
            ids, weights = inputs.topk_ids, inputs.topk_weights  # tensors when T > 0 (no cast: the hot path)
            if not native or ids.dtype not in _NATIVE_IDS:  # type: ignore[union-attr]
                ids = ids.to(torch.int32)  # type: ignore[union-attr]
            if not native or weights.dtype not in _NATIVE_WEIGHTS:  # type: ignore[union-attr]
                weights = weights.to(torch.float32)  # type: ignore[union-attr]
        elif native:
            ids = weights = None
        else:
            ids = x.new_empty((0, top_k), dtype=torch.int32)
            weights = x.new_empty((0, top_k), dtype=torch.float32)
        with reserve(x.device) if reserve is not None else contextlib.nullcontext():
            buf = buffer(group)
            has_shared = shared and inputs.shared_l1_weights is not None
            bm = shared_block_m(buf, num_tokens) if has_shared else 0
            pre_dispatch(x, ids, weights, buf, num_tokens, bm, has_shared)
            if has_shared:
                kernel(
                    y,
                    inputs.l1_weights,
                    inputs.l2_weights,
                    buf,
                    shared_l1_weights=inputs.shared_l1_weights,
                    shared_l2_weights=inputs.shared_l2_weights,
                    **kernel_kwargs,
                )
            else:
                kernel(y, inputs.l1_weights, inputs.l2_weights, buf, **kernel_kwargs)

    return launch


def _pre_dispatch(
    variant: Any, api: DeepGemmApi, choice: str, deep_gemm: Any, config: MegaMoEConfig
) -> Callable[..., None]:
    """``pre(x, ids, weights, buf, num_tokens, shared_block_m, shared)`` for the chosen implementation."""
    rsf = config.routed_scaling_factor
    name = variant.variant
    if choice == "triton":
        from .pre_dispatch_triton import prepare_pre_dispatch  # noqa: PLC0415

        # one prepared launcher per symmetric buffer and shared-expert block size (the buffer's
        # tensors and the block size are fixed in it); the buffer object is kept to check identity
        launchers: dict[tuple[int, int], tuple[Any, Callable[..., None]]] = {}
        # E2M1 midpoints as the installed release rounds them (supports() declined an unknown rule)
        ties: dict[str, Any] = (
            {"e2m1_ties": api.e2m1_ties} if name == "mxf4xmxf4" and api.e2m1_ties not in (None, "even") else {}
        )
        launchers_lock = threading.Lock()

        def launcher(buf: Any, block_m: int, shared: bool) -> Callable[..., None]:
            key = (id(buf), block_m if shared else -1)
            with launchers_lock:
                entry = launchers.get(key)
                if entry is None or entry[0] is not buf:
                    entry = launchers[key] = (
                        buf,
                        prepare_pre_dispatch(
                            buf.x,
                            buf.x_sf,
                            buf.topk_idx,
                            buf.topk_weights,
                            variant=name,
                            routed_scaling_factor=rsf,
                            shared_x_sf=buf.shared_l1_acts_sf if shared else None,
                            shared_block_m=block_m if shared else 0,
                            **ties,
                        ),
                    )
            return entry[1]

        def pre(x, ids, weights, buf, num_tokens, block_m, shared):
            entry = launchers.get((id(buf), block_m if shared else -1))
            run = entry[1] if entry is not None and entry[0] is buf else launcher(buf, block_m, shared)
            run(x, ids, weights)

        return pre
    if choice == "torch":
        from ...ops.mega_moe.formats import pre_dispatch_reference as ours  # noqa: PLC0415

        def pre(x, ids, weights, buf, num_tokens, block_m, shared):
            ours(
                x,
                ids,
                weights,
                buf.x,
                buf.x_sf,
                buf.topk_idx,
                buf.topk_weights,
                variant=name,
                routed_scaling_factor=rsf,
                shared_x_sf=buf.shared_l1_acts_sf if shared else None,
                shared_block_m=block_m,
            )

        return pre
    if variant.host_pre_dispatch == "sglang":
        jit = sglang_jit_pre_dispatch()

        def pre(x, ids, weights, buf, num_tokens, block_m, shared):
            if rsf != 1.0:
                weights = weights * rsf
            jit(
                x,
                ids,
                weights,
                buf.x,
                buf.x_sf,
                buf.topk_idx,
                buf.topk_weights,
                quant_group_size=variant.group_size,
                shared_x_sf=buf.shared_l1_acts_sf if shared else None,
                shared_block_m=block_m,
                copy_topk=True,
            )

        return pre
    function = getattr(deep_gemm, variant.host_pre_dispatch)
    group_size = variant.group_size
    if variant.arch == "sm90":  # the SM90 kernel scales the weights itself

        def pre(x, ids, weights, buf, num_tokens, block_m, shared):
            function(
                x,
                ids,
                weights,
                buf.x,
                buf.x_sf,
                buf.topk_idx,
                buf.topk_weights,
                num_tokens=num_tokens,
                group_size=group_size,
                routed_scaling_factor=rsf,
            )

        return pre
    extra = {"mma_type": variant.mma_type} if api.takes(variant.host_pre_dispatch, "mma_type") else {}

    def pre(x, ids, weights, buf, num_tokens, block_m, shared):  # type: ignore[no-redef]  # one closure per branch
        if rsf != 1.0:
            weights = weights * rsf
        function(
            x,
            ids,
            weights,
            buf.x,
            buf.x_sf,
            buf.topk_idx,
            buf.topk_weights,
            num_tokens=num_tokens,
            group_size=group_size,
            **extra,
        )

    return pre
