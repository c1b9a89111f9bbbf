"""The SGLang version table: which host functions each release has, and what the host does around them.

Every difference between releases that a hook relies on is a field of a frozen record here, read from
the released wheels (``tests/test_sglang_releases.py`` checks the table against each release's source
with ``ast``, without installing it): the parameters of each host function (which keywords a release
takes: shared experts from 0.5.22, ``activation`` and ``routing_in_buffer`` from 0.5.23), the scale
layout of each ``silu_mul_quant`` branch, and what ``run_mega_routed_experts`` does around its kernel.
The hooks read the record of the release they were registered for (:func:`.versions.active_target`); they hold
no per-release if-chains.

Which case of the table applies to the installed SGLang: :mod:`.versions` (the names here are also
importable from there).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HookTarget",
    "SmqHost",
    "MegaHost",
    "ContigHost",
    "KNOWN_TARGETS",
    "SMQ_TARGET",
    "MEGA_TARGET",
    "CONTIG_RUNNER_TARGET",
    "GUARD_TARGET",
    "POLICY_TARGET",
]

SMQ_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._varlen_deep_gemm_silu_mul_quant"
MEGA_TARGET = "sglang.srt.layers.moe.mega_moe.run_mega_routed_experts"
#: The compact (contiguous) runner method whose activation step op ``silu_mul_quant_contig`` serves.
CONTIG_RUNNER_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm.DeepGemmRunnerCore._run_contiguous_gemm"


@dataclass(frozen=True)
class SmqHost:
    """What a release's ``_varlen_deep_gemm_silu_mul_quant`` does with a call (not gemm1_alpha).

    ``jit_arguments``: the arguments that, when set, send a call to the DSV4 JIT kernel
    (``silu_and_mul_masked_post_quant``), which returns row-major fp32 scales, or with UE8M0 packed
    int32 ``[E, G//4, N]`` transposed. ``default_layout``: the fp32 scale layout of every other call:
    ``column_major`` from ``per_token_group_quant(..., column_major_scales=True)`` (0.5.17+), or
    ``row_major`` (0.5.16: the JIT kernel when the shape fits, else the Triton
    ``silu_and_mul_masked_post_quant_fwd``, both row-major). With UE8M0 every call returns packed
    int32 scales (0.5.16's Triton fallback returns UE8M0-rounded fp32 instead; its caller packs either,
    docs/host-notes.md).
    """

    jit_arguments: tuple[str, ...]
    default_layout: str

    def dsv4_branch(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call with these (bound) arguments returns the DSV4 branch's scale layout (row-major
        fp32): it sets one of :attr:`jit_arguments`, or the release's default path is row-major (0.5.16).
        The layout itself: :func:`.silu_mul_quant.release_scale_layout`."""
        jit = any(arguments.get(name) not in (None, False) for name in self.jit_arguments)
        return jit or self.default_layout == "row_major"


@dataclass(frozen=True)
class MegaHost:
    """What a release's ``run_mega_routed_experts`` does (SM100 path; SM90 is the same in every release).

    ``scaling_on_output``: ``routed_scaling_factor`` multiplies the bf16 output after the kernel
    (0.5.21) instead of the top-k weights before it (0.5.22+). ``mma_type_from_host``: the variant comes
    from the host's ``_mega_moe_mma_type(experts)`` (0.5.21 reads a server flag) rather than from
    attributes of the experts. ``buffer_keywords``: the keywords the host's ``_get_mega_moe_symm_buffer``
    takes after the five sizes (read by ``tests/test_sglang_releases.py``; the plugin that takes the
    buffer reads the host's signature itself).
    """

    scaling_on_output: bool
    mma_type_from_host: bool
    buffer_keywords: tuple[str, ...]


@dataclass(frozen=True)
class ContigHost:
    """What a release's ``DeepGemmRunnerCore._run_contiguous_gemm`` does in its activation step (0.5.20+).

    The method has three activation branches (read from the wheels, checked by ``tests/test_sglang_releases.py``):
    ``situ`` (its own kernels), the fused branch (SGLang's JIT ``silu_and_mul_contig_post_quant`` into
    buffers the method allocates) taken when one of :attr:`fused_when` is true, and otherwise the two-kernel
    branch (``silu_and_mul_clamp``/``silu_and_mul`` into a bf16 buffer, then ``sglang_per_token_group_quant_fp8``).
    The fused branch allocates exactly the outputs the two-kernel branch returns (same dtypes and scale
    layout, from the same UE8M0 flags), so the runner hook sends a two-kernel call through the fused branch
    by setting :attr:`redirect` on the runner for the duration of the call, and serves the kernel call.

    ``kernel_path``: where the method imports ``silu_and_mul_contig_post_quant`` from (inside the method,
    so the hooked module attribute is what it gets). ``fused_when``: the runner attributes of the fused
    branch's condition (``config.x`` is ``self.config.x``). ``redirect``: the attribute set to True to take
    the fused branch (one that changes nothing else in the method: ``config.silu_mul_keep_fp32`` from
    0.5.21; on 0.5.20, ``use_swizzle``, whose only other use is the kernel's ``swizzle`` argument, which the
    hook then ignores).
    """

    kernel_path: str
    fused_when: tuple[str, ...]
    redirect: str


@dataclass(frozen=True)
class HookTarget:
    """A host function we hook: dotted path, op, the parameter names we rely on (in order), the hook
    function (``module:function``) and the host's behaviour record."""

    path: str
    op: str
    parameters: tuple[str, ...]
    hook: str = ""
    host: SmqHost | MegaHost | ContigHost | None = field(default=None, compare=True)
    #: Paths of targets that must be hooked too for this one to be (else neither serves its op correctly):
    #: the compact runner and its kernel need each other; the layout guard and policy need the masked op's hook.
    requires: tuple[str, ...] = ()

    def hook_function(self) -> Any:
        name = self.hook or _DEFAULT_HOOKS[self.op]
        module, attr = name.split(":")
        return getattr(importlib.import_module(module), attr)


_SMQ_9 = (
    "gateup_output",
    "masked_m",
    "group_size",
    "topk",
    "swiglu_limit",
    "swizzle",
    "gemm1_alpha",
    "gemm1_clamp_limit",
    "num_real_tokens",
)
_SMQ_10 = (*_SMQ_9, "silu_mul_keep_fp32")
_MEGA_10 = (
    "experts",
    "hidden_states",
    "topk_ids",
    "topk_weights",
    "hidden_size",
    "intermediate_size",
    "top_k",
    "num_tokens",
    "activation_clamp",
    "routed_scaling_factor",
)
_MEGA_13 = (*_MEGA_10, "num_shared_experts", "shared_l1_weights", "shared_l2_weights")
_MEGA_15 = (
    *_MEGA_10,
    "activation",
    "num_shared_experts",
    "shared_l1_weights",
    "shared_l2_weights",
    "routing_in_buffer",
)

_SMQ_HOOK = "sglang_moe_plugins.integrations.sglang.silu_mul_quant:silu_mul_quant_hook"
_MEGA_HOOK = "sglang_moe_plugins.integrations.sglang.mega_moe:mega_moe_hook"
_CONTIG_RUNNER_HOOK = "sglang_moe_plugins.integrations.sglang.contig:contig_runner_hook"
_CONTIG_KERNEL_HOOK = "sglang_moe_plugins.integrations.sglang.contig:contig_kernel_hook"
_DEFAULT_HOOKS = {"silu_mul_quant": _SMQ_HOOK, "mega_moe": _MEGA_HOOK}
_CONTIG_RUNNER_PARAMS = ("self", "runner_input", "quant_info", "running_state")
_CONTIG_KERNEL_PARAMS = (
    "input",
    "output",
    "output_scale",
    "quant_group_size",
    "scale_ue8m0",
    "transposed",
    "swiglu_limit",
    "swizzle",
)
_CONTIG_OP = "silu_mul_quant_contig"


def _contig_targets(kernel_module: str, fused_when: tuple[str, ...], redirect: str) -> tuple[HookTarget, HookTarget]:
    host = ContigHost(f"{kernel_module}.silu_and_mul_contig_post_quant", fused_when, redirect)
    return (
        HookTarget(
            CONTIG_RUNNER_TARGET, _CONTIG_OP, _CONTIG_RUNNER_PARAMS, _CONTIG_RUNNER_HOOK, host, (host.kernel_path,)
        ),
        HookTarget(
            host.kernel_path, _CONTIG_OP, _CONTIG_KERNEL_PARAMS, _CONTIG_KERNEL_HOOK, host, (CONTIG_RUNNER_TARGET,)
        ),
    )


#: SGLang's activation guard of the masked layout (0.5.20+), hooked with op ``silu_mul_quant`` (:mod:`.layout`).
GUARD_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._masked_activation_unsupported_reason"
_GUARD = HookTarget(
    GUARD_TARGET,
    "silu_mul_quant",
    ("runner_config", "quant_info"),
    "sglang_moe_plugins.integrations.sglang.layout:masked_guard_hook",
    requires=(SMQ_TARGET,),
)
#: SGLang's layout policy, hooked to hand the batch's token count to the guard's hook.
POLICY_TARGET = "sglang.srt.layers.moe.moe_runner.deep_gemm._should_use_masked_standard_layout"
_POLICY = HookTarget(
    POLICY_TARGET,
    "silu_mul_quant",
    ("runner_config", "quant_info", "hidden_states"),
    "sglang_moe_plugins.integrations.sglang.layout:masked_policy_hook",
    requires=(SMQ_TARGET, GUARD_TARGET),
)
_CONTIG_0520 = _contig_targets("sglang.kernels.ops.attention.dsv4", ("use_swizzle",), "use_swizzle")
_CONTIG_0521 = _contig_targets(
    "sglang.kernels.ops.moe.dsv4", ("use_swizzle", "config.silu_mul_keep_fp32"), "config.silu_mul_keep_fp32"
)
_CONTIG_0523 = _contig_targets(
    "sglang.kernels.ops.activation.silu_and_mul_clamp",
    ("use_swizzle", "config.silu_mul_keep_fp32"),
    "config.silu_mul_keep_fp32",
)

# 0.5.16 picks the JIT kernel by shape (and SGLANG_OPT_USE_JIT_EP_ACTIVATION, default on), not by
# argument; both of its kernels return row-major fp32 scales, so no argument changes the layout.
_SMQ_0516 = HookTarget(SMQ_TARGET, "silu_mul_quant", _SMQ_9, _SMQ_HOOK, SmqHost((), "row_major"))
_SMQ_0517 = HookTarget(
    SMQ_TARGET, "silu_mul_quant", _SMQ_9, _SMQ_HOOK, SmqHost(("swiglu_limit", "swizzle"), "column_major")
)
_SMQ_0521 = HookTarget(
    SMQ_TARGET,
    "silu_mul_quant",
    _SMQ_10,
    _SMQ_HOOK,
    SmqHost(("swiglu_limit", "swizzle", "silu_mul_keep_fp32"), "column_major"),
)
_MEGA_0521 = HookTarget(MEGA_TARGET, "mega_moe", _MEGA_10, _MEGA_HOOK, MegaHost(True, True, ("mma_type",)))
_MEGA_0522 = HookTarget(
    MEGA_TARGET, "mega_moe", _MEGA_13, _MEGA_HOOK, MegaHost(False, False, ("num_shared_experts", "mma_type"))
)
_MEGA_0523 = HookTarget(
    MEGA_TARGET,
    "mega_moe",
    _MEGA_15,
    _MEGA_HOOK,
    MegaHost(False, False, ("num_shared_experts", "mma_type", "activation")),
)

#: SGLang releases whose hook targets, signatures and host behaviour were read from the released wheels.
KNOWN_TARGETS: dict[str, tuple[HookTarget, ...]] = {
    "0.5.16": (_SMQ_0516,),
    "0.5.17": (_SMQ_0517,),
    "0.5.18": (_SMQ_0517,),
    "0.5.19": (_SMQ_0517,),
    "0.5.20": (_SMQ_0517, _GUARD, _POLICY, *_CONTIG_0520),
    "0.5.21": (_SMQ_0521, _GUARD, _POLICY, _MEGA_0521, *_CONTIG_0521),
    "0.5.22": (_SMQ_0521, _GUARD, _POLICY, _MEGA_0522, *_CONTIG_0521),
    "0.5.23": (_SMQ_0521, _GUARD, _POLICY, _MEGA_0523, *_CONTIG_0523),
}
