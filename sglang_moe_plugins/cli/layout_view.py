"""What ``explain`` says about a model's DeepGEMM layouts on the installed SGLang release: which layout the release
takes and why (its activation guard, DeepEP mode, or the memory policy, which cannot be known offline), which
op and plugin then runs, and what stock SGLang runs instead.

SGLang's guard (``_masked_activation_unsupported_reason``, the same body in 0.5.20-0.5.23) is modelled by
:func:`sglang_guard_reason`; ``tests/test_layout_view.py`` checks it against the installed release's function.
Nothing here imports SGLang or torch's CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware import Platform
from ..integrations.sglang.versions import _release_key, sglang_version

__all__ = ["GUARD_RELEASE", "LayoutView", "sglang_guard_reason", "layout_view"]

#: The first release whose compact layout takes the configs the guard refuses (before it: an assert).
GUARD_RELEASE = "0.5.20"


def sglang_guard_reason(
    *, experts: int, hidden: int, group_size: int, swiglu_limit: float | None, megamoe: bool = False
) -> str | None:
    """SGLang 0.5.20-0.5.23's ``_masked_activation_unsupported_reason`` for a layer (E local experts, D per partition)."""
    if swiglu_limit is None and not megamoe:
        return None
    if hidden // 8 < experts:
        return f"D // 8 ({hidden // 8}) < num_local_experts ({experts})"
    if group_size != 128:
        return f"masked activation group_size {group_size}, DSV4 JIT kernel requires 128"
    if hidden % (group_size * 4) != 0:
        return f"D ({hidden}) not divisible by 4 * group_size"
    return None


@dataclass(frozen=True)
class LayoutView:
    """One model at one parallel setting: the layouts and what runs in each."""

    release: str | None
    guard: str | None
    stock_layout: str
    stock_runs: str
    package_layout: str
    package_runs: str
    deepep_normal: str
    deepep_low_latency: str

    def lines(self) -> list[str]:
        return [
            f"  SGLang {self.release or '(not installed)'}, standard dispatch: {self.stock_layout}",
            f"    stock SGLang runs: {self.stock_runs}",
            f"    with the package: {self.package_layout}; {self.package_runs}",
            f"  DeepEP normal dispatch: {self.deepep_normal}",
            f"  DeepEP low-latency dispatch: {self.deepep_low_latency}",
        ]


def _stock_masked_kernel(hidden: int, experts: int, group_size: int, clamped: bool) -> str:
    if not clamped:
        return "per_token_group_quant (fused SiLU, masked; SiLU rounded to bf16)"
    if hidden // 8 >= experts and group_size in (32, 128) and hidden % 256 == 0:
        return "the DSV4 JIT kernel silu_and_mul_masked_post_quant"
    return (
        "the DSV4 JIT kernel behind its asserts (N % 4, G % 4, D // 8 >= E): AssertionError on this shape "
        f"(D // 8 = {hidden // 8}, E = {experts})"
    )


def layout_view(
    *,
    experts: int,
    hidden: int,
    group_size: int,
    swiglu_limit: float | None,
    topk: int,
    platform: Platform,
    ue8m0: bool,
    selector: Any,
    masked_layout: str,
    smq_hooked: bool = True,
    contig_hooked: bool = True,
    release: str | None = None,
) -> LayoutView:
    """The view of one layer (``experts`` local experts, ``hidden`` = D per partition)."""
    from ..integrations.sglang.layout import LayoutKey, decide_layout
    from ..ops.silu_mul_quant import SiluMulQuantConfig, SiluMulQuantShape
    from ..ops.silu_mul_quant_contig import ContigConfig, ContigShape

    release = sglang_version() if release is None else release
    clamped = swiglu_limit is not None
    has_guard = release is not None and _release_key(release) >= _release_key(GUARD_RELEASE)
    guard = sglang_guard_reason(experts=experts, hidden=hidden, group_size=group_size, swiglu_limit=swiglu_limit)
    smq_layout = "ue8m0_packed" if ue8m0 else ("row_major" if clamped else "column_major")
    smq_config = SiluMulQuantConfig(platform, swiglu_limit, False, smq_layout)  # type: ignore[arg-type]

    def masked_plugin(rows: int) -> str | None:
        chosen = selector.explain(
            "silu_mul_quant", SiluMulQuantShape(experts, rows, hidden, group_size, topk), smq_config
        ).chosen
        return None if chosen is None else chosen.name

    contig_config = ContigConfig(platform, swiglu_limit, False, "ue8m0_packed" if ue8m0 else "row_major", False)
    contig = selector.explain("silu_mul_quant_contig", ContigShape(hidden, group_size), contig_config).chosen
    two_kernels = (
        "two kernels: silu_and_mul_clamp into bf16, then sglang_per_token_group_quant_fp8"
        if clamped
        else "two kernels: silu_and_mul into bf16, then sglang_per_token_group_quant_fp8"
    )
    if not contig_hooked:
        contig_runs = f"op silu_mul_quant_contig is stock: SGLang's {two_kernels}"
    elif contig is not None:
        contig_runs = f"op silu_mul_quant_contig runs {contig.name}"
    else:
        contig_runs = "op silu_mul_quant_contig: no enabled plugin (raises NoPluginAvailableError)"
    plugin = masked_plugin(256)
    masked_runs = (
        f"op silu_mul_quant runs {plugin}"
        if plugin is not None
        else "op silu_mul_quant: no enabled plugin (raises NoPluginAvailableError)"
    )
    memory = "masked, if SGLang's memory policy allows (SGLANG_DEEPGEMM_STANDARD_LAYOUT=auto: decided at run time, unknown offline)"
    if not has_guard:
        stock_layout = f"masked (releases before {GUARD_RELEASE} have no compact fallback for the activation)"
        stock_runs = _stock_masked_kernel(hidden, experts, group_size, clamped)
        package_layout, package_runs = "masked", masked_runs
    elif guard is None:
        stock_layout, stock_runs = memory + "; else compact", _stock_masked_kernel(hidden, experts, group_size, clamped)
        package_layout, package_runs = stock_layout, f"{masked_runs}; compact: {contig_runs}"
    else:
        stock_layout, stock_runs = f"compact (SGLang's guard: {guard})", two_kernels
        decision = decide_layout(
            LayoutKey(experts, hidden, group_size, swiglu_limit, False, topk),
            masked_layout=masked_layout,
            smq_hooked=smq_hooked,
            serving=masked_plugin,
        )
        if decision.lift:
            package_layout = f"{memory} (the guard lifted: {decision.reason}); else compact"
            package_runs = f"{masked_runs}; compact: {contig_runs}"
        else:
            package_layout, package_runs = f"compact (guard kept: {decision.reason})", contig_runs
    deepep_normal = (
        f"compact always; stock: {two_kernels}; package: {contig_runs}"
        if has_guard
        else "compact always; stock: two kernels (the package hooks the compact runner from 0.5.20)"
    )
    deepep_ll = (
        f"masked always (the guard is not consulted); stock: {_stock_masked_kernel(hidden, experts, group_size, clamped)}; "
        f"package: {masked_runs}"
    )
    return LayoutView(
        release,
        guard if has_guard else None,
        stock_layout,
        stock_runs,
        package_layout,
        package_runs,
        deepep_normal,
        deepep_ll,
    )
