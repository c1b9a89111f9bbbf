"""The configurations ``benchmarks/contig_e2e.py`` times: SGLang 0.5.23's DeepGEMM MoE layer, compact against masked.

CPU only (no torch). Every rule here is a copy of SGLang 0.5.23's code
(``sglang/srt/layers/moe/moe_runner/deep_gemm.py``), checked against it by ``tests/test_contig_e2e_bench.py``:

- :func:`masked_activation_unsupported_reason`: ``_masked_activation_unsupported_reason``, the guard that sends a
  standard-dispatch layer to the compact layout whatever the memory budget says (``swiglu_limit`` set and
  ``D // 8 < E_local``, group != 128, or ``D % (4 * group) != 0``);
- :func:`compact_all_tokens`: ``_get_compact_all_tokens``, the compact layout's row count;
- :func:`masked_peak_bytes`: ``_estimate_masked_standard_layout_peak_bytes``, the masked layout's memory, on a GPU
  where DeepGEMM's scales are fp32 (``DEEPGEMM_SCALE_UE8M0`` False: Hopper).

The cases: every catalog model and standard-dispatch parallelism (MoE-TP 1/2/4/8, EP 2/4/8) the guard refuses
(SGLang runs it compact, the stock two-kernel activation), the guard-permitted DeepSeek-V4-Flash TP1 (SGLang runs it
masked: stock masked against the package's masked ``triton``), and DeepEP-normal contiguous prefill at EP8
(``pre_permute_deepep_normal_to_deep_gemm``: always compact) for four models.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..catalog import ModelSpec, get_model, load_catalog

__all__ = [
    "PREFILL_TOKENS",
    "DECODE_TOKENS",
    "GROUP",
    "TP_SIZES",
    "EP_SIZES",
    "DEEPEP_MODELS",
    "MASKED_EXTRA",
    "E2ECase",
    "masked_activation_unsupported_reason",
    "compact_all_tokens",
    "masked_padded_m",
    "masked_peak_bytes",
    "derive_cases",
    "filter_cases",
]

PREFILL_TOKENS = (512, 2048, 8192, 16384)
DECODE_TOKENS = (1, 16, 64, 256)
GROUP = 128
TP_SIZES = (1, 2, 4, 8)
EP_SIZES = (2, 4, 8)
#: DeepEP normal dispatch (EP8) feeds ``_run_contiguous_gemm`` directly: these models' prefill.
DEEPEP_MODELS = ("DeepSeek-V3", "DeepSeek-V4-Flash", "Kimi-K2-Instruct", "Qwen3-235B-A22B")
#: Configurations 0.5.23 already runs masked, timed stock masked against package masked: (model, tp, ep).
MASKED_EXTRA = (("DeepSeek-V4-Flash", 1, 1),)


def masked_activation_unsupported_reason(
    swiglu_limit: float | None, d: int | None, e: int | None, group_size: int = GROUP, megamoe: bool = False
) -> str | None:
    """``_masked_activation_unsupported_reason`` of 0.5.23, on the values it reads (same strings)."""
    if swiglu_limit is None and not megamoe:
        return None
    if d is None or e is None:
        return None
    if d // 8 < e:
        return f"D // 8 ({d // 8}) < num_local_experts ({e})"
    if group_size != 128:
        return f"masked activation group_size {group_size}, DSV4 JIT kernel requires 128"
    if d % (group_size * 4) != 0:
        return f"D ({d}) not divisible by 4 * group_size"
    return None


def compact_all_tokens(num_assignments: int, num_experts: int, block_e: int = 128) -> int:
    """``_get_compact_all_tokens``: the most padded rows over all routings of the assignments."""
    max_nonempty = min(num_assignments, num_experts)
    return block_e * (max_nonempty + (num_assignments - max_nonempty) // block_e)


def masked_padded_m(tokens: int) -> int:
    """Rows per expert of the masked layout (``moe_ep_deepgemm_preprocess``'s ``m_max``)."""
    return (tokens // 256 + 1) * 256


def masked_peak_bytes(
    num_local_experts: int,
    tokens: int,
    hidden: int,
    gateup_size: int,
    down_out: int,
    block_k: int = GROUP,
    packed_scales: bool = False,
) -> int:
    """``_estimate_masked_standard_layout_peak_bytes`` for FP8 weights: E_local x padded tokens x peak row bytes."""
    scale_bytes = 1 if packed_scales else 4
    input_row = hidden
    input_scale_row = -(-hidden // block_k) * scale_bytes
    down_input_row = gateup_size // 2
    down_scale_row = -(-(gateup_size // 2) // block_k) * scale_bytes
    peak_row = input_row + input_scale_row + down_input_row + down_scale_row + max(gateup_size * 2, down_out * 2)
    return num_local_experts * masked_padded_m(tokens) * peak_row


@dataclass(frozen=True)
class E2ECase:
    """One MoE layer configuration on one rank."""

    model: str  # short name
    mode: str  # "standard" (pre_permute_standard_to_deep_gemm) or "deepep_normal"
    tp: int
    ep: int
    experts: int  # global
    local_experts: int
    hidden: int  # K
    inter: int  # D, per rank
    topk: int
    swiglu_limit: float | None
    #: What 0.5.23 runs: "compact" or "masked".
    stock_layout: str
    #: The guard's reason (None: the guard permits masked).
    guard_reason: str | None
    tokens: tuple[int, ...]

    @property
    def label(self) -> str:
        par = f"EP{self.ep}" if self.ep > 1 else f"TP{self.tp}"
        return f"{self.model} {par}" + (" deepep" if self.mode == "deepep_normal" else "")

    @property
    def gateup(self) -> int:
        return 2 * self.inter

    def masked_bytes(self, tokens: int) -> int:
        return masked_peak_bytes(self.local_experts, tokens, self.hidden, self.gateup, self.hidden)


def _parallel(model: ModelSpec) -> Iterable[tuple[int, int, int, int]]:
    """(tp, ep, E_local, D) of the standard-dispatch settings that divide the model (D a multiple of the group)."""
    for tp in TP_SIZES:
        if model.inter % tp == 0 and (model.inter // tp) % GROUP == 0:
            yield tp, 1, model.experts, model.inter // tp
    for ep in EP_SIZES:
        if model.experts % ep == 0 and model.inter % GROUP == 0:
            yield 1, ep, model.experts // ep, model.inter


def _case(
    model: ModelSpec,
    mode: str,
    tp: int,
    ep: int,
    e: int,
    d: int,
    layout: str,
    reason: str | None,
    tokens: Sequence[int],
) -> E2ECase:
    return E2ECase(
        model.short_name,
        mode,
        tp,
        ep,
        model.experts,
        e,
        model.hidden,
        d,
        model.topk,
        model.swiglu_limit,
        layout,
        reason,
        tuple(tokens),
    )


def derive_cases(catalog: Sequence[ModelSpec] | None = None) -> list[E2ECase]:
    """Every configuration of the benchmark, in order: guard-refused, masked extras, DeepEP normal."""
    models = load_catalog() if catalog is None else catalog
    all_tokens = DECODE_TOKENS + PREFILL_TOKENS
    cases = []
    for model in models:
        if model.gpt_oss_activation:  # SGLang's gemm1_alpha path, not this activation
            continue
        for tp, ep, e, d in _parallel(model):
            reason = masked_activation_unsupported_reason(model.swiglu_limit, d, e, model.group_size or GROUP)
            if reason is not None:
                cases.append(_case(model, "standard", tp, ep, e, d, "compact", reason, all_tokens))
    for name, tp, ep in MASKED_EXTRA:
        model = get_model(name)
        e, d = model.experts // ep, model.inter // tp
        reason = masked_activation_unsupported_reason(model.swiglu_limit, d, e, model.group_size or GROUP)
        if reason is None:
            cases.append(_case(model, "standard", tp, ep, e, d, "masked", None, all_tokens))
    for name in DEEPEP_MODELS:
        model = get_model(name)
        cases.append(
            _case(model, "deepep_normal", 1, 8, model.experts // 8, model.inter, "compact", None, PREFILL_TOKENS)
        )
    return cases


def filter_cases(cases: Sequence[E2ECase], only: str | None, quick: bool = False) -> list[E2ECase]:
    """``--only`` (comma-separated substrings of labels, case-insensitive; a term ending in ``|`` matches a whole
    label) and ``--quick`` (token counts 16 and 2048)."""
    out = list(cases)
    if only:
        wanted = [w.strip().lower() for w in only.split(",") if w.strip()]

        def hit(label: str) -> bool:
            return any(label == w[:-1] if w.endswith("|") else w in label for w in wanted)

        out = [c for c in out if hit(c.label.lower())]
    if quick:
        keep = (16, 2048)
        out = [
            E2ECase(**{**c.__dict__, "tokens": tuple(t for t in c.tokens if t in keep) or c.tokens[:1]}) for c in out
        ]
    return out
