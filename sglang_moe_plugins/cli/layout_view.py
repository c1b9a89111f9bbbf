"""What ``explain`` says about a model's DeepGEMM layouts on the installed SGLang release: which layout the release
takes and why (its activation guard, DeepEP mode, or the memory policy, which cannot be known offline), which
op and plugin then runs, and what stock SGLang runs instead; and per call what the installed release's own
function does with it (:func:`stock_masked`, :func:`stock_contig`, :func:`stock_mega`: its kernel, or that it
crashes and with which of SGLang's assertions, as read from the released wheels).

SGLang's guard (``_masked_activation_unsupported_reason``, the same body in 0.5.20-0.5.23) is modelled by
:func:`sglang_guard_reason`; ``tests/test_layout_view.py`` checks it against the installed release's function.
Nothing here imports SGLang or torch's CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware import Platform
from ..integrations.sglang.stock_rules import jit_limit
from ..integrations.sglang.versions import _release_key, sglang_version

__all__ = [
    "GUARD_RELEASE",
    "LayoutView",
    "StockOutcome",
    "hooked_here",
    "layout_view",
    "sglang_guard_reason",
    "stock_contig",
    "stock_masked",
    "stock_mega",
]

#: The first release whose compact layout takes the configs the guard refuses (before it: an assert).
GUARD_RELEASE = "0.5.20"
#: The first release whose masked activation sends only clamped/swizzled calls to the DSV4 JIT kernel (0.5.16:
#: every call whose shape fits it, and a clamped call that does not fit asserts).
_ARGUMENT_RELEASE = "0.5.17"


@dataclass(frozen=True)
class StockOutcome:
    """What stock SGLang (``release``) does with one call: ``runs`` names its kernel, or starts with "crashes: "
    (``raises``) and gives SGLang's own assertion or the kernel limit it breaks."""

    release: str | None
    runs: str
    raises: bool = False

    def describe(self) -> str:
        return f"stock SGLang {self.release or '(not installed)'}: {self.runs}"


def _after(release: str | None, first: str) -> bool:
    return release is None or _release_key(release) >= _release_key(first)


def hooked_here(op: str, release: str | None) -> bool:
    """Whether the package hooks ``op`` on ``release`` (its version-table entry, or the newest one for a newer
    release; not installed: the newest)."""
    from ..integrations.sglang.version_table import KNOWN_TARGETS

    newest = max(KNOWN_TARGETS, key=_release_key)
    if release is None or _release_key(release) > _release_key(newest):
        targets = KNOWN_TARGETS[newest]
    else:
        targets = KNOWN_TARGETS.get(release.split("+", 1)[0], ())
    return any(t.op == op for t in targets)


def stock_masked(
    release: str | None, *, experts: int, rows: int | None, hidden: int, group_size: int, clamped: bool
) -> StockOutcome:
    """The installed release's ``_varlen_deep_gemm_silu_mul_quant`` on a call (E, N = ``rows``, D, group); no
    gemm1_alpha, swizzle or keep_fp32 (explain's calls). ``rows`` None: N % 4 == 0 assumed (the layouts' view)."""
    groups = hidden // group_size
    n = "N" if rows is None else str(rows)
    fits = (rows is None or rows % 4 == 0) and groups % 4 == 0 and hidden // 8 >= experts
    jit = "the DSV4 JIT kernel silu_and_mul_masked_post_quant"
    limit = jit_limit(experts, hidden, group_size)
    if not _after(release, _ARGUMENT_RELEASE):  # 0.5.16: by shape
        if fits:
            if limit is None:
                return StockOutcome(release, jit)
            return StockOutcome(release, f"crashes: outside {jit}'s limits: {limit}", True)
        if clamped:
            return StockOutcome(
                release,
                "crashes: AssertionError: swiglu_limit (DeepSeek V4) requires SGLANG_OPT_USE_JIT_EP_ACTIVATION=True "
                f"(its JIT kernel is skipped: N={n} G={groups} D={hidden} E={experts} breaks N % 4 == 0, G % 4 == 0 "
                "or D // 8 >= E)",
                True,
            )
        return StockOutcome(release, "the Triton kernel silu_and_mul_masked_post_quant_fwd (row-major scales)")
    if not clamped:
        return StockOutcome(release, "per_token_group_quant (fused SiLU, masked; SiLU rounded to bf16)")
    if not fits:
        return StockOutcome(
            release,
            "crashes: AssertionError: DSV4 JIT activation requires N % 4 == 0, G % 4 == 0 and D // 8 >= num_experts, "
            f"got N={n} G={groups} D={hidden} E={experts}",
            True,
        )
    if limit is not None:
        return StockOutcome(release, f"crashes: outside {jit}'s limits: {limit}", True)
    return StockOutcome(release, jit)


def stock_contig(release: str | None, *, clamped: bool) -> StockOutcome:
    """The compact runner's activation step on the release (no swizzle or keep_fp32: its two-kernel branch)."""
    if not _after(release, GUARD_RELEASE):
        first = "silu_and_mul (the limit applied first in torch)" if clamped else "silu_and_mul"
    else:
        first = "silu_and_mul_clamp" if clamped else "silu_and_mul"
    return StockOutcome(release, f"two kernels: {first} into bf16, then sglang_per_token_group_quant_fp8")


#: The plugin that calls the DeepGEMM MegaMoE kernel stock SGLang calls, per variant; its shape checks model
#: DeepGEMM's own (``check_mega_moe_shapes``, the block-128 scales of sm90, the top_k packing).
_MEGA_KERNEL_PLUGINS = {"fp8xfp4": "mega_w4a8", "mxf4xmxf4": "mega_w4a4", "sm90_fp8": "mega_sm90_fp8"}
_MEGA_SHAPE_LIMITS = ("check_mega_moe_shapes", "(block-128 scales)", "(the kernel packs")


def stock_mega(release: str | None, label: str, variant: str, candidates: Any = ()) -> StockOutcome:
    """SGLang's ``run_mega_routed_experts`` (``--moe-a2a-backend megamoe``) with the variant's weights: DeepGEMM's
    kernel, or, where the plugin calling that kernel finds a shape outside DeepGEMM's checks, the crash."""
    name = _MEGA_KERNEL_PLUGINS.get(variant)
    for candidate in candidates:
        if candidate.name == name and candidate.verdict == "unsupported":
            if any(mark in candidate.reason for mark in _MEGA_SHAPE_LIMITS):
                return StockOutcome(release, f"crashes: DeepGEMM's MegaMoE kernel refuses it: {candidate.reason}", True)
    return StockOutcome(release, f"DeepGEMM's MegaMoE kernel ({label}) through run_mega_routed_experts")


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


def _stock_masked_kernel(release: str | None, hidden: int, experts: int, group_size: int, clamped: bool) -> str:
    return stock_masked(release, experts=experts, rows=None, hidden=hidden, group_size=group_size, clamped=clamped).runs


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
        stock_runs = _stock_masked_kernel(release, hidden, experts, group_size, clamped)
        package_layout, package_runs = "masked", masked_runs
    elif guard is None:
        stock_layout, stock_runs = (
            memory + "; else compact",
            _stock_masked_kernel(release, hidden, experts, group_size, clamped),
        )
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
        f"masked always (the guard is not consulted); stock: {_stock_masked_kernel(release, hidden, experts, group_size, clamped)}; "
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
