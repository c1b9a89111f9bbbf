"""The embedded catalog of real models' MoE shapes (``data/moe_models.json``) and the calls they make."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from importlib import resources

from .errors import InvalidArgumentError
from .hardware import Platform
from .ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape, host_scale_layout

__all__ = [
    "ModelSpec",
    "load_catalog",
    "get_model",
    "SiluMulQuantCase",
    "silu_mul_quant_cases",
    "MegaMoECase",
    "mega_moe_cases",
    "platform_uses_ue8m0",
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

    @property
    def swiglu_limit(self) -> float | None:
        match = re.search(r"swiglu_limit=([0-9.]+)", self.act)
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
    return tuple(ModelSpec(**{k: m[k] for k in ModelSpec.__dataclass_fields__}) for m in raw["models"])


def get_model(name: str) -> ModelSpec:
    """A model by id (``Qwen/Qwen3-30B-A3B``) or short name (``Qwen3-30B-A3B``), case-insensitive."""
    wanted = name.lower()
    for model in load_catalog():
        if wanted in (model.id.lower(), model.short_name.lower()):
            return model
    valid = ", ".join(m.short_name for m in load_catalog())
    raise InvalidArgumentError("catalog", "model", name, f"a model of the embedded catalog: {valid}")


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
    swiglu_limit: float | None | str = "model",
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
        raise InvalidArgumentError("catalog", "tp", tp, f"a divisor of {model.short_name}'s intermediate size {model.inter}")
    limit = model.swiglu_limit if swiglu_limit == "model" else swiglu_limit
    e, d = model.experts // ep, model.inter // tp
    if d % group_size:
        raise InvalidArgumentError("catalog", "tp", tp, f"a split leaving D = {model.inter}/{tp} a multiple of group_size {group_size}")
    layout = host_scale_layout(limit is not None, ue8m0)
    cases = []
    for n in rows:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError("catalog", "rows", n, "ints >= 1 (padded rows per expert)")
        label = f"{model.short_name} EP{ep} TP{tp} N={n}" + (f" limit={limit:g}" if limit is not None else "")
        cases.append(
            SiluMulQuantCase(
                label,
                SiluMulQuantShape(e, n, d, group_size, model.topk),
                SiluMulQuantConfig(platform=platform, swiglu_limit=limit, scale_layout=layout),
            )
        )
    return cases


def platform_uses_ue8m0(platform: Platform) -> bool:
    """Whether SGLang's DeepGEMM path uses UE8M0 scales there: on sm100 (Blackwell) it always does."""
    return platform.is_cuda and platform.capability is not None and platform.capability[0] == 10


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
_MEGA_VARIANTS = {
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
    shape = mega_moe.MegaMoEShape(num_experts=model.experts, hidden=model.hidden, intermediate=model.inter,
                                  top_k=model.topk, ep_size=ep)
    cases = []
    for label, variant, weights in variants:
        config = mega_moe.MegaMoEConfig(platform=platform, variant=variant, weight_format=weights,
                                        activation_clamp=model.swiglu_limit)
        cases.append(MegaMoECase(f"{head} {label}", shape, config))
    return cases
