"""``contig_triton``: this project's own Triton kernel for ``silu_mul_quant_contig``.

Every call the op allows (any M including 0, any D that is a multiple of the group size, groups of 16 to
256, ``swiglu_limit``, the gran-8 swizzled input, fp32 row-major and packed UE8M0 scales), one launch per
call, no host sync, CUDA-graph capturable; one compiled kernel per shape key (D, group size, flags),
whatever M. Rows past M are never read or written.

Importing this module imports neither Triton nor the kernel: both load (:mod:`.triton_launch`, which
imports :mod:`.triton_kernel`) on the first ``prepare`` or ``run``. ``prepare(shape, config)`` returns the
launch of a shape key with every shape-dependent decision made once; ``run`` keeps the launches it
prepared, per shape key and device.

Options: ``pdl`` (default true): programmatic dependent launch on sm90+ (the kernel waits for the previous
kernel before reading ``gateup``). ``fast_exp`` (default true): SiLU with SGLang's arithmetic (``__expf`` as
``ex2.approx`` and a fast reciprocal, as SGLang's fused contig kernel and the masked ``triton`` plugin), within
the op's fast-exponential tolerance; false: the reference's operations (libdevice ``expf``, IEEE division),
bytes identical to ``contig_reference`` but about 1.5x slower on large calls (compute-bound; measured in
``benchmarks/results/contig_activation_NVIDIA-H200.md``). Scales are IEEE ``absmax / 448`` either way.
``waves`` (default 0): cap the grid at that many whole waves of resident programs, each program then
walking several tiles (0: one tile per program).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from ...contract import Plugin, Support
from ...hardware import Platform
from ...log import get_logger
from ...ops.silu_mul_quant_contig import GROUP_SIZES, OP, ContigConfig, ContigInputs, ContigOutputs, ContigShape
from ..triton_smq.plugin import MIN_SM, triton_fp8_available

__all__ = ["ContigTritonPlugin", "MIN_SM"]

#: D above this: the per-row offsets still fit, but such widths are outside every catalogued model.
_MAX_HIDDEN = 1 << 20
#: Shape keys ``run`` keeps a prepared launch for (then it starts over, with one log line).
_MAX_PREPARED = 1024
_LOCK = threading.Lock()
logger = get_logger(__name__)


@functools.lru_cache(maxsize=64)
def _bf16_limit(limit: float) -> float:
    from ...quant import round_to_bf16

    return round_to_bf16(limit)


class ContigTritonPlugin(Plugin):
    name = "contig_triton"
    op = OP
    # Above SGLang's own kernels (contig_sglang_fused, contig_sglang_two_kernel), as the masked ``triton``.
    priority = 110
    description = (
        "Triton kernel for contiguous rows: every D/group, swiglu_limit, swizzle, fp32/UE8M0 scales; no host sync"
    )
    options = MappingProxyType({"pdl": True, "fast_exp": True, "waves": 0})
    #: The kernel stores to ``out`` and ``scale`` only; ``gateup`` is loaded, never stored to.
    writes_inputs: frozenset[str] = frozenset()

    @functools.cached_property
    def _launches(self) -> dict[tuple, Callable[[ContigInputs, ContigOutputs], None]]:
        return {}

    def available(self, platform: Platform) -> Support:
        return triton_fp8_available(platform)

    def supports(self, shape: ContigShape, config: ContigConfig) -> Support:
        here = self.available(config.platform)
        if not here:
            return here
        gs = shape.group_size
        if gs not in GROUP_SIZES:
            return Support.no(f"group_size {gs} is not one of {GROUP_SIZES}")
        if shape.hidden <= 0 or shape.hidden % gs != 0:
            return Support.no(f"D ({shape.hidden}) is not a positive multiple of group_size ({gs})")
        if shape.hidden > _MAX_HIDDEN:
            return Support.no(f"D ({shape.hidden}) exceeds {_MAX_HIDDEN}")
        return Support.yes(
            f"Triton kernel handles {shape.describe()} with {config.scale_layout} scales"
            + (", swiglu_limit" if config.swiglu_limit is not None else "")
            + (", swizzle" if config.swizzle else "")
        )

    def prepare(self, shape: ContigShape, config: ContigConfig) -> Callable[[ContigInputs, ContigOutputs], None]:
        """The launch for this shape key, decided once (constexprs, grid cap, PDL, the bf16-rounded
        ``swiglu_limit``); on CUDA the kernel is compiled here. See :func:`.triton_launch.prepare_contig_launch`."""
        import torch

        from . import triton_launch as launcher

        device_index = torch.cuda.current_device() if config.platform.is_cuda else None
        return self._prepare(shape, config, device_index, launcher)

    def _prepare(
        self, shape: ContigShape, config: ContigConfig, device_index: int | None, launcher: Any
    ) -> Callable[[ContigInputs, ContigOutputs], None]:
        limit = None if config.swiglu_limit is None else _bf16_limit(float(config.swiglu_limit))
        waves = int(self.options.get("waves", 0) or 0)
        launch = launcher.prepare_contig_launch(
            shape.hidden,
            group_size=shape.group_size,
            swiglu_limit=limit,
            swizzle=config.swizzle,
            ue8m0=config.scale_ue8m0,
            config=launcher.choose_contig_config(shape.hidden, shape.group_size, waves=waves),
            fast_exp=bool(self.options.get("fast_exp", True)),
            pdl=bool(self.options.get("pdl", True)),
            device_index=device_index,
        )

        def bound(inputs: ContigInputs, outputs: ContigOutputs) -> None:
            launch(inputs.gateup, outputs.out, outputs.scale)

        bound.launch = launch  # type: ignore[attr-defined]  # the tensor-level launcher (tests, benchmarks)
        return bound

    def run(self, inputs: ContigInputs, outputs: ContigOutputs, shape: ContigShape, config: ContigConfig) -> None:
        """Launch through the prepared launch of ``(shape, config, device)``, prepared on first use."""
        index = inputs.gateup.get_device()
        device_index = None if index < 0 else index
        key = (shape, config, device_index)
        launch = self._launches.get(key)
        if launch is None:
            from . import triton_launch as launcher

            launch = self._prepare(shape, config, device_index, launcher)
            with _LOCK:
                if len(self._launches) >= _MAX_PREPARED:
                    logger.warning("contig_triton: more than %d shape keys prepared; dropping them", _MAX_PREPARED)
                    self._launches.clear()
                self._launches[key] = launch
        launch(inputs, outputs)
