"""Plugins of op ``silu_mul_quant_contig`` (the contiguous / compact runner's activation step).

- :mod:`.triton_plugin`: ``contig_triton``, this project's Triton kernel (:mod:`.triton_kernel`: the
  ``@triton.jit`` code; :mod:`.triton_launch`: launch configuration and the prepared launch);
- :mod:`.sglang_fused`, :mod:`.sglang_two_kernel` (with :mod:`.sglang_host`): SGLang's own kernels.

Importing this package imports none of them.
"""

__all__: list[str] = []
