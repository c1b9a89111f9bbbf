"""Plugins that launch the host's (SGLang's) own kernels.

- :mod:`.jit_ep`: ``jit_ep``, SGLang's DSV4 JIT ``silu_and_mul_masked_post_quant``,
- :mod:`.fp8_fallback`: ``fp8_fallback``, SGLang's masked fused ``per_token_group_quant``,
- :mod:`.host`: where those kernels come from (SGLang's wrappers, or a :class:`~.host.HostKernels`
  override) and the check both plugins share.

Importing this package imports none of them (and never SGLang).
"""

__all__: list[str] = []
