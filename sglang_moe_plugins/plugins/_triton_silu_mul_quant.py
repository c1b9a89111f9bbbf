"""Temporary re-export: the ``silu_mul_quant`` Triton kernel lives in
:mod:`sglang_moe_plugins.plugins.triton_smq` (``kernel``, ``tuning``, ``launch``)."""

from .triton_common import next_pow2, pdl_supported  # noqa: F401
from .triton_smq.kernel import _silu_mul_quant_kernel, silu_mul_quant_kernel  # noqa: F401
from .triton_smq.launch import *  # noqa: F401,F403
from .triton_smq.launch import occupancy_records, plan_launch, prepare_launch  # noqa: F401
from .triton_smq.tuning import *  # noqa: F401,F403
from .triton_smq.tuning import KernelConfig, choose_config  # noqa: F401

__all__ = ["KernelConfig", "LaunchPlan", "choose_block_c", "choose_config", "launch", "plan_launch", "prepare_launch",
           "pointer_dtypes", "sm_count", "pdl_supported", "resident_programs_per_sm", "occupancy_records"]
