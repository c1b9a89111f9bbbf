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

__all__ = ["ModelSpec", "load_catalog", "get_model", "SiluMulQuantCase", "silu_mul_quant_cases", "DEFAULT_ROWS"]

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
        label = f"{model.short_name} EP{ep} TP{tp} N={n}" + (f" limit={limit:g}" if limit is not None else "")
        cases.append(
            SiluMulQuantCase(
                label,
                SiluMulQuantShape(e, n, d, group_size, model.topk),
                SiluMulQuantConfig(platform=platform, swiglu_limit=limit, scale_layout=layout),
            )
        )
    return cases
