"""The tolerance policy for silu_mul_quant: re-exported from the package, its single source.

See ``sglang_moe_plugins.testing.tolerance`` for the policy and its derivation.
"""

from sglang_moe_plugins.testing.tolerance import POISON_FP8, check_against_fp64, fp64_expected, poison

__all__ = ["fp64_expected", "check_against_fp64", "poison", "POISON_FP8"]
