"""The DeepGEMM MegaMoE plugins: ``mega_w4a8``, ``mega_w4a4`` and ``mega_sm90_fp8``.

Each ``run`` makes the calls SGLang 0.5.23's ``run_mega_routed_experts`` makes for its variant:

1. the symmetric buffer: the host's cached ``_get_mega_moe_symm_buffer`` when the integration
   passes it (one buffer per layer shape, shared with SGLang's mega gate), else
   ``deep_gemm.get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk,
   hidden, intermediate_hidden, num_shared_experts=..., mma_type=..., activation=...)`` cached here;
2. the pre-dispatch into ``buf.x``/``buf.x_sf``/``buf.topk_idx``/``buf.topk_weights`` (option
   ``pre_dispatch``: ``"triton"`` this project's kernel, ``"host"`` the kernel SGLang uses,
   ``"torch"`` the reference, ``"auto"`` = triton when importable, else host);
3. ``deep_gemm.fp8_fp4_mega_moe(y, l1, l2, buf, shared_l1_weights=..., shared_l2_weights=...,
   activation=..., activation_clamp=..., fast_math=True, recipe=(1, 1, 32))`` inside SGLang's SM
   reservation (SM100), or on SM90 ``deep_gemm.fp8_mega_moe(y, l1, l2, buf, recipe=(128, 128, 128),
   activation="swiglu", activation_clamp=..., fast_math=True)``.

``deep_gemm`` is imported on first ``run`` only. ``supports`` reads the shape and the config alone
(the sgl-deep-gemm API detected from sources, no import), so every rank answers the same.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from types import MappingProxyType
from typing import Any, ClassVar, Iterator

import torch

from ..contract import Plugin, Support
from ..deep_gemm_api import DeepGemmApi, detect_deep_gemm_api, load_deep_gemm
from ..errors import InvalidArgumentError, KernelNotAvailableError
from ..hardware import Platform, triton_available
from ..ops.mega_moe import OP, MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape

__all__ = ["MegaW4A8Plugin", "MegaW4A4Plugin", "MegaSm90Fp8Plugin", "PRE_DISPATCH_CHOICES", "clear_buffer_cache"]

logger = logging.getLogger(__name__)

PRE_DISPATCH_CHOICES = ("auto", "triton", "host", "torch")

_buffer_lock = threading.Lock()
_buffers: dict[tuple, Any] = {}


def clear_buffer_cache() -> None:
    """Forget the symmetric buffers this module allocated (when the host did not provide its own)."""
    with _buffer_lock:
        _buffers.clear()


def _sglang_available() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@contextlib.contextmanager
def _reserve_sms(deep_gemm: Any, device: torch.device) -> Iterator[None]:
    """SGLang's ``_configure_mega_moe_deep_gemm_num_sms`` (SM100): leave
    SGLANG_OPT_DEEPGEMM_MEGA_MOE_RESERVED_SMS (default 2) SMs free, keep the count even."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 10:
        yield
        return
    physical = torch.cuda.get_device_properties(device).multi_processor_count
    limit = max(2, physical - max(_env_int("SGLANG_OPT_DEEPGEMM_MEGA_MOE_RESERVED_SMS", 2), 0))
    current = deep_gemm.get_num_sms()
    target = min(limit, current)
    target -= target % 2
    if target == current:
        yield
        return
    deep_gemm.set_num_sms(target)
    try:
        yield
    finally:
        deep_gemm.set_num_sms(current)


class _MegaDeepGemmPlugin(Plugin):
    """Shared checks and the call sequence; subclasses fix the variant and the architecture."""

    op = OP
    variant: ClassVar[str] = ""
    variant_label: ClassVar[str] = ""
    #: The deep_gemm functions ``run`` calls (besides the host pre-dispatch's).
    kernel_functions: ClassVar[tuple[str, ...]] = ()
    options = MappingProxyType({"pre_dispatch": "auto"})

    # -- selection ---------------------------------------------------------------------------------
    def _arch(self, platform: Platform) -> Support:
        raise NotImplementedError

    def available(self, platform: Platform) -> Support:
        api = detect_deep_gemm_api()
        return Support.all_of(self._arch(platform), self._api(api), ok_reason=f"{api.describe()} on {platform}")

    def _weights(self, config: MegaMoEConfig) -> Support:
        raise NotImplementedError

    def _api(self, api: DeepGemmApi) -> Support:
        if not api.present:
            return Support.no("sgl-deep-gemm is not installed (pip install sgl-deep-gemm)")
        missing = [f for f in self.kernel_functions if not api.has(f)]
        if api.flavour == "no_mega" or missing:
            return Support.no(f"{api.describe()} lacks deep_gemm.{', deep_gemm.'.join(missing or ['get_symm_buffer_for_mega_moe'])}")
        return Support.yes(api.describe())

    def _legacy_env(self, api: DeepGemmApi) -> Support:
        if not api.legacy_env:
            return Support.yes("no DG_USE_* override")
        names = "/".join(api.legacy_env)
        if api.refuses_legacy_env:
            return Support.no(f"{names} is set; {api.describe()} raises RuntimeError on it (replaced by mma_type): unset it")
        return Support.no(f"{names} is set; {api.describe()} then lays the buffer out for FP4 activations, which {self.name} does not write")

    def _shapes(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        raise NotImplementedError

    def _pre_dispatch_choice(self) -> str:
        choice = str(self.options.get("pre_dispatch", "auto"))
        if choice == "auto":
            return "triton" if triton_available() else "host"
        return choice

    def _pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        choice = str(self.options.get("pre_dispatch", "auto"))
        if choice not in PRE_DISPATCH_CHOICES:
            return Support.no(f"option pre_dispatch={choice!r} is not one of {PRE_DISPATCH_CHOICES}")
        choice = self._pre_dispatch_choice()
        if choice == "triton" and not triton_available():
            return Support.no("option pre_dispatch='triton' but triton is not importable")
        if choice == "host":
            return self._host_pre_dispatch(shape, config)
        return Support.yes(f"{choice} pre-dispatch")

    def _host_pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        raise NotImplementedError

    def supports(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        platform = config.platform
        return Support.all_of(
            self._arch(platform),
            self._weights(config),
            self._api(config.deep_gemm),
            self._legacy_env(config.deep_gemm),
            self._shapes(shape, config),
            self._pre_dispatch(shape, config),
            ok_reason=(
                f"DeepGEMM {self.variant_label} MegaMoE on {platform}, {config.deep_gemm.describe()}, "
                f"{self._pre_dispatch_choice()} pre-dispatch"
            ),
        )

    # -- running -----------------------------------------------------------------------------------
    def run(self, inputs: MegaMoEInputs, outputs: MegaMoEOutputs, shape: MegaMoEShape, config: MegaMoEConfig) -> None:
        num_tokens = inputs.num_tokens
        if num_tokens > shape.max_tokens_per_rank:
            raise InvalidArgumentError(
                OP, "hidden_states.shape[0]", num_tokens,
                f"<= max_tokens_per_rank={shape.max_tokens_per_rank} (SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK)", self.name,
            )
        if outputs.y.shape[0] < max(num_tokens, 1):
            raise InvalidArgumentError(OP, "outputs.y.shape[0]", outputs.y.shape[0], f">= max(num_tokens, 1) = {max(num_tokens, 1)}", self.name)
        group = inputs.resolve_ep_group()
        if group is None:
            raise KernelNotAvailableError(f"{self.name}: DeepGEMM MegaMoE needs the expert-parallel process group (MegaMoEInputs.ep_group)")
        deep_gemm = load_deep_gemm()
        buf = self._buffer(deep_gemm, inputs, group, shape, config)
        if num_tokens > 0:
            topk_ids = inputs.topk_ids.to(torch.int32)
            topk_weights = inputs.topk_weights.to(torch.float32)
        else:
            topk_ids = inputs.hidden_states.new_empty((0, shape.top_k), dtype=torch.int32)
            topk_weights = inputs.hidden_states.new_empty((0, shape.top_k), dtype=torch.float32)
        self._launch(deep_gemm, buf, inputs, outputs.y, topk_ids, topk_weights, shape, config)

    def _launch(self, deep_gemm: Any, buf: Any, inputs: MegaMoEInputs, y: torch.Tensor, topk_ids: torch.Tensor,
                topk_weights: torch.Tensor, shape: MegaMoEShape, config: MegaMoEConfig) -> None:
        raise NotImplementedError

    def _num_sms(self, deep_gemm: Any, inputs: MegaMoEInputs) -> contextlib.AbstractContextManager[Any]:
        host = inputs.host
        if host is not None and host.num_sms_context is not None:
            return host.num_sms_context(deep_gemm)
        return _reserve_sms(deep_gemm, inputs.device)

    def _buffer(self, deep_gemm: Any, inputs: MegaMoEInputs, group: Any, shape: MegaMoEShape, config: MegaMoEConfig) -> Any:
        args = (shape.num_experts, shape.max_tokens_per_rank, shape.top_k, shape.hidden, shape.intermediate)
        host = inputs.host
        if host is not None and host.get_symm_buffer is not None:
            return host.get_symm_buffer(
                group, *args, num_shared_experts=shape.num_shared_experts, mma_type=config.mma_type, activation=config.activation
            )
        with self._num_sms(deep_gemm, inputs):
            key = (id(group), *args, shape.num_shared_experts, config.mma_type, config.activation, deep_gemm.get_num_sms())
            with _buffer_lock:
                buf = _buffers.get(key)
                if buf is None:
                    if config.deep_gemm.flavour == "legacy_env":
                        buf = deep_gemm.get_symm_buffer_for_mega_moe(group, *args, activation=config.activation)
                    else:
                        buf = deep_gemm.get_symm_buffer_for_mega_moe(
                            group, *args, num_shared_experts=shape.num_shared_experts,
                            mma_type=config.mma_type, activation=config.activation,
                        )
                    _buffers[key] = buf
        return buf

    def _our_pre_dispatch(self, choice: str, inputs: MegaMoEInputs, buf: Any, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                          config: MegaMoEConfig, shared_x_sf: torch.Tensor | None = None, shared_block_m: int = 0) -> None:
        if choice == "triton":
            from ._mega_pre_dispatch_triton import pre_dispatch
        else:
            from ..ops.mega_moe_numerics import pre_dispatch_reference as pre_dispatch
        pre_dispatch(
            inputs.hidden_states, topk_ids, topk_weights, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights,
            variant=config.variant, routed_scaling_factor=config.routed_scaling_factor,
            shared_x_sf=shared_x_sf, shared_block_m=shared_block_m,
        )


def _deep_gemm_pre_dispatch(shape: MegaMoEShape, config: MegaMoEConfig, function: str, label: str) -> Support:
    """Option pre_dispatch='host' through sgl-deep-gemm's own pre-dispatch kernel ``function``."""
    if not config.deep_gemm.has(function):
        return Support.no(f"option pre_dispatch='host' needs deep_gemm.{function}, missing in {config.deep_gemm.describe()}")
    if shape.hidden > 8192:
        return Support.no(f"sgl-deep-gemm's {label} covers hidden <= 8192 (one 8-column chunk per thread), got {shape.hidden}")
    return Support.yes(f"sgl-deep-gemm's {function}")


def _sm100(platform: Platform) -> Support:
    if not platform.is_cuda:
        return Support.no(f"requires CUDA compute capability 10.x (DeepGEMM SM100 MegaMoE), the call is on {platform}")
    if (platform.sm or 0) // 10 != 10:
        return Support.no(f"DeepGEMM's FP4 MegaMoE kernels run on compute capability 10.x only (SM100); the device is sm{platform.sm}")
    return Support.yes(f"sm{platform.sm}")


class _Sm100Plugin(_MegaDeepGemmPlugin):
    kernel_functions = ("get_symm_buffer_for_mega_moe", "fp8_fp4_mega_moe")
    #: check_mega_moe_shapes: moe_intermediate_size must be a multiple of this for the variant.
    intermediate_align: ClassVar[int] = 128
    #: How SGLang builds the weights this variant needs (for the rejection reason).
    layout_hint: ClassVar[str] = ""

    def _arch(self, platform: Platform) -> Support:
        return _sm100(platform)

    def _weights(self, config: MegaMoEConfig) -> Support:
        if config.variant != self.variant:
            return Support.no(
                f"the experts' weights are laid out for {config.variant}; {self.name} needs the {self.variant} layout "
                f"({self.layout_hint})"
            )
        if config.weight_format != "fp4_e2m1_ue8m0_g32":
            return Support.no(f"needs FP4 E2M1 weights with per-32 UE8M0 scales, got {config.weight_format}")
        return Support.yes(f"{self.variant} FP4 weights")

    def _shapes(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if shape.hidden % 512:
            return Support.no(f"hidden_size={shape.hidden} is not a multiple of 512 (16 x scale group 32; check_mega_moe_shapes)")
        if shape.intermediate % self.intermediate_align:
            return Support.no(
                f"moe_intermediate_size={shape.intermediate} is not a multiple of {self.intermediate_align} "
                f"(check_mega_moe_shapes, {self.variant})"
            )
        if shape.top_k > 32:
            return Support.no(f"top_k={shape.top_k} > 32 (the kernel packs 32 / top_k tokens per warp)")
        return self._shared_experts(shape, config)

    def _shared_experts(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        raise NotImplementedError

    def _launch(self, deep_gemm, buf, inputs, y, topk_ids, topk_weights, shape, config) -> None:
        choice = self._pre_dispatch_choice()
        shared = inputs.shared_l1_weights is not None
        shared_block_m = 0
        if shared:
            shared_block_m = deep_gemm.get_block_m_for_mega_moe(
                num_ranks=buf.group.size(), num_experts=buf.num_experts,
                num_max_tokens_per_rank=buf.num_max_tokens_per_rank,
                num_tokens=max(inputs.num_tokens, 1), num_topk=buf.num_topk, mma_type=buf.mma_type,
            )
        if choice == "host":
            if config.routed_scaling_factor != 1.0:
                topk_weights = topk_weights * config.routed_scaling_factor
            self._host_launch_pre_dispatch(deep_gemm, buf, inputs, topk_ids, topk_weights, shared_block_m)
        else:
            self._our_pre_dispatch(choice, inputs, buf, topk_ids, topk_weights, config,
                                   buf.shared_l1_acts_sf if shared else None, shared_block_m)
        with self._num_sms(deep_gemm, inputs):
            deep_gemm.fp8_fp4_mega_moe(
                y, inputs.l1_weights, inputs.l2_weights, buf,
                shared_l1_weights=inputs.shared_l1_weights, shared_l2_weights=inputs.shared_l2_weights,
                activation=config.activation, activation_clamp=config.activation_clamp,
                fast_math=True, recipe=(1, 1, 32),
            )

    def _host_launch_pre_dispatch(self, deep_gemm, buf, inputs, topk_ids, topk_weights, shared_block_m) -> None:
        raise NotImplementedError


class MegaW4A8Plugin(_Sm100Plugin):
    """FP8 activations (per-32 UE8M0) x FP4 weights: ``mma_type='fp8xfp4'``."""

    name = "mega_w4a8"
    priority = 100
    variant = "fp8xfp4"
    variant_label = "W4A8 (fp8xfp4)"
    layout_hint = "FP4 weights, gran-8 gate/up interleave: SGLang's default MegaMoE build"
    description = "DeepGEMM fp8xfp4 MegaMoE (SM100), FP8 per-32 UE8M0 pre-dispatch"

    def _shared_experts(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if shape.num_shared_experts and config.deep_gemm.flavour == "legacy_env":
            return Support.no(f"in-kernel shared experts need a buffer sized for them; {config.deep_gemm.describe()} takes no num_shared_experts")
        if shape.num_shared_experts and not config.deep_gemm.has("get_block_m_for_mega_moe"):
            return Support.no(f"in-kernel shared experts need deep_gemm.get_block_m_for_mega_moe, missing in {config.deep_gemm.describe()}")
        return Support.yes("shapes pass check_mega_moe_shapes")

    def _host_pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if not _sglang_available():
            return Support.no("option pre_dispatch='host' needs SGLang's JIT mega_moe_pre_dispatch (sglang is not installed)")
        if shape.hidden > 8192 and shape.hidden % 256:
            return Support.no(f"SGLang's JIT pre-dispatch needs hidden above 8192 to be a multiple of 256, got {shape.hidden}")
        return Support.yes("SGLang's JIT mega_moe_pre_dispatch")

    def _host_launch_pre_dispatch(self, deep_gemm, buf, inputs, topk_ids, topk_weights, shared_block_m) -> None:
        from sglang.kernels.ops.moe.dsv4 import mega_moe_pre_dispatch

        mega_moe_pre_dispatch(
            inputs.hidden_states, topk_ids, topk_weights, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights,
            quant_group_size=32,
            shared_x_sf=buf.shared_l1_acts_sf if inputs.shared_l1_weights is not None else None,
            shared_block_m=shared_block_m, copy_topk=True,
        )


class MegaW4A4Plugin(_Sm100Plugin):
    """MXFP4 activations (E2M1, per-32 UE8M0) x FP4 weights: ``mma_type='mxf4xmxf4'``."""

    name = "mega_w4a4"
    priority = 110
    variant = "mxf4xmxf4"
    variant_label = "W4A4 (mxf4xmxf4)"
    intermediate_align = 512
    layout_hint = "FP4 weights, gran-16 packed gate/up interleave: SGLang builds it with --enable-w4a4-mxfp4-megamoe"
    description = "DeepGEMM mxf4xmxf4 MegaMoE (SM100), MXFP4 E2M1 per-32 UE8M0 pre-dispatch"

    def _api(self, api: DeepGemmApi) -> Support:
        base = super()._api(api)
        if not base:
            return base
        if api.flavour != "mma_type":
            return Support.no(
                f"{api.describe()} selects FP4 activations through the process-wide DG_USE_FP4_ACTS / DG_USE_MXF4_KIND "
                "variables, which this plugin never sets; needs an sgl-deep-gemm whose get_symm_buffer_for_mega_moe takes mma_type (0.2.x)"
            )
        return base

    def _shared_experts(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if shape.num_shared_experts:
            return Support.no("in-kernel shared experts take FP8 weights with fp8xfp4 only (SGLang fuses them for W4A8 only)")
        return Support.yes("shapes pass check_mega_moe_shapes")

    def _host_pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        return _deep_gemm_pre_dispatch(shape, config, "mega_moe_pre_dispatch", "pre-dispatch")

    def _host_launch_pre_dispatch(self, deep_gemm, buf, inputs, topk_ids, topk_weights, shared_block_m) -> None:
        deep_gemm.mega_moe_pre_dispatch(
            inputs.hidden_states, topk_ids, topk_weights, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights,
            num_tokens=inputs.num_tokens, group_size=32, mma_type="mxf4xmxf4",
        )


class MegaSm90Fp8Plugin(_MegaDeepGemmPlugin):
    """SM90 FP8 x FP8 (block-128 weights, per-128 activations): ``deep_gemm.fp8_mega_moe``."""

    name = "mega_sm90_fp8"
    priority = 100
    variant = "sm90_fp8"
    variant_label = "SM90 FP8"
    description = "DeepGEMM fp8_mega_moe (SM90), FP8 per-128 pre-dispatch"
    kernel_functions = ("get_symm_buffer_for_mega_moe", "fp8_mega_moe")

    def _arch(self, platform: Platform) -> Support:
        if not platform.is_cuda:
            return Support.no(f"requires CUDA compute capability 9.0 (DeepGEMM SM90 MegaMoE), the call is on {platform}")
        if platform.sm != 90:
            return Support.no(f"DeepGEMM's fp8_mega_moe runs on compute capability 9.0 only (SGLang uses it on sm90); the device is sm{platform.sm}")
        return Support.yes("sm90")

    def _legacy_env(self, api: DeepGemmApi) -> Support:
        return Support.yes("the SM90 buffer ignores DG_USE_* (no FP4 activations on SM90)")

    def _weights(self, config: MegaMoEConfig) -> Support:
        if config.variant != "sm90_fp8" or config.weight_format != "fp8_e4m3_block128":
            return Support.no(
                f"needs FP8 e4m3 weights with 128x128 block scales (build_sm90_mega_moe_experts_weights); "
                f"the experts hold {config.weight_format} weights laid out for {config.variant}"
            )
        return Support.yes("FP8 block-128 weights")

    def _shapes(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if shape.hidden % 128 or shape.intermediate % 128:
            return Support.no(
                f"hidden_size={shape.hidden} and moe_intermediate_size={shape.intermediate} must be multiples of 128 (block-128 scales)"
            )
        if shape.num_shared_experts:
            return Support.no("SGLang's SM90 MegaMoE has no in-kernel shared experts (num_shared_experts must be 0)")
        return Support.yes("shapes fit 128x128 block scales")

    def _host_pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        return _deep_gemm_pre_dispatch(shape, config, "mega_moe_pre_dispatch_sm90", "SM90 pre-dispatch")

    def _launch(self, deep_gemm, buf, inputs, y, topk_ids, topk_weights, shape, config) -> None:
        choice = self._pre_dispatch_choice()
        if choice == "host":
            deep_gemm.mega_moe_pre_dispatch_sm90(
                inputs.hidden_states, topk_ids, topk_weights, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights,
                num_tokens=inputs.num_tokens, group_size=128, routed_scaling_factor=config.routed_scaling_factor,
            )
        else:
            self._our_pre_dispatch(choice, inputs, buf, topk_ids, topk_weights, config)
        deep_gemm.fp8_mega_moe(
            y, inputs.l1_weights, inputs.l2_weights, buf,
            recipe=(128, 128, 128), activation="swiglu", activation_clamp=config.activation_clamp, fast_math=True,
        )
