"""The tolerance policy for silu_mul_quant: re-exported from the package, its single source.

See ``sglang_moe_plugins.testing.ops.silu_mul_quant`` for the policy and its derivation.
"""

import torch

from sglang_moe_plugins.testing.case import POISON_FP8, poison
from sglang_moe_plugins.testing.ops.silu_mul_quant import check_against_fp64, fp64_expected

__all__ = ["fp64_expected", "check_against_fp64", "poison", "POISON_FP8", "fast_exp_silu_mul"]


def fast_exp_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in fp32 as a fast-exp kernel computes it: ``e^-g`` as an exact ``2^t`` of the
    fp32-rounded argument ``t = g * fp32(log2 e)`` (``ex2.approx``/``__expf`` up to their own ulps)."""
    t = gate.float() * torch.tensor(1.4426950408889634, dtype=torch.float32).neg()
    return (gate.double() / (1.0 + torch.exp2(t.double())) * up.double()).float()
