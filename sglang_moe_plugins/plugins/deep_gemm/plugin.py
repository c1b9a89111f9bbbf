"""The DeepGEMM MegaMoE plugins ``mega_w4a8``, ``mega_w4a4`` and ``mega_sm90_fp8``: one table of variants.

Each plugin is a row of :data:`VARIANTS` (a frozen :class:`Variant`) run by one class,
:class:`MegaDeepGemmPlugin`. A call makes the calls SGLang 0.5.23's ``run_mega_routed_experts`` makes
for its variant, with only the arguments the installed sgl-deep-gemm release takes
(:class:`~sglang_moe_plugins.plugins.deep_gemm.api.DeepGemmApi`, read from its signatures):

1. the symmetric buffer: SGLang's cached ``_get_mega_moe_symm_buffer`` when SGLang's MegaMoE module is
   loaded and the release takes SGLang's arguments (one buffer per layer shape, shared with SGLang's
   mega gate), else ``deep_gemm.get_symm_buffer_for_mega_moe(group, num_experts,
   num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden[, num_shared_experts][, mma_type],
   activation)``, cached here;
2. the pre-dispatch into ``buf.x``/``buf.x_sf``/``buf.topk_idx``/``buf.topk_weights`` (option
   ``pre_dispatch``: ``"triton"`` this project's kernel, ``"host"`` the kernel SGLang uses for the
   variant, ``"torch"`` the reference, ``"auto"`` = triton on the GPU architectures where it has a
   recorded GPU run (:data:`TRITON_PRE_DISPATCH_VERIFIED`: sm90) when triton is importable, else host;
   on SM100 ``auto`` is SGLang's / sgl-deep-gemm's own pre-dispatch);
3. the variant's entry point (``fp8_fp4_mega_moe`` on SM100, ``fp8_mega_moe`` on SM90), inside
   SGLang's SM reservation on SM100 (entered once per call).

:meth:`MegaDeepGemmPlugin.prepare` does everything that depends on the shape and config once
(arguments, pre-dispatch, reservation) and returns the launch closure; ``deep_gemm`` is imported
there, never by ``supports``, which reads the shape, the config and the detected API alone (no
import), so every rank answers the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

from ...contract import OptionValueError, Plugin, Support
from ...hardware import Platform, triton_available
from ...ops.mega_moe import OP, MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape
from .api import DeepGemmApi, detect_deep_gemm_api
from .sglang_host import sglang_installed

__all__ = [
    "Variant",
    "VARIANTS",
    "W4A8",
    "W4A4",
    "SM90_FP8",
    "PRE_DISPATCH_CHOICES",
    "TRITON_PRE_DISPATCH_VERIFIED",
    "MegaDeepGemmPlugin",
    "MegaW4A8Plugin",
    "MegaW4A4Plugin",
    "MegaSm90Fp8Plugin",
]

PRE_DISPATCH_CHOICES = ("auto", "triton", "host", "torch")
#: SM numbers on which this project's Triton pre-dispatch has a recorded GPU run (bit-exact against the
#: host's kernels, tests/gpu): ``pre_dispatch="auto"`` picks it there only, the host's own elsewhere.
TRITON_PRE_DISPATCH_VERIFIED = frozenset({90})


@dataclass(frozen=True)
class Variant:
    """One DeepGEMM MegaMoE variant: what selects it and how it is called."""

    name: str  #: plugin name
    priority: int
    variant: str  #: the op variant (``MegaMoEConfig.variant``) it runs
    label: str
    description: str
    arch: str  #: ``"sm100"`` (compute capability 10.x) or ``"sm90"`` (9.0 exactly)
    mma_type: str  #: ``get_symm_buffer_for_mega_moe(mma_type=...)`` (SGLang's; the SM90 buffer too)
    weight_format: str
    weight_hint: str  #: how SGLang builds the weights (for the rejection reason)
    hidden_align: int
    intermediate_align: int
    max_top_k: int | None
    shared_experts: bool  #: SGLang fuses its FP8 shared experts into this kernel
    kernel: str  #: the deep_gemm entry point
    recipe: tuple[int, int, int]
    host_pre_dispatch: str  #: ``"sglang"`` (SGLang's JIT kernel) or a deep_gemm function
    group_size: int  #: activation scale group of the pre-dispatch


W4A8 = Variant(
    "mega_w4a8",
    100,
    "fp8xfp4",
    "W4A8 (fp8xfp4)",
    "DeepGEMM fp8xfp4 MegaMoE (SM100), FP8 per-32 UE8M0 pre-dispatch",
    "sm100",
    "fp8xfp4",
    "fp4_e2m1_ue8m0_g32",
    "FP4 weights, gran-8 gate/up interleave: SGLang's default MegaMoE build",
    512,
    128,
    32,
    True,
    "fp8_fp4_mega_moe",
    (1, 1, 32),
    "sglang",
    32,
)
W4A4 = Variant(
    "mega_w4a4",
    110,
    "mxf4xmxf4",
    "W4A4 (mxf4xmxf4)",
    "DeepGEMM mxf4xmxf4 MegaMoE (SM100), MXFP4 E2M1 per-32 UE8M0 pre-dispatch",
    "sm100",
    "mxf4xmxf4",
    "fp4_e2m1_ue8m0_g32",
    "FP4 weights, gran-16 packed gate/up interleave: SGLang builds it with --enable-w4a4-mxfp4-megamoe",
    512,
    512,
    32,
    False,
    "fp8_fp4_mega_moe",
    (1, 1, 32),
    "mega_moe_pre_dispatch",
    32,
)
SM90_FP8 = Variant(
    "mega_sm90_fp8",
    100,
    "sm90_fp8",
    "SM90 FP8",
    "DeepGEMM fp8_mega_moe (SM90), FP8 per-128 pre-dispatch",
    "sm90",
    "fp8xfp4",
    "fp8_e4m3_block128",
    "FP8 e4m3 weights with 128x128 block scales (build_sm90_mega_moe_experts_weights)",
    128,
    128,
    None,
    False,
    "fp8_mega_moe",
    (128, 128, 128),
    "mega_moe_pre_dispatch_sm90",
    128,
)
VARIANTS: tuple[Variant, ...] = (W4A8, W4A4, SM90_FP8)


def _arch(v: Variant, platform: Platform) -> Support:
    if v.arch == "sm90":
        if not platform.is_cuda:
            return Support.no(
                f"requires CUDA compute capability 9.0 (DeepGEMM SM90 MegaMoE), the call is on {platform}"
            )
        if platform.sm != 90:
            return Support.no(
                f"DeepGEMM's fp8_mega_moe runs on compute capability 9.0 only (SGLang uses it on sm90); the device is sm{platform.sm}"
            )
        return Support.yes("sm90")
    if not platform.is_cuda:
        return Support.no(f"requires CUDA compute capability 10.x (DeepGEMM SM100 MegaMoE), the call is on {platform}")
    if (platform.sm or 0) // 10 != 10:
        return Support.no(
            f"DeepGEMM's FP4 MegaMoE kernels run on compute capability 10.x only (SM100); the device is sm{platform.sm}"
        )
    return Support.yes(f"sm{platform.sm}")


def _api(v: Variant, api: DeepGemmApi) -> Support:
    if not api.present:
        return Support.no("sgl-deep-gemm is not installed (pip install sgl-deep-gemm)")
    missing = [f for f in ("get_symm_buffer_for_mega_moe", v.kernel) if not api.has(f)]
    if missing:
        return Support.no(f"{api.describe()} lacks deep_gemm.{', deep_gemm.'.join(missing)}")
    if v.arch == "sm100" and v.mma_type not in api.mma_types:
        return Support.no(
            f"{api.describe()} selects FP4 activations through the process-wide DG_USE_FP4_ACTS / DG_USE_MXF4_KIND "
            f"variables, which this plugin never sets; needs an sgl-deep-gemm whose MegaMoE takes mma_type={v.mma_type!r} (0.1.7+)"
        )
    if api.legacy_env and v.arch == "sm100":
        names = "/".join(api.legacy_env)
        if api.refuses_legacy_env:
            return Support.no(
                f"{names} is set; {api.describe()} raises RuntimeError on it (replaced by mma_type): unset it"
            )
        return Support.no(
            f"{names} is set; {api.describe()} then lays the buffer out for FP4 activations, which {v.name} does not write"
        )
    return Support.yes(api.describe())


def _weights(v: Variant, config: MegaMoEConfig) -> Support:
    if config.variant != v.variant or config.weight_format != v.weight_format:
        if v.arch == "sm90":
            return Support.no(
                f"needs {v.weight_hint}; the experts hold {config.weight_format} weights laid out for {config.variant}"
            )
        if config.variant != v.variant:
            return Support.no(
                f"the experts' weights are laid out for {config.variant}; {v.name} needs the {v.variant} layout ({v.weight_hint})"
            )
        return Support.no(f"needs FP4 E2M1 weights with per-32 UE8M0 scales, got {config.weight_format}")
    return Support.yes(f"{v.variant} weights")


def _shapes(v: Variant, shape: MegaMoEShape, api: DeepGemmApi) -> Support:
    if v.arch == "sm90":
        if shape.hidden % 128 or shape.intermediate % 128:
            return Support.no(
                f"hidden_size={shape.hidden} and moe_intermediate_size={shape.intermediate} must be multiples of 128 (block-128 scales)"
            )
    else:
        if shape.hidden % v.hidden_align:
            return Support.no(
                f"hidden_size={shape.hidden} is not a multiple of {v.hidden_align} (16 x scale group 32; check_mega_moe_shapes)"
            )
        if shape.intermediate % v.intermediate_align:
            return Support.no(
                f"moe_intermediate_size={shape.intermediate} is not a multiple of {v.intermediate_align} (check_mega_moe_shapes, {v.variant})"
            )
    if v.max_top_k is not None and shape.top_k > v.max_top_k:
        return Support.no(f"top_k={shape.top_k} > {v.max_top_k} (the kernel packs 32 / top_k tokens per warp)")
    if shape.num_shared_experts:
        if v.arch == "sm90":
            return Support.no("SGLang's SM90 MegaMoE has no in-kernel shared experts (num_shared_experts must be 0)")
        if not v.shared_experts:
            return Support.no(
                "in-kernel shared experts take FP8 weights with fp8xfp4 only (SGLang fuses them for W4A8 only)"
            )
        if not api.shared_experts:
            return Support.no(
                f"in-kernel shared experts need get_symm_buffer_for_mega_moe(num_shared_experts=...), fp8_fp4_mega_moe(shared_l1_weights=...) "
                f"and get_block_m_for_mega_moe (sgl-deep-gemm 0.1.7+); {api.describe()} takes no num_shared_experts or lacks one of them"
            )
    return Support.yes("shapes pass check_mega_moe_shapes")


def _host_pre_dispatch(v: Variant, shape: MegaMoEShape, api: DeepGemmApi) -> Support:
    if v.host_pre_dispatch == "sglang":
        if not sglang_installed():
            return Support.no(
                "option pre_dispatch='host' needs SGLang's JIT mega_moe_pre_dispatch (sglang is not installed)"
            )
        if shape.hidden > 8192 and shape.hidden % 256:
            return Support.no(
                f"SGLang's JIT pre-dispatch needs hidden above 8192 to be a multiple of 256, got {shape.hidden}"
            )
        return Support.yes("SGLang's JIT mega_moe_pre_dispatch")
    function = v.host_pre_dispatch
    if not api.has(function):
        return Support.no(f"option pre_dispatch='host' needs deep_gemm.{function}, missing in {api.describe()}")
    if v.arch == "sm100" and not api.takes(function, "mma_type"):
        return Support.no(
            f"option pre_dispatch='host' needs deep_gemm.{function}(..., mma_type=...), not in {api.describe()}"
        )
    if shape.hidden > 8192:
        return Support.no(
            f"sgl-deep-gemm's {function} covers hidden <= 8192 (one 8-column chunk per thread), got {shape.hidden}"
        )
    return Support.yes(f"sgl-deep-gemm's {function}")


def _e2m1_ties(choice: str, api: DeepGemmApi) -> Support:
    """Our E2M1 pre-dispatch must round midpoints as the installed release does (bit-exact with its own)."""
    ties = api.e2m1_ties
    if ties is None:
        return Support.no(
            f"option pre_dispatch={choice!r}: cannot tell how {api.describe()} rounds E2M1 ties "
            "(no deep_gemm/utils/math.py _quantize_to_fp4_e2m1 to read); use pre_dispatch='host'"
        )
    if choice == "torch" and ties != "even":
        return Support.no(
            f"option pre_dispatch='torch' rounds E2M1 ties to even; {api.describe()} rounds them toward zero: "
            "use pre_dispatch='host' or 'triton'"
        )
    return Support.yes(f"{choice} pre-dispatch, E2M1 ties {ties.replace('_', ' ')} as {api.describe()}")


class MegaDeepGemmPlugin(Plugin):
    """A DeepGEMM MegaMoE plugin; subclasses name their :class:`Variant` (``variant = W4A8``)."""

    op = OP
    variant: ClassVar[Variant]
    options = MappingProxyType({"pre_dispatch": "auto"})

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        v = cls.__dict__.get("variant")
        if isinstance(v, Variant):
            cls.name, cls.priority, cls.description = v.name, v.priority, v.description

    def __init__(self, api: DeepGemmApi | None = None) -> None:
        """``api``: the sgl-deep-gemm API to plan for (default: the installed one, detected once)."""
        self._api = api
        self._prepared: dict[
            tuple[MegaMoEShape, MegaMoEConfig, Any], Callable[[MegaMoEInputs, MegaMoEOutputs], None]
        ] = {}
        self._lock = threading.Lock()

    @property
    def api(self) -> DeepGemmApi:
        return self._api if self._api is not None else detect_deep_gemm_api()

    def check_options(self, options: Any) -> None:
        """``pre_dispatch`` must be one of :data:`PRE_DISPATCH_CHOICES` (a ConfigError when the registry is built)."""
        choice = options.get("pre_dispatch", "auto")
        if choice not in PRE_DISPATCH_CHOICES:
            raise OptionValueError("pre_dispatch", choice, f"one of {PRE_DISPATCH_CHOICES}")

    # -- selection ---------------------------------------------------------------------------------
    def pre_dispatch_choice(self, platform: Platform | None = None) -> str:
        """The pre-dispatch a call on ``platform`` runs (``auto`` resolved; None: an unknown platform)."""
        return self._pre_dispatch_choice(platform)[0]

    def _pre_dispatch_choice(self, platform: Platform | None) -> tuple[str, str]:
        """``(choice, why)``: ``auto`` is triton only where it has a recorded GPU run and triton imports."""
        choice = str(self.options.get("pre_dispatch", "auto"))
        if choice != "auto":
            return choice, f"option pre_dispatch={choice!r}"
        verified = "/".join(f"sm{sm}" for sm in sorted(TRITON_PRE_DISPATCH_VERIFIED))
        if platform is None or platform.sm not in TRITON_PRE_DISPATCH_VERIFIED:
            return "host", f"auto: triton pre-dispatch verified on {verified} only"
        if not triton_available():
            return "host", "auto: triton is not importable"
        return "triton", f"auto: triton pre-dispatch verified on {platform.describe().removeprefix('cuda ')}"

    def pre_dispatch_reason(self, platform: Platform | None) -> str:
        """E.g. ``host pre-dispatch (auto: triton pre-dispatch verified on sm90 only)``."""
        choice, why = self._pre_dispatch_choice(platform)
        ties = self.api.e2m1_ties
        if self.variant.variant == "mxf4xmxf4" and choice != "host" and ties is not None:
            why += f"; E2M1 ties {ties.replace('_', ' ')}, as the installed release"
        return f"{choice} pre-dispatch ({why})"

    def _pre_dispatch(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        choice = str(self.options.get("pre_dispatch", "auto"))
        if choice not in PRE_DISPATCH_CHOICES:
            return Support.no(f"option pre_dispatch={choice!r} is not one of {PRE_DISPATCH_CHOICES}")
        choice = self.pre_dispatch_choice(config.platform)
        if choice == "triton" and not triton_available():
            return Support.no("option pre_dispatch='triton' but triton is not importable")
        if choice == "host":
            return _host_pre_dispatch(self.variant, shape, self.api)
        if self.variant.variant == "mxf4xmxf4":
            return _e2m1_ties(choice, self.api)
        return Support.yes(f"{choice} pre-dispatch")

    def available(self, platform: Platform) -> Support:
        api = self.api
        return Support.all_of(
            _arch(self.variant, platform), _api(self.variant, api), ok_reason=f"{api.describe()} on {platform}"
        )

    def supports(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        v, api = self.variant, self.api
        return Support.all_of(
            _arch(v, config.platform),
            _weights(v, config),
            _api(v, api),
            _shapes(v, shape, api),
            self._pre_dispatch(shape, config),
            ok_reason=f"DeepGEMM {v.label} MegaMoE on {config.platform}, {api.describe()}, {self.pre_dispatch_reason(config.platform)}",
        )

    # -- running -----------------------------------------------------------------------------------
    def run(self, inputs: MegaMoEInputs, outputs: MegaMoEOutputs, shape: MegaMoEShape, config: MegaMoEConfig) -> None:
        self.prepare(shape, config)(inputs, outputs)

    def prepare(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Callable[[MegaMoEInputs, MegaMoEOutputs], None]:
        """The launch closure of this shape and config: arguments, pre-dispatch and SM reservation chosen once.

        One closure per ``(shape, config, pre_dispatch)`` and plugin instance: ``run``, a bound op and a
        caller of ``prepare`` share it (one prepared pre-dispatch launcher per buffer, not one per caller)."""
        key = (shape, config, self.pre_dispatch_choice(config.platform))  # options may be replaced after creation
        launch = self._prepared.get(key)
        if launch is None:
            with self._lock:
                launch = self._prepared.get(key)
                if launch is None:
                    from .launch import build_launch  # noqa: PLC0415 - deep_gemm and friends on first use

                    if len(self._prepared) >= 256:
                        self._prepared.clear()
                    launch = self._prepared[key] = build_launch(
                        self.variant, self.api, key[2], shape, config, self.name
                    )
        return launch


class MegaW4A8Plugin(MegaDeepGemmPlugin):
    """FP8 activations (per-32 UE8M0) x FP4 weights: ``mma_type='fp8xfp4'``."""

    variant = W4A8


class MegaW4A4Plugin(MegaDeepGemmPlugin):
    """MXFP4 activations (E2M1, per-32 UE8M0) x FP4 weights: ``mma_type='mxf4xmxf4'``."""

    variant = W4A4


class MegaSm90Fp8Plugin(MegaDeepGemmPlugin):
    """SM90 FP8 x FP8 (block-128 weights, per-128 activations): ``deep_gemm.fp8_mega_moe``."""

    variant = SM90_FP8
