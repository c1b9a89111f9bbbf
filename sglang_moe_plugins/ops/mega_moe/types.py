"""The types of op ``mega_moe`` (described in the package's docstring): its names, the shape and config
(hashable, metadata only), the inputs and the outputs. Public through :mod:`sglang_moe_plugins.ops.mega_moe`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...hardware import Platform

if TYPE_CHECKING:
    import torch


OP = "mega_moe"


VARIANTS = ("fp8xfp4", "mxf4xmxf4", "sm90_fp8")


Variant = Literal["fp8xfp4", "mxf4xmxf4", "sm90_fp8"]


#: ``fp4_e2m1_ue8m0_g32``: packed E2M1 (int8/uint8, two per byte) + int32 packed UE8M0 per-32 scales;
#: ``fp8_e4m3_block128``: float8_e4m3fn + fp32 scales per 128x128 block.
WEIGHT_FORMATS = ("fp4_e2m1_ue8m0_g32", "fp8_e4m3_block128")


WeightFormat = Literal["fp4_e2m1_ue8m0_g32", "fp8_e4m3_block128"]


ACTIVATIONS = ("swiglu",)


#: Tokens per rank the host's buffers hold when SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK
#: is unset (SGLang 0.5.23's default).
DEFAULT_MAX_TOKENS_PER_RANK = 8192


@dataclass(frozen=True)
class MegaMoEShape:
    """Sizes of a MegaMoE layer. Hashable; part of the selection key. No token count."""

    num_experts: int  # global routed experts (incl. fused shared-expert slots), experts.num_experts
    hidden: int
    intermediate: int  # per-expert moe_intermediate_size
    top_k: int  # experts per token, incl. fused shared-expert slots
    num_shared_experts: int = 0  # shared experts computed inside the DeepGEMM kernel
    ep_size: int = 1
    max_tokens_per_rank: int = DEFAULT_MAX_TOKENS_PER_RANK  # SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.ep_size

    def describe(self) -> str:
        text = f"E={self.num_experts} H={self.hidden} I={self.intermediate} topk={self.top_k}"
        if self.num_shared_experts:
            text += f" shared={self.num_shared_experts}"
        return text + f" ep={self.ep_size} cap={self.max_tokens_per_rank}"


@dataclass(frozen=True)
class MegaMoEConfig:
    """Numerics, weight layout and platform of a MegaMoE call. Hashable; names no kernel library."""

    platform: Platform = Platform()
    variant: Variant = "fp8xfp4"
    weight_format: WeightFormat = "fp4_e2m1_ue8m0_g32"
    activation: str = "swiglu"
    #: SwiGLU limit (DeepSeek-V4: 10). SM100 kernels clamp in bf16, the SM90 kernel in fp32.
    activation_clamp: float | None = None
    #: Multiplies the top-k weights (in fp32) before dispatch. The host passes 1.0 when the
    #: factor is already fused into the router's weights.
    routed_scaling_factor: float = 1.0

    def describe(self) -> str:
        parts = [str(self.platform), self.variant, self.weight_format]
        if self.activation_clamp is not None:
            parts.append(f"clamp={self.activation_clamp:g}")
        if self.routed_scaling_factor != 1.0:
            parts.append(f"rsf={self.routed_scaling_factor:g}")
        return " ".join(parts)


@dataclass(frozen=True, eq=False)
class MegaMoEInputs:
    """Tensors and plain values of one call. ``topk_ids``/``topk_weights`` may be None when T == 0."""

    hidden_states: torch.Tensor  # [T, hidden] bf16
    topk_ids: torch.Tensor | None  # [T, top_k] integer; -1 = no expert
    topk_weights: torch.Tensor | None  # [T, top_k] floating
    l1_weights: tuple[torch.Tensor, torch.Tensor]  # experts.mega_l1_weights (data, scales)
    l2_weights: tuple[torch.Tensor, torch.Tensor]  # experts.mega_l2_weights
    shared_l1_weights: tuple[torch.Tensor, torch.Tensor] | None = None
    shared_l2_weights: tuple[torch.Tensor, torch.Tensor] | None = None
    #: The expert-parallel ``torch.distributed`` process group (what a collective kernel runs over),
    #: or None outside a distributed run.
    ep_group: Any = None

    @property
    def num_tokens(self) -> int:
        return int(self.hidden_states.shape[0])

    @property
    def device(self) -> torch.device:
        return self.hidden_states.device


@dataclass(frozen=True, eq=False)
class MegaMoEOutputs:
    y: torch.Tensor  # [max(T, 1), hidden] bf16; rows [:T] are the result
