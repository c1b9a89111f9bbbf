"""The embedded catalog of real models' MoE shapes (``data/moe_models.json``) and the calls they make."""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from .errors import InvalidArgumentError
from .hardware import Platform
from .integrations.sglang.silu_mul_quant import host_scale_layout
from .ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape

if TYPE_CHECKING:
    from .ops.mega_moe.types import Variant, WeightFormat

__all__ = [
    "ModelSpec",
    "load_catalog",
    "get_model",
    "model_from_hf_config",
    "SiluMulQuantCase",
    "silu_mul_quant_cases",
    "MegaMoECase",
    "mega_moe_cases",
    "platform_uses_ue8m0",
    "deep_gemm_runner_runs_on",
    "limit_text",
    "DEFAULT_ROWS",
]

#: Padded rows per expert (N) of a decode-size and a prefill-size call.
DEFAULT_ROWS = (128, 1024)


@dataclass(frozen=True)
class ModelSpec:
    """One model's MoE layer, as published."""

    id: str
    hidden: int
    inter: int
    experts: int
    topk: int
    shared: int
    act: str
    quant: str
    status: str
    #: Quantization group size the checkpoint declares (``weight_block_size[1]``), when known.
    group_size: int | None = None
    #: Why SGLang's DeepGEMM MoE runner never makes this model's silu_mul_quant calls (its experts are bf16,
    #: or quantized by a method other than FP8); "" when it does (every catalog model: explained as served in FP8).
    not_served: str = ""

    @property
    def swiglu_limit(self) -> float | None:
        match = re.search(r"swiglu_limit=(\S+)", self.act)  # written with repr(): 1e-07, 1e+20, 10.0
        return float(match.group(1)) if match else None

    @property
    def gpt_oss_activation(self) -> bool:
        """gpt-oss's clamped SwiGLU goes through SGLang's gemm1_alpha path, which the op does not model."""
        return self.act.startswith("gpt-oss")

    @property
    def short_name(self) -> str:
        return self.id.split("/")[-1]


@functools.lru_cache(maxsize=1)
def load_catalog() -> tuple[ModelSpec, ...]:
    """Every model of the embedded catalog."""
    raw = json.loads(resources.files("sglang_moe_plugins").joinpath("data/moe_models.json").read_text())
    return tuple(ModelSpec(**{k: m[k] for k in ModelSpec.__dataclass_fields__ if k in m}) for m in raw["models"])


def get_model(name: str) -> ModelSpec:
    """A model by id (``Qwen/Qwen3-30B-A3B``) or short name (``Qwen3-30B-A3B``), case-insensitive."""
    wanted = name.lower()
    for model in load_catalog():
        if wanted in (model.id.lower(), model.short_name.lower()):
            return model
    valid = ", ".join(m.short_name for m in load_catalog())
    raise InvalidArgumentError("catalog", "model", name, f"a model of the embedded catalog: {valid}")


def limit_text(limit: float) -> str:
    """A swiglu limit as printed: ``%g`` where that is the exact value (10, 7.25, 1e-07), else ``repr`` (never
    rounded: 10.000001 stays 10.000001)."""
    short = f"{limit:g}"
    return short if float(short) == limit else repr(limit)


def model_from_hf_config(path: str | os.PathLike[str]) -> ModelSpec:
    """A model's MoE layer read from its HuggingFace ``config.json`` (for models the catalog lacks).

    Reads the routed experts (``num_experts``, ``n_routed_experts`` or ``num_local_experts``), the per-expert
    intermediate size (``moe_intermediate_size``, else ``intermediate_size``), ``num_experts_per_tok``,
    ``hidden_size``, ``swiglu_limit`` and the quantization group size (``quantization_config.weight_block_size``),
    from the top level or from ``text_config`` (multimodal configs). gpt-oss (``model_type`` ``gpt_oss``) is
    marked as its clamped activation, which SGLang runs through its own ``gemm1_alpha`` path.
    """
    from .hf_config import read_hf_config

    return read_hf_config(path)


@dataclass(frozen=True)
class SiluMulQuantCase:
    """One silu_mul_quant call a model makes at a parallel setting."""

    label: str
    shape: SiluMulQuantShape
    config: SiluMulQuantConfig


def silu_mul_quant_cases(
    model: ModelSpec,
    *,
    ep: int = 1,
    tp: int = 1,
    rows: tuple[int, ...] = DEFAULT_ROWS,
    platform: Platform = Platform.cuda(9, 0),
    ue8m0: bool = False,
    group_size: int = 128,
    swiglu_limit: float | str | None = "model",
) -> list[SiluMulQuantCase]:
    """The calls of SGLang's DeepGEMM masked runner for ``model`` at EP ``ep`` / MoE-TP ``tp``.

    E = experts / ep, D = inter / tp, N = each of ``rows``. ``swiglu_limit="model"`` takes the
    model's own limit; the scale layout is the one the host returns on that branch.
    """
    for arg, value in (("ep", ep), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError("catalog", arg, value, "an int >= 1")
    if model.experts % ep:
        raise InvalidArgumentError("catalog", "ep", ep, f"a divisor of {model.short_name}'s {model.experts} experts")
    if model.inter % tp:
        raise InvalidArgumentError(
            "catalog", "tp", tp, f"a divisor of {model.short_name}'s intermediate size {model.inter}"
        )
    limit: float | None = model.swiglu_limit if swiglu_limit == "model" else swiglu_limit  # type: ignore[assignment]  # "model" is the only str
    e, d = model.experts // ep, model.inter // tp
    if d % group_size:
        raise InvalidArgumentError(
            "catalog", "tp", tp, f"a split leaving D = {model.inter}/{tp} a multiple of group_size {group_size}"
        )
    layout = host_scale_layout(limit is not None, ue8m0)
    cases = []
    for n in rows:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError("catalog", "rows", n, "ints >= 1 (padded rows per expert)")
        label = f"{model.short_name} EP{ep} TP{tp} N={n}" + (f" limit={limit_text(limit)}" if limit is not None else "")
        cases.append(
            SiluMulQuantCase(
                label,
                SiluMulQuantShape(e, n, d, group_size, model.topk),
                SiluMulQuantConfig(platform=platform, swiglu_limit=limit, scale_layout=layout),
            )
        )
    return cases


def platform_uses_ue8m0(platform: Platform) -> bool:
    """Whether SGLang's DeepGEMM path uses UE8M0 scales there: on sm100 (Blackwell) it always does
    (``DEEPGEMM_SCALE_UE8M0`` in ``sglang.srt.layers.deep_gemm_wrapper.configurer``; also sm120/sm121)."""
    return (
        platform.is_cuda
        and platform.capability is not None
        and (platform.capability[0] == 10 or platform.capability in ((12, 0), (12, 1)))
    )


def deep_gemm_runner_runs_on(platform: Platform) -> bool:
    """Whether SGLang (0.5.16 to 0.5.23) runs its DeepGEMM MoE runner, and so the hooked functions, there:
    CUDA compute capability 9.0 or newer (``_compute_enable_deep_gemm`` in ``deep_gemm_wrapper/configurer.py``
    returns False below sm90). The CPU platform is kept: it is where the ``reference`` plugin is explained."""
    return not platform.is_cuda or (platform.capability is not None and platform.capability >= (9, 0))


@dataclass(frozen=True)
class MegaMoECase:
    """One MegaMoE call a model makes at a parallel setting, or (``shape is None``) why there is none."""

    label: str
    shape: object | None
    config: object | None
    note: str = ""


#: The variants SGLang 0.5.23 builds per platform (``mega_moe.py``): on sm100 the FP4 expert weights with
#: FP8 activations (W4A8, the default) or MXFP4 activations (W4A4, ``--enable-w4a4-mxfp4-megamoe``);
#: on sm90 ``mega_moe_sm90.py`` with FP8 block-128 weights.
_MEGA_VARIANTS: dict[int, tuple[tuple[str, Variant, WeightFormat], ...]] = {
    10: (("W4A8", "fp8xfp4", "fp4_e2m1_ue8m0_g32"), ("W4A4", "mxf4xmxf4", "fp4_e2m1_ue8m0_g32")),
    9: (("FP8", "sm90_fp8", "fp8_e4m3_block128"),),
}


def mega_moe_cases(model: ModelSpec, *, ep: int = 1, platform: Platform = Platform.cuda(10, 0)) -> list[MegaMoECase]:
    """The ``run_mega_routed_experts`` calls of ``model`` at EP ``ep`` on ``platform`` (SGLang launched with
    ``--moe-a2a-backend megamoe``), built with the op's public types. The only place that builds them (the
    CLI's ``explain`` and ``bench`` call this)."""
    from .ops import mega_moe

    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or model.experts % ep:
        raise InvalidArgumentError("catalog", "ep", ep, f"a divisor of {model.short_name}'s {model.experts} experts")
    head = f"{model.short_name} EP{ep} mega_moe"
    if model.gpt_oss_activation:
        return [MegaMoECase(head, None, None, "gpt-oss activation: SGLang's MegaMoE path does not serve it")]
    major = platform.capability[0] if platform.is_cuda and platform.capability else None
    variants = _MEGA_VARIANTS.get(major) if major is not None else None
    if not variants:
        return [MegaMoECase(head, None, None, f"SGLang runs MegaMoE on sm90 and sm100 only, not on {platform}")]
    shape = mega_moe.MegaMoEShape(
        num_experts=model.experts, hidden=model.hidden, intermediate=model.inter, top_k=model.topk, ep_size=ep
    )
    cases = []
    for label, variant, weights in variants:
        config = mega_moe.MegaMoEConfig(
            platform=platform, variant=variant, weight_format=weights, activation_clamp=model.swiglu_limit
        )
        cases.append(MegaMoECase(f"{head} {label}", shape, config))
    return cases
