"""The reference plugins: the pure-torch numerics oracles (CPU and GPU).

- :mod:`.silu_mul_quant`: ``reference`` (:class:`ReferencePlugin`) and
  :func:`silu_mul_quant_reference`, the op's numerics, re-exported here: this package is their
  public path (``sglang_moe_plugins.plugins.reference.silu_mul_quant:ReferencePlugin``),
- :mod:`.mega_moe`: ``mega_reference`` (:class:`~.mega_moe.MegaReferencePlugin`), the MegaMoE
  emulation (not imported by this package).
"""

from .silu_mul_quant import ReferencePlugin, silu_mul_quant_reference

__all__ = ["ReferencePlugin", "silu_mul_quant_reference"]
