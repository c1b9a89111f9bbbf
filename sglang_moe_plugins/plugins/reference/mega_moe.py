"""``mega_reference``: pure-torch emulation of the MegaMoE variants, the numerics oracle (CPU and GPU).

It quantizes activations as the variant's pre-dispatch does, dequantizes the host's expert weights
from DeepGEMM's layouts, applies SwiGLU with the clamp (in bf16 on SM100, in fp32 on SM90, as the
kernels do), requantizes as the kernel's L1 epilogue does, runs the down projection and combines
with the top-k weights (``routed_scaling_factor`` applied to them). Slow: a host sync per expert.

It computes every token of this rank from the weights it holds, so it needs all experts on the rank
(``ep_size == 1``); under expert parallelism each rank holds only its experts and the DeepGEMM kernel
is collective, so the reference declines rather than return wrong rows.
"""

from __future__ import annotations

from ...contract import Plugin, Support
from ...hardware import Platform
from ...ops.mega_moe import OP, MegaMoEConfig, MegaMoEInputs, MegaMoEOutputs, MegaMoEShape

__all__ = ["MegaReferencePlugin"]


class MegaReferencePlugin(Plugin):
    name = "mega_reference"
    op = OP
    priority = 0
    description = "pure torch emulation of W4A8 / W4A4 / SM90 FP8 MegaMoE numerics (slow; needs all experts locally)"
    #: Reads its inputs only.
    #: On CUDA only when forced or with reference_on_gpu = true (Plugin.oracle).
    oracle = True
    writes_inputs: frozenset[str] = frozenset()

    def available(self, platform: Platform) -> Support:
        return Support.yes("pure torch, runs anywhere")

    def supports(self, shape: MegaMoEShape, config: MegaMoEConfig) -> Support:
        if shape.ep_size != 1:
            return Support.no(
                f"needs every expert's weights on this rank (ep_size=1); ep_size={shape.ep_size} leaves "
                f"{shape.num_local_experts} of {shape.num_experts} experts here"
            )
        return Support.yes(f"pure torch emulation of {config.variant} (every valid call with all experts local)")

    def run(self, inputs: MegaMoEInputs, outputs: MegaMoEOutputs, shape: MegaMoEShape, config: MegaMoEConfig) -> None:
        from ...ops.mega_moe.reference import mega_moe_reference  # torch numerics: loaded by the first run

        mega_moe_reference(inputs, outputs, shape, config)
