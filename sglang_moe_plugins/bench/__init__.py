"""``sglang-moe-plugins bench``: time every enabled plugin on a model's MoE calls on this GPU, side by side.

The method is ``benchmarks/silu_mul_quant.py``'s (its timing helpers live in :mod:`.timing`): CUDA-graph
replays of back-to-back calls that rotate over enough input sets to exceed the L2 cache, with the device
copy bandwidth measured in the same run as the ceiling.
"""

from __future__ import annotations

__all__: list[str] = []
