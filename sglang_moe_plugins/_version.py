"""Package and plugin-contract versions."""

__all__ = ["__version__", "CONTRACT_VERSION"]

__version__ = "0.3.0"

#: Version of the kernel-plugin contract (``Plugin``, ``Support``, the op shape/config/input/output
#: types). A plugin may declare ``contract_version`` (an int); the registry skips a plugin whose
#: version differs from this one.
#: 2 (0.3.0): op ``mega_moe`` became backend-neutral (``MegaMoEConfig`` lost ``deep_gemm``/``mma_type``,
#: ``MegaMoEInputs`` lost ``experts``/``host``); ``silu_mul_quant`` is unchanged.
CONTRACT_VERSION = 2
