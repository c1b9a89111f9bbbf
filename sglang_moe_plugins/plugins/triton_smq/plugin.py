"""``triton``: this project's own Triton kernel for ``silu_mul_quant``.

Every shape the op allows (any E, any N, any D that is a multiple of the group size, groups of
16 to 256), ragged ``masked_m`` with empty experts, ``swiglu_limit``, the gran-8 swizzled input,
and all three scale layouts. One launch per call, no host sync, CUDA-graph capturable; one
compiled kernel per shape family (E, D, group size, layout, flags), whatever N and ``masked_m``.

Importing this module imports neither Triton nor the kernel: both load (:mod:`.launch`, which
imports :mod:`.kernel`) on the first ``prepare`` or ``run``. ``prepare(shape, config)`` returns the
launch of a shape key with every shape-dependent decision made once (the hooked path calls it through
``Selector.bind``, which keeps the bound op per key). ``run`` is for callers that go through it
directly (the conformance suite, ``check``): it keeps the launches it prepared, per shape key and
device, so that repeated calls of one key are planned and compiled once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from ...contract import Plugin, Support
from ...hardware import Platform, triton_available
from ...log import get_logger
from ...ops.silu_mul_quant import (
    GROUP_SIZES,
    OP,
    SiluMulQuantConfig,
    SiluMulQuantInputs,
    SiluMulQuantOutputs,
    SiluMulQuantShape,
    expected_scale_strides,
)

__all__ = ["TritonPlugin", "MIN_SM", "triton_fp8_available"]

#: The FP8 e4m3 conversion the kernel relies on (``cvt.rn.satfinite.e4m3x2.f32``) needs sm89+.
MIN_SM = 89
_MAX_INT32 = 2**31 - 1
#: Shape keys ``run`` keeps a prepared launch for (then it starts over, with one log line).
_MAX_PREPARED = 1024
_LOCK = threading.Lock()
logger = get_logger(__name__)


@functools.lru_cache(maxsize=64)
def _bf16_limit(limit: float) -> float:
    from ...quant import round_to_bf16

    return round_to_bf16(limit)


def triton_fp8_available(platform: Platform) -> Support:
    """Whether this project's Triton FP8 kernels (``triton``, ``contig_triton``) can run on ``platform``."""
    if not platform.is_cuda:
        return Support.no(f"needs a CUDA device; this call runs on {platform.describe()}")
    if platform.sm is not None and platform.sm < MIN_SM:
        return Support.no(f"needs sm{MIN_SM}+ for the FP8 e4m3 conversion; the device is sm{platform.sm}")
    if not triton_available():
        return Support.no("the 'triton' package is not importable in this environment")
    return Support.yes(f"Triton on {platform.describe()}")


class TritonPlugin(Plugin):
    name = "triton"
    op = OP
    # Set from docs/triton-kernel.md ("Default priorities"): through the plugins, which is what selection
    # compares, this kernel is faster than jit_ep on every shape both take (jit_ep clamps masked_m in a
    # kernel of its own first), so it ranks
    # above jit_ep (100); on every other shape it is the fastest path with the op's numerics, ahead of
    # fp8_fallback (50).
    priority = 110
    description = "Triton kernel: every shape, swiglu_limit, swizzle, fp32/UE8M0 scales; persistent, no host sync"
    #: ``pdl``: launch with programmatic dependent launch on sm90+ (the kernel reads ``masked_m``
    #: before waiting for the previous kernel in the stream, as SGLang's JIT kernel does; set it to
    #: false when the kernel right before this op may still be writing ``masked_m``).
    options = MappingProxyType({"pdl": True})
    #: The kernel stores to ``out`` and ``scale`` only; ``gateup`` is loaded, never stored to.
    writes_inputs: frozenset[str] = frozenset()

    @functools.cached_property
    def _launches(self) -> dict[tuple, Callable[[SiluMulQuantInputs, SiluMulQuantOutputs], None]]:
        """``run``'s prepared launches per (shape, config, device index); created on first use. The
        hooked path never fills it: the Selector calls ``prepare`` once per key and keeps the bound op."""
        return {}

    def available(self, platform: Platform) -> Support:
        return triton_fp8_available(platform)

    def supports(self, shape: SiluMulQuantShape, config: SiluMulQuantConfig) -> Support:
        here = self.available(config.platform)
        if not here:
            return here
        gs = shape.group_size
        if gs not in GROUP_SIZES:
            return Support.no(f"group_size {gs} is not one of {GROUP_SIZES}")
        if shape.hidden <= 0 or shape.hidden % gs != 0:
            return Support.no(f"D ({shape.hidden}) is not a positive multiple of group_size ({gs})")
        if shape.max_rows > _MAX_INT32:
            return Support.no(f"N ({shape.max_rows}) exceeds the kernel's int32 row index ({_MAX_INT32})")
        if shape.num_experts * shape.max_rows > _MAX_INT32:
            return Support.no(f"E * N ({shape.num_experts * shape.max_rows}) rows exceed the kernel's int32 tile count")
        return Support.yes(
            f"Triton kernel handles {shape.describe()} with {config.scale_layout} scales"
            + (", swiglu_limit" if config.swiglu_limit is not None else "")
            + (", swizzle" if config.swizzle else "")
        )

    def prepare(
        self, shape: SiluMulQuantShape, config: SiluMulQuantConfig
    ) -> Callable[[SiluMulQuantInputs, SiluMulQuantOutputs], None]:
        """The launch for this shape key, decided once: launch configuration, constexprs, grid (from
        the compiled kernel's occupancy), PDL, the bf16-rounded ``swiglu_limit`` and the scale
        strides of the layout. On CUDA the kernel is compiled here and each call goes to its
        launcher directly (no JIT dispatch); see :func:`.launch.prepare_launch`."""
        import torch  # bind time (once per key), as the launcher's own import of Triton

        from . import launch as launcher

        device_index = torch.cuda.current_device() if config.platform.is_cuda else None
        return self._prepare(shape, config, device_index, launcher)

    def _prepare(
        self, shape: SiluMulQuantShape, config: SiluMulQuantConfig, device_index: int | None, launcher: Any
    ) -> Callable[[SiluMulQuantInputs, SiluMulQuantOutputs], None]:
        """``prepare`` for ``device_index`` through the module ``launcher`` (:mod:`.launch`; tests pass
        it with its device queries replaced)."""
        from .tuning import choose_config

        limit = None if config.swiglu_limit is None else _bf16_limit(float(config.swiglu_limit))
        launch = launcher.prepare_launch(
            shape.num_experts,
            shape.max_rows,
            shape.hidden,
            group_size=shape.group_size,
            scale_strides=expected_scale_strides(shape, config)[1],
            swiglu_limit=limit,
            swizzle=config.swizzle,
            ue8m0=config.scale_ue8m0,
            config=choose_config(shape.num_experts, shape.max_rows, shape.hidden, shape.group_size, shape.topk),
            pdl=bool(self.options.get("pdl", True)),
            device_index=device_index,
        )

        def bound(inputs: SiluMulQuantInputs, outputs: SiluMulQuantOutputs) -> None:
            launch(inputs.gateup, inputs.masked_m, outputs.out, outputs.scale)

        bound.launch = launch  # type: ignore[attr-defined]  # the tensor-level launcher (tests, benchmarks)
        return bound

    def run(
        self,
        inputs: SiluMulQuantInputs,
        outputs: SiluMulQuantOutputs,
        shape: SiluMulQuantShape,
        config: SiluMulQuantConfig,
    ) -> None:
        """Launch through the prepared launch of ``(shape, config, device)``, prepared on first use."""
        index = inputs.gateup.get_device()
        device_index = None if index < 0 else index
        key = (shape, config, device_index)
        launch = self._launches.get(key)
        if launch is None:
            from . import launch as launcher

            launch = self._prepare(shape, config, device_index, launcher)
            with _LOCK:
                if len(self._launches) >= _MAX_PREPARED:
                    logger.warning(
                        "triton: more than %d shape keys prepared; dropping the cached launches", _MAX_PREPARED
                    )
                    self._launches.clear()
                self._launches[key] = launch
        launch(inputs, outputs)
