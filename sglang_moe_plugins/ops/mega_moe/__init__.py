"""Op ``mega_moe``: MegaMoE routed experts (pre-dispatch quantization + DeepGEMM's fused MoE).

Replaces SGLang 0.5.23's ``sglang.srt.layers.moe.mega_moe.run_mega_routed_experts``: this rank's
tokens in, fully combined rows out (``y [T, hidden]`` bf16). The variants, named by the layout the
host built the expert weights for (``experts.mega_l1_weights`` / ``mega_l2_weights``):

============ ============================= ================================= ===================
variant      activations (pre-dispatch)    weights                           DeepGEMM call
============ ============================= ================================= ===================
fp8xfp4      FP8 e4m3, per-32 UE8M0 (W4A8) FP4 E2M1, per-32 UE8M0, gran-8     fp8_fp4_mega_moe
mxf4xmxf4    MXFP4 E2M1, per-32 UE8M0      FP4 E2M1, per-32 UE8M0, gran-16    fp8_fp4_mega_moe
sm90_fp8     FP8 e4m3, per-128 fp32        FP8 e4m3, 128x128 block fp32       fp8_mega_moe (SM90)
============ ============================= ================================= ===================

NVFP4 (``nvfp4xnvfp4``) calls are not modelled by this op: the integration leaves them to SGLang.

The shape holds what decides support and is the same for every batch (never the token count); the
config holds the numerics, the weights' layout and the platform. Both are hashable and built by
:func:`describe` from metadata only (no tensor data read, no device sync), so every rank of an
expert-parallel group selects the same plugin, which the collective DeepGEMM kernel requires.

The op is backend-neutral: its types name no kernel library and carry no host object. The inputs are
tensors, plain values and the expert-parallel ``torch.distributed`` process group; what a backend
needs besides (DeepGEMM's API, its symmetric buffer, SGLang's helpers) lives in that backend's plugins.
A plugin for this op can be written with torch alone (tests/test_mega_third_party.py).

This package holds :func:`describe` and the output checks, and re-exports the op's types (defined in
:mod:`.types`, which imports nothing of the op); its other submodules, which it never imports, hold the
numerics: :mod:`.formats` (pre-dispatch activation formats, DeepGEMM weight
layouts and their decoding), :mod:`.activation` (the kernels' SwiGLU), :mod:`.sm90` (the SM90 GEMM
emulation) and :mod:`.reference` (the reference forward).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ...errors import InvalidArgumentError, OutputValidationError
from ...hardware import platform_of
from ...lazy import lazy_module
from ..base import BF16_MIN_NORMAL, OpSpec, check_output_devices, finite_float
from .types import (
    ACTIVATIONS,
    DEFAULT_MAX_TOKENS_PER_RANK,
    OP,
    VARIANTS,
    WEIGHT_FORMATS,
    MegaMoEConfig,
    MegaMoEInputs,
    MegaMoEOutputs,
    MegaMoEShape,
    Variant,
    WeightFormat,
)

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_module("torch", globals())  # torch itself from its first use on (sglang_moe_plugins.lazy)

__all__ = [
    "OP",
    "VARIANTS",
    "WEIGHT_FORMATS",
    "ACTIVATIONS",
    "DEFAULT_MAX_TOKENS_PER_RANK",
    "Variant",
    "WeightFormat",
    "MegaMoEShape",
    "MegaMoEConfig",
    "MegaMoEInputs",
    "MegaMoEOutputs",
    "describe",
    "allocate_outputs",
    "validate_outputs",
    "weight_format_of",
    "SPEC",
]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _bad(argument: str, value: object, allowed: str) -> InvalidArgumentError:
    return InvalidArgumentError(OP, argument, value, allowed)


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(name, value, f"an int >= {minimum}")
    return value


def _check_pair(name: str, pair: object) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(t, torch.Tensor) for t in pair)):
        raise _bad(name, type(pair).__name__, "a (data, scales) pair of torch.Tensors")
    return pair[0], pair[1]


def weight_format_of(l1_weights: tuple[torch.Tensor, torch.Tensor]) -> WeightFormat | None:
    """The :data:`WEIGHT_FORMATS` entry of a ``(data, scales)`` pair, by dtypes; None if neither."""
    data, scales = l1_weights
    if data.dtype in (torch.int8, torch.uint8) and scales.dtype == torch.int32:
        return "fp4_e2m1_ue8m0_g32"
    if data.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32:
        return "fp8_e4m3_block128"
    return None


def _expected_weight_shapes(fmt: WeightFormat, e: int, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    if fmt == "fp4_e2m1_ue8m0_g32":
        return {
            "l1_weights[0]": (e, 2 * inter, hidden // 2),
            "l1_weights[1]": (e, 2 * inter, _cdiv(hidden // 32, 4)),
            "l2_weights[0]": (e, hidden, inter // 2),
            "l2_weights[1]": (e, hidden, _cdiv(inter // 32, 4)),
        }
    return {
        "l1_weights[0]": (e, 2 * inter, hidden),
        "l1_weights[1]": (e, _cdiv(2 * inter, 128), _cdiv(hidden, 128)),
        "l2_weights[0]": (e, hidden, inter),
        "l2_weights[1]": (e, _cdiv(hidden, 128), _cdiv(inter, 128)),
    }


def describe(
    hidden_states: torch.Tensor,
    topk_ids: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    *,
    l1_weights: tuple[torch.Tensor, torch.Tensor],
    l2_weights: tuple[torch.Tensor, torch.Tensor],
    variant: str,
    num_experts: int,
    hidden_size: int,
    intermediate_size: int,
    top_k: int,
    activation_clamp: float | None = None,
    routed_scaling_factor: float = 1.0,
    activation: str = "swiglu",
    num_shared_experts: int = 0,
    shared_l1_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    shared_l2_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    ep_size: int = 1,
    max_tokens_per_rank: int = DEFAULT_MAX_TOKENS_PER_RANK,
) -> tuple[MegaMoEShape, MegaMoEConfig]:
    """Validate a call's arguments and build its shape and config (metadata only, no sync)."""
    hidden = _check_int("hidden_size", hidden_size, 2)
    inter = _check_int("intermediate_size", intermediate_size, 1)
    top_k = _check_int("top_k", top_k, 1)
    num_experts = _check_int("num_experts", num_experts, 1)
    num_shared = _check_int("num_shared_experts", num_shared_experts, 0)
    ep_size = _check_int("ep_size", ep_size, 1)
    cap = _check_int("max_tokens_per_rank", max_tokens_per_rank, 1)
    if num_experts % ep_size:
        raise _bad("num_experts", num_experts, f"a multiple of ep_size={ep_size}")
    if variant not in VARIANTS:
        raise _bad("variant", variant, f"one of {VARIANTS} (nvfp4xnvfp4 is left to the host)")
    if activation not in ACTIVATIONS:
        raise _bad("activation", activation, f"one of {ACTIVATIONS}")
    if activation_clamp is not None:
        clamp = finite_float(activation_clamp)
        # SM100 kernels clamp against bf16(limit): a positive limit below bf16's smallest normal rounds
        # to 0 there, unlike the SM90 kernel (fp32); such a limit is rejected rather than variant-dependent.
        if clamp is None or clamp < 0 or 0 < clamp < BF16_MIN_NORMAL:
            raise _bad(
                "activation_clamp",
                activation_clamp,
                "None, 0 or a finite number >= 2**-126 (bf16's smallest normal) that fits a float",
            )
        activation_clamp = clamp
    rsf = finite_float(routed_scaling_factor)
    if rsf is None:
        raise _bad("routed_scaling_factor", routed_scaling_factor, "a finite number that fits a float")
    routed_scaling_factor = rsf

    if not isinstance(hidden_states, torch.Tensor):
        raise _bad("hidden_states", type(hidden_states).__name__, "a torch.Tensor")
    if hidden_states.dtype != torch.bfloat16:
        raise _bad("hidden_states.dtype", hidden_states.dtype, "torch.bfloat16")
    if hidden_states.dim() != 2 or hidden_states.shape[1] != hidden:
        raise _bad("hidden_states.shape", tuple(hidden_states.shape), f"[num_tokens, hidden_size={hidden}]")
    if hidden_states.shape[0] and hidden_states.stride(1) != 1:
        raise _bad("hidden_states.stride()", tuple(hidden_states.stride()), "unit stride along hidden")
    num_tokens = int(hidden_states.shape[0])
    if num_tokens > cap:
        raise _bad(
            "hidden_states.shape[0]",
            num_tokens,
            f"<= max_tokens_per_rank={cap} (SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK)",
        )
    device = hidden_states.device
    if num_tokens or topk_ids is not None or topk_weights is not None:
        for name, tensor, kinds in (
            ("topk_ids", topk_ids, "an integer torch.Tensor"),
            ("topk_weights", topk_weights, "a floating torch.Tensor"),
        ):
            if not isinstance(tensor, torch.Tensor):
                raise _bad(name, type(tensor).__name__, f"{kinds} [num_tokens, top_k] (None only with 0 tokens)")
            if tuple(tensor.shape) != (num_tokens, top_k):
                raise _bad(f"{name}.shape", tuple(tensor.shape), f"({num_tokens}, {top_k}) = [num_tokens, top_k]")
            if tensor.device != device:
                raise _bad(f"{name}.device", tensor.device, f"the device of hidden_states ({device})")
        topk_ids, topk_weights = cast("torch.Tensor", topk_ids), cast("torch.Tensor", topk_weights)  # checked above
        if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool or topk_ids.dtype.is_complex:
            raise _bad("topk_ids.dtype", topk_ids.dtype, "an integer dtype (int32 or int64)")
        if not topk_weights.dtype.is_floating_point:
            raise _bad("topk_weights.dtype", topk_weights.dtype, "a floating dtype")

    l1 = _check_pair("l1_weights", l1_weights)
    l2 = _check_pair("l2_weights", l2_weights)
    fmt = weight_format_of(l1)
    if fmt is None:
        raise _bad(
            "l1_weights dtypes", (l1[0].dtype, l1[1].dtype), "(int8|uint8, int32) FP4 or (float8_e4m3fn, float32) FP8"
        )
    if weight_format_of(l2) != fmt:
        raise _bad("l2_weights dtypes", (l2[0].dtype, l2[1].dtype), f"the format of l1_weights ({fmt})")
    if fmt == "fp4_e2m1_ue8m0_g32" and (hidden % 32 or inter % 32):
        raise _bad("hidden_size/intermediate_size", (hidden, inter), "multiples of 32 for FP4 weights")
    expected = _expected_weight_shapes(fmt, num_experts // ep_size, hidden, inter)
    for name, tensor in (
        ("l1_weights[0]", l1[0]),
        ("l1_weights[1]", l1[1]),
        ("l2_weights[0]", l2[0]),
        ("l2_weights[1]", l2[1]),
    ):
        if tuple(tensor.shape) != expected[name]:
            raise _bad(
                f"{name}.shape",
                tuple(tensor.shape),
                f"{expected[name]} for {fmt} weights of {num_experts // ep_size} local experts",
            )
        if tensor.device != device:
            raise _bad(f"{name}.device", tensor.device, f"the device of hidden_states ({device})")

    if (shared_l1_weights is None) != (shared_l2_weights is None):
        raise _bad("shared_l1_weights/shared_l2_weights", "one of them None", "both None or both (data, scales) pairs")
    if shared_l1_weights is not None:
        if num_shared == 0:
            raise _bad("num_shared_experts", 0, ">= 1 when shared_l1_weights are given")
        s1 = _check_pair("shared_l1_weights", shared_l1_weights)
        s2 = _check_pair("shared_l2_weights", shared_l2_weights)
        width = inter * num_shared
        for name, (data, scales), want in (
            ("shared_l1_weights", s1, (2 * width, hidden)),
            ("shared_l2_weights", s2, (hidden, width)),
        ):
            if data.dtype != torch.float8_e4m3fn or scales.dtype != torch.int32:
                raise _bad(
                    f"{name} dtypes",
                    (data.dtype, scales.dtype),
                    "(float8_e4m3fn, int32) as transform_weights_for_mega_moe returns",
                )
            if tuple(data.shape) != want:
                raise _bad(f"{name}[0].shape", tuple(data.shape), f"{want}")
    elif num_shared:
        raise _bad("num_shared_experts", num_shared, "0 when no shared_l1_weights/shared_l2_weights are given")

    shape = MegaMoEShape(num_experts, hidden, inter, top_k, num_shared, ep_size, cap)
    config = MegaMoEConfig(
        platform=platform_of(hidden_states),
        variant=variant,  # type: ignore[arg-type]
        weight_format=fmt,
        activation=activation,
        activation_clamp=activation_clamp,
        routed_scaling_factor=float(routed_scaling_factor),
    )
    return shape, config


def allocate_outputs(
    shape: MegaMoEShape, config: MegaMoEConfig, device: torch.device, num_tokens: int | None = None
) -> MegaMoEOutputs:
    """``y`` of ``max(num_tokens, 1)`` rows (DeepGEMM rejects a null pointer; the host does the same).

    The row count depends on the batch, not on the shape: ``num_tokens`` is required.
    """
    if num_tokens is None or isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise _bad(
            "num_tokens",
            num_tokens,
            "the batch's token count (int >= 0); pass outputs=MegaCall.allocate_outputs() to dispatch",
        )
    return MegaMoEOutputs(torch.empty((max(num_tokens, 1), shape.hidden), dtype=torch.bfloat16, device=device))


def validate_outputs(
    outputs: MegaMoEOutputs,
    shape: MegaMoEShape,
    config: MegaMoEConfig,
    plugin: str | None = None,
    inputs: MegaMoEInputs | None = None,
) -> None:
    """Check dtype, device, rank, width and contiguity of ``y`` (metadata only); with the call's ``inputs``,
    also that ``y`` has at least ``max(num_tokens, 1)`` rows (the shape key holds no token count, so
    without ``inputs`` only ``>= 1`` row can be checked) and is on their device (without them: on a device of
    the config's platform's type)."""
    who = f"plugin {plugin!r}" if plugin else OP
    if not isinstance(outputs, MegaMoEOutputs):
        raise OutputValidationError(
            f"{who} returned outputs of type {type(outputs).__name__}, the host requires MegaMoEOutputs"
        )
    y = outputs.y
    if not isinstance(y, torch.Tensor) or y.dtype != torch.bfloat16:
        raise OutputValidationError(
            f"{who} returned y.dtype={getattr(y, 'dtype', type(y).__name__)}, the host requires torch.bfloat16"
        )

    def fail(what: str, got: object, want: object) -> OutputValidationError:
        return OutputValidationError(f"{who} returned {what}={got}, the host requires {want}")

    check_output_devices(fail, (("y", y),), None if inputs is None else inputs.device, config.platform, "hidden_states")
    if y.dim() != 2 or y.shape[1] != shape.hidden or y.shape[0] < 1:
        raise OutputValidationError(
            f"{who} returned y.shape={tuple(y.shape)}, the host requires [max(num_tokens, 1), {shape.hidden}]"
        )
    if inputs is not None:
        num_tokens = inputs.num_tokens
        if y.shape[0] < max(num_tokens, 1):
            raise OutputValidationError(
                f"{who} returned y.shape={tuple(y.shape)} for a call of {num_tokens} tokens, the host requires "
                f"[max(num_tokens, 1), {shape.hidden}] = [{max(num_tokens, 1)}, {shape.hidden}]"
            )
    if not y.is_contiguous():
        raise OutputValidationError(f"{who} returned y.stride()={tuple(y.stride())}, the host requires contiguous")


SPEC = OpSpec(
    name=OP,
    allocate_outputs=allocate_outputs,
    validate_outputs=validate_outputs,
    collective=True,
    shape_type=MegaMoEShape,
    output_type=MegaMoEOutputs,
    conformance="sglang_moe_plugins.testing.ops.mega_moe:MegaMoEConformance",
)
